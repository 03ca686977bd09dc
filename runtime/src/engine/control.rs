//! The control block shared by a session actor and its running turn.

use std::sync::{Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

use crate::steering::SteeringQueue;
use crate::terminal::{Terminal, TerminalKind};

/// What the actor can ask of a running turn. The turn reads it only at seams.
#[derive(Debug, Default)]
pub struct TurnControl {
    cancel: CancellationToken,
    stop: Mutex<Option<Terminal>>,
    steering: Mutex<SteeringQueue>,
}

impl TurnControl {
    /// Asks the turn to stop with `terminal`. The first stop wins; returns
    /// `false` when the turn was already asked to stop.
    pub fn stop(&self, terminal: Terminal) -> bool {
        let mut stop = self.stop.lock().unwrap_or_else(|e| e.into_inner());
        if stop.is_some() {
            return false;
        }
        *stop = Some(terminal);
        self.cancel.cancel();
        true
    }

    /// Whether a stop was requested.
    pub fn is_stopped(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves when a stop is requested (cancel-safe).
    pub async fn stopped(&self) {
        self.cancel.cancelled().await
    }

    /// The turn's steering queue (injected messages not yet delivered).
    pub fn steering(&self) -> MutexGuard<'_, SteeringQueue> {
        self.steering.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The terminal the stop asked for (`user_cancelled` if none was recorded).
    pub fn stop_terminal(&self) -> Terminal {
        self.stop
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| Terminal::new(TerminalKind::UserCancelled, "the turn was cancelled"))
    }
}
