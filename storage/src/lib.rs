//! # berth-storage
//!
//! The journal: one redb file in the data directory holding every session's
//! record, event log, latest frame, transcript, open-turn marker, checkpoints
//! and suspension, plus the one-time resume claims on suspension handles
//! (`DESIGN.md`, "The journal").
//!
//! Writes go through one writer thread that group-commits: it drains every
//! pending [`Batch`] from all sessions, makes them durable together (one
//! record appended to the commit log beside the file and fsynced, then one
//! redb write transaction; see `commit_log`) and acknowledges each only after
//! that ([`Journal::commit`]).
//! Reads ([`Journal::session`], [`Journal::events`], …) use their own read
//! transactions and never wait for the writer.
//!
//! A batch can carry preconditions checked inside the writer's transaction,
//! so they hold against every other commit, including those of the same group:
//! a turn fence ([`Batch::fenced_by_turn`]) and a claim on a suspension handle
//! ([`Batch::claim`]) that at most one batch ever wins. A batch whose
//! precondition fails writes nothing.
//!
//! Integrity (DESIGN.md, "The journal"): receipts are signed with the
//! [`Keyring`] (HMAC-SHA256, key id beside every MAC, keys persisted in the
//! data dir or given in `BERTH_RECEIPT_KEYS`), each session's event log is a
//! hash chain anchored by a signed chain head, the rows a session reloads
//! into a model's context (transcript, checkpoints, frames, suspensions, open
//! turns) are sealed with a MAC that every read checks (`sealed.rs`), and
//! [`verify::verify_journal`] (`berth verify`) checks all three, read-only.
//!
//! Crash guarantee: a batch whose `commit` returned `Ok` survives SIGKILL of the
//! process (tested in `tests/kill_writer.rs`); a batch that did not return is
//! either wholly present or wholly absent after restart.

#![warn(missing_docs)]

mod batch;
mod chain;
mod commit_log;
mod error;
mod journal;
pub mod keyring;
pub mod readonly;
mod records;
mod sealed;
mod tables;
pub mod verify;
mod writer;

pub mod private;

pub use batch::Batch;
pub use error::StorageError;
pub use journal::{
    Journal, JournalCounts, JournalOptions, Queued, DEFAULT_CACHE_BYTES, JOURNAL_FORMAT,
};
pub use keyring::{KeyInfo, KeyOrigin, Keyring, KeyringError, SignatureError, KEY_FILE};
pub use records::{OpenTurn, SessionRecord, TurnCheckpoint};
pub use writer::{COMMIT_ERRORS_TOTAL, COMMIT_GROUP_SIZE, COMMIT_SECONDS};
