//! Prompt content.
//!
//! Prompts arrive as ACP content blocks. The runtime keeps the blocks as given
//! (so `session/load` replays exactly what the client sent) and derives the
//! text a model reads from them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A user prompt: the ACP content blocks as received (`text`, `resource_link`,
/// `resource`, …; see ACP "Content").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Prompt(pub Vec<Value>);

impl Prompt {
    /// A prompt with one text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self(vec![
            serde_json::json!({"type": "text", "text": text.into()}),
        ])
    }

    /// Parses `session/inject` content: a non-blank string, or a non-empty
    /// array of ACP content blocks (objects with a `type`) holding some text.
    /// `None` when it is empty or malformed (the seed's `invalid_content`).
    pub fn from_inject_content(content: &Value) -> Option<Self> {
        let prompt = match content {
            Value::String(s) if !s.trim().is_empty() => Self::text(s.clone()),
            Value::Array(blocks)
                if blocks
                    .iter()
                    .all(|b| b.get("type").is_some_and(Value::is_string)) =>
            {
                Self(blocks.clone())
            }
            _ => return None,
        };
        (!prompt.to_model_text().trim().is_empty()).then_some(prompt)
    }

    /// The text a model reads: text blocks verbatim, embedded text resources by
    /// their text, links as their URI; blocks joined by a blank line.
    pub fn to_model_text(&self) -> String {
        let parts: Vec<String> = self
            .0
            .iter()
            .filter_map(|block| match block.get("type").and_then(Value::as_str) {
                Some("text") => block.get("text").and_then(Value::as_str).map(str::to_owned),
                Some("resource") => block
                    .pointer("/resource/text")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                Some("resource_link") => block
                    .get("uri")
                    .and_then(Value::as_str)
                    .map(|uri| format!("[resource: {uri}]")),
                _ => None,
            })
            .collect();
        parts.join("\n\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn inject_content_is_a_string_or_blocks_with_text() {
        assert!(Prompt::from_inject_content(&json!("steer me")).is_some());
        assert!(Prompt::from_inject_content(&json!([{"type":"text","text":"x"}])).is_some());
        for bad in [
            json!(""),
            json!("  "),
            json!([]),
            json!([{"text":"x"}]),
            json!(5),
            json!([{"type":"text","text":""}]),
        ] {
            assert!(Prompt::from_inject_content(&bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn model_text_joins_text_and_resources() {
        let p = Prompt(vec![
            json!({"type":"text","text":"hello"}),
            json!({"type":"resource_link","uri":"file:///a","name":"a"}),
            json!({"type":"image","data":"…","mimeType":"image/png"}),
        ]);
        assert_eq!(p.to_model_text(), "hello\n\n[resource: file:///a]");
    }
}
