//! The `openai` provider: any OpenAI-compatible `/v1/chat/completions` endpoint
//! (OpenAI itself, vLLM, llama.cpp, Ollama, LM Studio, OpenRouter, …).
//!
//! # One model call, on the wire
//!
//! [`OpenAiModel::complete`] sends one `POST {base_url}/chat/completions` with a
//! JSON body and reads the answer as a server-sent-event stream:
//!
//! ```json
//! {
//!   "model": "gpt-4o",
//!   "stream": true,
//!   "stream_options": { "include_usage": true },
//!   "messages": [
//!     { "role": "user", "content": "list files" },
//!     { "role": "assistant", "content": null,
//!       "tool_calls": [ { "id": "call_1", "type": "function",
//!                         "function": { "name": "shell", "arguments": "{\"command\":\"ls\"}" } } ] },
//!     { "role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt" }
//!   ],
//!   "tools": [ { "type": "function",
//!                "function": { "name": "shell", "description": "…", "parameters": { "type": "object" } } } ]
//! }
//! ```
//!
//! The transcript maps one message to one message:
//!
//! | [`Message`] | wire message |
//! |---|---|
//! | `User { text }` | `{role: "user", content: text}` |
//! | `Assistant { text, tool_calls }` | `{role: "assistant", content: text, tool_calls: [{id, type: "function", function: {name, arguments}}]}`; `arguments` is the arguments object serialized to a JSON *string*; `tool_calls` is omitted when there are none and `content` is `null` when the text is empty and there are tool calls |
//! | `Tool { tool_call_id, content, .. }` | `{role: "tool", tool_call_id, content}` (the wire has no error flag: the content already says what failed) |
//!
//! [`ToolSpec`]s become `tools: [{type: "function", function: {name,
//! description, parameters}}]`; the field is omitted when there are no tools.
//! An `Authorization: Bearer <key>` header is sent only when a key is
//! configured, so keyless local servers work.
//!
//! # Reading the stream
//!
//! The answer is read line by line (`\n` or `\r\n`). Blank lines, comment lines
//! (`:` …) and other SSE fields (`event:`, `id:`, `retry:`) are skipped; each
//! `data: {…}` line is one chunk, and `data: [DONE]` ends the response. In each
//! chunk (only choice `0` is read):
//!
//! - `delta.content` is answer text: sent as [`ModelDelta::Text`] and appended
//!   to [`ModelResponse::text`];
//! - `delta.reasoning_content` (DeepSeek, vLLM) or else `delta.reasoning`
//!   (OpenRouter, Ollama) is sent as [`ModelDelta::Thought`];
//! - `delta.tool_calls[]` are fragments of tool calls, keyed by `index`: the id
//!   and function name arrive in the first fragment of a call, the `arguments`
//!   JSON text arrives in pieces that are concatenated. When the stream ends,
//!   each call's arguments are parsed (empty text means `{}`); a call without an
//!   id gets `call_<turn>_<model call>_<n>`;
//! - `finish_reason` sets [`ModelResponse::stop`]: `stop` → `EndTurn`,
//!   `tool_calls` / `function_call` → `ToolUse`, `length` → `MaxTokens`,
//!   `content_filter` → `Refusal`; absent or unknown → `ToolUse` when tool calls
//!   were collected, else `EndTurn`;
//! - the last chunk's `usage` (`prompt_tokens`, `completion_tokens`) is the
//!   call's [`Usage`] (zero when the server sends none);
//! - a chunk with an `error` object fails the call.
//!
//! # Failures
//!
//! | what happened | error |
//! |---|---|
//! | connection refused, DNS, TLS, no headers or no data within the timeout, connection dropped mid-stream | [`ModelError::Transport`] |
//! | a non-2xx status | [`ModelError::Status`] with the first 2 KiB of the body |
//! | a data line that is not JSON, a line over 4 MiB, tool arguments that are not JSON, an `error` chunk | [`ModelError::Protocol`] |
//! | a bad base URL, model or timeout | [`ModelError::Config`] (from the constructors) |
//!
//! When the response was cut off by the token limit (`finish_reason: "length"`),
//! tool calls whose arguments were cut off mid-JSON are dropped instead of
//! failing the call, so the turn ends as `MaxTokens` rather than as a protocol
//! error.
//!
//! [`OpenAiModel::complete`] is cancel-safe: it spawns nothing, so dropping its
//! future drops the HTTP response and closes that connection.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use super::{
    ModelDelta, ModelError, ModelProvider, ModelRequest, ModelResponse, ModelStop, ToolSpec, Usage,
};
use crate::history::{Message, ToolCallRequest};
use crate::ids::ToolCallId;

/// Longest SSE line accepted from the server (bytes, 4 MiB); a longer line
/// fails the call with [`ModelError::Protocol`].
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// Most bytes of an error response body kept in [`ModelError::Status`] (2 KiB).
pub const MAX_ERROR_BODY_BYTES: usize = 2 * 1024;

/// How to reach an OpenAI-compatible endpoint.
///
/// Deserializable so a config file can set it (`base_url` and
/// `request_timeout_ms` default to [`OpenAiConfig::DEFAULT_BASE_URL`] and
/// [`OpenAiConfig::DEFAULT_REQUEST_TIMEOUT_MS`]). Its `Debug` output hides the
/// key.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// API root, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8000/v1`;
    /// `/chat/completions` is appended. A trailing `/` is tolerated. Must be an
    /// `http://` or `https://` URL.
    #[serde(default = "default_base_url")]
    pub base_url: String,
    /// Bearer token sent as `Authorization: Bearer <key>`; `None` (or empty)
    /// sends no `Authorization` header, for local servers that need none.
    #[serde(default)]
    pub api_key: Option<String>,
    /// Model name sent as `model`, e.g. `gpt-4o`.
    pub model: String,
    /// Timeout in milliseconds, applied separately to: connecting, waiting for
    /// the response headers, and each wait for the next piece of the streamed
    /// body. It is an idle timeout, not a cap on the whole response, so a long
    /// generation that keeps streaming is never cut off. Must be > 0.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_base_url() -> String {
    OpenAiConfig::DEFAULT_BASE_URL.to_owned()
}

fn default_request_timeout_ms() -> u64 {
    OpenAiConfig::DEFAULT_REQUEST_TIMEOUT_MS
}

impl OpenAiConfig {
    /// The base URL used when none is configured: OpenAI's public API.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.openai.com/v1";

    /// The timeout used when none is configured: 600 000 ms (10 minutes), as
    /// the official OpenAI SDKs. Generous because slow local servers may send
    /// nothing while they process a long prompt.
    pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 600_000;

    /// A config for `model` with the default base URL and timeout and no key.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            base_url: default_base_url(),
            api_key: None,
            model: model.into(),
            request_timeout_ms: Self::DEFAULT_REQUEST_TIMEOUT_MS,
        }
    }

    /// A config for `model` from the environment: `OPENAI_BASE_URL` (default
    /// [`Self::DEFAULT_BASE_URL`]) and `OPENAI_API_KEY` (optional). Empty
    /// variables count as unset. Not validated: [`OpenAiModel::new`] does that.
    pub fn from_env(model: &str) -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        Self {
            base_url: var("OPENAI_BASE_URL").unwrap_or_else(default_base_url),
            api_key: var("OPENAI_API_KEY"),
            ..Self::new(model)
        }
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .finish()
    }
}

/// An OpenAI-compatible chat completions model (see the [module docs](self)
/// for the wire mapping).
///
/// Holds one HTTP client, so connections are reused across calls. Its `Debug`
/// output hides the key.
pub struct OpenAiModel {
    name: String,
    model: String,
    endpoint: String,
    api_key: Option<String>,
    timeout: Duration,
    client: reqwest::Client,
}

impl fmt::Debug for OpenAiModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiModel")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl OpenAiModel {
    /// Builds a provider from `config`.
    ///
    /// # Errors
    /// [`ModelError::Config`] when the model name is empty, `base_url` is not an
    /// `http(s)://` URL, `request_timeout_ms` is 0, or the HTTP client cannot be
    /// built.
    pub fn new(config: OpenAiConfig) -> Result<Self, ModelError> {
        let model = config.model.trim().to_owned();
        if model.is_empty() {
            return Err(ModelError::Config(
                "openai: the model name is empty; give one, e.g. `--model openai:gpt-4o`".into(),
            ));
        }
        if config.request_timeout_ms == 0 {
            return Err(ModelError::Config(
                "openai: request_timeout_ms must be greater than 0".into(),
            ));
        }
        let endpoint = chat_completions_url(&config.base_url)?;
        let url = reqwest::Url::parse(&endpoint).map_err(|e| {
            ModelError::Config(format!(
                "openai: base URL {:?} is not a valid URL ({e}); set OPENAI_BASE_URL to e.g. {}",
                config.base_url,
                OpenAiConfig::DEFAULT_BASE_URL
            ))
        })?;
        let timeout = Duration::from_millis(config.request_timeout_ms);
        let mut builder = reqwest::Client::builder().connect_timeout(timeout);
        // A server on this machine is never reached through an HTTP proxy that
        // the environment may name for the outside world.
        if is_loopback(&url) {
            builder = builder.no_proxy();
        }
        let client = builder.build().map_err(|e| {
            ModelError::Config(format!(
                "openai: cannot build the HTTP client: {}",
                describe(&e)
            ))
        })?;
        Ok(Self {
            name: format!("openai:{model}"),
            model,
            endpoint,
            api_key: config.api_key.filter(|k| !k.trim().is_empty()),
            timeout,
            client,
        })
    }

    /// Builds a provider for `model` configured from the environment
    /// (`OPENAI_BASE_URL`, default `https://api.openai.com/v1`; `OPENAI_API_KEY`,
    /// optional — without it no `Authorization` header is sent). See
    /// [`OpenAiConfig::from_env`].
    ///
    /// # Errors
    /// [`ModelError::Config`] as [`OpenAiModel::new`].
    pub fn from_env(model: &str) -> Result<Self, ModelError> {
        Self::new(OpenAiConfig::from_env(model))
    }

    /// The URL requests are posted to: `{base_url}/chat/completions`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends the request and returns the response once its headers arrived with
    /// a 2xx status.
    async fn send(&self, body: &WireRequest<'_>) -> Result<reqwest::Response, ModelError> {
        let mut post = self
            .client
            .post(&self.endpoint)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .json(body);
        if let Some(key) = &self.api_key {
            post = post.bearer_auth(key);
        }
        let response = tokio::time::timeout(self.timeout, post.send())
            .await
            .map_err(|_| {
                ModelError::Transport(format!(
                    "{} sent no response within {} ms",
                    self.endpoint,
                    self.timeout.as_millis()
                ))
            })?
            .map_err(|e| {
                ModelError::Transport(format!(
                    "cannot reach {}: {} (is the server running? check OPENAI_BASE_URL)",
                    self.endpoint,
                    describe(&e)
                ))
            })?;
        let status = response.status();
        if !status.is_success() {
            let body = self.read_error_body(response).await;
            return Err(ModelError::Status {
                status: status.as_u16(),
                body,
            });
        }
        Ok(response)
    }

    /// Reads at most [`MAX_ERROR_BODY_BYTES`] of an error body; what cannot be
    /// read in time is left out.
    async fn read_error_body(&self, response: reqwest::Response) -> String {
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while body.len() < MAX_ERROR_BODY_BYTES {
            match tokio::time::timeout(self.timeout, stream.next()).await {
                Ok(Some(Ok(bytes))) => body.extend_from_slice(&bytes),
                _ => break,
            }
        }
        truncate_utf8(&body, MAX_ERROR_BODY_BYTES)
    }
}

#[async_trait]
impl ModelProvider for OpenAiModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        deltas: mpsc::UnboundedSender<ModelDelta>,
    ) -> Result<ModelResponse, ModelError> {
        tracing::debug!(
            session_id = %request.session_id,
            turn_id = %request.turn_id,
            iteration = request.iteration,
            model = %self.name,
            "model call"
        );
        let body = WireRequest::new(&self.model, request.messages(), &request.tools);
        let response = self.send(&body).await?;
        let mut stream = response.bytes_stream();
        let mut lines = LineBuffer::default();
        let mut acc = Accumulator::default();
        // The receiver may be gone (the engine stopped listening); the answer
        // is still assembled and returned.
        let mut emit = |delta: ModelDelta| {
            let _ = deltas.send(delta);
        };
        'read: loop {
            let next = tokio::time::timeout(self.timeout, stream.next())
                .await
                .map_err(|_| {
                    ModelError::Transport(format!(
                        "the response stream from {} stalled: no data for {} ms",
                        self.endpoint,
                        self.timeout.as_millis()
                    ))
                })?;
            match next {
                Some(Ok(bytes)) => {
                    lines.push(&bytes);
                    while let Some(line) = lines.next_line()? {
                        if acc.line(&line, &mut emit)? == Flow::Done {
                            break 'read;
                        }
                    }
                }
                Some(Err(e)) => {
                    return Err(ModelError::Transport(format!(
                        "the response stream from {} broke: {}",
                        self.endpoint,
                        describe(&e)
                    )))
                }
                None => {
                    if let Some(line) = lines.finish()? {
                        acc.line(&line, &mut emit)?;
                    }
                    break;
                }
            }
        }
        let response = acc.finish(request)?;
        tracing::debug!(
            session_id = %request.session_id,
            turn_id = %request.turn_id,
            iteration = request.iteration,
            stop = ?response.stop,
            tool_calls = response.tool_calls.len(),
            input_tokens = response.usage.input_tokens,
            output_tokens = response.usage.output_tokens,
            "model call done"
        );
        Ok(response)
    }
}

/// `{base}/chat/completions`, tolerating trailing slashes on `base`.
fn chat_completions_url(base: &str) -> Result<String, ModelError> {
    let base = base.trim().trim_end_matches('/');
    let lower = base.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(ModelError::Config(format!(
            "openai: base URL {base:?} must start with http:// or https://; set OPENAI_BASE_URL to e.g. {}",
            OpenAiConfig::DEFAULT_BASE_URL
        )));
    }
    Ok(format!("{base}/chat/completions"))
}

fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A reqwest error with its causes (reqwest's own message rarely says why).
fn describe(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// At most `max` bytes of `bytes` as text, cut at a character boundary.
fn truncate_utf8(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(max)]);
    let mut text = text.into_owned();
    // Lossy decoding may grow the text (replacement characters are 3 bytes).
    while text.len() > max {
        text.pop();
    }
    text
}

// ---------------------------------------------------------------------------
// Request body.

#[derive(Debug, Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    stream: bool,
    stream_options: WireStreamOptions,
}

#[derive(Debug, Serialize)]
struct WireStreamOptions {
    include_usage: bool,
}

#[derive(Debug, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum WireMessage<'a> {
    User {
        content: &'a str,
    },
    Assistant {
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireToolCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

#[derive(Debug, Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionCall<'a>,
}

#[derive(Debug, Serialize)]
struct WireFunctionCall<'a> {
    name: &'a str,
    /// The arguments object serialized to JSON text.
    arguments: String,
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Debug, Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> WireRequest<'a> {
    fn new(
        model: &'a str,
        messages: impl Iterator<Item = &'a Message>,
        tools: &'a [ToolSpec],
    ) -> Self {
        Self {
            model,
            messages: messages.filter_map(WireMessage::from_message).collect(),
            tools: tools
                .iter()
                .map(|t| WireTool {
                    kind: "function",
                    function: WireFunction {
                        name: &t.name,
                        description: &t.description,
                        parameters: &t.parameters,
                    },
                })
                .collect(),
            stream: true,
            stream_options: WireStreamOptions {
                include_usage: true,
            },
        }
    }
}

impl<'a> WireMessage<'a> {
    /// The wire form of a message; `None` for audit-only entries.
    fn from_message(message: &'a Message) -> Option<Self> {
        Some(match message {
            Message::User { text } => WireMessage::User { content: text },
            Message::Queued { .. } => return None,
            Message::Assistant { text, tool_calls } => WireMessage::Assistant {
                content: (!text.is_empty() || tool_calls.is_empty()).then_some(text.as_str()),
                tool_calls: tool_calls
                    .iter()
                    .map(|c| WireToolCall {
                        id: c.id.as_str(),
                        kind: "function",
                        function: WireFunctionCall {
                            name: &c.name,
                            arguments: c.arguments.to_string(),
                        },
                    })
                    .collect(),
            },
            Message::Tool {
                tool_call_id,
                content,
                ..
            } => WireMessage::Tool {
                tool_call_id: tool_call_id.as_str(),
                content,
            },
        })
    }
}

// ---------------------------------------------------------------------------
// Response stream: lines.

/// Splits the response body into lines, across network reads.
#[derive(Debug, Default)]
struct LineBuffer {
    buf: Vec<u8>,
    /// Start of the first unreturned line in `buf`.
    start: usize,
    /// Bytes of `buf` already searched for `\n` (so a long line arriving in
    /// many reads is scanned once).
    scanned: usize,
}

impl LineBuffer {
    fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete line without its `\n` / `\r\n`, or `None` until more
    /// bytes arrive.
    fn next_line(&mut self) -> Result<Option<Vec<u8>>, ModelError> {
        match self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
            Some(at) => {
                let end = self.scanned + at;
                let line = strip_cr(&self.buf[self.start..end]);
                check_line_len(line.len())?;
                let line = line.to_vec();
                self.start = end + 1;
                self.scanned = self.start;
                Ok(Some(line))
            }
            None => {
                self.scanned = self.buf.len();
                // One byte of slack for a `\r` that may precede the `\n`.
                check_line_len((self.buf.len() - self.start).saturating_sub(1))?;
                Ok(None)
            }
        }
    }

    /// The unterminated last line at end of stream, if any.
    fn finish(&mut self) -> Result<Option<Vec<u8>>, ModelError> {
        let line = strip_cr(&self.buf[self.start..]);
        check_line_len(line.len())?;
        let line = (!line.is_empty()).then(|| line.to_vec());
        self.start = self.buf.len();
        self.scanned = self.buf.len();
        Ok(line)
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn check_line_len(len: usize) -> Result<(), ModelError> {
    if len > MAX_LINE_BYTES {
        return Err(ModelError::Protocol(format!(
            "a line of the event stream exceeds {MAX_LINE_BYTES} bytes"
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Response stream: chunks.

/// One `data:` chunk. Every field is optional so that servers which leave
/// things out still parse.
#[derive(Debug, Deserialize)]
struct WireChunk {
    #[serde(default)]
    choices: Option<Vec<WireChoice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct WireChoice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    delta: Option<WireDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
struct WireToolCallDelta {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct WireFunctionDelta {
    #[serde(default)]
    name: Option<String>,
    /// A fragment of JSON text; some servers send the whole object instead.
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

/// Whether to keep reading after a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    More,
    Done,
}

/// A tool call being assembled from fragments.
#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// The response assembled so far.
#[derive(Debug, Default)]
struct Accumulator {
    text: String,
    /// Tool calls by wire `index` (model order).
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    done: bool,
}

impl Accumulator {
    /// Handles one line of the stream, emitting text and reasoning deltas.
    fn line(&mut self, line: &[u8], emit: &mut impl FnMut(ModelDelta)) -> Result<Flow, ModelError> {
        let Some(data) = line.strip_prefix(b"data:") else {
            // Blank line, `: comment`, `event:`, `id:`, `retry:`.
            return Ok(Flow::More);
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            return Ok(Flow::Done);
        }
        if data.trim_ascii().is_empty() {
            return Ok(Flow::More);
        }
        let chunk: WireChunk = serde_json::from_slice(data).map_err(|e| {
            ModelError::Protocol(format!(
                "a data line of the event stream is not a valid chunk ({e}): {}",
                preview(data)
            ))
        })?;
        self.chunk(chunk, emit)?;
        Ok(Flow::More)
    }

    fn chunk(
        &mut self,
        chunk: WireChunk,
        emit: &mut impl FnMut(ModelDelta),
    ) -> Result<(), ModelError> {
        if let Some(error) = chunk.error.filter(|e| !e.is_null()) {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| preview(error.to_string().as_bytes()), str::to_owned);
            return Err(ModelError::Protocol(format!(
                "the stream reported an error: {message}"
            )));
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(Usage {
                input_tokens: usage.prompt_tokens.unwrap_or(0),
                output_tokens: usage.completion_tokens.unwrap_or(0),
            });
        }
        // We ask for one choice; anything else a server adds is ignored.
        let choices = chunk.choices.unwrap_or_default();
        for choice in choices.into_iter().filter(|c| c.index.unwrap_or(0) == 0) {
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish_reason = Some(reason);
            }
            let Some(delta) = choice.delta else { continue };
            if let Some(thought) = delta
                .reasoning_content
                .or(delta.reasoning)
                .filter(|t| !t.is_empty())
            {
                emit(ModelDelta::Thought(thought));
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                self.text.push_str(&text);
                emit(ModelDelta::Text(text));
            }
            for fragment in delta.tool_calls.unwrap_or_default() {
                self.tool_call_fragment(fragment);
            }
        }
        Ok(())
    }

    fn tool_call_fragment(&mut self, fragment: WireToolCallDelta) {
        let index = fragment
            .index
            .unwrap_or_else(|| self.index_without_wire_index(fragment.id.as_deref()));
        let call = self.calls.entry(index).or_default();
        if let Some(id) = fragment.id.filter(|id| !id.is_empty()) {
            call.id.get_or_insert(id);
        }
        let Some(function) = fragment.function else {
            return;
        };
        if let Some(name) = function.name.filter(|n| !n.is_empty()) {
            // The name comes in the first fragment; some servers repeat it in
            // every fragment, which must not double it.
            if call.name != name {
                call.name.push_str(&name);
            }
        }
        match function.arguments {
            None | Some(Value::Null) => {}
            Some(Value::String(piece)) => call.arguments.push_str(&piece),
            Some(whole) => call.arguments.push_str(&whole.to_string()),
        }
    }

    /// Servers that leave out `index`: a fragment bringing an unseen id starts
    /// a new call, one bringing a known id continues that call, any other
    /// continues the last one.
    fn index_without_wire_index(&self, id: Option<&str>) -> u64 {
        let last = self.calls.last_key_value().map(|(&key, _)| key);
        match id.filter(|id| !id.is_empty()) {
            Some(id) => self
                .calls
                .iter()
                .find(|(_, call)| call.id.as_deref() == Some(id))
                .map(|(&key, _)| key)
                .unwrap_or_else(|| last.map_or(0, |key| key.saturating_add(1))),
            None => last.unwrap_or(0),
        }
    }

    /// The complete response, once the stream ended.
    fn finish(self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        if !self.done && self.finish_reason.is_none() {
            return Err(ModelError::Transport(
                "the response stream ended before the response was complete (no finish_reason and no [DONE])"
                    .into(),
            ));
        }
        let has_calls = !self.calls.is_empty();
        let stop = match self.finish_reason.as_deref() {
            Some("stop") => ModelStop::EndTurn,
            Some("tool_calls" | "function_call") => ModelStop::ToolUse,
            Some("length") => ModelStop::MaxTokens,
            Some("content_filter") => ModelStop::Refusal,
            _ if has_calls => ModelStop::ToolUse,
            _ => ModelStop::EndTurn,
        };
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (n, (index, call)) in self.calls.into_iter().enumerate() {
            let id = call
                .id
                .unwrap_or_else(|| format!("call_{}_{}_{n}", request.turn_id, request.iteration));
            let arguments = if call.arguments.trim().is_empty() {
                Ok(Value::Object(Default::default()))
            } else {
                serde_json::from_str::<Value>(&call.arguments)
            };
            let arguments = match arguments {
                Ok(arguments) => arguments,
                // Cut off by the token limit: the call cannot be run anyway.
                Err(e) if stop == ModelStop::MaxTokens => {
                    tracing::warn!(
                        turn_id = %request.turn_id,
                        tool_call_id = %id,
                        "dropping tool call cut off by the token limit: {e}"
                    );
                    continue;
                }
                Err(e) => {
                    return Err(ModelError::Protocol(format!(
                        "tool call {id} ({:?}, index {index}) has arguments that are not valid JSON ({e}): {}",
                        call.name,
                        preview(call.arguments.as_bytes())
                    )))
                }
            };
            if call.name.is_empty() {
                return Err(ModelError::Protocol(format!(
                    "tool call {id} (index {index}) has no function name"
                )));
            }
            tool_calls.push(ToolCallRequest {
                id: ToolCallId(id),
                name: call.name,
                arguments,
            });
        }
        Ok(ModelResponse {
            text: self.text,
            tool_calls,
            usage: self.usage.unwrap_or_default(),
            stop,
        })
    }
}

/// The start of `bytes` as text, for error messages.
fn preview(bytes: &[u8]) -> String {
    const MAX: usize = 200;
    let mut text = truncate_utf8(bytes, MAX);
    if bytes.len() > MAX {
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> ModelRequest {
        ModelRequest {
            session_id: "sess_1".into(),
            turn_id: "turn_1".into(),
            iteration: 2,
            cwd: "/tmp".into(),
            history: Default::default(),
            history_fingerprint: String::new(),
            turn_messages: vec![],
            tools: Default::default(),
        }
    }

    /// Feeds `lines` through an accumulator; returns the deltas and the response.
    fn run(lines: &[&str]) -> (Vec<ModelDelta>, Result<ModelResponse, ModelError>) {
        let mut acc = Accumulator::default();
        let mut deltas = Vec::new();
        for line in lines {
            match acc.line(line.as_bytes(), &mut |d| deltas.push(d)) {
                Ok(Flow::More) => {}
                Ok(Flow::Done) => break,
                Err(e) => return (deltas, Err(e)),
            }
        }
        (deltas, acc.finish(&request()))
    }

    #[test]
    fn base_url_tolerates_trailing_slashes_and_rejects_other_schemes() {
        assert_eq!(
            chat_completions_url("http://h:1/v1/").unwrap(),
            "http://h:1/v1/chat/completions"
        );
        assert_eq!(
            chat_completions_url("https://api.openai.com/v1").unwrap(),
            "https://api.openai.com/v1/chat/completions"
        );
        assert!(matches!(
            chat_completions_url("api.openai.com/v1"),
            Err(ModelError::Config(_))
        ));
    }

    #[test]
    fn config_validation() {
        assert!(matches!(
            OpenAiModel::new(OpenAiConfig::new(" ")),
            Err(ModelError::Config(_))
        ));
        let zero = OpenAiConfig {
            request_timeout_ms: 0,
            ..OpenAiConfig::new("m")
        };
        assert!(matches!(OpenAiModel::new(zero), Err(ModelError::Config(_))));
        let model = OpenAiModel::new(OpenAiConfig::new("gpt-4o")).unwrap();
        assert_eq!(model.name(), "openai:gpt-4o");
        assert_eq!(
            model.endpoint(),
            "https://api.openai.com/v1/chat/completions"
        );
    }

    #[test]
    fn debug_hides_the_key() {
        let config = OpenAiConfig {
            api_key: Some("sk-secret".into()),
            ..OpenAiConfig::new("m")
        };
        assert!(!format!("{config:?}").contains("sk-secret"));
        assert!(!format!("{:?}", OpenAiModel::new(config).unwrap()).contains("sk-secret"));
    }

    #[test]
    fn config_deserializes_with_defaults() {
        let config: OpenAiConfig = toml::from_str("model = \"m\"").unwrap();
        assert_eq!(config, OpenAiConfig::new("m"));
    }

    #[test]
    fn line_buffer_splits_across_reads_and_strips_cr() {
        let mut lines = LineBuffer::default();
        let mut out = Vec::new();
        for piece in ["data: a", "b\r", "\n\ndata: c\n: x", "\r\nlast"] {
            lines.push(piece.as_bytes());
            while let Some(line) = lines.next_line().unwrap() {
                out.push(String::from_utf8(line).unwrap());
            }
        }
        out.extend(
            lines
                .finish()
                .unwrap()
                .map(|l| String::from_utf8(l).unwrap()),
        );
        assert_eq!(out, ["data: ab", "", "data: c", ": x", "last"]);
    }

    #[test]
    fn line_buffer_bounds_a_line() {
        let mut lines = LineBuffer::default();
        let block = vec![b'x'; 1024 * 1024];
        let mut result = Ok(None);
        for _ in 0..5 {
            lines.push(&block);
            result = lines.next_line();
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(ModelError::Protocol(_))));
    }

    #[test]
    fn line_buffer_accepts_a_line_of_exactly_the_limit() {
        let mut lines = LineBuffer::default();
        lines.push(&vec![b'x'; MAX_LINE_BYTES]);
        assert!(lines.next_line().unwrap().is_none());
        lines.push(b"\r\n");
        assert_eq!(lines.next_line().unwrap().unwrap().len(), MAX_LINE_BYTES);
    }

    #[test]
    fn text_reasoning_and_usage() {
        let (deltas, response) = run(&[
            ": keep-alive",
            "event: message",
            r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"hmm"}}]}"#,
            r#"data: {"choices":[{"index":0,"delta":{"reasoning":"so"}}]}"#,
            r#"data:{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
            r#"data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}],"usage":null}"#,
            r#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            r#"data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#,
            "data: [DONE]",
        ]);
        let response = response.unwrap();
        assert_eq!(
            deltas,
            [
                ModelDelta::Thought("hmm".into()),
                ModelDelta::Thought("so".into()),
                ModelDelta::Text("Hel".into()),
                ModelDelta::Text("lo".into()),
            ]
        );
        assert_eq!(response.text, "Hello");
        assert_eq!(response.stop, ModelStop::EndTurn);
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 7,
                output_tokens: 3
            }
        );
    }

    #[test]
    fn finish_reasons_map() {
        for (reason, stop) in [
            ("stop", ModelStop::EndTurn),
            ("tool_calls", ModelStop::ToolUse),
            ("function_call", ModelStop::ToolUse),
            ("length", ModelStop::MaxTokens),
            ("content_filter", ModelStop::Refusal),
            ("something_new", ModelStop::EndTurn),
        ] {
            let line =
                format!(r#"data: {{"choices":[{{"delta":{{}},"finish_reason":"{reason}"}}]}}"#);
            let (_, response) = run(&[&line, "data: [DONE]"]);
            assert_eq!(response.unwrap().stop, stop, "{reason}");
        }
    }

    #[test]
    fn missing_finish_reason_depends_on_tool_calls() {
        let (_, response) = run(&[
            r#"data: {"choices":[{"delta":{"content":"x"}}]}"#,
            "data: [DONE]",
        ]);
        assert_eq!(response.unwrap().stop, ModelStop::EndTurn);
        let (_, response) = run(&[
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"t"}}]}}]}"#,
            "data: [DONE]",
        ]);
        let response = response.unwrap();
        assert_eq!(response.stop, ModelStop::ToolUse);
        assert_eq!(response.tool_calls[0].arguments, json!({}));
    }

    #[test]
    fn parallel_tool_calls_are_ordered_by_index_and_ids_generated() {
        let (_, response) = run(&[
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"name":"b","arguments":"{\"x\""}}]}}]}"#,
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"first","type":"function","function":{"name":"a","arguments":""}}]}}]}"#,
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":":1}"}},{"index":0,"function":{"arguments":"{}"}}]}}]}"#,
            r#"data: {"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
            "data: [DONE]",
        ]);
        let calls = response.unwrap().tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].id.as_str(), calls[0].name.as_str()),
            ("first", "a")
        );
        assert_eq!(calls[0].arguments, json!({}));
        assert_eq!(
            (calls[1].id.as_str(), calls[1].name.as_str()),
            ("call_turn_1_2_1", "b")
        );
        assert_eq!(calls[1].arguments, json!({"x": 1}));
    }

    #[test]
    fn tool_calls_without_index_and_with_object_arguments() {
        let (_, response) = run(&[
            r#"data: {"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":{"k":1}}}]}}]}"#,
            r#"data: {"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"g","arguments":"{\"k\":"}}]}}]}"#,
            r#"data: {"choices":[{"delta":{"tool_calls":[{"function":{"name":"g","arguments":"2}"}}]}}]}"#,
            "data: [DONE]",
        ]);
        let calls = response.unwrap().tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].name.as_str(), &calls[0].arguments),
            ("f", &json!({"k": 1}))
        );
        assert_eq!(
            (calls[1].name.as_str(), &calls[1].arguments),
            ("g", &json!({"k": 2}))
        );
    }

    #[test]
    fn invalid_arguments_name_the_call() {
        let (_, response) = run(&[
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c9","function":{"name":"shell","arguments":"{nope"}}]},"finish_reason":"tool_calls"}]}"#,
            "data: [DONE]",
        ]);
        match response {
            Err(ModelError::Protocol(m)) => assert!(m.contains("c9") && m.contains("shell"), "{m}"),
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }

    #[test]
    fn truncated_arguments_under_length_are_dropped() {
        let (_, response) = run(&[
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"shell","arguments":"{\"comm"}}]},"finish_reason":"length"}]}"#,
            "data: [DONE]",
        ]);
        let response = response.unwrap();
        assert_eq!(response.stop, ModelStop::MaxTokens);
        assert!(response.tool_calls.is_empty());
    }

    #[test]
    fn error_chunks_and_bad_shapes_fail_without_panicking() {
        for line in [
            r#"data: {"error":{"message":"overloaded"}}"#,
            r#"data: {"choices":"nope"}"#,
            r#"data: {"choices":[{"delta":{"content":5}}]}"#,
            r#"data: [1,2"#,
            "data: \u{1F600}",
        ] {
            let (_, response) = run(&[line]);
            assert!(
                matches!(response, Err(ModelError::Protocol(_))),
                "{line}: {response:?}"
            );
        }
        let (_, response) = run(&["data: \"just a string\""]);
        assert!(matches!(response, Err(ModelError::Protocol(_))));
    }

    #[test]
    fn a_stream_that_just_stops_is_a_transport_error() {
        let (_, response) = run(&[r#"data: {"choices":[{"delta":{"content":"par"}}]}"#]);
        assert!(matches!(response, Err(ModelError::Transport(_))));
    }

    #[test]
    fn request_body_shape() {
        let messages = [
            Message::User { text: "hi".into() },
            Message::Assistant {
                text: String::new(),
                tool_calls: vec![ToolCallRequest {
                    id: "c1".into(),
                    name: "shell".into(),
                    arguments: json!({"command": "ls"}),
                }],
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: "a.txt".into(),
                is_error: false,
            },
            Message::Assistant {
                text: "done".into(),
                tool_calls: vec![],
            },
        ];
        let body = serde_json::to_value(WireRequest::new("m", messages.iter(), &[])).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "m",
                "stream": true,
                "stream_options": {"include_usage": true},
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "c1", "type": "function",
                         "function": {"name": "shell", "arguments": "{\"command\":\"ls\"}"}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
                    {"role": "assistant", "content": "done"},
                ],
            })
        );
    }

    #[test]
    fn truncate_utf8_cuts_at_a_char_boundary() {
        let s = "é".repeat(10);
        let t = truncate_utf8(s.as_bytes(), 5);
        assert!(t.len() <= 5 && t.starts_with("éé"));
    }
}
