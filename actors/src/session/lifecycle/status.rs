//! The live status of a session (`session/list` entry).

use super::super::SessionState;
use crate::node::SessionStatus;

/// Status as this actor knows it: live, with `activePrompt` true while a turn runs.
pub(crate) fn status(state: &SessionState) -> SessionStatus {
    SessionStatus {
        record: state.record.clone(),
        live: true,
        active_prompt: state.turn.is_some(),
        last_event_id: state.watchers.last_event_id(),
        suspension_handle: state.suspension.as_ref().map(|s| s.handle.clone()),
        quiescing: state.record.suspend_request.is_some()
            && state
                .turn
                .as_ref()
                .is_some_and(|t| t.control.is_quiescing()),
        last_claim: state.last_claim.clone(),
    }
}
