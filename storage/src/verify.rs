//! `berth verify`: checks every session's hash chain and every signed receipt
//! of a journal, read-only (DESIGN.md, "The journal").
//!
//! For each session, in event order, [`verify_journal`] checks that
//!
//! 1. ids run 1, 2, 3, … without a gap (`sequence`: a dropped event);
//! 2. the row has its chain header (`row`);
//! 3. the row's own hash matches its bytes and position (`hash`: an edited,
//!    moved or swapped event);
//! 4. it chains to the previous row's hash (`chain`: the previous event was
//!    replaced by a self-consistent forgery);
//! 5. its JSON decodes (`decode`);
//! 6. a receipt it carries (`control_outcome`, `suspension_receipt`,
//!    `resumption_receipt`, `drain_decision_receipt`) verifies under the key
//!    its signature names (`signature`);
//!
//! and at the end that the signed chain head names the last event and its
//! hash (`head`: the tail was dropped, or the log was re-hashed without the
//! key). Then (format 4 on) that every row of the session the actor reloads
//! into a model's context — transcript, checkpoints, frame, suspension, open
//! turn — matches its seal (`seal`, naming the row; see `sealed.rs`). The
//! first failure is the session's verdict `tampered`, with its seq (or row)
//! and what failed; later events are not examined.
//!
//! The file is opened read-only (see [`crate::readonly`]): a journal left by
//! a killed process is repaired and read in a temporary copy, and the data
//! dir is still not touched. A journal a running berth holds is refused:
//! stop the server first.

use std::collections::HashMap;
use std::path::Path;

use berth_runtime::event::{EventRecord, SessionEvent};
use redb::ReadableTable;
use serde::Serialize;

use crate::chain::{self, ChainHead};
use crate::error::StorageError;
use crate::keyring::Keyring;
use crate::readonly::Opened;
use crate::sealed;
use crate::tables::{
    CHAIN_HEADS, CHECKPOINTS, EVENTS, FRAMES, OPEN_TURNS, SESSIONS, SUSPENSIONS, TRANSCRIPTS,
};

/// Which check an event failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// An event id is missing (dropped), or ids are out of order.
    Sequence,
    /// The row has no valid chain header.
    Row,
    /// The row's hash does not match its content and position (edited,
    /// moved or swapped).
    Hash,
    /// The row does not chain to its predecessor's hash.
    Chain,
    /// The event JSON does not decode.
    Decode,
    /// A receipt's signature does not verify.
    Signature,
    /// The chain head is missing, forged, or does not name the last event.
    Head,
    /// A transcript, checkpoint, frame, suspension or open-turn row does
    /// not match its seal (edited, moved, or written outside berth); the
    /// finding's `row` names it.
    Seal,
}

/// The first bad event of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The event id (seq) at which the check failed; for a [`Check::Seal`]
    /// finding, the session's last event (the rows are checked after the
    /// whole chain).
    pub seq: u64,
    /// For a [`Check::Seal`] finding, the row: `table/session` or
    /// `table/session/index` (`transcript_messages/sess_…/3`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub row: Option<String>,
    /// Which check.
    pub check: Check,
    /// What exactly.
    pub message: String,
}

impl Finding {
    /// Where it is, for the operator: `event 14`, or for a [`Check::Seal`]
    /// finding `row transcript_messages/sess_…/3`.
    pub fn location(&self) -> String {
        match &self.row {
            Some(row) => format!("row {row}"),
            None => format!("event {}", self.seq),
        }
    }
}

/// A session's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every check passed.
    Ok,
    /// A check failed; see `first_bad`.
    Tampered,
}

/// One session's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionReport {
    /// The session id.
    pub session_id: String,
    /// The verdict.
    pub status: Verdict,
    /// Events examined (up to and including the first bad one).
    pub events: u64,
    /// Signed receipts verified.
    pub receipts: u64,
    /// The first failure, when tampered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_bad: Option<Finding>,
}

/// The result of verifying one journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    /// The journal file.
    pub journal: String,
    /// Its format, as recorded in it (2: written before the commit log and
    /// not opened since; 3: before sealed rows, not opened since; 4: see
    /// `JOURNAL_FORMAT`).
    pub format: u64,
    /// Whether the rows a session reloads into a model's context were
    /// checked against their seals (format 4); a format-2 or 3 journal's
    /// rows are not covered until a berth opens it (which seals them).
    pub rows_covered: bool,
    /// The key ids verification used.
    pub keys: Vec<String>,
    /// Whether the file needed crash repair, done in a temporary copy.
    pub repaired_copy: bool,
    /// Per session, in session id order.
    pub sessions: Vec<SessionReport>,
    /// Sessions `ok`.
    pub ok: usize,
    /// Sessions `tampered`.
    pub tampered: usize,
}

impl VerifyReport {
    /// Whether every session verified.
    pub fn is_ok(&self) -> bool {
        self.tampered == 0
    }
}

/// Verifies every session of the journal at `path` with `keyring` (see the
/// module docs). Never writes to `path`.
///
/// # Errors
/// [`StorageError::Open`] when there is no journal at `path` or a running
/// berth holds it; [`StorageError::Format`] for a journal of another format;
/// [`StorageError::Database`] on I/O failure; [`StorageError::Corrupt`]
/// (table `journal`) when the file is damaged below the hash chain (a page
/// the database cannot read). Tampering is not an error: it is in the
/// report.
pub fn verify_journal(path: &Path, keyring: &Keyring) -> Result<VerifyReport, StorageError> {
    damage_as_error(|| verify_journal_unguarded(path, keyring))
}

/// Runs a read of a journal that may be damaged below the chain: redb
/// panics on some corrupted pages (an invalid UTF-8 key, an impossible
/// b-tree node) instead of returning an error. Such a panic becomes
/// [`StorageError::Corrupt`] on table `journal` (the default panic message
/// is kept off stderr meanwhile), so `berth verify` reports the damage
/// rather than crashing.
fn damage_as_error<T>(read: impl FnOnce() -> Result<T, StorageError>) -> Result<T, StorageError> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(read));
    std::panic::set_hook(hook);
    outcome.unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("no message");
        Err(StorageError::Corrupt {
            table: "journal",
            key: "(file structure)".into(),
            message: format!("the database could not read a damaged page ({message})"),
        })
    })
}

fn verify_journal_unguarded(path: &Path, keyring: &Keyring) -> Result<VerifyReport, StorageError> {
    let opened = Opened::open(path, "verify", Some(keyring))?;
    let txn = opened.begin_read()?;
    let format = Opened::check_format(&txn, path, FORMAT_HINT)?;
    let rows_covered = format >= SEALED_FROM;
    let mut rows = if rows_covered {
        check_rows(&txn, keyring, None)?
    } else {
        HashMap::new()
    };
    let events = txn.open_table(EVENTS)?;
    let heads = txn.open_table(CHAIN_HEADS)?;
    let sessions = txn.open_table(SESSIONS)?;
    let mut reports: Vec<SessionReport> = Vec::new();
    let mut current: Option<SessionCheck> = None;
    for entry in events.iter()? {
        let (key, value) = entry?;
        let (session, seq) = key.value();
        if current.as_ref().is_none_or(|c| c.session != session) {
            if let Some(done) = current.take() {
                let bad_row = rows.remove(&done.session);
                reports.push(done.finish(&heads, keyring, bad_row)?);
            }
            current = Some(SessionCheck::new(session));
        }
        if let Some(check) = current.as_mut() {
            check.event(seq, value.value(), keyring);
        }
    }
    if let Some(done) = current.take() {
        let bad_row = rows.remove(&done.session);
        reports.push(done.finish(&heads, keyring, bad_row)?);
    }
    // Sessions with a head but no event left (every event dropped), and
    // sessions with neither (created, nothing journaled yet).
    let mut others: Vec<String> = Vec::new();
    for entry in heads.iter()? {
        others.push(entry?.0.value().to_owned());
    }
    for entry in sessions.iter()? {
        others.push(entry?.0.value().to_owned());
    }
    // And sessions with nothing but a bad row.
    others.extend(rows.keys().cloned());
    others.sort();
    others.dedup();
    for session in others {
        if reports.iter().any(|r| r.session_id == session) {
            continue;
        }
        let bad_row = rows.remove(&session);
        reports.push(SessionCheck::new(&session).finish(&heads, keyring, bad_row)?);
    }
    reports.sort_by(|a, b| a.session_id.cmp(&b.session_id));
    let tampered = reports
        .iter()
        .filter(|r| r.status == Verdict::Tampered)
        .count();
    Ok(VerifyReport {
        journal: path.display().to_string(),
        format,
        rows_covered,
        keys: keyring.keys().into_iter().map(|k| k.id).collect(),
        repaired_copy: opened.repaired(),
        ok: reports.len() - tampered,
        tampered,
        sessions: reports,
    })
}

const FORMAT_HINT: &str = "berth verify checks journals with hash chains and signed receipts only";

/// Verifies one session of the journal at `path`: the same checks as
/// [`verify_journal`], on that session's events and chain head only (what
/// `berth replay --verify` runs first). A session the journal does not know
/// verifies `ok` with no events. Never writes to `path`.
///
/// # Errors
/// As [`verify_journal`].
pub fn verify_session(
    path: &Path,
    keyring: &Keyring,
    session: &str,
) -> Result<SessionReport, StorageError> {
    damage_as_error(|| verify_session_unguarded(path, keyring, session))
}

fn verify_session_unguarded(
    path: &Path,
    keyring: &Keyring,
    session: &str,
) -> Result<SessionReport, StorageError> {
    let opened = Opened::open(path, "verify", Some(keyring))?;
    let txn = opened.begin_read()?;
    let format = Opened::check_format(&txn, path, FORMAT_HINT)?;
    let bad_row = if format >= SEALED_FROM {
        check_rows(&txn, keyring, Some(session))?.remove(session)
    } else {
        None
    };
    let events = txn.open_table(EVENTS)?;
    let heads = txn.open_table(CHAIN_HEADS)?;
    let mut check = SessionCheck::new(session);
    for entry in events.range((session, 0)..=(session, u64::MAX))? {
        let (key, value) = entry?;
        check.event(key.value().1, value.value(), keyring);
    }
    check.finish(&heads, keyring, bad_row)
}

/// The first journal format whose context rows are sealed.
const SEALED_FROM: u64 = 4;

/// The first row failing its seal per session (`only`: that session's rows
/// alone), in table order transcript, checkpoints, frame, suspension, open
/// turn, then key order.
fn check_rows(
    txn: &redb::ReadTransaction,
    keyring: &Keyring,
    only: Option<&str>,
) -> Result<HashMap<String, Finding>, StorageError> {
    let mut found: HashMap<String, Finding> = HashMap::new();
    let mut note = |table: &str, session: &str, index: u64, row: &[u8]| {
        if found.contains_key(session) {
            return;
        }
        if let Err(message) = sealed::open(keyring, table, session, index, row) {
            found.insert(
                session.to_owned(),
                Finding {
                    seq: 0,
                    row: Some(format!("{table}/{}", sealed::row_key(session, index))),
                    check: Check::Seal,
                    message,
                },
            );
        }
    };
    for (def, name) in [
        (TRANSCRIPTS, "transcript_messages"),
        (CHECKPOINTS, "checkpoints"),
    ] {
        let table = txn.open_table(def)?;
        let range = match only {
            Some(s) => table.range((s, 0)..=(s, u64::MAX))?,
            None => table.iter()?,
        };
        for entry in range {
            let (k, v) = entry?;
            let (session, index) = k.value();
            note(name, session, index, v.value());
        }
    }
    for (def, name) in [
        (FRAMES, "frames"),
        (SUSPENSIONS, "suspensions"),
        (OPEN_TURNS, "open_turns"),
    ] {
        let table = txn.open_table(def)?;
        let range = match only {
            Some(s) => table.range(s..=s)?,
            None => table.iter()?,
        };
        for entry in range {
            let (k, v) = entry?;
            note(name, k.value(), sealed::NO_INDEX, v.value());
        }
    }
    Ok(found)
}

/// The running check of one session's log.
struct SessionCheck {
    session: String,
    /// The seq and hash of the last good event.
    last: u64,
    last_hash: [u8; 32],
    events: u64,
    receipts: u64,
    bad: Option<Finding>,
}

impl SessionCheck {
    fn new(session: &str) -> Self {
        Self {
            session: session.to_owned(),
            last: 0,
            last_hash: chain::GENESIS,
            events: 0,
            receipts: 0,
            bad: None,
        }
    }

    fn fail(&mut self, seq: u64, check: Check, message: String) {
        self.bad = Some(Finding {
            seq,
            row: None,
            check,
            message,
        });
    }

    fn event(&mut self, seq: u64, row: &[u8], keyring: &Keyring) {
        if self.bad.is_some() {
            return;
        }
        self.events += 1;
        let expected = self.last + 1;
        if seq != expected {
            return self.fail(
                expected,
                Check::Sequence,
                format!("event {expected} is missing: the next stored event is {seq} (dropped)"),
            );
        }
        let row = match chain::split_row(row) {
            Ok(row) => row,
            Err(message) => return self.fail(seq, Check::Row, message),
        };
        if chain::event_hash(&self.session, seq, &row.prev, row.json) != row.hash {
            return self.fail(
                seq,
                Check::Hash,
                "the event's bytes do not match its hash: it was edited, or moved here from another position".into(),
            );
        }
        if row.prev != self.last_hash {
            return if seq == 1 {
                self.fail(
                    1,
                    Check::Chain,
                    "the first event does not start the chain (it was forged)".into(),
                )
            } else {
                self.fail(
                    seq - 1,
                    Check::Chain,
                    format!("event {seq} was chained to a different event {}: this one was replaced (or event {seq} forged)", seq - 1),
                )
            };
        }
        let record: EventRecord = match serde_json::from_slice(row.json) {
            Ok(record) => record,
            Err(e) => {
                return self.fail(
                    seq,
                    Check::Decode,
                    format!("the event does not decode: {e}"),
                )
            }
        };
        let verified = match &record.event {
            SessionEvent::ControlOutcome(r) => Some(("control_outcome", keyring.verify(r))),
            SessionEvent::SuspensionReceipt(r) => Some(("suspension_receipt", keyring.verify(r))),
            SessionEvent::ResumptionReceipt(r) => Some(("resumption_receipt", keyring.verify(r))),
            SessionEvent::DrainDecisionReceipt(r) => {
                Some(("drain_decision_receipt", keyring.verify(r)))
            }
            _ => None,
        };
        match verified {
            Some((kind, Err(e))) => {
                return self.fail(
                    seq,
                    Check::Signature,
                    format!("the {kind}'s signature: {e}"),
                )
            }
            Some((_, Ok(()))) => self.receipts += 1,
            None => {}
        }
        self.last = seq;
        self.last_hash = row.hash;
    }

    fn finish(
        mut self,
        heads: &redb::ReadOnlyTable<&str, &[u8]>,
        keyring: &Keyring,
        bad_row: Option<Finding>,
    ) -> Result<SessionReport, StorageError> {
        if self.bad.is_none() {
            let stored = heads.get(self.session.as_str())?;
            match stored {
                None if self.last == 0 => {}
                None => self.fail(
                    self.last,
                    Check::Head,
                    "the session has events but no chain head (it was removed)".into(),
                ),
                Some(stored) => match serde_json::from_slice::<ChainHead>(stored.value()) {
                    Err(e) => self.fail(
                        self.last,
                        Check::Head,
                        format!("the chain head does not decode: {e}"),
                    ),
                    Ok(head) => self.head(&head, keyring),
                },
            }
        }
        if self.bad.is_none() {
            self.bad = bad_row.map(|bad| Finding {
                seq: self.last,
                ..bad
            });
        }
        Ok(SessionReport {
            session_id: self.session,
            status: if self.bad.is_some() {
                Verdict::Tampered
            } else {
                Verdict::Ok
            },
            events: self.events,
            receipts: self.receipts,
            first_bad: self.bad,
        })
    }

    fn head(&mut self, head: &ChainHead, keyring: &Keyring) {
        if let Err(e) = head.verify(keyring, &self.session) {
            return self.fail(
                head.seq,
                Check::Head,
                format!("the chain head's signature: {e}"),
            );
        }
        if head.seq > self.last {
            return self.fail(
                self.last + 1,
                Check::Sequence,
                format!(
                    "events {} to {} are missing: the signed chain head says the log ends at {} (dropped)",
                    self.last + 1,
                    head.seq,
                    head.seq
                ),
            );
        }
        if head.seq < self.last {
            return self.fail(
                head.seq + 1,
                Check::Head,
                format!(
                    "the signed chain head says the log ends at {}: the events after it were added outside berth",
                    head.seq
                ),
            );
        }
        if head.hash_bytes() != Some(self.last_hash) {
            self.fail(
                self.last,
                Check::Head,
                "the log was re-hashed: its last hash is not the one the signed chain head names"
                    .into(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic in the database's read path (what redb does on some damaged
    /// pages) is a typed `Corrupt` error naming the damage, not a crash;
    /// a normal result passes through.
    #[test]
    fn a_panicking_read_becomes_a_corrupt_journal_error() {
        let damaged = damage_as_error::<()>(|| panic!("entered unreachable code"));
        match damaged {
            Err(StorageError::Corrupt { table, message, .. }) => {
                assert_eq!(table, "journal");
                assert!(message.contains("entered unreachable code"), "{message}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert_eq!(damage_as_error(|| Ok(7)).ok(), Some(7));
    }
}
