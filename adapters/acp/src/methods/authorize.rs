//! Roles on every method (issue 8, "Auth and roles"): which role each ACP
//! method needs, checked before the method's handler runs, and the refusal —
//! -32011 `role_not_authorized` plus a rejected `control_outcome` receipt.
//!
//! | role | methods |
//! |---|---|
//! | `observer` | `initialize`, `session/list`, `_berth/session.get`, `session/load`, `session/resume` (a plain reattach; claiming a suspension needs `controller`), `berth.session_view.query` / `_berth/session_view`, `session/pending_injections`, `_berth/schedule.list` |
//! | `controller` | the above, plus `session/new`, `session/prompt`, `session/cancel`, `session/cancel_tool_call`, `session/inject`, `session/revoke_inject` (own messages; another client's needs the session's owner), `session/replace_inject` (own messages), `session/suspend`, `session/rollback`, `session/redo`, `session/set_mode`, `session/set_config_option`, `_berth/event.emit`, `_berth/schedule.create \| pause \| unpause \| delete` |
//! | `host_owner` | everything, plus `_berth/suspend_many` (the operator broadcast) |
//!
//! `session/close` needs the session's owner: the host owner, or the
//! controller that created the session. Methods berth does not know need
//! only `observer` (they answer -32601 anyway).
//!
//! The receipt of a refusal on a session berth holds is journaled in that
//! session's log (and so reaches every client watching it); a refusal that
//! names no session, or an unknown one, has no log to go in and is sent to
//! the refused connection only, like the receipt of a control on an unknown
//! session.

use berth_actors::{ControlError, Role};
use berth_runtime::event::ControlStatus;
use berth_runtime::ids::SessionId;
use serde_json::{json, Value};

use crate::connection::Connection;
use crate::jsonrpc::{encode_notification, RpcError};
use crate::render::AGENT_EVENT_METHOD;

/// The code of a refusal by role.
pub const ROLE_NOT_AUTHORIZED: i64 = -32011;

/// The role `method` needs (see the module table).
pub(crate) fn required_role(method: &str) -> Role {
    match method {
        "initialize"
        | "session/list"
        | "_berth/session.get"
        | "session/load"
        | "session/resume"
        | "berth.session_view.query"
        | "_berth/session_view"
        | "session/pending_injections"
        | "_berth/schedule.list" => Role::Observer,
        "_berth/suspend_many" => Role::HostOwner,
        "session/new"
        | "session/prompt"
        | "session/cancel"
        | "session/cancel_tool_call"
        | "session/inject"
        | "session/revoke_inject"
        | "session/replace_inject"
        | "session/suspend"
        | "session/close"
        | "session/rollback"
        | "session/redo"
        | "session/set_mode"
        | "session/set_config_option"
        | "_berth/event.emit"
        | "_berth/schedule.create"
        | "_berth/schedule.pause"
        | "_berth/schedule.unpause"
        | "_berth/schedule.delete" => Role::Controller,
        // Unknown methods answer -32601 whoever asks; refusing them by role
        // would also let a client mint metric labels.
        _ => Role::Observer,
    }
}

/// The `sessionId` of `params`, when it is a non-empty string.
fn session_of(params: &Value) -> Option<SessionId> {
    params
        .get("sessionId")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(|s| SessionId(s.to_owned()))
}

/// Checks that the connection's role allows `method`; refuses it
/// otherwise (see [`refuse`]).
///
/// # Errors
/// -32011 `role_not_authorized`.
pub(crate) async fn check(conn: &Connection, method: &str, params: &Value) -> Result<(), RpcError> {
    let needed = required_role(method);
    if conn.principal.may(needed) {
        return Ok(());
    }
    Err(refuse(conn, method, session_of(params).as_ref(), needed, None).await)
}

/// Checks that the connection owns `session_id` (it is the host owner, or
/// the actor that created the session) before `method`.
///
/// # Errors
/// -32011 `role_not_authorized` (with `requiredRole: "host_owner"` and
/// `reason` saying the creator may too); -32004 for an unknown session;
/// -32603 when the session record cannot be read.
pub(crate) async fn check_owner(
    conn: &Connection,
    method: &str,
    session_id: &SessionId,
) -> Result<(), RpcError> {
    if conn.principal.role == Role::HostOwner {
        return Ok(());
    }
    let record = conn
        .node
        .journal()
        .session(session_id)
        .map_err(RpcError::internal)?;
    let Some(record) = record else {
        return Err(RpcError::unknown_session(session_id.as_str()));
    };
    if conn.principal.owns(record.created_by.as_deref()) {
        return Ok(());
    }
    Err(refuse(
        conn,
        method,
        Some(session_id),
        Role::HostOwner,
        Some("only the host owner or the client that created the session may do this"),
    )
    .await)
}

/// Refuses `method` for the connection's role: journals (or, without a
/// session log, sends) a rejected `control_outcome` receipt with reason
/// `role_not_authorized`, and returns the -32011 error whose `data` is
/// `{reason: "role_not_authorized", method, actor, role, requiredRole,
/// sessionId?, detail?}`.
pub(crate) async fn refuse(
    conn: &Connection,
    method: &str,
    session_id: Option<&SessionId>,
    needed: Role,
    detail: Option<&str>,
) -> RpcError {
    let mut data = json!({
        "reason": "role_not_authorized",
        "method": method,
        "actor": conn.principal.actor,
        "role": conn.principal.role,
        "requiredRole": needed,
    });
    if let Some(id) = session_id {
        data["sessionId"] = json!(id);
    }
    if let Some(detail) = detail {
        data["detail"] = json!(detail);
    }
    let metadata = json!({"role": conn.principal.role, "requiredRole": needed});
    let journaled = match session_id {
        Some(id) => match conn
            .node
            .refuse_control(
                id,
                method,
                &conn.actor(),
                "role_not_authorized",
                metadata.clone(),
            )
            .await
        {
            Ok(()) => {
                // The connection may not watch the session: make sure the
                // refused client hears its receipt too (observers watching
                // it already got it live, once).
                if !conn.is_attached(id) {
                    send_receipt(conn, method, Some(id), metadata.clone());
                }
                true
            }
            Err(ControlError::UnknownSession { .. }) => false,
            Err(e) => {
                tracing::warn!(error = %e, method, "could not journal a refusal's receipt");
                false
            }
        },
        None => false,
    };
    if !journaled {
        berth_actors::metrics::count_control(method, ControlStatus::Rejected);
        send_receipt(conn, method, session_id, metadata);
    }
    RpcError::new(ROLE_NOT_AUTHORIZED, "Role not authorized", data)
}

/// Sends the refusal's receipt to this connection only (same shape as a
/// journaled one, minus the `eventId` it does not have).
fn send_receipt(conn: &Connection, method: &str, session_id: Option<&SessionId>, metadata: Value) {
    let event = conn.node.unjournaled_receipt(
        &session_id.cloned().unwrap_or_else(|| SessionId::from("")),
        method,
        &conn.actor(),
        ControlStatus::Rejected,
        "rejected",
        json!({"sessionId": session_id}),
        Some("role_not_authorized"),
        metadata,
    );
    let mut params = json!({"type": "control_outcome", "event": event});
    if let Some(id) = session_id {
        params["sessionId"] = json!(id);
    }
    conn.send(encode_notification(AGENT_EVENT_METHOD, &params));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observers_read_controllers_steer_owners_broadcast() {
        for m in ["session/list", "session/load", "berth.session_view.query"] {
            assert_eq!(required_role(m), Role::Observer, "{m}");
        }
        for m in [
            "session/prompt",
            "session/inject",
            "session/suspend",
            "session/cancel",
            "_berth/event.emit",
            "_berth/schedule.create",
        ] {
            assert_eq!(required_role(m), Role::Controller, "{m}");
        }
        assert_eq!(required_role("_berth/schedule.list"), Role::Observer);
        assert_eq!(required_role("_berth/suspend_many"), Role::HostOwner);
    }
}
