//! `session/cancel` (`remote-session-control.md`, "Stop").

use berth_runtime::terminal::{Terminal, TerminalKind};

use super::super::SessionState;
use crate::node::CancelStatus;

/// Stops the running turn (first cancel wins) and kills every process group the
/// session started. The turn's task sees the stop at its next seam: unsent tool
/// calls are never sent, in-flight ones are abandoned. Idempotent: the first
/// cancel of a turn answers `cancelled`, every later one — and one on an idle
/// session — `already_cancelled`.
pub(crate) fn cancel(state: &mut SessionState) -> CancelStatus {
    let first = state.turn.as_ref().is_some_and(|turn| {
        turn.control.stop(Terminal::new(
            TerminalKind::UserCancelled,
            "a client sent session/cancel",
        ))
    });
    let killed = state.processes.kill_all();
    tracing::info!(session_id = %state.record.session_id, first, killed_process_groups = killed, "cancel");
    if first {
        CancelStatus::Cancelled
    } else {
        CancelStatus::AlreadyCancelled
    }
}
