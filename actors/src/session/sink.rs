//! The turn's sink: journal first, then watchers.

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use berth_runtime::engine::{PermissionDecision, PermissionRequest, SinkError, TurnSink};
use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::frame::Frame;
use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::tape::TapeRecorder;
use berth_storage::Batch;

use super::receipt::{append_records, stamp};
use super::SessionEnv;
use crate::watch::Watchers;

/// Journals each event of a running turn, then publishes it to the session's
/// watchers. Nothing reaches a watcher before it is durable. Whatever the
/// run's replay tape holds rides on the first record of each batch, and a
/// client's answer to a permission request goes on the tape. Events held for
/// the next write ([`TurnSink::emit_with_next_write`]) go first in it; what
/// is still held when the run leaves the engine goes first in its seal or
/// park, which the actor writes ([`RunningTurn::held`](super::RunningTurn)).
pub(crate) struct JournalSink {
    pub env: Arc<SessionEnv>,
    pub session_id: SessionId,
    /// Every write is fenced by this turn: once it is sealed, nothing lands.
    pub turn_id: TurnId,
    pub watchers: Arc<Watchers>,
    /// The run's replay tape.
    pub tape: TapeRecorder,
    /// Records stamped but not yet written (shared with the actor).
    held: Held,
}

/// Records a running turn has stamped but not yet written (see
/// [`TurnSink::emit_with_next_write`]), oldest first. Shared by the turn's
/// sink and the session actor: whichever writes for the session next takes
/// them and writes them first, so nothing the session journals meanwhile (a
/// steer accepted, a suspend requested) is recorded before them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Held(Arc<Mutex<Vec<EventRecord>>>);

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<EventRecord>> {
        // A poisoned lock only means a panic elsewhere; the records are intact.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the held records, leaving none.
    pub fn take(&self) -> Vec<EventRecord> {
        std::mem::take(&mut *self.lock())
    }

    /// The held records, then `records`; holds none after.
    pub fn take_before(&self, records: Vec<EventRecord>) -> Vec<EventRecord> {
        let mut all = self.take();
        all.extend(records);
        all
    }

    /// Puts `records`, taken by a write that then failed, back before
    /// whatever was held since, so the next write still records them first.
    pub fn put_back(&self, records: Vec<EventRecord>) {
        let mut held = self.lock();
        let later = std::mem::replace(&mut *held, records);
        held.extend(later);
    }

    fn hold(&self, records: Vec<EventRecord>) {
        self.lock().extend(records);
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

impl JournalSink {
    /// A sink for `turn_id`'s writes; `held` is shared with the actor.
    pub fn new(
        env: Arc<SessionEnv>,
        session_id: SessionId,
        turn_id: TurnId,
        watchers: Arc<Watchers>,
        tape: TapeRecorder,
        held: Held,
    ) -> Self {
        Self {
            env,
            session_id,
            turn_id,
            watchers,
            tape,
            held,
        }
    }

    /// `event` as records stamped at this moment's clock reading.
    fn stamped(&self, event: SessionEvent) -> Vec<EventRecord> {
        stamp(
            &self.env,
            &self.session_id,
            Some(&self.turn_id),
            self.env.config.clock.now(),
            vec![event],
        )
    }

    /// Journals the held records, then `events` (each stamped at its own
    /// clock reading; a delivery or drop goes with its signed drain receipt;
    /// the tape rides on the first record) and `frame` in one fenced batch,
    /// then publishes the records to the watchers once durable.
    async fn journal_then_publish(
        &self,
        events: Vec<SessionEvent>,
        frame: Option<&Frame>,
    ) -> Result<(), SinkError> {
        let mut records = self.held.take();
        for event in events {
            records.extend(self.stamped(event));
        }
        let tape = self.tape.take();
        let mut batch = append_records(
            Batch::new().fenced_by_turn(&self.session_id, &self.turn_id),
            &self.session_id,
            &records,
            &tape,
        );
        if let Some(frame) = frame {
            batch = batch.put_frame(frame);
        }
        let ids = self
            .env
            .journal
            .commit(batch)
            .await
            .map_err(|e| SinkError(e.to_string()))?;
        self.watchers.publish(
            &self.session_id,
            ids.into_iter().zip(records.into_iter().map(Arc::new)),
        );
        Ok(())
    }
}

#[async_trait]
impl TurnSink for JournalSink {
    async fn emit(&self, event: SessionEvent) -> Result<(), SinkError> {
        self.journal_then_publish(vec![event], None).await
    }

    async fn emit_with_next_write(&self, event: SessionEvent) -> Result<(), SinkError> {
        self.held.hold(self.stamped(event));
        Ok(())
    }

    async fn flush(&self) -> Result<(), SinkError> {
        if self.held.is_empty() {
            return Ok(());
        }
        self.journal_then_publish(Vec::new(), None).await
    }

    async fn request_permission(
        &self,
        request: &PermissionRequest,
    ) -> Result<PermissionDecision, SinkError> {
        // The client is asked only about what it can already have seen.
        self.flush().await?;
        let Some(answer) = self.watchers.ask(&self.session_id, request) else {
            let decision = PermissionDecision::Rejected {
                reason: "no attached client can answer permission requests".into(),
            };
            self.tape.permission(&request.tool_call_id, &decision);
            return Ok(decision);
        };
        let decision = answer.await.unwrap_or(PermissionDecision::Rejected {
            reason: "the client went away before answering".into(),
        });
        self.tape.permission(&request.tool_call_id, &decision);
        Ok(decision)
    }

    /// One fenced batch: the events and the frame; published once durable.
    fn joins_in_progress(&self) -> bool {
        true
    }

    async fn emit_with_checkpoint(
        &self,
        events: Vec<SessionEvent>,
        frame: &Frame,
    ) -> Result<(), SinkError> {
        self.journal_then_publish(events, Some(frame)).await
    }

    async fn checkpoint(&self, frame: &Frame) -> Result<(), SinkError> {
        if !self.held.is_empty() {
            return self.journal_then_publish(Vec::new(), Some(frame)).await;
        }
        self.env
            .journal
            .commit(
                Batch::new()
                    .fenced_by_turn(&self.session_id, &self.turn_id)
                    .put_frame(frame),
            )
            .await
            .map(drop)
            .map_err(|e| SinkError(e.to_string()))
    }
}
