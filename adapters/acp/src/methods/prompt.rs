//! `session/prompt` (ACP "Prompt Turn").

use agent_client_protocol_schema::v1::{
    ContentBlock, Meta, PromptRequest, PromptResponse, StopReason as AcpStop,
};
use berth_runtime::content::Prompt;
use berth_runtime::ids::SessionId;
use berth_runtime::terminal::StopReason;
use serde_json::{json, Value};

use super::{parse, to_value};
use crate::connection::Connection;
use crate::jsonrpc::RpcError;

fn acp_stop(stop: StopReason) -> AcpStop {
    match stop {
        StopReason::EndTurn => AcpStop::EndTurn,
        StopReason::MaxTokens => AcpStop::MaxTokens,
        StopReason::MaxTurnRequests => AcpStop::MaxTurnRequests,
        StopReason::Refusal => AcpStop::Refusal,
        StopReason::Cancelled => AcpStop::Cancelled,
    }
}

/// Runs one turn; the turn's `session/update`s stream to this connection and
/// every other watcher, and the answer comes once the turn is sealed (durable):
/// ACP `stopReason` plus `_meta.berth.terminal = {kind, owner, reason}`,
/// `_meta.berth.turnId` and `_meta.berth.usage` (tokens). A turn that ended in
/// an error answers -32603 with the terminal in `data`.
pub(crate) async fn prompt(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let request: PromptRequest = parse(params)?;
    if request.prompt.is_empty() {
        return Err(RpcError::invalid_params(
            "prompt",
            "must hold at least one content block",
        ));
    }
    // `initialize` advertises `promptCapabilities.image/audio: false`: such
    // blocks would silently never reach the model, so they are refused.
    for (i, block) in request.prompt.iter().enumerate() {
        let kind = match block {
            ContentBlock::Image(_) => "image",
            ContentBlock::Audio(_) => "audio",
            _ => continue,
        };
        return Err(RpcError::invalid_params(
            &format!("prompt[{i}]"),
            format!("{kind} content is not supported (promptCapabilities.{kind} is false)"),
        ));
    }
    let session_id = SessionId(request.session_id.0.to_string());
    let blocks = request
        .prompt
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()
        .map_err(RpcError::internal)?;
    conn.ensure_attached(&session_id).await?;
    // The sender shows its own prompt; other watchers get it echoed.
    let outcome = conn
        .node
        .prompt_from(&session_id, Prompt(blocks), Some(conn.id))
        .await?;
    let mut berth = json!({
        "terminal": outcome.terminal,
        "turnId": outcome.turn_id,
        "usage": outcome.usage,
    });
    if let Some(handle) = &outcome.suspension_handle {
        berth["handle"] = json!(handle);
    }
    let Some(stop) = outcome.stop_reason else {
        return Err(RpcError::new(
            -32603,
            format!("the turn failed: {}", outcome.terminal.reason),
            json!({"reason": "turn_failed", "sessionId": session_id, "berth": berth}),
        ));
    };
    let mut meta = Meta::new();
    meta.insert("berth".into(), berth);
    to_value(PromptResponse::new(acp_stop(stop)).meta(meta))
}
