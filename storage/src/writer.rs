//! The group-commit writer.
//!
//! One OS thread owns every write transaction. It blocks for the first pending
//! request, drains whatever else is queued (up to [`MAX_GROUP`] requests), applies
//! them all in one redb write transaction with `Durability::Immediate`, commits
//! (one fsync for the whole group), and only then answers each request. With one
//! session appending, every append pays a full commit; with a hundred, a hundred
//! appends share one — that is what makes durable appends cheap.

use std::collections::HashMap;
use std::sync::Arc;

use redb::{Database, ReadableTable, WriteTransaction};
use tokio::sync::{mpsc, oneshot};

use crate::batch::{Batch, Op};
use crate::error::StorageError;
use crate::records::OpenTurn;
use crate::tables::{CHECKPOINTS, EVENTS, FRAMES, OPEN_TURNS, SESSIONS, TRANSCRIPTS};

/// Most requests folded into one transaction.
pub(crate) const MAX_GROUP: usize = 1024;

/// Requests waiting for the writer before `commit` callers are made to wait
/// for room (backpressure).
pub(crate) const QUEUE_DEPTH: usize = 8192;

pub(crate) struct Request {
    pub batch: Batch,
    pub ack: oneshot::Sender<Result<Vec<u64>, StorageError>>,
}

/// Starts the writer thread; it ends when every sender is dropped.
pub(crate) fn spawn(
    db: Arc<Database>,
    quick_repair: bool,
) -> (mpsc::Sender<Request>, std::thread::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Request>(QUEUE_DEPTH);
    let thread = std::thread::Builder::new()
        .name("berth-journal-writer".into())
        .spawn(move || {
            let mut group = Vec::with_capacity(MAX_GROUP);
            while let Some(first) = rx.blocking_recv() {
                group.push(first);
                while group.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(next) => group.push(next),
                        Err(_) => break,
                    }
                }
                commit_group(&db, quick_repair, &mut group);
            }
        })
        .expect("spawning the journal writer thread");
    (tx, thread)
}

fn commit_group(db: &Database, quick_repair: bool, group: &mut Vec<Request>) {
    let result = (|| {
        let mut txn = db.begin_write()?;
        txn.set_quick_repair(quick_repair);
        let outcomes = apply_all(&txn, group)?;
        txn.commit()?;
        Ok::<_, StorageError>(outcomes)
    })();
    match result {
        Ok(outcomes) => {
            for (request, outcome) in group.drain(..).zip(outcomes) {
                let _ = request.ack.send(outcome);
            }
        }
        Err(e) => {
            tracing::error!(error = %e, requests = group.len(), "journal group commit failed");
            for request in group.drain(..) {
                let _ = request.ack.send(Err(e.clone()));
            }
        }
    }
}

/// Whether the fence of a batch holds: its turn is still the session's open turn.
fn fence_holds(
    open_turns: &redb::Table<&str, &[u8]>,
    session: &str,
    turn: &str,
) -> Result<bool, StorageError> {
    let Some(open) = open_turns.get(session)? else {
        return Ok(false);
    };
    let open: OpenTurn =
        serde_json::from_slice(open.value()).map_err(|e| StorageError::Corrupt {
            table: "open_turns",
            key: session.to_owned(),
            message: e.to_string(),
        })?;
    Ok(open.turn_id.as_str() == turn)
}

/// Applies every request's ops; returns, per request, the event ids assigned or
/// the refusal of a fenced batch (which then wrote nothing). A storage error
/// fails the whole group.
fn apply_all(
    txn: &WriteTransaction,
    group: &[Request],
) -> Result<Vec<Result<Vec<u64>, StorageError>>, StorageError> {
    let mut sessions = txn.open_table(SESSIONS)?;
    let mut events = txn.open_table(EVENTS)?;
    let mut frames = txn.open_table(FRAMES)?;
    let mut transcripts = txn.open_table(TRANSCRIPTS)?;
    let mut open_turns = txn.open_table(OPEN_TURNS)?;
    let mut checkpoints = txn.open_table(CHECKPOINTS)?;
    // Last event id per session, as of this transaction.
    let mut last: HashMap<&str, u64> = HashMap::new();
    let mut out = Vec::with_capacity(group.len());
    for request in group {
        if let Some((session, turn)) = &request.batch.fence {
            if !fence_holds(&open_turns, session, turn)? {
                out.push(Err(StorageError::Fenced {
                    session_id: session.clone(),
                    turn_id: turn.clone(),
                }));
                continue;
            }
        }
        let mut ids = Vec::new();
        for op in &request.batch.ops {
            match op {
                Op::PutSession { id, value } => {
                    sessions.insert(id.as_str(), value.as_slice())?;
                }
                Op::AppendEvent { id, value } => {
                    let next = match last.get(id.as_str()) {
                        Some(&n) => n + 1,
                        None => {
                            let tail = events
                                .range((id.as_str(), 0)..=(id.as_str(), u64::MAX))?
                                .next_back();
                            match tail {
                                Some(entry) => entry?.0.value().1 + 1,
                                None => 1,
                            }
                        }
                    };
                    events.insert((id.as_str(), next), value.as_slice())?;
                    last.insert(id.as_str(), next);
                    ids.push(next);
                }
                Op::PutFrame { id, value } => {
                    frames.insert(id.as_str(), value.as_slice())?;
                }
                Op::DeleteFrame { id } => {
                    frames.remove(id.as_str())?;
                }
                Op::PutTranscriptMessage { id, index, value } => {
                    transcripts.insert((id.as_str(), *index), value.as_slice())?;
                }
                Op::OpenTurn { id, value } => {
                    open_turns.insert(id.as_str(), value.as_slice())?;
                }
                Op::CloseTurn { id } => {
                    open_turns.remove(id.as_str())?;
                }
                Op::PutCheckpoint { id, seq, value } => {
                    checkpoints.insert((id.as_str(), *seq), value.as_slice())?;
                }
                Op::DeleteCheckpointsFrom { id, seq } => {
                    checkpoints
                        .retain_in((id.as_str(), *seq)..=(id.as_str(), u64::MAX), |_, _| false)?;
                }
                Op::TruncateTranscript { id, from } => {
                    transcripts
                        .retain_in((id.as_str(), *from)..=(id.as_str(), u64::MAX), |_, _| false)?;
                }
            }
        }
        out.push(Ok(ids));
    }
    Ok(out)
}
