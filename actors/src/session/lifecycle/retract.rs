//! `session/revoke_inject` and `session/replace_inject`: pulling a message back
//! before it lands.

use berth_runtime::content::Prompt;
use berth_runtime::event::{ControlStatus, SessionEvent};
use berth_runtime::steering::InjectionConflict;
use serde_json::{json, Value};

use super::super::receipt::{receipt, rejected};
use super::super::SessionState;
use crate::error::ControlError;

/// Revokes (`content: None`) or replaces a pending injection of the running
/// turn. A replace keeps the message's id, mode and place in the queue. A
/// message already delivered answers `already_delivered`, one revoked before
/// `already_revoked`, an id this session never issued (or whose turn ended
/// before delivery) `unknown_message_id`, another client's
/// `not_owner_or_not_authorized` — unless `owner_override` (the session's
/// owner revoking; replace stays the injecting client's alone). The receipt
/// is durable before the answer, for rejections too.
///
/// A message the running or last turn does not know (the actor was
/// passivated or restarted since, or it belongs to an earlier turn) is
/// answered from the journal: `already_delivered` / `already_revoked` as its
/// last `injection_delivered` / `injection_revoked` event says, else
/// `unknown_message_id` — the same answer whether or not the session kept
/// its actor.
///
/// # Errors
/// [`ControlError::Injection`], [`ControlError::InvalidParams`] for replace
/// content that is empty (`invalid_content`), [`ControlError::Storage`].
pub(crate) async fn retract(
    state: &mut SessionState,
    message_id: &str,
    content: Option<&Value>,
    actor: &str,
    owner_override: bool,
) -> Result<(), ControlError> {
    let method = if content.is_some() {
        "session/replace_inject"
    } else {
        "session/revoke_inject"
    };
    let target = json!({"sessionId": state.record.session_id, "messageId": message_id});
    let replacement = match content.map(Prompt::from_inject_content) {
        Some(None) => {
            let r = rejected(state, method, actor, target, "invalid_content");
            state.record(vec![r]).await?;
            return Err(ControlError::invalid("content", "invalid_content"));
        }
        Some(Some(prompt)) => Some(prompt),
        None => None,
    };
    // The running turn's queue, else the last turn's (which remembers what
    // it delivered and what was revoked).
    let control = state
        .turn
        .as_ref()
        .map(|t| &t.control)
        .or(state.last_control.as_ref())
        .cloned();
    let result = match (&control, replacement) {
        (None, _) => Err(InjectionConflict::UnknownMessageId),
        (Some(c), None) => c
            .steering()
            .revoke_as(message_id, actor, owner_override)
            .map(|_| SessionEvent::InjectionRevoked {
                message_id: message_id.to_owned(),
            }),
        (Some(c), Some(prompt)) => c
            .steering()
            .replace(message_id, actor, prompt)
            .map(|injection| SessionEvent::InjectionReplaced { injection }),
    };
    let result = match result {
        Err(InjectionConflict::UnknownMessageId) => Err(settled_in_journal(state, message_id)?),
        other => other,
    };
    match result {
        Ok(fact) => {
            let outcome = if content.is_some() {
                "replaced"
            } else {
                "revoked"
            };
            let r = receipt(
                state,
                method,
                actor,
                ControlStatus::Accepted,
                outcome,
                target,
                None,
            );
            state.record(vec![fact, r]).await
        }
        Err(conflict) => {
            let r = rejected(state, method, actor, target, conflict.reason());
            state.record(vec![r]).await?;
            Err(ControlError::Injection {
                message_id: message_id.to_owned(),
                conflict,
            })
        }
    }
}

/// What the journal says became of `message_id` in a finished turn.
///
/// # Errors
/// [`ControlError::Storage`].
fn settled_in_journal(
    state: &SessionState,
    message_id: &str,
) -> Result<InjectionConflict, ControlError> {
    let events = state.env.journal.events(&state.record.session_id, 0)?;
    Ok(events
        .iter()
        .rev()
        .find_map(|(_, record)| match &record.event {
            SessionEvent::InjectionDelivered { injection, .. }
                if injection.message_id == message_id =>
            {
                Some(InjectionConflict::AlreadyDelivered)
            }
            SessionEvent::InjectionRevoked { message_id: id } if id == message_id => {
                Some(InjectionConflict::AlreadyRevoked)
            }
            _ => None,
        })
        .unwrap_or(InjectionConflict::UnknownMessageId))
}
