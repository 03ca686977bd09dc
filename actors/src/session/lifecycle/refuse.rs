//! A control refused before its handler ran: the sender's role does not allow
//! the method (issue 8, "Auth and roles"). The refusal still leaves its
//! durable `control_outcome` receipt (status `rejected`) in the session's log,
//! like every other arbitrated control (`remote-session-control.md`,
//! "Receipts"), so an audit shows who tried what.

use serde_json::{json, Value};

use berth_runtime::event::ControlStatus;

use super::super::receipt::{control_outcome, signed_outcome};
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
    let mut outcome = control_outcome(
        &state.env,
        &state.record.session_id,
        method,
        actor,
        ControlStatus::Rejected,
        "rejected",
        target,
        Some(reason),
    );
    // Set before signing: the signature covers the metadata too.
    outcome.metadata = metadata;
    state
        .record(vec![signed_outcome(&state.env, outcome)])
        .await
}
