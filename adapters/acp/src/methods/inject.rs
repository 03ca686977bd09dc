//! `session/inject`, `session/revoke_inject`, `session/replace_inject`,
//! `session/pending_injections` (`remote-session-control.md`, "Steer", "Queue",
//! "Interrupt"; berth extensions to ACP).

use serde_json::{json, Value};

use super::{receipt_unknown_session, session_id};
use crate::connection::Connection;
use crate::jsonrpc::RpcError;

fn message_id(params: &Value) -> Result<String, RpcError> {
    match params.get("messageId") {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(_) => Err(RpcError::invalid_params(
            "messageId",
            "must be a non-empty string",
        )),
        None => Err(RpcError::invalid_params("messageId", "is required")),
    }
}

/// `{sessionId, mode, content}` → `{messageId, status: "accepted"}` (accepted
/// = queued for the next seam its mode allows). An idle or unknown session
/// answers -32004 before the mode is looked at; a bad mode or empty content
/// answers -32602 with `reason` `invalid_mode` / `invalid_content`.
pub(crate) async fn inject(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let id = session_id(&params)?;
    super::attach_controller(conn, "session/inject", &id).await?;
    let mode = params.get("mode").and_then(Value::as_str).unwrap_or("");
    let content = params.get("content").cloned().unwrap_or(Value::Null);
    let message_id = conn
        .node
        .inject(&id, mode, &content, &conn.actor())
        .await
        .map_err(|e| receipt_unknown_session(conn, "session/inject", &id, e))?;
    Ok(json!({"messageId": message_id, "status": "accepted"}))
}

/// `{sessionId, messageId}` → `{messageId, status: "revoked"}`; -32008 with
/// `reason` `already_delivered`, `already_revoked`, `unknown_message_id` or
/// `not_owner_or_not_authorized` (another client's message, and the sender
/// does not own the session: only the host owner or the session's creator
/// may revoke others' messages).
pub(crate) async fn revoke(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let id = session_id(&params)?;
    super::attach_controller(conn, "session/revoke_inject", &id).await?;
    let message = message_id(&params)?;
    let owner = conn.principal.role == berth_actors::Role::HostOwner
        || conn
            .node
            .journal()
            .session(&id)
            .map_err(RpcError::internal)?
            .is_some_and(|r| conn.principal.owns(r.created_by.as_deref()));
    conn.node
        .retract_injection_as(&id, &message, None, &conn.actor(), owner)
        .await
        .map_err(|e| receipt_unknown_session(conn, "session/revoke_inject", &id, e))?;
    Ok(json!({"messageId": message, "status": "revoked"}))
}

/// `{sessionId, messageId, content}` → `{messageId, status: "replaced"}`: same
/// id, mode and place in the queue; errors as for revoke, plus
/// `invalid_content`.
pub(crate) async fn replace(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let id = session_id(&params)?;
    super::attach_controller(conn, "session/replace_inject", &id).await?;
    let message = message_id(&params)?;
    let content = params.get("content").cloned().unwrap_or(Value::Null);
    conn.node
        .retract_injection(&id, &message, Some(&content), &conn.actor())
        .await
        .map_err(|e| receipt_unknown_session(conn, "session/replace_inject", &id, e))?;
    Ok(json!({"messageId": message, "status": "replaced"}))
}

/// `{sessionId}` → `{injections: [{messageId, mode, content}]}` in delivery
/// (FIFO) order; empty when nothing is pending or no turn runs.
pub(crate) async fn pending(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let id = session_id(&params)?;
    let pending = conn.node.pending_injections(&id).await?;
    let injections: Vec<Value> = pending
        .into_iter()
        .map(|i| json!({"messageId": i.message_id, "mode": i.mode, "content": i.content}))
        .collect();
    Ok(json!({ "injections": injections }))
}
