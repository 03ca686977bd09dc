//! A model answer that completed at once is held for the turn's next write
//! (`TurnSink::emit_with_next_write`). What the session journals meanwhile
//! (a steer accepted while the turn is past its answer) is recorded after
//! that answer, never before it.

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use berth_actors::node::NewSession;
use berth_actors::{Node, NodeConfig};
use berth_runtime::content::Prompt;
use berth_runtime::directives::{CompletionJudge, Directive};
use berth_runtime::model::scripted::ScriptedModel;
use serde_json::json;

const SCRIPT: &str = r#"
[[rules]]
match = "answer"
steps = [{ text = "the answer" }]
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_accepted_after_a_held_answer_is_recorded_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::parse(SCRIPT, "toml", "scripted:held").unwrap();
    let mut config = NodeConfig::new(dir.path().join("data"), Arc::new(model));
    let (reached_tx, reached) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    config.completion_judge = Some(Arc::new(Gate {
        reached: Mutex::new(reached_tx),
        release: Mutex::new(release_rx),
    }));
    let node = Node::start(config).await.unwrap();
    let id = node
        .new_session(NewSession::in_dir(dir.path().to_path_buf()))
        .await
        .unwrap()
        .session_id;
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

    let events = node.journal().events(&id, 0).unwrap();
    let kinds: Vec<&str> = events.iter().map(|(_, r)| r.event.type_name()).collect();
    let at = |kind: &str| {
        kinds
            .iter()
            .position(|k| *k == kind)
            .unwrap_or_else(|| panic!("no {kind} in {kinds:?}"))
    };
    assert!(
        at("agent_message_chunk") < at("injection_accepted"),
        "the answer is recorded before the steer accepted after it: {kinds:?}"
    );
    assert!(at("injection_accepted") < at("turn_ended"), "{kinds:?}");
    node.shutdown().await;
}
