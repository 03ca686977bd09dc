//! `session/cancel_tool_call` (`remote-session-control.md`, "Stop": the narrower stop).

use berth_runtime::engine::CallCancel;
use berth_runtime::event::ControlStatus;
use serde_json::json;

use super::super::receipt::{control_outcome, signed_outcome};
use super::super::SessionState;
use crate::error::ControlError;

/// Stops one tool call of the running turn — kills the process groups it
/// started, or keeps it from being sent — without ending the turn: the model
/// reads a "cancelled" result for it. `cancelled` for the request that did it,
/// `already_cancelled` after, `not_found` for an id that is not an unfinished
/// call of the running turn. The receipt is durable before the answer.
///
/// # Errors
/// [`ControlError::Storage`].
pub(crate) async fn cancel_tool_call(
    state: &mut SessionState,
    tool_call_id: &str,
    reason: Option<&str>,
    actor: &str,
) -> Result<CallCancel, ControlError> {
    let answer = match &state.turn {
        Some(turn) => turn.control.cancel_call(tool_call_id),
        None => CallCancel::NotFound,
    };
    let (status, outcome) = match answer {
        CallCancel::Cancelled => (ControlStatus::Accepted, "cancelled"),
        CallCancel::AlreadyCancelled => (ControlStatus::Idempotent, "already_cancelled"),
        CallCancel::NotFound => (ControlStatus::Rejected, "not_found"),
    };
    let target = json!({"sessionId": state.record.session_id, "toolCallId": tool_call_id});
    let rejected = (answer == CallCancel::NotFound).then_some("not_found");
    let mut outcome = control_outcome(
        &state.env,
        &state.record.session_id,
        "session/cancel_tool_call",
        actor,
        status,
        outcome,
        target,
        rejected,
    );
    if let Some(why) = reason {
        outcome.metadata = json!({ "reason": why });
    }
    // Signed with its metadata.
    let event = signed_outcome(&state.env, outcome);
    state.record(vec![event]).await?;
    Ok(answer)
}
