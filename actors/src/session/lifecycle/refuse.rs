//! A control refused before its handler ran: the sender's role does not allow
//! the method (issue 8, "Auth and roles"). The refusal still leaves its
//! durable `control_outcome` receipt (status `rejected`) in the session's log,
//! like every other arbitrated control (`remote-session-control.md`,
//! "Receipts"), so an audit shows who tried what.

use serde_json::{json, Value};

use super::super::receipt::rejected;
use super::super::SessionState;
use crate::error::ControlError;

/// Journals the rejected receipt of `method` by `actor` with `reason`
/// (`role_not_authorized`) and `metadata`; returns once it is durable.
///
/// # Errors
/// [`ControlError::Storage`]: nothing was written.
pub(crate) async fn refuse(
    state: &SessionState,
    method: &str,
    actor: &str,
    reason: &str,
    metadata: Value,
) -> Result<(), ControlError> {
    let target = json!({"sessionId": state.record.session_id});
    let mut receipt = rejected(state, method, actor, target, reason);
    if let berth_runtime::event::SessionEvent::ControlOutcome(outcome) = &mut receipt {
        outcome.metadata = metadata;
    }
    state.record(vec![receipt]).await
}
