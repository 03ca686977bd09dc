//! Storage errors.

use berth_runtime::suspension::{ResumeClaim, ResumeClaimKind};

/// How a claim kind reads in a message ("already resumed by …").
fn claim_verb(kind: ResumeClaimKind) -> &'static str {
    match kind {
        ResumeClaimKind::Resumed => "resumed",
        ResumeClaimKind::Cancelled => "cancelled",
        ResumeClaimKind::Failed => "failed",
    }
}

/// What can go wrong in the journal. Every variant means the operation did not
/// take effect (a failed commit leaves nothing of its batch behind).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    /// The database file could not be opened or created.
    #[error("cannot open journal {path}: {message}")]
    Open {
        /// The file.
        path: String,
        /// The underlying error.
        message: String,
    },
    /// redb failed a read or a commit.
    #[error("journal I/O failed: {0}")]
    Database(String),
    /// A stored value could not be decoded (corruption or a newer format).
    #[error("journal record {table}/{key} is unreadable: {message}")]
    Corrupt {
        /// Table name.
        table: &'static str,
        /// Key, for the operator.
        key: String,
        /// Decoder message.
        message: String,
    },
    /// A batch fenced by a turn that is no longer open; nothing was written.
    #[error("turn {turn_id} of session {session_id} is no longer open (it was sealed); the write was refused")]
    Fenced {
        /// The session.
        session_id: String,
        /// The fenced turn.
        turn_id: String,
    },
    /// A batch that completes a suspension
    /// ([`Batch::completing_suspension`](crate::Batch::completing_suspension))
    /// found it no longer the session's: another write completed, cancelled
    /// or replaced it first. Nothing was written.
    #[error("suspension {handle} of session {session_id} is no longer the session's (it was completed first); the write was refused")]
    SuspensionGone {
        /// The session.
        session_id: String,
        /// The suspension's handle.
        handle: String,
    },
    /// A batch claiming a suspension handle ([`Batch::claim`](crate::Batch::claim))
    /// lost: the handle was already claimed, by an earlier commit or by an
    /// earlier batch of the same group commit. Nothing of the batch was
    /// written. `existing` is the stored claim (who won, how, when).
    #[error(
        "suspension handle {handle} is used up: it was already {} by {} at {}; nothing was written",
        claim_verb(existing.kind), existing.actor, existing.claimed_at
    )]
    AlreadyClaimed {
        /// The handle.
        handle: String,
        /// The claim that won (boxed to keep the error small).
        existing: Box<ResumeClaim>,
    },
    /// The journal file was written by a berth with another journal format.
    #[error("journal {path} has format {}, this berth reads format {expected}: {hint}", found.map_or_else(|| "1 (no hash chain, unsigned receipts)".to_owned(), |f| f.to_string()))]
    Format {
        /// The file.
        path: String,
        /// The format found (`None`: a journal from before formats were
        /// recorded, format 1).
        found: Option<u64>,
        /// The format this berth reads.
        expected: u64,
        /// What to do.
        hint: &'static str,
    },
    /// The receipt keyring could not be loaded or created.
    #[error(transparent)]
    Keys(#[from] crate::keyring::KeyringError),
    /// The writer thread is gone (the process is shutting down).
    #[error("journal writer stopped")]
    WriterStopped,
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StorageError {
            fn from(e: $t) -> Self {
                StorageError::Database(e.to_string())
            }
        }
    )*};
}

from_redb!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);
