//! `session/close` (ACP "Closing a Session"; `remote-session-control.md`, "Stop").

use agent_client_protocol_schema::v1::{CloseSessionRequest, CloseSessionResponse};
use berth_runtime::ids::SessionId;
use serde_json::Value;

use super::{parse, to_value};
use crate::connection::Connection;
use crate::jsonrpc::RpcError;

/// Cancels a running turn, records the close durably and drops the session from
/// memory. Afterwards `session/load` still replays it and `session/prompt`
/// answers -32005.
pub(crate) async fn close(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let request: CloseSessionRequest = parse(params)?;
    conn.node
        .close(&SessionId(request.session_id.0.to_string()), &conn.actor())
        .await?;
    to_value(CloseSessionResponse::new())
}
