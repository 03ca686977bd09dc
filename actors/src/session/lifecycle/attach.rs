//! Attaching a watcher: `session/load` (replay) and `session/resume` (no replay).

use std::sync::Arc;

use super::super::{AttachOutcome, Replay, SessionState};
use crate::error::ControlError;
use crate::watch::Watcher;

/// Registers `watcher`. With [`Replay::After`], every persisted event after
/// the given id is delivered to it (marked replayed) before this returns, and
/// later events arrive live exactly once: a client that reconnects with the
/// last event id it acknowledged gets exactly what it missed. Every event is
/// durable before it is published, so there is nothing to flush first.
///
/// # Errors
/// [`ControlError::InvalidParams`] (field `_meta.berth.lastEventId`) when the
/// id is past the session's last event; [`ControlError::Storage`] when the
/// log cannot be read. Nothing is registered then.
pub(crate) fn attach(
    state: &SessionState,
    watcher: Arc<dyn Watcher>,
    replay: Replay,
) -> Result<AttachOutcome, ControlError> {
    let journal = &state.env.journal;
    let session_id = &state.record.session_id;
    let replayed = state
        .watchers
        .attach(session_id, watcher, || match replay {
            Replay::After(after) => {
                let last = journal.last_event_id(session_id)?;
                if after > last {
                    return Err(ControlError::invalid(
                        "_meta.berth.lastEventId",
                        &format!("{after} is past the session's last event id {last}"),
                    ));
                }
                let events = journal.events(session_id, after)?;
                let upto = events.last().map_or(after, |(id, _)| *id);
                Ok::<_, ControlError>((events, upto))
            }
            Replay::None => Ok((Vec::new(), journal.last_event_id(session_id)?)),
        })?;
    Ok(AttachOutcome {
        record: state.record.clone(),
        replayed: replayed
            .iter()
            .map(|(id, record)| (*id, record.event.type_name()))
            .collect(),
    })
}
