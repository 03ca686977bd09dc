//! The replay's stand-ins for what a live run consumes: a model that plays
//! the taped responses, tools that return the taped results, a clock that
//! reads the taped times, and ids and a keyring for the receipts the exit
//! re-derives. None of them calls a model, runs a tool or reads the time.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use berth_runtime::clock::Clock;
use berth_runtime::engine::PermissionDecision;
use berth_runtime::event::ToolKind;
use berth_runtime::ids::IdSource;
use berth_runtime::model::ToolSpec;
use berth_runtime::model::{ModelDelta, ModelError, ModelProvider, ModelRequest, ModelResponse};
use berth_runtime::receipt::{Receipt, Signed};
use berth_runtime::tape::{request_sha256, ModelTape, Tape, ToolTapeOutcome};
use berth_runtime::tools::{
    ResumeInput, Tool, ToolContext, ToolContinuation, ToolError, ToolExit, ToolOutput,
};
use berth_storage::Keyring;
use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;
use tokio::sync::mpsc;

use super::sequencer::Shared;
use crate::session::receipt::Stamper;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A run's taped inputs, served in the order they were consumed.
#[derive(Debug, Default)]
pub(super) struct Inputs {
    model: Mutex<VecDeque<ModelTape>>,
    /// Per call id: its executions (continuation?, outcome), in order.
    tools: Mutex<HashMap<String, VecDeque<(bool, ToolTapeOutcome)>>>,
    permissions: Mutex<HashMap<String, VecDeque<PermissionDecision>>>,
    clock_ms: Mutex<VecDeque<i64>>,
    /// Model calls served so far.
    calls: Mutex<u32>,
    /// Tool executions served so far.
    executions: Mutex<usize>,
}

impl Inputs {
    /// The inputs of a run whose records carried `tape`.
    pub(super) fn new(tape: Tape) -> Self {
        let mut tools: HashMap<String, VecDeque<(bool, ToolTapeOutcome)>> = HashMap::new();
        for entry in tape.tools {
            tools
                .entry(entry.call_id.0)
                .or_default()
                .push_back((entry.resumed, entry.outcome));
        }
        let mut permissions: HashMap<String, VecDeque<PermissionDecision>> = HashMap::new();
        for entry in tape.permissions {
            permissions
                .entry(entry.tool_call_id.0)
                .or_default()
                .push_back(entry.decision);
        }
        Self {
            model: Mutex::new(tape.model.into()),
            tools: Mutex::new(tools),
            permissions: Mutex::new(permissions),
            clock_ms: Mutex::new(tape.clock_ms.into()),
            calls: Mutex::new(0),
            executions: Mutex::new(0),
        }
    }

    /// Model calls the replayed run made.
    pub(super) fn served_model_calls(&self) -> usize {
        *lock(&self.calls) as usize
    }

    /// Tool executions the replayed run got a recorded result for.
    pub(super) fn served_tool_calls(&self) -> usize {
        *lock(&self.executions)
    }

    /// The recorded answer to the permission request for `call`, if any.
    pub(super) fn permission(&self, call: &str) -> Option<PermissionDecision> {
        lock(&self.permissions).get_mut(call)?.pop_front()
    }

    fn tool(&self, call: &str, resumed: bool) -> Option<ToolTapeOutcome> {
        let mut tools = lock(&self.tools);
        let queue = tools.get_mut(call)?;
        let at = queue.iter().position(|(r, _)| *r == resumed)?;
        *lock(&self.executions) += 1;
        queue.remove(at).map(|(_, outcome)| outcome)
    }
}

/// Plays the run's taped model calls in order. A call whose request differs
/// from the recorded one's (its SHA-256) is a divergence; a call the tape
/// ends before, or one that was abandoned (cancelled while it streamed),
/// streams what was recorded and then never answers (the recorded stop
/// reaches the turn meanwhile).
#[derive(Debug)]
pub(super) struct ReplayModel {
    pub name: String,
    pub inputs: Arc<Inputs>,
    pub shared: Arc<Shared>,
}

#[async_trait]
impl ModelProvider for ReplayModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        deltas: mpsc::UnboundedSender<ModelDelta>,
    ) -> Result<ModelResponse, ModelError> {
        let index = {
            let mut calls = lock(&self.inputs.calls);
            *calls += 1;
            *calls
        };
        let Some(entry) = lock(&self.inputs.model).pop_front() else {
            self.shared.waiting(format!(
                "model call {index} of the run, which has no recorded response"
            ));
            return std::future::pending().await;
        };
        let got = request_sha256(request);
        if got != entry.request_sha256 {
            self.shared.diverge_input(
                "model_request",
                format!(
                    "model call {index} of the run: the engine asks the model something else than it did when recorded"
                ),
                Value::String(entry.request_sha256.clone()),
                Value::String(got),
            );
            return Err(ModelError::Recorded("replay diverged".into()));
        }
        for delta in &entry.deltas {
            let _ = deltas.send(ModelDelta::from(delta));
        }
        match entry.result() {
            Some(result) => result,
            None => {
                self.shared.waiting(format!(
                    "model call {index} of the run, abandoned when recorded (a stop is due)"
                ));
                drop(deltas);
                std::future::pending().await
            }
        }
    }
}

/// A tool of the recorded configuration: its presentation (`spec`, `kind`,
/// `title`, `concurrency_safe`) is the tool's own code, its results come
/// from the tape. A call with no recorded result (it was abandoned, or
/// cancelled while it ran) never returns: the recorded stop or cancel
/// reaches it.
#[derive(Debug)]
pub(super) struct ReplayTool {
    pub inner: Arc<dyn Tool>,
    pub inputs: Arc<Inputs>,
    pub shared: Arc<Shared>,
}

impl ReplayTool {
    async fn play(&self, ctx: &ToolContext, resumed: bool) -> Result<ToolExit, ToolError> {
        let call = ctx.call_id.clone().unwrap_or_default();
        match self.inputs.tool(&call, resumed) {
            Some(outcome) => outcome.result(),
            None => {
                self.shared
                    .waiting(format!("tool call {call}, which has no recorded result"));
                std::future::pending().await
            }
        }
    }
}

#[async_trait]
impl Tool for ReplayTool {
    fn spec(&self) -> ToolSpec {
        self.inner.spec()
    }

    fn kind(&self) -> ToolKind {
        self.inner.kind()
    }

    fn title(&self, arguments: &Value) -> String {
        self.inner.title(arguments)
    }

    async fn call(&self, ctx: &ToolContext, _arguments: Value) -> Result<ToolOutput, ToolError> {
        match self.play(ctx, false).await? {
            ToolExit::Done(output) => Ok(output),
            ToolExit::Suspended(_) => Err(ToolError::invalid(
                "a replayed call suspended where its tool cannot",
            )),
        }
    }

    async fn execute(&self, ctx: &ToolContext, _arguments: Value) -> Result<ToolExit, ToolError> {
        self.play(ctx, false).await
    }

    async fn resume_execution(
        &self,
        ctx: &ToolContext,
        _continuation: &ToolContinuation,
        _resume: &ResumeInput,
    ) -> Result<ToolExit, ToolError> {
        self.play(ctx, true).await
    }

    fn concurrency_safe(&self) -> bool {
        self.inner.concurrency_safe()
    }
}

/// Reads the run's taped clock readings in order; past the last one it
/// keeps reading the last (a replay that reads more often than recorded
/// shows up in what the turn produces, not here).
#[derive(Debug)]
pub(super) struct ReplayClock {
    pub inputs: Arc<Inputs>,
    pub last: Mutex<i64>,
}

impl Clock for ReplayClock {
    fn now(&self) -> DateTime<Utc> {
        let mut last = lock(&self.last);
        if let Some(ms) = lock(&self.inputs.clock_ms).pop_front() {
            *last = ms;
        }
        Utc.timestamp_millis_opt(*last).single().unwrap_or_default()
    }
}

/// A clock stopped at a recorded time (the time of the batch whose events
/// are being re-derived).
#[derive(Debug, Default)]
pub(super) struct FixedClock(Mutex<DateTime<Utc>>);

impl FixedClock {
    pub(super) fn set(&self, at: DateTime<Utc>) {
        *lock(&self.0) = at;
    }
}

impl Clock for FixedClock {
    fn now(&self) -> DateTime<Utc> {
        *lock(&self.0)
    }
}

/// Ids recorded in the events being re-derived, by prefix (`ctl`, `susp`),
/// handed out in order. One that was not recorded gets a marker id, which
/// then shows up as the divergence.
#[derive(Debug, Default)]
pub(super) struct ReplayIds(Mutex<HashMap<String, VecDeque<String>>>);

impl ReplayIds {
    /// Queues `id` (its prefix is what precedes the first `_`).
    pub(super) fn load(&self, id: &str) {
        let prefix = id.split('_').next().unwrap_or("").to_owned();
        lock(&self.0)
            .entry(prefix)
            .or_default()
            .push_back(id.to_owned());
    }

    /// Forgets every queued id.
    pub(super) fn clear(&self) {
        lock(&self.0).clear();
    }
}

impl IdSource for ReplayIds {
    fn new_id(&self, prefix: &str) -> String {
        lock(&self.0)
            .get_mut(prefix)
            .and_then(VecDeque::pop_front)
            .unwrap_or_else(|| format!("{prefix}_unrecorded"))
    }
}

/// What the re-derived receipts are built with: the recorded time and ids,
/// and the journal's keyring (each receipt is re-signed with the key its
/// recorded counterpart names before the two are compared).
#[derive(Debug)]
pub(super) struct ReplayEnv {
    pub clock: FixedClock,
    pub ids: ReplayIds,
    pub keyring: Keyring,
}

impl Stamper for ReplayEnv {
    fn clock(&self) -> &dyn Clock {
        &self.clock
    }

    fn ids(&self) -> &dyn IdSource {
        &self.ids
    }

    fn sign<T: Receipt>(&self, receipt: T) -> Signed<T> {
        self.keyring.sign(receipt)
    }
}
