//! The turn engine against a recording sink: event order, checkpoints, the
//! three cancel guarantees, limits and failures.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use berth_runtime::content::Prompt;
use berth_runtime::engine::{
    run_turn, SinkError, TurnControl, TurnDeps, TurnOutcome, TurnSink, TurnSpec,
};
use berth_runtime::event::{SessionEvent, ToolCallStatus};
use berth_runtime::frame::{Frame, Phase, ToolOutcomeStatus};
use berth_runtime::history::{Message, ToolCallRequest};
use berth_runtime::ids::{SessionId, ToolCallId, TurnId};
use berth_runtime::model::scripted::ScriptedModel;
use berth_runtime::model::{
    ModelDelta, ModelError, ModelProvider, ModelRequest, ModelResponse, ModelStop, Usage,
};
use berth_runtime::terminal::{Terminal, TerminalKind, TerminalOwner};
use berth_runtime::tools::{ProcessGroups, ToolSet};
use serde_json::json;
use tokio::sync::mpsc;

#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<SessionEvent>>,
    frames: Mutex<Vec<Frame>>,
    /// Stop the turn when a tool call goes in progress (with this control).
    stop_on_in_progress: Mutex<Option<(Arc<TurnControl>, Arc<ProcessGroups>)>>,
    fail_after: Option<usize>,
}

#[async_trait]
impl TurnSink for Recorder {
    async fn emit(&self, event: SessionEvent) -> Result<(), SinkError> {
        let mut events = self.events.lock().unwrap();
        if self.fail_after.is_some_and(|n| events.len() >= n) {
            return Err(SinkError("disk on fire".into()));
        }
        if let SessionEvent::ToolCallUpdate {
            status: ToolCallStatus::InProgress,
            ..
        } = &event
        {
            if let Some((control, processes)) = self.stop_on_in_progress.lock().unwrap().as_ref() {
                control.stop(Terminal::new(TerminalKind::UserCancelled, "test cancel"));
                processes.kill_all();
            }
        }
        events.push(event);
        Ok(())
    }

    async fn checkpoint(&self, frame: &Frame) -> Result<(), SinkError> {
        self.frames.lock().unwrap().push(frame.clone());
        Ok(())
    }
}

fn spec(cwd: &std::path::Path, prompt: &str, max_model_calls: u32) -> TurnSpec {
    TurnSpec {
        session_id: SessionId::from("sess_t"),
        turn_id: TurnId::from("turn_t"),
        cwd: cwd.to_path_buf(),
        additional_directories: vec![],
        history: Default::default(),
        prompt: Prompt::text(prompt),
        max_model_calls,
    }
}

fn deps(model: Arc<dyn ModelProvider>) -> TurnDeps {
    TurnDeps {
        model,
        tools: ToolSet::builtin(),
        processes: Arc::new(ProcessGroups::default()),
        control: Arc::new(TurnControl::default()),
        judge: None,
        needs_approval: vec![],
        budget: None,
        clock: Arc::new(berth_runtime::clock::SystemClock),
    }
}

const SCRIPT: &str = r#"
[[rules]]
match = "write"
steps = [
  { thought = "writing" },
  { tool_call = { name = "write_file", arguments = { path = "{cwd}/out.txt", content = "hi" } } },
  { text = "done" },
]
[[rules]]
match = "loop"
steps = [
  { tool_call = { name = "shell", arguments = { command = "true" } } },
  { tool_call = { name = "shell", arguments = { command = "true" } } },
  { tool_call = { name = "shell", arguments = { command = "true" } } },
  { text = "never reached" },
]
[[rules]]
match = "sleepy batch"
steps = [ { tool_calls = [
  { name = "shell", arguments = { command = "sleep 30" } },
  { name = "write_file", arguments = { path = "{cwd}/sibling.txt", content = "x" } },
] } ]
[[rules]]
match = "mystery"
steps = [ { tool_call = { name = "teleport", arguments = {} } }, { text = "ok" } ]
[[rules]]
match = "refuse"
steps = [ { text = "no" }, { stop = "refusal" } ]
[[rules]]
match = "long"
steps = [ { text = "aaaa" }, { tool_call = { name = "shell", arguments = { command = "true" } } }, { stop = "max_tokens" } ]
"#;

fn scripted() -> Arc<dyn ModelProvider> {
    Arc::new(ScriptedModel::parse(SCRIPT, "toml", "scripted:test").unwrap())
}

async fn run(spec: &TurnSpec, deps: &TurnDeps, sink: &Recorder) -> TurnOutcome {
    tokio::time::timeout(Duration::from_secs(20), run_turn(spec, deps, sink))
        .await
        .expect("turn hung")
        .ended()
        .expect("the turn suspended")
}

#[tokio::test]
async fn completed_turn_streams_calls_and_checkpoints_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Recorder::default();
    let out = run(
        &spec(dir.path(), "please write", 10),
        &deps(scripted()),
        &sink,
    )
    .await;
    assert_eq!(out.terminal.kind, TerminalKind::Completed);
    assert_eq!(out.terminal.owner, TerminalOwner::Agent);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "hi"
    );
    let kinds: Vec<_> = sink
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.type_name())
        .collect();
    assert_eq!(
        kinds,
        [
            "agent_thought_chunk",
            "tool_call",
            "tool_call_update",
            "tool_call_update",
            "agent_message_chunk"
        ]
    );
    let frames = sink.frames.lock().unwrap();
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[0].phase, Phase::Tools);
    assert_eq!(frames[0].unstarted_calls.len(), 1);
    assert_eq!(frames[1].phase, Phase::Provider);
    assert_eq!(
        frames[1].tool_outcomes[0].status,
        ToolOutcomeStatus::Completed
    );
    assert_eq!(
        out.turn_messages.len(),
        4,
        "user, assistant(call), tool, assistant"
    );
    assert!(matches!(
        &out.turn_messages[2],
        Message::Tool {
            is_error: false,
            ..
        }
    ));
}

/// A model that asks for two writes and, while answering, the user cancels.
#[derive(Debug)]
struct CancelWhileThinking(Arc<TurnControl>);

#[async_trait]
impl ModelProvider for CancelWhileThinking {
    fn name(&self) -> &str {
        "cancel-while-thinking"
    }
    async fn complete(
        &self,
        req: &ModelRequest,
        _d: mpsc::UnboundedSender<ModelDelta>,
    ) -> Result<ModelResponse, ModelError> {
        let call = |n: u32| ToolCallRequest {
            id: ToolCallId(format!("c{n}")),
            name: "write_file".into(),
            arguments: json!({"path": req.cwd.join(format!("f{n}.txt")), "content": "x"}),
        };
        // The response is complete; the stop lands before the batch dispatches.
        self.0
            .stop(Terminal::new(TerminalKind::UserCancelled, "cancel"));
        Ok(ModelResponse {
            text: String::new(),
            tool_calls: vec![call(1), call(2)],
            usage: Usage::default(),
            stop: ModelStop::ToolUse,
        })
    }
}

#[tokio::test]
async fn a_tool_call_that_was_not_sent_is_never_sent() {
    let dir = tempfile::tempdir().unwrap();
    let control = Arc::new(TurnControl::default());
    let mut d = deps(Arc::new(CancelWhileThinking(Arc::clone(&control))));
    d.control = control;
    let sink = Recorder::default();
    let out = run(&spec(dir.path(), "x", 10), &d, &sink).await;
    assert_eq!(out.terminal.kind, TerminalKind::UserCancelled);
    assert!(
        !dir.path().join("f1.txt").exists() && !dir.path().join("f2.txt").exists(),
        "a cancelled batch left a trace"
    );
    let events = sink.events.lock().unwrap();
    let failed = events
        .iter()
        .filter(|e| matches!(e, SessionEvent::ToolCallUpdate { status: ToolCallStatus::Failed, raw_output: Some(r), .. } if r["dispatched"] == false))
        .count();
    assert_eq!(failed, 2);
    assert!(!events.iter().any(|e| matches!(
        e,
        SessionEvent::ToolCallUpdate {
            status: ToolCallStatus::InProgress,
            ..
        }
    )));
}

#[tokio::test]
async fn an_in_flight_call_is_abandoned_and_its_process_killed() {
    let dir = tempfile::tempdir().unwrap();
    let d = deps(scripted());
    let sink = Recorder::default();
    *sink.stop_on_in_progress.lock().unwrap() =
        Some((Arc::clone(&d.control), Arc::clone(&d.processes)));
    let out = run(&spec(dir.path(), "sleepy batch", 10), &d, &sink).await;
    assert_eq!(out.terminal.kind, TerminalKind::UserCancelled);
    let events = sink.events.lock().unwrap();
    let statuses: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::ToolCallUpdate {
                tool_call_id,
                status,
                raw_output,
                ..
            } => Some((
                tool_call_id.as_str().to_owned(),
                *status,
                raw_output.clone(),
            )),
            _ => None,
        })
        .collect();
    // The first call went in flight and was abandoned; its sibling never started.
    assert!(statuses.iter().any(|(_, s, r)| *s == ToolCallStatus::Failed
        && r.as_ref().is_some_and(|r| r["dispatched"] == true)));
    assert!(statuses.iter().any(|(_, s, r)| *s == ToolCallStatus::Failed
        && r.as_ref().is_some_and(|r| r["dispatched"] == false)));
    assert!(!dir.path().join("sibling.txt").exists());
    assert_eq!(d.processes.prune(), 0, "the sleep's process group is gone");
}

#[tokio::test]
async fn model_call_limit_is_a_policy_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &spec(dir.path(), "loop", 2),
        &deps(scripted()),
        &Recorder::default(),
    )
    .await;
    assert_eq!(out.terminal.kind, TerminalKind::MaxTurnRequests);
    assert_eq!(out.terminal.owner, TerminalOwner::Policy);
}

#[tokio::test]
async fn unknown_tools_fail_the_call_not_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Recorder::default();
    let out = run(&spec(dir.path(), "mystery", 10), &deps(scripted()), &sink).await;
    assert_eq!(out.terminal.kind, TerminalKind::Completed);
    assert!(sink.events.lock().unwrap().iter().any(|e| matches!(e,
        SessionEvent::ToolCallUpdate { status: ToolCallStatus::Failed, raw_output: Some(r), .. } if r["error"] == "unknown_tool")));
}

#[tokio::test]
async fn refusal_and_max_tokens_end_the_turn_without_running_tools() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &spec(dir.path(), "refuse", 10),
        &deps(scripted()),
        &Recorder::default(),
    )
    .await;
    assert_eq!(
        (out.terminal.kind, out.terminal.owner),
        (TerminalKind::Refusal, TerminalOwner::Agent)
    );
    let sink = Recorder::default();
    let out = run(&spec(dir.path(), "long", 10), &deps(scripted()), &sink).await;
    assert_eq!(out.terminal.kind, TerminalKind::MaxTokens);
    assert!(!sink
        .events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, SessionEvent::ToolCall { .. })));
    // The unrun calls are not left in the transcript.
    assert!(
        matches!(&out.turn_messages[1], Message::Assistant { tool_calls, .. } if tool_calls.is_empty())
    );
}

#[derive(Debug)]
struct Broken;

#[async_trait]
impl ModelProvider for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    async fn complete(
        &self,
        _r: &ModelRequest,
        _d: mpsc::UnboundedSender<ModelDelta>,
    ) -> Result<ModelResponse, ModelError> {
        Err(ModelError::Transport("connection refused".into()))
    }
}

#[tokio::test]
async fn provider_and_journal_failures_are_typed_terminals() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &spec(dir.path(), "x", 10),
        &deps(Arc::new(Broken)),
        &Recorder::default(),
    )
    .await;
    assert_eq!(
        (out.terminal.kind, out.terminal.owner),
        (TerminalKind::ProviderError, TerminalOwner::Provider)
    );
    assert!(out.terminal.stop_reason().is_none());
    let sink = Recorder {
        fail_after: Some(1),
        ..Recorder::default()
    };
    let out = run(
        &spec(dir.path(), "please write", 10),
        &deps(scripted()),
        &sink,
    )
    .await;
    assert_eq!(
        (out.terminal.kind, out.terminal.owner),
        (TerminalKind::InternalError, TerminalOwner::Harness)
    );
    assert!(
        !dir.path().join("out.txt").exists(),
        "nothing runs after the journal refused a write"
    );
}

/// Logs every sink call in order, holding what the engine offers to hold.
#[derive(Default)]
struct Ledger(Mutex<Vec<String>>);

impl Ledger {
    fn log(&self, entry: String) {
        self.0.lock().unwrap().push(entry);
    }
}

#[async_trait]
impl TurnSink for Ledger {
    async fn emit(&self, event: SessionEvent) -> Result<(), SinkError> {
        self.log(format!("emit {}", event.type_name()));
        Ok(())
    }

    async fn emit_with_next_write(&self, event: SessionEvent) -> Result<(), SinkError> {
        self.log(format!("hold {}", event.type_name()));
        Ok(())
    }

    async fn flush(&self) -> Result<(), SinkError> {
        self.log("flush".into());
        Ok(())
    }

    async fn checkpoint(&self, frame: &Frame) -> Result<(), SinkError> {
        self.log(format!("checkpoint {:?}", frame.phase));
        Ok(())
    }
}

#[tokio::test]
async fn a_completed_answer_is_held_for_the_next_write_even_across_a_model_call_that_answers_at_once(
) {
    let dir = tempfile::tempdir().unwrap();
    let sink = Ledger::default();
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        run_turn(
            &spec(dir.path(), "please write", 10),
            &deps(scripted()),
            &sink,
        ),
    )
    .await
    .expect("turn hung")
    .ended()
    .expect("the turn suspended");
    assert_eq!(out.terminal.kind, TerminalKind::Completed);
    // The scripted model answers at once, so each answer's deltas are held:
    // the thought rides on the tool batch's announcement, the final text on
    // the turn's exit (nothing emits it here). No model call had to be
    // waited for; the one flush is the engine's before tools run.
    assert_eq!(
        *sink.0.lock().unwrap(),
        [
            "hold agent_thought_chunk",
            "emit tool_call",
            "checkpoint Tools",
            "flush",
            "emit tool_call_update",
            "emit tool_call_update",
            "checkpoint Provider",
            "hold agent_message_chunk",
        ]
    );
}

/// A model that takes 50 ms to answer `hello`: it streams `before` (if
/// any) at once, the rest of `hello` once the 50 ms are up.
#[derive(Debug)]
struct Waited {
    before: &'static str,
}

#[async_trait]
impl ModelProvider for Waited {
    fn name(&self) -> &str {
        "waited"
    }
    async fn complete(
        &self,
        _req: &ModelRequest,
        deltas: mpsc::UnboundedSender<ModelDelta>,
    ) -> Result<ModelResponse, ModelError> {
        if !self.before.is_empty() {
            let _ = deltas.send(ModelDelta::Text(self.before.into()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let rest = "hello".strip_prefix(self.before).unwrap_or("hello");
        let _ = deltas.send(ModelDelta::Text(rest.into()));
        Ok(ModelResponse {
            text: "hello".into(),
            tool_calls: vec![],
            stop: ModelStop::EndTurn,
            usage: Usage::default(),
        })
    }
}

/// The sink calls of one turn of `hi` answered by `model`.
async fn ledger_of(model: Waited) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let sink = Ledger::default();
    tokio::time::timeout(
        Duration::from_secs(20),
        run_turn(&spec(dir.path(), "hi", 10), &deps(Arc::new(model)), &sink),
    )
    .await
    .expect("turn hung")
    .ended()
    .expect("the turn suspended");
    sink.0.into_inner().unwrap()
}

#[tokio::test]
async fn what_streams_while_the_model_still_answers_is_emitted_at_once() {
    // The first delta's write carries whatever was held: no flush of its own.
    assert_eq!(
        ledger_of(Waited { before: "hel" }).await,
        ["emit agent_message_chunk", "hold agent_message_chunk"]
    );
}

#[tokio::test]
async fn what_is_held_is_flushed_while_a_model_call_is_waited_for() {
    assert_eq!(
        ledger_of(Waited { before: "" }).await,
        ["flush", "hold agent_message_chunk"]
    );
}
