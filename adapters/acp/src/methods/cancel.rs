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
    super::attach_controller(conn, "session/cancel", &id).await?;
    let status = conn
        .node
        .cancel(&id, &conn.actor())
        .await
        .map_err(|e| super::receipt_unknown_session(conn, "session/cancel", &id, e))?;
    Ok(json!({ "status": status }))
}

/// `session/cancel_tool_call {sessionId, toolCallId, reason?}` →
/// `{status: "cancelled" | "already_cancelled" | "not_found"}`: stops one
/// call (killing its processes) without ending the turn.
pub(crate) async fn cancel_tool_call(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let id = session_id(&params)?;
    super::attach_controller(conn, "session/cancel_tool_call", &id).await?;
    let call = match params.get("toolCallId") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(_) => {
            return Err(RpcError::invalid_params(
                "toolCallId",
                "must be a non-empty string",
            ))
        }
        None => return Err(RpcError::invalid_params("toolCallId", "is required")),
    };
    let reason = match params.get("reason") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(RpcError::invalid_params("reason", "must be a string")),
    };
    let status = conn
        .node
        .cancel_tool_call(&id, &call, reason, &conn.actor())
        .await
        .map_err(|e| super::receipt_unknown_session(conn, "session/cancel_tool_call", &id, e))?;
    Ok(json!({ "status": status }))
}
