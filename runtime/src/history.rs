//! The canonical transcript: what a model reads on its next call.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

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
    /// A `queue`-mode injection drained at loop exit: kept in the transcript
    /// for the audit trail, never put in front of a model
    /// (`remote-session-control.md`, "Queue").
    Queued {
        /// The injection's message id.
        message_id: String,
        /// Its text.
        text: String,
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

/// Gives every tool call of `messages` a result: a call whose result is
/// missing (its turn died before the call settled) gets a synthetic error
/// result with `reason`, right after the other results of its batch. Providers
/// such as OpenAI refuse a transcript with an unanswered tool call.
pub fn close_open_tool_calls(messages: Vec<Message>, reason: &str) -> Vec<Message> {
    let mut out = Vec::with_capacity(messages.len());
    let mut iter = messages.into_iter().peekable();
    while let Some(message) = iter.next() {
        let calls: Vec<ToolCallId> = match &message {
            Message::Assistant { tool_calls, .. } => {
                tool_calls.iter().map(|c| c.id.clone()).collect()
            }
            _ => Vec::new(),
        };
        out.push(message);
        if calls.is_empty() {
            continue;
        }
        let mut answered = Vec::new();
        while let Some(Message::Tool { tool_call_id, .. }) = iter.peek() {
            answered.push(tool_call_id.clone());
            out.extend(iter.next());
        }
        for id in calls.into_iter().filter(|id| !answered.contains(id)) {
            out.push(Message::Tool {
                tool_call_id: id,
                content: reason.to_owned(),
                is_error: true,
            });
        }
    }
    out
}

/// A session's transcript, shared cheaply (turns and model requests hold the
/// same allocation) and fingerprinted incrementally: the fingerprint after
/// message *n* is `SHA-256(fingerprint(n-1) ‖ JSON(message n))`, so appending a
/// turn costs what the turn costs, not what the whole history costs.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcript {
    messages: Arc<Vec<Message>>,
    fingerprint: String,
}

impl Default for Transcript {
    fn default() -> Self {
        Self::from_messages(Vec::new())
    }
}

fn chain(previous: &str, message: &Message) -> String {
    let mut hasher = Sha256::new();
    hasher.update(previous.as_bytes());
    hasher.update(serde_json::to_vec(message).unwrap_or_default());
    crate::hexstr::lower(&hasher.finalize())
}

impl Transcript {
    /// A transcript of `messages` (fingerprinted once, O(n)).
    pub fn from_messages(messages: Vec<Message>) -> Self {
        let fingerprint = messages.iter().fold(String::new(), |fp, m| chain(&fp, m));
        Self {
            messages: Arc::new(messages),
            fingerprint,
        }
    }

    /// The messages, oldest first.
    pub fn messages(&self) -> &Arc<Vec<Message>> {
        &self.messages
    }

    /// Number of messages.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether there are no messages.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Hex SHA-256 chain over the messages (empty string for no messages).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Appends messages. Copies the shared vector only if another holder
    /// (a finished turn's request) still shares it.
    pub fn extend(&mut self, more: impl IntoIterator<Item = Message>) {
        let messages = Arc::make_mut(&mut self.messages);
        for message in more {
            self.fingerprint = chain(&self.fingerprint, &message);
            messages.push(message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unanswered_tool_calls_get_a_result_after_their_batch() {
        let call = |id: &str| ToolCallRequest {
            id: ToolCallId::from(id),
            name: "shell".into(),
            arguments: serde_json::json!({}),
        };
        let messages = vec![
            Message::User { text: "go".into() },
            Message::Assistant {
                text: String::new(),
                tool_calls: vec![call("a"), call("b")],
            },
            Message::Tool {
                tool_call_id: ToolCallId::from("a"),
                content: "ok".into(),
                is_error: false,
            },
        ];
        let closed = close_open_tool_calls(messages, "abandoned");
        assert_eq!(closed.len(), 4);
        assert!(
            matches!(&closed[3], Message::Tool { tool_call_id, is_error: true, .. } if tool_call_id.as_str() == "b")
        );
        // Idempotent.
        assert_eq!(close_open_tool_calls(closed.clone(), "abandoned"), closed);
    }

    #[test]
    fn incremental_fingerprint_equals_batch_fingerprint() {
        let a = Message::User { text: "a".into() };
        let b = Message::Assistant {
            text: "b".into(),
            tool_calls: vec![],
        };
        let mut t = Transcript::from_messages(vec![a.clone()]);
        t.extend([b.clone()]);
        assert_eq!(t, Transcript::from_messages(vec![a.clone(), b]));
        assert_ne!(
            t.fingerprint(),
            Transcript::from_messages(vec![a]).fingerprint()
        );
        assert_eq!(t.fingerprint().len(), 64);
    }
}
