//! The replay tape: every non-deterministic input one run of a turn consumed
//! (DESIGN.md, "Deterministic replay"), journaled so that `berth replay` can
//! re-run the turn without calling a model or running a tool.
//!
//! A run (a fresh turn, or a parked turn continued by a resume) gets a
//! [`TapeRecorder`] when it starts. The session actor wraps the run's
//! dependencies in recorders that write to it:
//!
//! | input | recorder | tape field |
//! |---|---|---|
//! | the run's configuration (model name, tools, limits, budget) | written at start | [`Tape::config`] |
//! | each model call: a SHA-256 of the request, the streamed deltas, the response (stop reason, usage, tool calls) or the error | [`TapedModel`] | [`Tape::model`] |
//! | each tool execution (or continuation): its result, file changes, continuation or typed error | [`TapedTool`] | [`Tape::tools`] |
//! | each client answer to a permission request | the journal sink | [`Tape::permissions`] |
//! | each wall-clock reading of the engine (its `wall_ms` accounting) | [`TapedClock`] | [`Tape::clock_ms`] |
//!
//! Whatever is on the recorder rides on the next event record the run
//! journals (the same batch as the first event that depends on it, inside
//! the hash-chained row: `{"at", "event", "tape"}`, see [`TapedRecord`]);
//! what is left when the run leaves the engine rides on its `turn_ended` or
//! `suspended` batch. A call abandoned by a cancel leaves a model entry with
//! the deltas streamed so far and no outcome; a tool call abandoned leaves
//! none. Clock readings and ids the session actor consumes are not taped:
//! they are in the events themselves (`at`, `decided_at`, `suspended_at`,
//! handles, control ids), and replay feeds them back from there.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::budget::Budget;
use crate::clock::Clock;
use crate::engine::PermissionDecision;
use crate::event::{EventRecord, SessionEvent, ToolKind};
use crate::history::ToolCallRequest;
use crate::ids::ToolCallId;
use crate::model::{
    ModelDelta, ModelError, ModelProvider, ModelRequest, ModelResponse, ModelStop, ToolSpec, Usage,
};
use crate::tools::{
    AgentPark, FileChange, ResumeInput, Tool, ToolContext, ToolContinuation, ToolError, ToolExit,
    ToolOutput, ToolSuspension,
};

/// What one run of a turn consumed (or the part of it one record carries).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tape {
    /// The run's configuration (on the run's first record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<TurnConfig>,
    /// Model calls, in call order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model: Vec<ModelTape>,
    /// Tool executions, in completion order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolTape>,
    /// Permission answers, in answer order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub permissions: Vec<PermissionTape>,
    /// The engine's wall-clock readings, unix ms, in reading order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clock_ms: Vec<i64>,
}

impl Tape {
    /// Whether nothing is on it.
    pub fn is_empty(&self) -> bool {
        self.config.is_none()
            && self.model.is_empty()
            && self.tools.is_empty()
            && self.permissions.is_empty()
            && self.clock_ms.is_empty()
    }

    /// Appends `other` after this tape's entries (a later record's part).
    pub fn extend(&mut self, other: Tape) {
        if other.config.is_some() {
            self.config = other.config;
        }
        self.model.extend(other.model);
        self.tools.extend(other.tools);
        self.permissions.extend(other.permissions);
        self.clock_ms.extend(other.clock_ms);
    }
}

/// What a run was configured with (a model name and a tool set are code
/// and configuration, not journal data: replay checks it runs the same).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnConfig {
    /// The model provider's name (`scripted:…`, `openai:…`).
    pub model: String,
    /// Model calls allowed per turn.
    pub max_model_calls: u32,
    /// The tools offered, by name (sorted).
    pub tools: Vec<String>,
    /// Tools whose calls needed a client's approval.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub needs_approval: Vec<String>,
    /// The completion judge in force (its type name, e.g. `ObjectiveJudge`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<String>,
    /// The budget the run was checked against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// [`crate::engine::config_fingerprint`] of the run (also in its frames).
    pub config_fingerprint: String,
}

/// One streamed piece of a model response, as taped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TapedDelta {
    /// Answer text.
    Text(String),
    /// Reasoning text.
    Thought(String),
}

impl From<&ModelDelta> for TapedDelta {
    fn from(delta: &ModelDelta) -> Self {
        match delta {
            ModelDelta::Text(t) => Self::Text(t.clone()),
            ModelDelta::Thought(t) => Self::Thought(t.clone()),
        }
    }
}

impl From<&TapedDelta> for ModelDelta {
    fn from(delta: &TapedDelta) -> Self {
        match delta {
            TapedDelta::Text(t) => Self::Text(t.clone()),
            TapedDelta::Thought(t) => Self::Thought(t.clone()),
        }
    }
}

/// One model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelTape {
    /// `sha256:<hex>` of the request's JSON (everything the model read:
    /// transcript, this turn's messages, tool specs, call index).
    pub request_sha256: String,
    /// The deltas streamed, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deltas: Vec<TapedDelta>,
    /// How the call ended; `None`: abandoned (the turn was stopped while it
    /// streamed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<ModelOutcome>,
}

/// How a model call ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelOutcome {
    /// A response.
    Response {
        /// The response text when it is not the concatenated text deltas
        /// (absent in the common case, to keep the tape small).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// The tool calls, in the model's order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCallRequest>,
        /// Tokens used.
        usage: Usage,
        /// Why it ended.
        stop: ModelStop,
    },
    /// The provider failed; the error's whole message.
    Error {
        /// `ModelError`'s display text.
        message: String,
    },
}

/// The concatenated text deltas of a call.
pub fn streamed_text(deltas: &[TapedDelta]) -> String {
    deltas
        .iter()
        .filter_map(|d| match d {
            TapedDelta::Text(t) => Some(t.as_str()),
            TapedDelta::Thought(_) => None,
        })
        .collect()
}

impl ModelTape {
    /// The provider's answer this entry records (`None`: abandoned).
    pub fn result(&self) -> Option<Result<ModelResponse, ModelError>> {
        Some(match self.outcome.as_ref()? {
            ModelOutcome::Response {
                text,
                tool_calls,
                usage,
                stop,
            } => Ok(ModelResponse {
                text: text.clone().unwrap_or_else(|| streamed_text(&self.deltas)),
                tool_calls: tool_calls.clone(),
                usage: *usage,
                stop: *stop,
            }),
            ModelOutcome::Error { message } => Err(ModelError::Recorded(message.clone())),
        })
    }
}

/// `sha256:<hex>` over everything a model request carries: the history's
/// chained fingerprint ([`crate::history::Transcript::fingerprint`], taken
/// from the request when the engine set it, so a call costs what its turn
/// costs, not what the whole history costs), then the JSON of the rest
/// (session, turn, call index, cwd, this turn's messages, tool specs).
pub fn request_sha256(request: &ModelRequest) -> String {
    let history = if request.history_fingerprint.is_empty() && !request.history.is_empty() {
        crate::history::Transcript::from_messages(request.history.as_ref().clone())
            .fingerprint()
            .to_owned()
    } else {
        request.history_fingerprint.clone()
    };
    // The bytes of `serde_json::to_vec(&(session, turn, iteration, cwd,
    // turn_messages, tools))` (what tapes were always hashed over), with the
    // tools' encoding taken from the shared specs rather than redone.
    let head = serde_json::to_vec(&(
        &request.session_id,
        &request.turn_id,
        request.iteration,
        &request.cwd,
        &request.turn_messages,
    ))
    .unwrap_or_default();
    // Hashed piece by piece: the digest is the same as over the spliced
    // bytes, without copying the tool specs (kilobytes) on every call.
    let mut hasher = Sha256::new();
    hasher.update(b"berth.model_request.v1\0");
    hasher.update(history.as_bytes());
    hasher.update(b"\0");
    hasher.update(head.strip_suffix(b"]").unwrap_or(&head));
    hasher.update(b",");
    hasher.update(request.tools.json());
    hasher.update(b"]");
    crate::hexstr::sha256_tagged(&hasher.finalize())
}

/// One tool execution (or continuation of a suspended call).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolTape {
    /// The call.
    pub call_id: ToolCallId,
    /// `true`: a continuation (`resume_execution`), not a first run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resumed: bool,
    /// How it came out.
    pub outcome: ToolTapeOutcome,
}

/// How a tool execution came out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolTapeOutcome {
    /// A result.
    Done {
        /// Text the model read.
        content: String,
        /// Structured result.
        raw: Value,
        /// Files it changed.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        file_changes: Vec<FileChange>,
    },
    /// The call yielded a continuation.
    Suspended {
        /// The continuation.
        continuation: ToolContinuation,
        /// The agent's park, when the call parks the session.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        park: Option<Box<AgentPark>>,
    },
    /// A typed tool error.
    Failed {
        /// The error.
        error: ToolError,
    },
}

impl ToolTapeOutcome {
    /// The tape form of an execution's result.
    pub fn of(result: &Result<ToolExit, ToolError>) -> Self {
        match result {
            Ok(ToolExit::Done(output)) => Self::Done {
                content: output.content.clone(),
                raw: output.raw.clone(),
                file_changes: output.file_changes.clone(),
            },
            Ok(ToolExit::Suspended(parked)) => Self::Suspended {
                continuation: parked.continuation.clone(),
                park: parked.park.clone().map(Box::new),
            },
            Err(error) => Self::Failed {
                error: error.clone(),
            },
        }
    }

    /// The execution result this entry records.
    pub fn result(&self) -> Result<ToolExit, ToolError> {
        match self {
            Self::Done {
                content,
                raw,
                file_changes,
            } => Ok(ToolExit::Done(ToolOutput {
                content: content.clone(),
                raw: raw.clone(),
                file_changes: file_changes.clone(),
            })),
            Self::Suspended { continuation, park } => {
                Ok(ToolExit::Suspended(Box::new(ToolSuspension {
                    continuation: continuation.clone(),
                    park: park.as_deref().cloned(),
                })))
            }
            Self::Failed { error } => Err(error.clone()),
        }
    }
}

/// A client's answer to a permission request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PermissionTape {
    /// The call asked about.
    pub tool_call_id: ToolCallId,
    /// The answer.
    pub decision: PermissionDecision,
}

/// An event row as stored in the journal: the record plus the tape entries
/// it carries (absent when none). Decodes every row, taped or not; a plain
/// [`EventRecord`] decodes from the same JSON, ignoring the tape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TapedRecord {
    /// When the event was recorded.
    pub at: DateTime<Utc>,
    /// The fact.
    pub event: SessionEvent,
    /// The inputs consumed before it.
    #[serde(default, skip_serializing_if = "Tape::is_empty")]
    pub tape: Tape,
}

/// The borrowed form a row is written from (same JSON as [`TapedRecord`]).
/// The event goes in as the record's shared encoding
/// ([`EventRecord::event_json`]), so the row does not serialize it again.
#[derive(Debug, Serialize)]
pub struct TapedRecordRef<'a> {
    /// When.
    pub at: &'a DateTime<Utc>,
    /// The fact, as JSON.
    pub event: &'a RawValue,
    /// The inputs.
    #[serde(skip_serializing_if = "Tape::is_empty")]
    pub tape: &'a Tape,
}

impl<'a> TapedRecordRef<'a> {
    /// `record` carrying `tape`.
    pub fn new(record: &'a EventRecord, tape: &'a Tape) -> Self {
        Self {
            at: &record.at,
            event: record.event_json(),
            tape,
        }
    }
}

/// Where a run's recorders write: shared by the recorders and the journal
/// sink, which takes what is on it into the next record. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct TapeRecorder(Arc<Mutex<Tape>>);

impl TapeRecorder {
    /// A recorder for a run configured with `config`.
    pub fn new(config: TurnConfig) -> Self {
        Self(Arc::new(Mutex::new(Tape {
            config: Some(config),
            ..Tape::default()
        })))
    }

    fn with<R>(&self, f: impl FnOnce(&mut Tape) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Everything recorded since the last take.
    pub fn take(&self) -> Tape {
        self.with(std::mem::take)
    }

    /// Records a permission answer.
    pub fn permission(&self, tool_call_id: &ToolCallId, decision: &PermissionDecision) {
        self.with(|t| {
            t.permissions.push(PermissionTape {
                tool_call_id: tool_call_id.clone(),
                decision: decision.clone(),
            })
        });
    }
}

/// Records every model call of the wrapped provider on a tape.
#[derive(Debug)]
pub struct TapedModel {
    inner: Arc<dyn ModelProvider>,
    tape: TapeRecorder,
}

impl TapedModel {
    /// `inner`, recorded on `tape`.
    pub fn new(inner: Arc<dyn ModelProvider>, tape: TapeRecorder) -> Self {
        Self { inner, tape }
    }
}

/// The entry of a call in progress; written on drop, so a call the engine
/// abandons (it drops the future on cancel) still leaves its deltas.
struct Pending {
    tape: TapeRecorder,
    entry: Option<ModelTape>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            self.tape.with(|t| t.model.push(entry));
        }
    }
}

#[async_trait]
impl ModelProvider for TapedModel {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        deltas: mpsc::UnboundedSender<ModelDelta>,
    ) -> Result<ModelResponse, ModelError> {
        let mut pending = Pending {
            tape: self.tape.clone(),
            entry: Some(ModelTape {
                request_sha256: request_sha256(request),
                deltas: Vec::new(),
                outcome: None,
            }),
        };
        let mut forward = |delta: ModelDelta| {
            if let Some(entry) = pending.entry.as_mut() {
                entry.deltas.push(TapedDelta::from(&delta));
            }
            let _ = deltas.send(delta);
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let call = self.inner.complete(request, tx);
        tokio::pin!(call);
        let result = loop {
            tokio::select! {
                biased;
                Some(delta) = rx.recv() => forward(delta),
                result = &mut call => break result,
            }
        };
        while let Ok(delta) = rx.try_recv() {
            forward(delta);
        }
        if let Some(entry) = pending.entry.as_mut() {
            entry.outcome = Some(match &result {
                Ok(response) => ModelOutcome::Response {
                    text: (response.text != streamed_text(&entry.deltas))
                        .then(|| response.text.clone()),
                    tool_calls: response.tool_calls.clone(),
                    usage: response.usage,
                    stop: response.stop,
                },
                Err(e) => ModelOutcome::Error {
                    message: e.to_string(),
                },
            });
        }
        drop(pending);
        result
    }
}

/// Records every execution of the wrapped tool on a tape.
#[derive(Debug)]
pub struct TapedTool {
    inner: Arc<dyn Tool>,
    tape: TapeRecorder,
}

impl TapedTool {
    /// `inner`, recorded on `tape`.
    pub fn new(inner: Arc<dyn Tool>, tape: TapeRecorder) -> Self {
        Self { inner, tape }
    }

    fn record(&self, ctx: &ToolContext, resumed: bool, result: &Result<ToolExit, ToolError>) {
        let entry = ToolTape {
            call_id: ToolCallId(ctx.call_id.clone().unwrap_or_default()),
            resumed,
            outcome: ToolTapeOutcome::of(result),
        };
        self.tape.with(|t| t.tools.push(entry));
    }
}

#[async_trait]
impl Tool for TapedTool {
    fn spec(&self) -> ToolSpec {
        self.inner.spec()
    }

    fn kind(&self) -> ToolKind {
        self.inner.kind()
    }

    fn title(&self, arguments: &Value) -> String {
        self.inner.title(arguments)
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        self.inner.call(ctx, arguments).await
    }

    async fn execute(&self, ctx: &ToolContext, arguments: Value) -> Result<ToolExit, ToolError> {
        let result = self.inner.execute(ctx, arguments).await;
        self.record(ctx, false, &result);
        result
    }

    async fn resume_execution(
        &self,
        ctx: &ToolContext,
        continuation: &ToolContinuation,
        resume: &ResumeInput,
    ) -> Result<ToolExit, ToolError> {
        let result = self.inner.resume_execution(ctx, continuation, resume).await;
        self.record(ctx, true, &result);
        result
    }

    fn concurrency_safe(&self) -> bool {
        self.inner.concurrency_safe()
    }
}

/// Records every reading of the wrapped clock on a tape (unix ms).
#[derive(Debug)]
pub struct TapedClock {
    inner: Arc<dyn Clock>,
    tape: TapeRecorder,
}

impl TapedClock {
    /// `inner`, recorded on `tape`.
    pub fn new(inner: Arc<dyn Clock>, tape: TapeRecorder) -> Self {
        Self { inner, tape }
    }
}

impl Clock for TapedClock {
    fn now(&self) -> DateTime<Utc> {
        let now = self.inner.now();
        self.tape.with(|t| t.clock_ms.push(now.timestamp_millis()));
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::ids::{SessionId, TurnId};
    use crate::model::scripted::ScriptedModel;

    fn request(text: &str) -> ModelRequest {
        ModelRequest {
            session_id: SessionId::from("s"),
            turn_id: TurnId::from("t"),
            iteration: 0,
            cwd: "/tmp".into(),
            history: Arc::new(vec![]),
            history_fingerprint: String::new(),
            turn_messages: vec![crate::history::Message::User { text: text.into() }],
            tools: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_taped_model_records_request_deltas_and_response() {
        let script = r#"
[[rules]]
match = "go"
steps = [{ thought = "hm" }, { text = "a" }, { text = "b" }, { tool_call = { name = "shell", arguments = { command = "ls" } } }]
"#;
        let inner: Arc<dyn ModelProvider> =
            Arc::new(ScriptedModel::parse(script, "toml", "scripted:t").unwrap());
        let tape = TapeRecorder::default();
        let model = TapedModel::new(inner, tape.clone());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let response = model.complete(&request("go"), tx).await.unwrap();
        let mut seen = Vec::new();
        while let Ok(d) = rx.try_recv() {
            seen.push(d);
        }
        assert_eq!(seen.len(), 3, "every delta reaches the engine");
        let taped = tape.take();
        assert_eq!(taped.model.len(), 1);
        let entry = &taped.model[0];
        assert_eq!(entry.request_sha256, request_sha256(&request("go")));
        assert_ne!(entry.request_sha256, request_sha256(&request("went")));
        assert_eq!(entry.deltas.len(), 3);
        // The text is the deltas': not stored twice.
        assert!(matches!(
            &entry.outcome,
            Some(ModelOutcome::Response { text: None, .. })
        ));
        assert_eq!(entry.result().unwrap().unwrap(), response);
        // Round trip through JSON.
        let json = serde_json::to_string(&taped).unwrap();
        assert_eq!(serde_json::from_str::<Tape>(&json).unwrap(), taped);
    }

    #[tokio::test]
    async fn an_abandoned_call_leaves_its_deltas_and_no_outcome() {
        let script = r#"
[[rules]]
match = "go"
steps = [{ text = "partial" }, { delay_ms = 60000 }, { text = "never" }]
"#;
        let inner: Arc<dyn ModelProvider> =
            Arc::new(ScriptedModel::parse(script, "toml", "scripted:t").unwrap());
        let tape = TapeRecorder::default();
        let model = TapedModel::new(inner, tape.clone());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let req = request("go");
        let mut call = Box::pin(model.complete(&req, tx));
        // Poll until the first delta is out, then drop the call (a cancel).
        tokio::select! {
            _ = &mut call => panic!("the call waits a minute"),
            Some(_) = rx.recv() => {}
        }
        drop(call);
        let taped = tape.take();
        assert_eq!(taped.model.len(), 1);
        assert_eq!(
            taped.model[0].deltas,
            vec![TapedDelta::Text("partial".into())]
        );
        assert!(taped.model[0].outcome.is_none());
        assert!(taped.model[0].result().is_none());
    }

    #[test]
    fn a_request_hash_covers_the_history_with_or_without_its_fingerprint() {
        let mut with_history = request("go");
        with_history.history = Arc::new(vec![crate::history::Message::User { text: "a".into() }]);
        let computed = request_sha256(&with_history);
        let transcript = crate::history::Transcript::from_messages(with_history.history.to_vec());
        with_history.history_fingerprint = transcript.fingerprint().to_owned();
        assert_eq!(request_sha256(&with_history), computed);
        assert_ne!(computed, request_sha256(&request("go")));
        let mut other = with_history.clone();
        other.tools = vec![ToolSpec {
            name: "t".into(),
            description: String::new(),
            parameters: serde_json::json!({}),
        }]
        .into();
        assert_ne!(request_sha256(&other), computed);
    }

    /// Tapes recorded before the specs were shared must still verify: the
    /// hash is over the same bytes as the tuple encoding it always used.
    #[test]
    fn a_request_hash_is_over_the_bytes_it_always_was() {
        for tools in [vec![], crate::tools::ToolSet::builtin().specs()] {
            let mut req = request("go \"quoted\" ✓");
            req.iteration = 3;
            req.tools = tools.clone().into();
            let rest = serde_json::to_vec(&(
                &req.session_id,
                &req.turn_id,
                req.iteration,
                &req.cwd,
                &req.turn_messages,
                &tools,
            ))
            .unwrap();
            let mut hasher = Sha256::new();
            hasher.update(b"berth.model_request.v1\0");
            hasher.update(b"\0");
            hasher.update(&rest);
            let expected = format!("sha256:{}", hex::encode(hasher.finalize()));
            assert_eq!(request_sha256(&req), expected);
        }
    }

    #[test]
    fn a_taped_clock_records_ms_readings() {
        let tape = TapeRecorder::default();
        let inner = Arc::new(ManualClock::at(1_000));
        let clock = TapedClock::new(inner.clone(), tape.clone());
        clock.now();
        inner.advance_ms(5);
        clock.now();
        assert_eq!(tape.take().clock_ms, vec![1_000, 1_005]);
    }

    #[test]
    fn tool_outcomes_round_trip() {
        let err: Result<ToolExit, ToolError> = Err(ToolError::RelativePath { path: "x".into() });
        let taped = ToolTapeOutcome::of(&err);
        let json = serde_json::to_value(&taped).unwrap();
        assert_eq!(json["error"]["error"], "relative_path");
        let back: ToolTapeOutcome = serde_json::from_value(json).unwrap();
        assert_eq!(back.result(), err);
    }

    #[test]
    fn a_record_without_tape_keeps_its_old_json() {
        let record = EventRecord::new(
            Utc::now(),
            SessionEvent::AgentMessageChunk { text: "x".into() },
        );
        let empty = Tape::default();
        assert_eq!(
            serde_json::to_vec(&TapedRecordRef::new(&record, &empty)).unwrap(),
            serde_json::to_vec(&record).unwrap()
        );
        let tape = Tape {
            clock_ms: vec![1],
            ..Tape::default()
        };
        let row = serde_json::to_vec(&TapedRecordRef::new(&record, &tape)).unwrap();
        let plain: EventRecord = serde_json::from_slice(&row).unwrap();
        assert_eq!(plain, record);
        let taped: TapedRecord = serde_json::from_slice(&row).unwrap();
        assert_eq!(taped.tape, tape);
    }
}
