//! `session/close`: cancel, flush, drop (`remote-session-control.md`, "Stop").

use berth_runtime::event::{ControlStatus, SessionEvent};
use berth_runtime::suspension::ResumeClaimKind;
use berth_runtime::terminal::{Terminal, TerminalKind};
use berth_storage::Batch;
use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::json;

use super::super::receipt::receipt;
use super::super::{SessionMsg, SessionState};
use crate::error::ControlError;

/// A close waiting for the running turn to be sealed: who sent it, and where
/// to answer.
pub(crate) type PendingClose = (String, RpcReplyPort<Result<(), ControlError>>);

/// Closes the session. A running turn is stopped (terminal `session_closed`,
/// owner `user`) and the close completes once it is sealed. Closing a closed
/// session succeeds and changes nothing (receipt `idempotent`,
/// `already_closed`).
pub(crate) async fn close(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    actor: String,
    reply: RpcReplyPort<Result<(), ControlError>>,
) -> Result<(), ActorProcessingErr> {
    if state.record.closed_at.is_some() {
        let target = json!({"sessionId": state.record.session_id});
        let r = receipt(
            state,
            "session/close",
            &actor,
            ControlStatus::Idempotent,
            "already_closed",
            target,
            None,
        );
        let _ = reply.send(state.record(vec![r]).await);
        return Ok(());
    }
    state.pending_close.push((actor, reply));
    if stop_running_turn(state) {
        return Ok(()); // finalized by prompt::finish once the turn is sealed
    }
    finalize(myself, state).await
}

/// Stops the running turn, if any, for the close (terminal
/// `session_closed`) and kills the session's processes; whether there was
/// one.
fn stop_running_turn(state: &SessionState) -> bool {
    let Some(turn) = &state.turn else {
        return false;
    };
    turn.control.stop(Terminal::new(
        TerminalKind::SessionClosed,
        "a client sent session/close",
    ));
    state.processes.kill_all();
    true
}

/// Records the close durably (`session_closed` event, `closed_at`, one
/// receipt per waiting close: the first `accepted`, the others `idempotent`),
/// answers every waiting close, and drains the actor: once the controls queued
/// behind the close are answered the session is dropped from memory. It stays
/// readable by `session/load` (which rehydrates it, read-only).
///
/// A wake-up's claim that lands first (the session is resuming) is
/// completed, and the close then stops the turn it started, as a close of a
/// running session does.
///
/// # Errors
/// A journal failure is answered to the waiting closes and fails the actor.
pub(crate) async fn finalize(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ActorProcessingErr> {
    match finalize_once(myself, state).await {
        Err(e) if super::resume::lost_to_a_claim(&e) => {
            if let Some(Err(e)) = super::resume::settle_claimed(myself, state).await {
                tracing::warn!(session_id = %state.record.session_id, error = %e, "a close lost to a wake-up whose resume could not be completed");
            }
            if stop_running_turn(state) {
                return Ok(()); // finalized by prompt::finish once the turn is sealed
            }
            let again = finalize_once(myself, state).await;
            answer(state, again)
        }
        result => answer(state, result),
    }
}

/// Answers the waiting closes with a failed close's error (which then fails
/// the actor); a close that landed has answered them already.
fn answer(
    state: &mut SessionState,
    result: Result<(), ControlError>,
) -> Result<(), ActorProcessingErr> {
    match result {
        Ok(()) => Ok(()),
        Err(e) => {
            for (_, reply) in std::mem::take(&mut state.pending_close) {
                let _ = reply.send(Err(e.clone()));
            }
            Err(Box::new(e))
        }
    }
}

/// One attempt at the close's write. On failure the waiting closes are put
/// back, unanswered.
async fn finalize_once(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Result<(), ControlError> {
    state.processes.kill_all();
    let now = state.env.config.clock.now();
    let mut record = state.record.clone();
    record.closed_at = Some(now);
    record.updated_at = now;
    let pending = std::mem::take(&mut state.pending_close);
    let target = json!({"sessionId": record.session_id});
    let mut batch = Batch::new();
    let mut events = Vec::new();
    let mut appended = Vec::new();
    // Close while suspended cancels the suspension and seals a parked turn.
    let actor = pending
        .first()
        .map_or("host", |(a, _)| a.as_str())
        .to_owned();
    if let Some(super::suspend::Cancelled {
        batch: ops,
        events: cancelled,
        appended: messages,
        ..
    }) = super::suspend::cancel_suspension(
        state,
        &mut record,
        &actor,
        ResumeClaimKind::Cancelled,
        Terminal::new(
            TerminalKind::SessionClosed,
            "a client sent session/close while the session was suspended",
        ),
        "the session was closed while suspended",
    ) {
        batch = ops;
        events = cancelled;
        appended = messages;
    }
    events.push(SessionEvent::SessionClosed {});
    for (i, (actor, _)) in pending.iter().enumerate() {
        let (status, outcome) = if i == 0 {
            (ControlStatus::Accepted, "closed")
        } else {
            (ControlStatus::Idempotent, "already_closed")
        };
        events.push(receipt(
            state,
            "session/close",
            actor,
            status,
            outcome,
            target.clone(),
            None,
        ));
    }
    match state.record_with(batch.put_session(&record), events).await {
        Ok(()) => {
            state.record = record;
            state.unpark();
            state.transcript.extend(appended);
            for (_, reply) in pending {
                let _ = reply.send(Ok(()));
            }
            // Drain, not stop: controls already queued behind the close are
            // still answered (as for a closed session); later ones reach a
            // fresh actor rehydrated from the journal.
            let _ = myself.drain();
            Ok(())
        }
        Err(e) => {
            state.pending_close = pending;
            Err(e)
        }
    }
}
