//! The turn loop.

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::join_all;
use serde_json::json;
use tokio::sync::mpsc;

use super::{PermissionDecision, PermissionRequest, SinkError, TurnControl, TurnSink};
use crate::content::Prompt;
use crate::directives::{Authority, CompletionJudge, Directive, DirectiveSet, Registered};
use crate::event::{SessionEvent, ToolCallStatus};
use crate::frame::{
    fingerprint, Accounting, Frame, Phase, ToolOutcome, ToolOutcomeStatus, FRAME_VERSION,
};
use crate::history::{Message, ToolCallRequest, Transcript};
use crate::ids::{SessionId, TurnId};
use crate::model::{ModelDelta, ModelProvider, ModelRequest, ModelResponse, ModelStop, Usage};
use crate::steering::{InjectMode, Injection, Seam};
use crate::terminal::{Terminal, TerminalKind};
use crate::tools::{FileChange, ProcessGroups, ToolContext, ToolError, ToolSet};

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
}

/// Result of a call stopped by `session/cancel_tool_call`.
const CALL_CANCELLED: &str =
    "cancelled: a client stopped this tool call (session/cancel_tool_call); \
                              the turn goes on";
/// The seed's reason for a call skipped by an interrupt.
const INTERRUPTED: &str = "a user interrupt arrived before this tool call was dispatched";
const NOT_SENT: &str = "not dispatched: the turn was stopped before this tool call was sent";
const ABANDONED: &str = "abandoned: the turn was stopped while this tool call ran; \
                         its effects, if any, were not undone";

/// Internal early exit of the loop.
enum Exit {
    Stopped,
    Sink(SinkError),
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
}

/// Runs one prompt turn to its terminal.
///
/// Every event is emitted through `sink` (durable before it returns); a frame is
/// checkpointed when a tool batch is ready and when it has settled. The caller
/// journals `turn_started` before and `turn_ended` after.
pub async fn run_turn(spec: &TurnSpec, deps: &TurnDeps, sink: &dyn TurnSink) -> TurnOutcome {
    let mut turn = Turn {
        spec,
        deps,
        sink,
        accounting: Accounting::default(),
        turn_messages: vec![Message::User {
            text: spec.prompt.to_model_text(),
        }],
        history_fingerprint: spec.history.fingerprint().to_owned(),
        config_fingerprint: fingerprint(&(
            deps.model.name(),
            deps.tools.specs(),
            spec.max_model_calls,
        )),
        directives: DirectiveSet::default(),
        judged: false,
        file_changes: Default::default(),
    };
    let terminal = match turn.run().await {
        Ok(terminal) => terminal,
        Err(Exit::Stopped) => deps.control.stop_terminal(),
        Err(Exit::Sink(e)) => Terminal::new(TerminalKind::InternalError, e.to_string()),
    };
    // Seam: loop_exit, whatever ended the loop. A journal failure here is
    // already reflected in the terminal when it was the cause.
    let _ = turn.exit_loop().await;
    TurnOutcome {
        terminal,
        usage: turn.accounting.usage,
        turn_messages: turn.turn_messages,
        file_changes: merge_changes(
            turn.file_changes
                .into_inner()
                .unwrap_or_else(|e| e.into_inner()),
        ),
    }
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

impl Turn<'_> {
    async fn run(&mut self) -> Result<Terminal, Exit> {
        let mut iteration = 0u32;
        loop {
            // Seam: turn_start.
            if self.deps.control.is_stopped() {
                return Err(Exit::Stopped);
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
            turn_messages: self.turn_messages.clone(),
            tools: self.deps.tools.specs(),
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let call = self.deps.model.complete(&request, tx);
        tokio::pin!(call);
        let mut streamed = String::new();
        let result = loop {
            tokio::select! {
                biased;
                () = self.deps.control.stopped() => {
                    if !streamed.is_empty() {
                        self.turn_messages.push(Message::Assistant { text: streamed, tool_calls: vec![] });
                    }
                    return Err(Exit::Stopped);
                }
                Some(delta) = rx.recv() => self.forward(delta, &mut streamed).await?,
                result = &mut call => break result,
            }
        };
        while let Ok(delta) = rx.try_recv() {
            self.forward(delta, &mut streamed).await?;
        }
        Ok(result)
    }

    async fn forward(&self, delta: ModelDelta, streamed: &mut String) -> Result<(), SinkError> {
        let event = match delta {
            ModelDelta::Text(text) => {
                streamed.push_str(&text);
                SessionEvent::AgentMessageChunk { text }
            }
            ModelDelta::Thought(text) => SessionEvent::AgentThoughtChunk { text },
        };
        self.sink.emit(event).await
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
            accounting: self.accounting,
            tool_outcomes: outcomes,
            unstarted_calls: unstarted,
            turn_messages: self.turn_messages.clone(),
            history_fingerprint: self.history_fingerprint.clone(),
            config_fingerprint: self.config_fingerprint.clone(),
            dispatch_skipped: false,
            skip_reason: None,
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
        let due = self.deps.control.steering().drain(seam);
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
        let dropped: Vec<_> = self.deps.control.steering().drain_all();
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

    /// Announces, checkpoints, dispatches and settles one tool batch, then
    /// records each outcome as a tool message (in call order).
    async fn run_tool_batch(
        &mut self,
        iteration: u32,
        calls: Vec<ToolCallRequest>,
    ) -> Result<(), Exit> {
        for call in &calls {
            self.deps.control.track_call(call.id.as_str());
            let (title, kind) = match self.deps.tools.get(&call.name) {
                Some(tool) => (tool.title(&call.arguments), tool.kind()),
                None => (call.name.clone(), crate::event::ToolKind::Other),
            };
            self.sink
                .emit(SessionEvent::ToolCall {
                    tool_call_id: call.id.clone(),
                    name: call.name.clone(),
                    title,
                    kind,
                    raw_input: call.arguments.clone(),
                })
                .await?;
        }
        self.sink
            .checkpoint(&self.frame(Phase::Tools, iteration, vec![], calls.clone()))
            .await?;
        // Seam: pre_tool_dispatch. An interrupt here skips the whole batch.
        let interrupts = self.deps.control.steering().drain(Seam::PreToolDispatch);
        if !interrupts.is_empty() {
            return self.skip_batch(iteration, calls, interrupts).await;
        }
        // Each call re-checks the stop flag right before it is sent, so a stop
        // that lands mid-batch still holds back every call not yet sent.
        let ctx = ToolContext {
            cwd: self.spec.cwd.clone(),
            additional_directories: self.spec.additional_directories.clone(),
            processes: Arc::clone(&self.deps.processes),
            call_id: None,
        };
        let outcomes = join_all(calls.iter().map(|call| self.dispatch(&ctx, call))).await;
        let outcomes = outcomes.into_iter().collect::<Result<Vec<_>, _>>()?;
        for outcome in &outcomes {
            self.turn_messages.push(Message::Tool {
                tool_call_id: outcome.call.id.clone(),
                content: outcome.content.clone(),
                is_error: outcome.status != ToolOutcomeStatus::Completed,
            });
        }
        self.sink
            .checkpoint(&self.frame(Phase::Provider, iteration, outcomes, vec![]))
            .await?;
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

    async fn dispatch(
        &self,
        ctx: &ToolContext,
        call: &ToolCallRequest,
    ) -> Result<ToolOutcome, SinkError> {
        let outcome = self.dispatch_one(ctx, call).await;
        self.deps.control.finish_call(call.id.as_str());
        outcome
    }

    async fn dispatch_one(
        &self,
        ctx: &ToolContext,
        call: &ToolCallRequest,
    ) -> Result<ToolOutcome, SinkError> {
        let settle = |status: ToolOutcomeStatus, content: String| ToolOutcome {
            call: call.clone(),
            status,
            content,
        };
        if self.deps.control.is_stopped() {
            self.update(
                call,
                ToolCallStatus::Failed,
                json!({"dispatched": false, "reason": NOT_SENT}),
                NOT_SENT,
            )
            .await?;
            return Ok(settle(ToolOutcomeStatus::Interrupted, NOT_SENT.into()));
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
            return Ok(settle(
                ToolOutcomeStatus::Interrupted,
                CALL_CANCELLED.into(),
            ));
        }
        let Some(tool) = self.deps.tools.get(&call.name) else {
            let err = ToolError::UnknownTool {
                name: call.name.clone(),
            };
            self.update(call, ToolCallStatus::Failed, json!(err), &err.to_string())
                .await?;
            return Ok(settle(ToolOutcomeStatus::Failed, err.to_string()));
        };
        if self.deps.needs_approval.contains(&call.name) {
            let decision = self.approve(tool.as_ref(), call, &cancelled).await?;
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
                return Ok(settle(ToolOutcomeStatus::Interrupted, reason));
            }
        }
        self.sink
            .emit(SessionEvent::ToolCallUpdate {
                tool_call_id: call.id.clone(),
                status: ToolCallStatus::InProgress,
                raw_output: None,
                content: None,
            })
            .await?;
        let ctx = ToolContext {
            call_id: Some(call.id.0.clone()),
            ..ctx.clone()
        };
        let result = tokio::select! {
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
                return Ok(settle(ToolOutcomeStatus::Interrupted, CALL_CANCELLED.into()));
            }
            result = tool.call(&ctx, call.arguments.clone()) => Some(result),
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
                Ok(settle(ToolOutcomeStatus::Unknown, ABANDONED.into()))
            }
            Some(Ok(mut output)) => {
                self.file_changes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .append(&mut output.file_changes);
                self.update(call, ToolCallStatus::Completed, output.raw, &output.content)
                    .await?;
                Ok(settle(ToolOutcomeStatus::Completed, output.content))
            }
            Some(Err(err)) => {
                self.update(call, ToolCallStatus::Failed, json!(err), &err.to_string())
                    .await?;
                Ok(settle(ToolOutcomeStatus::Failed, format!("error: {err}")))
            }
        }
    }

    /// Asks a client to approve `call`; a stop of the turn or of this call
    /// while it waits answers `cancelled`. The wait shows in
    /// `pending.approvals`; request and answer are journaled.
    async fn approve(
        &self,
        tool: &dyn crate::tools::Tool,
        call: &ToolCallRequest,
        cancelled: &tokio_util::sync::CancellationToken,
    ) -> Result<PermissionDecision, SinkError> {
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
            () = self.deps.control.stopped() => PermissionDecision::Cancelled,
            () = cancelled.cancelled() => PermissionDecision::Cancelled,
            decision = self.sink.request_permission(&request) => decision?,
        };
        self.deps.control.set_pending_approval(&request, false);
        self.sink
            .emit(SessionEvent::PermissionResolved {
                tool_call_id: call.id.clone(),
                decision: decision.clone(),
            })
            .await?;
        Ok(decision)
    }

    async fn update(
        &self,
        call: &ToolCallRequest,
        status: ToolCallStatus,
        raw: serde_json::Value,
        content: &str,
    ) -> Result<(), SinkError> {
        self.sink
            .emit(SessionEvent::ToolCallUpdate {
                tool_call_id: call.id.clone(),
                status,
                raw_output: Some(raw),
                content: Some(content.to_owned()),
            })
            .await
    }
}
