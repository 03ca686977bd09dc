//! Storage errors.

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
