//! `session/close` (ACP "Closing a Session"; `remote-session-control.md`, "Stop").

use agent_client_protocol_schema::v1::{CloseSessionRequest, CloseSessionResponse};
use berth_runtime::ids::SessionId;
use serde_json::Value;

use super::{parse, to_value};
use crate::connection::Connection;
use crate::jsonrpc::RpcError;

/// Cancels a running turn, records the close durably and drops the session from
/// memory. Afterwards `session/load` still replays it and `session/prompt`
/// answers -32005. Only the session's owner (the host owner or its creator)
/// may close it (-32011 otherwise).
pub(crate) async fn close(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let request: CloseSessionRequest = parse(params)?;
    let id = SessionId(request.session_id.0.to_string());
    super::authorize::check_owner(conn, "session/close", &id).await?;
    conn.node.close(&id, &conn.actor()).await?;
    to_value(CloseSessionResponse::new())
}
