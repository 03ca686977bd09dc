//! Engine suspension (`seeds/execution-suspension.md`) against a recording
//! sink: where each mode parks, what the frame holds, and that a resume from
//! the frame runs nothing twice.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use berth_runtime::content::Prompt;
use berth_runtime::engine::{
    check_resumable, resume_turn, run_turn, ResumeRefusal, SinkError, TurnControl, TurnDeps,
    TurnExit, TurnSink, TurnSpec,
};
use berth_runtime::event::{SessionEvent, ToolCallStatus};
use berth_runtime::frame::{Frame, Phase, ToolOutcomeStatus};
use berth_runtime::history::{Message, Transcript};
use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::model::scripted::ScriptedModel;
use berth_runtime::model::ModelProvider;
use berth_runtime::suspension::{ResumeCause, SuspendMode};
use berth_runtime::terminal::TerminalKind;
use berth_runtime::tools::{ProcessGroups, ResumeInput, ToolSet};
use serde_json::json;

const SCRIPT: &str = r#"
[[rules]]
match = "two steps"
steps = [
  { tool_call = { name = "shell", arguments = { command = "sleep 0.3; echo A >> log" } } },
  { tool_call = { name = "shell", arguments = { command = "echo B >> log" } } },
  { text = "done" },
]
[[rules]]
match = "one batch"
steps = [
  { tool_calls = [
    { name = "shell", arguments = { command = "sleep 0.3; echo A >> log" } },
    { name = "shell", arguments = { command = "echo B >> log" } },
  ] },
  { text = "done" },
]
[[rules]]
match = "wait"
steps = [
  { tool_call = { name = "wait_for_file", arguments = { path = "{cwd}/flag" } } },
  { text = "saw: {last_tool_result}" },
]
[[rules]]
match = "bad park"
steps = [
  { tool_call = { name = "await_resumption", arguments = { reason = "ci", conditions = { timeout = { durationMinutes = 0 } } } } },
  { text = "told: {last_tool_result}" },
]
[[rules]]
match = "park"
steps = [
  { tool_call = { name = "await_resumption", arguments = { reason = "ci", conditions = { onEvent = "ci.passed" } } } },
  { text = "woke: {last_tool_result}" },
]
[[rules]]
match = "[resumed]"
steps = [ { text = "read: {input}" } ]
"#;

/// Which event asks for a suspension, and in which mode.
type Trigger = Option<(fn(&SessionEvent) -> bool, SuspendMode)>;

/// Records everything; asks for a suspension (through `control`) when the
/// `nth` event matching `trigger` is emitted.
struct Sink {
    control: Arc<TurnControl>,
    events: Mutex<Vec<SessionEvent>>,
    frames: Mutex<Vec<Frame>>,
    trigger: Trigger,
    /// Answer permission requests `allowed`; otherwise never answer.
    approve: bool,
}

#[async_trait]
impl TurnSink for Sink {
    async fn request_permission(
        &self,
        _request: &berth_runtime::engine::PermissionRequest,
    ) -> Result<berth_runtime::engine::PermissionDecision, SinkError> {
        if self.approve {
            return Ok(berth_runtime::engine::PermissionDecision::Allowed);
        }
        std::future::pending().await
    }

    async fn emit(&self, event: SessionEvent) -> Result<(), SinkError> {
        if let Some((matches, mode)) = self.trigger {
            if matches(&event) {
                self.control.request_suspend(mode);
            }
        }
        self.events.lock().unwrap().push(event);
        Ok(())
    }

    async fn checkpoint(&self, frame: &Frame) -> Result<(), SinkError> {
        self.frames.lock().unwrap().push(frame.clone());
        Ok(())
    }
}

fn in_progress(event: &SessionEvent) -> bool {
    matches!(
        event,
        SessionEvent::ToolCallUpdate {
            status: ToolCallStatus::InProgress,
            ..
        }
    )
}

fn announced(event: &SessionEvent) -> bool {
    matches!(event, SessionEvent::ToolCall { .. })
}

struct Setup {
    _dir: tempfile::TempDir,
    spec: TurnSpec,
    deps: TurnDeps,
    sink: Sink,
}

fn setup(prompt: &str, trigger: Trigger) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let model: Arc<dyn ModelProvider> =
        Arc::new(ScriptedModel::parse(SCRIPT, "toml", "scripted:test").unwrap());
    let control = Arc::new(TurnControl::default());
    let spec = TurnSpec {
        session_id: SessionId::from("sess_s"),
        turn_id: TurnId::from("turn_s"),
        cwd: dir.path().canonicalize().unwrap(),
        additional_directories: vec![],
        history: Transcript::default(),
        prompt: Prompt::text(prompt),
        max_model_calls: 10,
    };
    let deps = TurnDeps {
        model,
        tools: ToolSet::builtin(),
        processes: Arc::new(ProcessGroups::default()),
        control: Arc::clone(&control),
        judge: None,
        needs_approval: vec![],
        budget: None,
        clock: Arc::new(berth_runtime::clock::SystemClock),
    };
    let sink = Sink {
        control,
        events: Mutex::default(),
        frames: Mutex::default(),
        trigger,
        approve: false,
    };
    Setup {
        _dir: dir,
        spec,
        deps,
        sink,
    }
}

async fn run(s: &Setup) -> TurnExit {
    tokio::time::timeout(Duration::from_secs(20), run_turn(&s.spec, &s.deps, &s.sink))
        .await
        .expect("turn hung")
}

fn parked(exit: TurnExit) -> Frame {
    match exit {
        TurnExit::Suspended(s) => s.frame,
        TurnExit::Ended(o) => panic!("expected a suspension, got {:?}", o.terminal),
    }
}

/// Resumes `frame` in a fresh turn (new control block, as after a restart).
async fn resume(s: &Setup, frame: Frame, input: Option<&str>) -> (TurnExit, Sink) {
    let control = Arc::new(TurnControl::default());
    let deps = TurnDeps {
        control: Arc::clone(&control),
        ..s.deps.clone()
    };
    check_resumable(&frame, &s.spec, &deps).expect("resumable");
    let sink = Sink {
        control,
        events: Mutex::default(),
        frames: Mutex::default(),
        trigger: None,
        approve: true,
    };
    let input = ResumeInput {
        input: input.map(|t| json!(t)),
        cause: ResumeCause::ExplicitResume,
    };
    let exit = tokio::time::timeout(
        Duration::from_secs(20),
        resume_turn(&s.spec, &deps, &sink, frame, &input),
    )
    .await
    .expect("resumed turn hung");
    (exit, sink)
}

fn log(s: &Setup) -> String {
    std::fs::read_to_string(s.spec.cwd.join("log")).unwrap_or_default()
}

fn ended(exit: TurnExit) -> berth_runtime::engine::TurnOutcome {
    exit.ended().expect("expected the turn to end")
}

fn last_text(messages: &[Message]) -> String {
    messages
        .iter()
        .rev()
        .find_map(|m| match m {
            Message::Assistant { text, .. } if !text.is_empty() => Some(text.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn finish_step_parks_before_the_next_model_call_and_resumes_there() {
    let s = setup("two steps", Some((in_progress, SuspendMode::FinishStep)));
    let frame = parked(run(&s).await);
    assert_eq!(frame.phase, Phase::Provider);
    assert_eq!(frame.iteration, 1);
    assert_eq!(frame.accounting.model_calls, 1);
    assert_eq!(
        log(&s),
        "A\n",
        "the step in flight settled, nothing after it ran"
    );
    assert_eq!(
        s.sink.frames.lock().unwrap().last(),
        Some(&frame),
        "checkpointed before reporting"
    );
    let before = frame.accounting.usage;
    let (exit, _) = resume(&s, frame, None).await;
    let outcome = ended(exit);
    assert_eq!(outcome.terminal.kind, TerminalKind::Completed);
    assert_eq!(log(&s), "A\nB\n");
    // The turn's accounting carries over the pause.
    assert!(outcome.usage.output_tokens > before.output_tokens);
    assert!(outcome.usage.input_tokens > before.input_tokens);
}

#[tokio::test]
async fn interrupt_immediate_mid_batch_settles_the_started_call_and_keeps_the_rest() {
    let s = setup(
        "one batch",
        Some((in_progress, SuspendMode::InterruptImmediate)),
    );
    let frame = parked(run(&s).await);
    assert_eq!(frame.phase, Phase::Tools);
    assert_eq!(frame.tool_outcomes.len(), 1);
    assert_eq!(frame.tool_outcomes[0].status, ToolOutcomeStatus::Completed);
    assert_eq!(frame.unstarted_calls.len(), 1);
    assert_eq!(log(&s), "A\n");
    let second = frame.unstarted_calls[0].id.clone();
    let started_second = s.sink.events.lock().unwrap().iter().any(|e| {
        matches!(e, SessionEvent::ToolCallUpdate { tool_call_id, .. } if *tool_call_id == second)
    });
    assert!(!started_second, "the unstarted call was never dispatched");
    let (exit, _) = resume(&s, frame, None).await;
    let outcome = ended(exit);
    assert_eq!(outcome.terminal.kind, TerminalKind::Completed);
    assert_eq!(log(&s), "A\nB\n", "each call ran exactly once");
    // Results in the model's call order.
    let results: Vec<_> = outcome
        .turn_messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool { tool_call_id, .. } => Some(tool_call_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 2);
    assert_eq!(results[1], second);
}

#[tokio::test]
async fn interrupt_before_dispatch_keeps_the_whole_batch_unstarted() {
    let s = setup(
        "one batch",
        Some((announced, SuspendMode::InterruptImmediate)),
    );
    let frame = parked(run(&s).await);
    assert_eq!(frame.phase, Phase::Tools);
    assert!(frame.tool_outcomes.is_empty());
    assert_eq!(frame.unstarted_calls.len(), 2);
    assert_eq!(log(&s), "");
    let (exit, _) = resume(&s, frame, None).await;
    assert_eq!(ended(exit).terminal.kind, TerminalKind::Completed);
    assert_eq!(log(&s), "A\nB\n");
}

#[tokio::test]
async fn a_waiting_tool_yields_its_continuation_and_is_resumed_not_redispatched() {
    let s = setup("wait", Some((in_progress, SuspendMode::FinishStep)));
    let frame = parked(run(&s).await);
    assert_eq!(frame.phase, Phase::Tools);
    let outcome = &frame.tool_outcomes[0];
    assert_eq!(outcome.status, ToolOutcomeStatus::Suspended);
    assert_eq!(outcome.continuation.as_ref().unwrap().tool, "wait_for_file");
    std::fs::write(s.spec.cwd.join("flag"), "").unwrap();
    let (exit, sink) = resume(&s, frame, None).await;
    let outcome = ended(exit);
    assert!(last_text(&outcome.turn_messages).contains("flag exists"));
    // Resumed through resume_execution: no second `tool_call` announcement.
    let announced_again = sink.events.lock().unwrap().iter().any(announced);
    assert!(!announced_again);
}

#[tokio::test]
async fn the_agent_parks_itself_and_reads_the_resume_input_as_the_call_result() {
    let s = setup("park", None);
    let exit = run(&s).await;
    let TurnExit::Suspended(suspended) = exit else {
        panic!("expected a park");
    };
    let park = suspended.park.clone().expect("an agent park");
    assert_eq!(park.reason, "ci");
    assert_eq!(park.conditions.on_event.as_deref(), Some("ci.passed"));
    let (exit, _) = resume(&s, suspended.frame, Some("the build passed")).await;
    let outcome = ended(exit);
    let text = last_text(&outcome.turn_messages);
    assert!(text.contains("woke: resumed"), "{text}");
    assert!(text.contains("the build passed"), "{text}");
}

#[tokio::test]
async fn a_park_with_invalid_conditions_is_a_tool_error_not_a_park() {
    let s = setup("bad park", None);
    let outcome = ended(run(&s).await);
    let text = last_text(&outcome.turn_messages);
    assert!(
        text.contains("conditions.timeout.durationMinutes"),
        "{text}"
    );
}

#[tokio::test]
async fn resume_input_at_a_provider_waitpoint_is_a_user_message() {
    let s = setup("two steps", Some((in_progress, SuspendMode::FinishStep)));
    let frame = parked(run(&s).await);
    let (exit, _) = resume(&s, frame, Some("look again")).await;
    let outcome = ended(exit);
    assert!(outcome.turn_messages.contains(&Message::User {
        text: "[resumed] look again".into()
    }));
    assert_eq!(
        last_text(&outcome.turn_messages),
        "read: [resumed] look again"
    );
}

#[tokio::test]
async fn a_frame_does_not_resume_under_other_history_configuration_or_version() {
    let s = setup("two steps", Some((in_progress, SuspendMode::FinishStep)));
    let frame = parked(run(&s).await);
    let other_history = TurnSpec {
        history: Transcript::from_messages(vec![Message::User { text: "x".into() }]),
        ..s.spec.clone()
    };
    assert!(matches!(
        check_resumable(&frame, &other_history, &s.deps),
        Err(ResumeRefusal::HistoryChanged { .. })
    ));
    let other_limit = TurnSpec {
        max_model_calls: 3,
        ..s.spec.clone()
    };
    assert!(matches!(
        check_resumable(&frame, &other_limit, &s.deps),
        Err(ResumeRefusal::ConfigurationChanged { .. })
    ));
    let future = Frame {
        version: 99,
        ..frame
    };
    assert!(matches!(
        check_resumable(&future, &s.spec, &s.deps),
        Err(ResumeRefusal::FrameVersion { .. })
    ));
}

fn permission_requested(event: &SessionEvent) -> bool {
    matches!(event, SessionEvent::PermissionRequested { .. })
}

#[tokio::test]
async fn interrupt_immediate_does_not_wait_for_an_approval_that_never_comes() {
    let mut s = setup(
        "one batch",
        Some((permission_requested, SuspendMode::InterruptImmediate)),
    );
    s.deps.needs_approval = vec!["shell".into()];
    let frame = parked(run(&s).await);
    assert_eq!(frame.phase, Phase::Tools);
    assert!(frame.tool_outcomes.is_empty());
    assert_eq!(
        frame.unstarted_calls.len(),
        2,
        "the waiting call stays unstarted"
    );
    assert_eq!(log(&s), "");
    let resolved = s.sink.events.lock().unwrap().iter().any(|e| {
        matches!(e, SessionEvent::PermissionResolved { decision, .. }
            if *decision == berth_runtime::engine::PermissionDecision::Cancelled)
    });
    assert!(resolved, "the abandoned approval is recorded as cancelled");
    let (exit, _) = resume(&s, frame, None).await;
    assert_eq!(ended(exit).terminal.kind, TerminalKind::Completed);
    assert_eq!(log(&s), "A\nB\n");
}
