//! `session/cancel` (`remote-session-control.md`, "Stop").

use berth_runtime::event::ControlStatus;
use berth_runtime::terminal::{Terminal, TerminalKind};
use serde_json::json;

use ractor::ActorRef;

use super::super::receipt::receipt;
use super::super::{SessionMsg, SessionState};
use crate::error::ControlError;
use crate::node::CancelStatus;

/// Stops the running turn (first cancel wins) and kills every process group the
/// session started. The turn's task sees the stop at its next seam: unsent tool
/// calls are never sent, in-flight ones are abandoned. Idempotent: the first
/// cancel of a turn answers `cancelled` (receipt `accepted`), every later one —
/// and one on an idle session — `already_cancelled` (receipt `idempotent`).
/// The receipt is durable before the answer.
///
/// # Errors
/// [`ControlError::Storage`] when the receipt cannot be journaled; the stop
/// itself has then still been requested (a stop is never held back).
pub(crate) async fn cancel(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    actor: &str,
) -> Result<CancelStatus, ControlError> {
    match cancel_once(state, actor).await {
        // A wake-up's claim landed first: the session is resuming. That
        // resume is completed, and the cancel stops the turn it started.
        Err(e) if super::resume::lost_to_a_claim(&e) => {
            if let Some(Err(e)) = super::resume::settle_claimed(myself, state).await {
                return Err(e);
            }
            cancel_once(state, actor).await
        }
        other => other,
    }
}

async fn cancel_once(state: &mut SessionState, actor: &str) -> Result<CancelStatus, ControlError> {
    let first = state.turn.as_ref().is_some_and(|turn| {
        turn.control.stop(Terminal::new(
            TerminalKind::UserCancelled,
            "a client sent session/cancel",
        ))
    });
    let killed = state.processes.kill_all();
    tracing::info!(session_id = %state.record.session_id, first, killed_process_groups = killed, "cancel");
    let (status, outcome, answer) = if first {
        (
            ControlStatus::Accepted,
            "cancelled",
            CancelStatus::Cancelled,
        )
    } else {
        (
            ControlStatus::Idempotent,
            "already_cancelled",
            CancelStatus::AlreadyCancelled,
        )
    };
    let target = json!({"sessionId": state.record.session_id});
    // A turn parked by a suspension is work too: cancelling drops it (the
    // suspension's handle is used up, the turn sealed `user_cancelled`).
    let parked_turn =
        state.turn.is_none() && state.suspension.as_ref().is_some_and(|s| s.frame.is_some());
    if parked_turn {
        let mut record = state.record.clone();
        let cancelled = super::suspend::cancel_suspension(
            state,
            &mut record,
            actor,
            berth_runtime::suspension::ResumeClaimKind::Cancelled,
            Terminal::new(
                TerminalKind::UserCancelled,
                "a client sent session/cancel while the session was suspended",
            ),
            "the suspended turn was cancelled",
        );
        if let Some(super::suspend::Cancelled {
            batch,
            mut events,
            appended,
            claim,
        }) = cancelled
        {
            events.push(receipt(
                state,
                "session/cancel",
                actor,
                ControlStatus::Accepted,
                "cancelled",
                target,
                Some("suspended_turn"),
            ));
            state
                .record_with(batch.put_session(&record), events)
                .await?;
            state.record = record;
            state.unpark();
            state.transcript.extend(appended);
            state.last_claim = Some(claim);
            return Ok(CancelStatus::Cancelled);
        }
    }
    state
        .record(vec![receipt(
            state,
            "session/cancel",
            actor,
            status,
            outcome,
            target,
            None,
        )])
        .await?;
    Ok(answer)
}
