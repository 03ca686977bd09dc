//! `session/cancel` as request or notification (`remote-session-control.md`, "Stop").

use serde_json::{json, Value};

use super::session_id;
use crate::connection::Connection;
use crate::jsonrpc::RpcError;

/// Stops the running turn. Answers `{status: "cancelled"}` for the cancel that
/// stopped it and `{status: "already_cancelled"}` for every other; -32004 for a
/// session the server does not hold.
pub(crate) async fn cancel(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let id = session_id(&params)?;
    let status = conn
        .node
        .cancel(&id, &conn.actor())
        .await
        .map_err(|e| super::receipt_unknown_session(conn, "session/cancel", &id, e))?;
    Ok(json!({ "status": status }))
}
