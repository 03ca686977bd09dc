//! `control_outcome` receipts (`remote-session-control.md`, "Receipts").

use berth_runtime::event::{ControlOutcome, ControlStatus, SessionEvent};
use serde_json::Value;

use super::SessionState;

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
    SessionEvent::ControlOutcome(ControlOutcome {
        session_id: state.record.session_id.0.clone(),
        control_id: state.env.config.ids.new_id("ctl"),
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
