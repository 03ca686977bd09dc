//! What an agent's outputs look like to an A2A client, over a real loopback
//! listener with the scripted model: `publish_artifact` calls as artifacts
//! with a `data`, `url` or `text` part (A2A spec §4.1.6, §4.1.7), and
//! `direct_reply` as a direct `Message` answer to a blocking send (§3.1.1) —
//! or, where the send already committed to a task, as the completed task's
//! status message.

use std::sync::Arc;

use berth_a2a::{router, A2aOptions};
use berth_actors::{Node, NodeConfig};
use berth_runtime::event::{SessionEvent, ToolCallStatus};
use berth_runtime::ids::SessionId;
use berth_runtime::model::scripted::ScriptedModel;
use serde_json::{json, Value};

const SCRIPT: &str = r#"
[[rules]]
match = "publish data"
steps = [
  { tool_call = { name = "publish_artifact", arguments = { name = "result", description = "the numbers", data = { key = "value", count = 42 } } } },
]

[[rules]]
match = "publish link"
steps = [
  { tool_call = { name = "publish_artifact", arguments = { url = "https://example.com/files/report.csv", mediaType = "text/csv" } } },
]

[[rules]]
match = "publish badly"
steps = [
  { tool_call = { name = "publish_artifact", arguments = { text = "a", url = "https://example.com/" } } },
  { text = "gave up" },
]

[[rules]]
match = "reply directly"
steps = [{ tool_call = { name = "direct_reply", arguments = { text = "Short answer." } } }]

[[rules]]
match = "reply and talk"
steps = [
  { text = "Thinking aloud." },
  { tool_call = { name = "direct_reply", arguments = { text = "Short answer." } } },
]

[[rules]]
match = "ask first"
steps = [
  { tool_call = { name = "await_resumption", arguments = { reason = "needs a detail" } } },
  { tool_call = { name = "direct_reply", arguments = { text = "Thanks." } } },
]
"#;

struct Server {
    url: String,
    http: reqwest::Client,
    node: Node,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::parse(SCRIPT, "toml", "scripted:outputs").unwrap();
    let node = Node::start(NodeConfig::new(dir.path().join("data"), Arc::new(model)))
        .await
        .unwrap();
    let app = router(node.clone(), A2aOptions::new(dir.path().join("contexts")));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server {
        url,
        http: reqwest::Client::new(),
        node,
        _dir: dir,
        task,
    }
}

fn user(text: &str, extra: Value) -> Value {
    let mut m = json!({
        "role": "ROLE_USER",
        "messageId": format!("m-{}", next_id()),
        "parts": [{"text": text}],
    });
    m.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    m
}

/// A distinct message id per call (no clock, no randomness needed).
fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

impl Server {
    async fn call(&self, method: &str, params: Value) -> Value {
        let response = self
            .http
            .post(&self.url)
            .header("A2A-Version", "1.0")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }

    /// A blocking `SendMessage`'s `result`.
    async fn send(&self, message: Value) -> Value {
        let answer = self.call("SendMessage", json!({"message": message})).await;
        assert!(answer.get("error").is_none(), "{answer}");
        answer["result"].clone()
    }

    /// Every `result` of a `SendStreamingMessage` (the stream closes at the
    /// task's terminal or input-required state).
    async fn stream(&self, message: Value) -> Vec<Value> {
        let response = self
            .http
            .post(&self.url)
            .header("A2A-Version", "1.0")
            .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "SendStreamingMessage", "params": {"message": message}}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .split(';')
                .next(),
            Some("text/event-stream")
        );
        let body = response.text().await.unwrap();
        body.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| {
                let frame: Value = serde_json::from_str(d.trim()).unwrap();
                assert!(frame.get("error").is_none(), "{frame}");
                frame["result"].clone()
            })
            .collect()
    }
}

#[tokio::test]
async fn published_artifacts_carry_their_part_kind() {
    let s = start().await;
    let task = &s.send(user("publish data", json!({}))).await["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    let artifacts = task["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 1, "{task}");
    assert_eq!(artifacts[0]["name"], "result");
    assert_eq!(artifacts[0]["description"], "the numbers");
    assert!(artifacts[0]["artifactId"]
        .as_str()
        .is_some_and(|a| !a.is_empty()));
    assert_eq!(
        artifacts[0]["parts"],
        json!([{"data": {"key": "value", "count": 42}}])
    );

    let task = &s.send(user("publish link", json!({}))).await["task"];
    assert_eq!(
        task["artifacts"][0]["parts"],
        json!([{"url": "https://example.com/files/report.csv", "filename": "report.csv", "mediaType": "text/csv"}]),
        "{task}"
    );
    // ACP sees the same call as an ordinary tool call with its output.
    let session = SessionId(task["contextId"].as_str().unwrap().into());
    let events = s.node.session_events(&session, 0).unwrap();
    assert!(events.iter().any(|(_, r)| matches!(
        &r.event,
        SessionEvent::ToolCall { name, .. } if name == "publish_artifact"
    )));
    assert!(events.iter().any(|(_, r)| matches!(
        &r.event,
        SessionEvent::ToolCallUpdate { status: ToolCallStatus::Completed, raw_output: Some(raw), .. }
            if raw["artifact"]["part"]["filename"] == "report.csv"
    )));

    // A refused call (text and url at once) publishes nothing; the model
    // reads the error and answers in text.
    let task = &s.send(user("publish badly", json!({}))).await["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert_eq!(
        task["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["parts"].clone())
            .collect::<Vec<_>>(),
        vec![json!([{"text": "gave up"}])],
        "{task}"
    );
}

#[tokio::test]
async fn a_published_artifact_streams_as_one_complete_artifact_update() {
    let s = start().await;
    let events = s.stream(user("publish data", json!({}))).await;
    assert!(events[0].get("task").is_some(), "{events:?}");
    let updates: Vec<&Value> = events
        .iter()
        .filter_map(|e| e.get("artifactUpdate"))
        .collect();
    assert_eq!(updates.len(), 1, "{events:?}");
    assert_eq!(
        updates[0]["artifact"]["parts"],
        json!([{"data": {"key": "value", "count": 42}}])
    );
    assert_eq!(updates[0]["lastChunk"], true);
    assert_eq!(updates[0]["append"], false);
    let last = events.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
}

#[tokio::test]
async fn a_direct_reply_answers_a_blocking_send_with_a_message() {
    let s = start().await;
    let result = s.send(user("reply directly", json!({}))).await;
    assert!(result.get("task").is_none(), "{result}");
    let message = &result["message"];
    assert_eq!(message["role"], "ROLE_AGENT");
    assert_eq!(message["parts"], json!([{"text": "Short answer."}]));
    assert!(message.get("taskId").is_none(), "{message}");
    assert!(message["messageId"].as_str().is_some_and(|m| !m.is_empty()));
    let context = message["contextId"].as_str().unwrap().to_owned();

    // The turn is journaled: its task answers GetTask, completed, with the
    // reply as its status message and last history message.
    let id = message["metadata"]["berth"]["taskId"].as_str().unwrap();
    let task = &s.call("GetTask", json!({"id": id})).await["result"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert_eq!(task["contextId"], context.as_str());
    assert_eq!(
        task["status"]["message"]["parts"],
        json!([{"text": "Short answer."}])
    );
    assert_eq!(
        task["history"].as_array().unwrap().last().unwrap()["parts"],
        json!([{"text": "Short answer."}])
    );

    // The context goes on: the next message in it is answered the same way.
    let again = s
        .send(user("reply directly", json!({"contextId": context})))
        .await;
    assert_eq!(again["message"]["contextId"], context.as_str(), "{again}");
    let listed = &s.call("ListTasks", json!({"contextId": context})).await["result"];
    assert_eq!(listed["totalSize"], 2, "{listed}");
}

#[tokio::test]
async fn otherwise_the_reply_is_the_status_message_of_the_task() {
    let s = start().await;
    // More output than the reply: a task, with the text artifact kept.
    let task = &s.send(user("reply and talk", json!({}))).await["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert_eq!(
        task["artifacts"][0]["parts"],
        json!([{"text": "Thinking aloud."}])
    );
    assert_eq!(
        task["status"]["message"]["parts"],
        json!([{"text": "Short answer."}])
    );

    // Non-blocking: the answer is the task, before the agent has spoken.
    let answer = s
        .call(
            "SendMessage",
            json!({"message": user("reply directly", json!({})), "configuration": {"returnImmediately": true}}),
        )
        .await;
    assert!(answer["result"].get("task").is_some(), "{answer}");

    // Streaming: the Task first; the completed status carries the reply.
    let events = s.stream(user("reply directly", json!({}))).await;
    assert!(events[0].get("task").is_some(), "{events:?}");
    let last = &events.last().unwrap()["statusUpdate"]["status"];
    assert_eq!(last["state"], "TASK_STATE_COMPLETED", "{events:?}");
    assert_eq!(last["message"]["parts"], json!([{"text": "Short answer."}]));

    // A reply in a task that already exists (resumed from input-required)
    // answers with that task.
    let parked = &s.send(user("ask first", json!({}))).await["task"];
    assert_eq!(parked["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    let id = parked["id"].as_str().unwrap();
    let result = s.send(user("blue", json!({"taskId": id}))).await;
    let task = &result["task"];
    assert_eq!(task["id"], id, "{result}");
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(
        task["status"]["message"]["parts"],
        json!([{"text": "Thanks."}])
    );
}
