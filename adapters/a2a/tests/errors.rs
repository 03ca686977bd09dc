//! The A2A error surface over a real loopback listener: each A2A error code
//! with its `google.rpc.ErrorInfo` in `error.data`, the standard JSON-RPC
//! errors with a `data` object, `A2A-Version` negotiation, and that a refused
//! request changes nothing.

use std::sync::Arc;

use berth_a2a::{router, A2aOptions};
use berth_actors::{Node, NodeConfig};
use berth_runtime::model::scripted::ScriptedModel;
use serde_json::{json, Value};

const SCRIPT: &str = r#"
[[rules]]
match = "hello"
steps = [{ text = "Hello." }]
"#;

struct Server {
    url: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start() -> Server {
    start_as(None).await
}

/// A server whose every request carries `principal` (as the HTTP listener's
/// token layer sets it); `None`: the router alone (actor `a2a`, every right).
async fn start_as(principal: Option<berth_actors::Principal>) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::parse(SCRIPT, "toml", "scripted:errors").unwrap();
    let node = Node::start(NodeConfig::new(dir.path().join("data"), Arc::new(model)))
        .await
        .unwrap();
    let mut options = A2aOptions::new(dir.path().join("contexts"));
    options.max_body_bytes = 64 * 1024;
    let mut app = router(node, options);
    if let Some(principal) = principal {
        app = app.layer(axum::Extension(principal));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server {
        url,
        http: reqwest::Client::new(),
        _dir: dir,
        task,
    }
}

impl Server {
    async fn call_with(&self, method: &str, params: Value, version: Option<&str>) -> Value {
        let mut request = self.http.post(&self.url).json(&json!({
            "jsonrpc": "2.0", "id": 7, "method": method, "params": params,
        }));
        if let Some(v) = version {
            request = request.header("A2A-Version", v);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }

    async fn call(&self, method: &str, params: Value) -> Value {
        self.call_with(method, params, Some("1.0")).await
    }

    async fn send(&self, message: Value) -> Value {
        self.call("SendMessage", json!({"message": message})).await
    }
}

/// Asserts an A2A error: code, and an ErrorInfo with `reason` first in `data`.
#[track_caller]
fn assert_a2a(answer: &Value, code: i64, reason: &str) -> Value {
    let error = &answer["error"];
    assert_eq!(error["code"], code, "{answer}");
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    let info = &error["data"][0];
    assert_eq!(
        info["@type"], "type.googleapis.com/google.rpc.ErrorInfo",
        "{answer}"
    );
    assert_eq!(info["domain"], "a2a-protocol.org");
    assert_eq!(info["reason"], reason, "{answer}");
    assert!(info["metadata"]
        .as_object()
        .unwrap()
        .values()
        .all(Value::is_string));
    info["metadata"].clone()
}

fn user(text: &str, extra: Value) -> Value {
    let mut m =
        json!({"role": "ROLE_USER", "messageId": format!("m-{text}"), "parts": [{"text": text}]});
    m.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    m
}

#[tokio::test]
async fn a2a_errors_carry_their_codes_and_error_info() {
    let s = start().await;
    // -32001: unknown and malformed task ids.
    for id in ["turn_x.ctx_missing", "not-a-task-id"] {
        let meta = assert_a2a(
            &s.call("GetTask", json!({"id": id})).await,
            -32001,
            "TASK_NOT_FOUND",
        );
        assert_eq!(meta["taskId"], id);
        assert_a2a(
            &s.call("CancelTask", json!({"id": id})).await,
            -32001,
            "TASK_NOT_FOUND",
        );
        assert_a2a(
            &s.call("SubscribeToTask", json!({"id": id})).await,
            -32001,
            "TASK_NOT_FOUND",
        );
        assert_a2a(
            &s.send(user("hello", json!({"taskId": id}))).await,
            -32001,
            "TASK_NOT_FOUND",
        );
    }
    // A completed task: -32002 to cancel, -32004 to send and subscribe.
    let done = s.send(user("hello", json!({}))).await;
    let task = &done["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    let id = task["id"].as_str().unwrap();
    assert_a2a(
        &s.call("CancelTask", json!({"id": id})).await,
        -32002,
        "TASK_NOT_CANCELABLE",
    );
    let meta = assert_a2a(
        &s.send(user("again", json!({"taskId": id}))).await,
        -32004,
        "UNSUPPORTED_OPERATION",
    );
    assert_eq!(meta["berthReason"], "task_terminal");
    assert_a2a(
        &s.call("SubscribeToTask", json!({"id": id})).await,
        -32004,
        "UNSUPPORTED_OPERATION",
    );
    // -32003: every push-notification method.
    for method in [
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "DeleteTaskPushNotificationConfig",
    ] {
        assert_a2a(
            &s.call(method, json!({"taskId": id})).await,
            -32003,
            "PUSH_NOTIFICATION_NOT_SUPPORTED",
        );
    }
    let push = json!({"message": user("hello", json!({})), "configuration": {"taskPushNotificationConfig": {"url": "http://127.0.0.1:1/"}}});
    assert_a2a(
        &s.call("SendMessage", push).await,
        -32003,
        "PUSH_NOTIFICATION_NOT_SUPPORTED",
    );
    // -32004: no extended card.
    assert_a2a(
        &s.call("GetExtendedAgentCard", json!({})).await,
        -32004,
        "UNSUPPORTED_OPERATION",
    );
    // -32005: bytes that are not text, and a body that is not JSON.
    let binary = user(
        "x",
        json!({"parts": [{"raw": "//4A", "mediaType": "image/png"}]}),
    );
    assert_a2a(&s.send(binary).await, -32005, "CONTENT_TYPE_NOT_SUPPORTED");
    let response = s
        .http
        .post(&s.url)
        .header("content-type", "text/plain")
        .header("A2A-Version", "1.0")
        .body("{}")
        .send()
        .await
        .unwrap();
    let answer: Value = response.json().await.unwrap();
    assert_a2a(&answer, -32005, "CONTENT_TYPE_NOT_SUPPORTED");
}

#[tokio::test]
async fn the_version_header_is_negotiated() {
    let s = start().await;
    let params = json!({"id": "turn_x.ctx_none"});
    // Missing means 0.3 (spec §3.6.2), which berth does not serve.
    for version in [None, Some(""), Some("0.3"), Some("99.0"), Some("1.1")] {
        let answer = s.call_with("GetTask", params.clone(), version).await;
        let meta = assert_a2a(&answer, -32009, "VERSION_NOT_SUPPORTED");
        assert_eq!(meta["supportedVersions"], "1.0", "{version:?}");
    }
    // 1.0 (a patch number is ignored) reaches the method.
    for version in ["1.0", "1.0.1"] {
        let answer = s.call_with("GetTask", params.clone(), Some(version)).await;
        assert_eq!(answer["error"]["code"], -32001, "{answer}");
    }
    // …and so does the query parameter.
    let response = s
        .http
        .post(format!("{}?A2A-Version=1.0", s.url))
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": params}))
        .send()
        .await
        .unwrap();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], -32001, "{answer}");
    // 0.3 slash-style names are not aliases of the 1.0 methods.
    let answer = s.call("tasks/get", params).await;
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
    assert_eq!(answer["error"]["data"]["method"], "tasks/get");
}

#[tokio::test]
async fn standard_errors_name_what_was_wrong_and_change_nothing() {
    let s = start().await;
    let raw = |body: &'static str| {
        s.http
            .post(&s.url)
            .header("content-type", "application/json")
            .header("A2A-Version", "1.0")
            .body(body)
            .send()
    };
    let answer: Value = raw("{not json").await.unwrap().json().await.unwrap();
    assert_eq!(answer["error"]["code"], -32700);
    assert_eq!(answer["id"], Value::Null);
    let answer: Value = raw("[]").await.unwrap().json().await.unwrap();
    assert_eq!(answer["error"]["code"], -32600);
    let answer: Value = raw(r#"{"jsonrpc":"2.0","method":"GetTask"}"#)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["error"]["code"], -32600);
    let answer = s
        .call("GetTask", json!({"id": "turn_x.y", "historyLength": -1}))
        .await;
    assert_eq!(answer["error"]["code"], -32602);
    assert_eq!(answer["error"]["data"]["field"], "historyLength");
    let answer = s.call("ListTasks", json!({"pageSize": 150})).await;
    assert_eq!(answer["error"]["data"]["field"], "pageSize", "{answer}");
    let answer = s
        .call("ListTasks", json!({"status": "TASK_STATE_RUNNING"}))
        .await;
    assert_eq!(answer["error"]["data"]["field"], "status", "{answer}");
    let answer = s.call("Nope", json!({})).await;
    assert_eq!(answer["error"]["code"], -32601);
    // Refused sends create no context and no task.
    let bad = [
        user(
            "hello",
            json!({"contextId": "ctx-a", "parts": [{"text": "a", "url": "b"}]}),
        ),
        user("hello", json!({"contextId": "ctx-b", "role": "ROLE_AGENT"})),
        user("hello", json!({"contextId": "../escape"})),
        user("hello", json!({"contextId": "ctx-c", "parts": []})),
    ];
    for message in bad {
        let answer = s.send(message.clone()).await;
        assert_eq!(answer["error"]["code"], -32602, "{message} -> {answer}");
    }
    let listed = s.call("ListTasks", json!({})).await;
    assert_eq!(listed["result"]["totalSize"], 0, "{listed}");
    assert_eq!(listed["result"]["nextPageToken"], "");
    // An oversized body is refused whole.
    let big = "x".repeat(100 * 1024);
    let response = s
        .http
        .post(&s.url)
        .header("content-type", "application/json")
        .header("A2A-Version", "1.0")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["data"]["reason"], "body_too_large");
}

#[tokio::test]
async fn client_context_ids_name_sessions_and_tasks_are_listed_newest_first() {
    let s = start().await;
    let first = s
        .send(user("hello", json!({"contextId": "my-context"})))
        .await;
    assert_eq!(
        first["result"]["task"]["contextId"], "my-context",
        "{first}"
    );
    let second = s
        .send(json!({"role": "ROLE_USER", "messageId": "m2", "contextId": "my-context", "parts": [{"text": "hello"}]}))
        .await;
    let ids = [
        second["result"]["task"]["id"].as_str().unwrap().to_owned(),
        first["result"]["task"]["id"].as_str().unwrap().to_owned(),
    ];
    // A mismatching contextId for a task is refused.
    let answer = s
        .send(user(
            "hello",
            json!({"taskId": ids[0], "contextId": "other"}),
        ))
        .await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    let page = s
        .call(
            "ListTasks",
            json!({"contextId": "my-context", "pageSize": 1}),
        )
        .await;
    let result = &page["result"];
    assert_eq!(result["totalSize"], 2, "{page}");
    assert_eq!(result["tasks"][0]["id"], ids[0].as_str());
    assert!(result["tasks"][0].get("artifacts").is_none());
    let token = result["nextPageToken"].as_str().unwrap();
    assert!(!token.is_empty());
    let page = s
        .call(
            "ListTasks",
            json!({"contextId": "my-context", "pageSize": 1, "pageToken": token, "includeArtifacts": true}),
        )
        .await;
    assert_eq!(page["result"]["tasks"][0]["id"], ids[1].as_str(), "{page}");
    assert_eq!(page["result"]["nextPageToken"], "");
    assert_eq!(
        page["result"]["tasks"][0]["artifacts"][0]["parts"][0]["text"],
        "Hello."
    );
}

#[tokio::test]
async fn an_observer_reads_but_may_not_send_or_cancel() {
    use berth_actors::{Principal, Role};
    let s = start_as(Some(Principal::new("grafana", Role::Observer))).await;
    let msg = json!({"messageId": "m-obs", "role": "ROLE_USER", "parts": [{"text": "hello"}]});
    for (method, params) in [
        ("SendMessage", json!({"message": msg})),
        ("SendStreamingMessage", json!({"message": msg})),
        ("CancelTask", json!({"id": "t.sess_x"})),
    ] {
        let answer = s.call(method, params).await;
        assert_eq!(answer["error"]["code"], -32011, "{method}: {answer}");
        let data = &answer["error"]["data"];
        assert_eq!(data["reason"], "role_not_authorized", "{answer}");
        assert_eq!(data["actor"], "grafana");
        assert_eq!(data["requiredRole"], "controller");
    }
    // Reads are allowed, and nothing was created by the refused sends.
    let list = s.call("ListTasks", json!({})).await;
    assert!(list.get("error").is_none(), "{list}");
    assert_eq!(list["result"]["tasks"], json!([]), "{list}");
}
