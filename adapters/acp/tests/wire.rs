//! The ACP adapter over an in-memory duplex stream against a real node:
//! error paths, bounds, concurrency, replay.

use std::collections::VecDeque;
use std::time::Duration;

use berth_acp::{serve, ServeOptions};
use berth_actors::{Node, NodeConfig};
use berth_runtime::model::scripted::ScriptedModel;
use serde_json::{json, Value};
use tokio::io::{
    AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf,
};

const SCRIPT: &str = r#"
[[rules]]
match = "slow"
steps = [ { text = "one" }, { delay_ms = 300 }, { text = "two" }, { delay_ms = 300 }, { text = "three" } ]
[[rules]]
match = "sleep"
steps = [ { tool_call = { name = "shell", arguments = { command = "sleep 30" } } }, { text = "woke" } ]
[[rules]]
match = "hi"
steps = [ { text = "hello" } ]
[[rules]]
match = "write v1"
steps = [ { tool_call = { name = "write_file", arguments = { path = "{cwd}/a.txt", content = "v1" } } }, { text = "wrote v1" } ]
[[rules]]
match = "write v2"
steps = [
  { tool_calls = [
      { name = "write_file", arguments = { path = "{cwd}/a.txt", content = "v2" } },
      { name = "write_file", arguments = { path = "{cwd}/new/b.txt", content = "b" } },
  ] },
  { text = "wrote v2" },
]
[[rules]]
match = "short job"
steps = [ { tool_call = { name = "shell", arguments = { command = "sleep 0.2; echo ran >> jobs.log" } } }, { text = "after the job" } ]
[[rules]]
match = "budgeted"
steps = [
  { tool_call = { name = "shell", arguments = { command = "echo A >> budget.log" } } },
  { tool_call = { name = "shell", arguments = { command = "echo B >> budget.log" } } },
  { text = "budgeted done" },
]
[[rules]]
match = "[resumed]"
steps = [
  { tool_call = { name = "shell", arguments = { command = "echo C >> budget.log" } } },
  { text = "refilled done" },
]
[[rules]]
match = "three jobs"
steps = [
  { tool_calls = [
      { name = "shell", arguments = { command = "echo 1 >> jobs3.log" } },
      { name = "shell", arguments = { command = "echo 2 >> jobs3.log" } },
      { name = "shell", arguments = { command = "echo 3 >> jobs3.log" } },
  ] },
  { text = "three jobs done" },
]
[[rules]]
match = "gated"
steps = [ { tool_call = { name = "shell", arguments = { command = "while [ ! -e gate.open ]; do sleep 0.02; done; echo through" } } }, { text = "past the gate" } ]
[[rules]]
match = "two jobs"
steps = [
  { tool_calls = [
      { name = "shell", arguments = { command = "echo $$ > job.pid; exec sleep 30" } },
      { name = "shell", arguments = { command = "echo fast" } },
  ] },
  { text = "carried on after the cancelled job" },
]
"#;

struct Client {
    write: WriteHalf<DuplexStream>,
    lines: Lines<BufReader<ReadHalf<DuplexStream>>>,
    /// Frames read while waiting for something else.
    backlog: VecDeque<Value>,
    next_id: u64,
}

impl Client {
    fn connect(node: &Node, options: ServeOptions) -> Self {
        Self::connect_as(node, None, options)
    }

    /// A connection authenticated as `principal` (`None`: the local host owner).
    fn connect_as(
        node: &Node,
        principal: Option<berth_actors::Principal>,
        options: ServeOptions,
    ) -> Self {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let (r, w) = tokio::io::split(theirs);
        tokio::spawn(berth_acp::connection::serve_as(
            node.clone(),
            principal,
            r,
            w,
            options,
        ));
        let (r, w) = tokio::io::split(ours);
        Self {
            write: w,
            lines: BufReader::new(r).lines(),
            backlog: VecDeque::new(),
            next_id: 1000,
        }
    }

    async fn send_raw(&mut self, line: &str) {
        self.write.write_all(line.as_bytes()).await.unwrap();
        self.write.write_all(b"\n").await.unwrap();
    }

    async fn read(&mut self) -> Value {
        if let Some(v) = self.backlog.pop_front() {
            return v;
        }
        let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
            .await
            .expect("no frame within 10 s")
            .unwrap()
            .expect("stream ended");
        serde_json::from_str(&line).unwrap()
    }

    /// Sends a request and returns its id.
    async fn request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send_raw(
            &json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}).to_string(),
        )
        .await;
        id
    }

    /// Reads until the response to `id`; returns it and the notifications before it.
    async fn response(&mut self, id: u64) -> (Value, Vec<Value>) {
        let mut notes = Vec::new();
        let mut others = VecDeque::new();
        loop {
            let v = self.read().await;
            if v["id"] == json!(id) {
                self.backlog.extend(others);
                return (v, notes);
            }
            if v.get("method").is_some() {
                notes.push(v);
            } else {
                others.push_back(v);
            }
        }
    }

    /// Sends a request; returns its response and the notifications before it.
    async fn exchange(&mut self, method: &str, params: Value) -> (Value, Vec<Value>) {
        let id = self.request(method, params).await;
        self.response(id).await
    }

    /// Sends `session/prompt` with one text block; returns the request id.
    async fn prompt(&mut self, sid: &str, text: &str) -> u64 {
        self.request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]}),
        )
        .await
    }

    /// Like [`Client::exchange`], collecting the notifications into `notes`.
    async fn exchange_into(
        &mut self,
        notes: &mut Vec<Value>,
        method: &str,
        params: Value,
    ) -> Value {
        let (response, seen) = self.exchange(method, params).await;
        notes.extend(seen);
        response
    }

    /// A prompt and its answer (with the notifications before it).
    async fn exchange_prompt(&mut self, sid: &str, text: &str) -> (Value, Vec<Value>) {
        let id = self.prompt(sid, text).await;
        self.response(id).await
    }

    /// A prompt's answer.
    async fn call_prompt(&mut self, sid: &str, text: &str) -> Value {
        self.exchange_prompt(sid, text).await.0
    }

    /// Reads frames until a tool call goes in progress.
    async fn until_in_progress(&mut self) {
        while self.read().await["params"]["update"]["status"] != "in_progress" {}
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.request(method, params).await;
        self.response(id).await.0
    }

    async fn new_session(&mut self, cwd: &std::path::Path) -> String {
        let r = self
            .call("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        r["result"]["sessionId"].as_str().unwrap().to_owned()
    }
}

async fn node(dir: &std::path::Path) -> Node {
    node_with(dir, |_| {}).await
}

async fn node_with(dir: &std::path::Path, tune: impl FnOnce(&mut NodeConfig)) -> Node {
    let model = ScriptedModel::parse(SCRIPT, "toml", "scripted:wire").unwrap();
    let mut config = NodeConfig::new(dir.join("data"), std::sync::Arc::new(model));
    tune(&mut config);
    Node::start(config).await.unwrap()
}

fn error_of(v: &Value) -> (i64, Value) {
    (
        v["error"]["code"].as_i64().unwrap(),
        v["error"]["data"].clone(),
    )
}

#[tokio::test]
async fn malformed_frames_get_typed_errors_and_change_nothing() {
    let data = tempfile::tempdir().unwrap();
    let node = node(data.path()).await;
    let mut c = Client::connect(
        &node,
        ServeOptions {
            max_frame_bytes: 1024,
            max_in_flight: 8,
        },
    );
    c.send_raw("{not json").await;
    assert_eq!(error_of(&c.read().await).0, -32700);
    c.send_raw(r#"[{"jsonrpc":"2.0","id":1,"method":"session/list"},{"jsonrpc":"2.0","id":2,"method":"session/list"}]"#).await;
    let batch = c.read().await;
    assert_eq!(error_of(&batch).0, -32600);
    assert_eq!(batch["id"], Value::Null);
    c.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"session/list","params":{{"pad":"{}"}}}}"#,
        "x".repeat(5000)
    ))
    .await;
    let (code, data) = error_of(&c.read().await);
    assert_eq!(
        (code, data["reason"].as_str()),
        (-32600, Some("frame_too_large"))
    );
    let r = c.call("session/frobnicate", json!({})).await;
    assert_eq!(
        error_of(&r),
        (-32601, json!({"method": "session/frobnicate"}))
    );
    let r = c
        .call(
            "session/new",
            json!({"cwd": "relative/dir", "mcpServers": []}),
        )
        .await;
    assert_eq!(error_of(&r).0, -32602);
    assert_eq!(error_of(&r).1["field"], "cwd");
    let r = c
        .call(
            "session/new",
            json!({"cwd": "/definitely/not/here", "mcpServers": []}),
        )
        .await;
    assert_eq!(error_of(&r).1["field"], "cwd");
    let r = c
        .call("session/prompt", json!({"sessionId": 5, "prompt": []}))
        .await;
    assert_eq!(error_of(&r).0, -32602);
    let r = c
        .call("session/cancel", json!({"sessionId": "sess_nope"}))
        .await;
    assert_eq!(
        error_of(&r),
        (
            -32004,
            json!({"sessionId": "sess_nope", "reason": "unknown_session"})
        )
    );
    let r = c
        .call("session/load", json!({"sessionId": "sess_nope"}))
        .await;
    assert_eq!(error_of(&r).0, -32004);
    // Wrong types name the field by its path.
    let r = c
        .call("session/new", json!({"cwd": 5, "mcpServers": []}))
        .await;
    assert_eq!(
        (error_of(&r).0, error_of(&r).1["field"].as_str()),
        (-32602, Some("cwd"))
    );
    let r = c
        .call(
            "session/prompt",
            json!({"sessionId": "s", "prompt": [{"type": "text", "text": 5}]}),
        )
        .await;
    assert_eq!(error_of(&r).1["field"], "prompt[0]");
    let r = c
        .call("session/list", json!({"cursor": "not-a-cursor"}))
        .await;
    assert_eq!(error_of(&r).1["field"], "cursor");
    // None of that created anything; the connection still works.
    let r = c.call("session/list", json!({})).await;
    assert_eq!(r["result"]["sessions"], json!([]));
}

/// A cancel that lands as soon as a call is announced (inside the grace in
/// which its `in_progress` is held) ends it as abandoned, in order, exactly
/// as a later one does: never as a `completed` killed process.
#[tokio::test]
async fn a_cancel_at_once_abandons_the_running_call() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let prompt = c.prompt(&sid, "sleep").await;
    let mut notes = Vec::new();
    loop {
        let v = c.read().await;
        let announced = v["params"]["update"]["sessionUpdate"] == "tool_call";
        notes.push(v);
        if announced {
            break;
        }
    }
    c.send_raw(
        &json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId": sid}}).to_string(),
    )
    .await;
    let (done, rest) = c.response(prompt).await;
    notes.extend(rest);
    assert_eq!(done["result"]["stopReason"], "cancelled");
    let statuses: Vec<&str> = notes
        .iter()
        .filter(|n| n["params"]["update"]["sessionUpdate"] == "tool_call_update")
        .filter_map(|n| n["params"]["update"]["status"].as_str())
        .collect();
    assert_eq!(statuses, ["in_progress", "failed"], "{notes:#?}");
    let failed = notes
        .iter()
        .find(|n| n["params"]["update"]["status"] == "failed")
        .expect("a failed update");
    assert!(
        failed["params"]["update"]["rawOutput"]["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("abandoned")),
        "{failed}"
    );
}

#[tokio::test]
async fn cancel_and_list_do_not_wait_behind_a_running_prompt() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    c.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
    .await;
    let sid = c.new_session(dir.path()).await;
    let prompt = c.prompt(&sid, "sleep").await;
    // Wait until the tool call is in flight.
    loop {
        let v = c.read().await;
        if v["params"]["update"]["status"] == "in_progress" {
            break;
        }
    }
    let list = c.call("session/list", json!({})).await;
    let entry = &list["result"]["sessions"][0]["_meta"]["berth"];
    assert_eq!(
        (entry["liveState"].as_str(), entry["activePrompt"].as_bool()),
        (Some("live"), Some(true))
    );
    let again = c.call_prompt(&sid, "hi").await;
    assert_eq!(error_of(&again).0, -32006);
    // Cancel as a notification: never answered, still ends the turn.
    c.send_raw(
        &json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId": sid}}).to_string(),
    )
    .await;
    let (done, _) = c.response(prompt).await;
    assert_eq!(done["result"]["stopReason"], "cancelled");
    assert_eq!(
        done["result"]["_meta"]["berth"]["terminal"]["kind"],
        "user_cancelled"
    );
    assert_eq!(
        done["result"]["_meta"]["berth"]["terminal"]["owner"],
        "user"
    );
    let r = c.call("session/cancel", json!({"sessionId": sid})).await;
    assert_eq!(r["result"]["status"], "already_cancelled");
}

#[tokio::test]
async fn requests_past_the_in_flight_bound_are_refused_at_once() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(
        &node,
        ServeOptions {
            max_frame_bytes: 1 << 20,
            max_in_flight: 1,
        },
    );
    let sid = c.new_session(dir.path()).await;
    let prompt = c.prompt(&sid, "slow").await;
    let r = c.call("session/list", json!({})).await;
    assert_eq!(error_of(&r).0, -32007);
    assert_eq!(error_of(&r).1["limit"], 1);
    let (done, _) = c.response(prompt).await;
    assert_eq!(done["result"]["stopReason"], "end_turn");
}

#[tokio::test]
async fn a_second_client_loading_mid_turn_sees_every_event_exactly_once() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut a = Client::connect(&node, ServeOptions::default());
    let sid = a.new_session(dir.path()).await;
    let prompt = a.prompt(&sid, "slow").await;
    // Let the first chunk land, then attach a second client with replay.
    loop {
        if a.read().await["params"]["update"]["sessionUpdate"] == "agent_message_chunk" {
            break;
        }
    }
    let mut b = Client::connect(&node, ServeOptions::default());
    let load = b.request("session/load", json!({"sessionId": sid})).await;
    let (resp, replayed) = b.response(load).await;
    assert!(replayed
        .iter()
        .all(|n| n["params"]["_meta"]["berth"]["replayed"] == true));
    let listed: Vec<u64> = resp["result"]["_meta"]["berth"]["replayed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["eventId"].as_u64().unwrap())
        .collect();
    assert!(!listed.is_empty());
    a.response(prompt).await;
    // B now receives the rest live, up to and including turn_ended.
    let mut ids: Vec<u64> = replayed
        .iter()
        .map(|n| n["params"]["_meta"]["berth"]["eventId"].as_u64().unwrap())
        .collect();
    loop {
        let n = b.read().await;
        assert!(
            n["params"]["_meta"]["berth"]["replayed"].is_null(),
            "live events are not marked replayed"
        );
        ids.push(n["params"]["_meta"]["berth"]["eventId"].as_u64().unwrap());
        if n["method"] == "_berth/agentEvent" && n["params"]["type"] == "turn_ended" {
            break;
        }
    }
    let expected: Vec<u64> = (1..=ids.len() as u64).collect();
    assert_eq!(ids, expected, "contiguous, no duplicates, no gaps");
}

#[tokio::test]
async fn closed_sessions_stay_readable_and_refuse_prompts() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let image = json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"});
    let r = c
        .call(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type":"text","text":"hi"}, image]}),
        )
        .await;
    let reason = "image content is not supported (promptCapabilities.image is false)";
    assert_eq!(
        error_of(&r),
        (-32602, json!({"field": "prompt[1]", "reason": reason}))
    );
    let r = c.call_prompt(&sid, "hi").await;
    assert_eq!(r["result"]["stopReason"], "end_turn");
    assert_eq!(
        c.call("session/close", json!({"sessionId": sid})).await["result"],
        json!({})
    );
    let r = c.call_prompt(&sid, "hi").await;
    assert_eq!(error_of(&r).0, -32005);
    let load = c.call("session/load", json!({"sessionId": sid})).await;
    let kinds: Vec<&str> = load["result"]["_meta"]["berth"]["replayed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "turn_started",
            "agent_message_chunk",
            "turn_ended",
            "session_closed",
            "control_outcome"
        ]
    );
    let list = c.call("session/list", json!({})).await;
    assert!(list["result"]["sessions"][0]["_meta"]["berth"]["closedAt"].is_string());
}

#[tokio::test]
async fn controls_racing_a_close_get_closed_session_answers() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    for _ in 0..10 {
        let sid = c.new_session(dir.path()).await;
        let close = c.request("session/close", json!({"sessionId": sid})).await;
        let prompt = c.prompt(&sid, "hi").await;
        let load = c.request("session/load", json!({"sessionId": sid})).await;
        let cancel = c.request("session/cancel", json!({"sessionId": sid})).await;
        assert_eq!(c.response(close).await.0["result"], json!({}));
        assert_eq!(error_of(&c.response(prompt).await.0).0, -32005);
        assert!(c.response(load).await.0["result"].is_object());
        assert_eq!(
            c.response(cancel).await.0["result"]["status"],
            "already_cancelled"
        );
    }
}

/// The receipts (`control_outcome`) among notifications.
fn receipts(notes: &[Value]) -> Vec<Value> {
    notes
        .iter()
        .filter(|n| n["method"] == "_berth/agentEvent" && n["params"]["type"] == "control_outcome")
        .map(|n| n["params"]["event"].clone())
        .collect()
}

/// A steer that reaches a turn after its cancel was answered finds no
/// active prompt: the turn is only winding down to its seal, and nothing
/// would deliver the message (it was accepted, and could be lost).
#[tokio::test]
async fn a_steer_after_the_cancel_finds_no_active_prompt() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let prompt = c.prompt(&sid, "sleep").await; // a 30 s tool call
    while c.read().await["params"]["update"]["status"] != "in_progress" {}
    // Written back to back, so the steer reaches the session while the
    // cancelled turn is still stopping (its tool's process being killed).
    let cancel = c.request("session/cancel", json!({"sessionId": sid})).await;
    let steer = c
        .request(
            "session/inject",
            json!({"sessionId": sid, "mode": "steer", "content": "too late"}),
        )
        .await;
    let (r, _) = c.response(cancel).await;
    assert_eq!(r["result"]["status"], "cancelled", "{r}");
    let (r, _) = c.response(steer).await;
    assert_eq!(
        error_of(&r),
        (
            -32004,
            json!({"sessionId": sid, "reason": "no_active_prompt"})
        )
    );
    let (done, _) = c.response(prompt).await;
    assert_eq!(done["result"]["stopReason"], "cancelled");
}

#[tokio::test]
async fn inject_revoke_replace_and_their_receipts() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let mut notes = Vec::new();

    // Idle: -32004 before the (bad) mode is even looked at.
    let id = c
        .request(
            "session/inject",
            json!({"sessionId": sid, "mode": "sideways", "content": "x"}),
        )
        .await;
    let (r, n) = c.response(id).await;
    notes.extend(n);
    assert_eq!(
        error_of(&r),
        (
            -32004,
            json!({"sessionId": sid, "reason": "no_active_prompt"})
        )
    );
    assert_eq!(r["error"]["message"], "Session has no active prompt");

    // A running turn (a 30 s tool call).
    let prompt = c.prompt(&sid, "sleep").await;
    loop {
        let v = c.read().await;
        let status = v["params"]["update"]["status"].clone();
        notes.push(v);
        if status == "in_progress" {
            break;
        }
    }
    let r = c
        .exchange_into(
            &mut notes,
            "session/inject",
            json!({"sessionId": sid, "mode": "sideways", "content": "x"}),
        )
        .await;
    assert_eq!(
        error_of(&r),
        (-32602, json!({"field": "mode", "reason": "invalid_mode"}))
    );
    let r = c
        .exchange_into(
            &mut notes,
            "session/inject",
            json!({"sessionId": sid, "mode": "queue", "content": "  "}),
        )
        .await;
    assert_eq!(
        error_of(&r),
        (
            -32602,
            json!({"field": "content", "reason": "invalid_content"})
        )
    );
    // Two queued messages stay pending until the loop exits.
    let r = c
        .exchange_into(
            &mut notes,
            "session/inject",
            json!({"sessionId": sid, "mode": "queue", "content": "first note"}),
        )
        .await;
    assert_eq!(r["result"]["status"], "accepted");
    let first = r["result"]["messageId"].as_str().unwrap().to_owned();
    let r = c.exchange_into(&mut notes, "session/inject", json!({"sessionId": sid, "mode": "queue", "content": [{"type":"text","text":"second note"}]})).await;
    let second = r["result"]["messageId"].as_str().unwrap().to_owned();
    let (r, _) = c
        .exchange("session/pending_injections", json!({"sessionId": sid}))
        .await;
    let pending: Vec<&str> = r["result"]["injections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["messageId"].as_str().unwrap())
        .collect();
    assert_eq!(pending, [first.as_str(), second.as_str()], "FIFO");
    let r = c
        .exchange_into(
            &mut notes,
            "session/replace_inject",
            json!({"sessionId": sid, "messageId": first, "content": "first note, amended"}),
        )
        .await;
    assert_eq!(r["result"]["status"], "replaced");
    let r = c
        .exchange_into(
            &mut notes,
            "session/revoke_inject",
            json!({"sessionId": sid, "messageId": second}),
        )
        .await;
    assert_eq!(r["result"]["status"], "revoked");
    let r = c
        .exchange_into(
            &mut notes,
            "session/revoke_inject",
            json!({"sessionId": sid, "messageId": second}),
        )
        .await;
    assert_eq!(
        error_of(&r),
        (
            -32008,
            json!({"messageId": second, "reason": "already_revoked"})
        )
    );
    let r = c
        .exchange_into(
            &mut notes,
            "session/revoke_inject",
            json!({"sessionId": sid, "messageId": "msg_nope"}),
        )
        .await;
    assert_eq!(error_of(&r).1["reason"], "unknown_message_id");

    // End the turn: the queue is delivered at loop exit, echoed with its id.
    let r = c
        .exchange_into(&mut notes, "session/cancel", json!({"sessionId": sid}))
        .await;
    assert_eq!(r["result"]["status"], "cancelled");
    let (done, n) = c.response(prompt).await;
    notes.extend(n);
    assert_eq!(done["result"]["stopReason"], "cancelled");
    let echoed: Vec<(&str, &str)> = notes
        .iter()
        .filter(|n| {
            n["params"]["update"]["sessionUpdate"] == "user_message_chunk"
                && n["params"]["update"]["messageId"].is_string()
        })
        .map(|n| {
            (
                n["params"]["update"]["messageId"].as_str().unwrap(),
                n["params"]["update"]["content"]["text"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(echoed, [(first.as_str(), "first note, amended")]);
    let id = c
        .request(
            "session/revoke_inject",
            json!({"sessionId": sid, "messageId": first}),
        )
        .await;
    let (r, n) = c.response(id).await;
    notes.extend(n);
    assert_eq!(error_of(&r).1["reason"], "already_delivered");

    // Exactly one receipt per control, rejected ones included, in order.
    let got: Vec<(String, String, String)> = receipts(&notes)
        .iter()
        .map(|r| {
            (
                r["method"].as_str().unwrap().into(),
                r["status"].as_str().unwrap().into(),
                r["reason"]
                    .as_str()
                    .unwrap_or(r["outcome"].as_str().unwrap())
                    .into(),
            )
        })
        .collect();
    let want: Vec<(String, String, String)> = [
        ("session/inject", "rejected", "no_active_prompt"),
        ("session/inject", "rejected", "invalid_mode"),
        ("session/inject", "rejected", "invalid_content"),
        ("session/inject", "accepted", "accepted"),
        ("session/inject", "accepted", "accepted"),
        ("session/replace_inject", "accepted", "replaced"),
        ("session/revoke_inject", "accepted", "revoked"),
        ("session/revoke_inject", "rejected", "already_revoked"),
        ("session/revoke_inject", "rejected", "unknown_message_id"),
        ("session/cancel", "accepted", "cancelled"),
        ("session/revoke_inject", "rejected", "already_delivered"),
    ]
    .iter()
    .map(|(a, b, c)| ((*a).into(), (*b).into(), (*c).into()))
    .collect();
    assert_eq!(got, want);
    // All of them are journaled: a load replays the same receipts.
    let load = c.call("session/load", json!({"sessionId": sid})).await;
    let kinds = load["result"]["_meta"]["berth"]["replayed"]
        .as_array()
        .unwrap();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| k["type"] == "control_outcome")
            .count(),
        want.len()
    );
}

#[tokio::test]
async fn cancel_tool_call_stops_one_call_and_the_turn_goes_on() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let prompt = c.prompt(&sid, "two jobs").await;
    // The slow call's id, once it runs and has written its pid.
    let mut slow = None;
    while slow.is_none() {
        let v = c.read().await;
        let u = &v["params"]["update"];
        if u["sessionUpdate"] == "tool_call"
            && u["rawInput"]["command"]
                .as_str()
                .is_some_and(|c| c.contains("sleep"))
        {
            slow = u["toolCallId"].as_str().map(str::to_owned);
        }
    }
    let slow = slow.unwrap();
    let pid_file = dir.path().join("job.pid");
    let pid: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (r, mut notes) = c
        .exchange(
            "session/cancel_tool_call",
            json!({"sessionId": sid, "toolCallId": slow, "reason": "too slow"}),
        )
        .await;
    assert_eq!(r["result"]["status"], "cancelled");
    let (done, rest) = c.response(prompt).await;
    notes.extend(rest);
    assert_eq!(done["result"]["stopReason"], "end_turn", "the turn went on");
    assert!(notes
        .iter()
        .any(|n| n["params"]["update"]["content"]["text"] == "carried on after the cancelled job"));
    assert!(notes
        .iter()
        .any(|n| n["params"]["update"]["toolCallId"] == slow.as_str()
            && n["params"]["update"]["status"] == "failed"
            && n["params"]["update"]["rawOutput"]["cancelled"] == true));
    let gone =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "));
    assert!(gone, "the cancelled call's process was killed");
    let (r, _) = c
        .exchange(
            "session/cancel_tool_call",
            json!({"sessionId": sid, "toolCallId": slow}),
        )
        .await;
    assert_eq!(r["result"]["status"], "not_found", "the turn is over");
    let (r, _) = c
        .exchange(
            "session/cancel_tool_call",
            json!({"sessionId": sid, "toolCallId": "call_nope"}),
        )
        .await;
    assert_eq!(r["result"]["status"], "not_found");
    let (r, _) = c
        .exchange("session/cancel_tool_call", json!({"sessionId": sid}))
        .await;
    assert_eq!(error_of(&r).1["field"], "toolCallId");
}

#[tokio::test]
async fn rollback_and_redo_move_the_transcript_and_the_files() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let (r, _) = c
        .exchange("session/rollback", json!({"sessionId": sid}))
        .await;
    assert_eq!(r["result"]["status"], "nothing_to_rollback");
    for text in ["write v1", "write v2"] {
        let (r, _) = c
            .exchange(
                "session/prompt",
                json!({"sessionId": sid, "prompt": [{"type":"text","text":text}]}),
            )
            .await;
        assert_eq!(r["result"]["stopReason"], "end_turn");
    }
    let a = dir.path().join("a.txt");
    let b = dir.path().join("new/b.txt");
    let count = |v: &Value| v["result"]["messageCount"].as_u64().unwrap();
    let (view, _) = c
        .exchange("berth.session_view.query", json!({"sessionId": sid}))
        .await;
    assert_eq!(
        count(&view),
        9,
        "4 messages for the first turn, 5 for the second (two tool results)"
    );
    // `projection_hash` is what a client computes: SHA-256 over the JSON of
    // every other field with keys sorted at every depth, no whitespace.
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&map[k])))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    let mut fields = view["result"].clone();
    let claimed = fields
        .as_object_mut()
        .and_then(|m| m.remove("projection_hash"))
        .expect("a projection_hash");
    let digest =
        <sha2::Sha256 as sha2::Digest>::digest(serde_json::to_vec(&sorted(&fields)).unwrap());
    assert_eq!(claimed, json!(hex::encode(digest)));

    let (r, _) = c
        .exchange("session/rollback", json!({"sessionId": sid}))
        .await;
    assert_eq!(r["result"]["status"], "rolled_back");
    assert!(r["result"]["checkpointId"]
        .as_str()
        .unwrap()
        .starts_with("turn_"));
    assert_eq!(
        (
            r["result"]["beforeMessageCount"].as_u64(),
            r["result"]["afterMessageCount"].as_u64()
        ),
        (Some(4), Some(9))
    );
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "v1");
    assert!(!b.exists());
    let (view, _) = c
        .exchange("berth.session_view.query", json!({"sessionId": sid}))
        .await;
    assert_eq!(count(&view), 4);

    let (r, _) = c.exchange("session/redo", json!({"sessionId": sid})).await;
    assert_eq!(r["result"]["status"], "redone");
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "v2");
    assert_eq!(std::fs::read_to_string(&b).unwrap(), "b");
    let (r, _) = c.exchange("session/redo", json!({"sessionId": sid})).await;
    assert_eq!(r["result"]["status"], "nothing_to_redo");

    // Two rollbacks take both turns back; a new turn discards the redo stack.
    c.exchange("session/rollback", json!({"sessionId": sid}))
        .await;
    let (r, _) = c
        .exchange("session/rollback", json!({"sessionId": sid}))
        .await;
    assert_eq!(r["result"]["status"], "rolled_back");
    assert!(!a.exists(), "a.txt did not exist before the first turn");
    let (r, _) = c.exchange_prompt(&sid, "hi").await;
    assert_eq!(r["result"]["stopReason"], "end_turn");
    let (r, _) = c.exchange("session/redo", json!({"sessionId": sid})).await;
    assert_eq!(r["result"]["status"], "nothing_to_redo");

    // Refused while a prompt runs.
    let prompt = c.prompt(&sid, "slow").await;
    let (r, _) = c
        .exchange("session/rollback", json!({"sessionId": sid}))
        .await;
    assert_eq!(r["result"]["status"], "prompt_active");
    c.response(prompt).await;
}

/// Reads frames until berth asks for a permission; returns the request.
async fn next_permission_request(c: &mut Client) -> Value {
    loop {
        let v = c.read().await;
        if v["method"] == "session/request_permission" {
            return v;
        }
    }
}

#[tokio::test]
async fn approval_gated_tools_wait_for_the_client() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node_with(data.path(), |c| {
        c.needs_approval = vec!["write_file".into()]
    })
    .await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let a = dir.path().join("a.txt");

    // Rejected: the call never runs.
    let prompt = c.prompt(&sid, "write v1").await;
    let ask = next_permission_request(&mut c).await;
    assert_eq!(ask["params"]["sessionId"], sid.as_str());
    assert_eq!(ask["params"]["toolCall"]["rawInput"]["content"], "v1");
    let options: Vec<&str> = ask["params"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(options, ["allow_once", "reject_once"]);
    let (view, _) = c
        .exchange("berth.session_view.query", json!({"sessionId": sid}))
        .await;
    assert_eq!(
        view["result"]["pending"]["approvals"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "the wait shows as pending"
    );
    c.send_raw(&json!({"jsonrpc":"2.0","id":ask["id"],"result":{"outcome":{"outcome":"selected","optionId":"reject"}}}).to_string()).await;
    let (done, notes) = c.response(prompt).await;
    assert_eq!(done["result"]["stopReason"], "end_turn");
    assert!(!a.exists(), "a rejected call does not run");
    assert!(notes
        .iter()
        .any(|n| n["params"]["update"]["rawOutput"]["permission"]["outcome"] == "rejected"));

    // Allowed: it runs.
    let prompt = c.prompt(&sid, "write v1").await;
    let ask = next_permission_request(&mut c).await;
    c.send_raw(&json!({"jsonrpc":"2.0","id":ask["id"],"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}).to_string()).await;
    c.response(prompt).await;
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "v1");

    // Cancel while waiting: the wait resolves as cancelled and nothing runs.
    std::fs::remove_file(&a).unwrap();
    let prompt = c.prompt(&sid, "write v1").await;
    next_permission_request(&mut c).await;
    let (r, _) = c
        .exchange("session/cancel", json!({"sessionId": sid}))
        .await;
    assert_eq!(r["result"]["status"], "cancelled");
    let (done, _) = c.response(prompt).await;
    assert_eq!(done["result"]["stopReason"], "cancelled");
    assert!(!a.exists());
    let (view, _) = c
        .exchange("berth.session_view.query", json!({"sessionId": sid}))
        .await;
    assert!(view["result"]["pending"]["approvals"]
        .as_array()
        .unwrap()
        .is_empty());
    let load = c.call("session/load", json!({"sessionId": sid})).await;
    let resolved = load["result"]["_meta"]["berth"]["replayed"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "permission_resolved")
        .count();
    assert_eq!(
        resolved, 3,
        "every approval wait was answered: rejected, allowed, cancelled"
    );
}

#[tokio::test]
async fn only_the_injecting_client_may_revoke_or_replace() {
    use berth_actors::{Principal, Role};
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    // alice creates the session; bob is another controller; the local
    // connection is the host owner.
    let alice = Some(Principal::new("alice", Role::Controller));
    let bob = Some(Principal::new("bob", Role::Controller));
    let mut a = Client::connect_as(&node, alice, ServeOptions::default());
    let mut b = Client::connect_as(&node, bob, ServeOptions::default());
    let mut owner = Client::connect(&node, ServeOptions::default());
    let sid = a.new_session(dir.path()).await;
    let prompt = a.prompt(&sid, "sleep").await;
    a.until_in_progress().await;
    let (r, _) = a
        .exchange(
            "session/inject",
            json!({"sessionId": sid, "mode": "queue", "content": "mine"}),
        )
        .await;
    let id = r["result"]["messageId"].as_str().unwrap().to_owned();
    for method in ["session/revoke_inject", "session/replace_inject"] {
        let (r, notes) = b
            .exchange(
                method,
                json!({"sessionId": sid, "messageId": id, "content": "theirs"}),
            )
            .await;
        assert_eq!(
            error_of(&r),
            (
                -32008,
                json!({"messageId": id, "reason": "not_owner_or_not_authorized"})
            )
        );
        // The controlling connection is attached, so its receipt reaches it live.
        let got = receipts(&notes);
        assert_eq!(got.len(), 1, "{notes:?}");
        assert_eq!(got[0]["reason"], "not_owner_or_not_authorized");
        assert_eq!(got[0]["actor"], "bob", "the authenticated actor");
    }
    let (r, _) = a
        .exchange(
            "session/revoke_inject",
            json!({"sessionId": sid, "messageId": id}),
        )
        .await;
    assert_eq!(r["result"]["status"], "revoked");
    // The host owner may revoke another client's message, not replace it.
    let (r, _) = a
        .exchange(
            "session/inject",
            json!({"sessionId": sid, "mode": "queue", "content": "again"}),
        )
        .await;
    let id = r["result"]["messageId"].as_str().unwrap().to_owned();
    let (r, _) = owner
        .exchange(
            "session/replace_inject",
            json!({"sessionId": sid, "messageId": id, "content": "theirs"}),
        )
        .await;
    assert_eq!(error_of(&r).0, -32008);
    let (r, _) = owner
        .exchange(
            "session/revoke_inject",
            json!({"sessionId": sid, "messageId": id}),
        )
        .await;
    assert_eq!(r["result"]["status"], "revoked", "{r}");
    // bob may not close alice's session; alice (its creator) may.
    let (r, _) = b.exchange("session/close", json!({"sessionId": sid})).await;
    let (code, data) = error_of(&r);
    assert_eq!(code, -32011);
    assert_eq!(data["reason"], "role_not_authorized");
    assert_eq!(data["requiredRole"], "host_owner");
    a.exchange("session/cancel", json!({"sessionId": sid}))
        .await;
    a.response(prompt).await;
    let (r, _) = a.exchange("session/close", json!({"sessionId": sid})).await;
    assert!(r.get("result").is_some(), "{r}");
}

#[tokio::test]
async fn a_client_that_goes_away_mid_approval_does_not_hang_the_connection() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node_with(data.path(), |c| {
        c.needs_approval = vec!["write_file".into()]
    })
    .await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let prompt = c.prompt(&sid, "write v1").await;
    next_permission_request(&mut c).await;
    // The client's input ends without an answer (stdin closed).
    c.write.shutdown().await.unwrap();
    let (done, notes) = c.response(prompt).await;
    assert_eq!(
        done["result"]["stopReason"], "end_turn",
        "the turn went on without the write"
    );
    assert!(notes.iter().any(
        |n| n["params"]["update"]["rawOutput"]["permission"]["reason"]
            == "the client disconnected before answering"
    ));
    assert!(!dir.path().join("a.txt").exists());
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        while c.lines.next_line().await.ok().flatten().is_some() {}
    })
    .await;
    assert!(end.is_ok(), "the connection finished after its input ended");
}

#[tokio::test]
async fn rollback_never_overwrites_blindly_nor_hangs_on_special_files() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    c.exchange_prompt(&sid, "write v1").await;
    let a = dir.path().join("a.txt");

    // Edited by hand since the turn: refused, nothing changes.
    std::fs::write(&a, "hand edit").unwrap();
    let (r, _) = c
        .exchange("session/rollback", json!({"sessionId": sid}))
        .await;
    assert_eq!(r["result"]["status"], "files_conflict", "{r}");
    assert!(r["result"]["paths"][0]
        .as_str()
        .unwrap()
        .contains("changed since the checkpoint"));
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "hand edit");

    // Replaced by a FIFO: refused at once, the actor stays responsive.
    std::fs::remove_file(&a).unwrap();
    nix::unistd::mkfifo(&a, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let (r, _) = c
        .exchange("session/rollback", json!({"sessionId": sid}))
        .await;
    assert_eq!(r["result"]["status"], "files_conflict");
    let (view, _) = c
        .exchange("berth.session_view.query", json!({"sessionId": sid}))
        .await;
    assert_eq!(
        view["result"]["messageCount"], 4,
        "the transcript did not move"
    );

    // Put back as the turn left it: the rollback goes through.
    std::fs::remove_file(&a).unwrap();
    std::fs::write(&a, "v1").unwrap();
    let (r, _) = c
        .exchange("session/rollback", json!({"sessionId": sid}))
        .await;
    assert_eq!(r["result"]["status"], "rolled_back");
    assert!(!a.exists());

    // A closed session is read-only.
    c.call("session/close", json!({"sessionId": sid})).await;
    let (r, _) = c.exchange("session/redo", json!({"sessionId": sid})).await;
    assert_eq!(error_of(&r).0, -32005);
}

/// A rollback never writes through a hard link: another name of the file may
/// be outside the session's directories.
#[tokio::test]
async fn rollback_never_writes_through_a_hard_link() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    // The data dir lies outside every session root.
    let node = node(outside.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let a = dir.path().join("a.txt");
    std::fs::write(&a, "v0").unwrap();
    c.exchange_prompt(&sid, "write v1").await;
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "v1");
    // The name now links an outside file holding the turn's text.
    let target = outside.path().join("t.txt");
    std::fs::write(&target, "v1").unwrap();
    std::fs::remove_file(&a).unwrap();
    std::fs::hard_link(&target, &a).unwrap();
    let (r, _) = c
        .exchange("session/rollback", json!({"sessionId": sid}))
        .await;
    assert_eq!(r["result"]["status"], "files_conflict", "{r}");
    assert!(
        r["result"]["paths"][0]
            .as_str()
            .unwrap()
            .contains("hard links"),
        "{r}"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "v1", "untouched");
}

/// Suspends a session while its "short job" turn runs (finish_step): answers
/// the suspend's result and the prompt's response.
async fn suspend_mid_turn(c: &mut Client, sid: &str) -> (Value, Value) {
    let prompt = c.prompt(sid, "short job").await;
    c.until_in_progress().await;
    let suspended = c
        .call(
            "session/suspend",
            json!({"sessionId": sid, "reason": "review"}),
        )
        .await;
    let (answer, _) = c.response(prompt).await;
    (suspended, answer)
}

#[tokio::test]
async fn cancel_or_close_drop_a_parked_turn_and_use_up_its_handle() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let (suspended, answer) = suspend_mid_turn(&mut c, &sid).await;
    let handle = suspended["result"]["handle"].as_str().unwrap().to_owned();
    assert_eq!(answer["result"]["stopReason"], "end_turn");
    assert_eq!(
        answer["result"]["_meta"]["berth"]["terminal"]["kind"],
        "suspended"
    );
    assert_eq!(
        answer["result"]["_meta"]["berth"]["terminal"]["owner"],
        "user"
    );
    assert_eq!(
        answer["result"]["_meta"]["berth"]["handle"],
        handle.as_str()
    );
    // The parked turn is work: cancel drops it.
    let r = c.call("session/cancel", json!({"sessionId": sid})).await;
    assert_eq!(r["result"]["status"], "cancelled", "{r}");
    let r = c
        .call(
            "session/resume",
            json!({"sessionId": sid, "handle": handle}),
        )
        .await;
    let (code, data) = error_of(&r);
    assert_eq!(code, -32009);
    assert_eq!(data["reason"], "already_resumed");
    assert_eq!(data["claim"]["kind"], "cancelled");
    // The session is idle again and promptable; its transcript is whole.
    let r = c.call_prompt(&sid, "hi").await;
    assert_eq!(r["result"]["stopReason"], "end_turn");
    // Close while suspended: the resume fails, a second close is idempotent.
    let (suspended, _) = suspend_mid_turn(&mut c, &sid).await;
    let handle = suspended["result"]["handle"].as_str().unwrap().to_owned();
    assert_eq!(
        c.call("session/close", json!({"sessionId": sid})).await["result"],
        json!({})
    );
    let r = c
        .call(
            "session/resume",
            json!({"sessionId": sid, "handle": handle}),
        )
        .await;
    assert_eq!(error_of(&r).0, -32005, "{r}");
    assert_eq!(
        c.call("session/close", json!({"sessionId": sid})).await["result"],
        json!({})
    );
    let r = c
        .call("session/resume", json!({"sessionId": sid, "input": "go"}))
        .await;
    assert_eq!(error_of(&r).0, -32005, "{r}");
    let ran = std::fs::read_to_string(dir.path().join("jobs.log")).unwrap();
    assert_eq!(
        ran, "ran\nran\n",
        "each suspended job ran once and never again"
    );
}

#[tokio::test]
async fn suspend_params_are_validated_naming_the_field_and_change_nothing() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let cases = [
        (json!({"mode": "later"}), "mode"),
        (
            json!({"resumeWhen": {"timeout": {"durationMinutes": 0}}}),
            "resumeWhen.timeout.durationMinutes",
        ),
        (
            json!({"resumeWhen": {"timeout": {"durationMinutes": "5"}}}),
            "resumeWhen.timeout.durationMinutes",
        ),
        (
            json!({"resumeWhen": {"timeout": {"durationMinutes": 1, "onTimeout": "explode"}}}),
            "resumeWhen.timeout.onTimeout",
        ),
        (json!({"resumeWhen": {"onEvent": ""}}), "resumeWhen.onEvent"),
        (json!({"resumeWhen": {"when": "soon"}}), "resumeWhen.when"),
        (
            json!({"resumeWhen": {"trigger": {"cron": "not cron"}}}),
            "resumeWhen.trigger.cron",
        ),
        (json!({"reason": 5}), "reason"),
        (json!({"later": true}), "later"),
    ];
    for (extra, field) in cases {
        let mut params = json!({"sessionId": sid});
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        let r = c.call("session/suspend", params.clone()).await;
        let (code, data) = error_of(&r);
        assert_eq!(
            (code, data["field"].as_str()),
            (-32602, Some(field)),
            "{params} -> {r}"
        );
    }
    let view = c
        .call("berth.session_view.query", json!({"sessionId": sid}))
        .await;
    assert_eq!(view["result"]["run"]["status"], "idle");
    // Fractions of a minute are accepted (on another session: it fires in
    // 60 ms by itself).
    let tiny = c.new_session(dir.path()).await;
    let r = c
        .call(
            "session/suspend",
            json!({"sessionId": tiny, "resumeWhen": {"timeout": {"durationMinutes": 0.001}}}),
        )
        .await;
    assert_eq!(
        r["result"]["resumeWhen"]["timeout"]["durationMinutes"],
        0.001
    );
    c.call("session/suspend", json!({"sessionId": sid})).await;
    let r = c
        .call(
            "session/resume",
            json!({"sessionId": sid, "continueTranscript": "no"}),
        )
        .await;
    assert_eq!(
        error_of(&r),
        (
            -32602,
            json!({"field": "continueTranscript", "reason": "must be a boolean"})
        )
    );
    let r = c.call("session/resume", json!({"sessionId": sid})).await;
    assert!(
        r["result"]["_meta"]["berth"]["resumed"]["handle"].is_string(),
        "{r}"
    );
    let used = r["result"]["_meta"]["berth"]["resumed"]["handle"].clone();
    let r = c
        .call("session/resume", json!({"sessionId": sid, "input": "x"}))
        .await;
    assert_eq!(error_of(&r).1["reason"], "not_suspended");
    // Another session's used handle is not reported as this one's claim.
    let other = c.new_session(dir.path()).await;
    c.call("session/suspend", json!({"sessionId": other})).await;
    let r = c
        .call(
            "session/resume",
            json!({"sessionId": other, "handle": used}),
        )
        .await;
    // It is suspended, under its own handle.
    assert_eq!(error_of(&r).1["reason"], "handle_mismatch", "{r}");
    assert!(error_of(&r).1["currentHandle"].is_string(), "{r}");
}

#[tokio::test]
async fn a_broadcast_suspend_reports_every_session() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(
        &node,
        ServeOptions {
            max_in_flight: 512,
            ..ServeOptions::default()
        },
    );
    let mut running = Vec::new();
    for i in 0..100 {
        let label = if i % 2 == 0 { "even" } else { "odd" };
        let r = c
            .call(
                "session/new",
                json!({"cwd": dir.path(), "mcpServers": [], "_meta": {"berth": {"labels": [label]}}}),
            )
            .await;
        running.push(r["result"]["sessionId"].as_str().unwrap().to_owned());
    }
    let idle = c.new_session(dir.path()).await;
    let parked = c.new_session(dir.path()).await;
    let handle = c
        .call("session/suspend", json!({"sessionId": parked}))
        .await["result"]["handle"]
        .clone();
    let prompts: Vec<u64> = {
        let mut ids = Vec::new();
        for sid in &running {
            ids.push(c.prompt(sid, "slow").await);
        }
        ids
    };
    let mut ids: Vec<Value> = running.iter().map(|s| json!(s)).collect();
    ids.extend([json!(idle), json!(parked), json!("sess_nope")]);
    let r = c
        .call("_berth/suspend_many", json!({"sessionIds": ids}))
        .await;
    let results = r["result"]["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(results.len(), 103);
    let outcome = |sid: &str| {
        results
            .iter()
            .find(|e| e["sessionId"] == sid)
            .unwrap_or_else(|| panic!("no result for {sid}"))
            .clone()
    };
    for sid in &running {
        let o = outcome(sid);
        assert_eq!(o["outcome"], "suspended", "{o}");
        assert!(o["handle"].is_string());
    }
    assert_eq!(outcome(&idle)["outcome"], "not_running");
    assert_eq!(outcome(&parked)["outcome"], "already_suspended");
    assert_eq!(outcome(&parked)["handle"], handle);
    assert_eq!(outcome("sess_nope")["outcome"], "unknown");
    for id in prompts {
        let (answer, _) = c.response(id).await;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    }
    // By label, and selector validation.
    let r = c
        .call("_berth/suspend_many", json!({"label": "even"}))
        .await;
    let results = r["result"]["results"].as_array().unwrap();
    assert_eq!(results.len(), 50);
    assert!(results.iter().all(|e| e["outcome"] == "already_suspended"));
    let r = c
        .call("_berth/suspend_many", json!({"all": true, "label": "even"}))
        .await;
    assert_eq!(error_of(&r).0, -32602);
}

#[tokio::test]
async fn a_budget_breach_suspends_for_the_policy_and_a_refill_resumes() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node_with(data.path(), |c| {
        c.budgets = vec![berth_runtime::budget::BudgetPolicy {
            label: Some("metered".into()),
            limits: berth_runtime::budget::BudgetLimits {
                max_tool_calls: Some(0),
                ..Default::default()
            },
        }];
    })
    .await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let r = c
        .call(
            "session/new",
            json!({"cwd": dir.path(), "mcpServers": [], "_meta": {"berth": {"labels": ["metered"]}}}),
        )
        .await;
    let sid = r["result"]["sessionId"].as_str().unwrap().to_owned();
    let answer = c.call_prompt(&sid, "budgeted").await;
    let berth = &answer["result"]["_meta"]["berth"];
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(berth["terminal"]["kind"], "policy_budget");
    assert_eq!(berth["terminal"]["owner"], "policy");
    let log = || std::fs::read_to_string(dir.path().join("budget.log")).unwrap_or_default();
    assert_eq!(log(), "", "a budget of no tool calls dispatches none");
    let view = c
        .call("berth.session_view.query", json!({"sessionId": sid}))
        .await;
    let suspension = &view["result"]["run"]["suspension"];
    assert_eq!(suspension["initiator"], "policy", "{view}");
    assert!(suspension["reason"]
        .as_str()
        .unwrap()
        .contains("tool calls"));
    // A bad refill is refused and changes nothing; a good one resumes.
    let r = c
        .call(
            "session/resume",
            json!({"sessionId": sid, "input": {"budget": {"max_tools": 5}}}),
        )
        .await;
    assert_eq!(error_of(&r).1["field"], "input.budget", "{r}");
    let (r, mut notes) = c
        .exchange(
            "session/resume",
            json!({"sessionId": sid, "input": {"budget": {"max_tool_calls": 5}}}),
        )
        .await;
    assert!(
        r["result"]["_meta"]["berth"]["resumed"]["handle"].is_string(),
        "{r}"
    );
    while !notes.iter().any(|n| n["params"]["type"] == "turn_ended") {
        notes.push(c.read().await);
    }
    let ended = notes
        .iter()
        .find(|n| n["params"]["type"] == "turn_ended")
        .unwrap();
    assert_eq!(
        ended["params"]["event"]["terminal"]["kind"], "completed",
        "{ended}"
    );
    // The top-up is berth's, not the model's: the turn reads no resume
    // message and carries on with its script where it parked.
    assert_eq!(log(), "A\nB\n");
}

#[tokio::test]
async fn a_schedule_prompts_its_session_until_paused_and_validates_its_fields() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    for (params, field) in [
        (json!({"cron": "61 * * * *", "prompt": "hi"}), "cron"),
        (
            json!({"cron": "* * * * *", "timezone": "Mars/Base", "prompt": "hi"}),
            "timezone",
        ),
        (
            json!({"cron": "* * * * *", "prompt": "hi", "overlap": "often"}),
            "overlap",
        ),
        (json!({"cron": "* * * * *", "prompt": ""}), "prompt"),
    ] {
        let mut params = params;
        params["sessionId"] = json!(sid);
        let r = c.call("_berth/schedule.create", params.clone()).await;
        assert_eq!(error_of(&r).1["field"], field, "{params} -> {r}");
    }
    // Every second (6-field cron with seconds).
    let r = c
        .call(
            "_berth/schedule.create",
            json!({"sessionId": sid, "cron": "* * * * * *", "prompt": "hi", "overlap": "buffer_one"}),
        )
        .await;
    let id = r["result"]["scheduleId"].as_str().unwrap().to_owned();
    // Two runs arrive as turns with the schedule's prompt.
    let mut runs = 0;
    while runs < 2 {
        let note = c.read().await;
        if note["params"]["type"] == "turn_ended" {
            runs += 1;
        }
    }
    let paused = c
        .call("_berth/schedule.pause", json!({"scheduleId": id}))
        .await;
    assert_eq!(paused["result"]["paused"], true);
    let list = c.call("_berth/schedule.list", json!({})).await;
    assert!(list["result"]["schedules"][0]["fired"].as_u64().unwrap() >= 2);
    assert_eq!(
        c.call("_berth/schedule.delete", json!({"scheduleId": id}))
            .await["result"],
        json!({})
    );
    let r = c
        .call("_berth/schedule.delete", json!({"scheduleId": id}))
        .await;
    assert_eq!(error_of(&r).1["field"], "scheduleId");
}

/// One connection watches every session it creates through one watcher;
/// the sessions park and passivate (no actor), and each one's resumption
/// still reaches the connection once the session rehydrates.
#[tokio::test]
async fn a_connection_hears_each_of_its_passivated_sessions_resume() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node_with(data.path(), |c| c.passivate_after_ms = 0).await;
    let mut watching = Client::connect(&node, ServeOptions::default());
    watching
        .call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {"_meta": {"berth": {"suspendUpdates": true}}}}),
        )
        .await;
    let sessions = [
        watching.new_session(dir.path()).await,
        watching.new_session(dir.path()).await,
    ];
    for sid in &sessions {
        watching
            .call("session/suspend", json!({"sessionId": sid}))
            .await;
    }
    for sid in &sessions {
        let id = berth_runtime::ids::SessionId::from(sid.as_str());
        let mut waited = 0;
        while node.is_live(&id).await {
            assert!(waited < 2_000, "{sid} kept its actor");
            tokio::time::sleep(Duration::from_millis(5)).await;
            waited += 5;
        }
    }
    let mut other = Client::connect(&node, ServeOptions::default());
    for sid in &sessions {
        let r = other
            .call("session/resume", json!({"sessionId": sid}))
            .await;
        assert!(r["result"].is_object(), "{r}");
        let update = next_note(&mut watching, |v| {
            v["params"]["update"]["sessionUpdate"] == "resumed"
        })
        .await;
        assert_eq!(update["params"]["sessionId"], json!(sid), "{update}");
    }
}

/// Reads notifications until one matches `pred`; returns it.
async fn next_note(c: &mut Client, pred: impl Fn(&Value) -> bool) -> Value {
    loop {
        let v = c.read().await;
        if v.get("method").is_some() && pred(&v) {
            return v;
        }
    }
}

#[tokio::test]
async fn a_scheduled_wakeup_names_its_lateness_and_the_fresh_turn_it_starts() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    // A `suspendUpdates` client: the `resumed` session/update carries the
    // wake-up's lateness in its `_meta.berth`.
    let mut c = Client::connect(&node, ServeOptions::default());
    c.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {"_meta": {"berth": {"suspendUpdates": true}}}}),
    )
    .await;
    let sid = c.new_session(dir.path()).await;
    let r = c
        .call(
            "session/suspend",
            json!({"sessionId": sid, "resumeWhen": {"timeout": {"durationMinutes": 0.001}}}),
        )
        .await;
    let handle = r["result"]["handle"].clone();
    let update = next_note(&mut c, |v| {
        v["params"]["update"]["sessionUpdate"] == "resumed"
    })
    .await;
    let update = &update["params"]["update"];
    assert_eq!(update["handle"], handle, "{update}");
    assert_eq!(update["cause"], "timeout", "{update}");
    assert!(
        update["_meta"]["berth"]["latenessMs"].is_u64(),
        "the resumed update names the lateness: {update}"
    );

    // A stock client: the `resumed` agentEvent of a resume that starts a
    // fresh turn (an idle suspension woken with input) names that turn.
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    c.call("session/suspend", json!({"sessionId": sid})).await;
    let id = c
        .request("session/resume", json!({"sessionId": sid, "input": "hi"}))
        .await;
    let (answer, notes) = c.response(id).await;
    let turn_id = answer["result"]["_meta"]["berth"]["resumed"]["turnId"].clone();
    assert!(turn_id.is_string(), "{answer}");
    let resumed = notes
        .iter()
        .find(|n| n["params"]["type"] == "resumed")
        .expect("the resumed agentEvent precedes the answer");
    assert_eq!(resumed["params"]["event"]["turn_id"], turn_id, "{resumed}");
    let started = notes
        .iter()
        .find(|n| n["params"]["update"]["sessionUpdate"] == "user_message_chunk")
        .expect("the fresh turn's prompt");
    assert_eq!(started["params"]["update"]["content"]["text"], "hi");
}

#[tokio::test]
async fn an_event_without_data_wakes_without_input() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    c.call(
        "session/suspend",
        json!({"sessionId": sid, "resumeWhen": {"onEvent": "nightly.*"}}),
    )
    .await;
    let id = c
        .request("_berth/event.emit", json!({"name": "nightly.start"}))
        .await;
    let (answer, notes) = c.response(id).await;
    assert_eq!(answer["result"]["woke"][0]["resumed"], true, "{answer}");
    let resumed = notes
        .iter()
        .find(|n| n["params"]["type"] == "resumed")
        .expect("resumed before the emit's answer");
    assert_eq!(resumed["params"]["event"]["cause"], "external_event");
    assert_eq!(
        resumed["params"]["event"]["had_resume_input"], false,
        "{resumed}"
    );
    // An idle session woken without input just wakes: no turn, no "null" prompt.
    assert!(resumed["params"]["event"]["turn_id"].is_null(), "{resumed}");
    let view = c
        .call("berth.session_view.query", json!({"sessionId": sid}))
        .await;
    assert_eq!(view["result"]["run"]["status"], "idle", "{view}");
    assert_eq!(view["result"]["messageCount"], 0, "{view}");
}

/// The connection's writer buffers its output: each frame used to cost two
/// unbuffered writes (the frame, then its newline) — over stdio two round
/// trips through tokio's blocking pool each, which capped a busy connection
/// (bench-sched: 10,000 parked sessions waking at once).
mod buffered_output {
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use tokio::io::AsyncWrite;

    use super::*;

    /// Counts the writes made through it.
    struct CountingWriter<W> {
        inner: W,
        writes: Arc<AtomicUsize>,
    }

    impl<W: AsyncWrite + Unpin> AsyncWrite for CountingWriter<W> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.writes.fetch_add(1, Ordering::Relaxed);
            Pin::new(&mut self.inner).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    #[tokio::test]
    async fn a_burst_of_frames_takes_at_most_one_write_each_and_every_frame_arrives() {
        let data = tempfile::tempdir().unwrap();
        let node = node(data.path()).await;
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let (r, w) = tokio::io::split(theirs);
        let writes = Arc::new(AtomicUsize::new(0));
        let counted = CountingWriter {
            inner: w,
            writes: Arc::clone(&writes),
        };
        tokio::spawn(serve(node.clone(), r, counted, ServeOptions::default()));
        let (r, mut w) = tokio::io::split(ours);
        let mut lines = BufReader::new(r).lines();
        let burst: String = (1..=50)
            .map(|id| {
                format!(
                    "{}\n",
                    json!({"jsonrpc": "2.0", "id": id, "method": "session/list"})
                )
            })
            .collect();
        w.write_all(burst.as_bytes()).await.unwrap();
        // Every answer arrives with nothing more sent: none is left sitting
        // in the buffer once the queue runs dry.
        let mut ids = Vec::new();
        for _ in 0..50 {
            let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
                .await
                .expect("every answer is flushed")
                .unwrap()
                .expect("stream ended");
            let v: Value = serde_json::from_str(&line).unwrap();
            assert!(v.get("result").is_some(), "{v}");
            ids.push(v["id"].as_u64().unwrap());
        }
        ids.sort_unstable();
        assert_eq!(ids, (1..=50).collect::<Vec<u64>>());
        let n = writes.load(Ordering::Relaxed);
        assert!(
            n <= 50,
            "{n} writes for 50 frames (unbuffered: two per frame)"
        );
    }
}

#[tokio::test]
async fn observers_watch_approvals_but_are_never_asked() {
    use berth_actors::{Principal, Role};
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node_with(data.path(), |c| {
        c.needs_approval = vec!["write_file".into()]
    })
    .await;
    // The observer attaches first: it would be the first watcher asked.
    let mut watcher = Client::connect_as(
        &node,
        Some(Principal::new("grafana", Role::Observer)),
        ServeOptions::default(),
    );
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let loaded = watcher
        .call("session/load", json!({"sessionId": sid}))
        .await;
    assert!(loaded.get("result").is_some(), "{loaded}");
    let prompt = c.prompt(&sid, "write v1").await;
    let ask = next_permission_request(&mut c).await;
    // The observer sees the tool call wait, and hears no request.
    c.send_raw(
        &json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "reject"}}})
            .to_string(),
    )
    .await;
    let (done, _) = c.response(prompt).await;
    assert_eq!(done["result"]["stopReason"], "end_turn");
    // Everything the observer received up to a later answer: the wait and
    // its outcome, never the request.
    let (seen, notes) = watcher.exchange("session/list", json!({})).await;
    assert!(seen.get("result").is_some());
    assert!(notes
        .iter()
        .any(|n| n["params"]["update"]["rawOutput"]["permission"]["outcome"] == "rejected"));
    assert!(
        notes
            .iter()
            .all(|n| n["method"] != "session/request_permission"),
        "{notes:?}"
    );
}

#[tokio::test]
async fn list_entries_and_session_get_carry_state_spend_and_the_suspension() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let r = c
        .call(
            "session/new",
            json!({"cwd": dir.path(), "mcpServers": [], "_meta": {"berth": {"labels": ["fleet"]}}}),
        )
        .await;
    let sid = r["result"]["sessionId"].as_str().unwrap().to_owned();
    let prompted = c.call_prompt(&sid, "hi").await;
    assert_eq!(prompted["result"]["stopReason"], "end_turn", "{prompted}");
    let suspended = c
        .call(
            "session/suspend",
            json!({"sessionId": sid, "reason": "review",
                   "resumeWhen": {"onEvent": "ci.passed", "timeout": {"durationMinutes": 5}}}),
        )
        .await;
    let handle = suspended["result"]["handle"].clone();
    assert!(handle.is_string(), "{suspended}");

    let got = c
        .call("_berth/session.get", json!({"sessionId": sid}))
        .await;
    let berth = &got["result"]["session"]["_meta"]["berth"];
    assert_eq!(got["result"]["session"]["sessionId"], json!(sid), "{got}");
    assert_eq!(berth["state"], "suspended", "{got}");
    assert_eq!(berth["labels"], json!(["fleet"]));
    assert!(
        berth["spend"]["outputTokens"].as_u64().unwrap() > 0,
        "{got}"
    );
    assert_eq!(berth["suspended"]["handle"], handle);
    assert_eq!(berth["suspended"]["reason"], "review");
    assert_eq!(berth["suspended"]["mode"], "finish_step");
    assert_eq!(berth["suspended"]["resumeWhen"]["onEvent"], "ci.passed");
    assert!(berth["suspended"]["suspendedAt"].is_string(), "{got}");
    // The list entry is the same entry.
    let list = c.call("session/list", json!({})).await;
    assert_eq!(list["result"]["sessions"][0], got["result"]["session"]);

    let unknown = c
        .call("_berth/session.get", json!({"sessionId": "sess_nope"}))
        .await;
    assert_eq!(error_of(&unknown).0, -32004, "{unknown}");
    let missing = c.call("_berth/session.get", json!({})).await;
    assert_eq!(
        error_of(&missing),
        (
            -32602,
            json!({"field": "sessionId", "reason": "is required"})
        )
    );
}

/// Every key of every object in `v` whose value is `null`, by path.
fn null_paths(v: &Value, path: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let here = format!("{path}.{k}");
                if v.is_null() {
                    out.push(here);
                } else {
                    null_paths(v, &here, out);
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                null_paths(v, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn nulls(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    null_paths(v, "", &mut out);
    out
}

#[tokio::test]
async fn rfc_suspend_shapes_are_accepted_and_optional_fields_omitted() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    c.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {"_meta": {"berth": {"suspendUpdates": true}}}}),
    )
    .await;
    let sid = c.new_session(dir.path()).await;

    // No reason, no resumeWhen: absent from the answer, the update and the
    // list entry, never null.
    let mut notes = Vec::new();
    let r = c
        .exchange_into(&mut notes, "session/suspend", json!({"sessionId": sid}))
        .await;
    assert!(r["result"]["handle"].is_string(), "{r}");
    assert_eq!(nulls(&r), Vec::<String>::new(), "{r}");
    let list = c.call("session/list", json!({})).await;
    assert_eq!(nulls(&list), Vec::<String>::new(), "{list}");
    let r = c
        .exchange_into(&mut notes, "session/resume", json!({"sessionId": sid}))
        .await;
    assert_eq!(nulls(&r), Vec::<String>::new(), "{r}");
    for kind in ["suspended", "resumed"] {
        let update = notes
            .iter()
            .find(|v| v["params"]["update"]["sessionUpdate"] == kind)
            .unwrap_or_else(|| panic!("no {kind} update in {notes:?}"));
        assert_eq!(nulls(update), Vec::<String>::new(), "{update}");
    }

    // `_meta` on every object of resumeWhen is accepted; `resume_with_input`
    // without `input` (the RFC's ResumeTimeoutSpec has none) too.
    let r = c
        .call(
            "session/suspend",
            json!({"sessionId": sid, "_meta": {"x": 1},
                   "resumeWhen": {
                       "_meta": {"x": 2},
                       "trigger": {"event": "ci.passed", "filter": {"branch": "main"}, "_meta": {}},
                       "timeout": {"durationMinutes": 0.001, "onTimeout": "resume_with_input",
                                   "_meta": {"x": 3}}}}),
        )
        .await;
    assert!(r["result"]["handle"].is_string(), "{r}");
    assert_eq!(
        r["result"]["resumeWhen"]["timeout"],
        json!({"durationMinutes": 0.001, "onTimeout": "resume_with_input"}),
        "{r}"
    );
    // The timeout resumes with the timeout notice as input: a fresh turn
    // whose prompt says the wait timed out.
    let resumed = next_note(&mut c, |v| {
        v["params"]["update"]["sessionUpdate"] == "resumed"
    })
    .await;
    assert_eq!(resumed["params"]["update"]["cause"], "timeout", "{resumed}");
    assert_eq!(
        resumed["params"]["update"]["hadResumeInput"], true,
        "{resumed}"
    );
    let prompt = next_note(&mut c, |v| {
        v["params"]["update"]["sessionUpdate"] == "user_message_chunk"
    })
    .await;
    let text = prompt["params"]["update"]["content"]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("timed out"), "{prompt}");

    // Unknown keys beside `_meta` are still refused, by path; so is a
    // `_meta` that is not an object.
    for (resume_when, field) in [
        (
            json!({"timeout": {"durationMinutes": 1, "_meta": {}, "later": 1}}),
            "resumeWhen.timeout.later",
        ),
        (
            json!({"trigger": {"cron": "0 9 * * *", "_meta": {}, "tz": "UTC"}}),
            "resumeWhen.trigger.tz",
        ),
        (json!({"_meta": 5}), "resumeWhen._meta"),
    ] {
        let r = c
            .call(
                "session/suspend",
                json!({"sessionId": sid, "resumeWhen": resume_when}),
            )
            .await;
        let (code, data) = error_of(&r);
        assert_eq!((code, data["field"].as_str()), (-32602, Some(field)), "{r}");
    }
}

#[tokio::test]
async fn a_prompt_is_echoed_to_other_watchers_but_not_to_its_sender() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut sender = Client::connect(&node, ServeOptions::default());
    let sid = sender.new_session(dir.path()).await;
    let mut watcher = Client::connect(&node, ServeOptions::default());
    let load = watcher
        .call(
            "session/load",
            json!({"sessionId": sid, "cwd": dir.path(), "mcpServers": []}),
        )
        .await;
    assert!(load.get("result").is_some(), "{load}");

    let (answer, notes) = sender.exchange_prompt(&sid, "hi").await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let is_echo = |n: &Value| n["params"]["update"]["sessionUpdate"] == "user_message_chunk";
    assert!(
        notes
            .iter()
            .any(|n| n["params"]["update"]["sessionUpdate"] == "agent_message_chunk"),
        "the sender streams the turn: {notes:?}"
    );
    assert!(
        !notes.iter().any(is_echo),
        "the sender is not shown its own prompt: {notes:?}"
    );
    // The other watcher gets it live, before the answer text.
    let echo = next_note(&mut watcher, |n| {
        is_echo(n) || n["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    })
    .await;
    assert!(is_echo(&echo), "{echo}");
    assert_eq!(echo["params"]["update"]["content"]["text"], "hi");
    assert!(
        echo["params"]["_meta"]["berth"]["replayed"].is_null(),
        "{echo}"
    );

    // A replay on load includes it, for the sender too.
    let id = sender
        .request(
            "session/load",
            json!({"sessionId": sid, "cwd": dir.path(), "mcpServers": []}),
        )
        .await;
    let (_, replayed) = sender.response(id).await;
    let echoes: Vec<&Value> = replayed.iter().filter(|n| is_echo(n)).collect();
    assert_eq!(echoes.len(), 1, "{replayed:?}");
    assert_eq!(echoes[0]["params"]["update"]["content"]["text"], "hi");
    assert_eq!(echoes[0]["params"]["_meta"]["berth"]["replayed"], true);
}

/// A node whose sessions labelled `metered` run under `limits`.
async fn metered_node(dir: &std::path::Path, limits: berth_runtime::budget::BudgetLimits) -> Node {
    node_with(dir, |c| {
        c.budgets = vec![berth_runtime::budget::BudgetPolicy {
            label: Some("metered".into()),
            limits,
        }];
    })
    .await
}

async fn metered_session(c: &mut Client, dir: &std::path::Path) -> String {
    let r = c
        .call(
            "session/new",
            json!({"cwd": dir, "mcpServers": [], "_meta": {"berth": {"labels": ["metered"]}}}),
        )
        .await;
    r["result"]["sessionId"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_tool_call_budget_of_two_dispatches_two_calls_of_a_batch_of_three() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = metered_node(
        data.path(),
        berth_runtime::budget::BudgetLimits {
            max_tool_calls: Some(2),
            ..Default::default()
        },
    )
    .await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = metered_session(&mut c, dir.path()).await;
    let log = || std::fs::read_to_string(dir.path().join("jobs3.log")).unwrap_or_default();
    let answer = c.call_prompt(&sid, "three jobs").await;
    let berth = &answer["result"]["_meta"]["berth"];
    assert_eq!(berth["terminal"]["kind"], "policy_budget", "{answer}");
    assert_eq!(log(), "1\n2\n", "exactly two calls ran");
    let view = c
        .call("berth.session_view.query", json!({"sessionId": sid}))
        .await;
    let suspension = &view["result"]["run"]["suspension"];
    assert_eq!(suspension["initiator"], "policy", "{view}");
    let reason = suspension["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("tool calls") && reason.contains('2'),
        "{reason}"
    );
    // A top-up runs the third call from the parked frame; none runs twice.
    let (r, mut notes) = c
        .exchange(
            "session/resume",
            json!({"sessionId": sid, "input": {"budget": {"max_tool_calls": 5}}}),
        )
        .await;
    assert!(
        r["result"]["_meta"]["berth"]["resumed"]["handle"].is_string(),
        "{r}"
    );
    while !notes.iter().any(|n| n["params"]["type"] == "turn_ended") {
        notes.push(c.read().await);
    }
    let ended = notes
        .iter()
        .find(|n| n["params"]["type"] == "turn_ended")
        .unwrap();
    assert_eq!(
        ended["params"]["event"]["terminal"]["kind"], "completed",
        "{ended}"
    );
    assert_eq!(log(), "1\n2\n3\n");
}

#[tokio::test]
async fn a_token_budget_already_reached_starts_no_model_call() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // The scripted "hi" turn spends 1 input and 2 output tokens.
    let node = metered_node(
        data.path(),
        berth_runtime::budget::BudgetLimits {
            max_tokens: Some(3),
            ..Default::default()
        },
    )
    .await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = metered_session(&mut c, dir.path()).await;
    let first = c.call_prompt(&sid, "hi").await;
    let berth = &first["result"]["_meta"]["berth"];
    assert_eq!(berth["terminal"]["kind"], "completed", "{first}");
    assert_eq!(
        berth["usage"],
        json!({"input_tokens": 1, "output_tokens": 2}),
        "{first}"
    );
    // The limit is reached (3 of 3): the next turn parks before calling the
    // model.
    let (second, notes) = c.exchange_prompt(&sid, "hi").await;
    let berth = &second["result"]["_meta"]["berth"];
    assert_eq!(berth["terminal"]["kind"], "policy_budget", "{second}");
    assert!(
        !notes
            .iter()
            .any(|n| n["params"]["update"]["sessionUpdate"] == "agent_message_chunk"),
        "no model call: {notes:?}"
    );
    assert_eq!(
        berth["usage"],
        json!({"input_tokens": 0, "output_tokens": 0}),
        "{second}"
    );
}

#[tokio::test]
async fn a_message_that_repeats_a_key_is_refused_whole() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    // Last-wins would close the session.
    c.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"session/list","method":"session/close","params":{{"sessionId":"{sid}"}}}}"#
    ))
    .await;
    let r = c.read().await;
    assert_eq!(
        error_of(&r),
        (
            -32600,
            json!({"reason": "duplicate_key", "key": "method", "path": "/method"})
        ),
        "{r}"
    );
    // At any depth.
    c.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":8,"method":"session/prompt","params":{{"sessionId":"{sid}","prompt":[{{"type":"text","text":"a","text":"b"}}]}}}}"#
    ))
    .await;
    let r = c.read().await;
    assert_eq!(
        error_of(&r).1,
        json!({"reason": "duplicate_key", "key": "text", "path": "/params/prompt/0/text"}),
        "{r}"
    );
    // Nothing changed: the session is open and has no turn.
    let list = c.call("session/list", json!({})).await;
    let entry = &list["result"]["sessions"][0];
    assert_eq!(entry["sessionId"], sid.as_str(), "{list}");
    assert!(entry["_meta"]["berth"]["closedAt"].is_null(), "{list}");
}

/// Opens the gate a "gated" turn's shell call waits for.
fn open_gate(dir: &std::path::Path) {
    std::fs::write(dir.join("gate.open"), "").unwrap();
}

/// The session's `_meta.berth.state` in `session/list`.
async fn listed_state(c: &mut Client, sid: &str) -> Value {
    let list = c.call("session/list", json!({})).await;
    list["result"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sessionId"] == sid)
        .map(|s| s["_meta"]["berth"]["state"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_closed_session_refuses_every_resume() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let suspended = c.call("session/suspend", json!({"sessionId": sid})).await;
    let handle = suspended["result"]["handle"].as_str().unwrap().to_owned();
    assert_eq!(
        c.call("session/close", json!({"sessionId": sid})).await["result"],
        json!({})
    );
    let closed = json!({"sessionId": sid, "reason": "session_closed"});
    for params in [
        json!({"sessionId": sid}),
        json!({"sessionId": sid, "handle": handle}),
        json!({"sessionId": sid, "input": "go"}),
    ] {
        let r = c.call("session/resume", params.clone()).await;
        assert_eq!(error_of(&r), (-32005, closed.clone()), "{params}: {r}");
    }
}

#[tokio::test]
async fn a_bare_resume_of_a_suspension_claimed_by_another_names_that_claim() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut a = Client::connect(&node, ServeOptions::default());
    let mut b = Client::connect(&node, ServeOptions::default());
    let sid = a.new_session(dir.path()).await;
    let suspended = a.call("session/suspend", json!({"sessionId": sid})).await;
    let handle = suspended["result"]["handle"].clone();
    let won = a
        .call(
            "session/resume",
            json!({"sessionId": sid, "handle": handle}),
        )
        .await;
    assert_eq!(
        won["result"]["_meta"]["berth"]["resumed"]["handle"], handle,
        "{won}"
    );
    assert!(
        won["result"]["_meta"]["berth"].get("claim").is_none(),
        "{won}"
    );
    // B meant to wake it too: it only reattached, and the answer says who won.
    let lost = b.call("session/resume", json!({"sessionId": sid})).await;
    let berth = &lost["result"]["_meta"]["berth"];
    assert!(berth.get("resumed").is_none(), "{lost}");
    assert_eq!(berth["claim"]["handle"], handle, "{lost}");
    assert_eq!(berth["claim"]["kind"], "resumed", "{lost}");
    assert_eq!(berth["claim"]["cause"], "explicit_resume", "{lost}");
    assert!(berth["claim"]["actor"].is_string(), "{lost}");
    assert!(berth["claim"]["claimedAt"].is_string(), "{lost}");
    // A session suspended again has no used-up claim to report: a bare
    // resume claims the new suspension.
    let again = a.call("session/suspend", json!({"sessionId": sid})).await;
    let r = b.call("session/resume", json!({"sessionId": sid})).await;
    assert_eq!(
        r["result"]["_meta"]["berth"]["resumed"]["handle"], again["result"]["handle"],
        "{r}"
    );
    assert!(r["result"]["_meta"]["berth"].get("claim").is_none(), "{r}");
}

#[tokio::test]
async fn a_pending_suspend_shows_requested_until_it_parks() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let prompt = c.prompt(&sid, "gated").await;
    c.until_in_progress().await;
    assert_eq!(listed_state(&mut c, &sid).await, "running");
    let suspend = c
        .request("session/suspend", json!({"sessionId": sid}))
        .await;
    // The suspend is accepted while the gated call runs; poll until the
    // list reflects it.
    let mut state = listed_state(&mut c, &sid).await;
    while state == "running" {
        state = listed_state(&mut c, &sid).await;
    }
    assert_eq!(state, "requested");
    let view = c
        .call("berth.session_view.query", json!({"sessionId": sid}))
        .await;
    assert_eq!(view["result"]["run"]["status"], "requested", "{view}");
    assert_eq!(
        view["result"]["run"]["suspension"]["state"], "requested",
        "{view}"
    );
    let got = c
        .call("_berth/session.get", json!({"sessionId": sid}))
        .await;
    assert_eq!(
        got["result"]["session"]["_meta"]["berth"]["state"],
        "requested"
    );
    open_gate(dir.path());
    let (suspended, _) = c.response(suspend).await;
    assert!(suspended["result"]["handle"].is_string(), "{suspended}");
    let (answer, _) = c.response(prompt).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(listed_state(&mut c, &sid).await, "suspended");
    // The journaled request says the state it was accepted in.
    let mut reader = Client::connect(&node, ServeOptions::default());
    let (_, notes) = reader
        .exchange("session/load", json!({"sessionId": sid}))
        .await;
    let requested = notes
        .iter()
        .find(|n| n["params"]["type"] == "suspend_requested")
        .expect("a suspend_requested event");
    assert_eq!(
        requested["params"]["event"]["state"], "requested",
        "{requested}"
    );
}

#[tokio::test]
async fn a_second_suspend_with_other_conditions_is_refused_and_one_without_joins() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let prompt = c.prompt(&sid, "gated").await;
    c.until_in_progress().await;
    let first = c
        .request(
            "session/suspend",
            json!({"sessionId": sid, "resumeWhen": {"onEvent": "ci.passed"}}),
        )
        .await;
    while listed_state(&mut c, &sid).await == "running" {}
    let other = c
        .call(
            "session/suspend",
            json!({"sessionId": sid, "resumeWhen": {"onEvent": "ci.failed"}}),
        )
        .await;
    let (code, data) = error_of(&other);
    assert_eq!(code, -32602, "{other}");
    assert_eq!(data["field"], "resumeWhen", "{other}");
    assert_eq!(data["reason"], "suspend_pending", "{other}");
    assert_eq!(data["pendingResumeWhen"]["onEvent"], "ci.passed", "{other}");
    let handle = data["handle"].clone();
    assert!(handle.is_string(), "{other}");
    // No conditions, or the same ones: the request joins the pending one.
    let bare = c
        .request("session/suspend", json!({"sessionId": sid}))
        .await;
    let same = c
        .request(
            "session/suspend",
            json!({"sessionId": sid, "resumeWhen": {"onEvent": "ci.passed"}}),
        )
        .await;
    // Both are accepted before the gate opens (the list is answered after them).
    while listed_state(&mut c, &sid).await != "requested" {}
    open_gate(dir.path());
    for id in [first, bare, same] {
        let (r, _) = c.response(id).await;
        assert_eq!(r["result"]["handle"], handle, "{r}");
        assert_eq!(r["result"]["resumeWhen"]["onEvent"], "ci.passed", "{r}");
    }
    c.response(prompt).await;
    // The refused request changed nothing: the suspension waits for ci.passed.
    let got = c
        .call("_berth/session.get", json!({"sessionId": sid}))
        .await;
    let berth = &got["result"]["session"]["_meta"]["berth"];
    assert_eq!(berth["suspended"]["handle"], handle, "{got}");
    assert_eq!(
        berth["suspended"]["resumeWhen"],
        json!({"onEvent": "ci.passed"}),
        "{got}"
    );
}

/// A provider that records every request's messages and answers from the
/// wire script.
#[derive(Debug)]
struct Recording {
    inner: ScriptedModel,
    seen: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl berth_runtime::model::ModelProvider for Recording {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn complete(
        &self,
        request: &berth_runtime::model::ModelRequest,
        deltas: tokio::sync::mpsc::UnboundedSender<berth_runtime::model::ModelDelta>,
    ) -> Result<berth_runtime::model::ModelResponse, berth_runtime::model::ModelError> {
        let messages: Vec<String> = request.messages().map(|m| format!("{m:?}")).collect();
        self.seen.lock().unwrap().push(messages.join("\n"));
        self.inner.complete(request, deltas).await
    }
}

#[tokio::test]
async fn a_budget_top_up_never_reaches_the_model() {
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let model = std::sync::Arc::new(Recording {
        inner: ScriptedModel::parse(SCRIPT, "toml", "scripted:wire").unwrap(),
        seen: Default::default(),
    });
    let mut config = NodeConfig::new(data.path().join("data"), model.clone());
    config.budgets = vec![berth_runtime::budget::BudgetPolicy {
        label: Some("metered".into()),
        limits: berth_runtime::budget::BudgetLimits {
            max_tool_calls: Some(1),
            ..Default::default()
        },
    }];
    let node = Node::start(config).await.unwrap();
    let mut c = Client::connect(&node, ServeOptions::default());
    let r = c
        .call(
            "session/new",
            json!({"cwd": dir.path(), "mcpServers": [], "_meta": {"berth": {"labels": ["metered"]}}}),
        )
        .await;
    let sid = r["result"]["sessionId"].as_str().unwrap().to_owned();
    let answer = c.call_prompt(&sid, "budgeted").await;
    assert_eq!(
        answer["result"]["_meta"]["berth"]["terminal"]["kind"], "policy_budget",
        "{answer}"
    );
    let before = model.seen.lock().unwrap().len();
    let (r, mut notes) = c
        .exchange(
            "session/resume",
            json!({"sessionId": sid, "input": {"budget": {"max_tool_calls": 50}}}),
        )
        .await;
    assert!(
        r["result"]["_meta"]["berth"]["resumed"]["handle"].is_string(),
        "{r}"
    );
    while !notes.iter().any(|n| n["params"]["type"] == "turn_ended") {
        notes.push(c.read().await);
    }
    let seen = model.seen.lock().unwrap()[before..].to_vec();
    assert!(!seen.is_empty(), "the resumed turn called the model");
    for request in &seen {
        assert!(!request.contains("budget\""), "{request}");
        assert!(!request.contains("[resumed]"), "{request}");
        assert!(!request.contains("max_tool_calls"), "{request}");
    }
    // The transcript holds no trace of the top-up either.
    let view = c
        .call("berth.session_view.query", json!({"sessionId": sid}))
        .await;
    assert_eq!(view["result"]["run"]["status"], "idle", "{view}");
    let loaded = c
        .exchange("session/load", json!({"sessionId": sid}))
        .await
        .1;
    for note in loaded {
        if note["params"]["update"]["sessionUpdate"] == "user_message_chunk" {
            let text = note["params"]["update"]["content"]["text"]
                .as_str()
                .unwrap_or("");
            assert!(!text.contains("max_tool_calls"), "{note}");
        }
    }
}

#[tokio::test]
async fn an_observers_refused_controls_add_a_bounded_number_of_events() {
    use berth_actors::{Principal, Role};
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let sid = c.new_session(dir.path()).await;
    let mut observer = Client::connect_as(
        &node,
        Some(Principal::new("grafana", Role::Observer)),
        ServeOptions::default(),
    );
    let id = berth_runtime::ids::SessionId(sid.clone());
    let before = node.journal().last_event_id(&id).unwrap();
    for _ in 0..1000 {
        let r = observer
            .call("session/suspend", json!({"sessionId": sid}))
            .await;
        let (code, data) = error_of(&r);
        assert_eq!(code, -32011, "{r}");
        assert_eq!(data["reason"], "role_not_authorized", "{r}");
    }
    let added = node.journal().last_event_id(&id).unwrap() - before;
    assert!(
        (1..=2).contains(&added),
        "1000 refusals added {added} events to the session's log"
    );
    // The refusal that was journaled is an ordinary signed receipt.
    let mut reader = Client::connect(&node, ServeOptions::default());
    let (_, notes) = reader
        .exchange("session/load", json!({"sessionId": sid}))
        .await;
    let refused: Vec<Value> = receipts(&notes)
        .into_iter()
        .filter(|r| r["status"] == "rejected" && r["method"] == "session/suspend")
        .collect();
    assert_eq!(refused.len() as u64, added, "{refused:?}");
    assert_eq!(refused[0]["actor"], "grafana", "{refused:?}");
}

#[tokio::test]
async fn session_roots_in_pseudo_filesystems_or_at_slash_are_refused() {
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = node(data.path()).await;
    let mut c = Client::connect(&node, ServeOptions::default());
    let pid = std::process::id();
    let roots = [
        "/proc".to_owned(),
        "/proc/self".to_owned(),
        format!("/proc/{pid}"),
        format!("/proc/{pid}/cwd/.."),
        "/sys".to_owned(),
        "/sys/kernel".to_owned(),
        "/dev".to_owned(),
        "/dev/fd".to_owned(),
        "/".to_owned(),
    ];
    for root in &roots {
        if !std::path::Path::new(root).is_dir() {
            continue;
        }
        let r = c
            .call("session/new", json!({"cwd": root, "mcpServers": []}))
            .await;
        let (code, data) = error_of(&r);
        assert_eq!(code, -32602, "{root}: {r}");
        assert_eq!(data["field"], "cwd", "{root}: {r}");
        assert!(data["reason"].is_string(), "{root}: {r}");
        let r = c
            .call(
                "session/new",
                json!({"cwd": dir.path(), "additionalDirectories": [root], "mcpServers": []}),
            )
            .await;
        let (code, data) = error_of(&r);
        assert_eq!(code, -32602, "{root}: {r}");
        assert_eq!(data["field"], "additionalDirectories", "{root}: {r}");
    }
    // A symlink to /proc is refused as well.
    let link = dir.path().join("p");
    std::os::unix::fs::symlink("/proc", &link).unwrap();
    let r = c
        .call("session/new", json!({"cwd": link, "mcpServers": []}))
        .await;
    assert_eq!(error_of(&r).0, -32602, "{r}");
    // Nothing was created; an ordinary dir is still accepted.
    let list = c.call("session/list", json!({})).await;
    assert_eq!(list["result"]["sessions"], json!([]), "{list}");
    c.new_session(dir.path()).await;
}
