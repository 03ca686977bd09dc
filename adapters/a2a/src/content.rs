//! A2A parts ↔ berth prompt blocks (ACP content blocks).
//!
//! Incoming message parts become ACP content blocks, each carrying the part
//! as sent under `_meta.berth.a2a.part` (and the first the `messageId`), so
//! that the journaled prompt replays to ACP clients as ordinary content and
//! gives A2A clients their message back exactly in a task's history:
//!
//! | A2A part | ACP block | the model reads |
//! |---|---|---|
//! | `text` | `text` | the text |
//! | `url` | `resource_link` (`name` = filename or URL) | `[resource: URL]` |
//! | `raw` of a text media type (or UTF-8 without one) | `resource` with `text` | the text |
//! | `data` | `resource` with the JSON as `text`, `application/json` | the JSON |
//!
//! berth's models read text, so content is accepted when it is text: text
//! and data parts, links, and `raw` bytes that are UTF-8 — whatever their
//! `mediaType` (kept on the block as `mimeType`). `raw` bytes that are not
//! UTF-8 (an image, an archive) are refused with ContentTypeNotSupportedError
//! (`-32005`). [`SUPPORTED_INPUT_MODES`] lists the types the card advertises.

use base64::Engine;
use serde_json::{json, Value};

use crate::error::{A2aErrorKind, RpcError};
use crate::wire::{Message, Part};

/// Input media types berth accepts (agent card `defaultInputModes`).
pub const SUPPORTED_INPUT_MODES: &[&str] = &["text/plain", "text/markdown", "application/json"];

/// Output media types berth produces (agent card `defaultOutputModes`).
pub const OUTPUT_MODES: &[&str] = &["text/plain", "application/json"];

/// Largest number of parts in one message.
pub const MAX_PARTS: usize = 64;

/// Converts an incoming user message into prompt blocks. With
/// `message_id_header`, a first text block `[a2a messageId: ID]` tells the
/// model the message id (the TCK profile's in-band signal).
///
/// # Errors
/// `-32602` naming the part (`message.parts[2]`) when it has not exactly one
/// content field, bad base64 or too many parts; `-32005` for `raw` bytes that
/// are not UTF-8 text.
pub fn to_blocks(message: &Message, message_id_header: bool) -> Result<Vec<Value>, RpcError> {
    if message.parts.is_empty() {
        return Err(RpcError::invalid_params(
            "message.parts",
            "must hold at least one part",
        ));
    }
    if message.parts.len() > MAX_PARTS {
        return Err(RpcError::invalid_params(
            "message.parts",
            format!("at most {MAX_PARTS} parts"),
        ));
    }
    let mut blocks = Vec::with_capacity(message.parts.len() + 1);
    if message_id_header {
        blocks.push(json!({
            "type": "text",
            "text": format!("[a2a messageId: {}]", message.message_id),
            "_meta": {"berth": {"a2a": {"header": true}}},
        }));
    }
    for (i, part) in message.parts.iter().enumerate() {
        let field = format!("message.parts[{i}]");
        if part.content_count() != 1 {
            return Err(RpcError::invalid_params(
                &field,
                "must set exactly one of text, raw, url, data",
            ));
        }
        let mut meta = json!({"part": part});
        if i == 0 {
            meta["messageId"] = json!(message.message_id);
        }
        let meta = json!({"berth": {"a2a": meta}});
        let block = if let Some(text) = &part.text {
            json!({"type": "text", "text": text, "_meta": meta})
        } else if let Some(url) = &part.url {
            let mut block = json!({
                "type": "resource_link",
                "uri": url,
                "name": part.filename.clone().unwrap_or_else(|| url.clone()),
                "_meta": meta,
            });
            if let Some(media_type) = &part.media_type {
                block["mimeType"] = json!(media_type);
            }
            block
        } else if let Some(raw) = &part.raw {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(raw)
                .map_err(|e| RpcError::invalid_params(&format!("{field}.raw"), e))?;
            let text = String::from_utf8(bytes).map_err(|_| {
                RpcError::a2a(
                    A2aErrorKind::ContentTypeNotSupported,
                    "the part's bytes are not UTF-8 text; berth accepts text content only",
                    &[
                        ("field", field.clone()),
                        ("mediaType", part.media_type.clone().unwrap_or_default()),
                    ],
                )
            })?;
            json!({
                "type": "resource",
                "resource": {
                    "uri": format!("a2a:part/{}", part.filename.clone().unwrap_or_else(|| i.to_string())),
                    "text": text,
                    "mimeType": part.media_type.clone().unwrap_or_else(|| "text/plain".into()),
                },
                "_meta": meta,
            })
        } else {
            let data = part.data.clone().unwrap_or(Value::Null);
            json!({
                "type": "resource",
                "resource": {
                    "uri": format!("a2a:data/{i}"),
                    "text": data.to_string(),
                    "mimeType": "application/json",
                },
                "_meta": meta,
            })
        };
        blocks.push(block);
    }
    Ok(blocks)
}

/// The text of a message as the model read it ([`Prompt::to_model_text`] of
/// [`to_blocks`], e.g. a resume input) without the `[a2a messageId: ID]`
/// header that `message_id_header` put in front of it; other text unchanged.
///
/// [`Prompt::to_model_text`]: berth_runtime::content::Prompt::to_model_text
pub fn strip_message_id_header<'a>(text: &'a str, message_id: Option<&str>) -> &'a str {
    let Some(id) = message_id else {
        return text;
    };
    let header = format!("[a2a messageId: {id}]");
    match text.strip_prefix(header.as_str()) {
        Some(rest) => rest.strip_prefix("\n\n").unwrap_or(rest),
        None => text,
    }
}

/// The message id recorded in prompt blocks made by [`to_blocks`].
pub fn message_id_of(blocks: &[Value]) -> Option<String> {
    blocks
        .iter()
        .find_map(|b| b.pointer("/_meta/berth/a2a/messageId"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Parts of a journaled prompt: the A2A parts as sent when the prompt came
/// over A2A, else the ACP blocks converted (text, links, embedded text).
pub fn to_parts(blocks: &[Value]) -> Vec<Part> {
    blocks
        .iter()
        .filter(|b| b.pointer("/_meta/berth/a2a/header") != Some(&Value::Bool(true)))
        .filter_map(|block| {
            if let Some(part) = block.pointer("/_meta/berth/a2a/part") {
                if let Ok(part) = serde_json::from_value::<Part>(part.clone()) {
                    return Some(part);
                }
            }
            let str_of = |p: &str| block.pointer(p).and_then(Value::as_str).map(str::to_owned);
            match block.get("type").and_then(Value::as_str) {
                Some("text") => str_of("/text").map(Part::text),
                Some("resource_link") => Some(Part {
                    url: str_of("/uri"),
                    filename: str_of("/name"),
                    media_type: str_of("/mimeType"),
                    ..Part::default()
                }),
                Some("resource") => str_of("/resource/text").map(|text| Part {
                    text: Some(text),
                    media_type: str_of("/resource/mimeType"),
                    ..Part::default()
                }),
                _ => None,
            }
        })
        .collect()
}

/// A guess at a file's media type from its extension (for file artifacts).
pub fn media_type_for(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("txt" | "log" | "text") => "text/plain",
        Some("md" | "markdown") => "text/markdown",
        Some("json") => "application/json",
        Some("html" | "htm") => "text/html",
        Some("csv") => "text/csv",
        Some("xml") => "application/xml",
        Some("yaml" | "yml") => "application/yaml",
        Some("toml") => "application/toml",
        Some("rs" | "py" | "js" | "ts" | "sh" | "c" | "h" | "go" | "java") => "text/plain",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Role;

    fn message(parts: Vec<Part>) -> Message {
        Message {
            message_id: "m1".into(),
            context_id: None,
            task_id: None,
            role: Role::User,
            parts,
            metadata: None,
            extensions: vec![],
            reference_task_ids: vec![],
        }
    }

    #[test]
    fn parts_survive_the_round_trip_and_the_model_reads_text() {
        let parts = vec![
            Part::text("hello"),
            Part::data(json!({"a": 1})),
            Part {
                url: Some("https://example.com/x.txt".into()),
                filename: Some("x.txt".into()),
                media_type: Some("text/plain".into()),
                ..Part::default()
            },
            Part {
                raw: Some(base64::engine::general_purpose::STANDARD.encode("file text")),
                media_type: Some("text/plain".into()),
                ..Part::default()
            },
        ];
        let blocks = to_blocks(&message(parts.clone()), true).unwrap();
        assert_eq!(to_parts(&blocks), parts);
        assert_eq!(message_id_of(&blocks).as_deref(), Some("m1"));
        let text = berth_runtime::content::Prompt(blocks).to_model_text();
        assert!(text.starts_with("[a2a messageId: m1]"), "{text}");
        assert!(text.contains("hello") && text.contains("{\"a\":1}") && text.contains("file text"));
    }

    #[test]
    fn unsupported_media_and_bad_parts_are_refused() {
        let textual = Part {
            raw: Some("dGNr".into()),
            media_type: Some("application/x-unsupported-tck-type".into()),
            ..Part::default()
        };
        assert!(to_blocks(&message(vec![textual]), false).is_ok());
        let binary = Part {
            raw: Some(base64::engine::general_purpose::STANDARD.encode([0xff, 0xfe, 0x00])),
            media_type: Some("image/png".into()),
            ..Part::default()
        };
        assert_eq!(
            to_blocks(&message(vec![binary]), false).unwrap_err().code,
            -32005
        );
        let two = Part {
            text: Some("a".into()),
            url: Some("b".into()),
            ..Part::default()
        };
        let e = to_blocks(&message(vec![two]), false).unwrap_err();
        assert_eq!(
            (e.code, e.data["field"].as_str()),
            (-32602, Some("message.parts[0]"))
        );
        assert_eq!(to_blocks(&message(vec![]), false).unwrap_err().code, -32602);
    }
}
