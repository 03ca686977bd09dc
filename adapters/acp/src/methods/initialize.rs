//! `initialize` (ACP "Initialization").

use agent_client_protocol_schema::v1::{
    AgentCapabilities, Implementation, InitializeRequest, InitializeResponse, Meta,
    PromptCapabilities, SessionCapabilities, SessionCloseCapabilities, SessionListCapabilities,
    SessionResumeCapabilities,
};
use agent_client_protocol_schema::ProtocolVersion;
use berth_runtime::suspension::ResumeCause;
use serde_json::{json, Value};

use super::{parse, to_value};
use crate::connection::Connection;
use crate::jsonrpc::RpcError;

/// The suspend RFC's agent capabilities, under `agentCapabilities._meta.berth`
/// (ACP forbids custom root fields). `resumeCauses` lists what can wake a
/// session: an explicit `session/resume`, a time trigger (`condition_fired`),
/// a timeout, and an external event.
fn suspend_capabilities() -> Meta {
    let mut meta = Meta::new();
    meta.insert(
        "berth".into(),
        json!({
            "supportsSuspend": true,
            "supportsAwaitResumption": true,
            "resumeCauses": ResumeCause::ALL,
        }),
    );
    meta
}

/// Negotiates protocol version 1 and advertises what berth implements:
/// `loadSession`, `sessionCapabilities.{list, resume, close}`, and prompt
/// capabilities as they are — text and embedded text resources reach the model
/// (`embeddedContext: true`); images and audio do not (`false`). The answer's
/// `_meta.berth.principal` is `{actor, role}`: who this connection is
/// authenticated as (the actor receipts record) and what it may do.
pub(crate) fn initialize(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let request: InitializeRequest = parse(params)?;
    if let Ok(caps) = serde_json::to_value(&request.client_capabilities) {
        conn.extensions.declare(&caps);
        *conn
            .client_capabilities
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = caps;
    }
    let capabilities = AgentCapabilities::new()
        .load_session(true)
        .prompt_capabilities(PromptCapabilities::new().embedded_context(true))
        .session_capabilities(
            SessionCapabilities::new()
                .list(SessionListCapabilities::new())
                .resume(SessionResumeCapabilities::new())
                .close(SessionCloseCapabilities::new()),
        )
        .meta(suspend_capabilities());
    let mut meta = Meta::new();
    meta.insert(
        "berth".into(),
        serde_json::json!({"principal": {"actor": conn.principal.actor, "role": conn.principal.role}}),
    );
    to_value(
        InitializeResponse::new(ProtocolVersion::V1)
            .agent_capabilities(capabilities)
            .agent_info(Implementation::new("berth", env!("CARGO_PKG_VERSION")).title("berth"))
            .meta(meta),
    )
}
