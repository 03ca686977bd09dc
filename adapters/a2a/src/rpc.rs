//! The JSON-RPC 2.0 endpoint (A2A spec §9): envelope, `A2A-Version`
//! negotiation (§3.6), dispatch by method name, and the HTTP bounds.
//!
//! A unary method answers `200` with `application/json`; a streaming one
//! answers `200` with `text/event-stream`, one `data:` line per JSON-RPC
//! response whose `result` is a `StreamResponse` (§9.4.2). Errors found
//! before a stream starts are ordinary JSON-RPC error responses.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::{json, Value};

use crate::error::{A2aErrorKind, RpcError};
use crate::{Shared, DEFAULT_ACTOR, PROTOCOL_VERSION};
use berth_actors::{Principal, Role};

/// The `A2A-Version` service parameter (header or query parameter).
pub const VERSION_HEADER: &str = "a2a-version";

/// What a method answers.
pub(crate) enum Answer {
    /// A JSON-RPC `result`.
    Value(Value),
    /// An SSE stream of `StreamResponse` results (each already a JSON-RPC
    /// response object, or a final error object).
    Stream(std::pin::Pin<Box<dyn Stream<Item = Value> + Send>>),
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

fn error_response(status: StatusCode, id: &Value, error: &RpcError) -> Response {
    json_response(
        status,
        json!({"jsonrpc": "2.0", "id": id, "error": error.to_value()}),
    )
}

/// The requested protocol version: the header, else the query parameter;
/// missing or empty means `0.3` (spec §3.6.2).
fn requested_version(headers: &HeaderMap, query: Option<&str>) -> String {
    let from_header = headers
        .get(VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty());
    let from_query = query.and_then(|q| {
        q.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            k.eq_ignore_ascii_case("A2A-Version")
                .then(|| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        })
    });
    from_header
        .map(str::to_owned)
        .or(from_query)
        .unwrap_or_else(|| "0.3".into())
}

/// Whether `version` is 1.0 (`Major.Minor`; a patch number is ignored).
pub fn version_supported(version: &str) -> bool {
    let mut parts = version.split('.');
    matches!(
        (parts.next(), parts.next()),
        (Some("1"), Some("0")) | (Some("1"), None)
    ) && parts.all(|p| p.chars().all(|c| c.is_ascii_digit()))
}

/// The role a method needs: sending (which starts, steers or resumes a turn)
/// and cancelling need a controller; reading needs an observer.
fn required_role(method: &str) -> Role {
    match method {
        "SendMessage" | "SendStreamingMessage" | "CancelTask" => Role::Controller,
        _ => Role::Observer,
    }
}

/// -32011 `role_not_authorized` when `principal` may not call `method`
/// (the same code and `data` shape as ACP's refusal).
fn refusal(principal: &Principal, method: &str) -> Option<RpcError> {
    let needed = required_role(method);
    (!principal.may(needed)).then(|| RpcError {
        code: -32011,
        message: format!(
            "{} may not call {method}: it needs the {} role",
            principal.actor,
            needed.as_str()
        ),
        data: json!({
            "reason": "role_not_authorized",
            "method": method,
            "actor": principal.actor,
            "role": principal.role.as_str(),
            "requiredRole": needed.as_str(),
        }),
    })
}

/// `POST /`: one JSON-RPC request.
pub(crate) async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(permit) = Arc::clone(&shared.requests).try_acquire_owned() else {
        return busy(shared.options.max_in_flight);
    };
    // The listener's principal (recorded as the creator of the contexts it
    // makes), else the router alone: a local caller with every right.
    let (principal, creator) = match parts.extensions.get::<Principal>() {
        Some(p) => (p.clone(), Some(p.actor.clone())),
        None => (Principal::local(DEFAULT_ACTOR), None),
    };
    let confined = parts
        .extensions
        .get::<berth_actors::auth::Anonymous>()
        .is_some();
    let actor = principal.actor.clone();
    let limit = shared.options.max_body_bytes;
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => bytes,
        Err(_) => {
            let mut e = RpcError::invalid_request("request body too large");
            e.data = json!({"reason": "body_too_large", "limitBytes": limit});
            return error_response(StatusCode::PAYLOAD_TOO_LARGE, &Value::Null, &e);
        }
    };
    // Spec §9.1: requests are `application/json` (`application/*+json`
    // accepted); a body declared as something else is refused unread.
    if let Some(content_type) = parts.headers.get(header::CONTENT_TYPE) {
        let essence = content_type
            .to_str()
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if essence != "application/json"
            && !(essence.starts_with("application/") && essence.ends_with("+json"))
        {
            let e = RpcError::a2a(
                A2aErrorKind::ContentTypeNotSupported,
                format!("requests must be application/json, not {essence}"),
                &[("contentType", essence.clone())],
            );
            return error_response(StatusCode::OK, &Value::Null, &e);
        }
    }
    // A body that repeats a key (at any depth) is refused whole: parsers
    // disagree on which repeat counts (`berth_runtime::unique_json`).
    let envelope: Value = match berth_runtime::unique_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(berth_runtime::unique_json::JsonDecodeError::Syntax(e)) => {
            return error_response(StatusCode::OK, &Value::Null, &RpcError::parse_error(e))
        }
        Err(berth_runtime::unique_json::JsonDecodeError::DuplicateKey { key, path }) => {
            let e = RpcError {
                code: -32600,
                message: "Request payload validation error".into(),
                data: json!({"reason": "duplicate_key", "key": key, "path": path}),
            };
            return error_response(StatusCode::OK, &Value::Null, &e);
        }
    };
    let (id, method, params) = match classify(&envelope) {
        Ok(parsed) => parsed,
        Err((id, e)) => return error_response(StatusCode::OK, &id, &e),
    };
    let version = requested_version(&parts.headers, parts.uri.query());
    if !version_supported(&version) {
        let e = RpcError::a2a(
            A2aErrorKind::VersionNotSupported,
            format!("A2A protocol version {version} is not supported; this agent speaks {PROTOCOL_VERSION} (send the header A2A-Version: {PROTOCOL_VERSION})"),
            &[
                ("requestedVersion", version.clone()),
                ("supportedVersions", PROTOCOL_VERSION.into()),
            ],
        );
        return error_response(StatusCode::OK, &id, &e);
    }
    if let Some(e) = refusal(&principal, &method) {
        return error_response(StatusCode::OK, &id, &e);
    }
    let ctx = crate::methods::Ctx {
        shared: Arc::clone(&shared),
        actor,
        creator,
        confined,
    };
    let streaming = matches!(method.as_str(), "SendStreamingMessage" | "SubscribeToTask");
    let stream_permit = if streaming {
        match Arc::clone(&shared.streams).try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => return busy(shared.options.max_streams),
        }
    } else {
        None
    };
    let span = request_span(&method, &id, &parts.headers);
    let answer = tracing::Instrument::instrument(
        crate::methods::dispatch(&ctx, &method, params),
        span.clone(),
    )
    .await;
    if let Err(e) = &answer {
        berth_actors::telemetry::record_rpc_error(&span, e.code, &e.message);
    }
    match answer {
        Ok(Answer::Value(result)) => {
            drop(permit);
            json_response(
                StatusCode::OK,
                json!({"jsonrpc": "2.0", "id": id, "result": result}),
            )
        }
        Ok(Answer::Stream(stream)) => {
            // A stream holds a stream slot, not a request slot.
            drop(permit);
            let id = id.clone();
            let events = futures::StreamExt::map(stream, move |item| {
                let _held = &stream_permit;
                let frame = if item.get("error").is_some() {
                    json!({"jsonrpc": "2.0", "id": id, "error": item["error"]})
                } else {
                    json!({"jsonrpc": "2.0", "id": id, "result": item})
                };
                Ok::<_, Infallible>(Event::default().data(frame.to_string()))
            });
            Sse::new(events)
                .keep_alive(KeepAlive::default())
                .into_response()
        }
        Err(e) => error_response(StatusCode::OK, &id, &e),
    }
}

/// The span one A2A request runs in (OpenTelemetry RPC conventions, as ACP
/// requests: `rpc.system = jsonrpc`, kind server, named after the method).
/// A W3C `traceparent` (and `tracestate`) HTTP header makes that remote span
/// its parent, and so the ancestor of the work the request starts (a turn, a
/// suspension); an invalid one is ignored (W3C Trace Context §4.3) and the
/// request starts a trace of its own.
fn request_span(method: &str, id: &Value, headers: &HeaderMap) -> tracing::Span {
    let span = berth_actors::jsonrpc_server_span!("a2a.request", "a2a", method);
    if span.is_disabled() {
        return span;
    }
    span.record("rpc.jsonrpc.request_id", tracing::field::display(id));
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(traceparent) = header("traceparent") {
        let mut context = json!({"traceparent": traceparent});
        if let Some(tracestate) = header("tracestate") {
            context["tracestate"] = json!(tracestate);
        }
        berth_actors::telemetry::adopt_remote_parent(&span, &context);
    }
    span
}

fn busy(limit: usize) -> Response {
    let mut e = RpcError::internal("too many requests in flight; retry shortly");
    e.data = json!({"reason": "too_many_requests", "limit": limit});
    let mut response = error_response(StatusCode::SERVICE_UNAVAILABLE, &Value::Null, &e);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// Checks the JSON-RPC 2.0 envelope: an object with `jsonrpc: "2.0"`, a
/// string `method`, an `id` (string, number or null: every A2A method is a
/// request) and optional object `params`.
#[allow(clippy::result_large_err)] // built once per request, never propagated
fn classify(envelope: &Value) -> Result<(Value, String, Value), (Value, RpcError)> {
    let Some(object) = envelope.as_object() else {
        let detail = if envelope.is_array() {
            "batches are not supported: send one request per HTTP request"
        } else {
            "the body must be a JSON-RPC 2.0 request object"
        };
        return Err((Value::Null, RpcError::invalid_request(detail)));
    };
    let id = match object.get("id") {
        // A number that is not a 64-bit integer would be echoed changed
        // (see the ACP adapter's `jsonrpc::classify`): refused.
        Some(id @ (Value::String(_) | Value::Null)) => id.clone(),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n.clone()),
        Some(_) => {
            return Err((
                Value::Null,
                RpcError::invalid_request(
                    "id must be a string, an integer that fits in 64 bits, or null",
                ),
            ))
        }
        None => {
            return Err((
                Value::Null,
                RpcError::invalid_request("id is required: A2A methods are requests"),
            ))
        }
    };
    if object.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        return Err((id, RpcError::invalid_request("jsonrpc must be \"2.0\"")));
    }
    let Some(method) = object.get("method").and_then(Value::as_str) else {
        return Err((id, RpcError::invalid_request("method must be a string")));
    };
    let params = match object.get("params") {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => return Err((id, RpcError::invalid_params("params", "must be an object"))),
    };
    Ok((id, method.to_owned(), params))
}

/// Wraps a body for tests and tools that build requests by hand.
pub fn request_body(method: &str, params: Value) -> Body {
    Body::from(json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        for v in ["1.0", "1.0.3", "1"] {
            assert!(version_supported(v), "{v}");
        }
        for v in ["0.3", "99.0", "1.1", "", "1.x", "2"] {
            assert!(!version_supported(v), "{v}");
        }
        let mut headers = HeaderMap::new();
        assert_eq!(requested_version(&headers, None), "0.3");
        assert_eq!(requested_version(&headers, Some("A2A-Version=1.0")), "1.0");
        headers.insert(VERSION_HEADER, HeaderValue::from_static(" "));
        assert_eq!(requested_version(&headers, None), "0.3");
        headers.insert(VERSION_HEADER, HeaderValue::from_static("1.0"));
        assert_eq!(requested_version(&headers, None), "1.0");
    }

    #[test]
    fn envelopes() {
        assert_eq!(classify(&json!([])).unwrap_err().1.code, -32600);
        for id in [json!(1.5), json!(1e20)] {
            let (echo, e) =
                classify(&json!({"jsonrpc": "2.0", "id": id, "method": "X"})).unwrap_err();
            assert_eq!((echo, e.code), (Value::Null, -32600));
        }
        assert_eq!(
            classify(&json!({"jsonrpc": "2.0", "method": "X"}))
                .unwrap_err()
                .1
                .code,
            -32600
        );
        assert_eq!(
            classify(&json!({"jsonrpc": "1.0", "id": 1, "method": "X"}))
                .unwrap_err()
                .1
                .code,
            -32600
        );
        assert_eq!(
            classify(&json!({"jsonrpc": "2.0", "id": 1, "method": "X", "params": [1]}))
                .unwrap_err()
                .1
                .code,
            -32602
        );
        let (id, method, params) =
            classify(&json!({"jsonrpc": "2.0", "id": "a", "method": "GetTask"})).unwrap();
        assert_eq!(
            (id, method.as_str(), params),
            (json!("a"), "GetTask", json!({}))
        );
    }
}
