//! What a running turn holds for its next write: a model answer that
//! completed at once (`TurnSink::emit_with_next_write`), and the start of a
//! turn a wake-up resumed (its claim is durable; the rest of its resume rides
//! with the turn's first write). What the session journals meanwhile (a
//! steer accepted while the turn is past its answer) is recorded after what
//! was held, never before it.

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use berth_actors::node::{NewSession, SuspendParams};
use berth_actors::{Node, NodeConfig};
use berth_runtime::content::Prompt;
use berth_runtime::directives::{CompletionJudge, Directive};
use berth_runtime::ids::SessionId;
use berth_runtime::model::scripted::ScriptedModel;
use berth_runtime::suspension::{OnTimeout, ResumeConditions, ResumeTimeout};
use serde_json::json;

const SCRIPT: &str = r#"
[[rules]]
match = "answer"
steps = [{ text = "the answer" }]
[[rules]]
match = "woken"
steps = [{ text = "awake" }]
"#;

/// A judge that, at the answer's end, tells the test and waits for it: the
/// turn is then past its answer (held) and before its seal.
#[derive(Debug)]
struct Gate {
    reached: Mutex<mpsc::Sender<()>>,
    release: Mutex<mpsc::Receiver<()>>,
}

impl CompletionJudge for Gate {
    fn judge(&self, _request: &str, _answer: &str) -> Option<Directive> {
        let _ = self.reached.lock().unwrap().send(());
        let _ = self
            .release
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(20));
        None
    }
}

/// A node whose turns stop at the end of their answer until released (the
/// receiver hears when one is reached, the sender releases it), and a new
/// session in `dir/work` (the journal in `dir/data`).
async fn gated_session(
    dir: &std::path::Path,
) -> (Node, SessionId, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let model = ScriptedModel::parse(SCRIPT, "toml", "scripted:held").unwrap();
    let mut config = NodeConfig::new(dir.join("data"), Arc::new(model));
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let (reached_tx, reached) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    config.completion_judge = Some(Arc::new(Gate {
        reached: Mutex::new(reached_tx),
        release: Mutex::new(release_rx),
    }));
    let node = Node::start(config).await.unwrap();
    let id = node
        .new_session(NewSession::in_dir(work))
        .await
        .unwrap()
        .session_id;
    (node, id, reached, release)
}

/// The kinds of the session's journaled events, in order.
fn kinds(node: &Node, id: &SessionId) -> Vec<&'static str> {
    let events = node.journal().events(id, 0).unwrap();
    events.iter().map(|(_, r)| r.event.type_name()).collect()
}

/// Where `kind` first is in `kinds`.
fn at(kinds: &[&str], kind: &str) -> usize {
    kinds
        .iter()
        .position(|k| *k == kind)
        .unwrap_or_else(|| panic!("no {kind} in {kinds:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_accepted_after_a_held_answer_is_recorded_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let (node, id, reached, release) = gated_session(dir.path()).await;
    let prompt = tokio::spawn({
        let (node, id) = (node.clone(), id.clone());
        async move { node.prompt(&id, Prompt::text("answer")).await }
    });
    tokio::task::spawn_blocking(move || reached.recv_timeout(Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("the turn reached the end of its answer");
    // The answer is held; the steer's acceptance is the session's next write.
    node.inject(&id, "steer", &json!("one more thing"), "test")
        .await
        .unwrap();
    release.send(()).unwrap();
    prompt.await.unwrap().unwrap();

    let kinds = kinds(&node, &id);
    assert!(
        at(&kinds, "agent_message_chunk") < at(&kinds, "injection_accepted"),
        "the answer is recorded before the steer accepted after it: {kinds:?}"
    );
    assert!(
        at(&kinds, "injection_accepted") < at(&kinds, "turn_ended"),
        "{kinds:?}"
    );
    node.shutdown().await;
}

/// A wake-up's resume: the claim is durable at once; the `resumed`, the
/// turn's start and its answer are not written until the turn's next write
/// (here: a steer accepted while the turn is past its answer), and then
/// before it; the turn's seal follows. Exactly one of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_ups_resume_rides_with_its_turns_first_write() {
    let dir = tempfile::tempdir().unwrap();
    let (node, id, reached, release) = gated_session(dir.path()).await;
    let parked = node
        .suspend(
            &id,
            SuspendParams {
                resume_when: Some(ResumeConditions {
                    timeout: Some(ResumeTimeout {
                        // 120 ms.
                        duration_minutes: 0.002,
                        on_timeout: OnTimeout::ResumeWithInput,
                        input: Some(json!("woken")),
                    }),
                    ..Default::default()
                }),
                ..SuspendParams::by_client("test")
            },
        )
        .await
        .unwrap();
    tokio::task::spawn_blocking(move || reached.recv_timeout(Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("the woken turn reached the end of its answer");
    let claim = node.journal().resume_claim(&parked.handle).unwrap();
    assert!(
        claim.is_some_and(|c| c.actor == "scheduler"),
        "the wake-up's claim is durable before its turn runs"
    );
    let held = kinds(&node, &id);
    assert!(
        !held.contains(&"resumed") && !held.contains(&"turn_started"),
        "the resume and the turn's start ride with its next write: {held:?}"
    );
    node.inject(&id, "steer", &json!("one more thing"), "test")
        .await
        .unwrap();
    let steered = kinds(&node, &id);
    let order = [
        "resumed",
        "turn_started",
        "agent_message_chunk",
        "injection_accepted",
    ];
    for pair in order.windows(2) {
        assert!(
            at(&steered, pair[0]) < at(&steered, pair[1]),
            "{} before {}: {steered:?}",
            pair[0],
            pair[1]
        );
    }
    release.send(()).unwrap();
    for _ in 0..400 {
        if node.journal().open_turn(&id).unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let all = kinds(&node, &id);
    for kind in ["resumed", "turn_started", "turn_ended"] {
        assert_eq!(
            all.iter().filter(|k| **k == kind).count(),
            1,
            "one {kind}: {all:?}"
        );
    }
    assert!(
        at(&all, "injection_accepted") < at(&all, "turn_ended"),
        "{all:?}"
    );
    assert!(node.journal().suspension(&id).unwrap().is_none());
    node.shutdown().await;
}
