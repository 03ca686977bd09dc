//! A batch: writes that commit together, atomically.

use std::borrow::Cow;

use berth_runtime::event::EventRecord;
use berth_runtime::frame::Frame;
use berth_runtime::history::Message;
use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::suspension::{ExternalEvent, ResumeClaim, Schedule, Suspension, Wakeup};
use berth_runtime::tape::{Tape, TapedRecordRef};
use serde::Serialize;

use crate::records::{OpenTurn, SessionRecord, TurnCheckpoint};

/// One write, encoded in the caller, off the writer thread: when it is
/// added to its batch, or (a session record) when the batch is queued.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    PutSession {
        id: String,
        value: SessionRow,
    },
    AppendEvent {
        id: String,
        value: Vec<u8>,
    },
    PutFrame {
        id: String,
        value: Vec<u8>,
    },
    DeleteFrame {
        id: String,
    },
    PutTranscriptMessage {
        id: String,
        index: u64,
        value: Vec<u8>,
    },
    OpenTurn {
        id: String,
        /// The turn opened (what a fence names).
        turn: String,
        value: Vec<u8>,
    },
    CloseTurn {
        id: String,
    },
    PutCheckpoint {
        id: String,
        seq: u64,
        value: Vec<u8>,
    },
    DeleteCheckpointsFrom {
        id: String,
        seq: u64,
    },
    TruncateTranscript {
        id: String,
        from: u64,
    },
    PutWakeup {
        id: String,
        value: Vec<u8>,
    },
    AppendExternalEvent {
        value: Vec<u8>,
    },
    PutSchedule {
        id: String,
        value: Vec<u8>,
    },
    DeleteSchedule {
        id: String,
    },
    PutMeta {
        key: String,
        value: u64,
    },
    PutSuspension {
        id: String,
        value: Vec<u8>,
    },
    DeleteSuspension {
        id: String,
    },
}

/// A session record to store, kept as given until its batch is queued
/// ([`Batch::encode`]): a put that a later one in the same batch supersedes
/// ([`Batch::merge`]) is dropped without ever being encoded.
#[derive(Debug, Clone)]
pub(crate) enum SessionRow {
    Record(Box<SessionRecord>),
    Encoded(Vec<u8>),
}

impl SessionRow {
    /// The row's bytes (encoded now if it was not yet).
    pub(crate) fn bytes(&self) -> Cow<'_, [u8]> {
        match self {
            SessionRow::Record(record) => Cow::Owned(json(record)),
            SessionRow::Encoded(value) => Cow::Borrowed(value),
        }
    }
}

/// A one-time claim a batch takes on a suspension handle (see [`Batch::claim`]).
#[derive(Debug, Clone)]
pub(crate) struct PendingClaim {
    pub handle: String,
    pub value: Vec<u8>,
}

/// Writes that become durable together or not at all. Build one, then hand it
/// to [`Journal::commit`](crate::Journal::commit).
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub(crate) ops: Vec<Op>,
    /// `(session id, turn id)`: commit only while that turn is the session's
    /// open turn (see [`Batch::fenced_by_turn`]).
    pub(crate) fence: Option<(String, String)>,
    /// The handle this batch claims (see [`Batch::claim`]).
    pub(crate) claim: Option<PendingClaim>,
    /// `(session id, handle)`: commit only while that is the session's
    /// suspension (see [`Batch::completing_suspension`]).
    pub(crate) suspension: Option<(String, String)>,
}

impl Op {
    /// Whether this op, applied after `earlier` in one transaction, leaves
    /// nothing of `earlier`'s effect: both write the same row, and this one
    /// overwrites or removes it. Only whole-row puts are ever superseded.
    fn supersedes(&self, earlier: &Op) -> bool {
        match (self, earlier) {
            (Op::PutSession { id, .. }, Op::PutSession { id: before, .. })
            | (Op::OpenTurn { id, .. } | Op::CloseTurn { id }, Op::OpenTurn { id: before, .. })
            | (Op::PutFrame { id, .. } | Op::DeleteFrame { id }, Op::PutFrame { id: before, .. }) => {
                id == before
            }
            _ => false,
        }
    }
}

/// Initial capacity (bytes) of an encoded row: most rows (events, session
/// records, suspensions) are a few hundred bytes, so serde_json's 128-byte
/// start would regrow the buffer two or three times on the way there.
const ROW_CAPACITY: usize = 512;

fn json<T: Serialize>(value: &T) -> Vec<u8> {
    let mut row = Vec::with_capacity(ROW_CAPACITY);
    // Our record types serialize infallibly (no maps with non-string keys).
    match serde_json::to_writer(&mut row, value) {
        Ok(()) => row,
        Err(_) => Vec::new(),
    }
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `other`'s writes after this batch's; `other`'s fence or claim,
    /// when set, replaces this one's. A fence on a turn that this batch
    /// itself opens ([`Batch::open_turn`]) is dropped: the merged batch opens
    /// that turn, so the turn is the session's open turn when its writes
    /// apply (a running turn's first write carrying its held start). A
    /// write of this batch that `other` overwrites or removes (a session
    /// record stored again, a turn opened then closed, a frame stored then
    /// deleted) is dropped: the transaction ends the same without it.
    pub fn merge(mut self, other: Batch) -> Self {
        let opened_here = |fence: &(String, String)| {
            self.ops.iter().any(|op| {
                matches!(op, Op::OpenTurn { id, turn, .. } if *id == fence.0 && *turn == fence.1)
            })
        };
        if let Some(fence) = other.fence.filter(|f| !opened_here(f)) {
            self.fence = Some(fence);
        }
        self.ops
            .retain(|op| !other.ops.iter().any(|later| later.supersedes(op)));
        self.ops.extend(other.ops);
        if other.claim.is_some() {
            self.claim = other.claim;
        }
        if other.suspension.is_some() {
            self.suspension = other.suspension;
        }
        self
    }

    /// Encodes the session records it kept as given; the journal calls this
    /// as it queues the batch, so the writer thread gets bytes.
    pub(crate) fn encode(&mut self) {
        for op in &mut self.ops {
            if let Op::PutSession { value, .. } = op {
                if let SessionRow::Record(record) = value {
                    *value = SessionRow::Encoded(json(record));
                }
            }
        }
    }

    /// Whether the batch has no writes (no ops and no claim). Committing an
    /// empty batch is a no-op that returns `Ok` without touching the journal,
    /// even when it carries a fence.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.claim.is_none()
    }

    /// Makes the batch conditional: it commits only if `turn` is still the
    /// session's open turn; otherwise the whole batch is refused with
    /// [`StorageError::Fenced`](crate::StorageError::Fenced). A running turn
    /// writes through this fence, so once a turn is sealed (after a crash or an
    /// actor restart) nothing a stale task of it still sends can land.
    pub fn fenced_by_turn(mut self, session: &SessionId, turn: &TurnId) -> Self {
        self.fence = Some((session.0.clone(), turn.0.clone()));
        self
    }

    /// Makes the batch claim the suspension handle `claim.handle`, once and
    /// for all. At commit, inside the writer's transaction: if a claim on that
    /// handle is already stored, the whole batch is refused with
    /// [`StorageError::AlreadyClaimed`](crate::StorageError::AlreadyClaimed)
    /// (carrying the stored claim) and nothing of it is written; otherwise the
    /// claim row is inserted and the batch's writes applied, atomically.
    ///
    /// Exactly one of any number of batches claiming the same handle commits,
    /// including batches folded into the same group commit (later ones in the
    /// group see the earlier insert). Claims are never overwritten or deleted.
    ///
    /// A batch holds one claim; calling this again replaces it. It combines
    /// with [`Batch::fenced_by_turn`]: the fence is checked first, then the
    /// claim, and the batch writes only if both hold.
    pub fn claim(mut self, claim: &ResumeClaim) -> Self {
        self.claim = Some(PendingClaim {
            handle: claim.handle.clone(),
            value: json(claim),
        });
        self
    }

    /// Makes the batch conditional on the session's suspension: it commits
    /// only while `handle` is the session's stored suspension; otherwise the
    /// whole batch is refused with
    /// [`StorageError::SuspensionGone`](crate::StorageError::SuspensionGone).
    /// The completion of a resume whose claim is already durable carries it
    /// (with [`Batch::delete_suspension`]), so that of two completions of one
    /// claimed suspension (a stale task of a failed actor and its restarted
    /// successor) exactly one lands. Checked after the fence and the claim.
    pub fn completing_suspension(mut self, session: &SessionId, handle: &str) -> Self {
        self.suspension = Some((session.0.clone(), handle.to_owned()));
        self
    }

    /// Stores the session's suspension, replacing any earlier one (a session
    /// has at most one; table `suspensions`, keyed by `suspension.session_id`),
    /// and its [`Wakeup`] (table `wakeups`) when its conditions can fire —
    /// in the same transaction, so the scheduler never misses a suspension.
    pub fn put_suspension(mut self, suspension: &Suspension) -> Self {
        self.ops.push(Op::PutSuspension {
            id: suspension.session_id.0.clone(),
            value: json(suspension),
        });
        if let Some(wakeup) = Wakeup::of(suspension) {
            self.ops.push(Op::PutWakeup {
                id: suspension.session_id.0.clone(),
                value: json(&wakeup),
            });
        }
        self
    }

    /// Removes the session's suspension, if any (it was resumed, cancelled or
    /// failed), and its wake-up. Claims on its handle stay.
    pub fn delete_suspension(mut self, session: &SessionId) -> Self {
        self.ops.push(Op::DeleteSuspension {
            id: session.0.clone(),
        });
        self
    }

    /// Journals an external event (table `external_events`); its sequence
    /// number is returned by `commit` among the ids, in op order.
    pub fn append_external_event(mut self, event: &ExternalEvent) -> Self {
        self.ops
            .push(Op::AppendExternalEvent { value: json(event) });
        self
    }

    /// Creates or replaces a standing schedule (table `schedules`).
    pub fn put_schedule(mut self, schedule: &Schedule) -> Self {
        self.ops.push(Op::PutSchedule {
            id: schedule.schedule_id.clone(),
            value: json(schedule),
        });
        self
    }

    /// Deletes a standing schedule.
    pub fn delete_schedule(mut self, schedule_id: &str) -> Self {
        self.ops.push(Op::DeleteSchedule {
            id: schedule_id.to_owned(),
        });
        self
    }

    /// Sets a counter in table `meta`.
    pub fn put_meta(mut self, key: &str, value: u64) -> Self {
        self.ops.push(Op::PutMeta {
            key: key.to_owned(),
            value,
        });
        self
    }

    /// Creates or replaces a session record. The record is encoded when the
    /// batch is committed, so one that a later put in the same batch
    /// replaces (see [`Batch::merge`]) costs a copy, not an encoding.
    pub fn put_session(mut self, record: &SessionRecord) -> Self {
        self.ops.push(Op::PutSession {
            id: record.session_id.0.clone(),
            value: SessionRow::Record(Box::new(record.clone())),
        });
        self
    }

    /// Appends an event to the session's log; its id is the session's next
    /// event id, returned by `commit` in append order.
    pub fn append(self, session: &SessionId, event: &EventRecord) -> Self {
        self.append_taped(session, event, &Tape::default())
    }

    /// Like [`Batch::append`], with the replay `tape` entries the event
    /// carries stored in the same row (`{"at", "event", "tape"}`, covered by
    /// the hash chain; see `berth_runtime::tape`). An empty tape writes
    /// exactly what [`Batch::append`] writes.
    pub fn append_taped(mut self, session: &SessionId, event: &EventRecord, tape: &Tape) -> Self {
        self.ops.push(Op::AppendEvent {
            id: session.0.clone(),
            value: json(&TapedRecordRef::new(event, tape)),
        });
        self
    }

    /// Replaces the session's latest frame.
    pub fn put_frame(mut self, frame: &Frame) -> Self {
        self.ops.push(Op::PutFrame {
            id: frame.session_id.0.clone(),
            value: json(frame),
        });
        self
    }

    /// Removes the session's frame (its turn was sealed).
    pub fn delete_frame(mut self, session: &SessionId) -> Self {
        self.ops.push(Op::DeleteFrame {
            id: session.0.clone(),
        });
        self
    }

    /// Writes `messages` as the session's transcript entries `start`,
    /// `start + 1`, … (append the messages of a sealed turn at the transcript's
    /// current length).
    pub fn append_transcript(
        mut self,
        session: &SessionId,
        start: u64,
        messages: &[Message],
    ) -> Self {
        for (offset, message) in messages.iter().enumerate() {
            self.ops.push(Op::PutTranscriptMessage {
                id: session.0.clone(),
                index: start + offset as u64,
                value: json(message),
            });
        }
        self
    }

    /// Marks a turn as running (to be sealed if the process dies).
    pub fn open_turn(mut self, turn: &OpenTurn) -> Self {
        self.ops.push(Op::OpenTurn {
            id: turn.session_id.0.clone(),
            turn: turn.turn_id.0.clone(),
            value: json(turn),
        });
        self
    }

    /// Stores the session's checkpoint number `seq`.
    pub fn put_checkpoint(
        mut self,
        session: &SessionId,
        seq: u64,
        checkpoint: &TurnCheckpoint,
    ) -> Self {
        self.ops.push(Op::PutCheckpoint {
            id: session.0.clone(),
            seq,
            value: json(checkpoint),
        });
        self
    }

    /// Deletes the session's checkpoints numbered `seq` and above (a new turn
    /// discards what was rolled back).
    pub fn delete_checkpoints_from(mut self, session: &SessionId, seq: u64) -> Self {
        self.ops.push(Op::DeleteCheckpointsFrom {
            id: session.0.clone(),
            seq,
        });
        self
    }

    /// Drops transcript entries `from` and above (rollback).
    pub fn truncate_transcript(mut self, session: &SessionId, from: u64) -> Self {
        self.ops.push(Op::TruncateTranscript {
            id: session.0.clone(),
            from,
        });
        self
    }

    /// Clears the session's running-turn marker.
    pub fn close_turn(mut self, session: &SessionId) -> Self {
        self.ops.push(Op::CloseTurn {
            id: session.0.clone(),
        });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(session: &str, turn: &str) -> OpenTurn {
        OpenTurn {
            session_id: SessionId::from(session),
            turn_id: TurnId::from(turn),
            started_at: chrono::DateTime::from_timestamp_millis(0).unwrap_or_default(),
            prompt_text: String::new(),
        }
    }

    fn kinds(batch: &Batch) -> Vec<String> {
        batch
            .ops
            .iter()
            .map(|op| {
                format!("{op:?}")
                    .split([' ', '{'])
                    .next()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect()
    }

    fn record(session: &str, title: &str) -> SessionRecord {
        let at = chrono::DateTime::from_timestamp_millis(0).unwrap_or_default();
        SessionRecord {
            session_id: SessionId::from(session),
            cwd: "/tmp".into(),
            additional_directories: vec![],
            mcp_servers: vec![],
            mode_id: "default".into(),
            title: Some(title.into()),
            created_at: at,
            updated_at: at,
            closed_at: None,
            checkpoint_head: 0,
            parent_session_id: None,
            context_from: 0,
            suspend_request: None,
            created_by: None,
            labels: vec![],
            spend: Default::default(),
            budget_grant: Default::default(),
        }
    }

    #[test]
    fn a_session_record_is_encoded_once_as_the_batch_is_queued() {
        let (first, last) = (record("s", "first"), record("s", "last"));
        let mut merged = Batch::new()
            .put_session(&first)
            .merge(Batch::new().put_session(&last));
        assert_eq!(kinds(&merged), ["PutSession"]);
        merged.encode();
        let [Op::PutSession { value, .. }] = merged.ops.as_slice() else {
            panic!("one put: {:?}", merged.ops);
        };
        assert!(matches!(value, SessionRow::Encoded(_)));
        assert_eq!(
            value.bytes().as_ref(),
            serde_json::to_vec(&last).unwrap().as_slice()
        );
    }

    #[test]
    fn a_merge_drops_the_writes_the_merged_batch_overwrites_or_removes() {
        let s = SessionId::from("s");
        let mut start = Batch::new()
            .delete_suspension(&s)
            .open_turn(&open("s", "t1"));
        start.ops.push(Op::PutFrame {
            id: "s".into(),
            value: b"{}".to_vec(),
        });
        let seal = Batch::new()
            .fenced_by_turn(&s, &TurnId::from("t1"))
            .delete_frame(&s)
            .close_turn(&s);
        let merged = start.merge(seal);
        assert_eq!(
            kinds(&merged),
            ["DeleteSuspension", "DeleteFrame", "CloseTurn"]
        );
        assert!(merged.fence.is_none(), "the batch opened the fenced turn");
        // Another session's rows, and a turn opened after a close, stay.
        let t = SessionId::from("t");
        let kept = Batch::new()
            .close_turn(&s)
            .open_turn(&open("t", "t2"))
            .merge(Batch::new().open_turn(&open("s", "t3")));
        assert_eq!(kinds(&kept), ["CloseTurn", "OpenTurn", "OpenTurn"]);
        let closed = Batch::new()
            .open_turn(&open("t", "t2"))
            .merge(Batch::new().close_turn(&t));
        assert_eq!(kinds(&closed), ["CloseTurn"]);
    }
}
