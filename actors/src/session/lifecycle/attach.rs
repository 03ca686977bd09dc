//! Attaching a watcher: `session/load` (replay) and `session/resume` (no replay).

use std::sync::Arc;

use super::super::{AttachOutcome, SessionState};
use crate::error::ControlError;
use crate::watch::Watcher;

/// Registers `watcher`. With `replay`, every persisted event is delivered to it
/// (marked replayed) before this returns, and later events arrive live exactly
/// once. Every event is durable before it is published, so there is nothing to
/// flush first.
///
/// # Errors
/// [`ControlError::Storage`] when the log cannot be read; nothing is registered.
pub(crate) fn attach(
    state: &SessionState,
    watcher: Arc<dyn Watcher>,
    replay: bool,
) -> Result<AttachOutcome, ControlError> {
    let journal = &state.env.journal;
    let session_id = &state.record.session_id;
    let replayed = state.watchers.attach(session_id, watcher, || {
        if replay {
            let events = journal.events(session_id, 0)?;
            let last = events.last().map_or(0, |(id, _)| *id);
            Ok::<_, ControlError>((events, last))
        } else {
            Ok((Vec::new(), journal.last_event_id(session_id)?))
        }
    })?;
    Ok(AttachOutcome {
        record: state.record.clone(),
        replayed: replayed
            .iter()
            .map(|(id, record)| (*id, record.event.type_name()))
            .collect(),
    })
}
