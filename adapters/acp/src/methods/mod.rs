//! ACP methods, one file per method group. Each handler decodes its params
//! (official schema types where ACP defines the method), calls the node, and
//! encodes the result; errors are typed [`RpcError`]s.

mod attach;
pub mod authorize;
mod cancel;
mod close;
mod initialize;
mod inject;
mod list;
mod modes;
mod new;
mod prompt;
mod suspend;

use berth_runtime::ids::SessionId;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::connection::Connection;
use crate::jsonrpc::RpcError;

/// Answers one request: the connection's role is checked first
/// ([`authorize`]), then the method runs.
///
/// # Errors
/// -32011 when the role does not allow the method; -32601 for an unknown
/// method; the method's own typed errors otherwise.
pub async fn handle_request(
    conn: &Connection,
    method: &str,
    params: Value,
) -> Result<Value, RpcError> {
    authorize::check(conn, method, &params).await?;
    match method {
        "initialize" => initialize::initialize(conn, params),
        "session/new" => new::new_session(conn, params).await,
        "session/prompt" => prompt::prompt(conn, params).await,
        "session/cancel" => cancel::cancel(conn, params).await,
        "session/list" => list::list(conn, params).await,
        "_berth/session.get" => list::get(conn, params).await,
        "session/load" => attach::load(conn, params).await,
        "session/resume" => attach::resume(conn, params).await,
        "session/close" => close::close(conn, params).await,
        "session/suspend" => suspend::suspend(conn, params).await,
        "_berth/event.emit" => suspend::emit_event(conn, params).await,
        "_berth/suspend_many" => suspend::suspend_many(conn, params).await,
        m if m.starts_with("_berth/schedule.") => {
            suspend::schedule(conn, &m["_berth/schedule.".len()..], params).await
        }
        "session/cancel_tool_call" => cancel::cancel_tool_call(conn, params).await,
        "session/inject" => inject::inject(conn, params).await,
        "session/revoke_inject" => inject::revoke(conn, params).await,
        "session/replace_inject" => inject::replace(conn, params).await,
        "session/pending_injections" => inject::pending(conn, params).await,
        "session/rollback" | "session/redo" => {
            let id = session_id(&params)?;
            attach_controller(conn, method, &id).await?;
            conn.node
                .rollback(&id, method == "session/redo", &conn.actor())
                .await
                .map_err(|e| receipt_unknown_session(conn, method, &id, e))
        }
        // The seed's name, and the `_`-prefixed form ACP requires of custom methods.
        "berth.session_view.query" | "_berth/session_view" => {
            let id = session_id(&params)?;
            Ok(conn.node.session_view(&id).await?)
        }
        "session/set_mode" => modes::set_mode(conn, params).await,
        "session/set_config_option" => modes::set_config_option(conn, params).await,
        _ => Err(RpcError::method_not_found(method)),
    }
}

/// Handles one notification (never answered). `session/cancel` is the one ACP
/// defines client → agent; others are logged and dropped.
pub async fn handle_notification(conn: &Connection, method: &str, params: Value) {
    if let Err(e) = authorize::check(conn, method, &params).await {
        tracing::warn!(code = e.code, data = %e.data, "notification refused");
        return;
    }
    match method {
        "session/cancel" => {
            if let Err(e) = cancel::cancel(conn, params).await {
                tracing::warn!(code = e.code, data = %e.data, "session/cancel notification refused");
            }
        }
        _ => tracing::debug!(method, "ignored notification"),
    }
}

/// Decodes `params` as `T`, mapping errors to -32602 whose `data.field` is the
/// path of the offending field as sent (`cwd`, `prompt[0].text`, …).
pub(crate) fn parse<T: DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_path_to_error::deserialize(params).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            RpcError::from_serde(&inner)
        } else {
            RpcError::invalid_params(&path, inner)
        }
    })
}

/// Reads the required `sessionId` string.
pub(crate) fn session_id(params: &Value) -> Result<SessionId, RpcError> {
    match params.get("sessionId") {
        Some(Value::String(s)) if !s.is_empty() => Ok(SessionId(s.clone())),
        Some(_) => Err(RpcError::invalid_params(
            "sessionId",
            "must be a non-empty string",
        )),
        None => Err(RpcError::invalid_params("sessionId", "is required")),
    }
}

/// Serializes a schema type (infallible for the types we build).
pub(crate) fn to_value<T: serde::Serialize>(value: T) -> Result<Value, RpcError> {
    serde_json::to_value(value).map_err(RpcError::internal)
}

/// A control naming a session the server does not hold has no session log to
/// journal its receipt in: the `control_outcome` (rejected, `unknown_session`)
/// goes to the requesting connection only, then the error is answered.
pub(crate) fn receipt_unknown_session(
    conn: &Connection,
    method: &str,
    session_id: &SessionId,
    error: berth_actors::ControlError,
) -> RpcError {
    if let berth_actors::ControlError::UnknownSession { .. } = &error {
        berth_actors::metrics::count_control(method, berth_runtime::event::ControlStatus::Rejected);
        let event = conn.node.unjournaled_receipt(
            session_id,
            method,
            &conn.actor(),
            berth_runtime::event::ControlStatus::Rejected,
            "unknown_session",
            serde_json::json!({"sessionId": session_id}),
            Some("unknown_session"),
            Value::Null,
        );
        // Same shape as a journaled receipt, minus the eventId it cannot have.
        conn.send(crate::jsonrpc::encode_notification(
            crate::render::AGENT_EVENT_METHOD,
            &serde_json::json!({
                "sessionId": session_id,
                "type": "control_outcome",
                "event": event,
            }),
        ));
    }
    error.into()
}

/// Attaches this connection to the session it controls (so the receipts and
/// the effects of its control reach it live), answering an unknown session
/// with its unjournaled receipt and -32004.
pub(crate) async fn attach_controller(
    conn: &Connection,
    method: &str,
    session_id: &SessionId,
) -> Result<(), RpcError> {
    if conn.is_attached(session_id) {
        return Ok(());
    }
    match conn.node.attach(session_id, conn.watcher(), false).await {
        Ok(_) => {
            conn.mark_attached(session_id);
            Ok(())
        }
        Err(e) => Err(receipt_unknown_session(conn, method, session_id, e)),
    }
}
