//! `session/close`: cancel, flush, drop (`remote-session-control.md`, "Stop").

use std::sync::Arc;

use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::terminal::{Terminal, TerminalKind};
use berth_storage::Batch;
use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};

use super::super::{SessionMsg, SessionState};
use crate::error::ControlError;

/// Closes the session. A running turn is stopped (terminal `session_closed`,
/// owner `user`) and the close completes once it is sealed. Closing a closed
/// session succeeds and changes nothing.
pub(crate) async fn close(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    reply: RpcReplyPort<Result<(), ControlError>>,
) -> Result<(), ActorProcessingErr> {
    if state.record.closed_at.is_some() {
        let _ = reply.send(Ok(()));
        return Ok(());
    }
    state.pending_close.push(reply);
    if let Some(turn) = &state.turn {
        turn.control.stop(Terminal::new(
            TerminalKind::SessionClosed,
            "a client sent session/close",
        ));
        state.processes.kill_all();
        return Ok(()); // finalized by prompt::finish once the turn is sealed
    }
    finalize(myself, state).await
}

/// Records the close durably (`session_closed` event, `closed_at`), answers every
/// waiting close, and drains the actor: once the controls queued behind the
/// close are answered the session is dropped from memory. It stays readable by
/// `session/load` (which rehydrates it, read-only).
///
/// # Errors
/// A journal failure is answered to the waiting closes and fails the actor.
pub(crate) async fn finalize(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    state.processes.kill_all();
    let env = Arc::clone(&state.env);
    let now = env.config.clock.now();
    let mut record = state.record.clone();
    record.closed_at = Some(now);
    record.updated_at = now;
    let closed = EventRecord {
        at: now,
        event: SessionEvent::SessionClosed {},
    };
    let session_id = record.session_id.clone();
    let result = env
        .journal
        .commit(
            Batch::new()
                .put_session(&record)
                .append(&session_id, &closed),
        )
        .await;
    let replies = std::mem::take(&mut state.pending_close);
    match result {
        Ok(ids) => {
            state.record = record;
            let closed = Arc::new(closed);
            state
                .watchers
                .publish(&session_id, ids.iter().map(|&id| (id, Arc::clone(&closed))));
            for reply in replies {
                let _ = reply.send(Ok(()));
            }
            // Drain, not stop: controls already queued behind the close are
            // still answered (as for a closed session); later ones reach a
            // fresh actor rehydrated from the journal.
            let _ = myself.drain();
            Ok(())
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone().into()));
            }
            Err(Box::new(e))
        }
    }
}
