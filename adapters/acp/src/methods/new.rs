//! `session/new` (ACP "Creating a Session"; `remote-session-control.md`, "Start").

use agent_client_protocol_schema::v1::{
    Meta, NewSessionRequest, NewSessionResponse, SessionConfigOption, SessionConfigOptionCategory,
    SessionConfigSelectOption, SessionMode, SessionModeState,
};
use berth_actors::node::{NewSession, DEFAULT_MODE_ID};
use berth_actors::Node;
use berth_runtime::ids::SessionId;
use serde_json::{json, Value};

use super::{list::session_entry, parse, to_value};
use crate::connection::Connection;
use crate::jsonrpc::RpcError;

/// The session modes berth offers (one).
pub(crate) fn modes() -> SessionModeState {
    SessionModeState::new(
        DEFAULT_MODE_ID,
        vec![SessionMode::new(DEFAULT_MODE_ID, "Default")
            .description("The configured model with shell and file tools")],
    )
}

/// The config options berth offers: the model (one value: the configured one).
pub(crate) fn config_options(node: &Node) -> Vec<SessionConfigOption> {
    let model = node.config().model.name().to_owned();
    vec![SessionConfigOption::select(
        "model",
        "Model",
        model.clone(),
        vec![SessionConfigSelectOption::new(model.clone(), model)],
    )
    .category(SessionConfigOptionCategory::Model)]
}

/// Creates a session (durable before the answer) and attaches this connection
/// to it. The answer is ACP's `{sessionId, modes, configOptions}` plus the
/// session's list entry in `_meta.berth.session`. `cwd` must be absolute and an existing directory; `mcpServers` is
/// stored with the session (an absent list counts as empty).
pub(crate) async fn new_session(conn: &Connection, mut params: Value) -> Result<Value, RpcError> {
    if let Value::Object(obj) = &mut params {
        obj.entry("mcpServers").or_insert_with(|| json!([]));
    }
    let parent = match params.pointer("/_meta/berth/parentSessionId") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() => Some(SessionId(s.clone())),
        Some(_) => {
            return Err(RpcError::invalid_params(
                "_meta.berth.parentSessionId",
                "must be a non-empty string",
            ))
        }
    };
    let labels = match params.pointer("/_meta/berth/labels") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                RpcError::invalid_params("_meta.berth.labels", "must be an array of strings")
            })?,
        Some(_) => {
            return Err(RpcError::invalid_params(
                "_meta.berth.labels",
                "must be an array of strings",
            ))
        }
    };
    let request: NewSessionRequest = parse(params)?;
    let mcp_servers = request
        .mcp_servers
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()
        .map_err(RpcError::internal)?;
    let record = conn
        .node
        .new_session_by(
            NewSession {
                cwd: request.cwd,
                additional_directories: request.additional_directories,
                mcp_servers,
                parent_session_id: parent,
                labels,
                session_id: None,
            },
            Some(&conn.actor()),
        )
        .await?;
    conn.ensure_attached(&record.session_id).await?;
    let entry = session_entry(
        &berth_actors::SessionStatus {
            record: record.clone(),
            live: true,
            active_prompt: false,
            last_event_id: 0,
            suspension_handle: None,
            quiescing: false,
            last_claim: None,
        },
        None,
        conn.principal.role,
    );
    // The seed's `session` object (the `session/list` entry) rides in
    // `_meta.berth`: ACP forbids custom root fields on its types.
    let mut meta = Meta::new();
    meta.insert("berth".into(), json!({ "session": to_value(entry)? }));
    to_value(
        NewSessionResponse::new(record.session_id.to_string())
            .modes(modes())
            .config_options(config_options(&conn.node))
            .meta(meta),
    )
}
