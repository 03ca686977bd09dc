//! Operations routes on the listener (issue 8, "HTTP surface"):
//!
//! | route | auth | answer |
//! |---|---|---|
//! | `GET /healthz` | none | 200 `{"status": "ok"}` while the process serves |
//! | `GET /readyz` | none | 200 `{"status": "ready", journal, scheduler}` when the journal answers a read and the scheduler runs (loaded with every wake-up); 503 `{"status": "not_ready", …}` naming the failing check otherwise |
//! | `GET /metrics` | observer | Prometheus text ([`crate::metrics`]) |
//! | `POST /v1/events` | controller | `{name, data?}` → 200 `{seq, receivedAt, woke}` once the event is journaled (durable) and its matches resumed: the same as ACP `_berth/event.emit` / `Node::emit_event` (issue 5) |
//! | `GET /v1/sessions` | observer | `{sessions: [entry], nextCursor?}`, 100 per page, `?cursor=` from a previous `nextCursor`, `?cwd=` (absolute) to filter |
//! | `GET /v1/sessions/{id}` | observer | one entry, plus `suspension` while parked; 404 -32004 for an unknown id |
//!
//! A session entry: `{sessionId, cwd, title?, state ("running" | "suspended"
//! | "idle" | "closed"), live, activePrompt, lastEventId, createdAt,
//! updatedAt, closedAt?, createdBy?, labels, parentSessionId?, spend:
//! {inputTokens, outputTokens, toolCalls, costMicroUsd, wallMs},
//! suspendedHandle?}`. Reading never rehydrates a session.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use berth_actors::{Node, Principal, Role, SessionStatus};
use berth_runtime::ids::SessionId;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::require_role;
use crate::error::ApiError;

/// Sessions per page of `GET /v1/sessions`.
pub const PAGE: usize = 100;

/// `GET /healthz` and `GET /readyz` (no auth: probes).
pub fn public_routes(node: Node) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(node)
}

/// The authenticated ops routes, each behind its role.
pub fn routes(node: Node) -> Router {
    let observe = Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/sessions", get(list_sessions))
        .route("/v1/sessions/{id}", get(get_session))
        .route_layer(axum::middleware::from_fn_with_state(
            Role::Observer,
            require_role,
        ));
    let control = Router::new()
        .route("/v1/events", post(emit_event))
        .route_layer(axum::middleware::from_fn_with_state(
            Role::Controller,
            require_role,
        ));
    observe.merge(control).with_state(node)
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn readyz(State(node): State<Node>) -> Response {
    let readiness = node.readiness().await;
    let journal = match &readiness.journal {
        Ok(counts) => json!({"ok": true, "sessions": counts.sessions}),
        Err(e) => json!({"ok": false, "error": e}),
    };
    let body = json!({
        "status": if readiness.ready() { "ready" } else { "not_ready" },
        "journal": journal,
        "scheduler": {"ok": readiness.scheduler, "armedWakeups": readiness.armed_wakeups},
    });
    let status = if readiness.ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

async fn metrics(State(node): State<Node>) -> Response {
    match crate::metrics::render(&node).await {
        Ok(text) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => ApiError::internal(e).into_response(),
    }
}

/// Decodes a JSON body, mapping every failure to a typed error: 413 over
/// the body bound, 400 -32700-style for bad JSON, 400 -32602 naming the
/// field for a wrong shape.
fn json_body(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let bytes = body.map_err(|e| {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                status,
                -32600,
                "Request body too large",
                json!({"reason": "body_too_large", "hint": "raise [http] max_body_bytes"}),
            )
        } else {
            ApiError::new(
                status,
                -32600,
                "Unreadable request body",
                json!({"reason": e.body_text()}),
            )
        }
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            -32700,
            "Parse error",
            json!({"reason": e.to_string()}),
        )
    })
}

/// `POST /v1/events {name, data?}`.
async fn emit_event(
    State(node): State<Node>,
    Extension(principal): Extension<Principal>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let value = json_body(body)?;
    let Value::Object(mut object) = value else {
        return Err(ApiError::invalid_params(
            "body",
            "must be a JSON object {name, data?}",
        ));
    };
    if let Some(key) = object.keys().find(|k| *k != "name" && *k != "data") {
        return Err(ApiError::invalid_params(
            key,
            "unknown field; expected name and data",
        ));
    }
    let name = match object.remove("name") {
        Some(Value::String(name)) => name,
        Some(_) => return Err(ApiError::invalid_params("name", "must be a string")),
        None => return Err(ApiError::invalid_params("name", "is required")),
    };
    let data = object.remove("data").unwrap_or(Value::Null);
    // Journaled (durable) before `emit_event` returns, and so before this
    // answers.
    let outcome = node.emit_event(&name, data, &principal.actor).await?;
    Ok(Json(json!({
        "seq": outcome.seq,
        "receivedAt": outcome.received_at,
        "woke": outcome.woke,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    cursor: Option<String>,
    cwd: Option<std::path::PathBuf>,
}

async fn list_sessions(
    State(node): State<Node>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid_params("query", e.body_text()))?;
    if query.cwd.as_ref().is_some_and(|c| !c.is_absolute()) {
        return Err(ApiError::invalid_params("cwd", "must be an absolute path"));
    }
    let cursor = query.cursor.map(SessionId);
    if let Some(cursor) = &cursor {
        if node
            .journal()
            .session(cursor)
            .map_err(ApiError::internal)?
            .is_none()
        {
            return Err(ApiError::invalid_params(
                "cursor",
                "is not a cursor this server gave out; pass a previous nextCursor",
            ));
        }
    }
    let (page, next) = node
        .list(query.cwd.as_deref(), cursor.as_ref(), PAGE)
        .await?;
    let mut body = json!({"sessions": page.iter().map(entry).collect::<Vec<_>>()});
    if let Some(next) = next {
        body["nextCursor"] = json!(next);
    }
    Ok(Json(body))
}

async fn get_session(
    State(node): State<Node>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = SessionId(id);
    let status = node.session_status(&id).await?;
    let mut body = entry(&status);
    if let Some(s) = node.suspension(&id)? {
        body["suspension"] = json!({
            "handle": s.handle,
            "reason": s.reason,
            "initiator": s.initiator,
            "actor": s.actor,
            "mode": s.mode,
            "resumeWhen": s.resume_when,
            "summary": s.summary,
            "suspendedAt": s.suspended_at,
            "turnId": s.turn_id,
        });
    }
    Ok(Json(body))
}

/// The state word of a session.
fn state(status: &SessionStatus) -> &'static str {
    if status.record.closed_at.is_some() {
        "closed"
    } else if status.suspension_handle.is_some() {
        "suspended"
    } else if status.active_prompt {
        "running"
    } else {
        "idle"
    }
}

fn entry(status: &SessionStatus) -> Value {
    let r = &status.record;
    let mut e = json!({
        "sessionId": r.session_id,
        "cwd": r.cwd,
        "state": state(status),
        "live": status.live,
        "activePrompt": status.active_prompt,
        "lastEventId": status.last_event_id,
        "createdAt": r.created_at,
        "updatedAt": r.updated_at,
        "labels": r.labels,
        "spend": {
            "inputTokens": r.spend.input_tokens,
            "outputTokens": r.spend.output_tokens,
            "toolCalls": r.spend.tool_calls,
            "costMicroUsd": r.spend.cost_micro_usd,
            "wallMs": r.spend.wall_ms,
        },
    });
    let optional = [
        ("title", r.title.as_ref().map(|t| json!(t))),
        ("closedAt", r.closed_at.map(|t| json!(t))),
        ("createdBy", r.created_by.as_ref().map(|c| json!(c))),
        (
            "parentSessionId",
            r.parent_session_id.as_ref().map(|p| json!(p)),
        ),
        (
            "suspendedHandle",
            status.suspension_handle.as_ref().map(|h| json!(h)),
        ),
    ];
    for (key, value) in optional {
        if let Some(value) = value {
            e[key] = value;
        }
    }
    e
}
