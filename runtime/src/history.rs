//! The canonical transcript: what a model reads on its next call.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::ToolCallId;

/// One tool call as the model asked for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRequest {
    /// The call id (from the model, or generated when it gave none).
    pub id: ToolCallId,
    /// Tool name, e.g. `shell`.
    pub name: String,
    /// Arguments object as the model produced it.
    pub arguments: Value,
}

/// One message of the transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// What the user asked (prompt text as the model reads it).
    User {
        /// Prompt text.
        text: String,
    },
    /// What the model answered, with the tool calls it made.
    Assistant {
        /// Visible answer text (may be empty when only tools were called).
        text: String,
        /// Tool calls of this response, in the order the model gave them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCallRequest>,
    },
    /// The result of one tool call, as the model reads it.
    Tool {
        /// The call this answers.
        tool_call_id: ToolCallId,
        /// Result text (or error text when `is_error`).
        content: String,
        /// Whether the call failed (error, interrupted, cancelled).
        #[serde(default)]
        is_error: bool,
    },
}
