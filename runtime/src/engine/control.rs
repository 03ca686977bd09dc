//! The control block shared by a session actor and its running turn.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

use crate::steering::{Injection, Seam, SteeringQueue};
use crate::suspension::SuspendMode;
use crate::terminal::{Terminal, TerminalKind};

/// What the actor can ask of a running turn. The turn reads it only at seams.
#[derive(Debug, Default)]
pub struct TurnControl {
    cancel: CancellationToken,
    stop: Mutex<Option<Terminal>>,
    steering: Mutex<SteeringQueue>,
    calls: Mutex<HashMap<String, CallSlot>>,
    approvals: Mutex<Vec<crate::engine::PermissionRequest>>,
    suspend: Mutex<Option<SuspendMode>>,
    suspend_signal: CancellationToken,
    quiescing: std::sync::atomic::AtomicBool,
    interrupt_signal: CancellationToken,
    policy: Mutex<Option<String>>,
    feed: Option<std::sync::Arc<dyn SteeringFeed>>,
}

/// Puts recorded injections into a replayed turn's steering queue at the
/// seam where the journal says they were drained (`berth replay`; DESIGN.md,
/// "Deterministic replay"). A live turn has none: its queue is filled by
/// `session/inject` as messages arrive.
pub trait SteeringFeed: Send + Sync + std::fmt::Debug {
    /// Called with the queue locked, right before the turn drains it: at
    /// `Some(seam)` (the messages due there are taken next), or `None` when
    /// everything still pending is taken (the turn parks, or its loop
    /// exited, and drops them).
    fn before_drain(&self, queue: &mut SteeringQueue, seam: Option<Seam>);
}

/// A tool call of the running turn, as `session/cancel_tool_call` sees it.
#[derive(Debug)]
enum CallSlot {
    /// Announced or running; cancelling fires the token.
    Live(CancellationToken),
    /// Cancelled by `session/cancel_tool_call`.
    Cancelled,
    /// Finished on its own.
    Done,
}

/// Answer to `session/cancel_tool_call` (`remote-session-control.md`, "Stop").
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallCancel {
    /// This request stopped the call (or kept it from being sent).
    Cancelled,
    /// It was cancelled before.
    AlreadyCancelled,
    /// No announced, unfinished call has that id.
    NotFound,
}

impl TurnControl {
    /// A control block whose steering queue is filled by `feed` at each
    /// drain (`berth replay`) instead of by the session actor.
    pub fn with_feed(feed: std::sync::Arc<dyn SteeringFeed>) -> Self {
        Self {
            feed: Some(feed),
            ..Self::default()
        }
    }

    /// Takes the injections due at `seam` (FIFO), after the feed (if any)
    /// put in what was pending there.
    pub fn drain_at(&self, seam: Seam) -> Vec<Injection> {
        let mut queue = self.steering();
        if let Some(feed) = &self.feed {
            feed.before_drain(&mut queue, Some(seam));
        }
        queue.drain(seam)
    }

    /// Takes every injection still pending (the turn parks or ended), after
    /// the feed (if any) put in what was pending then.
    pub fn drain_rest(&self) -> Vec<Injection> {
        let mut queue = self.steering();
        if let Some(feed) = &self.feed {
            feed.before_drain(&mut queue, None);
        }
        queue.drain_all()
    }

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

    /// Asks the turn to suspend (`session/suspend`). A later request with a
    /// stronger mode upgrades the pending one (`interrupt_immediate` >
    /// `finish_step` > `wait_for_completion`); returns the mode now in force.
    /// `wait_for_completion` is the actor's business (it parks the session
    /// after the turn ends); the other two are honoured by the engine at its
    /// seams, and fire [`TurnControl::suspend_signal`] for cooperative tools.
    pub fn request_suspend(&self, mode: SuspendMode) -> SuspendMode {
        let rank = |m: SuspendMode| match m {
            SuspendMode::WaitForCompletion => 0,
            SuspendMode::FinishStep => 1,
            SuspendMode::InterruptImmediate => 2,
        };
        let mut pending = self.suspend.lock().unwrap_or_else(|e| e.into_inner());
        let effective = match *pending {
            Some(current) if rank(current) >= rank(mode) => current,
            _ => mode,
        };
        *pending = Some(effective);
        if effective != SuspendMode::WaitForCompletion {
            self.suspend_signal.cancel();
        }
        if effective == SuspendMode::InterruptImmediate {
            self.interrupt_signal.cancel();
        }
        effective
    }

    /// Suspends the turn for a budget breach (`interrupt_immediate`,
    /// initiator `policy`); the first reason is kept.
    pub fn suspend_for_policy(&self, reason: String) {
        self.policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(reason);
        self.request_suspend(SuspendMode::InterruptImmediate);
    }

    /// Why a policy suspended the turn, if one did.
    pub fn policy_breach(&self) -> Option<String> {
        self.policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The pending suspension request, if any.
    pub fn suspend_requested(&self) -> Option<SuspendMode> {
        *self.suspend.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the turn as quiescing: the engine reached the seam where a
    /// requested suspension stops it (it dispatches no further model or tool
    /// call; what is left is checkpointing its frame for the park). Until
    /// then a pending request is only `requested` (RFC `requested →
    /// quiescing → suspended`).
    pub fn begin_quiescing(&self) {
        self.quiescing
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether the turn reached the seam where it parks (see
    /// [`TurnControl::begin_quiescing`]).
    pub fn is_quiescing(&self) -> bool {
        self.quiescing.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Resolves once an `interrupt_immediate` suspension is requested
    /// (cancel-safe): a call still waiting to start (for approval) then stays
    /// unstarted.
    pub async fn interrupted(&self) {
        self.interrupt_signal.cancelled().await
    }

    /// Fires when a `finish_step` or `interrupt_immediate` suspension is
    /// requested (handed to tools as [`crate::tools::ToolContext::suspend`]).
    pub fn suspend_signal(&self) -> CancellationToken {
        self.suspend_signal.clone()
    }

    /// Tracks an announced tool call; the token fires on `cancel_call`.
    pub fn track_call(&self, id: &str) -> CancellationToken {
        let token = CancellationToken::new();
        self.calls()
            .insert(id.to_owned(), CallSlot::Live(token.clone()));
        token
    }

    /// The cancellation token of a tracked call (a fired token when it was
    /// cancelled or is unknown, so an untracked call is never sent by mistake
    /// after a cancel).
    pub fn call_token(&self, id: &str) -> CancellationToken {
        match self.calls().get(id) {
            Some(CallSlot::Live(token)) => token.clone(),
            Some(CallSlot::Done) => CancellationToken::new(),
            Some(CallSlot::Cancelled) | None => {
                let fired = CancellationToken::new();
                fired.cancel();
                fired
            }
        }
    }

    /// Marks a call finished (a later cancel answers `not_found`), unless it
    /// was cancelled.
    pub fn finish_call(&self, id: &str) {
        if let Some(slot @ CallSlot::Live(_)) = self.calls().get_mut(id) {
            *slot = CallSlot::Done;
        }
    }

    /// Cancels one tool call without ending the turn.
    pub fn cancel_call(&self, id: &str) -> CallCancel {
        let mut calls = self.calls();
        match calls.get_mut(id) {
            Some(slot @ CallSlot::Live(_)) => {
                if let CallSlot::Live(token) = std::mem::replace(slot, CallSlot::Cancelled) {
                    token.cancel();
                }
                CallCancel::Cancelled
            }
            Some(CallSlot::Cancelled) => CallCancel::AlreadyCancelled,
            Some(CallSlot::Done) | None => CallCancel::NotFound,
        }
    }

    fn calls(&self) -> MutexGuard<'_, HashMap<String, CallSlot>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tool calls waiting for a client's approval (`pending.approvals`).
    pub fn pending_approvals(&self) -> Vec<crate::engine::PermissionRequest> {
        self.approvals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_pending_approval(
        &self,
        request: &crate::engine::PermissionRequest,
        waiting: bool,
    ) {
        let mut approvals = self.approvals.lock().unwrap_or_else(|e| e.into_inner());
        approvals.retain(|r| r.tool_call_id != request.tool_call_id);
        if waiting {
            approvals.push(request.clone());
        }
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
