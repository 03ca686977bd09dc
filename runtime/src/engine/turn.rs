//! The turn loop.

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::join_all;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::spans;
use super::{PermissionDecision, PermissionRequest, SinkError, TurnControl, TurnSink};
use crate::budget::Budget;
use crate::clock::Clock;
use crate::content::Prompt;
use crate::directives::{Authority, CompletionJudge, Directive, DirectiveSet, Registered};
use crate::event::{SessionEvent, ToolCallStatus};
use crate::frame::{Accounting, Frame, Phase, ToolOutcome, ToolOutcomeStatus, FRAME_VERSION};
use crate::history::{Message, ToolCallRequest, Transcript};
use crate::ids::{SessionId, TurnId};
use crate::model::{ModelDelta, ModelProvider, ModelRequest, ModelResponse, ModelStop, Usage};
use crate::steering::{InjectMode, Injection, Seam};
use crate::suspension::SuspendMode;
use crate::terminal::{Terminal, TerminalKind};
use crate::tools::{
    AgentPark, FileChange, ProcessGroups, ResumeInput, ToolContext, ToolContinuation, ToolError,
    ToolExit, ToolSet,
};

/// What a turn is asked to do.
#[derive(Debug, Clone)]
pub struct TurnSpec {
    /// The session.
    pub session_id: SessionId,
    /// This turn (its `turn_started` event is already journaled by the caller).
    pub turn_id: TurnId,
    /// Session working directory (absolute).
    pub cwd: PathBuf,
    /// Extra directories file tools may use (absolute).
    pub additional_directories: Vec<PathBuf>,
    /// The transcript before this turn.
    pub history: Transcript,
    /// The user's prompt.
    pub prompt: Prompt,
    /// Model calls allowed in this turn before it ends with `max_turn_requests`.
    pub max_model_calls: u32,
}

/// What a turn runs with.
#[derive(Debug, Clone)]
pub struct TurnDeps {
    /// The model.
    pub model: Arc<dyn ModelProvider>,
    /// The tools offered to the model.
    pub tools: ToolSet,
    /// The session's process groups (killed by the actor on cancel).
    pub processes: Arc<ProcessGroups>,
    /// The control block the actor steers the turn through.
    pub control: Arc<TurnControl>,
    /// Tools whose calls need a client's approval before they run.
    pub needs_approval: Vec<String>,
    /// The completion judge, when enabled: at the model's end of turn it may
    /// restate the original request as a `corrective` directive.
    pub judge: Option<Arc<dyn CompletionJudge>>,
    /// The session's budget, when a policy applies: going over it suspends
    /// the turn (`interrupt_immediate`, initiator `policy`).
    pub budget: Option<Budget>,
    /// Where the turn reads wall time (its `accounting.wall_ms`, ms since
    /// this run started, at millisecond precision). Injected so that
    /// `berth replay` can feed the recorded readings.
    pub clock: Arc<dyn Clock>,
}

/// How a turn ended.
#[derive(Debug, Clone)]
pub struct TurnOutcome {
    /// The typed terminal.
    pub terminal: Terminal,
    /// Tokens used over all model calls of the turn.
    pub usage: Usage,
    /// Messages the turn adds to the transcript (the user prompt first).
    pub turn_messages: Vec<Message>,
    /// Files the turn's tools changed (one entry per path: first `before`,
    /// last `after`), for its checkpoint.
    pub file_changes: Vec<FileChange>,
    /// The turn's totals (usage, tool calls, wall time), for the session's
    /// spend.
    pub accounting: Accounting,
}

/// How a turn left the engine: ended with a terminal, or suspended. A
/// suspension is its own outcome (`seeds/execution-suspension.md`,
/// `ExecutionSuspended`), never a completion, a cancellation or a failure.
#[derive(Debug, Clone)]
pub enum TurnExit {
    /// The turn ended.
    Ended(TurnOutcome),
    /// The turn is parked; its frame is durably checkpointed.
    Suspended(Box<ExecutionSuspended>),
}

impl TurnExit {
    /// The ended outcome, or `None` for a suspension.
    pub fn ended(self) -> Option<TurnOutcome> {
        match self {
            Self::Ended(outcome) => Some(outcome),
            Self::Suspended(_) => None,
        }
    }
}

/// A turn parked at a seam. The frame was acknowledged by
/// [`TurnSink::checkpoint`] before this was returned; nothing of the turn runs
/// any more (started tool calls have settled or yielded a continuation).
#[derive(Debug, Clone)]
pub struct ExecutionSuspended {
    /// Where to continue from ([`resume_turn`]).
    pub frame: Frame,
    /// Set when the agent parked itself (`await_resumption`).
    pub park: Option<AgentPark>,
    /// The seam it parked at: `turn_start` (before the next model call),
    /// `pre_tool_dispatch` (an `interrupt_immediate` suspension left calls
    /// of the batch unstarted) or `post_tool_dispatch` (a call of the batch
    /// yielded and its group settled). Journaled in the drain receipt.
    pub seam: Seam,
}

/// Result of a call stopped by `session/cancel_tool_call`.
const CALL_CANCELLED: &str =
    "cancelled: a client stopped this tool call (session/cancel_tool_call); \
                              the turn goes on";
/// The seed's reason for a call skipped by an interrupt.
const INTERRUPTED: &str = "a user interrupt arrived before this tool call was dispatched";
/// How long a one-call group's `in_progress` update may wait to be
/// journaled with the call's outcome (see `Turn::hold_settled`). Past it,
/// the call is still running and watchers are told so.
const IN_PROGRESS_GRACE: std::time::Duration = std::time::Duration::from_millis(10);
const NOT_SENT: &str = "not dispatched: the turn was stopped before this tool call was sent";
const ABANDONED: &str = "abandoned: the turn was stopped while this tool call ran; \
                         its effects, if any, were not undone";

/// Why a resumed frame cannot continue; checked before any effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeRefusal {
    /// The frame was written by another format version.
    #[error("frame version {found} is not {expected}")]
    FrameVersion {
        /// In the frame.
        found: u32,
        /// This build's.
        expected: u32,
    },
    /// The transcript changed since the turn started.
    #[error("the session's history changed while it was suspended (fingerprint {found}, frame has {expected})")]
    HistoryChanged {
        /// The frame's.
        expected: String,
        /// Now.
        found: String,
    },
    /// Model, tools or limits changed since the turn started.
    #[error("the configuration changed while the session was suspended (fingerprint {found}, frame has {expected})")]
    ConfigurationChanged {
        /// The frame's.
        expected: String,
        /// Now.
        found: String,
    },
    /// A suspended call's tool is not mounted (its completion owner is gone).
    #[error("tool `{tool}` that owns a suspended call is not available")]
    CompletionOwnerMissing {
        /// The tool.
        tool: String,
    },
}

/// SHA-256 (hex) of what a turn runs with: model name, tool specs, model-call
/// limit. A frame records it; [`check_resumable`] compares it.
pub fn config_fingerprint(spec: &TurnSpec, deps: &TurnDeps) -> String {
    config_fingerprint_of(deps.model.as_ref(), &deps.tools, spec.max_model_calls)
}

/// [`config_fingerprint`] from its parts (start-up recovery has no turn).
///
/// Byte for byte the SHA-256 of `serde_json::to_vec(&(model name, tool
/// specs, max_model_calls))` (what frames already on disk carry), assembled
/// from the set's cached encoding of its specs.
pub fn config_fingerprint_of(
    model: &dyn ModelProvider,
    tools: &ToolSet,
    max_model_calls: u32,
) -> String {
    use sha2::{Digest, Sha256};
    let specs = tools.shared_specs();
    specs.fingerprint(model.name(), max_model_calls, || {
        let name = serde_json::to_vec(model.name()).unwrap_or_default();
        let mut hasher = Sha256::new();
        hasher.update(b"[");
        hasher.update(&name);
        hasher.update(b",");
        hasher.update(specs.json());
        hasher.update(format!(",{max_model_calls}]").as_bytes());
        crate::hexstr::lower(&hasher.finalize())
    })
}

/// Checks, before any effect, that `frame` can continue under `spec`/`deps`
/// (`seeds/execution-suspension.md`: history/configuration are checked
/// before effects, and every completion owner is validated before any
/// sibling is scheduled).
///
/// # Errors
/// The first [`ResumeRefusal`] that applies.
pub fn check_resumable(
    frame: &Frame,
    spec: &TurnSpec,
    deps: &TurnDeps,
) -> Result<(), ResumeRefusal> {
    if frame.version != FRAME_VERSION {
        return Err(ResumeRefusal::FrameVersion {
            found: frame.version,
            expected: FRAME_VERSION,
        });
    }
    let history = spec.history.fingerprint();
    if frame.history_fingerprint != history {
        return Err(ResumeRefusal::HistoryChanged {
            expected: frame.history_fingerprint.clone(),
            found: history.to_owned(),
        });
    }
    let config = config_fingerprint(spec, deps);
    if frame.config_fingerprint != config {
        return Err(ResumeRefusal::ConfigurationChanged {
            expected: frame.config_fingerprint.clone(),
            found: config,
        });
    }
    for outcome in &frame.tool_outcomes {
        if outcome.status == ToolOutcomeStatus::Suspended
            && deps.tools.get(&outcome.call.name).is_none()
        {
            return Err(ResumeRefusal::CompletionOwnerMissing {
                tool: outcome.call.name.clone(),
            });
        }
    }
    Ok(())
}

/// Internal early exit of the loop.
enum Exit {
    Stopped,
    Sink(SinkError),
    /// Park here: the frame to checkpoint, and the seam it parks at.
    Suspend(Box<Frame>, Seam),
}

impl From<SinkError> for Exit {
    fn from(e: SinkError) -> Self {
        Exit::Sink(e)
    }
}

struct Turn<'a> {
    spec: &'a TurnSpec,
    deps: &'a TurnDeps,
    sink: &'a dyn TurnSink,
    accounting: Accounting,
    turn_messages: Vec<Message>,
    history_fingerprint: String,
    config_fingerprint: String,
    directives: DirectiveSet,
    judged: bool,
    file_changes: std::sync::Mutex<Vec<FileChange>>,
    /// User messages to add after the current batch's results.
    resume_notes: Vec<String>,
    /// Set while a one-call group is dispatched: its `in_progress` update
    /// (for up to [`IN_PROGRESS_GRACE`], when the sink
    /// [joins](TurnSink::joins_in_progress) it) and its `completed` update are held
    /// in `settled` and journaled with the frame that records the outcome
    /// (one commit instead of three; no other write of the turn runs in
    /// between).
    hold_settled: std::sync::atomic::AtomicBool,
    /// Held tool call updates, in order; flushed before any other write of
    /// the turn.
    settled: std::sync::Mutex<Vec<SessionEvent>>,
    /// When this run of the turn started, unix ms from `deps.clock` (wall
    /// time before a suspension is in `accounting.wall_ms` already).
    started_ms: i64,
    wall_before: u64,
}

/// Runs one prompt turn until it ends or suspends.
///
/// Every event is emitted through `sink` (durable before it returns); a frame is
/// checkpointed when a tool batch is ready, when it has settled, and when the
/// turn suspends. The caller journals `turn_started` before and `turn_ended`
/// after.
pub async fn run_turn(spec: &TurnSpec, deps: &TurnDeps, sink: &dyn TurnSink) -> TurnExit {
    let mut turn = Turn::new(spec, deps, sink);
    let result = turn.run_from(0).await;
    turn.conclude(result).await
}

/// Continues a suspended turn from its `frame`
/// (`seeds/execution-suspension.md`, "resume(frame, …)").
///
/// Call [`check_resumable`] first. `resume.input` goes to the waitpoint: the
/// result of the `await_resumption` call when the agent parked itself,
/// otherwise a user message the model reads before its next call. Suspended
/// tool calls continue through their tool's `resume_execution`; unstarted
/// calls of the batch are dispatched; nothing settled runs again.
pub async fn resume_turn(
    spec: &TurnSpec,
    deps: &TurnDeps,
    sink: &dyn TurnSink,
    frame: Frame,
    resume: &ResumeInput,
) -> TurnExit {
    let mut turn = Turn::new(spec, deps, sink);
    turn.accounting = frame.accounting;
    turn.wall_before = frame.accounting.wall_ms;
    turn.turn_messages = frame.turn_messages.clone();
    turn.history_fingerprint = frame.history_fingerprint.clone();
    turn.file_changes = std::sync::Mutex::new(frame.file_changes.clone());
    let result = turn.resume(frame, resume).await;
    turn.conclude(result).await
}

/// One change per path: the first `before`, the last `after`.
fn merge_changes(changes: Vec<FileChange>) -> Vec<FileChange> {
    let mut merged: Vec<FileChange> = Vec::new();
    for change in changes {
        match merged.iter_mut().find(|c| c.path == change.path) {
            Some(existing) => existing.after = change.after,
            None => merged.push(change),
        }
    }
    merged
}

impl<'a> Turn<'a> {
    fn new(spec: &'a TurnSpec, deps: &'a TurnDeps, sink: &'a dyn TurnSink) -> Self {
        Turn {
            spec,
            deps,
            sink,
            accounting: Accounting::default(),
            turn_messages: vec![Message::User {
                text: spec.prompt.to_model_text(),
            }],
            history_fingerprint: spec.history.fingerprint().to_owned(),
            config_fingerprint: config_fingerprint(spec, deps),
            directives: DirectiveSet::default(),
            judged: false,
            file_changes: Default::default(),
            resume_notes: Vec::new(),
            hold_settled: Default::default(),
            settled: Default::default(),
            started_ms: deps.clock.now().timestamp_millis(),
            wall_before: 0,
        }
    }

    /// The accounting with the wall time up to now.
    fn accounting_now(&self) -> Accounting {
        let now_ms = self.deps.clock.now().timestamp_millis();
        let elapsed = u64::try_from(now_ms.saturating_sub(self.started_ms)).unwrap_or(0);
        Accounting {
            wall_ms: self.wall_before.saturating_add(elapsed),
            ..self.accounting
        }
    }

    /// Checks the budget; going over asks the turn to suspend for the policy
    /// (it parks at the next seam).
    fn check_budget(&mut self) {
        self.accounting = self.accounting_now();
        let breach = self
            .deps
            .budget
            .as_ref()
            .and_then(|b| b.breach(&self.accounting));
        if let Some(reason) = breach {
            self.deps.control.suspend_for_policy(reason);
        }
    }

    /// Checks the budget before a model call: spent tokens or cost that
    /// reached their limit ask the turn to suspend for the policy (it parks
    /// before the call).
    fn check_model_budget(&mut self) {
        self.accounting = self.accounting_now();
        let refused = self
            .deps
            .budget
            .as_ref()
            .and_then(|b| b.model_call_refused(&self.accounting));
        if let Some(reason) = refused {
            self.deps.control.suspend_for_policy(reason);
        }
    }

    /// Cuts `group` to the tool calls the budget has left, putting the rest
    /// back at the front of `pending`. With none left the turn is asked to
    /// suspend for the policy and `group` goes back whole.
    fn cut_to_tool_budget(
        &self,
        group: &mut Vec<ToolCallRequest>,
        pending: &mut std::collections::VecDeque<ToolCallRequest>,
    ) {
        let Some(left) = self
            .deps
            .budget
            .as_ref()
            .and_then(|b| b.tool_calls_left(&self.accounting))
        else {
            return;
        };
        let keep = usize::try_from(left).unwrap_or(usize::MAX).min(group.len());
        for call in group.drain(keep..).rev() {
            pending.push_front(call);
        }
        if group.is_empty() {
            let max = self
                .deps
                .budget
                .as_ref()
                .and_then(|b| b.limits.max_tool_calls)
                .unwrap_or(0);
            self.deps.control.suspend_for_policy(format!(
                "tool calls reached the budget of {max}; {} call(s) left unstarted",
                pending.len()
            ));
        }
    }

    fn take_file_changes(&self) -> Vec<FileChange> {
        merge_changes(std::mem::take(
            &mut *self.file_changes.lock().unwrap_or_else(|e| e.into_inner()),
        ))
    }

    /// Turns the loop's result into the turn's exit: a suspension is
    /// checkpointed (and only then reported), anything else passes the
    /// `loop_exit` seam and ends.
    async fn conclude(mut self, result: Result<Terminal, Exit>) -> TurnExit {
        let terminal = match result {
            Ok(terminal) => terminal,
            Err(Exit::Stopped) => self.deps.control.stop_terminal(),
            Err(Exit::Sink(e)) => Terminal::new(TerminalKind::InternalError, e.to_string()),
            Err(Exit::Suspend(frame, seam)) => match self.suspend(*frame, seam).await {
                Ok(suspended) => return TurnExit::Suspended(Box::new(suspended)),
                Err(e) => Terminal::new(TerminalKind::InternalError, e.to_string()),
            },
        };
        // Seam: loop_exit, whatever ended the loop. A journal failure here is
        // already reflected in the terminal when it was the cause.
        let _ = self.exit_loop().await;
        self.accounting = self.accounting_now();
        TurnExit::Ended(TurnOutcome {
            terminal,
            accounting: self.accounting,
            usage: self.accounting.usage,
            file_changes: self.take_file_changes(),
            turn_messages: self.turn_messages,
        })
    }

    /// Parks the turn: the frame (with the files changed so far) is
    /// checkpointed, and only once that is acknowledged are messages still
    /// waiting for a seam dropped and the suspension reported.
    async fn suspend(
        &mut self,
        mut frame: Frame,
        seam: Seam,
    ) -> Result<ExecutionSuspended, SinkError> {
        // Nothing more is dispatched: the session is quiescing.
        self.deps.control.begin_quiescing();
        frame.file_changes = self.take_file_changes();
        self.sink.checkpoint(&frame).await?;
        let pending: Vec<_> = self.deps.control.drain_rest();
        for injection in pending {
            self.sink
                .emit(SessionEvent::InjectionDropped {
                    message_id: injection.message_id,
                    reason: "the session suspended before this message was delivered".into(),
                })
                .await?;
        }
        Ok(ExecutionSuspended {
            park: frame.park().cloned(),
            frame,
            seam,
        })
    }

    /// The frame for parking before the next model call.
    fn parked_before_model(&self, iteration: u32) -> Exit {
        Exit::Suspend(
            Box::new(self.frame(Phase::Provider, iteration, vec![], vec![])),
            Seam::TurnStart,
        )
    }

    async fn resume(&mut self, frame: Frame, resume: &ResumeInput) -> Result<Terminal, Exit> {
        let iteration = frame.iteration;
        let note = resume.input.as_ref().map(|input| match input {
            Value::String(text) => format!("[resumed] {text}"),
            other => format!("[resumed] {other}"),
        });
        if frame.phase == Phase::Tools {
            // The agent's park call is the waitpoint; otherwise the input is
            // read after the batch's results.
            self.resume_notes = frame.resume_notes.clone();
            if frame.park().is_none() {
                self.resume_notes.extend(note);
            }
            for call in frame.batch_calls() {
                self.deps.control.track_call(call.id.as_str());
            }
            self.finish_batch(
                iteration,
                frame.tool_outcomes,
                frame.unstarted_calls,
                Some(resume),
            )
            .await?;
        } else if let Some(text) = note {
            self.turn_messages.push(Message::User { text });
        }
        self.run_from(iteration).await
    }

    async fn run_from(&mut self, mut iteration: u32) -> Result<Terminal, Exit> {
        loop {
            // Seam: turn_start.
            if self.deps.control.is_stopped() {
                return Err(Exit::Stopped);
            }
            // A suspension waits for the step in flight, then parks here,
            // before the next model call; so does a budget whose tokens or
            // cost are spent.
            self.check_model_budget();
            if matches!(
                self.deps.control.suspend_requested(),
                Some(SuspendMode::FinishStep | SuspendMode::InterruptImmediate)
            ) {
                return Err(self.parked_before_model(iteration));
            }
            if iteration >= self.spec.max_model_calls {
                return Ok(Terminal::new(
                    TerminalKind::MaxTurnRequests,
                    format!(
                        "the turn reached its limit of {} model calls",
                        self.spec.max_model_calls
                    ),
                ));
            }
            self.deliver(Seam::TurnStart).await?;
            let response = match self.call_model(iteration).await? {
                Ok(response) => response,
                Err(e) => return Ok(Terminal::new(TerminalKind::ProviderError, e.to_string())),
            };
            self.accounting.model_calls += 1;
            self.accounting.usage.add(response.usage);
            self.check_budget();
            // Tool calls enter the transcript only when they will run: a call
            // without a result would make the next request invalid.
            let runs_tools = matches!(response.stop, ModelStop::EndTurn | ModelStop::ToolUse)
                && !response.tool_calls.is_empty();
            self.turn_messages.push(Message::Assistant {
                text: response.text.clone(),
                tool_calls: if runs_tools {
                    response.tool_calls.clone()
                } else {
                    Vec::new()
                },
            });
            match response.stop {
                ModelStop::MaxTokens => {
                    return Ok(Terminal::new(
                        TerminalKind::MaxTokens,
                        "the model hit its output token limit",
                    ))
                }
                ModelStop::Refusal => {
                    return Ok(Terminal::new(TerminalKind::Refusal, "the model refused"))
                }
                ModelStop::EndTurn | ModelStop::ToolUse if response.tool_calls.is_empty() => {
                    // Seam: turn_end. A steer or interrupt that arrived during
                    // the last answer keeps the loop going: the model reads it.
                    if self.deliver(Seam::TurnEnd).await? > 0 || self.judge(&response.text).await? {
                        iteration += 1;
                        continue;
                    }
                    return Ok(Terminal::new(
                        TerminalKind::Completed,
                        "the model ended its turn",
                    ));
                }
                ModelStop::EndTurn | ModelStop::ToolUse => {}
            }
            iteration += 1;
            self.run_tool_batch(iteration, response.tool_calls).await?;
        }
    }

    /// One model call, streaming deltas to the sink. The outer `Result` is the
    /// loop's early exit; the inner one the provider's answer.
    async fn call_model(
        &mut self,
        iteration: u32,
    ) -> Result<Result<ModelResponse, crate::model::ModelError>, Exit> {
        let request = ModelRequest {
            session_id: self.spec.session_id.clone(),
            turn_id: self.spec.turn_id.clone(),
            iteration,
            cwd: self.spec.cwd.clone(),
            history: Arc::clone(self.spec.history.messages()),
            history_fingerprint: self.spec.history.fingerprint().to_owned(),
            turn_messages: self.turn_messages.clone(),
            tools: self.deps.tools.shared_specs().clone(),
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let span = spans::model_call(
            self.deps.model.name(),
            &self.spec.session_id,
            &self.spec.turn_id,
            iteration,
        );
        let call = self
            .deps
            .model
            .complete(&request, tx)
            .instrument(span.clone());
        tokio::pin!(call);
        let mut streamed = String::new();
        // What the sink holds (an earlier answer's tail, the turn's start)
        // is written while the model is waited for, so a model that answers
        // at once (the scripted one) costs no commit of its own: its answer
        // rides with what is held on the turn's next write.
        let mut flushed = false;
        let result = loop {
            tokio::select! {
                biased;
                () = self.deps.control.stopped() => {
                    if !streamed.is_empty() {
                        self.turn_messages.push(Message::Assistant { text: streamed, tool_calls: vec![] });
                    }
                    return Err(Exit::Stopped);
                }
                // An answer that is complete goes first: the deltas it left
                // queued then ride on the turn's next write.
                result = &mut call => break result,
                // A delta's write carries what was held.
                Some(delta) = rx.recv() => {
                    self.sink.emit(Self::streamed(delta, &mut streamed)).await?;
                    flushed = true;
                }
                () = std::future::ready(()), if !flushed => {
                    flushed = true;
                    self.sink.flush().await?;
                }
            }
        };
        spans::model_result(&span, &result);
        drop(span);
        while let Ok(delta) = rx.try_recv() {
            let event = Self::streamed(delta, &mut streamed);
            self.sink.emit_with_next_write(event).await?;
        }
        Ok(result)
    }

    /// The event of one streamed delta; a text delta also extends `streamed`.
    fn streamed(delta: ModelDelta, streamed: &mut String) -> SessionEvent {
        match delta {
            ModelDelta::Text(text) => {
                streamed.push_str(&text);
                SessionEvent::AgentMessageChunk { text }
            }
            ModelDelta::Thought(text) => SessionEvent::AgentThoughtChunk { text },
        }
    }

    fn frame(
        &self,
        phase: Phase,
        iteration: u32,
        outcomes: Vec<ToolOutcome>,
        unstarted: Vec<ToolCallRequest>,
    ) -> Frame {
        Frame {
            version: FRAME_VERSION,
            session_id: self.spec.session_id.clone(),
            turn_id: self.spec.turn_id.clone(),
            phase,
            iteration,
            accounting: self.accounting_now(),
            tool_outcomes: outcomes,
            unstarted_calls: unstarted,
            turn_messages: self.turn_messages.clone(),
            history_fingerprint: self.history_fingerprint.clone(),
            config_fingerprint: self.config_fingerprint.clone(),
            dispatch_skipped: false,
            skip_reason: None,
            resume_notes: self.resume_notes.clone(),
            file_changes: Vec::new(),
        }
    }

    /// Drains the injections due at `seam` and puts them in the transcript:
    /// a steer as a `contract` directive, an interrupt as a user message, a
    /// queued message as an audit-only entry. Each delivery is journaled (and
    /// echoed to clients as a `user_message_chunk` with its message id) before
    /// the model can see it. Returns how many the model will read.
    async fn deliver(&mut self, seam: Seam) -> Result<usize, SinkError> {
        // A message the model will never read is not "delivered": with no
        // model call left it stays pending and is dropped at loop exit.
        if seam != Seam::LoopExit && self.accounting.model_calls >= self.spec.max_model_calls {
            return Ok(0);
        }
        let due = self.deps.control.drain_at(seam);
        let mut visible = 0;
        for injection in due {
            let text = injection.content.to_model_text();
            let mode = injection.mode;
            let message_id = injection.message_id.clone();
            self.sink
                .emit(SessionEvent::InjectionDelivered { injection, seam })
                .await?;
            match mode {
                // A delivered steer is a contract on the objective: no
                // completion judge can undo it.
                InjectMode::Steer => {
                    let directive = Directive {
                        authority: Authority::Contract,
                        key: "objective".into(),
                        text,
                        source: "steer".into(),
                    };
                    visible += usize::from(self.register(directive).await?);
                }
                InjectMode::InterruptImmediate => {
                    self.turn_messages.push(Message::User { text });
                    visible += 1;
                }
                InjectMode::Queue => self
                    .turn_messages
                    .push(Message::Queued { message_id, text }),
            }
        }
        Ok(visible)
    }

    /// Registers a directive on the ladder; when it is in force it is put in
    /// front of the model. Journals the decision either way. Returns whether
    /// it was applied.
    async fn register(&mut self, directive: Directive) -> Result<bool, SinkError> {
        let outcome = self.directives.register(directive.clone());
        let (applied, overruled_by) = match outcome {
            Registered::Applied { .. } => (true, None),
            Registered::Overruled { by } => (false, Some(by)),
        };
        if applied {
            self.turn_messages.push(Message::User {
                text: directive.render(),
            });
        }
        self.sink
            .emit(SessionEvent::Directive {
                directive,
                applied,
                overruled_by,
            })
            .await?;
        Ok(applied)
    }

    /// Runs the completion judge once per turn on the model's final answer.
    /// Returns whether its corrective directive is in force (the loop then
    /// goes on so the model reads it).
    async fn judge(&mut self, final_answer: &str) -> Result<bool, SinkError> {
        let Some(judge) = self.deps.judge.clone() else {
            return Ok(false);
        };
        if self.accounting.model_calls >= self.spec.max_model_calls {
            return Ok(false);
        }
        if std::mem::replace(&mut self.judged, true) {
            return Ok(false);
        }
        match judge.judge(&self.spec.prompt.to_model_text(), final_answer) {
            Some(directive) => self.register(directive).await,
            None => Ok(false),
        }
    }

    /// The loop-exit seam: delivers queued messages; anything still pending
    /// (the turn was stopped before a steer seam came) is recorded as dropped.
    async fn exit_loop(&mut self) -> Result<(), SinkError> {
        self.deliver(Seam::LoopExit).await?;
        let dropped: Vec<_> = self.deps.control.drain_rest();
        for injection in dropped {
            self.sink
                .emit(SessionEvent::InjectionDropped {
                    message_id: injection.message_id,
                    reason: "the turn ended before this message was delivered".into(),
                })
                .await?;
        }
        Ok(())
    }

    /// Announces and checkpoints one tool batch, then dispatches it
    /// ([`Turn::finish_batch`]) unless an interrupt skips it.
    async fn run_tool_batch(
        &mut self,
        iteration: u32,
        calls: Vec<ToolCallRequest>,
    ) -> Result<(), Exit> {
        let mut announced = Vec::with_capacity(calls.len());
        for call in &calls {
            self.deps.control.track_call(call.id.as_str());
            let (title, kind) = match self.deps.tools.get(&call.name) {
                Some(tool) => (tool.title(&call.arguments), tool.kind()),
                None => (call.name.clone(), crate::event::ToolKind::Other),
            };
            announced.push(SessionEvent::ToolCall {
                tool_call_id: call.id.clone(),
                name: call.name.clone(),
                title,
                kind,
                raw_input: call.arguments.clone(),
            });
        }
        // The calls and the frame that lists them: one durable write.
        self.sink
            .emit_with_checkpoint(
                announced,
                &self.frame(Phase::Tools, iteration, vec![], calls.clone()),
            )
            .await?;
        // Seam: pre_tool_dispatch. An interrupt here skips the whole batch.
        let interrupts = self.deps.control.drain_at(Seam::PreToolDispatch);
        if !interrupts.is_empty() {
            return self.skip_batch(iteration, calls, interrupts).await;
        }
        self.finish_batch(iteration, Vec::new(), calls, None).await
    }

    /// Settles a batch: continues its suspended calls (on resume), then
    /// dispatches the `unstarted` ones in order — consecutive
    /// concurrency-safe calls together, every other call alone — and records
    /// each outcome as a tool message, in call order.
    ///
    /// Before each group, an `interrupt_immediate` suspension parks the turn
    /// with the rest unstarted; a call that yields a continuation (or the
    /// agent's `await_resumption`) parks it once its group has settled.
    async fn finish_batch(
        &mut self,
        iteration: u32,
        mut outcomes: Vec<ToolOutcome>,
        unstarted: Vec<ToolCallRequest>,
        resume: Option<&ResumeInput>,
    ) -> Result<(), Exit> {
        // A tool acts outside the journal: what the sink holds (a woken
        // turn's start) is durable before one runs, so that after a crash
        // the call is known to have been started and is never run again.
        self.sink.flush().await?;
        let ctx = ToolContext {
            cwd: self.spec.cwd.clone(),
            additional_directories: self.spec.additional_directories.clone(),
            processes: Arc::clone(&self.deps.processes),
            call_id: None,
            suspend: self.deps.control.suspend_signal(),
        };
        if let Some(resume) = resume {
            let resumed = join_all(outcomes.iter().map(|outcome| async {
                match &outcome.continuation {
                    Some(continuation) if outcome.status == ToolOutcomeStatus::Suspended => {
                        self.dispatch(&ctx, &outcome.call, Some((continuation, resume)))
                            .await
                    }
                    _ => Ok(None),
                }
            }))
            .await;
            for (slot, resumed) in outcomes.iter_mut().zip(resumed) {
                if let Some(outcome) = resumed? {
                    *slot = outcome;
                }
            }
        }
        let mut pending = std::collections::VecDeque::from(unstarted);
        let parked = |outcomes: &[ToolOutcome]| {
            outcomes
                .iter()
                .any(|o| o.status == ToolOutcomeStatus::Suspended)
        };
        while !pending.is_empty() && !parked(&outcomes) {
            self.flush_settled().await?;
            if self.deps.control.suspend_requested() == Some(SuspendMode::InterruptImmediate) {
                break;
            }
            // A call that waits for approval runs alone: it may end up not
            // started, and must then stay in order with the unstarted rest.
            let safe = |call: &ToolCallRequest| {
                !self.deps.needs_approval.contains(&call.name)
                    && self
                        .deps
                        .tools
                        .get(&call.name)
                        .is_some_and(|tool| tool.concurrency_safe())
            };
            let mut group = vec![pending.pop_front().unwrap_or_else(|| unreachable!())];
            if safe(&group[0]) {
                while pending.front().is_some_and(safe) {
                    group.extend(pending.pop_front());
                }
            }
            // A limit of N tool calls dispatches at most N: the group is cut
            // there, and with none left the turn parks before dispatching.
            self.cut_to_tool_budget(&mut group, &mut pending);
            if group.is_empty() {
                break;
            }
            self.hold_settled
                .store(group.len() == 1, std::sync::atomic::Ordering::Relaxed);
            let settled = join_all(group.iter().map(|call| self.dispatch(&ctx, call, None))).await;
            self.hold_settled
                .store(false, std::sync::atomic::Ordering::Relaxed);
            for (call, outcome) in group.iter().zip(settled) {
                match outcome? {
                    Some(outcome) => {
                        if outcome.status != ToolOutcomeStatus::Interrupted {
                            self.accounting.tool_calls += 1;
                        }
                        outcomes.push(outcome);
                    }
                    None => pending.push_front(call.clone()),
                }
            }
            self.check_budget();
        }
        if !pending.is_empty() || parked(&outcomes) {
            // Calls left unstarted: an `interrupt_immediate` suspension took
            // effect before the next group dispatched. Otherwise a call of
            // the batch yielded (the agent's park, or a cooperative tool
            // honouring the suspend signal) and its group settled.
            let seam = if pending.is_empty() {
                Seam::PostToolDispatch
            } else {
                Seam::PreToolDispatch
            };
            self.flush_settled().await?;
            let frame = self.frame(Phase::Tools, iteration, outcomes, pending.into());
            return Err(Exit::Suspend(Box::new(frame), seam));
        }
        for outcome in &outcomes {
            self.turn_messages.push(Message::Tool {
                tool_call_id: outcome.call.id.clone(),
                content: outcome.content.clone(),
                is_error: outcome.status != ToolOutcomeStatus::Completed,
            });
        }
        for text in std::mem::take(&mut self.resume_notes) {
            self.turn_messages.push(Message::User { text });
        }
        let frame = self.frame(Phase::Provider, iteration, outcomes, vec![]);
        let settled = self.take_settled();
        if settled.is_empty() {
            self.sink.checkpoint(&frame).await?;
        } else {
            // The last call's `completed` update and the frame with its
            // outcome: one durable write.
            self.sink.emit_with_checkpoint(settled, &frame).await?;
        }
        // Seam: post_tool_dispatch.
        if self.deps.control.is_stopped() {
            return Err(Exit::Stopped);
        }
        self.deliver(Seam::PostToolDispatch).await?;
        Ok(())
    }

    /// Skips a whole batch for an interrupt (`remote-session-control.md`,
    /// "Interrupt"): every call gets a synthetic `interrupted` result, the
    /// checkpoint records `dispatch_skipped`, and the interrupt is put where
    /// the tool results would have been so the model reads it next.
    async fn skip_batch(
        &mut self,
        iteration: u32,
        calls: Vec<ToolCallRequest>,
        interrupts: Vec<Injection>,
    ) -> Result<(), Exit> {
        let mut outcomes = Vec::with_capacity(calls.len());
        for call in calls {
            self.update(
                &call,
                ToolCallStatus::Failed,
                json!({"dispatched": false, "interrupted": true, "reason": INTERRUPTED}),
                INTERRUPTED,
            )
            .await?;
            self.turn_messages.push(Message::Tool {
                tool_call_id: call.id.clone(),
                content: INTERRUPTED.into(),
                is_error: true,
            });
            outcomes.push(ToolOutcome {
                call,
                status: ToolOutcomeStatus::Interrupted,
                content: INTERRUPTED.into(),
                continuation: None,
                park: None,
            });
        }
        for injection in interrupts {
            self.turn_messages.push(Message::User {
                text: injection.content.to_model_text(),
            });
            self.sink
                .emit(SessionEvent::InjectionDelivered {
                    injection,
                    seam: Seam::PreToolDispatch,
                })
                .await?;
        }
        let mut frame = self.frame(Phase::Provider, iteration, outcomes, vec![]);
        frame.dispatch_skipped = true;
        frame.skip_reason = Some("interrupt_immediate".into());
        self.sink.checkpoint(&frame).await?;
        Ok(())
    }

    /// Runs one call (or continues a suspended one from its continuation).
    /// `None`: the call never started (an `interrupt_immediate` suspension
    /// came while it waited for approval); it stays unstarted.
    async fn dispatch(
        &self,
        ctx: &ToolContext,
        call: &ToolCallRequest,
        resume: Option<(&ToolContinuation, &ResumeInput)>,
    ) -> Result<Option<ToolOutcome>, SinkError> {
        let span = spans::tool_call(call, &self.spec.turn_id, resume.is_some());
        let outcome = self
            .dispatch_one(ctx, call, resume)
            .instrument(span.clone())
            .await;
        spans::tool_result(&span, &outcome);
        let outcome = outcome?;
        if outcome
            .as_ref()
            .is_some_and(|o| o.status != ToolOutcomeStatus::Suspended)
        {
            self.deps.control.finish_call(call.id.as_str());
        }
        Ok(outcome)
    }

    async fn dispatch_one(
        &self,
        ctx: &ToolContext,
        call: &ToolCallRequest,
        resume: Option<(&ToolContinuation, &ResumeInput)>,
    ) -> Result<Option<ToolOutcome>, SinkError> {
        let settle = |status: ToolOutcomeStatus, content: String| ToolOutcome {
            call: call.clone(),
            status,
            content,
            continuation: None,
            park: None,
        };
        if self.deps.control.is_stopped() {
            self.update(
                call,
                ToolCallStatus::Failed,
                json!({"dispatched": false, "reason": NOT_SENT}),
                NOT_SENT,
            )
            .await?;
            return Ok(Some(settle(
                ToolOutcomeStatus::Interrupted,
                NOT_SENT.into(),
            )));
        }
        // A `session/cancel_tool_call` before dispatch: never sent.
        let cancelled = self.deps.control.call_token(call.id.as_str());
        if cancelled.is_cancelled() {
            self.update(
                call,
                ToolCallStatus::Failed,
                json!({"dispatched": false, "cancelled": true, "reason": CALL_CANCELLED}),
                CALL_CANCELLED,
            )
            .await?;
            return Ok(Some(settle(
                ToolOutcomeStatus::Interrupted,
                CALL_CANCELLED.into(),
            )));
        }
        let Some(tool) = self.deps.tools.get(&call.name) else {
            let err = ToolError::UnknownTool {
                name: call.name.clone(),
            };
            self.update(call, ToolCallStatus::Failed, json!(err), &err.to_string())
                .await?;
            return Ok(Some(settle(ToolOutcomeStatus::Failed, err.to_string())));
        };
        // A continued call was approved before it first ran.
        if resume.is_none() && self.deps.needs_approval.contains(&call.name) {
            // An interrupt_immediate suspension while it waits: never
            // started, kept for after the resume.
            let Some(decision) = self.approve(tool.as_ref(), call, &cancelled).await? else {
                return Ok(None);
            };
            if decision != PermissionDecision::Allowed {
                let reason = match &decision {
                    PermissionDecision::Rejected { reason } => {
                        format!("not run: the user rejected this call ({reason})")
                    }
                    _ => "not run: the turn was stopped while this call waited for approval"
                        .to_owned(),
                };
                self.update(
                    call,
                    ToolCallStatus::Failed,
                    json!({"dispatched": false, "permission": decision}),
                    &reason,
                )
                .await?;
                return Ok(Some(settle(ToolOutcomeStatus::Interrupted, reason)));
            }
        }
        let in_progress = SessionEvent::ToolCallUpdate {
            tool_call_id: call.id.clone(),
            status: ToolCallStatus::InProgress,
            raw_output: None,
            content: None,
        };
        // A one-call group holds its `in_progress` update too: a call that
        // settles within IN_PROGRESS_GRACE journals it with its outcome (one
        // commit, not two); a slower one journals it when the grace ends, so
        // watchers still see a long call running. A crash in between changes
        // nothing: an open turn's announced, unsettled calls are sealed as
        // abandoned whether or not `in_progress` was on disk.
        let held = self.hold_settled.load(std::sync::atomic::Ordering::Relaxed);
        let hold_in_progress = held && self.sink.joins_in_progress();
        if hold_in_progress {
            self.hold(in_progress);
        } else {
            self.sink.emit(in_progress).await?;
        }
        let ctx = ToolContext {
            call_id: Some(call.id.0.clone()),
            ..ctx.clone()
        };
        let run = async {
            match resume {
                Some((continuation, input)) => {
                    tool.resume_execution(&ctx, continuation, input).await
                }
                None => tool.execute(&ctx, call.arguments.clone()).await,
            }
        };
        tokio::pin!(run);
        // The grace: the call may settle first. A stop or a cancel ends the
        // grace and is then answered below exactly as after it; the held
        // `in_progress` is journaled outside any race, so no write is ever
        // dropped half done.
        let mut early = None;
        if hold_in_progress {
            tokio::select! {
                biased;
                () = self.deps.control.stopped() => {}
                () = cancelled.cancelled() => {}
                result = &mut run => early = Some(result),
                () = tokio::time::sleep(IN_PROGRESS_GRACE) => {}
            }
            if early.is_none() {
                self.flush_settled().await?;
            }
        }
        let result = match early {
            Some(result) => Some(result),
            None => tokio::select! {
                biased;
                () = self.deps.control.stopped() => None,
                () = cancelled.cancelled() => {
                    // Only this call's processes; the turn goes on.
                    self.deps.processes.kill_call(call.id.as_str());
                    self.update(
                        call,
                        ToolCallStatus::Failed,
                        json!({"dispatched": true, "cancelled": true, "reason": CALL_CANCELLED}),
                        CALL_CANCELLED,
                    )
                    .await?;
                    return Ok(Some(settle(ToolOutcomeStatus::Interrupted, CALL_CANCELLED.into())));
                }
                result = &mut run => Some(result),
            },
        };
        match result {
            None => {
                self.update(
                    call,
                    ToolCallStatus::Failed,
                    json!({"dispatched": true, "reason": ABANDONED}),
                    ABANDONED,
                )
                .await?;
                Ok(Some(settle(ToolOutcomeStatus::Unknown, ABANDONED.into())))
            }
            Some(Ok(ToolExit::Suspended(parked))) => {
                let reason = match &parked.park {
                    Some(park) => format!("parked: {}", park.reason),
                    None => "suspended: this call continues when the session resumes".into(),
                };
                self.flush_settled().await?;
                self.sink
                    .emit(SessionEvent::ToolCallUpdate {
                        tool_call_id: call.id.clone(),
                        status: ToolCallStatus::InProgress,
                        raw_output: Some(
                            json!({"suspended": true, "continuation": parked.continuation}),
                        ),
                        content: Some(reason.clone()),
                    })
                    .await?;
                let parked = *parked;
                Ok(Some(ToolOutcome {
                    continuation: Some(parked.continuation),
                    park: parked.park,
                    ..settle(ToolOutcomeStatus::Suspended, reason)
                }))
            }
            Some(Ok(ToolExit::Done(mut output))) => {
                self.file_changes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .append(&mut output.file_changes);
                if held {
                    self.hold(update_event(
                        call,
                        ToolCallStatus::Completed,
                        output.raw,
                        &output.content,
                    ));
                } else {
                    self.update(call, ToolCallStatus::Completed, output.raw, &output.content)
                        .await?;
                }
                Ok(Some(settle(ToolOutcomeStatus::Completed, output.content)))
            }
            // A continuation that cannot be continued: the call's outcome is
            // unknown and it is never re-dispatched.
            Some(Err(err @ ToolError::NotResumable { .. })) => {
                self.update(call, ToolCallStatus::Failed, json!(err), &err.to_string())
                    .await?;
                Ok(Some(settle(
                    ToolOutcomeStatus::Unknown,
                    format!("error: {err}"),
                )))
            }
            Some(Err(err)) => {
                self.update(call, ToolCallStatus::Failed, json!(err), &err.to_string())
                    .await?;
                Ok(Some(settle(
                    ToolOutcomeStatus::Failed,
                    format!("error: {err}"),
                )))
            }
        }
    }

    /// Asks a client to approve `call`; a stop of the turn or of this call
    /// while it waits answers `cancelled`. The wait shows in
    /// `pending.approvals`; request and answer are journaled. `None`: an
    /// `interrupt_immediate` suspension came first (recorded as `cancelled`;
    /// the call is asked about again after the resume).
    async fn approve(
        &self,
        tool: &dyn crate::tools::Tool,
        call: &ToolCallRequest,
        cancelled: &tokio_util::sync::CancellationToken,
    ) -> Result<Option<PermissionDecision>, SinkError> {
        let request = PermissionRequest {
            tool_call_id: call.id.clone(),
            title: tool.title(&call.arguments),
            kind: tool.kind(),
            raw_input: call.arguments.clone(),
        };
        self.sink
            .emit(SessionEvent::PermissionRequested {
                request: request.clone(),
            })
            .await?;
        self.deps.control.set_pending_approval(&request, true);
        let decision = tokio::select! {
            biased;
            () = self.deps.control.stopped() => Some(PermissionDecision::Cancelled),
            () = cancelled.cancelled() => Some(PermissionDecision::Cancelled),
            () = self.deps.control.interrupted() => None,
            decision = self.sink.request_permission(&request) => Some(decision?),
        };
        self.deps.control.set_pending_approval(&request, false);
        self.sink
            .emit(SessionEvent::PermissionResolved {
                tool_call_id: call.id.clone(),
                decision: decision.clone().unwrap_or(PermissionDecision::Cancelled),
            })
            .await?;
        Ok(decision)
    }

    /// Journals a call's settled update, after whatever is held (so the
    /// held `in_progress` stays before it).
    async fn update(
        &self,
        call: &ToolCallRequest,
        status: ToolCallStatus,
        raw: serde_json::Value,
        content: &str,
    ) -> Result<(), SinkError> {
        self.flush_settled().await?;
        self.sink
            .emit(update_event(call, status, raw, content))
            .await
    }

    /// Holds `event` for the next write of the turn (see `hold_settled`).
    fn hold(&self, event: SessionEvent) {
        self.settled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
    }

    /// The held updates, in order; none are left held.
    fn take_settled(&self) -> Vec<SessionEvent> {
        std::mem::take(&mut *self.settled.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Journals the held updates, in order, before any other write of the
    /// turn.
    async fn flush_settled(&self) -> Result<(), SinkError> {
        for event in self.take_settled() {
            self.sink.emit(event).await?;
        }
        Ok(())
    }
}

/// A call's `tool_call_update` with its settled output.
fn update_event(
    call: &ToolCallRequest,
    status: ToolCallStatus,
    raw: serde_json::Value,
    content: &str,
) -> SessionEvent {
    SessionEvent::ToolCallUpdate {
        tool_call_id: call.id.clone(),
        status,
        raw_output: Some(raw),
        content: Some(content.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scripted::ScriptedModel;

    /// Frames on disk carry fingerprints of the plain encoding; the cached
    /// assembly must match it byte for byte, before and after the set changes.
    #[test]
    fn the_config_fingerprint_matches_the_plain_encoding() {
        let model = ScriptedModel::demo();
        let mut tools = ToolSet::builtin();
        let plain =
            |tools: &ToolSet| crate::frame::fingerprint(&(model.name(), tools.specs(), 7u32));
        assert_eq!(config_fingerprint_of(&model, &tools, 7), plain(&tools));
        let before = config_fingerprint_of(&model, &tools, 7);
        let mut fewer = ToolSet::default();
        fewer.insert(Arc::clone(tools.get("shell").expect("shell is built in")));
        assert_ne!(config_fingerprint_of(&model, &fewer, 7), before);
        assert_eq!(config_fingerprint_of(&model, &fewer, 7), plain(&fewer));
        tools.insert(Arc::clone(fewer.get("shell").expect("shell")));
        assert_eq!(config_fingerprint_of(&model, &tools, 7), before);
        assert_ne!(config_fingerprint_of(&model, &tools, 8), before);
        assert_eq!(config_fingerprint_of(&model, &tools, 7), before);
        // Another model over the same (remembered) specs is another fingerprint.
        let other = ScriptedModel::parse("[[rules]]\nmatch = \"x\"\nsteps = []\n", "toml", "other")
            .expect("a valid script");
        let plain_other = crate::frame::fingerprint(&(other.name(), tools.specs(), 7u32));
        assert_eq!(config_fingerprint_of(&other, &tools, 7), plain_other);
        assert_ne!(plain_other, before);
        assert_eq!(config_fingerprint_of(&model, &tools, 7), before);
        // Every turn fingerprints a clone of the node's set: the encoding is
        // made once for the set and its clones, also those made before it.
        let node = ToolSet::builtin();
        let (turn1, turn2) = (node.clone(), node.clone());
        assert!(std::ptr::eq(turn1.specs_json(), turn2.specs_json()));
        assert!(std::ptr::eq(turn1.specs_json(), node.specs_json()));
        // A changed set is encoded anew and leaves its clones alone.
        let mut changed = node.clone();
        changed.insert(Arc::clone(fewer.get("shell").expect("shell")));
        assert!(!std::ptr::eq(changed.specs_json(), node.specs_json()));
        assert_eq!(config_fingerprint_of(&model, &changed, 7), plain(&changed));
    }
}
