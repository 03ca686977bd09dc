//! The journal handle: group-committed writes, direct reads.

use std::path::Path;
use std::sync::Arc;

use berth_runtime::event::EventRecord;
use berth_runtime::frame::Frame;
use berth_runtime::history::Message;
use berth_runtime::ids::{EventId, SessionId};
use berth_runtime::suspension::{ExternalEvent, ResumeClaim, Schedule, Suspension, Wakeup};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot};

use crate::batch::Batch;
use crate::chain;
use crate::commit_log::{self, CommitLog};
use crate::error::StorageError;
use crate::keyring::Keyring;
use crate::records::{OpenTurn, SessionRecord, TurnCheckpoint};
use crate::sealed;
use crate::tables::{
    CHAIN_HEADS, CHECKPOINTS, EVENTS, EXTERNAL_EVENTS, FRAMES, META, OPEN_TURNS, RESUME_CLAIMS,
    SCHEDULES, SESSIONS, SUSPENSIONS, TRANSCRIPTS, WAKEUPS,
};
use crate::writer::{self, Request};

/// The journal format this berth writes and reads (table `meta`, key
/// `format_version`). Format 1 (no recorded version) had no hash chain and
/// unsigned receipts; format 2 chains every session's events and signs
/// receipts; format 3 has the same tables plus the commit log beside the
/// file (`journal.log`, see `commit_log`), which holds acknowledged groups
/// that the redb file may not have yet; format 4 also seals every row a
/// session reloads into a model's context (transcript, checkpoints, frames,
/// suspensions, open turns; see `sealed.rs`). A format-1 journal is refused
/// at open with [`StorageError::Format`]; a format-2 or format-3 one has its
/// rows sealed and is stamped 4 when opened (its rows are trusted as they
/// are at that moment), so that a berth that knows nothing of the log or of
/// seals refuses it instead of misreading it.
pub const JOURNAL_FORMAT: u64 = 4;

/// The format before the commit log, read as is and stamped
/// [`JOURNAL_FORMAT`] when opened for writing.
pub(crate) const FORMAT_WITHOUT_LOG: u64 = 2;

/// The format before sealed rows: read as is (`berth verify` says its rows
/// are not covered), sealed and stamped [`JOURNAL_FORMAT`] when opened for
/// writing.
pub(crate) const FORMAT_UNSEALED: u64 = 3;

/// The `meta` key holding the journal format.
pub(crate) const FORMAT_KEY: &str = "format_version";

/// A batch queued for a group commit ([`Journal::submit`]).
#[derive(Debug)]
#[must_use = "the write is only known to be durable once `durable` returns Ok"]
pub struct Queued(Option<oneshot::Receiver<Result<Vec<EventId>, StorageError>>>);

impl Queued {
    /// Waits until the batch is durable; returns the event ids assigned to
    /// its appends, in order (none for an empty batch).
    ///
    /// # Errors
    /// As [`Journal::commit`]: nothing of the batch was written.
    pub async fn durable(self) -> Result<Vec<EventId>, StorageError> {
        match self.0 {
            None => Ok(Vec::new()),
            Some(done) => done.await.map_err(|_| StorageError::WriterStopped)?,
        }
    }
}

/// How the journal commits, caches, and with which keys.
#[derive(Debug, Clone)]
pub struct JournalOptions {
    /// redb quick-repair: each commit also persists allocator state so that
    /// opening after a crash needs no repair scan (slower commits, instant
    /// recovery). Default off.
    pub quick_repair: bool,
    /// redb's page cache, in bytes (default [`DEFAULT_CACHE_BYTES`]). The
    /// cache fills as pages are read and counts towards the process's RSS;
    /// redb's own default (1 GiB) would let one start-up scan of a million
    /// wake-ups hold most of a GiB.
    pub cache_bytes: usize,
    /// The receipt keyring (signs receipts and chain heads). `None`: the key
    /// file beside the journal file, created on first open
    /// ([`Keyring::load_or_create`]).
    pub keyring: Option<Keyring>,
}

/// The default page cache: 64 MiB.
///
/// redb's cache is a user-space copy of journal pages that the kernel's page
/// cache also holds (redb reads with `pread`), and it keeps every page a
/// commit writes until it is full, so on a busy node it is always full and
/// all of it counts towards RSS. 256 MiB (the earlier default) was a quarter
/// of the RSS of 100,000 parked sessions (bench-sched `--park`); a miss
/// costs a `pread` from the kernel's cache, and the WebSocket storm
/// (bench-ws, README) acknowledged as many steers per second with a 16 MiB
/// cache as with 256 MiB. Nodes that rehydrate many large sessions can raise
/// it (`journal_cache_mib`).
pub const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

impl Default for JournalOptions {
    fn default() -> Self {
        Self {
            quick_repair: false,
            cache_bytes: DEFAULT_CACHE_BYTES,
            keyring: None,
        }
    }
}

/// The journal. Cheap to clone; all clones share one database and one writer.
/// When the last clone is dropped, queued commits finish, the writer thread
/// ends and the file lock is released.
#[derive(Clone)]
pub struct Journal {
    db: Arc<Database>,
    writer: Arc<WriterHandle>,
    keyring: Keyring,
}

struct WriterHandle {
    sender: Option<mpsc::Sender<Request>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for WriterHandle {
    fn drop(&mut self) {
        // Closing the channel ends the writer loop once the queue is drained.
        self.sender.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").finish_non_exhaustive()
    }
}

pub(crate) fn decode<T: DeserializeOwned>(
    table: &'static str,
    key: &str,
    bytes: &[u8],
) -> Result<T, StorageError> {
    serde_json::from_slice(bytes).map_err(|e| StorageError::Corrupt {
        table,
        key: key.to_owned(),
        message: e.to_string(),
    })
}

/// Checks (or, for a new journal, records) the journal format inside the
/// opening transaction.
fn stamp_format(
    txn: &redb::WriteTransaction,
    path: &Path,
    keyring: &Keyring,
) -> Result<(), StorageError> {
    let mut meta = txn.open_table(META)?;
    let found = meta.get(FORMAT_KEY)?.map(|v| v.value());
    match found {
        Some(JOURNAL_FORMAT) => Ok(()),
        Some(older @ (FORMAT_WITHOUT_LOG | FORMAT_UNSEALED)) => {
            drop(meta);
            let rows = seal_existing_rows(txn, keyring)?;
            txn.open_table(META)?.insert(FORMAT_KEY, JOURNAL_FORMAT)?;
            tracing::info!(
                path = %path.display(),
                rows,
                "journal format {older} stamped {JOURNAL_FORMAT}: its transcript, checkpoint, frame, \
                 suspension and open-turn rows were sealed as they are now (from now on an edit \
                 of them is detected)"
            );
            Ok(())
        }
        Some(other) => Err(StorageError::Format {
            path: path.display().to_string(),
            found: Some(other),
            expected: JOURNAL_FORMAT,
            hint: "use the berth version that wrote it, or start with an empty --data-dir",
        }),
        None => {
            let used = txn.open_table(SESSIONS)?.first()?.is_some()
                || txn.open_table(EVENTS)?.first()?.is_some();
            if used {
                return Err(StorageError::Format {
                    path: path.display().to_string(),
                    found: None,
                    expected: JOURNAL_FORMAT,
                    hint: "it predates hash chains and signed receipts and is not migrated; keep it with the berth that wrote it, or move it aside and start with an empty --data-dir",
                });
            }
            meta.insert(FORMAT_KEY, JOURNAL_FORMAT)?;
            Ok(())
        }
    }
}

/// Seals every not yet sealed row of the sealed tables (a journal of an
/// older format, opened for writing); returns how many.
fn seal_existing_rows(
    txn: &redb::WriteTransaction,
    keyring: &Keyring,
) -> Result<u64, StorageError> {
    let unsealed = |row: &[u8]| row.first() != Some(&sealed::SEAL_VERSION);
    let mut count = 0;
    for (def, name) in [
        (TRANSCRIPTS, "transcript_messages"),
        (CHECKPOINTS, "checkpoints"),
    ] {
        let mut table = txn.open_table(def)?;
        let mut rows: Vec<(String, u64, Vec<u8>)> = Vec::new();
        for entry in table.iter()? {
            let (k, v) = entry?;
            if unsealed(v.value()) {
                let (session, index) = k.value();
                rows.push((session.to_owned(), index, v.value().to_vec()));
            }
        }
        for (session, index, value) in rows {
            let row = sealed::seal(keyring, name, &session, index, &value);
            table.insert((session.as_str(), index), row.as_slice())?;
            count += 1;
        }
    }
    for (def, name) in [
        (FRAMES, "frames"),
        (SUSPENSIONS, "suspensions"),
        (OPEN_TURNS, "open_turns"),
    ] {
        let mut table = txn.open_table(def)?;
        let mut rows: Vec<(String, Vec<u8>)> = Vec::new();
        for entry in table.iter()? {
            let (k, v) = entry?;
            if unsealed(v.value()) {
                rows.push((k.value().to_owned(), v.value().to_vec()));
            }
        }
        for (session, value) in rows {
            let row = sealed::seal(keyring, name, &session, sealed::NO_INDEX, &value);
            table.insert(session.as_str(), row.as_slice())?;
            count += 1;
        }
    }
    Ok(count)
}

impl Journal {
    /// Opens (or creates) the journal file at `path` and starts its writer.
    /// A file left by a crashed process is repaired by redb on open, and the
    /// groups its commit log (`journal.log` beside it) holds beyond the file
    /// are replayed into it. A new journal is stamped with [`JOURNAL_FORMAT`].
    ///
    /// # Errors
    /// [`StorageError::Open`] when the file or its commit log cannot be
    /// opened (bad path, permissions, or another process holds it);
    /// [`StorageError::Corrupt`] (table `commit_log`) when the log cannot be
    /// replayed, or is missing after a crash (it may have held acknowledged
    /// groups; see `commit_log::check_present`); [`StorageError::Format`]
    /// for a journal of another format; [`StorageError::Keys`] when no
    /// keyring was given and the key file cannot be loaded or created.
    pub fn open(path: &Path, options: JournalOptions) -> Result<Self, StorageError> {
        let open_err = |message: String| StorageError::Open {
            path: path.display().to_string(),
            message,
        };
        let keyring = match options.keyring {
            Some(keyring) => keyring,
            None => Keyring::load_or_create(
                path.parent().unwrap_or_else(|| Path::new(".")),
                chrono::Utc::now(),
            )?,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            crate::private::ensure_dir(dir).map_err(|e| open_err(e.to_string()))?;
        }
        let file = crate::private::open(
            path,
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
        )
        .map_err(|e| open_err(e.to_string()))?;
        let db = redb::backends::FileBackend::new(file)
            .and_then(|backend| {
                redb::Builder::new()
                    .set_cache_size(options.cache_bytes)
                    .create_with_backend(backend)
            })
            .map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => open_err(
                "another process holds it; stop the other berth using this data dir, or pass another --data-dir"
                    .into(),
            ),
            other => open_err(other.to_string()),
        })?;
        // Create every table so reads never meet a missing one.
        let txn = db.begin_write().map_err(|e| open_err(e.to_string()))?;
        txn.open_table(EXTERNAL_EVENTS)
            .map_err(|e| open_err(e.to_string()))?;
        txn.open_table(META).map_err(|e| open_err(e.to_string()))?;
        for table in [
            SESSIONS,
            CHAIN_HEADS,
            FRAMES,
            OPEN_TURNS,
            SUSPENSIONS,
            RESUME_CLAIMS,
            WAKEUPS,
            SCHEDULES,
        ] {
            txn.open_table(table).map_err(|e| open_err(e.to_string()))?;
        }
        for table in [EVENTS, TRANSCRIPTS, CHECKPOINTS] {
            txn.open_table(table).map_err(|e| open_err(e.to_string()))?;
        }
        stamp_format(&txn, path, &keyring)?;
        let log_path = commit_log::path_beside(path);
        {
            // Before the log file is created again below.
            let mut meta = txn.open_table(META)?;
            let in_use = meta
                .get(commit_log::LOG_IN_USE_KEY)?
                .is_some_and(|v| v.value() == 1);
            commit_log::check_present(&log_path, in_use)
                .map_err(|e| writer::log_error(&log_path, e))?;
            meta.insert(commit_log::LOG_IN_USE_KEY, 1)?;
        }
        txn.commit().map_err(|e| open_err(e.to_string()))?;
        let applied = writer::applied_seq(&db)?;
        let (mut log, records) =
            CommitLog::open(&log_path, applied).map_err(|e| writer::log_error(&log_path, e))?;
        let last = writer::replay(&db, &keyring, &records)?;
        let last = writer::start_lineage(&db, last, options.quick_repair)?;
        if log.len() > 0 {
            // Every record is in redb now (durably): the log starts over.
            log.clear().map_err(|e| StorageError::Open {
                path: log_path.display().to_string(),
                message: e.to_string(),
            })?;
        }
        let db = Arc::new(db);
        let (sender, thread) = writer::spawn(
            Arc::clone(&db),
            options.quick_repair,
            keyring.clone(),
            log,
            last + 1,
        );
        Ok(Self {
            db,
            writer: Arc::new(WriterHandle {
                sender: Some(sender),
                thread: Some(thread),
            }),
            keyring,
        })
    }

    /// The receipt keyring: signs receipts (actors build them) and verifies
    /// them.
    pub fn keyring(&self) -> &Keyring {
        &self.keyring
    }

    /// Commits `batch` atomically through the group-commit writer.
    ///
    /// **Durable on return:** when this returns `Ok`, every write of the batch
    /// is on disk (fsynced) and survives SIGKILL. Returns the event ids assigned
    /// to the batch's appends, in order.
    ///
    /// # Errors
    /// [`StorageError`] when the commit failed: nothing of the batch was written.
    /// In particular [`StorageError::Fenced`] for a [fenced](Batch::fenced_by_turn)
    /// batch whose turn is no longer open, and [`StorageError::AlreadyClaimed`]
    /// for a batch whose [claim](Batch::claim) lost to an earlier one.
    pub async fn commit(&self, batch: Batch) -> Result<Vec<EventId>, StorageError> {
        self.submit(batch).await?.durable().await
    }

    /// Queues `batch` for the next group commit and returns once it is
    /// queued (waiting only for room in the writer's queue), not once it is
    /// durable: await [`Queued::durable`] for what [`Journal::commit`]
    /// returns. Batches commit in the order they were queued, so a caller
    /// that queues while holding a lock orders its write before those of
    /// the lock's later holders. Dropping the [`Queued`] does not cancel the
    /// write.
    ///
    /// # Errors
    /// [`StorageError::WriterStopped`].
    pub async fn submit(&self, mut batch: Batch) -> Result<Queued, StorageError> {
        if batch.is_empty() {
            return Ok(Queued(None));
        }
        batch.encode();
        let (ack, done) = oneshot::channel();
        self.sender()?
            .send(Request {
                batch,
                ack,
                checkpoint: false,
            })
            .await
            .map_err(|_| StorageError::WriterStopped)?;
        Ok(Queued(Some(done)))
    }

    /// Queues `batch` for the next group commit from a thread outside the
    /// async runtime (the wake-up claimer), waiting only for room in the
    /// writer's queue, not for the commit: the returned receiver gets what
    /// [`Journal::commit`] would return, once the batch is durable (or
    /// refused). Dropping the receiver does not cancel the write.
    ///
    /// # Errors
    /// [`StorageError::WriterStopped`].
    ///
    /// # Panics
    /// When called on an async runtime thread (it may block).
    pub fn submit_blocking(
        &self,
        mut batch: Batch,
    ) -> Result<oneshot::Receiver<Result<Vec<EventId>, StorageError>>, StorageError> {
        batch.encode();
        let (ack, done) = oneshot::channel();
        self.sender()?
            .blocking_send(Request {
                batch,
                ack,
                checkpoint: false,
            })
            .map_err(|_| StorageError::WriterStopped)?;
        Ok(done)
    }

    /// Waits until every write acknowledged so far is in the redb file
    /// itself (a durable redb commit) and the commit log is empty, as the
    /// writer does on its own after 100 ms idle and when the journal closes.
    /// A server calls this as it stops, so that the next start has nothing
    /// to replay even if the process is ended before the journal is
    /// dropped.
    ///
    /// # Errors
    /// [`StorageError`] when the durable commit failed (the log still holds
    /// every group: nothing is lost).
    pub async fn flush_log(&self) -> Result<(), StorageError> {
        let (ack, done) = oneshot::channel();
        self.sender()?
            .send(Request {
                batch: Batch::new(),
                ack,
                checkpoint: true,
            })
            .await
            .map_err(|_| StorageError::WriterStopped)?;
        done.await
            .map_err(|_| StorageError::WriterStopped)?
            .map(drop)
    }

    /// The writer's queue, unless the writer was stopped.
    fn sender(&self) -> Result<&mpsc::Sender<Request>, StorageError> {
        self.writer
            .sender
            .as_ref()
            .ok_or(StorageError::WriterStopped)
    }

    /// Reads sealed row `key` of `def` (see `sealed.rs`), its seal checked.
    fn get_sealed<T: DeserializeOwned>(
        &self,
        def: TableDefinition<&str, &[u8]>,
        name: &'static str,
        key: &str,
    ) -> Result<Option<T>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(def)?;
        match table.get(key)? {
            Some(v) => {
                let value =
                    sealed::open_row(&self.keyring, name, key, sealed::NO_INDEX, v.value())?;
                Ok(Some(decode(name, key, value)?))
            }
            None => Ok(None),
        }
    }

    fn get<T: DeserializeOwned>(
        &self,
        def: TableDefinition<&str, &[u8]>,
        name: &'static str,
        key: &str,
    ) -> Result<Option<T>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(def)?;
        match table.get(key)? {
            Some(v) => Ok(Some(decode(name, key, v.value())?)),
            None => Ok(None),
        }
    }

    /// The session's record. Reads committed state only.
    ///
    /// # Errors
    /// [`StorageError`] on I/O failure or an undecodable record.
    pub fn session(&self, id: &SessionId) -> Result<Option<SessionRecord>, StorageError> {
        self.get(SESSIONS, "sessions", id.as_str())
    }

    /// Up to `limit` session records in id order, starting after `after`.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn sessions(
        &self,
        after: Option<&SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(SESSIONS)?;
        let mut range = match after {
            Some(a) => table.range::<&str>((
                std::ops::Bound::Excluded(a.as_str()),
                std::ops::Bound::Unbounded,
            ))?,
            None => table.range::<&str>(..)?,
        };
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(entry) = range.next() else { break };
            let (k, v) = entry?;
            out.push(decode("sessions", k.value(), v.value())?);
        }
        Ok(out)
    }

    /// The session's events with ids greater than `after`, in order.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn events(
        &self,
        id: &SessionId,
        after: EventId,
    ) -> Result<Vec<(EventId, EventRecord)>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(EVENTS)?;
        let start = after.saturating_add(1);
        let mut out = Vec::new();
        for entry in table.range((id.as_str(), start)..=(id.as_str(), u64::MAX))? {
            let (k, v) = entry?;
            let event_id = k.value().1;
            let key = format!("{id}/{event_id}");
            let row = chain::split_row(v.value()).map_err(|message| StorageError::Corrupt {
                table: "events",
                key: key.clone(),
                message,
            })?;
            out.push((event_id, decode("events", &key, row.json)?));
        }
        Ok(out)
    }

    /// At most `limit` of the session's events with ids greater than
    /// `after`, in order (a page of [`Journal::events`]: a reader streams a
    /// long log page by page instead of holding it whole).
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn events_page(
        &self,
        id: &SessionId,
        after: EventId,
        limit: usize,
    ) -> Result<Vec<(EventId, EventRecord)>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(EVENTS)?;
        let start = after.saturating_add(1);
        let mut out = Vec::new();
        for entry in table
            .range((id.as_str(), start)..=(id.as_str(), u64::MAX))?
            .take(limit)
        {
            let (k, v) = entry?;
            let event_id = k.value().1;
            let key = format!("{id}/{event_id}");
            let row = chain::split_row(v.value()).map_err(|message| StorageError::Corrupt {
                table: "events",
                key: key.clone(),
                message,
            })?;
            out.push((event_id, decode("events", &key, row.json)?));
        }
        Ok(out)
    }

    /// The session's last event id (0 when it has none).
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn last_event_id(&self, id: &SessionId) -> Result<EventId, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(EVENTS)?;
        let last = table
            .range((id.as_str(), 0)..=(id.as_str(), u64::MAX))?
            .next_back();
        Ok(match last {
            Some(entry) => entry?.0.value().1,
            None => 0,
        })
    }

    /// The session's transcript as of its last sealed turn (empty when none).
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn transcript(&self, id: &SessionId) -> Result<Vec<Message>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(TRANSCRIPTS)?;
        let mut out = Vec::new();
        for entry in table.range((id.as_str(), 0)..=(id.as_str(), u64::MAX))? {
            let (k, v) = entry?;
            let index = k.value().1;
            let value = sealed::open_row(
                &self.keyring,
                "transcript_messages",
                id.as_str(),
                index,
                v.value(),
            )?;
            out.push(decode(
                "transcript_messages",
                &format!("{id}/{index}"),
                value,
            )?);
        }
        Ok(out)
    }

    /// Number of messages in the session's transcript (the index the next one gets).
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn transcript_len(&self, id: &SessionId) -> Result<u64, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(TRANSCRIPTS)?;
        let last = table
            .range((id.as_str(), 0)..=(id.as_str(), u64::MAX))?
            .next_back();
        Ok(match last {
            Some(entry) => entry?.0.value().1 + 1,
            None => 0,
        })
    }

    /// The session's checkpoint number `seq` (from 1), if it exists.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn checkpoint(
        &self,
        id: &SessionId,
        seq: u64,
    ) -> Result<Option<TurnCheckpoint>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(CHECKPOINTS)?;
        match table.get((id.as_str(), seq))? {
            Some(v) => {
                let value =
                    sealed::open_row(&self.keyring, "checkpoints", id.as_str(), seq, v.value())?;
                Ok(Some(decode("checkpoints", &format!("{id}/{seq}"), value)?))
            }
            None => Ok(None),
        }
    }

    /// The latest frame of the session's open turn, if it checkpointed one.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn frame(&self, id: &SessionId) -> Result<Option<Frame>, StorageError> {
        self.get_sealed(FRAMES, "frames", id.as_str())
    }

    /// The session's open (unsealed) turn, if any.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn open_turn(&self, id: &SessionId) -> Result<Option<OpenTurn>, StorageError> {
        self.get_sealed(OPEN_TURNS, "open_turns", id.as_str())
    }

    /// Every open turn of every session (the turns to seal after a crash).
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn open_turns(&self) -> Result<Vec<OpenTurn>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(OPEN_TURNS)?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (k, v) = entry?;
            let value = sealed::open_row(
                &self.keyring,
                "open_turns",
                k.value(),
                sealed::NO_INDEX,
                v.value(),
            )?;
            out.push(decode("open_turns", k.value(), value)?);
        }
        Ok(out)
    }

    /// The session's suspension, if it is parked. Reads committed state only.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn suspension(&self, id: &SessionId) -> Result<Option<Suspension>, StorageError> {
        self.get_sealed(SUSPENSIONS, "suspensions", id.as_str())
    }

    /// Every stored suspension, in session id order (the parked sessions to
    /// restore at start-up and to schedule).
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn suspensions(&self) -> Result<Vec<Suspension>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(SUSPENSIONS)?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (k, v) = entry?;
            let value = sealed::open_row(
                &self.keyring,
                "suspensions",
                k.value(),
                sealed::NO_INDEX,
                v.value(),
            )?;
            out.push(decode("suspensions", k.value(), value)?);
        }
        Ok(out)
    }

    /// The claim on suspension `handle`, if one was committed (the handle is
    /// then used up). Reads committed state only.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn resume_claim(&self, handle: &str) -> Result<Option<ResumeClaim>, StorageError> {
        self.get(RESUME_CLAIMS, "resume_claims", handle)
    }

    /// Every stored wake-up, in session id order.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn wakeups(&self) -> Result<Vec<Wakeup>, StorageError> {
        let mut out = Vec::new();
        self.for_each_wakeup(|w| out.push(w))?;
        Ok(out)
    }

    /// Calls `f` with every stored wake-up, in session id order, one at a
    /// time (what the scheduler arms at start-up: a million of them are
    /// never all decoded at once). Returns how many there were.
    ///
    /// # Errors
    /// As [`Journal::session`]; [`StorageError::Corrupt`] stops at the first
    /// row that does not decode.
    pub fn for_each_wakeup(&self, mut f: impl FnMut(Wakeup)) -> Result<u64, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(WAKEUPS)?;
        let mut count = 0;
        for entry in table.iter()? {
            let (k, v) = entry?;
            f(decode("wakeups", k.value(), v.value())?);
            count += 1;
        }
        Ok(count)
    }

    /// The session's stored wake-up, if its suspension has one (what a due
    /// timer or a matching event resolves against). Reads committed state
    /// only.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn wakeup(&self, id: &SessionId) -> Result<Option<Wakeup>, StorageError> {
        self.get(WAKEUPS, "wakeups", id.as_str())
    }

    /// External events with sequence numbers above `after`, in order.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn external_events_after(
        &self,
        after: u64,
    ) -> Result<Vec<(u64, ExternalEvent)>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(EXTERNAL_EVENTS)?;
        let mut out = Vec::new();
        for entry in table.range(after.saturating_add(1)..)? {
            let (k, v) = entry?;
            out.push((
                k.value(),
                decode("external_events", &k.value().to_string(), v.value())?,
            ));
        }
        Ok(out)
    }

    /// A counter from table `meta` (0 when never set).
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn meta(&self, key: &str) -> Result<u64, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(META)?;
        Ok(table.get(key)?.map_or(0, |v| v.value()))
    }

    /// Every standing schedule, by id.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn schedules(&self) -> Result<Vec<Schedule>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(SCHEDULES)?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (k, v) = entry?;
            out.push(decode("schedules", k.value(), v.value())?);
        }
        Ok(out)
    }

    /// One standing schedule.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn schedule(&self, schedule_id: &str) -> Result<Option<Schedule>, StorageError> {
        self.get(SCHEDULES, "schedules", schedule_id)
    }

    /// Row counts for the `berth_sessions` gauge: sessions, suspended
    /// sessions and open (running) turns, from committed state. Each count
    /// is O(1) (redb keeps table lengths in its B-tree headers), so a
    /// metrics scrape stays cheap with a million sessions.
    ///
    /// # Errors
    /// As [`Journal::session`].
    pub fn counts(&self) -> Result<JournalCounts, StorageError> {
        use redb::ReadableTableMetadata;
        let txn = self.db.begin_read()?;
        Ok(JournalCounts {
            sessions: txn.open_table(SESSIONS)?.len()?,
            suspended: txn.open_table(SUSPENSIONS)?.len()?,
            open_turns: txn.open_table(OPEN_TURNS)?.len()?,
        })
    }
}

/// Row counts of the journal (see [`Journal::counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalCounts {
    /// Sessions ever created (closed ones included).
    pub sessions: u64,
    /// Sessions parked with a suspension.
    pub suspended: u64,
    /// Turns running (started and not yet sealed or parked).
    pub open_turns: u64,
}
