//! `berth replay` over sessions produced by a real `Node` (system clock,
//! random ids, the scripted model, real tools) in the conformance scenarios:
//! steer, interrupt, cancel, suspend in each mode, timer resume, self-park
//! with input. Each replay re-runs every turn with the model and the tools
//! unavailable and must reproduce every event and receipt byte for byte; a
//! recorded model answer changed, or a resume input edited, must fail it at
//! the first differing event.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use berth_actors::node::{NewSession, ResumeParams, SuspendParams};
use berth_actors::replay::{replay_session, CutCause, ReplayError, ReplayOptions, ReplayReport};
use berth_actors::{Node, NodeConfig, SessionNotice, Watcher};
use berth_runtime::content::Prompt;
use berth_runtime::event::{SessionEvent, ToolCallStatus, ToolKind};
use berth_runtime::ids::SessionId;
use berth_runtime::model::scripted::ScriptedModel;
use berth_runtime::model::{
    ModelDelta, ModelError, ModelProvider, ModelRequest, ModelResponse, ToolSpec,
};
use berth_runtime::steering::Seam;
use berth_runtime::suspension::{Initiator, ResumeCause, ResumeConditions, SuspendMode};
use berth_runtime::terminal::TerminalKind;
use berth_runtime::tools::{
    ResumeInput, Tool, ToolContext, ToolContinuation, ToolError, ToolExit, ToolOutput, ToolSet,
};
use berth_storage::Keyring;
use redb::{ReadableTable, TableDefinition};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify, Semaphore};

const SCRIPT: &str = r#"
fallback = "noted: {input}"

[[rules]]
match = "do the big fix"
steps = [
  { thought = "Plan: one command, then report." },
  { text = "Starting the big fix." },
  { tool_call = { name = "shell", arguments = { command = "while [ ! -e release ]; do sleep 0.01; done; echo fixed", timeout_ms = 20000 } } },
  { text = "Did the big fix." },
]

[[rules]]
match = "stall before answering"
steps = [ { delay_ms = 60000 }, { text = "Too late." } ]

[[rules]]
match = "prefer the smaller fix"
steps = [ { text = "Did the smaller fix instead." } ]

[[rules]]
match = "write two notes"
steps = [
  { text = "Writing two notes." },
  { tool_calls = [
      { name = "write_file", arguments = { path = "{cwd}/note-1.txt", content = "one\n" } },
      { name = "write_file", arguments = { path = "{cwd}/note-2.txt", content = "two\n" } },
  ] },
  { text = "Wrote two notes." },
]

[[rules]]
match = "stop writing now"
steps = [ { text = "Stopped, as asked." } ]

[[rules]]
match = "two steps"
steps = [
  { text = "Step A, then step B." },
  { tool_calls = [
      { name = "shell", arguments = { command = "while [ ! -e release ]; do sleep 0.01; done; echo A >> log", timeout_ms = 20000 } },
      { name = "write_file", arguments = { path = "{cwd}/b.txt", content = "B\n" } },
  ] },
  { text = "Both steps done." },
]

[[rules]]
match = "read both"
steps = [
  { tool_calls = [
      { name = "read_file", arguments = { path = "{cwd}/a.txt" } },
      { name = "read_file", arguments = { path = "{cwd}/b.txt" } },
  ] },
  { text = "Read: {last_tool_result}" },
]

[[rules]]
match = "spend two"
steps = [
  { tool_calls = [
      { name = "read_file", arguments = { path = "{cwd}/a.txt" } },
      { name = "write_file", arguments = { path = "{cwd}/note-1.txt", content = "again\n" } },
  ] },
  { text = "Spent two." },
]

[[rules]]
match = "park yourself"
steps = [
  { text = "Parking until someone answers." },
  { tool_call = { name = "await_resumption", arguments = { reason = "need the deploy window", summary = "waiting for a window" } } },
  { text = "Resumed with: {last_tool_result}" },
]

[[rules]]
match = "then"
steps = [ { text = "Continuing: {input}" } ]
"#;

/// Everything the session's watcher saw.
#[derive(Default)]
struct Seen {
    events: Mutex<Vec<SessionEvent>>,
    changed: Notify,
}

impl Watcher for Seen {
    fn watcher_id(&self) -> u64 {
        7
    }

    /// Approves writing the first note, refuses everything else.
    fn request_permission(
        &self,
        _session_id: &SessionId,
        request: &berth_runtime::engine::PermissionRequest,
    ) -> Option<tokio::sync::oneshot::Receiver<berth_runtime::engine::PermissionDecision>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let decision = if request.raw_input.to_string().contains("note-1") {
            berth_runtime::engine::PermissionDecision::Allowed
        } else {
            berth_runtime::engine::PermissionDecision::Rejected {
                reason: "not that one".into(),
            }
        };
        let _ = tx.send(decision);
        Some(rx)
    }

    fn notify(&self, notice: &SessionNotice) -> bool {
        self.events
            .lock()
            .unwrap()
            .push(notice.record.event.clone());
        self.changed.notify_waiters();
        true
    }
}

/// The scripted model behind a gate: a test holds a model call open until
/// it has sent its control (no timing involved).
#[derive(Debug)]
struct Gated {
    inner: ScriptedModel,
    armed: AtomicBool,
    entered: Notify,
    open: Semaphore,
}

#[async_trait]
impl ModelProvider for Gated {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        deltas: mpsc::UnboundedSender<ModelDelta>,
    ) -> Result<ModelResponse, ModelError> {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.entered.notify_one();
            let _ = self.open.acquire().await.map(|p| p.forget());
        }
        self.inner.complete(request, deltas).await
    }
}

struct Harness {
    _dir: tempfile::TempDir,
    data: PathBuf,
    cwd: PathBuf,
    keys: Keyring,
    node: Node,
    model: Arc<Gated>,
    seen: Arc<Seen>,
}

impl Harness {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    async fn start_with(configure: impl FnOnce(&mut NodeConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let cwd = dir.path().join("work");
        std::fs::create_dir_all(&cwd).unwrap();
        let cwd = cwd.canonicalize().unwrap();
        let model = Arc::new(Gated {
            inner: ScriptedModel::parse(SCRIPT, "toml", "scripted:replay-test").unwrap(),
            armed: AtomicBool::new(false),
            entered: Notify::new(),
            open: Semaphore::new(0),
        });
        let keys = Keyring::from_keys(vec![("k1".into(), vec![7; 32])]).unwrap();
        let mut config = NodeConfig::new(&data, Arc::clone(&model) as Arc<dyn ModelProvider>);
        config.receipt_keys = Some(keys.clone());
        configure(&mut config);
        let node = Node::start(config).await.unwrap();
        Self {
            _dir: dir,
            data,
            cwd,
            keys,
            node,
            model,
            seen: Arc::new(Seen::default()),
        }
    }

    async fn session(&self) -> SessionId {
        let record = self
            .node
            .new_session(NewSession::in_dir(self.cwd.clone()))
            .await
            .unwrap();
        let id = record.session_id;
        self.node
            .attach(&id, Arc::clone(&self.seen) as Arc<dyn Watcher>, false)
            .await
            .unwrap();
        id
    }

    /// Waits until the watcher saw an event `pred` accepts.
    async fn wait_for(&self, what: &str, pred: impl Fn(&SessionEvent) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let changed = self.seen.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.seen.events.lock().unwrap().iter().any(&pred) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("no {what} within 20 s");
            }
        }
    }

    async fn wait_running(&self, command_part: &str) {
        let call_id = {
            let part = command_part.to_owned();
            self.wait_for("tool call", move |e| {
                matches!(e, SessionEvent::ToolCall { raw_input, .. }
                    if raw_input.to_string().contains(&part))
            })
            .await;
            self.seen
                .events
                .lock()
                .unwrap()
                .iter()
                .rev()
                .find_map(|e| match e {
                    SessionEvent::ToolCall {
                        tool_call_id,
                        raw_input,
                        ..
                    } if raw_input.to_string().contains(command_part) => Some(tool_call_id.clone()),
                    _ => None,
                })
                .unwrap()
        };
        self.wait_for("in-progress update", move |e| {
            matches!(e, SessionEvent::ToolCallUpdate { tool_call_id, status: ToolCallStatus::InProgress, .. }
                if *tool_call_id == call_id)
        })
        .await;
    }

    fn release(&self) {
        std::fs::write(self.cwd.join("release"), "go").unwrap();
    }

    fn prompt(
        &self,
        id: &SessionId,
        text: &str,
    ) -> tokio::task::JoinHandle<berth_actors::PromptOutcome> {
        let node = self.node.clone();
        let id = id.clone();
        let text = text.to_owned();
        tokio::spawn(async move { node.prompt(&id, Prompt::text(text)).await.unwrap() })
    }

    async fn suspend(&self, id: &SessionId, mode: SuspendMode, resume_when: Option<Value>) {
        let node = self.node.clone();
        let id = id.clone();
        let resume_when = resume_when.map(|v| ResumeConditions::parse(&v, "resumeWhen").unwrap());
        // Answered once parked; not awaited here for a running turn.
        tokio::spawn(async move {
            node.suspend(
                &id,
                SuspendParams {
                    mode,
                    reason: Some("replay test".into()),
                    resume_when,
                    actor: "test".into(),
                    initiator: Initiator::Client,
                    require_running: false,
                },
            )
            .await
            .unwrap()
        });
        self.wait_for("suspend request or park", |e| {
            matches!(
                e,
                SessionEvent::SuspendRequested { .. } | SessionEvent::Suspended { .. }
            )
        })
        .await;
    }

    async fn resume(&self, id: &SessionId, input: Option<Value>, continue_transcript: bool) {
        self.node
            .resume(
                id,
                ResumeParams {
                    handle: None,
                    input,
                    continue_transcript,
                    cause: ResumeCause::ExplicitResume,
                    actor: "test".into(),
                    lateness_ms: None,
                    message_id: None,
                    trigger: None,
                },
            )
            .await
            .unwrap();
    }

    /// Stops the node and returns what replay needs (the journal is
    /// released once the node's runtime is gone; see [`recorded`]).
    async fn stop(self) -> Stopped {
        self.node.shutdown().await;
        drop(self.node);
        Stopped {
            _dir: self._dir,
            journal: self.data.join("journal.redb"),
            keys: self.keys,
            cwd: self.cwd,
        }
    }
}

/// Runs `scenario` on a node in its own runtime, then drops the runtime
/// (every task of the node, so the journal file is released), removes the
/// session directory (nothing a replay does may need it) and returns the
/// journal with the scenario's session.
fn recorded<F, Fut>(scenario: F) -> (Stopped, SessionId)
where
    F: FnOnce(Harness) -> Fut,
    Fut: std::future::Future<Output = (Harness, SessionId)>,
{
    recorded_with(|_| {}, scenario)
}

/// [`recorded`] on a node configured by `configure`.
fn recorded_with<F, Fut>(
    configure: impl FnOnce(&mut NodeConfig),
    scenario: F,
) -> (Stopped, SessionId)
where
    F: FnOnce(Harness) -> Fut,
    Fut: std::future::Future<Output = (Harness, SessionId)>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (stopped, id) = rt.block_on(async {
        let h = Harness::start_with(configure).await;
        let (h, id) = scenario(h).await;
        (h.stop().await, id)
    });
    drop(rt);
    std::fs::remove_dir_all(&stopped.cwd).unwrap();
    (stopped, id)
}

struct Stopped {
    _dir: tempfile::TempDir,
    journal: PathBuf,
    keys: Keyring,
    cwd: PathBuf,
}

/// A built-in tool whose presentation replay may use, and whose execution
/// it must never reach.
#[derive(Debug)]
struct Unavailable {
    inner: Arc<dyn Tool>,
    reached: Arc<AtomicBool>,
}

#[async_trait]
impl Tool for Unavailable {
    fn spec(&self) -> ToolSpec {
        self.inner.spec()
    }
    fn kind(&self) -> ToolKind {
        self.inner.kind()
    }
    fn title(&self, arguments: &Value) -> String {
        self.inner.title(arguments)
    }
    fn concurrency_safe(&self) -> bool {
        self.inner.concurrency_safe()
    }
    async fn call(&self, _: &ToolContext, _: Value) -> Result<ToolOutput, ToolError> {
        self.reached.store(true, Ordering::SeqCst);
        Err(ToolError::invalid("replay ran a tool"))
    }
    async fn execute(&self, _: &ToolContext, _: Value) -> Result<ToolExit, ToolError> {
        self.reached.store(true, Ordering::SeqCst);
        Err(ToolError::invalid("replay ran a tool"))
    }
    async fn resume_execution(
        &self,
        _: &ToolContext,
        _: &ToolContinuation,
        _: &ResumeInput,
    ) -> Result<ToolExit, ToolError> {
        self.reached.store(true, Ordering::SeqCst);
        Err(ToolError::invalid("replay ran a tool"))
    }
}

impl Stopped {
    /// Replays with the tools unavailable (and no model: replay takes none);
    /// checks that no tool was reached.
    fn replay(&self, id: &SessionId, verify: bool) -> Result<ReplayReport, ReplayError> {
        let reached = Arc::new(AtomicBool::new(false));
        let tools = ToolSet::builtin().wrapped(|tool| {
            Arc::new(Unavailable {
                inner: Arc::clone(tool),
                reached: Arc::clone(&reached),
            }) as Arc<dyn Tool>
        });
        let options = ReplayOptions { tools, verify };
        let result = replay_session(&self.journal, &self.keys, id, &options);
        assert!(!reached.load(Ordering::SeqCst), "replay ran a tool");
        result
    }

    /// Rewrites the JSON of the first event row of `id` that `edit`
    /// changes (it gets the row's JSON text and returns the new text),
    /// leaving the chain header as it was: `--verify` sees the edit, a plain
    /// replay reads it. Returns the row's seq.
    fn edit(&self, id: &SessionId, edit: impl Fn(&str) -> Option<String>) -> u64 {
        const EVENTS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("events");
        let db = redb::Database::create(&self.journal).unwrap();
        let txn = db.begin_write().unwrap();
        let mut edited = None;
        {
            let mut table = txn.open_table(EVENTS).unwrap();
            let rows: Vec<(u64, Vec<u8>)> = table
                .range((id.as_str(), 0)..=(id.as_str(), u64::MAX))
                .unwrap()
                .map(|e| {
                    let (k, v) = e.unwrap();
                    (k.value().1, v.value().to_vec())
                })
                .collect();
            for (seq, row) in rows {
                let json = std::str::from_utf8(&row[65..]).unwrap();
                if let Some(new_json) = edit(json) {
                    let mut new = row[..65].to_vec();
                    new.extend(new_json.as_bytes());
                    table.insert((id.as_str(), seq), new.as_slice()).unwrap();
                    edited = Some(seq);
                    break;
                }
            }
        }
        txn.commit().unwrap();
        edited.expect("no row to edit")
    }

    /// The seq of the first event of `id` whose JSON contains `needle`.
    fn seq_of(&self, id: &SessionId, needle: &str) -> u64 {
        let log = berth_storage::readonly::read_session(&self.journal, id).unwrap();
        log.events
            .iter()
            .find(|e| String::from_utf8_lossy(&e.json).contains(needle))
            .map(|e| e.seq)
            .unwrap()
    }
}

fn events_of(report: &ReplayReport) -> String {
    serde_json::to_string(report).unwrap()
}

fn assert_replays(report: &ReplayReport, runs: usize) {
    assert_eq!(report.runs.len(), runs, "{}", events_of(report));
    assert!(report.cut_short.is_none(), "{}", events_of(report));
    assert!(report.reproduced > 0, "{}", events_of(report));
    assert!(
        report.reproduced + report.inputs <= report.events,
        "{}",
        events_of(report)
    );
}

#[test]
fn a_steered_turn_replays_byte_for_byte_and_a_changed_answer_does_not() {
    let (stopped, id) = recorded(|h| async move {
        let id = h.session().await;
        let turn = h.prompt(&id, "do the big fix");
        h.wait_running("release").await;
        h.node
            .inject(&id, "steer", &json!("prefer the smaller fix"), "test")
            .await
            .unwrap();
        h.release();
        let outcome = turn.await.unwrap();
        assert_eq!(outcome.terminal.kind, TerminalKind::Completed);
        assert!(h.seen.events.lock().unwrap().iter().any(|e| matches!(
            e,
            SessionEvent::InjectionDelivered {
                seam: Seam::PostToolDispatch,
                ..
            }
        )));
        (h, id)
    });
    let report = stopped.replay(&id, true).unwrap();
    assert_replays(&report, 1);
    // The steer's drain receipt, re-signed identically.
    assert!(report.receipts >= 1, "{}", events_of(&report));
    assert_eq!(report.runs[0].model_calls, 2);
    assert_eq!(report.runs[0].tool_calls, 1);
    assert_eq!(report.runs[0].exit, "ended: completed");
    assert!(report.verified.is_some());

    // The model "answers differently": its recorded text delta changes.
    let chunk = stopped.seq_of(
        &id,
        r#""type":"agent_message_chunk","text":"Starting the big fix.""#,
    );
    stopped.edit(&id, |row| {
        let tape = row.find(r#""tape":"#)?;
        let delta = r#"{"text":"Starting the big fix."}"#;
        row[tape..].contains(delta).then(|| {
            format!(
                "{}{}",
                &row[..tape],
                row[tape..].replace(delta, r#"{"text":"Starting a different fix."}"#)
            )
        })
    });
    match stopped.replay(&id, false) {
        Err(ReplayError::Nondeterminism(d)) => {
            assert_eq!(d.event_type, "agent_message_chunk", "{d}");
            assert_eq!(
                d.expected.as_ref().unwrap()["text"],
                "Starting the big fix.",
                "{d}"
            );
            assert_eq!(
                d.got.as_ref().unwrap()["text"],
                "Starting a different fix.",
                "{d}"
            );
            assert_eq!(d.seq, chunk, "{d}");
        }
        other => panic!("expected a divergence, got {other:?}"),
    }
    // `--verify` sees the edit as tampering (at the row that carries the
    // answer, at or before the chunk).
    match stopped.replay(&id, true) {
        Err(ReplayError::Tampered { finding, .. }) => assert!(finding.seq <= chunk),
        other => panic!("expected tampered, got {other:?}"),
    }
}

#[test]
fn an_interrupt_that_skips_a_batch_replays() {
    let (stopped, id) = recorded(|h| async move {
        let id = h.session().await;
        h.model.armed.store(true, Ordering::SeqCst);
        let turn = h.prompt(&id, "write two notes");
        h.model.entered.notified().await;
        // The model call is in flight: the interrupt waits for the batch.
        h.node
            .inject(&id, "interrupt", &json!("stop writing now"), "test")
            .await
            .unwrap();
        h.model.open.add_permits(1);
        turn.await.unwrap();
        assert!(h.seen.events.lock().unwrap().iter().any(|e| matches!(
            e,
            SessionEvent::InjectionDelivered {
                seam: Seam::PreToolDispatch,
                ..
            }
        )));
        assert!(!h.cwd.join("note-1.txt").exists());
        (h, id)
    });
    let report = stopped.replay(&id, true).unwrap();
    assert_replays(&report, 1);
    assert_eq!(report.runs[0].tool_calls, 0, "the batch was skipped");
}

#[test]
fn a_cancelled_turn_and_a_parallel_batch_replay() {
    let (stopped, id) = recorded(|h| async move {
        let id = h.session().await;
        // Two reads in one parallel group, settling in any order.
        std::fs::write(h.cwd.join("a.txt"), "aaa").unwrap();
        std::fs::write(h.cwd.join("b.txt"), "bbb").unwrap();
        h.prompt(&id, "read both").await.unwrap();
        // A turn cancelled while its command runs: abandoned, never re-run.
        let turn = h.prompt(&id, "do the big fix");
        h.wait_running("release").await;
        h.node.cancel(&id, "test").await.unwrap();
        let outcome = turn.await.unwrap();
        assert_eq!(outcome.terminal.kind, TerminalKind::UserCancelled);
        (h, id)
    });
    let report = stopped.replay(&id, true).unwrap();
    assert_replays(&report, 2);
    assert_eq!(report.runs[1].exit, "ended: user_cancelled");
}

fn completed(e: &SessionEvent) -> bool {
    matches!(e, SessionEvent::TurnEnded { terminal, .. } if terminal.kind == TerminalKind::Completed)
}

#[test]
fn suspensions_in_each_mode_and_their_resumes_replay() {
    let (stopped, id) = recorded(|h| async move {
        let id = h.session().await;
        // finish_step: the running command settles, the turn parks before
        // its next model call; resumed with input.
        let turn = h.prompt(&id, "do the big fix");
        h.wait_running("release").await;
        h.suspend(&id, SuspendMode::FinishStep, None).await;
        h.release();
        turn.await.unwrap();
        h.seen.events.lock().unwrap().clear();
        h.resume(&id, Some(json!({"note": "go on", "n": 1})), true)
            .await;
        h.wait_for("turn end", completed).await;
        // interrupt_immediate: the first call of the batch settles, the
        // second stays unstarted until the resume.
        std::fs::remove_file(h.cwd.join("release")).unwrap();
        h.seen.events.lock().unwrap().clear();
        let turn = h.prompt(&id, "two steps");
        h.wait_running("release").await;
        h.suspend(&id, SuspendMode::InterruptImmediate, None).await;
        h.release();
        turn.await.unwrap();
        assert!(!h.cwd.join("b.txt").exists(), "the second call waits");
        h.seen.events.lock().unwrap().clear();
        h.resume(&id, None, true).await;
        h.wait_for("turn end", completed).await;
        assert!(h.cwd.join("b.txt").exists());
        // wait_for_completion: the prompt finishes, then the idle session
        // parks; a resume with input starts a fresh turn on it.
        std::fs::remove_file(h.cwd.join("release")).unwrap();
        h.seen.events.lock().unwrap().clear();
        let turn = h.prompt(&id, "do the big fix");
        h.wait_running("release").await;
        h.suspend(&id, SuspendMode::WaitForCompletion, None).await;
        h.release();
        turn.await.unwrap();
        h.seen.events.lock().unwrap().clear();
        h.resume(&id, Some(json!("then ship it")), true).await;
        h.wait_for("turn end", completed).await;
        // A parked turn resumed with a fresh transcript: sealed, a digest,
        // a new turn.
        std::fs::remove_file(h.cwd.join("release")).unwrap();
        h.seen.events.lock().unwrap().clear();
        let turn = h.prompt(&id, "do the big fix");
        h.wait_running("release").await;
        h.suspend(&id, SuspendMode::FinishStep, None).await;
        h.release();
        turn.await.unwrap();
        h.seen.events.lock().unwrap().clear();
        h.resume(&id, Some(json!("then start over")), false).await;
        h.wait_for("turn end", completed).await;
        (h, id)
    });
    let report = stopped.replay(&id, true).unwrap();
    let exits: Vec<&str> = report.runs.iter().map(|r| r.exit.as_str()).collect();
    assert_eq!(
        exits,
        [
            "suspended at turn_start",
            "ended: completed",
            "suspended at pre_tool_dispatch",
            "ended: completed",
            "ended: completed",
            "ended: completed",
            "suspended at turn_start",
            "ended: completed",
        ],
        "{}",
        events_of(&report)
    );
    assert_replays(&report, 8);
    // Every suspension's, resumption's and drain decision's receipt.
    assert!(report.receipts >= 16, "{}", events_of(&report));
}

#[test]
fn a_timer_resume_replays() {
    let (stopped, id) = recorded(|h| async move {
        let id = h.session().await;
        let turn = h.prompt(&id, "do the big fix");
        h.wait_running("release").await;
        // Wakes itself 60 ms after the park, with this input.
        h.suspend(
            &id,
            SuspendMode::FinishStep,
            Some(json!({"timeout": {"durationMinutes": 0.001, "onTimeout": "resume_with_input", "input": "then carry on"}})),
        )
        .await;
        h.release();
        turn.await.unwrap();
        h.wait_for("timer resume", |e| {
            matches!(
                e,
                SessionEvent::Resumed {
                    cause: ResumeCause::Timeout,
                    ..
                }
            )
        })
        .await;
        h.wait_for("turn end", completed).await;
        (h, id)
    });
    let report = stopped.replay(&id, true).unwrap();
    assert_replays(&report, 2);
    assert_eq!(report.runs[1].kind, "resumed");
}

#[test]
fn a_self_park_with_input_replays_and_an_edited_input_fails_the_hash_check() {
    let (stopped, id) = recorded(|h| async move {
        let id = h.session().await;
        let outcome = h.prompt(&id, "park yourself").await.unwrap();
        assert!(outcome.suspension_handle.is_some());
        h.resume(&id, Some(json!({"window": "tonight"})), true)
            .await;
        h.wait_for("turn end", completed).await;
        (h, id)
    });
    let report = stopped.replay(&id, true).unwrap();
    assert_replays(&report, 2);
    assert_eq!(report.runs[0].exit, "suspended at post_tool_dispatch");

    // The journaled resume input edited: its hash no longer matches the
    // signed ResumptionReceipt.
    let edited = stopped.edit(&id, |row| {
        row.contains(r#""type":"resumed""#)
            .then(|| row.replace(r#"{"window":"tonight"}"#, r#"{"window":"now"}"#))
    });
    match stopped.replay(&id, false) {
        Err(ReplayError::Nondeterminism(d)) => {
            assert_eq!(d.event_type, "resumption_receipt", "{d}");
            assert!(d.detail.contains("input hash check failed"), "{d}");
            assert!(d.seq > edited, "{d}");
        }
        other => panic!("expected the input hash check to fail, got {other:?}"),
    }
}

#[test]
fn replay_refuses_what_it_cannot_read() {
    let (stopped, id) = recorded(|h| async move {
        let id = h.session().await;
        h.prompt(&id, "hello").await.unwrap();
        (h, id)
    });
    stopped.replay(&id, true).unwrap();
    let missing = SessionId::from("sess_missing");
    assert!(matches!(
        stopped.replay(&missing, false),
        Err(ReplayError::UnknownSession { .. })
    ));
    let nowhere = Stopped {
        _dir: tempfile::tempdir().unwrap(),
        journal: Path::new("/nonexistent/journal.redb").to_path_buf(),
        keys: stopped.keys.clone(),
        cwd: PathBuf::new(),
    };
    assert!(matches!(
        nowhere.replay(&id, false),
        Err(ReplayError::Storage(_))
    ));
    // The tape stripped (as journaled by a berth before replay recording).
    stopped.edit(&id, |row| {
        let tape = row.find(r#","tape":"#)?;
        Some(format!("{}}}", &row[..tape]))
    });
    match stopped.replay(&id, false) {
        Err(ReplayError::NotReplayable { message, .. }) => {
            assert!(message.contains("no replay tape"), "{message}")
        }
        other => panic!("expected not replayable, got {other:?}"),
    }
}

#[test]
fn the_other_controls_replay() {
    let (stopped, id) = recorded(|h| async move {
        let id = h.session().await;
        // A running turn gets a queued note, a steer revoked, a steer
        // replaced, and its command cancelled on its own.
        let turn = h.prompt(&id, "do the big fix");
        h.wait_running("release").await;
        h.node
            .inject(&id, "queue", &json!("for the record"), "test")
            .await
            .unwrap();
        let revoked = h
            .node
            .inject(&id, "steer", &json!("never mind"), "test")
            .await
            .unwrap();
        h.node
            .retract_injection(&id, &revoked, None, "test")
            .await
            .unwrap();
        let replaced = h
            .node
            .inject(&id, "steer", &json!("prefer the smaller fix"), "test")
            .await
            .unwrap();
        h.node
            .retract_injection(
                &id,
                &replaced,
                Some(&json!("prefer the smaller fix, carefully")),
                "test",
            )
            .await
            .unwrap();
        let call = h
            .seen
            .events
            .lock()
            .unwrap()
            .iter()
            .find_map(|e| match e {
                SessionEvent::ToolCall { tool_call_id, .. } => Some(tool_call_id.clone()),
                _ => None,
            })
            .unwrap();
        h.node
            .cancel_tool_call(&id, call.as_str(), Some("too slow"), "test")
            .await
            .unwrap();
        let outcome = turn.await.unwrap();
        assert_eq!(outcome.terminal.kind, TerminalKind::Completed);
        // Rollback, redo, rollback: the transcript the next turns read.
        h.node.rollback(&id, false, "test").await.unwrap();
        h.node.rollback(&id, true, "test").await.unwrap();
        h.node.rollback(&id, false, "test").await.unwrap();
        h.prompt(&id, "hello there").await.unwrap();
        // A parked turn cancelled: sealed, its handle used up.
        h.seen.events.lock().unwrap().clear();
        let turn = h.prompt(&id, "do the big fix");
        h.wait_running("release").await;
        h.suspend(&id, SuspendMode::InterruptImmediate, None).await;
        h.release();
        turn.await.unwrap();
        h.node.cancel(&id, "test").await.unwrap();
        // A running turn closed.
        std::fs::remove_file(h.cwd.join("release")).unwrap();
        h.seen.events.lock().unwrap().clear();
        let turn = h.prompt(&id, "do the big fix");
        h.wait_running("release").await;
        h.node.close(&id, "test").await.unwrap();
        let outcome = turn.await.unwrap();
        assert_eq!(outcome.terminal.kind, TerminalKind::SessionClosed);
        (h, id)
    });
    let report = stopped.replay(&id, true).unwrap();
    let exits: Vec<&str> = report.runs.iter().map(|r| r.exit.as_str()).collect();
    assert_eq!(
        exits,
        [
            "ended: completed",
            "ended: completed",
            "suspended at turn_start",
            "ended: session_closed",
        ],
        "{}",
        events_of(&report)
    );
    assert_replays(&report, 4);
}

#[test]
fn approvals_and_a_budget_suspension_replay() {
    let (stopped, id) = recorded_with(
        |config| {
            config.needs_approval = vec!["write_file".into()];
            config.budgets = vec![berth_runtime::budget::BudgetPolicy {
                label: None,
                limits: berth_runtime::budget::BudgetLimits {
                    max_tool_calls: Some(2),
                    ..Default::default()
                },
            }];
        },
        |h| async move {
            let id = h.session().await;
            // One write approved, one refused: one tool call spent.
            h.prompt(&id, "write two notes").await.unwrap();
            assert!(h.cwd.join("note-1.txt").exists());
            assert!(!h.cwd.join("note-2.txt").exists());
            // The next call uses the budget up: the policy parks the turn
            // before the rest of its batch; an operator grants more.
            std::fs::write(h.cwd.join("a.txt"), "aaa").unwrap();
            let outcome = h.prompt(&id, "spend two").await.unwrap();
            assert_eq!(outcome.terminal.kind, TerminalKind::PolicyBudget);
            h.seen.events.lock().unwrap().clear();
            h.resume(&id, Some(json!({"budget": {"max_tool_calls": 5}})), true)
                .await;
            h.wait_for("turn end", completed).await;
            (h, id)
        },
    );
    let report = stopped.replay(&id, true).unwrap();
    let exits: Vec<&str> = report.runs.iter().map(|r| r.exit.as_str()).collect();
    assert_eq!(
        exits,
        [
            "ended: completed",
            "suspended at pre_tool_dispatch",
            "ended: completed"
        ],
        "{}",
        events_of(&report)
    );
    assert_replays(&report, 3);
}

/// How the turn a crash cuts is known to be running.
enum Running {
    /// Its tool call whose command contains this is running.
    Tool(&'static str),
    /// It was prompted this long ago.
    After(Duration),
}

/// Prompts "hello", then `stalling` (a turn still running once `running`
/// holds), and drops the node's runtime mid-turn, as a crash. The next
/// start seals that turn (`process_restarted`) and the session goes on with
/// "hello again". Returns the stopped journal.
fn crash_mid_turn(stalling: &'static str, running: Running) -> (Stopped, SessionId) {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let rt = runtime();
    let (h, id) = rt.block_on(async {
        let h = Harness::start().await;
        let id = h.session().await;
        h.prompt(&id, "hello").await.unwrap();
        let _turn = h.prompt(&id, stalling);
        match running {
            Running::Tool(command) => h.wait_running(command).await,
            Running::After(wait) => tokio::time::sleep(wait).await,
        }
        (h, id)
    });
    let Harness {
        _dir,
        data,
        cwd,
        keys,
        node,
        ..
    } = h;
    drop(node);
    drop(rt);
    let rt = runtime();
    rt.block_on(async {
        let model = ScriptedModel::parse(SCRIPT, "toml", "scripted:replay-test").unwrap();
        let mut config = NodeConfig::new(&data, Arc::new(model) as Arc<dyn ModelProvider>);
        config.receipt_keys = Some(keys.clone());
        let node = Node::start(config).await.unwrap();
        node.prompt(&id, Prompt::text("hello again")).await.unwrap();
        node.shutdown().await;
    });
    drop(rt);
    let stopped = Stopped {
        _dir,
        journal: data.join("journal.redb"),
        keys,
        cwd,
    };
    (stopped, id)
}

/// A turn berth stopped under before its first model call answered has no
/// tape at all (the tape is written with what the turn journals); replay
/// stops there and says so, as for any run a crash cut, rather than
/// failing as if the journal came from a berth without replay recording.
#[test]
fn a_turn_cut_before_its_first_model_answer_replays_up_to_the_crash() {
    let (stopped, id) = crash_mid_turn(
        "stall before answering",
        Running::After(Duration::from_millis(300)),
    );
    let report = stopped.replay(&id, true).unwrap();
    let cut = report.cut_short.clone().expect("cut short");
    assert_eq!(report.runs.len(), 1, "{}", events_of(&report));
    assert_ne!(cut.turn_id, report.runs[0].turn_id);
}

/// A turn berth stopped under (its runtime dropped mid-turn, as a crash) is
/// sealed at the next start from its checkpoint, which the journal does not
/// keep: replay reproduces everything up to the crash and says where it
/// stopped.
#[test]
fn a_turn_cut_short_by_a_crash_replays_up_to_the_crash() {
    let (stopped, id) = crash_mid_turn("do the big fix", Running::Tool("release"));
    let report = stopped.replay(&id, true).unwrap();
    let cut = report.cut_short.clone().expect("cut short");
    assert_eq!(report.runs.len(), 1, "{}", events_of(&report));
    assert_ne!(cut.turn_id, report.runs[0].turn_id);
    assert!(cut.seq > report.runs[0].last_seq, "{}", events_of(&report));
    assert_eq!(cut.cause, CutCause::Recovered);
}

/// A cancel whose receipt is durable (it was answered `cancelled`) but whose
/// turn berth died before sealing: the next start seals the turn
/// `user_cancelled` (owner `user`), as the client was told, not
/// `process_restarted`; replay still verifies.
#[test]
fn a_journaled_cancel_decides_the_seal_of_a_turn_a_crash_left_open() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let rt = runtime();
    let (h, id) = rt.block_on(async {
        let h = Harness::start().await;
        let id = h.session().await;
        let _turn = h.prompt(&id, "do the big fix");
        h.wait_running("release").await;
        // The receipt the cancel handler journals before it answers, made
        // durable while the turn is still running (the crash comes before
        // the turn's seal).
        let journal = h.node.journal();
        let receipt = journal
            .keyring()
            .sign(berth_runtime::event::ControlOutcome {
                session_id: id.0.clone(),
                control_id: "ctl_crash".into(),
                method: "session/cancel".into(),
                outcome: "cancelled".into(),
                status: berth_runtime::event::ControlStatus::Accepted,
                actor: "host".into(),
                target: json!({"sessionId": id}),
                reason: None,
                metadata: Value::Null,
                decided_at: chrono::Utc::now(),
            });
        let record = berth_runtime::event::EventRecord::new(
            chrono::Utc::now(),
            SessionEvent::ControlOutcome(receipt),
        );
        journal
            .commit(berth_storage::Batch::new().append(&id, &record))
            .await
            .unwrap();
        (h, id)
    });
    let Harness {
        _dir,
        data,
        cwd,
        keys,
        node,
        ..
    } = h;
    drop(node);
    drop(rt);
    let rt = runtime();
    let terminal = rt.block_on(async {
        let model = ScriptedModel::parse(SCRIPT, "toml", "scripted:replay-test").unwrap();
        let mut config = NodeConfig::new(&data, Arc::new(model) as Arc<dyn ModelProvider>);
        config.receipt_keys = Some(keys.clone());
        let node = Node::start(config).await.unwrap();
        let terminal = node
            .journal()
            .events(&id, 0)
            .unwrap()
            .into_iter()
            .find_map(|(_, r)| match r.event {
                SessionEvent::TurnEnded { terminal, .. } => Some(terminal),
                _ => None,
            })
            .expect("the open turn was sealed");
        node.shutdown().await;
        terminal
    });
    drop(rt);
    assert_eq!(terminal.kind, TerminalKind::UserCancelled, "{terminal:?}");
    assert_eq!(
        terminal.owner,
        berth_runtime::terminal::TerminalOwner::User,
        "{terminal:?}"
    );
    let stopped = Stopped {
        _dir,
        journal: data.join("journal.redb"),
        keys,
        cwd,
    };
    // Verified up to the crash; the recovered seal is recognised as one.
    let report = stopped.replay(&id, true).unwrap();
    let cut = report.cut_short.clone().expect("cut short");
    assert_eq!(cut.cause, CutCause::Recovered, "{}", events_of(&report));
}
