//! `publish_artifact {name?, description?, text? | data? | url, filename?,
//! mediaType?}`: the agent hands over one output — a text, a structured
//! value or a file by reference — as a named artifact of the current turn.
//!
//! The call has no side effect: it validates its arguments and echoes them,
//! normalized, as its `rawOutput` `{"artifact": PublishedArtifact}`. What a
//! client makes of it is the adapter's business: ACP clients see an ordinary
//! tool call; the A2A adapter renders every *completed* call as an artifact
//! of the task whose one part has the matching kind (A2A spec §4.1.6 `Part`:
//! `text`, `data` or `url` with `filename` and `mediaType`; §4.1.7
//! `Artifact`), so an agent can answer with structured data or a link
//! instead of prose. A refused call (bad arguments) publishes nothing.
//!
//! Bounds: the content (the text, the data as JSON, or the URL) is at most
//! [`MAX_CONTENT_BYTES`]; `name` [`MAX_NAME_CHARS`] characters,
//! `description` [`MAX_DESCRIPTION_CHARS`], `filename` [`MAX_FILENAME_BYTES`]
//! bytes, `mediaType` [`MAX_MEDIA_TYPE_BYTES`] bytes.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{Tool, ToolContext, ToolError, ToolOutput};
use crate::event::ToolKind;
use crate::model::ToolSpec;

/// The tool's name, as the model calls it.
pub const NAME: &str = "publish_artifact";
/// Largest content: the text, the data serialized as JSON, or the URL (bytes).
pub const MAX_CONTENT_BYTES: usize = 1024 * 1024;
/// Longest `name` (characters).
pub const MAX_NAME_CHARS: usize = 256;
/// Longest `description` (characters).
pub const MAX_DESCRIPTION_CHARS: usize = 4096;
/// Longest `filename` (bytes, as most file systems allow).
pub const MAX_FILENAME_BYTES: usize = 255;
/// Longest `mediaType` (bytes).
pub const MAX_MEDIA_TYPE_BYTES: usize = 255;

/// The content of a published part: exactly one kind (A2A `Part` oneof
/// `content`, without `raw`: a file the agent wrote is already reported by
/// `write_file`). Serialized as one field: `{"text": …}`, `{"data": …}` or
/// `{"url": …}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArtifactContent {
    /// Text.
    Text(String),
    /// A structured value (any JSON but `null`).
    Data(Value),
    /// A file by reference: an absolute URL.
    Url(String),
}

impl ArtifactContent {
    /// `text`, `data` or `url`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Text(_) => "text",
            Self::Data(_) => "data",
            Self::Url(_) => "url",
        }
    }
}

/// The one part of a published artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactPart {
    /// What it holds.
    #[serde(flatten)]
    pub content: ArtifactContent,
    /// File name (for a URL, the URL's last path segment when not given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// Media type (`type/subtype`, parameters allowed), as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
}

/// A validated `publish_artifact` call: the tool's `rawOutput` is
/// `{"artifact": <this>}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishedArtifact {
    /// Display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The content.
    pub part: ArtifactPart,
}

impl PublishedArtifact {
    /// Reads the artifact back from a completed call's `rawOutput`
    /// (`{"artifact": …}`); `None` for anything else.
    pub fn from_raw_output(raw: &Value) -> Option<Self> {
        serde_json::from_value(raw.get("artifact")?.clone()).ok()
    }
}

/// The built-in artifact tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct PublishArtifact;

fn opt_string<'a>(object: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, ToolError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ToolError::invalid(format!("`{key}` must be a string"))),
    }
}

/// RFC 9110 `token` characters.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// `type/subtype` followed by optional `; parameter`s (RFC 9110 §8.3.1).
fn valid_media_type(s: &str) -> bool {
    let essence = s.split(';').next().unwrap_or("");
    let Some((kind, subtype)) = essence.trim().split_once('/') else {
        return false;
    };
    is_token(kind) && is_token(subtype) && !s.chars().any(char::is_control)
}

fn valid_filename(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_FILENAME_BYTES
        && s != "."
        && s != ".."
        && !s.chars().any(|c| c == '/' || c == '\\' || c.is_control())
}

/// Parses and validates the call's arguments.
///
/// # Errors
/// [`ToolError::InvalidArguments`] naming the field: an unknown field; not
/// exactly one of `text`, `data`, `url`; `data` null; a `url` that is not an
/// absolute URL; `filename` with a path separator or control character;
/// `mediaType` not `type/subtype`; anything over its bound. Nothing is
/// published then.
pub fn parse(arguments: &Value) -> Result<PublishedArtifact, ToolError> {
    let Some(object) = arguments.as_object() else {
        return Err(ToolError::invalid("arguments must be an object"));
    };
    const FIELDS: &[&str] = &[
        "name",
        "description",
        "text",
        "data",
        "url",
        "filename",
        "mediaType",
    ];
    if let Some(key) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ToolError::invalid(format!(
            "unknown field `{key}` (expected {})",
            FIELDS.join(", ")
        )));
    }
    let present: Vec<&str> = ["text", "data", "url"]
        .into_iter()
        .filter(|k| object.get(*k).is_some_and(|v| !v.is_null()))
        .collect();
    if present.len() != 1 {
        return Err(ToolError::invalid(format!(
            "give exactly one of `text`, `data`, `url` (got {})",
            if present.is_empty() {
                "none".to_owned()
            } else {
                present.join(", ")
            }
        )));
    }
    let too_big = |field: &str, len: usize| {
        ToolError::invalid(format!(
            "`{field}` is {len} bytes, over the {MAX_CONTENT_BYTES}-byte limit"
        ))
    };
    let content = match present[0] {
        "text" => {
            let text = opt_string(object, "text")?.unwrap_or_default();
            if text.len() > MAX_CONTENT_BYTES {
                return Err(too_big("text", text.len()));
            }
            ArtifactContent::Text(text.to_owned())
        }
        "data" => {
            let data = object.get("data").cloned().unwrap_or(Value::Null);
            let len = data.to_string().len();
            if len > MAX_CONTENT_BYTES {
                return Err(too_big("data", len));
            }
            ArtifactContent::Data(data)
        }
        _ => {
            let url = opt_string(object, "url")?.unwrap_or_default();
            if url.len() > MAX_CONTENT_BYTES {
                return Err(too_big("url", url.len()));
            }
            if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(ToolError::invalid(
                    "`url` must not contain whitespace or control characters",
                ));
            }
            reqwest::Url::parse(url).map_err(|e| {
                ToolError::invalid(format!(
                    "`url` must be an absolute URL such as https://host/file.txt ({e})"
                ))
            })?;
            ArtifactContent::Url(url.to_owned())
        }
    };
    let name = opt_string(object, "name")?;
    if name.is_some_and(|n| n.chars().count() > MAX_NAME_CHARS) {
        return Err(ToolError::invalid(format!(
            "`name` is longer than {MAX_NAME_CHARS} characters"
        )));
    }
    let description = opt_string(object, "description")?;
    if description.is_some_and(|d| d.chars().count() > MAX_DESCRIPTION_CHARS) {
        return Err(ToolError::invalid(format!(
            "`description` is longer than {MAX_DESCRIPTION_CHARS} characters"
        )));
    }
    let mut filename = opt_string(object, "filename")?.map(str::to_owned);
    if let Some(f) = &filename {
        if !valid_filename(f) {
            return Err(ToolError::invalid(format!(
                "`filename` must be a base name of 1 to {MAX_FILENAME_BYTES} bytes without `/`, `\\` or control characters"
            )));
        }
    }
    if let (None, ArtifactContent::Url(url)) = (&filename, &content) {
        filename = reqwest::Url::parse(url)
            .ok()
            .and_then(|u| {
                u.path_segments()
                    .and_then(|mut s| s.next_back().map(str::to_owned))
            })
            .filter(|f| valid_filename(f));
    }
    let media_type = opt_string(object, "mediaType")?;
    if let Some(m) = media_type {
        if m.len() > MAX_MEDIA_TYPE_BYTES || !valid_media_type(m) {
            return Err(ToolError::invalid(
                "`mediaType` must be a media type such as text/plain or application/json",
            ));
        }
    }
    Ok(PublishedArtifact {
        name: name.map(str::to_owned),
        description: description.map(str::to_owned),
        part: ArtifactPart {
            content,
            filename,
            media_type: media_type.map(str::to_owned),
        },
    })
}

#[async_trait]
impl Tool for PublishArtifact {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: NAME.into(),
            description: "Publish one output of this task as an artifact the requester receives: \
                          a text, a structured JSON value (`data`), or a file by reference (`url`, \
                          with `filename` and `mediaType`). Give exactly one of text, data, url. \
                          Use it for results a program will read; plain answers need no tool."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "Display name of the artifact."},
                    "description": {"type": "string", "description": "What the artifact is."},
                    "text": {"type": "string", "description": "Text content."},
                    "data": {"description": "Structured content: any JSON value but null."},
                    "url": {"type": "string", "description": "A file by reference: an absolute URL."},
                    "filename": {"type": "string", "description": "File name (defaults to the URL's last path segment)."},
                    "mediaType": {"type": "string", "description": "Media type, e.g. text/plain or application/json."}
                }
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Other
    }

    fn title(&self, arguments: &Value) -> String {
        let label = ["name", "filename", "url"]
            .into_iter()
            .find_map(|k| arguments.get(k).and_then(Value::as_str))
            .or_else(|| {
                ["text", "data"]
                    .into_iter()
                    .find(|k| arguments.get(*k).is_some())
            })
            .unwrap_or("?");
        format!("publish artifact: {label}")
    }

    async fn call(&self, _ctx: &ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let artifact = parse(&arguments)?;
        let bytes = match &artifact.part.content {
            ArtifactContent::Text(t) => t.len(),
            ArtifactContent::Data(d) => d.to_string().len(),
            ArtifactContent::Url(u) => u.len(),
        };
        let content = format!(
            "published artifact {} ({} part, {bytes} bytes)",
            artifact
                .name
                .as_deref()
                .or(artifact.part.filename.as_deref())
                .map_or_else(|| "(unnamed)".to_owned(), |n| format!("{n:?}")),
            artifact.part.content.kind(),
        );
        Ok(ToolOutput {
            content,
            raw: json!({ "artifact": artifact }),
            file_changes: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(arguments: Value) -> Result<ToolOutput, ToolError> {
        PublishArtifact
            .call(&ToolContext::new(std::env::temp_dir()), arguments)
            .await
    }

    #[tokio::test]
    async fn each_kind_round_trips_through_the_raw_output() {
        let out = run(json!({"name": "result", "data": {"key": "value", "count": 42}}))
            .await
            .unwrap();
        assert_eq!(
            out.raw,
            json!({"artifact": {"name": "result", "part": {"data": {"key": "value", "count": 42}}}})
        );
        let back = PublishedArtifact::from_raw_output(&out.raw).unwrap();
        assert_eq!(
            back.part.content,
            ArtifactContent::Data(json!({"key": "value", "count": 42}))
        );
        assert!(
            out.content.contains("\"result\" (data part"),
            "{}",
            out.content
        );

        let out =
            run(json!({"url": "https://example.com/dir/output.txt", "mediaType": "text/plain"}))
                .await
                .unwrap();
        let back = PublishedArtifact::from_raw_output(&out.raw).unwrap();
        assert_eq!(back.part.filename.as_deref(), Some("output.txt"));
        assert_eq!(back.part.media_type.as_deref(), Some("text/plain"));
        assert_eq!(
            out.raw["artifact"]["part"],
            json!({"url": "https://example.com/dir/output.txt", "filename": "output.txt", "mediaType": "text/plain"})
        );

        let out = run(json!({"text": "hello", "description": "a greeting"}))
            .await
            .unwrap();
        assert_eq!(
            out.raw,
            json!({"artifact": {"description": "a greeting", "part": {"text": "hello"}}})
        );
        assert_eq!(PublishedArtifact::from_raw_output(&json!({"x": 1})), None);
    }

    #[tokio::test]
    async fn bad_arguments_are_typed_errors_naming_the_field() {
        let cases = [
            (json!({}), "exactly one"),
            (json!({"text": "a", "data": 1}), "got text, data"),
            (json!({"data": null}), "got none"),
            (
                json!({"url": "output.txt"}),
                "`url` must be an absolute URL",
            ),
            (json!({"url": "https://x/ y"}), "whitespace"),
            (json!({"text": 3}), "`text` must be a string"),
            (json!({"text": "a", "filename": "../a"}), "`filename`"),
            (json!({"text": "a", "mediaType": "plain"}), "`mediaType`"),
            (
                json!({"text": "a", "colour": "red"}),
                "unknown field `colour`",
            ),
            (
                json!({"text": "a", "name": "n".repeat(MAX_NAME_CHARS + 1)}),
                "`name` is longer",
            ),
            (
                json!({"text": "x".repeat(MAX_CONTENT_BYTES + 1)}),
                "over the 1048576-byte limit",
            ),
            (json!("text"), "must be an object"),
        ];
        for (arguments, expected) in cases {
            match run(arguments.clone()).await {
                Err(ToolError::InvalidArguments { message }) => {
                    assert!(message.contains(expected), "{arguments}: {message}")
                }
                other => panic!("{arguments}: {other:?}"),
            }
        }
        assert!(
            run(json!({"text": "a", "mediaType": "text/plain; charset=utf-8"}))
                .await
                .is_ok()
        );
    }

    #[test]
    fn the_title_names_the_artifact() {
        let t = PublishArtifact.title(&json!({"data": {"a": 1}}));
        assert_eq!(t, "publish artifact: data");
        let t = PublishArtifact.title(&json!({"name": "report", "text": "…"}));
        assert_eq!(t, "publish artifact: report");
    }
}
