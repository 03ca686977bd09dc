//! The sequencer: holds a run's recorded events and the position reached,
//! checks every event the replayed turn emits against the next recorded one
//! (byte for byte, as stored), and feeds the recorded controls to the turn's
//! control block at the point the record says they took effect.
//!
//! Controls are inputs, not outputs: `injection_accepted`, `suspend_requested`,
//! control receipts and the like are skipped when comparing. What they did is
//! replayed from what the record shows the turn did with them:
//!
//! - an injection is put in the queue at the drain whose delivery (or drop)
//!   the record shows next (see [`SteeringFeed`]);
//! - a `session/cancel_tool_call` fires when the call's cancelled update is
//!   next (or, for a call never sent, right after it was announced);
//! - the stop (`session/cancel`, `session/close`) or suspend request that
//!   ended the run fires once nothing but its consequences (abandoned or
//!   unsent calls, drops, `loop_exit` deliveries) is left before the run's
//!   exit.
//!
//! Tool calls of one parallel group emit in whatever order they settled; an
//! event that is recorded later than it is offered waits its turn.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use async_trait::async_trait;
use berth_runtime::engine::{
    PermissionDecision, PermissionRequest, SinkError, SteeringFeed, TurnControl, TurnSink,
};
use berth_runtime::event::{EventRecord, SessionEvent, ToolCallStatus};
use berth_runtime::frame::Frame;
use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::steering::{Injection, Seam, SteeringQueue};
use berth_runtime::suspension::SuspendMode;
use berth_runtime::tape::TapedRecord;
use berth_runtime::terminal::Terminal;
use serde_json::Value;

use super::inputs::{Inputs, ReplayEnv};
use super::Divergence;
use crate::session::receipt::stamp;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One stored event row, decoded.
#[derive(Debug)]
pub(super) struct Row {
    /// Its seq.
    pub seq: u64,
    /// The stored JSON (record plus tape).
    pub json: Vec<u8>,
    /// Decoded.
    pub rec: TapedRecord,
}

/// Whether `event` is a control's record (an input to the turn, never
/// produced by it or by its exit): skipped when comparing.
pub(super) fn is_input(event: &SessionEvent) -> bool {
    match event {
        SessionEvent::InjectionAccepted { .. }
        | SessionEvent::InjectionRevoked { .. }
        | SessionEvent::InjectionReplaced { .. }
        | SessionEvent::SuspendRequested { .. }
        | SessionEvent::TurnStarted { .. }
        | SessionEvent::Resumed { .. }
        | SessionEvent::ResumptionReceipt(_) => true,
        // The park's own receipt (outcome `suspended`) is the exit's.
        SessionEvent::ControlOutcome(o) => o.receipt.outcome != "suspended",
        _ => false,
    }
}

fn raw_flag(raw: &Value, key: &str) -> Option<bool> {
    raw.get(key).and_then(Value::as_bool)
}

/// Whether `event` follows from a stop or a suspension taking effect, not
/// from progress: a call never sent or abandoned, an approval cut short, a
/// message dropped, a `loop_exit` delivery, a drain receipt.
fn is_consequence(event: &SessionEvent) -> bool {
    match event {
        SessionEvent::InjectionDropped { .. } | SessionEvent::DrainDecisionReceipt(_) => true,
        SessionEvent::InjectionDelivered { seam, .. } => *seam == Seam::LoopExit,
        SessionEvent::PermissionResolved { decision, .. } => {
            *decision == PermissionDecision::Cancelled
        }
        SessionEvent::ToolCallUpdate {
            status: ToolCallStatus::Failed,
            raw_output: Some(raw),
            ..
        } => {
            let cancelled = raw_flag(raw, "cancelled") == Some(true);
            let interrupted = raw_flag(raw, "interrupted") == Some(true);
            let reason = raw.get("reason").is_some();
            match raw_flag(raw, "dispatched") {
                // Never sent, or its approval was cut short.
                Some(false) => {
                    (reason && !cancelled && !interrupted)
                        || raw.pointer("/permission/outcome") == Some(&Value::from("cancelled"))
                }
                // Abandoned while it ran.
                Some(true) => reason && !cancelled,
                None => false,
            }
        }
        _ => false,
    }
}

/// A cancelled-call update: `Some(dispatched)`.
fn call_cancel(event: &SessionEvent) -> Option<(&str, bool)> {
    match event {
        SessionEvent::ToolCallUpdate {
            tool_call_id,
            raw_output: Some(raw),
            ..
        } if raw_flag(raw, "cancelled") == Some(true) => Some((
            tool_call_id.as_str(),
            raw_flag(raw, "dispatched").unwrap_or(false),
        )),
        _ => None,
    }
}

/// The control that ended the run, fired once only its consequences remain.
#[derive(Debug, Clone)]
pub(super) enum ExitControl {
    /// `session/cancel` or `session/close`: stop with this terminal.
    Stop(Terminal),
    /// A suspend request in this mode (the mode in force when drained).
    Suspend(SuspendMode),
}

/// What a replayed run shares between its sink, feed, model and tools.
#[derive(Debug)]
pub(super) struct Shared {
    pub state: Mutex<SeqState>,
    pub env: Arc<ReplayEnv>,
    pub inputs: Arc<Inputs>,
}

/// The sequencer's state.
#[derive(Debug)]
pub(super) struct SeqState {
    pub rows: Arc<Vec<Row>>,
    /// The next row to consider.
    pub cursor: usize,
    /// The run's exit event (`turn_ended` / `suspended` of its turn).
    pub exit_index: usize,
    pub session_id: SessionId,
    pub turn_id: TurnId,
    pub divergence: Option<Divergence>,
    waiters: Vec<Waker>,
    /// What the turn waits for (diagnostics for a stall).
    waiting: Vec<String>,
    /// Events offered before their recorded turn.
    gated: Vec<Value>,
    pub control: Option<Arc<TurnControl>>,
    pub exit_control: Option<ExitControl>,
    fired: bool,
    /// Calls a `session/cancel_tool_call` cancelled.
    pub cancelled_calls: HashSet<String>,
    fired_cancels: HashSet<String>,
    /// Accepted injections by message id (their latest content).
    pub injections: HashMap<String, Injection>,
    pushed: HashSet<String>,
    /// Events and receipts produced and found identical.
    pub compared: u64,
    pub receipts: u64,
    /// The last row matched.
    last_matched: Option<usize>,
    /// The last row before the exit that is progress (not an input, not a
    /// consequence of the exit's control), computed once.
    last_progress: Option<Option<usize>>,
}

impl SeqState {
    pub(super) fn new(
        rows: Arc<Vec<Row>>,
        cursor: usize,
        exit_index: usize,
        session_id: SessionId,
        turn_id: TurnId,
    ) -> Self {
        Self {
            rows,
            cursor,
            exit_index,
            session_id,
            turn_id,
            divergence: None,
            waiters: Vec::new(),
            waiting: Vec::new(),
            gated: Vec::new(),
            control: None,
            exit_control: None,
            fired: false,
            cancelled_calls: HashSet::new(),
            fired_cancels: HashSet::new(),
            injections: HashMap::new(),
            pushed: HashSet::new(),
            compared: 0,
            receipts: 0,
            last_matched: None,
            last_progress: None,
        }
    }

    /// The index of the first row at or after `from` that is not a control's
    /// record.
    pub(super) fn next_output(&self, from: usize) -> Option<usize> {
        (from..self.rows.len()).find(|&i| !is_input(&self.rows[i].rec.event))
    }

    fn divergence_at(
        &self,
        index: Option<usize>,
        got: Option<&SessionEvent>,
        detail: String,
    ) -> Divergence {
        let (seq, expected) = match index.and_then(|i| self.rows.get(i)) {
            Some(row) => (row.seq, Some(&row.rec.event)),
            None => (self.rows.last().map_or(1, |r| r.seq + 1), None),
        };
        Divergence {
            seq,
            turn_id: Some(self.turn_id.clone()),
            event_type: expected
                .map(|e| e.type_name().to_owned())
                .unwrap_or_else(|| "end_of_log".into()),
            expected: expected.and_then(|e| serde_json::to_value(e).ok()),
            got: got.and_then(|e| serde_json::to_value(e).ok()),
            detail,
        }
    }

    /// Records the first divergence (later ones are consequences of it).
    pub(super) fn diverge(&mut self, d: Divergence) {
        if self.divergence.is_none() {
            self.divergence = Some(d);
        }
        self.wake();
    }

    fn wake(&mut self) {
        for waker in self.waiters.drain(..) {
            waker.wake();
        }
    }

    /// Compares `produced` with row `index`: re-signs a receipt with the key
    /// the recorded one names, then checks the bytes against the stored
    /// row (which may carry a tape after the event).
    fn matches(
        &mut self,
        env: &ReplayEnv,
        index: usize,
        produced: &EventRecord,
    ) -> Result<bool, String> {
        let rows = Arc::clone(&self.rows);
        let row = &rows[index];
        let produced = resign(env, produced, &row.rec.event)?;
        let bytes = serde_json::to_vec(&produced).map_err(|e| e.to_string())?;
        let stored = &row.json;
        let same = stored == &bytes
            || (bytes.len() > 1
                && stored.len() > bytes.len()
                && stored[..bytes.len() - 1] == bytes[..bytes.len() - 1]
                && stored[bytes.len() - 1..].starts_with(b",\"tape\":"));
        if !same && std::env::var("BERTH_REPLAY_DEBUG").is_ok() {
            eprintln!(
                "stored:   {}\nproduced: {}",
                String::from_utf8_lossy(stored),
                String::from_utf8_lossy(&bytes)
            );
        }
        if same && is_receipt(&produced.event) {
            self.receipts += 1;
        }
        Ok(same)
    }

    /// Compares `records` with the next recorded outputs, in order.
    pub(super) fn expect(
        &mut self,
        env: &ReplayEnv,
        records: &[EventRecord],
    ) -> Result<(), Box<Divergence>> {
        for record in records {
            let Some(index) = self.next_output(self.cursor) else {
                let d = self.divergence_at(
                    None,
                    Some(&record.event),
                    "the replay produces an event after the last recorded one".into(),
                );
                self.diverge(d.clone());
                return Err(Box::new(d));
            };
            match self.matches(env, index, record) {
                Ok(true) => {
                    self.cursor = index + 1;
                    self.compared += 1;
                    self.last_matched = Some(index);
                }
                Ok(false) => {
                    let d = self.divergence_at(
                        Some(index),
                        Some(&record.event),
                        "the replayed event differs from the recorded one".into(),
                    );
                    self.diverge(d.clone());
                    return Err(Box::new(d));
                }
                Err(message) => {
                    let d = self.divergence_at(Some(index), Some(&record.event), message);
                    self.diverge(d.clone());
                    return Err(Box::new(d));
                }
            }
        }
        Ok(())
    }

    /// Compares `record` with row `index` exactly (a receipt the replay
    /// re-derives although the turn takes it as an input).
    pub(super) fn expect_at(
        &mut self,
        env: &ReplayEnv,
        index: usize,
        record: &EventRecord,
    ) -> Result<(), Box<Divergence>> {
        match self.matches(env, index, record) {
            Ok(true) => {
                self.compared += 1;
                Ok(())
            }
            Ok(false) => Err(Box::new(self.divergence_at(
                Some(index),
                Some(&record.event),
                "the replayed event differs from the recorded one".into(),
            ))),
            Err(message) => Err(Box::new(self.divergence_at(
                Some(index),
                Some(&record.event),
                message,
            ))),
        }
    }

    /// Whether `event` is recorded later in the run than `index` (an event
    /// of a parallel group offered before its turn).
    fn recorded_later(&self, index: usize, event: &SessionEvent) -> bool {
        let Ok(bytes) = serde_json::to_value(event) else {
            return false;
        };
        let end = (self.exit_index + 1).min(self.rows.len());
        ((index + 1)..end).any(|i| {
            !is_input(&self.rows[i].rec.event)
                && serde_json::to_value(&self.rows[i].rec.event).ok().as_ref() == Some(&bytes)
        })
    }

    /// Fires the recorded controls that are due now (see the module docs).
    pub(super) fn fire(&mut self) {
        let Some(control) = self.control.clone() else {
            return;
        };
        let rows = Arc::clone(&self.rows);
        // A call cancelled before it was sent: right after its announcement.
        if let Some(last) = self.last_matched {
            if let SessionEvent::ToolCall { tool_call_id, .. } = &rows[last].rec.event {
                let id = tool_call_id.as_str();
                if self.cancelled_calls.contains(id) && !self.fired_cancels.contains(id) {
                    let first_update =
                        ((last + 1)..rows.len()).find_map(|i| match &rows[i].rec.event {
                            SessionEvent::ToolCallUpdate { tool_call_id, .. }
                                if tool_call_id.as_str() == id =>
                            {
                                Some(call_cancel(&rows[i].rec.event))
                            }
                            _ => None,
                        });
                    if let Some(Some((_, false))) = first_update {
                        self.fired_cancels.insert(id.to_owned());
                        control.cancel_call(id);
                    }
                }
            }
        }
        let next = self.next_output(self.cursor);
        if let Some(next) = next {
            let event = &rows[next].rec.event;
            let cancel = call_cancel(event)
                .map(|(id, _)| id.to_owned())
                .or_else(|| match event {
                    SessionEvent::PermissionResolved {
                        tool_call_id,
                        decision: PermissionDecision::Cancelled,
                    } if self.cancelled_calls.contains(tool_call_id.as_str()) => {
                        Some(tool_call_id.0.clone())
                    }
                    _ => None,
                });
            if let Some(id) = cancel {
                if self.fired_cancels.insert(id.clone()) {
                    control.cancel_call(&id);
                }
                return;
            }
        }
        if self.fired {
            return;
        }
        let Some(exit) = self.exit_control.clone() else {
            return;
        };
        let end = self.exit_index.min(rows.len());
        let last_progress = *self.last_progress.get_or_insert_with(|| {
            (0..end).rev().find(|&i| {
                let event = &rows[i].rec.event;
                !is_input(event) && !is_consequence(event)
            })
        });
        let only_consequences = last_progress.is_none_or(|last| self.cursor > last);
        if only_consequences {
            self.fired = true;
            match exit {
                ExitControl::Stop(terminal) => {
                    control.stop(terminal);
                }
                ExitControl::Suspend(mode) => {
                    control.request_suspend(mode);
                }
            }
        }
    }

    /// What the stalled turn waits for.
    pub(super) fn stall(&mut self) -> Divergence {
        let index = self.next_output(self.cursor);
        let mut why: Vec<String> = std::mem::take(&mut self.waiting);
        if why.is_empty() {
            why.push("the turn stopped making progress".into());
        }
        let got = self.gated.first().cloned();
        let mut d = self.divergence_at(
            index,
            None,
            format!(
                "the replayed turn cannot produce this event: it waits for {}",
                why.join("; ")
            ),
        );
        d.got = got;
        d
    }
}

fn is_receipt(event: &SessionEvent) -> bool {
    matches!(
        event,
        SessionEvent::ControlOutcome(_)
            | SessionEvent::SuspensionReceipt(_)
            | SessionEvent::ResumptionReceipt(_)
            | SessionEvent::DrainDecisionReceipt(_)
    )
}

/// `produced` with its receipt (if it is one) signed by the key `recorded`
/// names.
fn resign(
    env: &ReplayEnv,
    produced: &EventRecord,
    recorded: &SessionEvent,
) -> Result<EventRecord, String> {
    let k = &env.keyring;
    let bad = |e: berth_storage::SignatureError| format!("cannot re-sign the receipt: {e}");
    let event = match (&produced.event, recorded) {
        (SessionEvent::ControlOutcome(p), SessionEvent::ControlOutcome(r)) => {
            SessionEvent::ControlOutcome(
                k.sign_as(&r.signature.key_id, p.receipt.clone())
                    .map_err(bad)?,
            )
        }
        (SessionEvent::SuspensionReceipt(p), SessionEvent::SuspensionReceipt(r)) => {
            SessionEvent::SuspensionReceipt(
                k.sign_as(&r.signature.key_id, p.receipt.clone())
                    .map_err(bad)?,
            )
        }
        (SessionEvent::ResumptionReceipt(p), SessionEvent::ResumptionReceipt(r)) => {
            SessionEvent::ResumptionReceipt(
                k.sign_as(&r.signature.key_id, p.receipt.clone())
                    .map_err(bad)?,
            )
        }
        (SessionEvent::DrainDecisionReceipt(p), SessionEvent::DrainDecisionReceipt(r)) => {
            SessionEvent::DrainDecisionReceipt(
                k.sign_as(&r.signature.key_id, p.receipt.clone())
                    .map_err(bad)?,
            )
        }
        (event, _) => event.clone(),
    };
    Ok(EventRecord::new(produced.at, event))
}

impl Shared {
    pub(super) fn state(&self) -> MutexGuard<'_, SeqState> {
        lock(&self.state)
    }

    /// Notes what the turn waits for (shown if it stalls).
    pub(super) fn waiting(&self, what: String) {
        self.state().waiting.push(what);
    }

    /// A divergence in what the turn asked for (not an event).
    pub(super) fn diverge_input(&self, kind: &str, detail: String, expected: Value, got: Value) {
        let mut st = self.state();
        let index = st.next_output(st.cursor);
        let mut d = st.divergence_at(index, None, detail);
        d.event_type = kind.to_owned();
        d.expected = Some(expected);
        d.got = Some(got);
        st.diverge(d);
    }

    /// One emit of the replayed turn (see the module docs).
    fn offer(&self, event: &SessionEvent, cx: &mut Context<'_>) -> Poll<Result<(), SinkError>> {
        let diverged = || Poll::Ready(Err(SinkError("the replay diverged".into())));
        let mut st = self.state();
        if st.divergence.is_some() {
            return diverged();
        }
        let Some(index) = st.next_output(st.cursor) else {
            let d = st.divergence_at(
                None,
                Some(event),
                "the replayed turn emits an event after the last recorded one".into(),
            );
            st.diverge(d);
            return diverged();
        };
        let at = st.rows[index].rec.at;
        let records = stamp(
            self.env.as_ref(),
            &st.session_id,
            Some(&st.turn_id),
            at,
            vec![event.clone()],
        );
        match st.matches(&self.env, index, &records[0]) {
            Ok(true) => {}
            Ok(false) if st.recorded_later(index, event) => {
                st.waiters.push(cx.waker().clone());
                if let Ok(v) = serde_json::to_value(event) {
                    st.gated.push(v);
                }
                return Poll::Pending;
            }
            Ok(false) => {
                let d = st.divergence_at(
                    Some(index),
                    Some(event),
                    "the replayed turn emits another event than the recorded one".into(),
                );
                st.diverge(d);
                return diverged();
            }
            Err(message) => {
                let d = st.divergence_at(Some(index), Some(event), message);
                st.diverge(d);
                return diverged();
            }
        }
        st.cursor = index + 1;
        st.compared += 1;
        st.last_matched = Some(index);
        if st.expect(&self.env, &records[1..]).is_err() {
            return diverged();
        }
        st.gated.clear();
        st.waiting.clear();
        st.wake();
        st.fire();
        Poll::Ready(Ok(()))
    }
}

impl SteeringFeed for Shared {
    fn before_drain(&self, queue: &mut SteeringQueue, seam: Option<Seam>) {
        let mut st = self.state();
        let mut due: Vec<Injection> = Vec::new();
        let mut i = st.cursor;
        while let Some(index) = st.next_output(i) {
            let event = &st.rows[index].rec.event;
            match (event, seam) {
                (
                    SessionEvent::InjectionDelivered {
                        injection,
                        seam: at,
                    },
                    Some(seam),
                ) if *at == seam => due.push(injection.clone()),
                (SessionEvent::InjectionDropped { message_id, .. }, None) => {
                    if let Some(injection) = st.injections.get(message_id) {
                        due.push(injection.clone());
                    }
                }
                (SessionEvent::DrainDecisionReceipt(_), _) => {}
                (SessionEvent::Directive { .. }, Some(_)) => {}
                // A skipped batch's updates come before the interrupts
                // delivered in its place.
                (
                    SessionEvent::ToolCallUpdate {
                        raw_output: Some(raw),
                        ..
                    },
                    Some(Seam::PreToolDispatch),
                ) if raw_flag(raw, "interrupted") == Some(true) => {}
                _ => break,
            }
            i = index + 1;
        }
        for injection in due {
            if st.pushed.insert(injection.message_id.clone()) {
                queue.push(injection);
            }
        }
    }
}

/// The replayed turn's sink: every event goes through the sequencer.
#[derive(Debug, Clone)]
pub(super) struct ReplaySink {
    pub shared: Arc<Shared>,
    /// The latest frame the turn checkpointed.
    pub frame: Arc<Mutex<Option<Frame>>>,
}

#[async_trait]
impl TurnSink for ReplaySink {
    async fn emit(&self, event: SessionEvent) -> Result<(), SinkError> {
        std::future::poll_fn(|cx| self.shared.offer(&event, cx)).await
    }

    async fn request_permission(
        &self,
        request: &PermissionRequest,
    ) -> Result<PermissionDecision, SinkError> {
        match self.shared.inputs.permission(request.tool_call_id.as_str()) {
            Some(decision) => Ok(decision),
            None => {
                self.shared.waiting(format!(
                    "an answer to the approval of {}, which has none recorded",
                    request.tool_call_id
                ));
                std::future::pending().await
            }
        }
    }

    async fn checkpoint(&self, frame: &Frame) -> Result<(), SinkError> {
        *lock(&self.frame) = Some(frame.clone());
        Ok(())
    }
}
