//! `session/list` (ACP "Listing Sessions"; `remote-session-control.md`, "Status").

use agent_client_protocol_schema::v1::{ListSessionsResponse, Meta, SessionInfo};
use berth_actors::SessionStatus;
use berth_runtime::ids::SessionId;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse, to_value};
use crate::connection::Connection;
use crate::jsonrpc::RpcError;

/// Sessions per page.
const PAGE: usize = 100;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListParams {
    #[serde(default)]
    cwd: Option<std::path::PathBuf>,
    #[serde(default)]
    cursor: Option<String>,
}

/// The state word of a session in `_meta.berth.state`: `closed`,
/// `suspended` (parked with a suspension), `requested` (a suspend was
/// accepted; the running turn has not reached the seam where it parks),
/// `quiescing` (the turn reached that seam and dispatches nothing more; its
/// frame is being checkpointed for the park), `running` (a turn runs) or
/// `idle` — the words of `berth.session_view.v1`'s `run.status`.
fn state_word(status: &SessionStatus) -> &'static str {
    let record = &status.record;
    if record.closed_at.is_some() {
        "closed"
    } else if status.suspension_handle.is_some() {
        "suspended"
    } else if status.active_prompt && record.suspend_request.is_some() && status.quiescing {
        "quiescing"
    } else if status.active_prompt && record.suspend_request.is_some() {
        "requested"
    } else if status.active_prompt {
        "running"
    } else {
        "idle"
    }
}

/// One `session/list` entry: ACP `SessionInfo` plus, under `_meta.berth`,
/// `liveState` (`live` | `persisted`), `activePrompt`, `currentModeId`,
/// `attachableRoles` (the roles this client may act as: its own and every
/// lower one), `lastEventId` (absent until the session has events),
/// `closedAt` (once closed), `state` (see [`state_word`]), `labels`,
/// `createdAt`, `createdBy` (the authenticated creator, when networked),
/// `spend` (what its sealed turns spent: `{inputTokens, outputTokens,
/// toolCalls, costMicroUsd, wallMs}` — tokens, calls, millionths of a US
/// dollar, milliseconds) and, while parked, `suspended: {handle, reason?,
/// initiator, actor, mode, suspendedAt, resumeWhen?, summary?}` (the
/// suspension envelope of `seeds/acp-session-suspend-rfc.md` without its
/// frame; `suspension` is `None` when the caller did not read it, and then
/// only `handle` is given).
pub(crate) fn session_entry(
    status: &SessionStatus,
    suspension: Option<&berth_runtime::suspension::Suspension>,
    role: berth_actors::Role,
) -> SessionInfo {
    let record = &status.record;
    let mut berth = json!({
        "liveState": if status.live { "live" } else { "persisted" },
        "activePrompt": status.active_prompt,
        "currentModeId": record.mode_id,
        "attachableRoles": role.attachable(),
        "state": state_word(status),
        "labels": record.labels,
        "createdAt": record.created_at.to_rfc3339(),
        "spend": {
            "inputTokens": record.spend.input_tokens,
            "outputTokens": record.spend.output_tokens,
            "toolCalls": record.spend.tool_calls,
            "costMicroUsd": record.spend.cost_micro_usd,
            "wallMs": record.spend.wall_ms,
        },
    });
    if status.last_event_id > 0 {
        berth["lastEventId"] = json!(status.last_event_id);
    }
    if let Some(closed) = record.closed_at {
        berth["closedAt"] = json!(closed.to_rfc3339());
    }
    if let Some(creator) = &record.created_by {
        berth["createdBy"] = json!(creator);
    }
    if let Some(handle) = &status.suspension_handle {
        let mut suspended = json!({"handle": handle});
        if let Some(s) = suspension.filter(|s| &s.handle == handle) {
            suspended["initiator"] = json!(s.initiator);
            suspended["actor"] = json!(s.actor);
            suspended["mode"] = json!(s.mode);
            suspended["suspendedAt"] = json!(s.suspended_at.to_rfc3339());
            for (key, value) in [
                ("reason", s.reason.as_ref().map(|r| json!(r))),
                ("resumeWhen", s.resume_when.as_ref().map(|w| json!(w))),
                ("summary", s.summary.as_ref().map(|t| json!(t))),
            ] {
                if let Some(value) = value {
                    suspended[key] = value;
                }
            }
        }
        berth["suspended"] = suspended;
    }
    let mut meta = Meta::new();
    meta.insert("berth".into(), berth);
    SessionInfo::new(record.session_id.to_string(), record.cwd.clone())
        .additional_directories(record.additional_directories.clone())
        .title(record.title.clone())
        .updated_at(record.updated_at.to_rfc3339())
        .meta(meta)
}

/// Lists sessions (optionally only those whose `cwd` matches), 100 per page,
/// with `nextCursor` when more remain.
pub(crate) async fn list(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let params: ListParams = parse(params)?;
    if params.cwd.as_ref().is_some_and(|c| !c.is_absolute()) {
        return Err(RpcError::invalid_params("cwd", "must be an absolute path"));
    }
    let cursor = params.cursor.map(SessionId);
    if let Some(cursor) = &cursor {
        conn.node.ensure_exists(cursor).await.map_err(|e| match e {
            berth_actors::ControlError::UnknownSession { .. } => RpcError::invalid_params(
                "cursor",
                "is not a cursor this server gave out; pass a previous nextCursor",
            ),
            other => other.into(),
        })?;
    }
    let (page, next) = conn
        .node
        .list(params.cwd.as_deref(), cursor.as_ref(), PAGE)
        .await?;
    let mut entries = Vec::with_capacity(page.len());
    for status in &page {
        let suspension = suspension_of(conn, status)?;
        entries.push(session_entry(
            status,
            suspension.as_ref(),
            conn.principal.role,
        ));
    }
    to_value(ListSessionsResponse::new(entries).next_cursor(next.map(|id| id.0)))
}

/// The suspension of a parked session, read from the journal (never
/// rehydrating the session); `None` when it is not parked.
fn suspension_of(
    conn: &Connection,
    status: &SessionStatus,
) -> Result<Option<berth_runtime::suspension::Suspension>, RpcError> {
    if status.suspension_handle.is_none() {
        return Ok(None);
    }
    conn.node
        .suspension(&status.record.session_id)
        .map_err(RpcError::from)
}

/// `_berth/session.get {sessionId}` → `{session: entry}`: one session's
/// `session/list` entry (same shape, [`session_entry`]) without paging
/// through the list; read-only (a parked session is not rehydrated). What
/// `berth ctl show` reads.
///
/// # Errors
/// -32602 for a missing or empty `sessionId`; -32004 unknown session.
pub(crate) async fn get(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let id = super::session_id(&params)?;
    let status = conn.node.session_status(&id).await?;
    let suspension = suspension_of(conn, &status)?;
    let entry = to_value(session_entry(
        &status,
        suspension.as_ref(),
        conn.principal.role,
    ))?;
    Ok(json!({ "session": entry }))
}
