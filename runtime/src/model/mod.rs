//! Model providers behind one trait.
//!
//! A provider answers one [`ModelRequest`] (the transcript so far plus the tool
//! specs) with one [`ModelResponse`], streaming text and reasoning deltas through
//! a channel as they arrive so the engine can journal and forward them.
//!
//! Two providers ship: [`scripted::ScriptedModel`] (deterministic, the embedded
//! default) and [`openai::OpenAiModel`] (any OpenAI-compatible
//! `/v1/chat/completions` endpoint). [`from_spec`] builds one from the
//! `--model` flag (`scripted:PATH` | `openai:MODEL`).

pub mod openai;
pub mod scripted;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::history::{Message, ToolCallRequest};
use crate::ids::{SessionId, TurnId};

/// Token usage of one model call or of a whole turn (tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt (input) tokens.
    pub input_tokens: u64,
    /// Completion (output) tokens.
    pub output_tokens: u64,
}

impl Usage {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
    }
}

/// What a tool offers the model: name, description and JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Tool name as the model calls it.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema (object) of the arguments.
    pub parameters: Value,
}

/// The specs of a tool set, shared: what every [`ModelRequest`] carries.
/// Built once per tool set ([`crate::tools::ToolSet::shared_specs`]) and
/// cloned per model call as two `Arc`s, with their compact JSON encoding
/// beside them, so neither the schemas nor their encoding are rebuilt per
/// call (they were about 5 % of berth's CPU in the wake-up benchmark).
/// Serializes as the JSON array of the specs.
#[derive(Debug, Clone)]
pub struct ToolSpecs {
    specs: Arc<[ToolSpec]>,
    json: Arc<[u8]>,
    /// The last configuration fingerprint derived from these specs, with
    /// the model name and call limit it was derived for (see
    /// [`ToolSpecs::fingerprint`]).
    fingerprint: Arc<std::sync::Mutex<Option<(String, u32, String)>>>,
}

impl ToolSpecs {
    /// Shares `specs`, encoding them once.
    pub fn new(specs: Vec<ToolSpec>) -> Self {
        let json = serde_json::to_vec(&specs).unwrap_or_else(|_| b"[]".to_vec());
        Self {
            specs: specs.into(),
            json: json.into(),
            fingerprint: Arc::default(),
        }
    }

    /// The specs as compact JSON (`serde_json::to_vec` of the array).
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    /// The configuration fingerprint of these specs with `model` and
    /// `max_model_calls`: `derive`'s result, remembered (shared by every
    /// clone) until asked for another model or limit. It hashes the whole
    /// encoding, and every turn asks for it two or three times.
    pub fn fingerprint(
        &self,
        model: &str,
        max_model_calls: u32,
        derive: impl FnOnce() -> String,
    ) -> String {
        let mut memo = self
            .fingerprint
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match memo.as_ref() {
            Some((m, n, fingerprint)) if m == model && *n == max_model_calls => fingerprint.clone(),
            _ => {
                let fingerprint = derive();
                *memo = Some((model.to_owned(), max_model_calls, fingerprint.clone()));
                fingerprint
            }
        }
    }
}

impl Default for ToolSpecs {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl From<Vec<ToolSpec>> for ToolSpecs {
    fn from(specs: Vec<ToolSpec>) -> Self {
        Self::new(specs)
    }
}

impl std::ops::Deref for ToolSpecs {
    type Target = [ToolSpec];
    fn deref(&self) -> &[ToolSpec] {
        &self.specs
    }
}

impl PartialEq for ToolSpecs {
    fn eq(&self, other: &Self) -> bool {
        self.specs == other.specs
    }
}

impl Serialize for ToolSpecs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.specs.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ToolSpecs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<ToolSpec>::deserialize(deserializer).map(Self::new)
    }
}

/// One model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// The session.
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// Index of this model call within the turn (0 for the first).
    pub iteration: u32,
    /// The session's working directory (absolute).
    pub cwd: PathBuf,
    /// The transcript before this turn (shared, not copied per call).
    pub history: Arc<Vec<Message>>,
    /// [`crate::history::Transcript::fingerprint`] of `history` (empty when
    /// not computed): lets the replay tape fingerprint a request without
    /// re-serializing the whole history per call
    /// ([`crate::tape::request_sha256`]). Not sent to a provider.
    #[serde(skip)]
    pub history_fingerprint: String,
    /// This turn's messages so far (the user prompt first).
    pub turn_messages: Vec<Message>,
    /// Tools the model may call.
    pub tools: ToolSpecs,
}

impl ModelRequest {
    /// The whole conversation the model reads: history, then this turn, without
    /// the audit-only [`Message::Queued`] entries.
    pub fn messages(&self) -> impl DoubleEndedIterator<Item = &Message> {
        self.history
            .iter()
            .chain(&self.turn_messages)
            .filter(|m| !matches!(m, Message::Queued { .. }))
    }

    /// Model calls made since the latest user message (0 for the first answer
    /// to it): counts the assistant messages after it.
    pub fn calls_since_user(&self) -> u32 {
        self.messages()
            .rev()
            .take_while(|m| !matches!(m, Message::User { .. }))
            .filter(|m| matches!(m, Message::Assistant { .. }))
            .count() as u32
    }

    /// Text of the latest user message, or `""` when there is none.
    pub fn latest_user_text(&self) -> &str {
        self.messages()
            .rev()
            .find_map(|m| match m {
                Message::User { text } => Some(text.as_str()),
                _ => None,
            })
            .unwrap_or("")
    }
}

/// A streamed piece of a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelDelta {
    /// Answer text.
    Text(String),
    /// Reasoning text.
    Thought(String),
}

/// Why a model response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelStop {
    /// The model finished its turn.
    EndTurn,
    /// The model wants the tool calls of this response run.
    ToolUse,
    /// Output token limit.
    MaxTokens,
    /// The model refused.
    Refusal,
}

/// A complete model response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// All answer text of the response (the concatenated deltas).
    pub text: String,
    /// Tool calls, in the model's order; run as one batch.
    pub tool_calls: Vec<ToolCallRequest>,
    /// Tokens this call used.
    pub usage: Usage,
    /// Why it ended.
    pub stop: ModelStop,
}

/// Errors a provider returns.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The provider could not be reached or answered with a transport error.
    #[error("model provider unreachable: {0}")]
    Transport(String),
    /// The provider answered with an HTTP error status.
    #[error("model provider answered HTTP {status}: {body}")]
    Status {
        /// HTTP status code.
        status: u16,
        /// Response body (truncated).
        body: String,
    },
    /// The provider's answer did not follow its wire format.
    #[error("model provider sent a malformed response: {0}")]
    Protocol(String),
    /// The provider is misconfigured (missing key, bad script…).
    #[error("model provider misconfigured: {0}")]
    Config(String),
    /// A failure replayed from the journal (`berth replay`): the message is
    /// the original error's whole text, so the turn's terminal reads the same.
    #[error("{0}")]
    Recorded(String),
}

/// A model provider.
#[async_trait]
pub trait ModelProvider: Send + Sync + std::fmt::Debug {
    /// Short name for logs and fingerprints, e.g. `scripted:demo.toml`, `openai:gpt-4o`.
    fn name(&self) -> &str;

    /// Answers `request`, sending deltas on `deltas` as they arrive (the sender is
    /// dropped when the call returns). Must be cancel-safe: the engine drops the
    /// future when the turn is cancelled.
    ///
    /// # Errors
    /// [`ModelError`] when the provider cannot produce a response.
    async fn complete(
        &self,
        request: &ModelRequest,
        deltas: mpsc::UnboundedSender<ModelDelta>,
    ) -> Result<ModelResponse, ModelError>;
}

/// Builds a provider from a `--model` spec: `scripted:PATH` (a script file,
/// see [`scripted`]), `scripted` (the built-in demo script) or `openai:MODEL`
/// (base URL from `OPENAI_BASE_URL`, default `https://api.openai.com/v1`; key
/// from `OPENAI_API_KEY`).
///
/// # Errors
/// [`ModelError::Config`] for an unknown provider or an unreadable script.
pub fn from_spec(spec: &str) -> Result<Arc<dyn ModelProvider>, ModelError> {
    let (kind, arg) = spec.split_once(':').unwrap_or((spec, ""));
    match kind {
        "scripted" if arg.is_empty() => Ok(Arc::new(scripted::ScriptedModel::demo())),
        "scripted" => Ok(Arc::new(scripted::ScriptedModel::from_file(arg.as_ref())?)),
        "openai" if !arg.is_empty() => Ok(Arc::new(openai::OpenAiModel::from_env(arg)?)),
        _ => Err(ModelError::Config(format!(
            "unknown model spec {spec:?}: use `scripted`, `scripted:PATH` or `openai:MODEL`"
        ))),
    }
}
