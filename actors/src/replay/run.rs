//! Replaying one run of a turn: the real engine, fed from the tape and the
//! recorded controls, then the session actor's exit (seal or park)
//! re-derived with the actor's own functions.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use berth_runtime::content::Prompt;
use berth_runtime::directives::{CompletionJudge, ObjectiveJudge};
use berth_runtime::engine::{
    check_resumable, config_fingerprint, resume_turn, run_turn, SteeringFeed, TurnControl,
    TurnDeps, TurnExit, TurnSpec,
};
use berth_runtime::event::SessionEvent;
use berth_runtime::frame::Frame;
use berth_runtime::history::Transcript;
use berth_runtime::ids::TurnId;
use berth_runtime::receipt::DrainedItem;
use berth_runtime::suspension::{Initiator, SuspendMode, SuspendRequest};
use berth_runtime::tape::Tape;
use berth_runtime::terminal::TerminalKind;
use berth_runtime::tools::{ProcessGroups, ResumeInput, Tool, ToolSet};

use super::inputs::{Inputs, ReplayClock, ReplayModel, ReplayTool};
use super::sequencer::{is_input, ExitControl, ReplaySink, SeqState, Shared};
use super::{CutCause, CutShort, Divergence, ReplayError, RunReport, Walk};
use crate::session::lifecycle::{prompt, resume, suspend};
use crate::session::receipt::stamp;

/// What a run starts from.
pub(super) enum RunKind {
    /// A fresh turn on this prompt.
    Fresh(Prompt),
    /// A parked turn continued from its frame with this resume input.
    Resume(Box<Frame>, ResumeInput),
}

/// Wakes by setting a flag: a poll that leaves it unset made no progress and
/// none is coming (the replayed turn waits on nothing but the replay).
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Polls `fut` to completion on this thread; `None` when it stalls (pending
/// with nothing left to wake it). Nothing a replayed turn awaits involves
/// I/O or timers, so this never blocks.
fn drive<F: Future>(fut: F) -> Option<F::Output> {
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(Arc::clone(&flag));
    let mut cx = Context::from_waker(&waker);
    // Outside tokio's cooperative budget: a budget spent by the caller's
    // task would otherwise turn every channel read into a yield.
    let mut fut = std::pin::pin!(tokio::task::unconstrained(fut));
    loop {
        flag.0.store(false, Ordering::SeqCst);
        if let Poll::Ready(output) = fut.as_mut().poll(&mut cx) {
            return Some(output);
        }
        if !flag.0.load(Ordering::SeqCst) {
            return None;
        }
    }
}

/// Whether the recorded exit at `index` was written by a start-up (or actor
/// restart) recovery from the turn's last checkpoint rather than by the
/// turn leaving the engine.
fn recovered_exit(rows: &[super::sequencer::Row], index: usize) -> bool {
    match &rows[index].rec.event {
        SessionEvent::TurnEnded { terminal, .. } => {
            matches!(
                terminal.kind,
                TerminalKind::ProcessRestarted
                    | TerminalKind::InternalError
                    | TerminalKind::UserCancelled
            ) && terminal.reason.contains(" (turn started ")
        }
        // A client's request completed at start-up: drained outside any seam.
        SessionEvent::Suspended { handle, .. } => rows[index..].iter().take(5).any(|r| {
            matches!(&r.rec.event, SessionEvent::DrainDecisionReceipt(d)
                if matches!(&d.receipt.item, DrainedItem::SuspendRequest { handle: h, .. } if h == handle)
                    && d.receipt.seam.is_none())
        }),
        _ => false,
    }
}

impl Walk<'_> {
    /// Replays the run of `turn_id` that starts at row `start` (its
    /// `turn_started`, or the `resumed` that continues it). Returns the row
    /// after its exit.
    pub(super) fn run(
        &mut self,
        start: usize,
        turn_id: TurnId,
        kind: RunKind,
    ) -> Result<usize, ReplayError> {
        let rows = Arc::clone(&self.rows);
        // The run's exit: its `turn_ended`, or the `suspended` that parks it.
        let exit_index = (start + 1..rows.len()).find(|&i| match &rows[i].rec.event {
            SessionEvent::TurnEnded { turn_id: t, .. } => *t == turn_id,
            SessionEvent::Suspended {
                turn_id: Some(t), ..
            } => *t == turn_id,
            _ => false,
        });
        let open = exit_index.is_none();
        let exit_index = exit_index.unwrap_or(rows.len());
        let recovered = open || recovered_exit(&rows, exit_index);
        // Why a crash cut this run, should it turn out to be cut.
        let cause = if open {
            CutCause::LogEnds
        } else {
            CutCause::Recovered
        };
        // The run's tape, its injections, its pending suspend request, the
        // calls cancelled one by one.
        let mut tape = Tape::default();
        let mut seq = SeqState::new(
            Arc::clone(&rows),
            start,
            exit_index,
            self.session_id(),
            turn_id.clone(),
        );
        let mut request: Option<SuspendRequest> = None;
        for i in start..exit_index.min(rows.len()) {
            let rec = &rows[i].rec;
            tape.extend(rec.tape.clone());
            match &rec.event {
                SessionEvent::InjectionAccepted { injection }
                | SessionEvent::InjectionReplaced { injection } => {
                    seq.injections
                        .insert(injection.message_id.clone(), injection.clone());
                }
                SessionEvent::SuspendRequested {
                    handle,
                    mode,
                    initiator,
                    reason,
                    resume_when,
                    ..
                } => {
                    let actor = rows[i + 1..].iter().find_map(|r| match &r.rec.event {
                        SessionEvent::ControlOutcome(o)
                            if o.receipt.method == "session/suspend" =>
                        {
                            Some(o.receipt.actor.clone())
                        }
                        _ => None,
                    });
                    request = Some(SuspendRequest {
                        handle: handle.clone(),
                        mode: *mode,
                        initiator: *initiator,
                        actor: actor.unwrap_or_default(),
                        reason: reason.clone(),
                        resume_when: resume_when.clone(),
                        requested_at: rec.at,
                    });
                }
                SessionEvent::ControlOutcome(o) => {
                    let o = &o.receipt;
                    if o.method == "session/suspend" && o.outcome == "suspend_pending" {
                        if let (Some(r), Some(mode)) = (
                            request.as_mut(),
                            o.reason
                                .as_deref()
                                .and_then(|m| serde_json::from_value::<SuspendMode>(m.into()).ok()),
                        ) {
                            r.mode = mode;
                        }
                    }
                    if o.method == "session/cancel_tool_call" && o.outcome == "cancelled" {
                        if let Some(id) = o.target.get("toolCallId").and_then(|v| v.as_str()) {
                            seq.cancelled_calls.insert(id.to_owned());
                        }
                    }
                }
                _ => {}
            }
        }
        if exit_index < rows.len() {
            tape.extend(rows[exit_index].rec.tape.clone());
        }
        let Some(config) = tape.config.clone() else {
            if recovered {
                // Cut by a crash before anything of it was taped (its first
                // model call had not answered): replay stops here and says
                // so, as for any run a crash cut.
                self.report.cut_short = Some(CutShort {
                    turn_id: turn_id.clone(),
                    seq: rows[start].seq,
                    cause,
                });
                return Ok(rows.len());
            }
            return Err(self.not_replayable(
                start,
                format!("turn {turn_id} carries no replay tape: it was journaled by a berth from before replay recording"),
            ));
        };
        // What ended the run, fired once only its consequences are left.
        seq.exit_control = match rows.get(exit_index).map(|r| &r.rec.event) {
            Some(SessionEvent::TurnEnded { terminal, .. })
                if matches!(
                    terminal.kind,
                    TerminalKind::UserCancelled | TerminalKind::SessionClosed
                ) =>
            {
                Some(ExitControl::Stop(terminal.clone()))
            }
            Some(SessionEvent::Suspended {
                handle, initiator, ..
            }) if *initiator != Initiator::Agent && *initiator != Initiator::Policy => {
                let drained = rows[exit_index..]
                    .iter()
                    .take(6)
                    .find_map(|r| match &r.rec.event {
                        SessionEvent::DrainDecisionReceipt(d) => match &d.receipt.item {
                            DrainedItem::SuspendRequest { handle: h, mode } if h == handle => {
                                Some(*mode)
                            }
                            _ => None,
                        },
                        _ => None,
                    });
                drained
                    .or(request.as_ref().map(|r| r.mode))
                    .map(ExitControl::Suspend)
            }
            _ => None,
        };
        let (spec, deps, inputs, shared, sink) =
            self.setup(start, &turn_id, &kind, &config, tape, seq)?;
        if let RunKind::Resume(frame, _) = &kind {
            if let Err(refusal) = check_resumable(frame, &spec, &deps) {
                return Err(ReplayError::diverged(Divergence {
                    seq: rows[start].seq,
                    event_type: "resumed".into(),
                    turn_id: Some(turn_id),
                    expected: None,
                    got: None,
                    detail: format!("the replayed parked turn cannot be resumed: {refusal}"),
                }));
            }
        }
        shared.state().fire();
        let exit = match kind {
            RunKind::Fresh(_) => drive(run_turn(&spec, &deps, &sink)),
            RunKind::Resume(frame, input) => {
                drive(resume_turn(&spec, &deps, &sink, *frame, &input))
            }
        };
        // Release the run's share of the transcript before it is extended.
        drop(spec);
        let cut = |this: &mut Self, at: usize| {
            let past_the_end = rows.last().map_or(1, |r| r.seq + 1);
            this.report.cut_short = Some(CutShort {
                turn_id: turn_id.clone(),
                seq: rows.get(at).map_or(past_the_end, |r| r.seq),
                cause,
            });
            Ok(rows.len())
        };
        let exit = {
            let mut st = shared.state();
            self.report.reproduced += st.compared;
            self.report.receipts += st.receipts;
            st.compared = 0;
            st.receipts = 0;
            if let Some(d) = st.divergence.clone() {
                st.control = None;
                drop(st);
                if recovered {
                    return cut(self, index_of(&rows, d.seq));
                }
                return Err(ReplayError::diverged(d));
            }
            match exit {
                Some(exit) => exit,
                None => {
                    let d = st.stall();
                    st.control = None;
                    drop(st);
                    if recovered {
                        return cut(self, index_of(&rows, d.seq));
                    }
                    return Err(ReplayError::diverged(d));
                }
            }
        };
        if recovered {
            // The engine finished where the journal says berth stopped.
            let at = shared.state().cursor;
            shared.state().control = None;
            return cut(self, at);
        }
        let result = self.exit(&turn_id, exit_index, exit, request, &deps, &shared);
        shared.state().control = None;
        let (next, exit_text) = result?;
        let last_seq = rows[next.saturating_sub(1).max(start)].seq;
        self.report.inputs += (start..next)
            .filter(|&i| {
                let event = &rows[i].rec.event;
                is_input(event) && !matches!(event, SessionEvent::ResumptionReceipt(_))
            })
            .count() as u64;
        self.report.runs.push(RunReport {
            turn_id,
            kind: if start < rows.len()
                && matches!(rows[start].rec.event, SessionEvent::Resumed { .. })
            {
                "resumed"
            } else {
                "fresh"
            },
            first_seq: rows[start].seq,
            last_seq,
            model_calls: inputs.served_model_calls(),
            tool_calls: inputs.served_tool_calls(),
            exit: exit_text,
        });
        Ok(next)
    }

    /// The spec and stand-in dependencies of the run (checked against the
    /// recorded configuration), and its sequencer.
    #[allow(clippy::type_complexity)]
    fn setup(
        &self,
        start: usize,
        turn_id: &TurnId,
        kind: &RunKind,
        config: &berth_runtime::tape::TurnConfig,
        tape: Tape,
        seq: SeqState,
    ) -> Result<(TurnSpec, TurnDeps, Arc<Inputs>, Arc<Shared>, ReplaySink), ReplayError> {
        let inputs = Arc::new(Inputs::new(tape));
        let shared = Arc::new(Shared {
            state: Mutex::new(seq),
            env: Arc::clone(&self.env),
            inputs: Arc::clone(&inputs),
        });
        let control = Arc::new(TurnControl::with_feed(
            Arc::clone(&shared) as Arc<dyn SteeringFeed>
        ));
        shared.state().control = Some(Arc::clone(&control));
        let mut tools = ToolSet::default();
        for name in &config.tools {
            let Some(tool) = self.tools.get(name) else {
                return Err(self.not_replayable(
                    start,
                    format!("turn {turn_id} offered the tool `{name}`, which this build's tool set does not have"),
                ));
            };
            tools.insert(Arc::new(ReplayTool {
                inner: Arc::clone(tool),
                inputs: Arc::clone(&inputs),
                shared: Arc::clone(&shared),
            }) as Arc<dyn Tool>);
        }
        let judge: Option<Arc<dyn CompletionJudge>> = match config.judge.as_deref() {
            None => None,
            Some("ObjectiveJudge") => Some(Arc::new(ObjectiveJudge)),
            Some(other) => {
                return Err(self.not_replayable(
                    start,
                    format!("turn {turn_id} ran with the completion judge `{other}`, which replay does not have (only the built-in ObjectiveJudge)"),
                ))
            }
        };
        // The model's context, as the actor computes it.
        let from = usize::try_from(self.record.context_from).unwrap_or(usize::MAX);
        let history = if from == 0 {
            self.transcript.clone()
        } else {
            Transcript::from_messages(
                self.transcript
                    .messages()
                    .get(from..)
                    .unwrap_or_default()
                    .to_vec(),
            )
        };
        let prompt = match kind {
            RunKind::Fresh(prompt) => prompt.clone(),
            RunKind::Resume(frame, _) => resume::first_prompt(frame),
        };
        let spec = TurnSpec {
            session_id: self.session_id(),
            turn_id: turn_id.clone(),
            cwd: self.record.cwd.clone(),
            additional_directories: self.record.additional_directories.clone(),
            history,
            prompt,
            max_model_calls: config.max_model_calls,
        };
        let deps = TurnDeps {
            model: Arc::new(ReplayModel {
                name: config.model.clone(),
                inputs: Arc::clone(&inputs),
                shared: Arc::clone(&shared),
            }),
            tools,
            processes: Arc::new(ProcessGroups::default()),
            control,
            needs_approval: config.needs_approval.clone(),
            judge,
            budget: config.budget.clone(),
            clock: Arc::new(ReplayClock {
                inputs: Arc::clone(&inputs),
                last: Mutex::new(self.rows[start].rec.at.timestamp_millis()),
            }),
        };
        let found = config_fingerprint(&spec, &deps);
        if found != config.config_fingerprint {
            return Err(self.not_replayable(
                start,
                format!(
                    "turn {turn_id} ran with another configuration than replay re-creates (fingerprint {found}, recorded {}): its tools' specs differ from this build's",
                    config.config_fingerprint
                ),
            ));
        }
        let sink = ReplaySink {
            shared: Arc::clone(&shared),
            frame: Arc::default(),
        };
        Ok((spec, deps, inputs, shared, sink))
    }

    /// Re-derives how the session actor sealed or parked the run and
    /// compares it; updates the replay's session state. Returns the row
    /// after the exit and a description of it.
    #[allow(clippy::too_many_arguments)]
    fn exit(
        &mut self,
        turn_id: &TurnId,
        exit_index: usize,
        exit: TurnExit,
        request: Option<SuspendRequest>,
        deps: &TurnDeps,
        shared: &Arc<Shared>,
    ) -> Result<(usize, String), ReplayError> {
        let rows = Arc::clone(&self.rows);
        let now = rows[exit_index].rec.at;
        self.env.clock.set(now);
        // The ids the exit consumed: a park's handle, its receipt's id.
        self.env.ids.clear();
        let from = shared.state().cursor;
        let to = (exit_index + 8).min(rows.len()).max(from);
        // A park's span id, too, is the recorded one (see
        // `recorded_span_links`).
        let mut span_links = Vec::new();
        for row in &rows[from..to] {
            match &row.rec.event {
                SessionEvent::Suspended { handle, .. } => {
                    self.env.ids.load(handle);
                    span_links = super::recorded_span_links(&rows[from..], handle);
                }
                SessionEvent::ControlOutcome(o) if o.receipt.outcome == "suspended" => {
                    self.env.ids.load(&o.receipt.control_id)
                }
                _ => {}
            }
        }
        self.record.suspend_request = request;
        let control = &deps.control;
        let session_id = self.session_id();
        let (events, describe, ended) = match exit {
            TurnExit::Ended(outcome) => {
                let closing = matches!(
                    &rows[exit_index].rec.event,
                    SessionEvent::TurnEnded { terminal, .. } if terminal.kind == TerminalKind::SessionClosed
                ) || matches!(
                    rows.get(exit_index + 1).map(|r| &r.rec.event),
                    Some(SessionEvent::SessionClosed {})
                );
                let (events, parked) = prompt::ended_events(
                    self.env.as_ref(),
                    &mut self.record,
                    control,
                    turn_id,
                    &outcome,
                    closing,
                    now,
                    |suspension| suspension.span_links = span_links,
                );
                let kind = serde_json::to_value(outcome.terminal.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                (
                    events,
                    format!("ended: {kind}"),
                    Some((outcome.turn_messages, parked)),
                )
            }
            TurnExit::Suspended(suspended) => {
                let seam = serde_json::to_value(suspended.seam)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let (events, suspension) = suspend::parked_turn_events(
                    self.env.as_ref(),
                    &mut self.record,
                    control,
                    turn_id,
                    *suspended,
                    now,
                    |suspension| suspension.span_links = span_links,
                );
                self.suspension = Some(suspension);
                self.parked_sealed = false;
                (events, format!("suspended at {seam}"), None)
            }
        };
        let records = stamp(self.env.as_ref(), &session_id, Some(turn_id), now, events);
        {
            let mut st = shared.state();
            let compared = st.expect(&self.env, &records);
            self.report.reproduced += st.compared;
            self.report.receipts += st.receipts;
            compared.map_err(ReplayError::Nondeterminism)?;
        }
        if let Some((messages, parked)) = ended {
            self.checkpoint(turn_id.0.clone(), messages);
            if let Some(suspension) = parked {
                self.suspension = Some(suspension);
                self.parked_sealed = false;
            }
        }
        let next = shared.state().cursor;
        Ok((next, describe))
    }
}

/// The row index of event `seq`.
fn index_of(rows: &[super::sequencer::Row], seq: u64) -> usize {
    rows.iter().position(|r| r.seq == seq).unwrap_or(rows.len())
}
