//! The turn's sink: journal first, then watchers.

use std::sync::Arc;

use async_trait::async_trait;
use berth_runtime::engine::{PermissionDecision, PermissionRequest, SinkError, TurnSink};
use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::frame::Frame;
use berth_runtime::ids::EventId;
use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::tape::Tape;
use berth_runtime::tape::TapeRecorder;
use berth_storage::{Batch, Journal, StorageError};
use tokio::sync::Mutex;

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
    /// What the turn holds for its next write (shared with the actor).
    held: Held,
}

/// What a running turn has decided but not yet written, shared by the
/// turn's sink and the session actor: records stamped for the turn's next
/// write ([`TurnSink::emit_with_next_write`]) and, for a turn whose start was
/// held ([`Held::starting`]), its start. Whichever of them writes for the
/// session next carries what is held, first, through [`Held::write`], which
/// queues its batch before letting go of what is held: the session's writes
/// are journaled in the order they were decided (a steer accepted after an
/// answer completed is recorded after it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Held(Arc<Mutex<Pending>>);

/// See [`Held`].
#[derive(Debug, Default)]
struct Pending {
    /// A held start: its writes (its records already appended) and its
    /// records, in order.
    start: Option<(Batch, Vec<EventRecord>)>,
    /// Records stamped for the next write, oldest first.
    records: Vec<EventRecord>,
}

impl Held {
    /// What a turn whose start is not written yet holds: `batch` (the
    /// start's writes, which open the turn, with `records` appended) is
    /// written first by the turn's first write. For a start nothing waits
    /// on: a wake-up's resume, whose claim is already durable. A turn whose
    /// model answers at once then journals its start, answer and seal in one
    /// commit; one whose model must be waited for writes its start while it
    /// waits, and every turn writes it before a tool runs (the engine's
    /// [`TurnSink::flush`] calls).
    pub fn starting(batch: Batch, records: Vec<EventRecord>) -> Self {
        Self(Arc::new(Mutex::new(Pending {
            start: Some((batch, records)),
            records: Vec::new(),
        })))
    }

    async fn hold(&self, records: Vec<EventRecord>) {
        self.0.lock().await.records.extend(records);
    }

    async fn is_empty(&self) -> bool {
        let pending = self.0.lock().await;
        pending.start.is_none() && pending.records.is_empty()
    }

    /// Commits what is held, then `batch` with `records` appended, as one
    /// batch: the held start's writes first (a fence on the turn it opens is
    /// then satisfied by the batch itself, see [`Batch::merge`]), then the
    /// held records and `records`, with `tape` on the first of them. The
    /// batch is queued before anything else can take what is held. Returns
    /// the ids and the records written (the start's, the held ones, then
    /// `records`), to publish once durable.
    ///
    /// # Errors
    /// The journal's error; nothing was written, and what was held is held
    /// again, before anything held since.
    pub async fn write(
        &self,
        journal: &Journal,
        session_id: &SessionId,
        batch: Batch,
        records: Vec<EventRecord>,
        tape: impl FnOnce() -> Tape,
    ) -> Result<(Vec<EventId>, Vec<EventRecord>), StorageError> {
        let mut pending = self.0.lock().await;
        let (start_batch, start_records) = pending.start.take().unzip();
        let mut written = start_records.unwrap_or_default();
        let start_len = written.len();
        let held_len = pending.records.len();
        let mut appended = std::mem::take(&mut pending.records);
        appended.extend(records);
        // A copy: the start is held again if this write fails.
        let base = start_batch.clone().unwrap_or_default();
        let tape = if appended.is_empty() {
            Tape::default()
        } else {
            tape()
        };
        let batch = append_records(base.merge(batch), session_id, &appended, &tape);
        let outcome = match journal.submit(batch).await {
            Ok(queued) => {
                drop(pending);
                queued.durable().await
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(ids) => {
                written.extend(appended);
                Ok((ids, written))
            }
            Err(e) => {
                let mut pending = self.0.lock().await;
                if let Some(batch) = start_batch {
                    written.truncate(start_len);
                    pending.start = Some((batch, written));
                }
                appended.truncate(held_len);
                let later = std::mem::replace(&mut pending.records, appended);
                pending.records.extend(later);
                Err(e)
            }
        }
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

    /// Journals what is held, then `events` (each stamped at its own clock
    /// reading; a delivery or drop goes with its signed drain receipt; the
    /// tape rides on the first record) and `frame` in one fenced batch, then
    /// publishes the records to the watchers once durable.
    async fn journal_then_publish(
        &self,
        events: Vec<SessionEvent>,
        frame: Option<&Frame>,
    ) -> Result<(), SinkError> {
        let mut records = Vec::new();
        for event in events {
            records.extend(self.stamped(event));
        }
        let mut batch = Batch::new().fenced_by_turn(&self.session_id, &self.turn_id);
        if let Some(frame) = frame {
            batch = batch.put_frame(frame);
        }
        let (ids, records) = self
            .held
            .write(&self.env.journal, &self.session_id, batch, records, || {
                self.tape.take()
            })
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
        self.held.hold(self.stamped(event)).await;
        Ok(())
    }

    async fn flush(&self) -> Result<(), SinkError> {
        if self.held.is_empty().await {
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
        self.journal_then_publish(Vec::new(), Some(frame)).await
    }
}
