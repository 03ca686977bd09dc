//! Injected messages reach the turn at exactly the seams the seed defines:
//! steer after the current step (never before a batch dispatches), interrupt
//! before the batch (skipping it), queue only at loop exit and never in a
//! model request.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use berth_runtime::content::Prompt;
use berth_runtime::directives::{Authority, CompletionJudge, ObjectiveJudge};
use berth_runtime::engine::{
    run_turn, SinkError, TurnControl, TurnDeps, TurnOutcome, TurnSink, TurnSpec,
};
use berth_runtime::event::{SessionEvent, ToolCallStatus};
use berth_runtime::frame::{Frame, ToolOutcomeStatus};
use berth_runtime::history::Message;
use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::model::scripted::ScriptedModel;
use berth_runtime::model::{ModelDelta, ModelError, ModelProvider, ModelRequest, ModelResponse};
use berth_runtime::steering::{InjectMode, Injection, Seam};
use berth_runtime::terminal::{Terminal, TerminalKind};
use berth_runtime::tools::{ProcessGroups, ToolSet};
use tokio::sync::mpsc;

const SCRIPT: &str = r#"
[[rules]]
match = "smaller fix"
steps = [ { text = "Doing the smaller fix." } ]
[[rules]]
match = "stop writing"
steps = [ { text = "Understood, not writing." } ]
[[rules]]
match = "start"
steps = [
  { text = "working" },
  { tool_calls = [
      { name = "write_file", arguments = { path = "{cwd}/one.txt", content = "1" } },
      { name = "write_file", arguments = { path = "{cwd}/two.txt", content = "2" } },
  ] },
  { text = "Did the big fix." },
]
[[rules]]
match = "quick"
steps = [ { delay_ms = 100 }, { text = "Did the big fix." } ]
"#;

/// Records the requests a model saw, then answers with the script.
#[derive(Debug)]
struct Recording {
    inner: ScriptedModel,
    seen: Mutex<Vec<ModelRequest>>,
}

#[async_trait]
impl ModelProvider for Recording {
    fn name(&self) -> &str {
        "recording"
    }
    async fn complete(
        &self,
        r: &ModelRequest,
        d: mpsc::UnboundedSender<ModelDelta>,
    ) -> Result<ModelResponse, ModelError> {
        self.seen.lock().unwrap().push(r.clone());
        self.inner.complete(r, d).await
    }
}

type Hook = Box<dyn FnMut(&SessionEvent, &TurnControl) + Send>;

struct Sink {
    control: Arc<TurnControl>,
    events: Mutex<Vec<SessionEvent>>,
    frames: Mutex<Vec<Frame>>,
    hook: Mutex<Hook>,
}

#[async_trait]
impl TurnSink for Sink {
    async fn emit(&self, event: SessionEvent) -> Result<(), SinkError> {
        (self.hook.lock().unwrap())(&event, &self.control);
        self.events.lock().unwrap().push(event);
        Ok(())
    }
    async fn checkpoint(&self, frame: &Frame) -> Result<(), SinkError> {
        self.frames.lock().unwrap().push(frame.clone());
        Ok(())
    }
}

fn inject(control: &TurnControl, id: &str, mode: InjectMode, text: &str) {
    control.steering().push(Injection {
        message_id: id.into(),
        mode,
        content: Prompt::text(text),
        owner: "test".into(),
    });
}

struct Run {
    outcome: TurnOutcome,
    events: Vec<SessionEvent>,
    frames: Vec<Frame>,
    requests: Vec<ModelRequest>,
    dir: tempfile::TempDir,
}

async fn run(prompt: &str, hook: Hook) -> Run {
    run_judged(prompt, hook, None).await
}

async fn run_judged(prompt: &str, hook: Hook, judge: Option<Arc<dyn CompletionJudge>>) -> Run {
    run_with(prompt, hook, judge, 10).await
}

async fn run_limited(prompt: &str, hook: Hook, max_model_calls: u32) -> Run {
    run_with(prompt, hook, None, max_model_calls).await
}

async fn run_with(
    prompt: &str,
    hook: Hook,
    judge: Option<Arc<dyn CompletionJudge>>,
    max_model_calls: u32,
) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let model = Arc::new(Recording {
        inner: ScriptedModel::parse(SCRIPT, "toml", "scripted:seams").unwrap(),
        seen: Mutex::default(),
    });
    let control = Arc::new(TurnControl::default());
    let deps = TurnDeps {
        model: model.clone(),
        tools: ToolSet::builtin(),
        processes: Arc::new(ProcessGroups::default()),
        control: Arc::clone(&control),
        judge,
        needs_approval: vec![],
        budget: None,
        clock: Arc::new(berth_runtime::clock::SystemClock),
    };
    let spec = TurnSpec {
        session_id: SessionId::from("sess_s"),
        turn_id: TurnId::from("turn_s"),
        cwd: dir.path().to_path_buf(),
        additional_directories: vec![],
        history: Default::default(),
        prompt: Prompt::text(prompt),
        max_model_calls,
    };
    let sink = Sink {
        control,
        events: Mutex::default(),
        frames: Mutex::default(),
        hook: Mutex::new(hook),
    };
    let outcome = tokio::time::timeout(Duration::from_secs(20), run_turn(&spec, &deps, &sink))
        .await
        .unwrap()
        .ended()
        .expect("the turn suspended");
    let requests = model.seen.lock().unwrap().clone();
    Run {
        outcome,
        events: sink.events.into_inner().unwrap(),
        frames: sink.frames.into_inner().unwrap(),
        requests,
        dir,
    }
}

fn delivered(events: &[SessionEvent]) -> Vec<(String, Seam)> {
    events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::InjectionDelivered { injection, seam } => {
                Some((injection.message_id.clone(), *seam))
            }
            _ => None,
        })
        .collect()
}

fn final_text(outcome: &TurnOutcome) -> String {
    outcome
        .turn_messages
        .iter()
        .rev()
        .find_map(|m| match m {
            Message::Assistant { text, .. } if !text.is_empty() => Some(text.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

/// Injects once, when the first event of `kind` is emitted.
fn once_at(kind: &'static str, id: &'static str, mode: InjectMode, text: &'static str) -> Hook {
    let mut done = false;
    Box::new(move |event, control| {
        if !done && event.type_name() == kind {
            done = true;
            inject(control, id, mode, text);
        }
    })
}

#[tokio::test]
async fn steer_waits_for_the_batch_then_changes_the_final_answer() {
    // Arrives as the batch is announced: it must not land before dispatch.
    let r = run(
        "start",
        once_at(
            "tool_call",
            "m1",
            InjectMode::Steer,
            "prefer the smaller fix",
        ),
    )
    .await;
    assert_eq!(
        delivered(&r.events),
        vec![("m1".into(), Seam::PostToolDispatch)]
    );
    assert!(
        r.dir.path().join("one.txt").exists() && r.dir.path().join("two.txt").exists(),
        "the batch ran"
    );
    assert_eq!(final_text(&r.outcome), "Doing the smaller fix.");
    // The model read it as a contract directive.
    let last = r.requests.last().unwrap();
    assert!(last.messages().any(|m| matches!(m, Message::User { text } if text == "<directive authority=\"contract\">prefer the smaller fix</directive>")));
}

#[tokio::test]
async fn steer_during_the_last_answer_lands_at_turn_end_and_keeps_the_loop_going() {
    let r = run(
        "quick",
        once_at("turn_started_never", "x", InjectMode::Steer, ""),
    )
    .await;
    assert_eq!(final_text(&r.outcome), "Did the big fix.");
    let mut fired = false;
    let r = run(
        "quick",
        Box::new(move |event, control| {
            if !fired && event.type_name() == "agent_message_chunk" {
                fired = true;
                inject(control, "m2", InjectMode::Steer, "prefer the smaller fix");
            }
        }),
    )
    .await;
    assert_eq!(delivered(&r.events), vec![("m2".into(), Seam::TurnEnd)]);
    assert_eq!(final_text(&r.outcome), "Doing the smaller fix.");
    assert_eq!(r.outcome.terminal.kind, TerminalKind::Completed);
}

#[tokio::test]
async fn interrupt_before_dispatch_skips_the_whole_batch() {
    let r = run(
        "start",
        once_at(
            "tool_call",
            "i1",
            InjectMode::InterruptImmediate,
            "stop writing files",
        ),
    )
    .await;
    assert!(
        !r.dir.path().join("one.txt").exists() && !r.dir.path().join("two.txt").exists(),
        "no call was sent"
    );
    assert_eq!(
        delivered(&r.events),
        vec![("i1".into(), Seam::PreToolDispatch)]
    );
    let interrupted = r
        .events
        .iter()
        .filter(|e| matches!(e, SessionEvent::ToolCallUpdate { status: ToolCallStatus::Failed, raw_output: Some(o), .. }
            if o["interrupted"] == true && o["reason"] == "a user interrupt arrived before this tool call was dispatched"))
        .count();
    assert_eq!(interrupted, 2);
    let skipped = r
        .frames
        .iter()
        .find(|f| f.dispatch_skipped)
        .expect("a checkpoint records the skip");
    assert_eq!(skipped.skip_reason.as_deref(), Some("interrupt_immediate"));
    assert!(skipped
        .tool_outcomes
        .iter()
        .all(|o| o.status == ToolOutcomeStatus::Interrupted));
    // The loop went on and the model read the interrupt where the results were.
    assert_eq!(final_text(&r.outcome), "Understood, not writing.");
    assert_eq!(r.outcome.terminal.kind, TerminalKind::Completed);
}

#[tokio::test]
async fn queue_lands_only_at_loop_exit_and_never_in_a_model_request() {
    let r = run(
        "start",
        once_at(
            "tool_call",
            "q1",
            InjectMode::Queue,
            "note for the audit trail",
        ),
    )
    .await;
    assert_eq!(delivered(&r.events), vec![("q1".into(), Seam::LoopExit)]);
    assert_eq!(
        final_text(&r.outcome),
        "Did the big fix.",
        "the queue did not change behaviour"
    );
    assert!(
        matches!(r.outcome.turn_messages.last(), Some(Message::Queued { message_id, .. }) if message_id == "q1")
    );
    for request in &r.requests {
        assert!(!request
            .messages()
            .any(|m| matches!(m, Message::Queued { .. })));
        assert!(!request
            .messages()
            .any(|m| matches!(m, Message::User { text } if text.contains("audit trail"))));
    }
}

#[tokio::test]
async fn pending_steers_of_a_stopped_turn_are_dropped_not_lost() {
    let r = run(
        "start",
        Box::new(|event, control| {
            if event.type_name() == "tool_call" && control.steering().pending().count() == 0 {
                inject(control, "late", InjectMode::Steer, "prefer the smaller fix");
                control.stop(Terminal::new(TerminalKind::UserCancelled, "cancel"));
            }
        }),
    )
    .await;
    assert_eq!(r.outcome.terminal.kind, TerminalKind::UserCancelled);
    assert!(r.events.iter().any(
        |e| matches!(e, SessionEvent::InjectionDropped { message_id, .. } if message_id == "late")
    ));
    assert!(delivered(&r.events).is_empty());
}

fn directives(events: &[SessionEvent]) -> Vec<(String, Authority, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Directive {
                directive, applied, ..
            } => Some((directive.source.clone(), directive.authority, *applied)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_steer_outranks_the_completion_judge() {
    let judge: Option<Arc<dyn CompletionJudge>> = Some(Arc::new(ObjectiveJudge));
    // Without a steer the judge restates the unmet request and the loop goes on.
    let r = run_judged(
        "quick",
        once_at("never", "x", InjectMode::Steer, ""),
        judge.clone(),
    )
    .await;
    assert_eq!(
        directives(&r.events),
        vec![("completion_judge".into(), Authority::Corrective, true)]
    );
    // With a steer, its contract directive holds: the judge is overruled and
    // the final answer follows the steer.
    let mut fired = false;
    let r = run_judged(
        "quick",
        Box::new(move |event, control| {
            if !fired && event.type_name() == "agent_message_chunk" {
                fired = true;
                inject(control, "m3", InjectMode::Steer, "prefer the smaller fix");
            }
        }),
        judge,
    )
    .await;
    assert_eq!(
        directives(&r.events),
        vec![
            ("steer".into(), Authority::Contract, true),
            ("completion_judge".into(), Authority::Corrective, false)
        ]
    );
    assert_eq!(final_text(&r.outcome), "Doing the smaller fix.");
    let overruled = r.events.iter().find_map(|e| match e {
        SessionEvent::Directive {
            applied: false,
            overruled_by,
            ..
        } => overruled_by.clone(),
        _ => None,
    });
    assert_eq!(overruled.map(|d| d.source), Some("steer".into()));
}

#[tokio::test]
async fn a_steer_with_no_model_call_left_is_dropped_not_delivered() {
    let mut fired = false;
    let hook: Hook = Box::new(move |event, control| {
        if !fired && event.type_name() == "agent_message_chunk" {
            fired = true;
            inject(control, "late", InjectMode::Steer, "prefer the smaller fix");
        }
    });
    let r = run_limited("quick", hook, 1).await;
    assert!(
        delivered(&r.events).is_empty(),
        "the model could not read it"
    );
    assert!(r.events.iter().any(
        |e| matches!(e, SessionEvent::InjectionDropped { message_id, .. } if message_id == "late")
    ));
    assert_eq!(r.outcome.terminal.kind, TerminalKind::Completed);
}
