//! `session/inject` and `session/pending_injections`
//! (`remote-session-control.md`, "Steer", "Queue", "Interrupt").

use berth_runtime::content::Prompt;
use berth_runtime::event::{ControlStatus, SessionEvent};
use berth_runtime::steering::{InjectMode, Injection};
use serde_json::{json, Value};

use super::super::receipt::{receipt, rejected};
use super::super::SessionState;
use crate::error::ControlError;

const METHOD: &str = "session/inject";

/// Accepts a message for the running turn. In the seed's order: no running
/// turn (none, or one already stopped and winding down) → -32004
/// `NoActivePrompt` (before the mode is even read); unknown mode
/// → `invalid_mode`; empty or malformed content → `invalid_content`. Accepted
/// means queued, not delivered: the turn drains it at the next seam its mode
/// allows. Every outcome, rejected ones too, leaves a durable `control_outcome`.
///
/// # Errors
/// The rejections above; [`ControlError::Storage`].
pub(crate) async fn inject(
    state: &mut SessionState,
    mode: &str,
    content: &Value,
    actor: &str,
) -> Result<String, ControlError> {
    let session_id = state.record.session_id.clone();
    let target = json!({"sessionId": session_id});
    let reject =
        |state: &SessionState, reason: &str| rejected(state, METHOD, actor, target.clone(), reason);
    // A turn a stop has ended (a cancel answered `cancelled`, a budget
    // stop) is only winding down to its seal: nothing would deliver the
    // message, so it has no active prompt either.
    let Some(control) = state
        .turn
        .as_ref()
        .map(|t| t.control.clone())
        .filter(|c| !c.is_stopped())
    else {
        state
            .record(vec![reject(state, "no_active_prompt")])
            .await?;
        return Err(ControlError::NoActivePrompt { session_id });
    };
    let Some(mode) = InjectMode::parse(mode) else {
        state.record(vec![reject(state, "invalid_mode")]).await?;
        return Err(ControlError::invalid("mode", "invalid_mode"));
    };
    let Some(content) = Prompt::from_inject_content(content) else {
        state.record(vec![reject(state, "invalid_content")]).await?;
        return Err(ControlError::invalid("content", "invalid_content"));
    };
    let injection = Injection {
        message_id: state.env.config.ids.new_id("msg"),
        mode,
        content,
        owner: actor.to_owned(),
    };
    let accepted = receipt(
        state,
        METHOD,
        actor,
        ControlStatus::Accepted,
        "accepted",
        json!({"sessionId": session_id, "messageId": injection.message_id}),
        None,
    );
    state
        .record(vec![
            SessionEvent::InjectionAccepted {
                injection: injection.clone(),
            },
            accepted,
        ])
        .await?;
    let message_id = injection.message_id.clone();
    // Durable first, then visible to the turn.
    control.steering().push(injection);
    Ok(message_id)
}

/// The running turn's undelivered injections, in delivery (FIFO) order.
pub(crate) fn pending(state: &SessionState) -> Vec<Injection> {
    state
        .turn
        .as_ref()
        .map(|t| t.control.steering().pending().cloned().collect())
        .unwrap_or_default()
}
