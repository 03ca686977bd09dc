//! `session/set_mode` and `session/set_config_option`: berth has one mode and
//! one model per node, so these accept exactly the current values.

use serde_json::{json, Value};

use super::new::config_options;
use super::{session_id, to_value};
use crate::connection::Connection;
use crate::jsonrpc::RpcError;

/// Accepts `modeId: "default"`; any other id is -32602 naming `modeId`.
pub(crate) async fn set_mode(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let id = session_id(&params)?;
    conn.node.ensure_exists(&id).await?;
    match params.get("modeId").and_then(Value::as_str) {
        Some(berth_actors::node::DEFAULT_MODE_ID) => Ok(json!({})),
        _ => Err(RpcError::invalid_params(
            "modeId",
            "berth offers one mode: \"default\"",
        )),
    }
}

/// Accepts `configId: "model"` with the node's model as value.
pub(crate) async fn set_config_option(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let id = session_id(&params)?;
    conn.node.ensure_exists(&id).await?;
    let model = conn.node.config().model.name().to_owned();
    if params.get("configId").and_then(Value::as_str) != Some("model") {
        return Err(RpcError::invalid_params(
            "configId",
            "berth offers one config option: \"model\"",
        ));
    }
    if params.get("value").and_then(Value::as_str) != Some(model.as_str()) {
        return Err(RpcError::invalid_params(
            "value",
            format!("this node runs one model: {model:?}"),
        ));
    }
    Ok(json!({ "configOptions": to_value(config_options(&conn.node))? }))
}
