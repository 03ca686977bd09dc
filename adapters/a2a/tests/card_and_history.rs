//! The agent card's HTTP caching (`Last-Modified` / `If-Modified-Since`,
//! beside `ETag` / `If-None-Match`; A2A spec §8.6.1) and that a task's
//! history shows the client's messages as sent — with
//! `message_ids_in_prompt` too, where the model reads a `[a2a messageId: …]`
//! header the history does not show.

use std::sync::Arc;

use berth_a2a::{router, A2aOptions};
use berth_actors::{Node, NodeConfig};
use berth_runtime::model::scripted::ScriptedModel;
use serde_json::{json, Value};

const SCRIPT: &str = r#"
resume_input_is_input = true

[[rules]]
regex = '\[a2a messageId: ask-'
steps = [
  { tool_call = { name = "await_resumption", arguments = { reason = "needs a detail" } } },
]

[[rules]]
regex = '\[a2a messageId: done-'
steps = [{ text = "Done." }]
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
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::parse(SCRIPT, "toml", "scripted:history").unwrap();
    let node = Node::start(NodeConfig::new(dir.path().join("data"), Arc::new(model)))
        .await
        .unwrap();
    let mut options = A2aOptions::new(dir.path().join("contexts"));
    options.message_ids_in_prompt = true;
    let app = router(node, options);
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

    async fn card(&self, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut request = self
            .http
            .get(format!("{}.well-known/agent-card.json", self.url));
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        request.send().await.unwrap()
    }
}

#[tokio::test]
async fn the_card_has_a_stable_last_modified_and_honours_if_modified_since() {
    let s = start().await;
    let first = s.card(&[]).await;
    assert_eq!(first.status(), 200);
    let modified = first
        .headers()
        .get("last-modified")
        .expect("the card carries Last-Modified")
        .to_str()
        .unwrap()
        .to_owned();
    // An HTTP date (IMF-fixdate, RFC 9110 §5.6.7), not in the future.
    let at = chrono::DateTime::parse_from_rfc2822(&modified).expect("an HTTP date");
    assert!(modified.ends_with(" GMT"), "{modified}");
    assert!(at <= chrono::Utc::now());
    let again = s.card(&[]).await;
    assert_eq!(
        again
            .headers()
            .get("last-modified")
            .unwrap()
            .to_str()
            .unwrap(),
        modified,
        "stable across requests"
    );
    // Not modified since then → 304 with the validators; since earlier → 200.
    let cached = s.card(&[("If-Modified-Since", &modified)]).await;
    assert_eq!(cached.status(), 304);
    assert!(cached.headers().get("etag").is_some());
    assert_eq!(cached.headers().get("last-modified").unwrap(), &modified);
    let earlier = (at - chrono::Duration::seconds(60))
        .with_timezone(&chrono::Utc)
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string();
    let stale = s.card(&[("If-Modified-Since", &earlier)]).await;
    assert_eq!(stale.status(), 200);
    assert!(stale.text().await.unwrap().contains("supportedInterfaces"));
    // A date that cannot be parsed is ignored (RFC 9110 §13.1.3).
    assert_eq!(
        s.card(&[("If-Modified-Since", "yesterday")]).await.status(),
        200
    );
    // If-None-Match decides when both are sent: a tag that does not match
    // is a 200 whatever the date says.
    let both = s
        .card(&[
            ("If-None-Match", "\"other\""),
            ("If-Modified-Since", &modified),
        ])
        .await;
    assert_eq!(both.status(), 200);
}

fn texts(message: &Value) -> Vec<String> {
    message["parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["text"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn history_shows_the_clients_messages_without_the_message_id_header() {
    let s = start().await;
    let first = s
        .call(
            "SendMessage",
            json!({"message": {"role": "ROLE_USER", "messageId": "ask-1", "parts": [{"text": "start here"}]}}),
        )
        .await;
    let task = &first["result"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{first}"
    );
    let task_id = task["id"].as_str().unwrap().to_owned();
    for (id, text) in [
        ("ask-2", "TCK history message 1"),
        ("ask-3", "TCK history message 2"),
    ] {
        let answer = s
            .call(
                "SendMessage",
                json!({"message": {"role": "ROLE_USER", "messageId": id, "taskId": task_id, "parts": [{"text": text}]}}),
            )
            .await;
        assert_eq!(
            answer["result"]["task"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "{answer}"
        );
    }
    let done = s
        .call(
            "SendMessage",
            json!({"message": {"role": "ROLE_USER", "messageId": "done-1", "taskId": task_id, "parts": [{"text": "finish"}]}}),
        )
        .await;
    assert_eq!(
        done["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{done}"
    );
    let got = s
        .call("GetTask", json!({"id": task_id, "historyLength": 10}))
        .await;
    let users: Vec<(String, Vec<String>)> = got["result"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "ROLE_USER")
        .map(|m| (m["messageId"].as_str().unwrap().to_owned(), texts(m)))
        .collect();
    let expect = |id: &str, text: &str| (id.to_owned(), vec![text.to_owned()]);
    assert_eq!(
        users,
        [
            expect("ask-1", "start here"),
            expect("ask-2", "TCK history message 1"),
            expect("ask-3", "TCK history message 2"),
            expect("done-1", "finish"),
        ],
        "{got}"
    );
}
