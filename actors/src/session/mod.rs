//! The session actor.
//!
//! One actor per live session. Its state is the session record, transcript,
//! watchers, process groups and the running turn, if any. Each control word has
//! its own handler file under [`lifecycle`]; [`SessionActor::handle`] only routes.

pub mod lifecycle;
pub mod passivate;
pub(crate) mod receipt;
pub(crate) mod seal;
mod sink;

use std::sync::Arc;

use berth_runtime::content::Prompt;
use berth_runtime::engine::{CallCancel, TurnControl, TurnExit};
use berth_runtime::event::SessionEvent;
use berth_runtime::history::Transcript;
use berth_runtime::ids::{EventId, SessionId, TurnId};
use berth_runtime::steering::Injection;
use berth_runtime::suspension::{OverlapPolicy, Schedule, Suspension, Wakeup};
use berth_runtime::tape::Tape;
use berth_runtime::tools::{ProcessGroups, ProcessLedger};
use berth_scheduler::Scheduler;
use berth_storage::{Batch, Journal, SessionRecord};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tracing::Instrument;

pub(crate) use receipt::{control_outcome, signed_outcome};
pub use seal::{seal_open_turn, settle_open_turn};

use crate::config::NodeConfig;
use crate::error::ControlError;
use crate::node::{
    CancelStatus, PromptOutcome, ResumeOutcome, ResumeParams, SessionStatus, SuspendOutcome,
    SuspendParams,
};
use crate::watch::{Watcher, Watchers};

/// What every session actor of a node shares.
#[derive(Debug)]
pub struct SessionEnv {
    /// The journal.
    pub journal: Journal,
    /// Node configuration (model, tools, limits, clock, ids).
    pub config: NodeConfig,
    /// Process groups started by this node's sessions (reaped at start-up).
    pub processes: Arc<ProcessLedger>,
    /// The node's scheduler (wake-ups of parked sessions).
    pub scheduler: Scheduler,
    /// Watchers of passivated sessions, and which actors stopped for
    /// passivation.
    pub passivated: passivate::Passivated,
    /// Serializes read-modify-writes of schedule rows (a run's counters, a
    /// pause, a buffered run leaving its session's queue), so that none
    /// overwrites another. Never held across an actor call.
    pub schedule_rows: tokio::sync::Mutex<()>,
}

impl SessionEnv {
    /// Reads schedule `id`, applies `change` and commits it (durable on
    /// return), serialized with every other schedule update. `Ok(None)` when
    /// the schedule does not exist (deleted).
    ///
    /// # Errors
    /// [`StorageError`](berth_storage::StorageError); nothing was written.
    pub async fn update_schedule(
        &self,
        id: &str,
        change: impl FnOnce(&mut Schedule),
    ) -> Result<Option<Schedule>, berth_storage::StorageError> {
        let _guard = self.schedule_rows.lock().await;
        let Some(mut schedule) = self.journal.schedule(id)? else {
            return Ok(None);
        };
        change(&mut schedule);
        self.journal
            .commit(Batch::new().put_schedule(&schedule))
            .await?;
        Ok(Some(schedule))
    }
}

/// What an attach replays to its watcher before live events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Nothing: only events after the attach arrive.
    None,
    /// Every event with an id greater than this (`After(0)`: the whole log).
    After(EventId),
}

/// The answer to an attach (`session/load`, `session/resume`, `session/new`).
#[derive(Debug, Clone)]
pub struct AttachOutcome {
    /// The session record.
    pub record: SessionRecord,
    /// `(event id, type)` of each event replayed (empty without replay).
    pub replayed: Vec<(EventId, &'static str)>,
}

/// Messages a session actor handles, one at a time, in arrival order.
pub enum SessionMsg {
    /// `session/prompt`: start a turn; the reply comes when the turn is sealed.
    Prompt {
        /// The prompt blocks.
        prompt: Prompt,
        /// The watcher (connection) that sent it.
        origin: Option<u64>,
        /// Answered with the sealed outcome.
        reply: RpcReplyPort<Result<PromptOutcome, ControlError>>,
        /// The caller's span: the turn's span is its child.
        trace: tracing::Span,
    },
    /// `session/cancel`.
    Cancel {
        /// Who sent it (for the receipt).
        actor: String,
        /// `cancelled` or `already_cancelled`.
        reply: RpcReplyPort<Result<CancelStatus, ControlError>>,
    },
    /// `session/inject`: mode and content are validated only after the
    /// active-prompt check, as the seed requires.
    Inject {
        /// Wire mode (`steer`, `queue`, `interrupt_immediate`, `interrupt`).
        mode: String,
        /// Wire content (string or content blocks).
        content: serde_json::Value,
        /// Who sent it.
        actor: String,
        /// The assigned message id.
        reply: RpcReplyPort<Result<String, ControlError>>,
    },
    /// `session/revoke_inject` (`content: None`) or `session/replace_inject`.
    Retract {
        /// The message.
        message_id: String,
        /// New content for a replace; `None` revokes.
        content: Option<serde_json::Value>,
        /// Who sent it.
        actor: String,
        /// The sender owns the session (host owner or creator): it may
        /// revoke another client's message.
        owner_override: bool,
        /// Done, or why not.
        reply: RpcReplyPort<Result<(), ControlError>>,
    },
    /// A control refused before it reached its handler (the sender's role
    /// does not allow the method): its rejected `control_outcome` receipt is
    /// journaled, then the caller answers the error.
    Refuse {
        /// The refused method.
        method: String,
        /// Who sent it.
        actor: String,
        /// The receipt's machine-readable reason (`role_not_authorized`).
        reason: String,
        /// Receipt metadata (the role held and the role needed).
        metadata: serde_json::Value,
        /// Answered once the receipt is durable.
        reply: RpcReplyPort<Result<(), ControlError>>,
    },
    /// `session/cancel_tool_call`: stop one tool call, not the turn.
    CancelToolCall {
        /// The call.
        tool_call_id: String,
        /// Why (recorded in the receipt's metadata).
        reason: Option<String>,
        /// Who sent it.
        actor: String,
        /// `cancelled`, `already_cancelled` or `not_found`.
        reply: RpcReplyPort<Result<CallCancel, ControlError>>,
    },
    /// `session/rollback` (`redo: false`) or `session/redo`.
    Rollback {
        /// Redo instead of rollback.
        redo: bool,
        /// Who sent it.
        actor: String,
        /// The wire result object.
        reply: RpcReplyPort<Result<serde_json::Value, ControlError>>,
    },
    /// `berth.session_view.query`: the `berth.session_view.v1` projection.
    View {
        /// The projection.
        reply: RpcReplyPort<serde_json::Value>,
    },
    /// `session/pending_injections`: undelivered messages, FIFO.
    PendingInjections {
        /// The list.
        reply: RpcReplyPort<Vec<Injection>>,
    },
    /// `session/close`: cancel, flush, drop.
    Close {
        /// Who sent it.
        actor: String,
        /// Answered once the close is durable.
        reply: RpcReplyPort<Result<(), ControlError>>,
    },
    /// `session/list` entry for this session.
    Status {
        /// The status.
        reply: RpcReplyPort<SessionStatus>,
    },
    /// Registers a watcher, optionally replaying (part of) the log to it first.
    Attach {
        /// The watcher.
        watcher: Arc<dyn Watcher>,
        /// What to replay: nothing (`session/resume`), every event
        /// (`session/load`) or the events after a client's last acknowledged
        /// one (`session/load` with `_meta.berth.lastEventId`).
        replay: Replay,
        /// Answered after the replayed events were delivered.
        reply: RpcReplyPort<Result<AttachOutcome, ControlError>>,
    },
    /// Removes a watcher (its connection closed).
    Detach {
        /// The watcher id.
        watcher_id: u64,
    },
    /// `session/suspend` (or a policy's suspension): answered once the
    /// suspension is committed.
    Suspend {
        /// What to suspend with.
        params: SuspendParams,
        /// The handle and envelope summary.
        reply: RpcReplyPort<Result<SuspendOutcome, ControlError>>,
        /// The caller's span: an idle session's `suspend` span is its child.
        trace: tracing::Span,
    },
    /// `session/resume` claiming the session's suspension.
    Resume {
        /// The claim.
        params: ResumeParams,
        /// Answered once the claim is committed.
        reply: RpcReplyPort<Result<ResumeOutcome, ControlError>>,
        /// The caller's span: the `resume` span links to it.
        trace: tracing::Span,
    },
    /// A standing schedule's run.
    ScheduledPrompt {
        /// The schedule.
        schedule_id: String,
        /// The prompt text.
        text: String,
        /// Its overlap policy.
        overlap: OverlapPolicy,
        /// A run buffered before a restart, delivered again (already counted
        /// in the schedule's `buffered`).
        redelivered: bool,
        /// Started, buffered or skipped.
        reply: RpcReplyPort<lifecycle::scheduled::ScheduledStart>,
    },
    /// A `fail` timeout elapsed: fail the suspension `handle`.
    FailSuspension {
        /// The handle that timed out.
        handle: String,
        /// Why (for the terminal).
        reason: String,
        /// Done, or why not.
        reply: RpcReplyPort<Result<(), ControlError>>,
    },
    /// The claimer's claim on this session's suspension is durable: complete
    /// that resume (see [`crate::claimer`]). Answered with the resume's
    /// outcome, `None` when nothing was left to complete (a client's resume
    /// won, or it was completed already).
    Claimed {
        /// The claim as the claimer committed it (`None` when its commit
        /// found the handle claimed already: the stored claim is read).
        committed: Option<Box<berth_runtime::suspension::ResumeClaim>>,
        /// The outcome.
        reply: RpcReplyPort<Result<Option<ResumeOutcome>, ControlError>>,
    },
    /// Test-only fault injection: the handler fails, as a bug would.
    #[cfg(test)]
    InjectFault,
    /// Sent by the actor to itself once the session is parked with nothing
    /// in flight (after `passivate_after_ms`): it stops if that is still so
    /// (see [`passivate`]).
    Passivate,
    /// The running turn left the engine, ended or suspended (sent by the
    /// turn task itself).
    TurnFinished {
        /// The turn.
        turn_id: TurnId,
        /// How it left.
        exit: Box<TurnExit>,
        /// What the run consumed after its last journaled event (replay
        /// tape), for its exit batch.
        tape: Box<berth_runtime::tape::Tape>,
    },
}

/// The running turn, owned by the actor.
pub(crate) struct RunningTurn {
    pub turn_id: TurnId,
    pub control: Arc<TurnControl>,
    pub reply: Option<RpcReplyPort<Result<PromptOutcome, ControlError>>>,
    /// When it started (the node clock), for `berth_turn_duration_seconds`.
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// Aborts the task if the actor goes away without sealing the turn.
    pub task: tokio::task::AbortHandle,
    /// The turn's span (see [`crate::telemetry`]): the parent of a `suspend`
    /// span, and linked from the `resume` span. Dropped before the turn's
    /// park or seal commits, so it never stays open across a pause.
    pub span: tracing::Span,
    /// What the turn's sink holds for its next write. The actor's own
    /// writes for the session take it first ([`SessionState::record_with`]),
    /// and what is left goes first in the turn's seal or park.
    pub held: sink::Held,
}

/// A session actor's state.
pub struct SessionState {
    pub(crate) env: Arc<SessionEnv>,
    pub(crate) record: SessionRecord,
    pub(crate) transcript: Transcript,
    pub(crate) watchers: Arc<Watchers>,
    pub(crate) processes: Arc<ProcessGroups>,
    pub(crate) turn: Option<RunningTurn>,
    /// A close waiting for the running turn to be sealed.
    pub(crate) pending_close: Vec<lifecycle::close::PendingClose>,
    /// The control block of the last finished turn: what became of its
    /// injections (for revoke/replace after the turn).
    pub(crate) last_control: Option<Arc<TurnControl>>,
    /// The session's suspension, while it is parked.
    pub(crate) suspension: Option<Suspension>,
    /// Suspends waiting for the running turn to park.
    pub(crate) suspend_waiters: Vec<lifecycle::suspend::SuspendReply>,
    /// Scheduled runs waiting for the running turn to end (schedule id,
    /// prompt text); counted durably in each schedule's `buffered`.
    pub(crate) scheduled: std::collections::VecDeque<(String, String)>,
    /// A `Passivate` message is on its way to this actor.
    pub(crate) passivation_asked: bool,
    /// The claim that used up the session's last suspension (see
    /// [`crate::node::SessionStatus::last_claim`]); cleared when it parks again.
    pub(crate) last_claim: Option<berth_runtime::suspension::ResumeClaim>,
    /// Open coalescing windows of role refusals (see [`lifecycle::refuse`]).
    pub(crate) refusals: lifecycle::refuse::Refusals,
}

impl SessionState {
    /// Forgets the suspension (its removal is committed) and disarms its
    /// wake-up.
    pub(crate) fn unpark(&mut self) {
        if let Some(wakeup) = self.suspension.take().as_ref().and_then(Wakeup::of) {
            self.env.scheduler.disarm(&wakeup);
        }
    }

    /// Journals `events` in one durable batch, then publishes them to the
    /// session's watchers. Nothing is published unless it is durable.
    ///
    /// # Errors
    /// [`ControlError::Storage`]; nothing was written.
    pub(crate) async fn record(&self, events: Vec<SessionEvent>) -> Result<(), ControlError> {
        self.record_with(Batch::new(), events).await
    }

    /// Like [`SessionState::record`], with `batch`'s other writes committed
    /// atomically in the same transaction.
    ///
    /// # Errors
    /// [`ControlError::Storage`]; nothing was written.
    pub(crate) async fn record_with(
        &self,
        batch: Batch,
        events: Vec<SessionEvent>,
    ) -> Result<(), ControlError> {
        let now = self.env.config.clock.now();
        let session_id = &self.record.session_id;
        let turn_id = self.turn.as_ref().map(|t| &t.turn_id);
        let records = receipt::stamp(&self.env, session_id, turn_id, now, events);
        // What the running turn holds was decided first: it is recorded first.
        let (ids, records) = match &self.turn {
            Some(turn) => {
                turn.held
                    .write(&self.env.journal, session_id, batch, records, Tape::default)
                    .await?
            }
            None => {
                let batch = records.iter().fold(batch, |b, r| b.append(session_id, r));
                (self.env.journal.commit(batch).await?, records)
            }
        };
        self.watchers.publish(
            session_id,
            ids.into_iter().zip(records.into_iter().map(Arc::new)),
        );
        Ok(())
    }
}

impl Drop for SessionState {
    fn drop(&mut self) {
        // The actor is gone (stopped or failed): its turn stops; the processes
        // go when the last holder of `processes` (this or the turn) drops it.
        if let Some(turn) = &self.turn {
            turn.task.abort();
        }
        self.processes.kill_all();
    }
}

/// Arguments to spawn a session actor.
pub struct SessionArgs {
    /// Shared node environment.
    pub env: Arc<SessionEnv>,
    /// The session to rehydrate.
    pub session_id: SessionId,
    /// Its record, when the caller has just read it from the journal (the
    /// registry does, to tell an unknown session apart): saves a read.
    pub record: Option<SessionRecord>,
}

/// The session actor (stateless behaviour; the state is [`SessionState`]).
pub struct SessionActor;

#[ractor::async_trait]
impl Actor for SessionActor {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    /// Rehydrates from the journal. A turn still open here was running when a
    /// previous actor for this session failed: it is sealed, not re-run.
    async fn pre_start(
        &self,
        _myself: ActorRef<SessionMsg>,
        args: SessionArgs,
    ) -> Result<SessionState, ActorProcessingErr> {
        let journal = &args.env.journal;
        let record = match args.record {
            Some(record) => record,
            None => journal
                .session(&args.session_id)?
                .ok_or_else(|| format!("session {} is not in the journal", args.session_id))?,
        };
        let settled = settle_open_turn(
            &args.env,
            &args.session_id,
            berth_runtime::terminal::Terminal::new(
                berth_runtime::terminal::TerminalKind::InternalError,
                "the session actor failed while this turn ran; it was restarted from the journal and the turn was sealed, not re-run",
            ),
        )
        .await?;
        // Settling a turn moved the record on (its checkpoint head).
        let record = if settled {
            journal.session(&args.session_id)?.unwrap_or(record)
        } else {
            record
        };
        let suspension = journal.suspension(&args.session_id)?;
        let transcript = Transcript::from_messages(journal.transcript(&args.session_id)?);
        let last = journal.last_event_id(&args.session_id)?;
        // A passivated session's attached watchers carry over.
        let watchers = args
            .env
            .passivated
            .take_watchers(&args.session_id)
            .unwrap_or_else(|| Arc::new(Watchers::new(last)));
        let processes = Arc::new(ProcessGroups::with_ledger(
            Arc::clone(&args.env.processes),
            args.session_id.as_str(),
        ));
        processes.pin_roots(std::iter::once(&record.cwd).chain(&record.additional_directories));
        Ok(SessionState {
            env: args.env,
            record,
            transcript,
            watchers,
            processes,
            turn: None,
            pending_close: Vec::new(),
            last_control: None,
            suspension,
            suspend_waiters: Vec::new(),
            scheduled: Default::default(),
            passivation_asked: false,
            last_claim: None,
            refusals: Default::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SessionMsg>,
        msg: SessionMsg,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        // A resume the claimer claimed is completed before anything else
        // sees the session (see `crate::claimer`).
        if state.suspension.is_some() && !matches!(msg, SessionMsg::Claimed { .. }) {
            if let Some(Err(e)) = Box::pin(lifecycle::resume::settle_claimed(&myself, state)).await
            {
                tracing::warn!(session_id = %state.record.session_id, error = %e, "could not complete a claimed wake-up; the next message or start retries");
            }
        }
        let handled = self.dispatch(&myself, msg, state).await;
        // Handled in order: the passivation runs after whatever is queued now.
        let due = (!state.passivation_asked)
            .then(|| passivate::passivate_in_ms(state))
            .flatten();
        if let Some(ms) = due {
            state.passivation_asked = true;
            if ms == 0 {
                let _ = myself.send_message(SessionMsg::Passivate);
            } else {
                myself.send_after(std::time::Duration::from_millis(ms), || {
                    SessionMsg::Passivate
                });
            }
        }
        handled
    }
}

impl SessionActor {
    /// Handles one message (one control word per lifecycle file). Each arm's
    /// future is boxed: inline, this future would be as large as the
    /// largest arm (≈ 11 KB: `finish`, `resume`, `close`), and every message,
    /// a status query included, would copy that much into place.
    async fn dispatch(
        &self,
        myself: &ActorRef<SessionMsg>,
        msg: SessionMsg,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        let myself = myself.clone();
        match msg {
            SessionMsg::Prompt {
                prompt,
                origin,
                reply,
                trace,
            } => {
                Box::pin(
                    lifecycle::prompt::start(&myself, state, prompt, origin, reply)
                        .instrument(trace),
                )
                .await
            }
            SessionMsg::TurnFinished {
                turn_id,
                exit,
                tape,
            } => {
                Box::pin(lifecycle::prompt::finish(
                    &myself, state, turn_id, *exit, *tape,
                ))
                .await
            }
            SessionMsg::Suspend {
                params,
                reply,
                trace,
            } => {
                Box::pin(lifecycle::suspend::suspend(state, params, reply).instrument(trace)).await
            }
            SessionMsg::Resume {
                params,
                reply,
                trace,
            } => {
                Box::pin(lifecycle::resume::resume(&myself, state, params, reply).instrument(trace))
                    .await
            }
            SessionMsg::ScheduledPrompt {
                schedule_id,
                text,
                overlap,
                redelivered,
                reply,
            } => {
                let started = Box::pin(lifecycle::scheduled::run(
                    &myself,
                    state,
                    schedule_id,
                    text,
                    overlap,
                    redelivered,
                ))
                .await?;
                let _ = reply.send(started);
                Ok(())
            }
            SessionMsg::FailSuspension {
                handle,
                reason,
                reply,
            } => Box::pin(lifecycle::resume::fail(state, handle, reason, reply)).await,
            SessionMsg::Claimed { committed, reply } => {
                let outcome = Box::pin(lifecycle::resume::settle_claim(
                    &myself,
                    state,
                    committed.map(|c| *c),
                ))
                .await;
                let _ = reply.send(outcome.transpose());
                Ok(())
            }
            SessionMsg::Cancel { actor, reply } => {
                let _ =
                    reply.send(Box::pin(lifecycle::cancel::cancel(&myself, state, &actor)).await);
                Ok(())
            }
            SessionMsg::Inject {
                mode,
                content,
                actor,
                reply,
            } => {
                let _ = reply.send(
                    Box::pin(lifecycle::inject::inject(state, &mode, &content, &actor)).await,
                );
                Ok(())
            }
            SessionMsg::Retract {
                message_id,
                content,
                actor,
                owner_override,
                reply,
            } => {
                let _ = reply.send(
                    Box::pin(lifecycle::retract::retract(
                        state,
                        &message_id,
                        content.as_ref(),
                        &actor,
                        owner_override,
                    ))
                    .await,
                );
                Ok(())
            }
            SessionMsg::Refuse {
                method,
                actor,
                reason,
                metadata,
                reply,
            } => {
                let _ = reply.send(
                    Box::pin(lifecycle::refuse::refuse(
                        state, &method, &actor, &reason, metadata,
                    ))
                    .await,
                );
                Ok(())
            }
            SessionMsg::CancelToolCall {
                tool_call_id,
                reason,
                actor,
                reply,
            } => {
                let answer = Box::pin(lifecycle::cancel_tool_call::cancel_tool_call(
                    state,
                    &tool_call_id,
                    reason.as_deref(),
                    &actor,
                ))
                .await;
                let _ = reply.send(answer);
                Ok(())
            }
            SessionMsg::Rollback { redo, actor, reply } => {
                let _ =
                    reply.send(Box::pin(lifecycle::rollback::rollback(state, redo, &actor)).await);
                Ok(())
            }
            SessionMsg::View { reply } => {
                let _ = reply.send(lifecycle::view::view(state));
                Ok(())
            }
            SessionMsg::PendingInjections { reply } => {
                let _ = reply.send(lifecycle::inject::pending(state));
                Ok(())
            }
            SessionMsg::Close { actor, reply } => {
                Box::pin(lifecycle::close::close(&myself, state, actor, reply)).await
            }
            SessionMsg::Status { reply } => {
                let _ = reply.send(lifecycle::status::status(state));
                Ok(())
            }
            SessionMsg::Attach {
                watcher,
                replay,
                reply,
            } => {
                let _ = reply.send(lifecycle::attach::attach(state, watcher, replay));
                Ok(())
            }
            #[cfg(test)]
            SessionMsg::InjectFault => Err("injected fault".into()),
            SessionMsg::Detach { watcher_id } => {
                state.watchers.detach(&state.record.session_id, watcher_id);
                Ok(())
            }
            SessionMsg::Passivate => {
                passivate::passivate(&myself, state);
                Ok(())
            }
        }
    }
}
