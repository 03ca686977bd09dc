//! `direct_reply {text}`: the agent answers the requester with one message
//! instead of producing a tracked task.
//!
//! A2A lets an agent answer `SendMessage` with a direct `Message` for a
//! simple, self-contained interaction (A2A spec §3.1.1 "MAY return a direct
//! Message response"; `docs/topics/life-of-a-task.md`, "Messages for Trivial
//! Interactions"). The model decides that by calling this tool; the call has
//! no side effect and echoes the reply as its `rawOutput`
//! `{"reply": {"text": …}}`. The A2A adapter answers a blocking
//! `SendMessage` with that Message when the new task completed with exactly
//! one reply and nothing else to show (no artifact); in every other case
//! (streaming, non-blocking, more output) the reply is the completed task's
//! status message. ACP clients see an ordinary tool call.
//!
//! Bounds: `text` is 1 to [`MAX_TEXT_BYTES`] bytes.

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{Tool, ToolContext, ToolError, ToolOutput};
use crate::event::ToolKind;
use crate::model::ToolSpec;

/// The tool's name, as the model calls it.
pub const NAME: &str = "direct_reply";
/// Longest reply (bytes).
pub const MAX_TEXT_BYTES: usize = 1024 * 1024;

/// What the model reads after a reply is recorded.
const RECORDED: &str = "Recorded as the direct reply to the requester. End the turn now \
                        without further output: more text or artifacts make the requester \
                        receive a task instead of this message.";

/// The built-in direct-reply tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct DirectReply;

/// Validates the call's arguments and returns the reply text.
///
/// # Errors
/// [`ToolError::InvalidArguments`]: not an object, an unknown field, `text`
/// missing, not a string, empty or over [`MAX_TEXT_BYTES`].
pub fn parse(arguments: &Value) -> Result<&str, ToolError> {
    let Some(object) = arguments.as_object() else {
        return Err(ToolError::invalid("arguments must be an object"));
    };
    if let Some(key) = object.keys().find(|k| k.as_str() != "text") {
        return Err(ToolError::invalid(format!(
            "unknown field `{key}` (expected text)"
        )));
    }
    match object.get("text") {
        Some(Value::String(text)) if text.trim().is_empty() => {
            Err(ToolError::invalid("`text` must not be empty"))
        }
        Some(Value::String(text)) if text.len() > MAX_TEXT_BYTES => Err(ToolError::invalid(
            format!("`text` is over the {MAX_TEXT_BYTES}-byte limit"),
        )),
        Some(Value::String(text)) => Ok(text),
        _ => Err(ToolError::invalid("`text` must be a string")),
    }
}

/// The reply text of a completed call's `rawOutput` (`{"reply": {"text":
/// …}}`); `None` for anything else.
pub fn reply_of(raw_output: &Value) -> Option<&str> {
    raw_output.pointer("/reply/text").and_then(Value::as_str)
}

#[async_trait]
impl Tool for DirectReply {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: NAME.into(),
            description: "Answer the requester directly with this message, for a short, \
                          self-contained answer that needs no tracking (no files, no follow-up). \
                          Call it once as the turn's only output, then end the turn."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "The reply."}
                },
                "required": ["text"]
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Other
    }

    fn title(&self, arguments: &Value) -> String {
        let text = arguments.get("text").and_then(Value::as_str).unwrap_or("?");
        let mut short: String = text.chars().take(80).collect();
        if short.len() < text.len() {
            short.push('…');
        }
        format!("reply: {short}")
    }

    async fn call(&self, _ctx: &ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let text = parse(&arguments)?;
        Ok(ToolOutput {
            content: RECORDED.into(),
            raw: json!({"reply": {"text": text}}),
            file_changes: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reply_is_echoed_and_bad_arguments_are_refused() {
        let ctx = ToolContext::new(std::env::temp_dir());
        let out = DirectReply
            .call(&ctx, json!({"text": "Direct message response"}))
            .await
            .unwrap();
        assert_eq!(reply_of(&out.raw), Some("Direct message response"));
        assert_eq!(reply_of(&json!({"artifact": {}})), None);
        for (arguments, expected) in [
            (json!({}), "`text` must be a string"),
            (json!({"text": "  "}), "must not be empty"),
            (json!({"text": "a", "to": "b"}), "unknown field `to`"),
            (json!([1]), "must be an object"),
            (
                json!({"text": "x".repeat(MAX_TEXT_BYTES + 1)}),
                "byte limit",
            ),
        ] {
            match DirectReply.call(&ctx, arguments.clone()).await {
                Err(ToolError::InvalidArguments { message }) => {
                    assert!(message.contains(expected), "{arguments}: {message}")
                }
                other => panic!("{arguments}: {other:?}"),
            }
        }
        assert_eq!(
            DirectReply.title(&json!({"text": "hi"})),
            "reply: hi".to_owned()
        );
    }
}
