//! `session/prompt`: start a turn, and seal (or park) it when it leaves the
//! engine. Resumed turns (`session/resume`) start through the same path.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use berth_runtime::budget::{Budget, BudgetLimits};
use berth_runtime::content::Prompt;
use berth_runtime::engine::{
    config_fingerprint, resume_turn, run_turn, TurnControl, TurnDeps, TurnExit, TurnOutcome,
    TurnSpec,
};
use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::frame::Frame;
use berth_runtime::history::{Message, Transcript};
use berth_runtime::ids::TurnId;
use berth_runtime::suspension::Suspension;
use berth_runtime::tape::{Tape, TapeRecorder, TapedClock, TapedModel, TapedTool, TurnConfig};
use berth_runtime::terminal::{Terminal, TerminalKind};
use berth_runtime::tools::ResumeInput;
use berth_storage::{Batch, OpenTurn, SessionRecord, TurnCheckpoint};
use futures::FutureExt;
use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tracing::Instrument;

use super::super::receipt::{stamp, Stamper};
use super::super::sink::{Held, JournalSink};
use super::super::{RunningTurn, SessionMsg, SessionState};
use super::suspend;
use crate::error::ControlError;
use crate::node::PromptOutcome;

/// Longest title derived from a first prompt (characters).
const TITLE_CHARS: usize = 80;

/// Where a prompt's answer goes (none for a turn a resume started).
pub(crate) type PromptReply = RpcReplyPort<Result<PromptOutcome, ControlError>>;

/// What a turn task runs.
pub(crate) enum Run {
    /// A fresh turn on a prompt.
    Fresh,
    /// A parked turn continued from its frame.
    Resume {
        /// The frame.
        frame: Box<Frame>,
        /// What the resume feeds the waitpoint.
        input: ResumeInput,
    },
}

/// Writes that must land atomically with a turn's start (a resume claim, the
/// seal of the turn it supersedes), and the transcript messages they append.
#[derive(Default)]
pub(crate) struct Prelude {
    pub batch: Batch,
    pub events: Vec<SessionEvent>,
    pub transcript: Vec<Message>,
    /// The new turn's id, when the prelude's events already name it (a
    /// resume's `resumed`); otherwise one is generated.
    pub turn_id: Option<TurnId>,
    /// Whether the start may be written with the turn's first write
    /// ([`Held::starting`]) instead of before the turn runs: only when
    /// nothing waits on it being durable and nothing in it can be refused
    /// (a wake-up's resume, whose claim is already durable). A crash before
    /// that write leaves the claimed suspension, which the next start
    /// resumes again.
    pub held: bool,
    /// The watcher (connection) that sent the prompt, carried by the live
    /// `turn_started` notice.
    pub origin: Option<u64>,
}

/// Accepts a prompt from watcher `origin`. Refuses with `SessionClosed` /
/// `SessionSuspended` / `PromptActive`; otherwise see [`begin`].
pub(crate) async fn start(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    prompt: Prompt,
    origin: Option<u64>,
    reply: PromptReply,
) -> Result<(), ActorProcessingErr> {
    let session_id = state.record.session_id.clone();
    if state.record.closed_at.is_some() {
        let _ = reply.send(Err(ControlError::SessionClosed { session_id }));
        return Ok(());
    }
    if let Some(suspension) = &state.suspension {
        let _ = reply.send(Err(ControlError::SessionSuspended {
            session_id,
            handle: suspension.handle.clone(),
        }));
        return Ok(());
    }
    if let Some(turn) = &state.turn {
        let _ = reply.send(Err(ControlError::PromptActive {
            session_id,
            turn_id: turn.turn_id.clone(),
        }));
        return Ok(());
    }
    let prelude = Prelude {
        origin,
        ..Prelude::default()
    };
    if let Err((e, Some(reply))) = begin(myself, state, prompt, Some(reply), prelude).await {
        let _ = reply.send(Err(e));
    }
    Ok(())
}

/// Starts a fresh turn: journals `turn_started` and the open-turn marker
/// (with `prelude`'s writes, atomically; durable), then runs the turn as a
/// task owned by the actor. The reply is held until [`finish`].
///
/// # Errors
/// The journal's error, with the reply handed back; nothing was written.
pub(crate) async fn begin(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    prompt: Prompt,
    reply: Option<PromptReply>,
    prelude: Prelude,
) -> Result<TurnId, (ControlError, Option<PromptReply>)> {
    let env = Arc::clone(&state.env);
    let session_id = state.record.session_id.clone();
    let now = env.config.clock.now();
    let origin = prelude.origin;
    let turn_id = prelude
        .turn_id
        .clone()
        .unwrap_or_else(|| TurnId(env.config.ids.new_id("turn")));
    let prompt_text = prompt.to_model_text();
    let mut record = state.record.clone();
    record.updated_at = now;
    if record.title.is_none() {
        let first_line: String = prompt_text
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(TITLE_CHARS)
            .collect();
        record.title = Some(first_line).filter(|t| !t.trim().is_empty());
    }
    let mut events: Vec<EventRecord> = stamp(&env, &session_id, None, now, prelude.events);
    events.push(EventRecord::new(
        now,
        SessionEvent::TurnStarted {
            turn_id: turn_id.clone(),
            prompt: prompt.clone(),
        },
    ));
    let open = OpenTurn {
        session_id: session_id.clone(),
        turn_id: turn_id.clone(),
        started_at: now,
        prompt_text,
    };
    let batch = events
        .iter()
        .fold(prelude.batch.put_session(&record), |b, e| {
            b.append(&session_id, e)
        })
        .open_turn(&open);
    let held = if prelude.held {
        Held::starting(batch, events)
    } else {
        let ids = match env.journal.commit(batch).await {
            Ok(ids) => ids,
            Err(e) => return Err((e.into(), reply)),
        };
        state.watchers.publish_from(
            &session_id,
            ids.into_iter().zip(events.into_iter().map(Arc::new)),
            origin,
        );
        Held::default()
    };
    state.record = record;
    state.transcript.extend(prelude.transcript);
    spawn(
        myself,
        state,
        turn_id.clone(),
        prompt,
        Run::Fresh,
        reply,
        held,
    );
    Ok(turn_id)
}

/// The transcript the model reads: from the session's context start on.
pub(crate) fn model_history(state: &SessionState) -> Transcript {
    let from = usize::try_from(state.record.context_from).unwrap_or(usize::MAX);
    if from == 0 {
        return state.transcript.clone();
    }
    let messages = state.transcript.messages();
    Transcript::from_messages(messages.get(from..).unwrap_or_default().to_vec())
}

/// The spec and dependencies a turn of this session runs with.
pub(crate) fn turn_setup(
    state: &SessionState,
    turn_id: TurnId,
    prompt: Prompt,
    control: &Arc<TurnControl>,
) -> (TurnSpec, TurnDeps) {
    let env = &state.env;
    let spec = TurnSpec {
        session_id: state.record.session_id.clone(),
        turn_id,
        cwd: state.record.cwd.clone(),
        additional_directories: state.record.additional_directories.clone(),
        history: model_history(state),
        prompt,
        max_model_calls: env.config.max_model_calls,
    };
    let deps = TurnDeps {
        model: Arc::clone(&env.config.model),
        tools: env.config.tools.clone(),
        processes: Arc::clone(&state.processes),
        control: Arc::clone(control),
        judge: env.config.completion_judge.clone(),
        needs_approval: env.config.needs_approval.clone(),
        budget: session_budget(state),
        clock: Arc::clone(&env.config.clock),
    };
    (spec, deps)
}

/// `deps` with its model, tools and clock recording on a fresh replay tape
/// (`berth_runtime::tape`), which starts with the run's configuration.
pub(crate) fn taped(spec: &TurnSpec, deps: TurnDeps) -> (TurnDeps, TapeRecorder) {
    let tape = TapeRecorder::new(TurnConfig {
        model: deps.model.name().to_owned(),
        max_model_calls: spec.max_model_calls,
        tools: deps.tools.names(),
        needs_approval: deps.needs_approval.clone(),
        judge: deps.judge.as_ref().map(|j| format!("{j:?}")),
        budget: deps.budget.clone(),
        config_fingerprint: config_fingerprint(spec, &deps),
    });
    let tools = deps
        .tools
        .wrapped(|tool| Arc::new(TapedTool::new(Arc::clone(tool), tape.clone())) as Arc<_>);
    let deps = TurnDeps {
        model: Arc::new(TapedModel::new(Arc::clone(&deps.model), tape.clone())),
        clock: Arc::new(TapedClock::new(Arc::clone(&deps.clock), tape.clone())),
        tools,
        ..deps
    };
    (deps, tape)
}

/// The budget this session's turns run under: the tightest limits of the
/// policies that apply (all sessions, or its labels), raised by what
/// operators granted; `None` when no policy applies.
fn session_budget(state: &SessionState) -> Option<Budget> {
    let config = &state.env.config;
    let limits = config
        .budgets
        .iter()
        .filter(|p| {
            p.label
                .as_ref()
                .is_none_or(|l| state.record.labels.contains(l))
        })
        .fold(None, |acc: Option<BudgetLimits>, p| {
            Some(acc.map_or_else(|| p.limits.clone(), |a| a.tighter(&p.limits)))
        })?;
    Some(Budget {
        limits: limits.raised(&state.record.budget_grant),
        spent: state.record.spend,
        price: config.prices.get(config.model.name()).copied(),
    })
}

/// Runs `run` as a task owned by the actor; it reports back with
/// [`SessionMsg::TurnFinished`].
pub(crate) fn spawn(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    turn_id: TurnId,
    prompt: Prompt,
    run: Run,
    reply: Option<PromptReply>,
    held: Held,
) {
    let control = Arc::new(TurnControl::default());
    let (spec, deps) = turn_setup(state, turn_id.clone(), prompt, &control);
    let (deps, tape) = taped(&spec, deps);
    let sink = JournalSink::new(
        Arc::clone(&state.env),
        state.record.session_id.clone(),
        turn_id.clone(),
        Arc::clone(&state.watchers),
        tape.clone(),
        held.clone(),
    );
    let actor = myself.clone();
    let finished_id = turn_id.clone();
    let span = crate::telemetry::turn_span(
        &state.record.session_id,
        &turn_id,
        matches!(run, Run::Resume { .. }),
    );
    let turn_span = span.clone();
    let task = tokio::spawn(async move {
        let running = async {
            match run {
                Run::Fresh => run_turn(&spec, &deps, &sink).await,
                Run::Resume { frame, input } => {
                    resume_turn(&spec, &deps, &sink, *frame, &input).await
                }
            }
        };
        // A panic inside the turn (a tool, a provider) must still seal the
        // turn. The span leaves the task with the turn: the actor holds the
        // last handle and closes it before it commits the seal or the park.
        let exit = match AssertUnwindSafe(running.instrument(turn_span))
            .catch_unwind()
            .await
        {
            Ok(exit) => exit,
            Err(panic) => TurnExit::Ended(panicked_turn(&spec, panic.as_ref())),
        };
        // Release the turn's share of the transcript before the actor extends it.
        drop((spec, deps, sink));
        // What the run consumed after its last event rides on its exit batch
        // (with what it held, which the actor takes from `RunningTurn::held`).
        let tape = Box::new(tape.take());
        // If the actor is gone, its successor seals the turn from the journal
        // (what was held was never shown to anyone).
        let _ = actor.send_message(SessionMsg::TurnFinished {
            turn_id: finished_id,
            exit: Box::new(exit),
            tape,
        });
    });
    state.turn = Some(RunningTurn {
        turn_id,
        control,
        reply,
        started_at: state.env.config.clock.now(),
        task: task.abort_handle(),
        span,
        held,
    });
}

/// The outcome of a turn whose task panicked: an `internal_error` terminal
/// naming the panic; the transcript keeps the prompt.
fn panicked_turn(spec: &TurnSpec, panic: &(dyn std::any::Any + Send)) -> TurnOutcome {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    tracing::error!(session_id = %spec.session_id, turn_id = %spec.turn_id, panic = %what, "turn task panicked");
    TurnOutcome {
        terminal: Terminal::new(
            TerminalKind::InternalError,
            format!("the turn failed inside berth: {what}"),
        ),
        usage: Default::default(),
        accounting: Default::default(),
        turn_messages: vec![Message::User {
            text: spec.prompt.to_model_text(),
        }],
        file_changes: Vec::new(),
    }
}

/// Handles a turn leaving the engine: a suspension is parked
/// ([`suspend::park_turn`]), an ending is sealed ([`seal_ended`]). Then a
/// close that was waiting for the turn completes.
///
/// # Errors
/// A journal failure fails the actor after answering the prompt with it; the
/// supervisor restarts the actor, which seals (or parks) the turn from the
/// journal.
pub(crate) async fn finish(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    turn_id: TurnId,
    exit: TurnExit,
    tape: Tape,
) -> Result<(), ActorProcessingErr> {
    if state.turn.as_ref().is_none_or(|t| t.turn_id != turn_id) {
        return Ok(());
    }
    let Some(turn) = state.turn.take() else {
        return Ok(());
    };
    let ran_ms = (state.env.config.clock.now() - turn.started_at).num_milliseconds();
    let label = match &exit {
        TurnExit::Ended(outcome) => crate::metrics::terminal_label(outcome.terminal.kind),
        TurnExit::Suspended(_) => "suspended".into(),
    };
    crate::metrics::record_turn(&label, ran_ms);
    match exit {
        TurnExit::Ended(outcome) => seal_ended(state, turn, outcome, tape).await?,
        TurnExit::Suspended(suspended) => suspend::park_turn(state, turn, *suspended, tape).await?,
    }
    if !state.pending_close.is_empty() {
        // Boxed: a close is rare, and its future (≈ 10 KB) inline would
        // double the size of every `finish` future, which is moved
        // (memcpy) into place on each turn's end.
        Box::pin(super::close::finalize(myself, state)).await?;
    }
    super::scheduled::start_buffered(myself, state).await;
    Ok(())
}

/// What sealing an ended turn journals: `turn_ended` (after a drop for every
/// message still queued) and — when a suspension was requested while it ran
/// and it ended before a seam could park it (`wait_for_completion`, or the
/// model ended the turn), unless a close is waiting (`closing`) — the idle
/// session's park, drained at `loop_exit`. Takes the request out of `record`.
/// Returns the events and the suspension to commit with them. The same
/// function re-derives the exit in `berth replay`. `link` fills a park's
/// span links before its receipts are derived (see
/// [`suspend::parked_turn_events`]); it is not called when nothing parks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ended_events(
    env: &impl Stamper,
    record: &mut SessionRecord,
    control: &TurnControl,
    turn_id: &TurnId,
    outcome: &TurnOutcome,
    closing: bool,
    now: chrono::DateTime<chrono::Utc>,
    link: impl FnOnce(&mut Suspension),
) -> (Vec<SessionEvent>, Option<Suspension>) {
    let terminal = outcome.terminal.clone();
    // Injections accepted after the turn's loop exited never reached it.
    let mut events =
        suspend::drop_pending(control, "the turn ended before this message was delivered");
    events.push(SessionEvent::TurnEnded {
        turn_id: turn_id.clone(),
        stop_reason: terminal.stop_reason(),
        terminal,
        usage: outcome.usage,
    });
    // A close stops the turn and takes precedence over a pending suspension.
    let request = record
        .suspend_request
        .take()
        .or_else(|| suspend::policy_request(env, control, now));
    let parked = match request {
        Some(request) if !closing => {
            let mut suspension = suspend::envelope(record, &request, None, None, now);
            link(&mut suspension);
            // Drained after the loop exited (`wait_for_completion`, or the
            // model ended the turn before a seam could park it).
            events.extend(suspend::parked_events(
                env,
                &suspension,
                "session/suspend",
                Some((
                    request.mode,
                    Some(berth_runtime::steering::Seam::LoopExit),
                    turn_id.clone(),
                )),
            ));
            Some(suspension)
        }
        _ => None,
    };
    (events, parked)
}

/// Seals an ended turn: one durable batch with the events the turn still
/// held for its next write, then [`ended_events`] (the leftover of the run's
/// replay `tape` on the first record), the new
/// transcript, the turn checkpoint, and the open-turn marker and frame
/// removed — and the idle session parked in the same batch when a
/// suspension was pending. Then answers the prompt.
async fn seal_ended(
    state: &mut SessionState,
    mut turn: RunningTurn,
    outcome: TurnOutcome,
    tape: Tape,
) -> Result<(), ActorProcessingErr> {
    let env = Arc::clone(&state.env);
    let session_id = state.record.session_id.clone();
    let now = env.config.clock.now();
    let start = state.transcript.len() as u64;
    let terminal = outcome.terminal.clone();
    let stop_reason = terminal.stop_reason();
    // The turn's checkpoint; a new turn discards what was rolled back.
    let mut record = state.record.clone();
    record.updated_at = now;
    let price = env.config.prices.get(env.config.model.name());
    record.spend.add(&outcome.accounting, price);
    record.checkpoint_head += 1;
    let checkpoint = TurnCheckpoint {
        checkpoint_id: turn.turn_id.0.clone(),
        before_message_count: start,
        after_message_count: start + outcome.turn_messages.len() as u64,
        messages: outcome.turn_messages.clone(),
        files: outcome.file_changes.clone(),
    };
    let mut batch = Batch::new()
        .delete_checkpoints_from(&session_id, record.checkpoint_head)
        .put_checkpoint(&session_id, record.checkpoint_head, &checkpoint)
        .append_transcript(&session_id, start, &outcome.turn_messages)
        .delete_frame(&session_id)
        .close_turn(&session_id);
    let mut suspend_span = None;
    let (events, parked) = ended_events(
        &env,
        &mut record,
        &turn.control,
        &turn.turn_id,
        &outcome,
        !state.pending_close.is_empty(),
        now,
        |suspension| {
            suspend_span = Some(crate::telemetry::suspend_span(suspension, Some(&turn.span)));
        },
    );
    if let Some(suspension) = &parked {
        batch = batch.put_suspension(suspension);
    }
    let records = stamp(&env, &session_id, Some(&turn.turn_id), now, events);
    // The turn's and the suspension's spans end before the commit.
    drop(suspend_span);
    drop(std::mem::replace(&mut turn.span, tracing::Span::none()));
    // What the turn held for its next write goes first.
    let written = turn
        .held
        .write(
            &env.journal,
            &session_id,
            batch.put_session(&record),
            records,
            || tape,
        )
        .await;
    match written {
        Ok((ids, records)) => {
            state.record = record;
            state.transcript.extend(outcome.turn_messages);
            state.last_control = Some(Arc::clone(&turn.control));
            state.watchers.publish(
                &session_id,
                ids.into_iter().zip(records.into_iter().map(Arc::new)),
            );
            if let Some(reply) = turn.reply.take() {
                let _ = reply.send(Ok(PromptOutcome {
                    turn_id: turn.turn_id.clone(),
                    terminal,
                    stop_reason,
                    usage: outcome.usage,
                    suspension_handle: None,
                }));
            }
            match parked {
                Some(suspension) => suspend::parked(state, suspension),
                None => suspend::fail_waiters(
                    state,
                    ControlError::SessionClosed {
                        session_id: session_id.clone(),
                    },
                ),
            }
            Ok(())
        }
        Err(e) => {
            if let Some(reply) = turn.reply.take() {
                let _ = reply.send(Err(e.clone().into()));
            }
            suspend::fail_waiters(state, e.clone().into());
            Err(Box::new(e))
        }
    }
}
