//! Row shapes stored in the journal (JSON-encoded).

use std::path::PathBuf;

use berth_runtime::budget::{BudgetLimits, Spend};
use berth_runtime::history::Message;
use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::suspension::SuspendRequest;
use berth_runtime::tools::FileChange;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A session's durable record (table `sessions`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The session id.
    pub session_id: SessionId,
    /// Working directory (absolute).
    pub cwd: PathBuf,
    /// Extra directories the file tools may use (absolute).
    #[serde(default)]
    pub additional_directories: Vec<PathBuf>,
    /// MCP servers as given in `session/new` (ACP `McpServer` objects), stored
    /// for the tool layer.
    #[serde(default)]
    pub mcp_servers: Vec<Value>,
    /// Session mode id (ACP `currentModeId`).
    pub mode_id: String,
    /// Title, once the session has one (the first prompt's first line).
    #[serde(default)]
    pub title: Option<String>,
    /// When it was created.
    #[serde(with = "berth_runtime::clock::rfc3339")]
    pub created_at: DateTime<Utc>,
    /// When anything about it last changed.
    #[serde(with = "berth_runtime::clock::rfc3339")]
    pub updated_at: DateTime<Utc>,
    /// When it was closed; a closed session refuses prompts.
    #[serde(default)]
    #[serde(with = "berth_runtime::clock::rfc3339::option")]
    pub closed_at: Option<DateTime<Utc>>,
    /// How many turn checkpoints are applied; checkpoints above it were rolled
    /// back and can be redone (until the next turn discards them).
    #[serde(default)]
    pub checkpoint_head: u64,
    /// The session that spawned this one (nested sessions; `_meta.berth.parentSessionId`
    /// in `session/new`). Each session suspends and resumes on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_id: Option<SessionId>,
    /// Transcript index the model's context starts at: a resume with
    /// `continueTranscript: false` starts a fresh context (a digest of what
    /// came before, then the input) without deleting the transcript.
    #[serde(default)]
    pub context_from: u64,
    /// Labels for selecting sessions (`_meta.berth.labels` in `session/new`;
    /// the broadcast suspend and budget policies select by label).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// What the session's sealed turns spent (for budget policies).
    #[serde(default)]
    pub spend: Spend,
    /// Budget operators granted on top of the policies (resume input
    /// `{"budget": {...}}`; added up).
    #[serde(default, skip_serializing_if = "BudgetLimits::is_unlimited")]
    pub budget_grant: BudgetLimits,
    /// A suspension requested while a turn runs and not yet committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend_request: Option<SuspendRequest>,
    /// The authenticated actor that created the session over a networked
    /// transport (`None` for a local client or a session created before
    /// creators were recorded). Besides the host owner, only the creator may
    /// close the session or revoke others' injections (issue 8, "Auth and
    /// roles").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

/// A turn checkpoint (table `checkpoints`, key `(session, seq)` with `seq`
/// from 1): what `session/rollback` undoes and `session/redo` re-applies
/// (`remote-session-control.md`, "Turn checkpoints").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnCheckpoint {
    /// `turn_<uuid>`: the id of the turn it captures.
    pub checkpoint_id: String,
    /// Transcript length before the turn.
    pub before_message_count: u64,
    /// Transcript length after it.
    pub after_message_count: u64,
    /// The turn's transcript messages (re-appended by redo).
    pub messages: Vec<Message>,
    /// Files the turn's tools changed, with their text before and after.
    pub files: Vec<FileChange>,
}

/// A turn that started and has not been sealed (table `open_turns`). After a
/// crash these are the turns to seal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenTurn {
    /// The session.
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// When it started.
    #[serde(with = "berth_runtime::clock::rfc3339")]
    pub started_at: DateTime<Utc>,
    /// The prompt as the model reads it, so a turn sealed before its first
    /// checkpoint still leaves its prompt in the transcript.
    #[serde(default)]
    pub prompt_text: String,
}
