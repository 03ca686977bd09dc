//! Reading a journal offline, without a server: `berth verify` and
//! `berth replay` open the file read-only and never write to it.
//!
//! A journal left by a killed process cannot be read as it is: redb needs
//! to repair the file (no clean shutdown, no quick-repair), or its commit
//! log holds acknowledged groups the file does not have yet (see
//! `commit_log`). It is then repaired, and the log replayed, in a temporary
//! copy (removed afterwards); the data dir is still not touched. A journal a
//! running berth holds is refused: stop the server first.

use std::path::{Path, PathBuf};

use berth_runtime::ids::SessionId;
use redb::{Database, ReadOnlyDatabase, ReadTransaction, ReadableDatabase};

use crate::chain;
use crate::commit_log;
use crate::error::StorageError;
use crate::journal::{FORMAT_KEY, FORMAT_UNSEALED, FORMAT_WITHOUT_LOG, JOURNAL_FORMAT};
use crate::keyring::Keyring;
use crate::records::SessionRecord;
use crate::tables::{EVENTS, META, SESSIONS};
use crate::writer;

/// A journal file opened for reading only.
pub(crate) enum Opened {
    /// Opened in place, read-only.
    ReadOnly(ReadOnlyDatabase),
    /// Repaired and opened in a temporary copy (the original needed crash
    /// repair or a replay of its commit log); the copy goes when this is
    /// dropped, after the database.
    Repaired {
        /// The copy, opened.
        db: Database,
        /// Removes the copy on drop.
        _copy: TempCopy,
    },
}

impl Opened {
    /// Opens `path` read-only (or a repaired copy; see the module docs).
    /// `verb` names the command in the error for a held journal. A replayed
    /// log's chain heads are signed with `keyring`, or with a throwaway key
    /// when none is given (for readers that do not check heads).
    ///
    /// # Errors
    /// [`StorageError::Open`] when there is no journal at `path` or a running
    /// berth holds it; [`StorageError::Corrupt`] (table `commit_log`) when
    /// its commit log cannot be replayed, or is missing after a crash.
    pub(crate) fn open(
        path: &Path,
        verb: &str,
        keyring: Option<&Keyring>,
    ) -> Result<Self, StorageError> {
        let open_err = |message: String| StorageError::Open {
            path: path.display().to_string(),
            message,
        };
        if !path.is_file() {
            return Err(open_err(
                "no journal file there (pass the --data-dir a berth served)".into(),
            ));
        }
        let log_path = commit_log::path_beside(path);
        let file = crate::private::open_read_only(path).map_err(|e| open_err(e.to_string()))?;
        let opened = redb::backends::FileBackend::new(file)
            .and_then(|backend| redb::Builder::new().open_read_only_with_backend(backend));
        match opened {
            Ok(db) => {
                let (applied, log) = log_beside(&db, &log_path)?;
                if log.last().is_none_or(|r| r.seq <= applied) {
                    return Ok(Self::ReadOnly(db));
                }
                drop(db);
            }
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(open_err(format!(
                    "a running berth holds it; stop `berth serve` on this data dir, then {verb}"
                )))
            }
            // Killed without a clean shutdown: repaired in the copy below.
            Err(redb::DatabaseError::RepairAborted) => {}
            Err(e) => return Err(open_err(e.to_string())),
        }
        // Repair a copy, and replay the log into it, not into the original.
        let copy = TempCopy::of(path).map_err(|e| open_err(e.to_string()))?;
        let db = Database::create(&copy.0).map_err(|e| open_err(e.to_string()))?;
        let (_, log) = log_beside(&db, &log_path)?;
        if !log.is_empty() {
            let throwaway;
            let keyring = match keyring {
                Some(keyring) => keyring,
                None => {
                    throwaway = Keyring::from_keys(vec![("replay".into(), vec![0; 32])])?;
                    &throwaway
                }
            };
            writer::replay(&db, keyring, &log)?;
        }
        Ok(Self::Repaired { db, _copy: copy })
    }

    /// Whether the file needed crash repair (done in a temporary copy).
    pub(crate) fn repaired(&self) -> bool {
        matches!(self, Self::Repaired { .. })
    }

    /// A read transaction.
    ///
    /// # Errors
    /// [`StorageError::Database`] on I/O failure.
    pub(crate) fn begin_read(&self) -> Result<ReadTransaction, StorageError> {
        Ok(match self {
            Self::ReadOnly(db) => db.begin_read()?,
            Self::Repaired { db, .. } => db.begin_read()?,
        })
    }

    /// Checks the journal's format inside `txn`; returns it.
    ///
    /// # Errors
    /// [`StorageError::Format`] (with `hint`) for a journal of another format.
    pub(crate) fn check_format(
        txn: &ReadTransaction,
        path: &Path,
        hint: &'static str,
    ) -> Result<u64, StorageError> {
        let meta = txn.open_table(META)?;
        let format = meta.get(FORMAT_KEY)?.map(|v| v.value());
        if !matches!(
            format,
            Some(JOURNAL_FORMAT | FORMAT_UNSEALED | FORMAT_WITHOUT_LOG)
        ) {
            return Err(StorageError::Format {
                path: path.display().to_string(),
                found: format,
                expected: JOURNAL_FORMAT,
                hint,
            });
        }
        Ok(format.unwrap_or_default())
    }
}

/// The last log seq `db` holds and the records of its log at `log_path`,
/// read without changing anything.
///
/// # Errors
/// [`StorageError::Corrupt`] (table `commit_log`) for a log damaged in the
/// middle or missing while `db` says it was in use; [`StorageError::Open`]
/// when it cannot be read; [`StorageError::Database`] on I/O failure.
fn log_beside(
    db: &impl ReadableDatabase,
    log_path: &Path,
) -> Result<(u64, Vec<commit_log::Record>), StorageError> {
    commit_log::check_present(log_path, writer::log_in_use(db)?)
        .map_err(|e| writer::log_error(log_path, e))?;
    let applied = writer::applied_seq(db)?;
    let log = commit_log::read(log_path, applied).map_err(|e| writer::log_error(log_path, e))?;
    Ok((applied, log))
}

/// A temporary copy of the journal, removed on drop.
pub(crate) struct TempCopy(PathBuf);

impl TempCopy {
    fn of(path: &Path) -> std::io::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let copy = std::env::temp_dir().join(format!(
            "berth-readonly-{}-{nanos}.redb",
            std::process::id()
        ));
        let mut from = crate::private::open_read_only(path)?;
        let mut to = crate::private::open(
            &copy,
            std::fs::OpenOptions::new().write(true).create_new(true),
        )?;
        let copied = Self(copy);
        std::io::copy(&mut from, &mut to)?;
        Ok(copied)
    }
}

impl Drop for TempCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One stored event row of a session, as it is on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// The event id (seq), from 1.
    pub seq: u64,
    /// The row's JSON (after its chain header): the event record, plus the
    /// replay tape it carries (`berth_runtime::tape::TapedRecord`).
    pub json: Vec<u8>,
}

/// A session's log read offline.
#[derive(Debug, Clone)]
pub struct SessionLog {
    /// The session record (its current state), when the session exists.
    pub record: Option<SessionRecord>,
    /// Every event row, in seq order.
    pub events: Vec<StoredEvent>,
    /// Whether the journal needed crash repair or a replay of its commit
    /// log (read in a temporary copy).
    pub repaired_copy: bool,
}

/// Reads session `id`'s record and event rows from the journal at `path`,
/// read-only (see the module docs). Rows are returned as stored; their hash
/// chain is not checked here (`verify::verify_session` does that).
///
/// # Errors
/// [`StorageError::Open`] (no journal, or a running berth holds it),
/// [`StorageError::Format`], [`StorageError::Corrupt`] for a row without a
/// chain header or an undecodable session record, [`StorageError::Database`].
pub fn read_session(path: &Path, id: &SessionId) -> Result<SessionLog, StorageError> {
    let opened = Opened::open(path, "replay", None)?;
    let txn = opened.begin_read()?;
    Opened::check_format(
        &txn,
        path,
        "berth replay reads journals of this berth's format only",
    )?;
    let sessions = txn.open_table(SESSIONS)?;
    let record = match sessions.get(id.as_str())? {
        Some(v) => Some(
            serde_json::from_slice(v.value()).map_err(|e| StorageError::Corrupt {
                table: "sessions",
                key: id.0.clone(),
                message: e.to_string(),
            })?,
        ),
        None => None,
    };
    let table = txn.open_table(EVENTS)?;
    let mut events = Vec::new();
    for entry in table.range((id.as_str(), 0)..=(id.as_str(), u64::MAX))? {
        let (k, v) = entry?;
        let seq = k.value().1;
        let row = chain::split_row(v.value()).map_err(|message| StorageError::Corrupt {
            table: "events",
            key: format!("{id}/{seq}"),
            message,
        })?;
        events.push(StoredEvent {
            seq,
            json: row.json.to_vec(),
        });
    }
    Ok(SessionLog {
        record,
        events,
        repaired_copy: opened.repaired(),
    })
}
