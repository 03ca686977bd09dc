//! The execution frame: a turn's state as explicit, serializable program state
//! (`seeds/execution-suspension.md`, "Frame version 1"), never a coroutine stack.
//!
//! The engine checkpoints a frame at each phase boundary; the journal keeps the
//! latest one per open turn. After a crash it is what seals the turn (the
//! transcript keeps the messages the frame holds); a suspension persists it and a
//! resume continues from it ([`crate::engine::resume_turn`]).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::history::{Message, ToolCallRequest};
use crate::ids::{SessionId, TurnId};
use crate::model::Usage;
use crate::tools::{AgentPark, FileChange, ToolContinuation};

/// The frame format version written by this build.
pub const FRAME_VERSION: u32 = 1;

/// Where in the loop a frame was taken (execution-suspension seed, frame v1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before the next model call.
    Provider,
    /// A model request is prepared and not yet sent.
    PreparedRequest,
    /// A tool batch is ready to dispatch (`unstarted_calls`).
    Tools,
    /// A tool batch is running; started calls settle, unstarted ones are kept.
    SettlingTools,
    /// The model ended the turn; finalization is prepared.
    PreparedFinalization,
    /// Goal assessment/judgment.
    Goal,
}

/// Running totals for the turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accounting {
    /// Model calls made so far in this turn.
    pub model_calls: u32,
    /// Tokens used so far in this turn.
    pub usage: Usage,
    /// Tool calls dispatched so far in this turn.
    #[serde(default)]
    pub tool_calls: u32,
    /// Wall time the turn has run (ms; time parked does not count).
    #[serde(default)]
    pub wall_ms: u64,
}

/// How one tool call of a batch came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolOutcomeStatus {
    /// Ran and returned a result.
    Completed,
    /// Ran and failed (typed tool error).
    Failed,
    /// Never dispatched: a control event skipped it.
    Interrupted,
    /// Dispatched but its result is unknown (abandoned on cancel, or berth
    /// stopped while it ran); never retried.
    Unknown,
    /// The tool parked itself with a continuation; on resume the engine calls
    /// its `resume_execution`, never `execute` again.
    Suspended,
}

/// The recorded outcome of one tool call, in the model's call order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolOutcome {
    /// The call.
    pub call: ToolCallRequest,
    /// How it came out.
    pub status: ToolOutcomeStatus,
    /// The text the model reads for it.
    pub content: String,
    /// The tool's continuation (status `suspended`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation: Option<ToolContinuation>,
    /// Set when this call parked the session (`await_resumption`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park: Option<AgentPark>,
}

/// A turn's explicit state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// Always [`FRAME_VERSION`] when written by this build.
    pub version: u32,
    /// Owning session.
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// Where the loop stands.
    pub phase: Phase,
    /// Index of the next model call in this turn (0-based).
    pub iteration: u32,
    /// Totals so far.
    pub accounting: Accounting,
    /// Outcomes of the current (or last) tool batch, in call order.
    pub tool_outcomes: Vec<ToolOutcome>,
    /// Calls of the current batch not dispatched yet.
    pub unstarted_calls: Vec<ToolCallRequest>,
    /// Messages this turn added to the transcript so far (user prompt first).
    pub turn_messages: Vec<Message>,
    /// SHA-256 (hex) of the transcript the turn started from.
    pub history_fingerprint: String,
    /// SHA-256 (hex) of the turn's configuration (model, tools, limits).
    pub config_fingerprint: String,
    /// The last tool batch was skipped, not dispatched (an interrupt arrived
    /// at `pre_tool_dispatch`).
    #[serde(default)]
    pub dispatch_skipped: bool,
    /// Why it was skipped (`interrupt_immediate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<String>,
    /// User messages to add once the current batch's results are in (a
    /// resume input whose waitpoint is the batch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resume_notes: Vec<String>,
    /// Files the turn's tools changed so far (kept in a suspension's frame so
    /// the turn's checkpoint is whole after a resume).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub file_changes: Vec<FileChange>,
}

impl Frame {
    /// The calls of the current batch in the model's order: settled (or
    /// suspended) outcomes first, then the unstarted calls.
    pub fn batch_calls(&self) -> impl Iterator<Item = &ToolCallRequest> {
        self.tool_outcomes
            .iter()
            .map(|o| &o.call)
            .chain(&self.unstarted_calls)
    }

    /// The agent's self-park in this frame, if it parked itself.
    pub fn park(&self) -> Option<&AgentPark> {
        self.tool_outcomes.iter().find_map(|o| o.park.as_ref())
    }
}

/// SHA-256 of a value's JSON serialization, as lowercase hex.
pub fn fingerprint<T: Serialize + ?Sized>(value: &T) -> String {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    crate::hexstr::lower(&digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_stable_hex() {
        let a = fingerprint(&vec![Message::User { text: "hi".into() }]);
        let b = fingerprint(&vec![Message::User { text: "hi".into() }]);
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
    }
}
