//! The group-commit writer.
//!
//! One OS thread owns every write transaction. It blocks for the first pending
//! request, drains whatever else is queued (up to [`MAX_GROUP`] requests),
//! appends the whole group to the commit log as one record and fsyncs it
//! (`commit_log`: one sequential write), applies it in one redb write
//! transaction committed without I/O, and only then answers each request.
//! With one session appending, every append pays a full fsync; with a
//! hundred, a hundred appends share one — that is what makes durable appends
//! cheap. Every so often (see `commit_log`) a group's transaction is
//! committed with `Durability::Immediate` instead, which writes redb's pages
//! of every group since the last such commit, and the log is emptied.
//!
//! The writer also extends each session's hash chain (`chain.rs`): it knows
//! the ids it assigns, so it seals each appended row with the previous row's
//! hash and, once per transaction and session, writes the session's signed
//! chain head. A refused batch appends nothing and moves no chain.

use std::collections::HashMap;
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, WriteTransaction};
use tokio::sync::{mpsc, oneshot};

use berth_runtime::suspension::ResumeClaim;

use crate::batch::{Batch, Op, PendingClaim};
use crate::chain::{self, ChainHead};
use crate::commit_log::{self, codec, AppendError, CommitLog, Record, LOG_IN_USE_KEY, LOG_SEQ_KEY};
use crate::error::StorageError;
use crate::journal::decode;
use crate::keyring::Keyring;
use crate::records::OpenTurn;
use crate::sealed;
use crate::tables::{
    CHAIN_HEADS, CHECKPOINTS, EVENTS, EXTERNAL_EVENTS, FRAMES, META, OPEN_TURNS, RESUME_CLAIMS,
    SCHEDULES, SESSIONS, SUSPENSIONS, TRANSCRIPTS, WAKEUPS,
};

/// Most requests folded into one transaction.
pub(crate) const MAX_GROUP: usize = 1024;

/// Requests waiting for the writer before `commit` callers are made to wait
/// for room (backpressure).
pub(crate) const QUEUE_DEPTH: usize = 8192;

pub(crate) struct Request {
    pub batch: Batch,
    pub ack: oneshot::Sender<Result<Vec<u64>, StorageError>>,
    /// Answer only once redb holds everything durably and the log is empty
    /// ([`Journal::flush_log`](crate::Journal::flush_log); its batch is
    /// empty).
    pub checkpoint: bool,
}

/// Starts the writer thread over `db` and its commit `log`, whose next
/// record is number `next_seq`; it ends when every sender is dropped, after
/// a last durable commit that empties the log.
pub(crate) fn spawn(
    db: Arc<Database>,
    quick_repair: bool,
    keyring: Keyring,
    log: CommitLog,
    next_seq: u64,
) -> (mpsc::Sender<Request>, std::thread::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Request>(QUEUE_DEPTH);
    let mut writer = Writer {
        db,
        quick_repair,
        keyring,
        tips: Tips::default(),
        log,
        next_seq,
        broken: None,
        payload: Vec::new(),
        in_use: true,
    };
    let thread = std::thread::Builder::new()
        .name("berth-journal-writer".into())
        .spawn(move || {
            // Only to wait for a request with a timeout (the idle checkpoint).
            let timer = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("building the journal writer's timer");
            let mut group = Vec::with_capacity(MAX_GROUP);
            loop {
                let first = if writer.log.len() == 0 {
                    rx.blocking_recv()
                } else {
                    let next = timer.block_on(async {
                        tokio::time::timeout(commit_log::IDLE_CHECKPOINT, rx.recv()).await
                    });
                    match next {
                        Ok(next) => next,
                        Err(_idle) => {
                            let _ = writer.checkpoint();
                            continue;
                        }
                    }
                };
                let Some(first) = first else { break };
                group.push(first);
                while group.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(next) => group.push(next),
                        Err(_) => break,
                    }
                }
                let checkpoints: Vec<Request> = if group.iter().any(|r| r.checkpoint) {
                    let (asked, rest) = group.drain(..).partition(|r| r.checkpoint);
                    group = rest;
                    asked
                } else {
                    Vec::new()
                };
                if !group.is_empty() {
                    writer.commit_group(&mut group);
                }
                if !checkpoints.is_empty() {
                    // Asked for as the server stops: the file goes too.
                    // Marked clean before the file shrinks: killed in
                    // between, the journal lost nothing either way.
                    let outcome = writer
                        .checkpoint()
                        .and_then(|()| writer.set_in_use(false))
                        .map(|()| writer.release_log());
                    for request in checkpoints {
                        let _ = request.ack.send(outcome.clone().map(|()| Vec::new()));
                    }
                }
            }
            if writer.checkpoint().is_ok() {
                match writer.set_in_use(false) {
                    Ok(()) => writer.release_log(),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not record the journal's clean stop");
                    }
                }
            }
        })
        .expect("spawning the journal writer thread");
    (tx, thread)
}

/// Histogram of one successful group commit's duration, from the log
/// append to the applied transaction (seconds).
pub const COMMIT_SECONDS: &str = "berth_journal_commit_seconds";
/// Counter of failed group commits.
pub const COMMIT_ERRORS_TOTAL: &str = "berth_journal_commit_errors_total";
/// Histogram of requests folded into one group commit.
pub const COMMIT_GROUP_SIZE: &str = "berth_journal_commit_group_size";

/// Most sessions whose chain tip the writer remembers between transactions.
const TIPS_CACHED: usize = 65_536;

/// The chain tips (last event id, its row hash) of sessions appended to by
/// committed transactions, so the next append to a busy session does not
/// read its last row and its head back (`chain_tip`). Only the writer
/// appends events, so a remembered tip is what `chain_tip` would find.
/// Bounded: past [`TIPS_CACHED`] sessions it starts over (a forgotten tip
/// is read from the journal again).
#[derive(Default)]
pub(crate) struct Tips(HashMap<String, (u64, [u8; 32])>);

impl Tips {
    fn get(&self, session: &str) -> Option<(u64, [u8; 32])> {
        self.0.get(session).copied()
    }

    /// Remembers the tips a transaction committed.
    fn committed(&mut self, tips: HashMap<&str, (u64, [u8; 32])>) {
        if self.0.len() + tips.len() > TIPS_CACHED {
            self.0.clear();
        }
        for (session, tip) in tips {
            match self.0.get_mut(session) {
                Some(known) => *known = tip,
                None => {
                    self.0.insert(session.to_owned(), tip);
                }
            }
        }
    }
}

/// The largest encoding buffer (bytes) the writer keeps between groups.
const PAYLOAD_KEPT: usize = 8 * 1024 * 1024;

/// What the writer thread owns.
struct Writer {
    db: Arc<Database>,
    quick_repair: bool,
    keyring: Keyring,
    tips: Tips,
    log: CommitLog,
    /// The number of the next log record.
    next_seq: u64,
    /// Set once the log may hold a record that was not applied and could not
    /// be removed: replaying it would apply what was answered as failed, so
    /// nothing more is committed (every request gets this error).
    broken: Option<String>,
    /// The encoding buffer, reused across groups.
    payload: Vec<u8>,
    /// What redb holds durably under [`commit_log::LOG_IN_USE_KEY`]: the
    /// journal's open sets it, a stop that emptied the log clears it, and a
    /// group after that sets it again before its record is written.
    in_use: bool,
}

impl Writer {
    fn commit_group(&mut self, group: &mut Vec<Request>) {
        // Metrics only: wall time, not the engine's injected clock.
        let started = std::time::Instant::now();
        metrics::histogram!(COMMIT_GROUP_SIZE).record(group.len() as f64);
        match self.commit(group) {
            Ok(outcomes) => {
                metrics::histogram!(COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
                for (request, outcome) in group.drain(..).zip(outcomes) {
                    let _ = request.ack.send(outcome);
                }
            }
            Err(e) => {
                metrics::counter!(COMMIT_ERRORS_TOTAL).increment(1);
                tracing::error!(error = %e, requests = group.len(), "journal group commit failed");
                for request in group.drain(..) {
                    let _ = request.ack.send(Err(e.clone()));
                }
            }
        }
    }

    /// Logs, applies and commits one group; returns each request's outcome.
    fn commit(
        &mut self,
        group: &[Request],
    ) -> Result<Vec<Result<Vec<u64>, StorageError>>, StorageError> {
        if let Some(why) = &self.broken {
            return Err(StorageError::Database(why.clone()));
        }
        self.set_in_use(true)?;
        commit_log::new_record(&mut self.payload);
        codec::encode_group(group.iter().map(|r| &r.batch), &mut self.payload);
        let before = self.log.len();
        let seq = self.next_seq;
        let appended = self.log.append(seq, &mut self.payload);
        if self.payload.capacity() > PAYLOAD_KEPT {
            // A group of large rows: do not hold its buffer for good.
            self.payload = Vec::new();
        }
        match appended {
            Ok(()) => {}
            Err(AppendError::Failed(e)) => {
                return Err(StorageError::Database(format!(
                    "appending to the commit log: {e}"
                )))
            }
            Err(AppendError::Broken(e)) => return Err(self.break_off(&e)),
        }
        // A large log: this group's transaction writes redb's pages of every
        // group since the last durable commit, and then the log is emptied.
        let checkpoint = self.log.len() >= commit_log::CHECKPOINT_BYTES;
        let batches: Vec<&Batch> = group.iter().map(|r| &r.batch).collect();
        let applied = (|| {
            let mut txn = self.db.begin_write()?;
            txn.set_quick_repair(self.quick_repair);
            if !checkpoint {
                txn.set_durability(Durability::None)
                    .map_err(|e| StorageError::Database(e.to_string()))?;
            }
            let (outcomes, tips) = apply_all(&txn, &self.keyring, &self.tips, &batches)?;
            txn.open_table(META)?.insert(LOG_SEQ_KEY, seq)?;
            txn.commit()?;
            Ok::<_, StorageError>((outcomes, tips))
        })();
        match applied {
            Ok((outcomes, tips)) => {
                self.next_seq += 1;
                self.tips.committed(tips);
                if checkpoint {
                    self.clear_log();
                }
                Ok(outcomes)
            }
            Err(e) => {
                // Not applied: it must not be replayed either.
                if let Err(cut) = self.log.undo_last(before) {
                    self.break_off(&cut);
                }
                Err(e)
            }
        }
    }

    /// Stops committing for good (see [`Writer::broken`]); returns the error.
    fn break_off(&mut self, cause: &std::io::Error) -> StorageError {
        let why = format!(
            "the journal's commit log could not be repaired after a failed write ({cause}); \
             no more writes are accepted: restart berth"
        );
        tracing::error!(error = %why, "journal writer stopped committing");
        self.broken = Some(why.clone());
        StorageError::Database(why)
    }

    /// Makes every applied group durable in redb itself (an empty
    /// transaction committed with `Durability::Immediate` writes the pages
    /// of the non-durable commits before it), then empties the log.
    fn checkpoint(&mut self) -> Result<(), StorageError> {
        if let Some(why) = &self.broken {
            return Err(StorageError::Database(why.clone()));
        }
        if self.log.len() == 0 {
            return Ok(());
        }
        let durable = (|| {
            let mut txn = self.db.begin_write()?;
            txn.set_quick_repair(self.quick_repair);
            txn.commit()?;
            Ok::<_, StorageError>(())
        })();
        match durable {
            Ok(()) => {
                self.clear_log();
                Ok(())
            }
            // The log still holds every group: nothing is lost, it is tried again.
            Err(e) => {
                tracing::error!(error = %e, "journal checkpoint failed");
                Err(e)
            }
        }
    }

    /// Records durably (an `Immediate` redb commit) whether the log may hold
    /// acknowledged groups redb does not (see [`commit_log::check_present`]);
    /// nothing when redb already says so.
    ///
    /// # Errors
    /// [`StorageError::Database`] when the commit failed.
    fn set_in_use(&mut self, in_use: bool) -> Result<(), StorageError> {
        if self.in_use == in_use {
            return Ok(());
        }
        let mut txn = self.db.begin_write()?;
        txn.set_quick_repair(self.quick_repair);
        txn.open_table(META)?
            .insert(LOG_IN_USE_KEY, u64::from(in_use))?;
        txn.commit()?;
        self.in_use = in_use;
        Ok(())
    }

    /// Empties the log and truncates its file (see `CommitLog::release`);
    /// only after a successful checkpoint.
    fn release_log(&mut self) {
        if let Err(e) = self.log.release() {
            tracing::warn!(error = %e, "could not truncate the journal's commit log");
        }
    }

    fn clear_log(&mut self) {
        if let Err(e) = self.log.clear() {
            // Harmless: the records are at or below redb's durable sequence
            // number, so a replay skips them.
            tracing::warn!(error = %e, "could not empty the journal's commit log");
        }
    }
}

/// The seq of the last commit-log record `db` holds (0 for none).
///
/// # Errors
/// [`StorageError::Database`] on I/O failure.
pub(crate) fn applied_seq(db: &impl ReadableDatabase) -> Result<u64, StorageError> {
    meta_value(db, LOG_SEQ_KEY)
}

/// Starts the sequence numbers of this open's records past anything an
/// earlier open could have written (see [`commit_log::LINEAGE_GAP`]):
/// records `db` holds up to `last`, the next record is numbered the returned
/// value + 1. Durable (an `Immediate` commit) before the first record.
///
/// # Errors
/// [`StorageError::Database`] when the commit fails.
pub(crate) fn start_lineage(
    db: &Database,
    last: u64,
    quick_repair: bool,
) -> Result<u64, StorageError> {
    let from = last.checked_add(commit_log::LINEAGE_GAP).ok_or_else(|| {
        StorageError::Database("the commit log's sequence numbers are used up".into())
    })?;
    let mut txn = db.begin_write()?;
    txn.set_quick_repair(quick_repair);
    txn.open_table(META)?.insert(LOG_SEQ_KEY, from)?;
    txn.commit()?;
    Ok(from)
}

/// Whether `db` says its commit log may hold acknowledged groups it does
/// not ([`LOG_IN_USE_KEY`]).
///
/// # Errors
/// [`StorageError::Database`] on I/O failure.
pub(crate) fn log_in_use(db: &impl ReadableDatabase) -> Result<bool, StorageError> {
    Ok(meta_value(db, LOG_IN_USE_KEY)? == 1)
}

/// The `meta` value under `key` (0 when absent).
fn meta_value(db: &impl ReadableDatabase, key: &str) -> Result<u64, StorageError> {
    let txn = db.begin_read()?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let value = meta.get(key)?.map_or(0, |v| v.value());
    Ok(value)
}

/// The error for a commit log that cannot be read at `path`: damage in the
/// middle is [`StorageError::Corrupt`] (table `commit_log`), anything else
/// [`StorageError::Open`].
pub(crate) fn log_error(path: &std::path::Path, e: std::io::Error) -> StorageError {
    if e.kind() == std::io::ErrorKind::InvalidData {
        StorageError::Corrupt {
            table: "commit_log",
            key: path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
            message: e.to_string(),
        }
    } else {
        StorageError::Open {
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }
}

/// Replays into `db` the log `records` whose sequence number is above the
/// one `db` holds (what a crash left only in the log), in one durable
/// transaction; returns the number of the last record now applied (0 for
/// none), so the next record is one more.
///
/// # Errors
/// [`StorageError::Corrupt`] (table `commit_log`) for a record that cannot
/// be decoded or a gap between `db` and the log; [`StorageError::Database`]
/// on I/O failure. Nothing is applied then.
pub(crate) fn replay(
    db: &Database,
    keyring: &Keyring,
    records: &[Record],
) -> Result<u64, StorageError> {
    let applied = applied_seq(db)?;
    let pending: Vec<&Record> = records.iter().filter(|r| r.seq > applied).collect();
    let Some(first) = pending.first() else {
        return Ok(applied);
    };
    let corrupt = |seq: u64, message: String| StorageError::Corrupt {
        table: "commit_log",
        key: seq.to_string(),
        message,
    };
    if first.seq != applied + 1 {
        return Err(corrupt(
            first.seq,
            format!(
                "the journal holds records up to {applied} and its commit log resumes at {}: \
                 records in between are missing",
                first.seq
            ),
        ));
    }
    let mut txn = db.begin_write()?;
    txn.set_quick_repair(true);
    let mut last = applied;
    for record in pending {
        let batches =
            codec::decode_group(&record.payload).map_err(|message| corrupt(record.seq, message))?;
        let refs: Vec<&Batch> = batches.iter().collect();
        // Refusals come out as they did the first time: applying a batch
        // depends only on what the records before it left.
        apply_all(&txn, keyring, &Tips::default(), &refs)?;
        txn.open_table(META)?.insert(LOG_SEQ_KEY, record.seq)?;
        last = record.seq;
    }
    txn.commit()?;
    tracing::info!(
        from = applied + 1,
        to = last,
        "replayed the journal's commit log (groups acknowledged before the last stop that redb \
         did not hold yet)"
    );
    Ok(last)
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
    let open: OpenTurn = decode(
        "open_turns",
        session,
        strip("open_turns", session, open.value())?,
    )?;
    Ok(open.turn_id.as_str() == turn)
}

/// The value of a sealed row, its seal not checked (a precondition decides
/// nothing a model sees); an unsealed row (a format-3 journal's, in a
/// read-only copy) is taken as it is.
fn strip<'r>(table: &'static str, session: &str, row: &'r [u8]) -> Result<&'r [u8], StorageError> {
    if row.first() != Some(&sealed::SEAL_VERSION) {
        return Ok(row);
    }
    sealed::strip(row).map_err(|message| StorageError::Corrupt {
        table,
        key: session.to_owned(),
        message,
    })
}

/// The claim already stored on the handle a batch wants to claim, if any. Reads
/// through the group's write transaction, so it sees claims inserted by earlier
/// batches of the same group.
fn existing_claim(
    resume_claims: &redb::Table<&str, &[u8]>,
    handle: &str,
) -> Result<Option<ResumeClaim>, StorageError> {
    let Some(stored) = resume_claims.get(handle)? else {
        return Ok(None);
    };
    decode("resume_claims", handle, stored.value()).map(Some)
}

/// Whether `handle` is the session's stored suspension. Reads only the
/// stored envelope's `handle` (the rest, a parked frame included, is skipped).
fn suspension_holds(
    suspensions: &redb::Table<&str, &[u8]>,
    session: &str,
    handle: &str,
) -> Result<bool, StorageError> {
    #[derive(serde::Deserialize)]
    struct Handle {
        handle: String,
    }
    let Some(stored) = suspensions.get(session)? else {
        return Ok(false);
    };
    let stored: Handle = decode(
        "suspensions",
        session,
        strip("suspensions", session, stored.value())?,
    )?;
    Ok(stored.handle == handle)
}

/// Checks a batch's preconditions (its fence, then its claim, then its
/// suspension) without writing; `Some` is the refusal of a batch that must
/// write nothing.
fn refusal(
    batch: &Batch,
    open_turns: &redb::Table<&str, &[u8]>,
    resume_claims: &redb::Table<&str, &[u8]>,
    suspensions: &redb::Table<&str, &[u8]>,
) -> Result<Option<StorageError>, StorageError> {
    if let Some((session, turn)) = &batch.fence {
        if !fence_holds(open_turns, session, turn)? {
            return Ok(Some(StorageError::Fenced {
                session_id: session.clone(),
                turn_id: turn.clone(),
            }));
        }
    }
    if let Some(PendingClaim { handle, .. }) = &batch.claim {
        if let Some(existing) = existing_claim(resume_claims, handle)? {
            return Ok(Some(StorageError::AlreadyClaimed {
                handle: handle.clone(),
                existing: Box::new(existing),
            }));
        }
    }
    if let Some((session, handle)) = &batch.suspension {
        if !suspension_holds(suspensions, session, handle)? {
            return Ok(Some(StorageError::SuspensionGone {
                session_id: session.clone(),
                handle: handle.clone(),
            }));
        }
    }
    Ok(None)
}

/// Per request, the event ids assigned or the refusal; and the chain tips the
/// transaction leaves, per session.
pub(crate) type Applied<'g> = (
    Vec<Result<Vec<u64>, StorageError>>,
    HashMap<&'g str, (u64, [u8; 32])>,
);

/// Applies every request's ops; returns, per request, the event ids assigned or
/// the refusal of a fenced or already-claimed batch (which then wrote nothing),
/// and the sessions' new chain tips. A storage error fails the whole group.
pub(crate) fn apply_all<'g>(
    txn: &WriteTransaction,
    keyring: &Keyring,
    cached: &Tips,
    batches: &[&'g Batch],
) -> Result<Applied<'g>, StorageError> {
    let mut sessions = txn.open_table(SESSIONS)?;
    let mut events = txn.open_table(EVENTS)?;
    let mut frames = txn.open_table(FRAMES)?;
    let mut transcripts = txn.open_table(TRANSCRIPTS)?;
    let mut open_turns = txn.open_table(OPEN_TURNS)?;
    let mut checkpoints = txn.open_table(CHECKPOINTS)?;
    let mut suspensions = txn.open_table(SUSPENSIONS)?;
    let mut resume_claims = txn.open_table(RESUME_CLAIMS)?;
    let mut wakeups = txn.open_table(WAKEUPS)?;
    let mut external = txn.open_table(EXTERNAL_EVENTS)?;
    let mut meta = txn.open_table(META)?;
    let mut schedules = txn.open_table(SCHEDULES)?;
    let mut heads = txn.open_table(CHAIN_HEADS)?;
    let mut last_external: Option<u64> = None;
    // Last event id and hash per session, as of this transaction.
    let mut tips: HashMap<&str, (u64, [u8; 32])> = HashMap::new();
    let mut out = Vec::with_capacity(batches.len());
    // One buffer for every sealed row of the group.
    let mut row = Vec::new();
    for &batch in batches {
        if let Some(refused) = refusal(batch, &open_turns, &resume_claims, &suspensions)? {
            out.push(Err(refused));
            continue;
        }
        if let Some(PendingClaim { handle, value }) = &batch.claim {
            resume_claims.insert(handle.as_str(), value.as_slice())?;
        }
        let mut ids = Vec::new();
        for op in &batch.ops {
            match op {
                Op::PutSession { id, value } => {
                    sessions.insert(id.as_str(), value.bytes().as_ref())?;
                }
                Op::AppendEvent { id, value } => {
                    let (last, prev) = match tips.get(id.as_str()) {
                        Some(&tip) => tip,
                        None => match cached.get(id) {
                            Some(tip) => tip,
                            None => chain_tip(&events, &heads, id)?,
                        },
                    };
                    let next = last + 1;
                    let (row, hash) = chain::seal_row(id, next, &prev, value);
                    events.insert((id.as_str(), next), row.as_slice())?;
                    tips.insert(id.as_str(), (next, hash));
                    ids.push(next);
                }
                Op::PutFrame { id, value } => {
                    sealed::seal_into(&mut row, keyring, "frames", id, sealed::NO_INDEX, value);
                    frames.insert(id.as_str(), row.as_slice())?;
                }
                Op::DeleteFrame { id } => {
                    frames.remove(id.as_str())?;
                }
                Op::PutTranscriptMessage { id, index, value } => {
                    sealed::seal_into(&mut row, keyring, "transcript_messages", id, *index, value);
                    transcripts.insert((id.as_str(), *index), row.as_slice())?;
                }
                Op::OpenTurn { id, value, .. } => {
                    sealed::seal_into(&mut row, keyring, "open_turns", id, sealed::NO_INDEX, value);
                    open_turns.insert(id.as_str(), row.as_slice())?;
                }
                Op::CloseTurn { id } => {
                    open_turns.remove(id.as_str())?;
                }
                Op::PutCheckpoint { id, seq, value } => {
                    sealed::seal_into(&mut row, keyring, "checkpoints", id, *seq, value);
                    checkpoints.insert((id.as_str(), *seq), row.as_slice())?;
                }
                Op::DeleteCheckpointsFrom { id, seq } => {
                    checkpoints
                        .retain_in((id.as_str(), *seq)..=(id.as_str(), u64::MAX), |_, _| false)?;
                }
                Op::TruncateTranscript { id, from } => {
                    transcripts
                        .retain_in((id.as_str(), *from)..=(id.as_str(), u64::MAX), |_, _| false)?;
                }
                Op::PutSuspension { id, value } => {
                    sealed::seal_into(
                        &mut row,
                        keyring,
                        "suspensions",
                        id,
                        sealed::NO_INDEX,
                        value,
                    );
                    suspensions.insert(id.as_str(), row.as_slice())?;
                }
                Op::PutWakeup { id, value } => {
                    wakeups.insert(id.as_str(), value.as_slice())?;
                }
                Op::AppendExternalEvent { value } => {
                    let next = match last_external {
                        Some(n) => n + 1,
                        None => match external.last()? {
                            Some((k, _)) => k.value() + 1,
                            None => 1,
                        },
                    };
                    external.insert(next, value.as_slice())?;
                    last_external = Some(next);
                    ids.push(next);
                }
                Op::PutSchedule { id, value } => {
                    schedules.insert(id.as_str(), value.as_slice())?;
                }
                Op::DeleteSchedule { id } => {
                    schedules.remove(id.as_str())?;
                }
                Op::PutMeta { key, value } => {
                    meta.insert(key.as_str(), *value)?;
                }
                Op::DeleteSuspension { id } => {
                    suspensions.remove(id.as_str())?;
                    wakeups.remove(id.as_str())?;
                }
            }
        }
        out.push(Ok(ids));
    }
    for (session, (seq, hash)) in &tips {
        let head = ChainHead::signed(keyring, session, *seq, hash);
        let head = serde_json::to_vec(&head).unwrap_or_default();
        heads.insert(*session, head.as_slice())?;
    }
    Ok((out, tips))
}

/// Where a session's chain continues: after the larger of its head's seq and
/// its last stored id (so no row is ever overwritten), from the head's hash
/// (never from the last row's, so rows appended behind the writer's back stay
/// detectably unchained). A session without a head starts from the genesis
/// hash; an undecodable head is logged and treated as absent (`berth verify`
/// reports the break).
fn chain_tip(
    events: &redb::Table<(&str, u64), &[u8]>,
    heads: &redb::Table<&str, &[u8]>,
    session: &str,
) -> Result<(u64, [u8; 32]), StorageError> {
    let tail = match events
        .range((session, 0)..=(session, u64::MAX))?
        .next_back()
    {
        Some(entry) => entry?.0.value().1,
        None => 0,
    };
    let head = match heads.get(session)? {
        Some(stored) => match serde_json::from_slice::<ChainHead>(stored.value())
            .ok()
            .and_then(|h| Some((h.seq, h.hash_bytes()?)))
        {
            Some(head) => Some(head),
            None => {
                tracing::error!(session_id = session, "the chain head is unreadable; the chain continues from genesis and `berth verify` will report the break");
                None
            }
        },
        None => None,
    };
    Ok(match head {
        Some((seq, hash)) => (seq.max(tail), hash),
        None => (tail, chain::GENESIS),
    })
}

#[cfg(test)]
mod tests {
    use berth_runtime::ids::SessionId;
    use berth_runtime::suspension::{ResumeClaim, ResumeClaimKind, Suspension};
    use redb::ReadableDatabase;

    use super::*;

    fn claim(actor: &str) -> ResumeClaim {
        ResumeClaim {
            handle: "susp_1".into(),
            session_id: SessionId::from("s"),
            kind: ResumeClaimKind::Resumed,
            cause: None,
            actor: actor.into(),
            claimed_at: chrono::DateTime::from_timestamp_millis(0).unwrap(),
        }
    }

    /// Two batches claiming one handle in the same group commit: the second
    /// sees the first's insert through the shared write transaction.
    #[test]
    fn the_second_claim_in_one_group_loses_to_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("j.redb")).unwrap();
        let sid = SessionId::from("s");
        let parked: Suspension = serde_json::from_value(serde_json::json!({
            "handle": "susp_1", "session_id": "s", "initiator": "client",
            "actor": "c", "mode": "finish_step", "suspended_at": "2024-01-01T00:00:00Z"
        }))
        .unwrap();
        let group = [
            Batch::new().put_suspension(&parked),
            Batch::new().claim(&claim("first")).delete_suspension(&sid),
            Batch::new().claim(&claim("second")).put_suspension(&parked),
        ];
        let txn = db.begin_write().unwrap();
        let keyring = Keyring::from_keys(vec![("k1".into(), vec![1; 32])]).unwrap();
        let group: Vec<&Batch> = group.iter().collect();
        let (outcomes, _) = apply_all(&txn, &keyring, &Tips::default(), &group).unwrap();
        txn.commit().unwrap();

        assert!(outcomes[0].is_ok() && outcomes[1].is_ok());
        match &outcomes[2] {
            Err(StorageError::AlreadyClaimed { handle, existing }) => {
                assert_eq!(handle, "susp_1");
                assert_eq!(**existing, claim("first"));
            }
            other => panic!("expected AlreadyClaimed, got {other:?}"),
        }
        let read = db.begin_read().unwrap();
        let stored = read.open_table(RESUME_CLAIMS).unwrap();
        let stored: ResumeClaim =
            serde_json::from_slice(stored.get("susp_1").unwrap().unwrap().value()).unwrap();
        assert_eq!(stored, claim("first"));
        // The loser's put_suspension did not land: the winner's delete stands.
        let suspensions = read.open_table(SUSPENSIONS).unwrap();
        assert!(suspensions.get("s").unwrap().is_none());
    }
}
