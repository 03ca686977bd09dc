//! `control_outcome` receipts (`remote-session-control.md`, "Receipts").

use berth_runtime::event::{ControlOutcome, ControlStatus, SessionEvent};
use serde_json::Value;

use berth_runtime::ids::SessionId;

use super::{SessionEnv, SessionState};

/// Builds the receipt of one arbitrated control on this session.
pub(crate) fn receipt(
    state: &SessionState,
    method: &str,
    actor: &str,
    status: ControlStatus,
    outcome: &str,
    target: Value,
    reason: Option<&str>,
) -> SessionEvent {
    receipt_in(
        &state.env,
        &state.record.session_id,
        method,
        actor,
        status,
        outcome,
        target,
        reason,
    )
}

/// [`receipt`] without an actor state (start-up recovery).
#[allow(clippy::too_many_arguments)]
pub(crate) fn receipt_in(
    env: &SessionEnv,
    session_id: &SessionId,
    method: &str,
    actor: &str,
    status: ControlStatus,
    outcome: &str,
    target: Value,
    reason: Option<&str>,
) -> SessionEvent {
    SessionEvent::ControlOutcome(ControlOutcome {
        session_id: session_id.0.clone(),
        control_id: env.config.ids.new_id("ctl"),
        method: method.into(),
        outcome: outcome.into(),
        status,
        actor: actor.into(),
        target,
        reason: reason.map(str::to_owned),
        metadata: Value::Null,
    })
}

/// The receipt of a refused control: status `rejected`, outcome `rejected`,
/// and the machine-readable `reason`.
pub(crate) fn rejected(
    state: &SessionState,
    method: &str,
    actor: &str,
    target: Value,
    reason: &str,
) -> SessionEvent {
    receipt(
        state,
        method,
        actor,
        ControlStatus::Rejected,
        "rejected",
        target,
        Some(reason),
    )
}
