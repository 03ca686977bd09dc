//! An A2A JSON-RPC body that repeats a key (at any depth) is refused whole
//! with -32600 naming the key and its path; nothing runs.

use std::sync::Arc;

use berth_a2a::{router, A2aOptions};
use berth_actors::{Node, NodeConfig};
use berth_runtime::model::scripted::ScriptedModel;
use serde_json::Value;

#[tokio::test]
async fn a_body_that_repeats_a_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::parse("", "toml", "scripted:dup").unwrap();
    let node = Node::start(NodeConfig::new(dir.path().join("data"), Arc::new(model)))
        .await
        .unwrap();
    let app = router(node, A2aOptions::new(dir.path().join("contexts")));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    let http = reqwest::Client::new();
    for (body, key, path) in [
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"ListTasks","method":"CancelTask","params":{"id":"t"}}"#,
            "method",
            "/method",
        ),
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","messageId":"m1","messageId":"m2","parts":[{"text":"hi"}]}}}"#,
            "messageId",
            "/params/message/messageId",
        ),
    ] {
        let answer: Value = http
            .post(&url)
            .header("content-type", "application/json")
            .header("A2A-Version", "1.0")
            .body(body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        assert_eq!(
            answer["error"]["data"]["reason"], "duplicate_key",
            "{answer}"
        );
        assert_eq!(answer["error"]["data"]["key"], key, "{answer}");
        assert_eq!(answer["error"]["data"]["path"], path, "{answer}");
    }
    // Nothing was sent: no task exists.
    let list: Value = http
        .post(&url)
        .header("A2A-Version", "1.0")
        .json(&serde_json::json!({"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["result"]["tasks"], serde_json::json!([]), "{list}");
    task.abort();
}
