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

/// One `session/list` entry: ACP `SessionInfo` plus, under `_meta.berth`,
/// `liveState` (`live` | `persisted`), `activePrompt`, `currentModeId`,
/// `attachableRoles` (the roles this client may act as: its own and every
/// lower one), `lastEventId` (absent until the session has events) and
/// `closedAt` (once closed).
pub(crate) fn session_entry(status: &SessionStatus, role: berth_actors::Role) -> SessionInfo {
    let record = &status.record;
    let mut berth = json!({
        "liveState": if status.live { "live" } else { "persisted" },
        "activePrompt": status.active_prompt,
        "currentModeId": record.mode_id,
        "attachableRoles": role.attachable(),
    });
    if status.last_event_id > 0 {
        berth["lastEventId"] = json!(status.last_event_id);
    }
    if let Some(closed) = record.closed_at {
        berth["closedAt"] = json!(closed.to_rfc3339());
    }
    if let Some(handle) = &status.suspension_handle {
        berth["suspended"] = json!({"handle": handle});
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
    to_value(
        ListSessionsResponse::new(
            page.iter()
                .map(|s| session_entry(s, conn.principal.role))
                .collect(),
        )
        .next_cursor(next.map(|id| id.0)),
    )
}
