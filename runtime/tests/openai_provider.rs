//! The `openai` provider against a fake OpenAI-compatible server on loopback.
//!
//! The fake server is a bare `TcpListener` that reads one HTTP/1.1 request,
//! hands it to the test, and writes a hand-made response: a chunked
//! `text/event-stream` whose pieces split lines (and a UTF-8 character) at
//! awkward places, or an error status.

use std::time::Duration;

use berth_runtime::history::{Message, ToolCallRequest};
use berth_runtime::model::openai::{OpenAiConfig, OpenAiModel};
use berth_runtime::model::{
    ModelDelta, ModelError, ModelProvider, ModelRequest, ModelResponse, ModelStop, ToolSpec, Usage,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// What the fake server received.
#[derive(Debug)]
struct Received {
    /// Request line, e.g. `POST /v1/chat/completions HTTP/1.1`.
    request_line: String,
    /// Header names lowercased, values trimmed.
    headers: Vec<(String, String)>,
    body: Value,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// How the fake server answers.
enum Reply {
    /// 200 with a chunked event stream, one HTTP chunk per piece.
    Stream(Vec<Vec<u8>>),
    /// A status with a body.
    Status(u16, String),
    /// 200 with a first piece, then nothing until the client goes away;
    /// reports on the channel once it sees the connection closed.
    StreamThenWait(String, oneshot::Sender<()>),
}

/// Serves one request on an ephemeral loopback port; returns the base URL
/// (`http://127.0.0.1:PORT/v1/`, trailing slash on purpose) and what the
/// server will have received.
async fn serve_once(reply: Reply) -> (String, oneshot::Receiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1/", listener.local_addr().unwrap());
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let received = read_request(&mut socket).await;
        let _ = tx.send(received);
        match reply {
            Reply::Stream(pieces) => {
                write_stream_head(&mut socket).await;
                for piece in pieces {
                    write_chunk(&mut socket, &piece).await;
                }
                let _ = socket.write_all(b"0\r\n\r\n").await;
            }
            Reply::Status(status, body) => {
                let head = format!(
                    "HTTP/1.1 {status} Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(body.as_bytes()).await;
            }
            Reply::StreamThenWait(first, closed) => {
                write_stream_head(&mut socket).await;
                write_chunk(&mut socket, first.as_bytes()).await;
                let mut buf = [0u8; 1024];
                // Returns 0 (or fails) once the client dropped the connection.
                while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
                let _ = closed.send(());
            }
        }
        let _ = socket.shutdown().await;
    });
    (base, rx)
}

async fn read_request(socket: &mut TcpStream) -> Received {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = socket.read(&mut chunk).await.unwrap();
        assert!(n > 0, "client closed before sending a request");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .expect("request has a Content-Length")
        .1
        .parse()
        .unwrap();
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = socket.read(&mut chunk).await.unwrap();
        assert!(n > 0, "client closed mid-body");
        body.extend_from_slice(&chunk[..n]);
    }
    Received {
        request_line,
        headers,
        body: serde_json::from_slice(&body).unwrap(),
    }
}

async fn write_stream_head(socket: &mut TcpStream) {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    socket.write_all(head.as_bytes()).await.unwrap();
}

async fn write_chunk(socket: &mut TcpStream, bytes: &[u8]) {
    let mut out = format!("{:x}\r\n", bytes.len()).into_bytes();
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
    // The client may already be gone (error tests); that is fine.
    let _ = socket.write_all(&out).await;
    let _ = socket.flush().await;
}

fn model(base_url: &str, api_key: Option<&str>) -> OpenAiModel {
    model_with_timeout(base_url, api_key, 10_000)
}

fn model_with_timeout(base_url: &str, api_key: Option<&str>, timeout_ms: u64) -> OpenAiModel {
    OpenAiModel::new(OpenAiConfig {
        base_url: base_url.to_owned(),
        api_key: api_key.map(str::to_owned),
        model: "test-model".into(),
        request_timeout_ms: timeout_ms,
    })
    .unwrap()
}

fn request(messages: Vec<Message>, tools: Vec<ToolSpec>) -> ModelRequest {
    ModelRequest {
        session_id: "sess_1".into(),
        turn_id: "turn_1".into(),
        iteration: 0,
        cwd: "/tmp".into(),
        history: std::sync::Arc::new(messages),
        history_fingerprint: String::new(),
        turn_messages: vec![],
        tools: tools.into(),
    }
}

fn user(text: &str) -> Vec<Message> {
    vec![Message::User { text: text.into() }]
}

/// Runs one call; returns its result and every delta it sent, in order.
async fn call(
    model: &OpenAiModel,
    request: &ModelRequest,
) -> (Result<ModelResponse, ModelError>, Vec<ModelDelta>) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let result = model.complete(request, tx).await;
    let mut deltas = Vec::new();
    while let Some(delta) = rx.recv().await {
        deltas.push(delta);
    }
    (result, deltas)
}

fn data(chunk: Value) -> String {
    format!("data: {chunk}\n\n")
}

fn pieces(pieces: &[String]) -> Vec<Vec<u8>> {
    pieces.iter().map(|p| p.clone().into_bytes()).collect()
}

#[tokio::test]
async fn text_deltas_stream_in_order_and_usage_is_read() {
    let body = [
        ": OPENROUTER PROCESSING\r\n\r\n".to_owned(),
        data(json!({"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null})),
        data(json!({"choices":[{"index":0,"delta":{"reasoning_content":"thinking"}}]})),
        data(json!({"choices":[{"index":0,"delta":{"content":"Hel"}}]})),
        data(json!({"choices":[{"index":0,"delta":{"content":"lo, "}}]})),
        data(json!({"choices":[{"index":0,"delta":{"content":"wörld"}}]})),
        data(json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})),
        data(json!({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}})),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    // Cut the body into pieces that split lines, a `\r\n` and the two bytes
    // of `ö`.
    let bytes = body.as_bytes();
    let o = body.find('ö').unwrap() + 1;
    let mut cuts = vec![
        0,
        10,
        25,
        26,
        80,
        150,
        o,
        o + 7,
        bytes.len() - 3,
        bytes.len(),
    ];
    cuts.sort_unstable();
    cuts.dedup();
    let pieces = cuts
        .windows(2)
        .map(|w| bytes[w[0]..w[1]].to_vec())
        .collect();
    let (base, received) = serve_once(Reply::Stream(pieces)).await;

    let (result, deltas) = call(&model(&base, None), &request(user("hi"), vec![])).await;
    let response = result.unwrap();

    assert_eq!(
        deltas,
        [
            ModelDelta::Thought("thinking".into()),
            ModelDelta::Text("Hel".into()),
            ModelDelta::Text("lo, ".into()),
            ModelDelta::Text("wörld".into()),
        ]
    );
    assert_eq!(response.text, "Hello, wörld");
    assert_eq!(response.stop, ModelStop::EndTurn);
    assert!(response.tool_calls.is_empty());
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 12,
            output_tokens: 5
        }
    );
    let received = received.await.unwrap();
    assert_eq!(received.request_line, "POST /v1/chat/completions HTTP/1.1");
    assert_eq!(
        received.header("authorization"),
        None,
        "no key, no Authorization header"
    );
}

#[tokio::test]
async fn a_tool_call_split_across_chunks_is_reassembled() {
    let pieces = pieces(&[
        data(
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[
            {"index":0,"id":"call_abc","type":"function","function":{"name":"shell","arguments":""}}]}}]}),
        ),
        data(
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"comm"}}]}}]}),
        ),
        data(
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"and\": \"ls"}}]}}]}),
        ),
        data(
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" -la\"}"}}]}}]}),
        ),
        data(json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})),
        data(json!({"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":9}})),
        "data: [DONE]\n\n".to_owned(),
    ]);
    let (base, received) = serve_once(Reply::Stream(pieces)).await;
    let transcript = vec![
        Message::User {
            text: "list files".into(),
        },
        Message::Assistant {
            text: "Looking.".into(),
            tool_calls: vec![ToolCallRequest {
                id: "call_prev".into(),
                name: "read_file".into(),
                arguments: json!({"path": "/tmp/a.txt"}),
            }],
        },
        Message::Tool {
            tool_call_id: "call_prev".into(),
            content: "no such file".into(),
            is_error: true,
        },
    ];
    let tools = vec![ToolSpec {
        name: "shell".into(),
        description: "Runs a shell command.".into(),
        parameters: json!({"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}),
    }];

    let (result, deltas) = call(
        &model(&base, Some("sk-test")),
        &request(transcript, tools.clone()),
    )
    .await;
    let response = result.unwrap();

    assert!(deltas.is_empty(), "{deltas:?}");
    assert_eq!(response.text, "");
    assert_eq!(response.stop, ModelStop::ToolUse);
    assert_eq!(
        response.tool_calls,
        [ToolCallRequest {
            id: "call_abc".into(),
            name: "shell".into(),
            arguments: json!({"command": "ls -la"}),
        }]
    );
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 40,
            output_tokens: 9
        }
    );

    let received = received.await.unwrap();
    assert_eq!(received.header("authorization"), Some("Bearer sk-test"));
    assert!(received
        .header("content-type")
        .is_some_and(|v| v.starts_with("application/json")));
    assert_eq!(
        received.body,
        json!({
            "model": "test-model",
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": "Looking.", "tool_calls": [
                    {"id": "call_prev", "type": "function",
                     "function": {"name": "read_file", "arguments": "{\"path\":\"/tmp/a.txt\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_prev", "content": "no such file"},
            ],
            "tools": [{"type": "function", "function": {
                "name": "shell",
                "description": "Runs a shell command.",
                "parameters": tools[0].parameters,
            }}],
        })
    );
}

#[tokio::test]
async fn no_tools_means_no_tools_field() {
    let pieces = pieces(&[
        data(json!({"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]})),
        "data: [DONE]\n\n".to_owned(),
    ]);
    let (base, received) = serve_once(Reply::Stream(pieces)).await;
    let (result, _) = call(&model(&base, None), &request(user("hi"), vec![])).await;
    assert_eq!(result.unwrap().usage, Usage::default(), "no usage chunk");
    let body = received.await.unwrap().body;
    assert!(body.get("tools").is_none(), "{body}");
    assert_eq!(body["messages"], json!([{"role": "user", "content": "hi"}]));
}

#[tokio::test]
async fn http_401_is_a_status_error_with_the_body() {
    let body = r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#;
    let (base, _received) = serve_once(Reply::Status(401, body.to_owned())).await;
    let (result, deltas) = call(&model(&base, Some("bad")), &request(user("hi"), vec![])).await;
    match result {
        Err(ModelError::Status { status, body: got }) => {
            assert_eq!(status, 401);
            assert_eq!(got, body);
        }
        other => panic!("expected HTTP 401, got {other:?}"),
    }
    assert!(deltas.is_empty());
}

#[tokio::test]
async fn a_large_error_body_is_truncated_to_2_kib() {
    let (base, _received) = serve_once(Reply::Status(500, "x".repeat(100_000))).await;
    let (result, _) = call(&model(&base, None), &request(user("hi"), vec![])).await;
    match result {
        Err(ModelError::Status { status: 500, body }) => assert_eq!(body.len(), 2048),
        other => panic!("expected HTTP 500, got {other:?}"),
    }
}

#[tokio::test]
async fn malformed_json_in_a_data_line_is_a_protocol_error() {
    let pieces = pieces(&[
        data(json!({"choices":[{"index":0,"delta":{"content":"fine so far"}}]})),
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"oops\"}\n\n".to_owned(),
        "data: [DONE]\n\n".to_owned(),
    ]);
    let (base, _received) = serve_once(Reply::Stream(pieces)).await;
    let (result, deltas) = call(&model(&base, None), &request(user("hi"), vec![])).await;
    assert!(matches!(result, Err(ModelError::Protocol(_))), "{result:?}");
    assert_eq!(deltas, [ModelDelta::Text("fine so far".into())]);
}

#[tokio::test]
async fn connection_refused_is_a_transport_error() {
    // Bind then drop, so nothing listens on the port.
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().port()
    };
    let base = format!("http://127.0.0.1:{port}/v1");
    let (result, _) = call(&model(&base, None), &request(user("hi"), vec![])).await;
    match result {
        Err(ModelError::Transport(message)) => assert!(message.contains(&base), "{message}"),
        other => panic!("expected a transport error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_stalled_stream_times_out_as_a_transport_error() {
    let (closed_tx, _closed_rx) = oneshot::channel();
    let first = data(json!({"choices":[{"index":0,"delta":{"content":"a"}}]}));
    let (base, _received) = serve_once(Reply::StreamThenWait(first, closed_tx)).await;
    let model = model_with_timeout(&base, None, 200);
    let (result, deltas) = call(&model, &request(user("hi"), vec![])).await;
    assert!(
        matches!(&result, Err(ModelError::Transport(m)) if m.contains("200 ms")),
        "{result:?}"
    );
    assert_eq!(deltas, [ModelDelta::Text("a".into())]);
}

#[tokio::test]
async fn dropping_the_call_closes_the_connection() {
    let (closed_tx, closed_rx) = oneshot::channel();
    let first = data(json!({"choices":[{"index":0,"delta":{"content":"partial"}}]}));
    let (base, _received) = serve_once(Reply::StreamThenWait(first, closed_tx)).await;
    let model = model(&base, None);
    let request = request(user("hi"), vec![]);
    let (tx, mut rx) = mpsc::unbounded_channel();
    {
        let call = model.complete(&request, tx);
        tokio::pin!(call);
        // Drive the call until the first delta arrives, then drop it (what the
        // engine does on cancel).
        tokio::select! {
            result = &mut call => panic!("the call ended early: {result:?}"),
            delta = rx.recv() => assert_eq!(delta, Some(ModelDelta::Text("partial".into()))),
        }
    }
    tokio::time::timeout(Duration::from_secs(10), closed_rx)
        .await
        .expect("the server saw the connection closed")
        .unwrap();
}
