//! OpenTelemetry export, end to end: the real `berth serve` binary with its
//! OTLP exporter pointed at a real OTLP/HTTP receiver on loopback (axum,
//! decoding the official `opentelemetry-proto` messages, protobuf and JSON),
//! started by the test on an ephemeral port.
//!
//! Checked (`seeds/acp-session-suspend-rfc.md`, "OTel span pairing"; issue 6):
//! a `traceparent` in `_meta` parents the turn; model and tool spans carry the
//! GenAI semantic-convention attributes; the `suspend` span ends before the
//! `resume` span starts (and the parked turn's span ends too); the `resume`
//! span is a root whose links point at the suspension span and the turn span
//! (the ids the signed receipts carry); the resume input appears in no span;
//! and after a SIGKILL and a restart a resume still links back to the spans
//! of the process that died. Sessions recorded with export on (turn parks,
//! a `wait_for_completion` park, an idle park) pass `berth replay --verify`,
//! which exports nothing itself.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{serve_command, workspace, StdioServer as Server};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use prost::Message;
use serde_json::{json, Value};

const SCRIPT: &str = r#"
fallback = "noted: {input}"

[[rules]]
match = "traced work"
steps = [
  { text = "Working on it." },
  { tool_call = { name = "shell", arguments = { command = "while [ ! -e release ]; do sleep 0.02; done; echo A >> log", timeout_ms = 20000 } } },
  { usage = { input_tokens = 120, output_tokens = 40 } },
  { text = "Done." },
]

[[rules]]
match = "park until resumed"
steps = [
  { text = "Parking until someone resumes me." },
  { tool_call = { name = "await_resumption", arguments = { reason = "waiting for the operator", summary = "parked" } } },
  { text = "I was woken." },
]
"#;

/// Only in the resume input: it must never reach a span.
const SENTINEL: &str = "resume-input-sentinel-5c1e";
const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const PARENT: &str = "b7ad6b7169203331";

/// One exported span, flattened.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace: String,
    id: String,
    parent: String,
    kind: i32,
    /// OTLP status code: 0 unset, 1 ok, 2 error.
    status: i32,
    start: u64,
    end: u64,
    attrs: BTreeMap<String, Value>,
    links: Vec<Link>,
}

#[derive(Debug, Clone)]
struct Link {
    trace: String,
    id: String,
    attrs: BTreeMap<String, Value>,
}

impl Span {
    fn attr(&self, key: &str) -> &Value {
        self.attrs.get(key).unwrap_or(&Value::Null)
    }
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, Value> {
    kvs.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => json!(s),
                Some(any_value::Value::BoolValue(b)) => json!(b),
                Some(any_value::Value::IntValue(i)) => json!(i),
                Some(any_value::Value::DoubleValue(d)) => json!(d),
                other => json!(format!("{other:?}")),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the receiver got: flattened spans, every request as Debug text (to
/// search for what must not be there), decode failures.
#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    raw: Vec<String>,
    errors: Vec<String>,
    content_types: Vec<String>,
}

type Store = Arc<Mutex<Received>>;

async fn traces(State(store): State<Store>, headers: HeaderMap, body: Bytes) -> impl IntoResponse {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let json = content_type.starts_with("application/json");
    let decoded = if json {
        serde_json::from_slice::<ExportTraceServiceRequest>(&body).map_err(|e| e.to_string())
    } else {
        ExportTraceServiceRequest::decode(body.clone()).map_err(|e| e.to_string())
    };
    let mut store = store.lock().unwrap();
    store.content_types.push(content_type.clone());
    let request = match decoded {
        Ok(request) => request,
        Err(e) => {
            store.errors.push(e.clone());
            return (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, content_type)],
                e.into_bytes(),
            );
        }
    };
    store.raw.push(format!("{request:?}"));
    for resource in &request.resource_spans {
        for scope in &resource.scope_spans {
            for span in &scope.spans {
                store.spans.push(Span {
                    name: span.name.clone(),
                    trace: hex(&span.trace_id),
                    id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    kind: span.kind,
                    status: span.status.as_ref().map_or(0, |s| s.code),
                    start: span.start_time_unix_nano,
                    end: span.end_time_unix_nano,
                    attrs: attrs(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|l| Link {
                            trace: hex(&l.trace_id),
                            id: hex(&l.span_id),
                            attrs: attrs(&l.attributes),
                        })
                        .collect(),
                });
            }
        }
    }
    let body = if json {
        b"{}".to_vec()
    } else {
        ExportTraceServiceResponse::default().encode_to_vec()
    };
    (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], body)
}

/// An OTLP/HTTP trace receiver on 127.0.0.1:0, in its own thread and
/// runtime; stopped on drop.
struct Receiver {
    addr: SocketAddr,
    store: Store,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    fn start() -> Self {
        let store: Store = Arc::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = mpsc::channel();
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(traces))
            .with_state(Arc::clone(&store));
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        Self {
            addr: addr_rx.recv().unwrap(),
            store,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.store.lock().unwrap().spans.clone()
    }

    /// Waits (up to 30 s) until some exported span satisfies `pred`.
    fn wait_for(&self, what: &str, pred: impl Fn(&Span) -> bool) -> Span {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(span) = self.spans().into_iter().find(&pred) {
                return span;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} span exported within 30 s; got {:#?}",
                self.spans().iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `berth serve` exporting to `otel` (variable, value) pairs, with a short
/// batch delay so spans leave within milliseconds (and no `OTEL_*` from the
/// test's own environment).
fn start_server(data: &Path, script: &Path, otel: &[(&str, String)]) -> Server {
    let mut command = serve_command(data, script);
    for (name, _) in std::env::vars() {
        if name.starts_with("OTEL_") {
            command.env_remove(name);
        }
    }
    command
        .env("OTEL_BSP_SCHEDULE_DELAY", "20")
        .env("OTEL_SERVICE_NAME", "berth-under-test");
    for (name, value) in otel {
        command.env(name, value);
    }
    Server::start(command)
}

/// Closes stdin (berth stops and flushes its spans); it must exit cleanly.
fn stop(server: Server) {
    let status = server.stop();
    assert!(status.success(), "berth exited with {status}");
}

fn agent_event<'a>(frames: &'a [Value], kind: &str) -> Vec<&'a Value> {
    frames
        .iter()
        .filter(|f| f["method"] == "_berth/agentEvent" && f["params"]["type"] == kind)
        .map(|f| &f["params"]["event"])
        .collect()
}

fn link_kinds(span: &Span) -> Vec<(&str, &str, &str)> {
    span.links
        .iter()
        .map(|l| {
            (
                l.attrs
                    .get("berth.link.kind")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
                l.trace.as_str(),
                l.id.as_str(),
            )
        })
        .collect()
}

/// `berth replay SESSION --verify --json` on `data`, which must succeed: the
/// receipts a session signed while exporting spans (span ids in them) are
/// re-derived byte for byte. The replay runs with the OTLP variables set to
/// `receiver` and must export nothing: it installs no exporter (a replayed
/// run is not new work). The receiver is checked once the process exited,
/// after its shutdown would have flushed any span.
fn replay_verified(data: &Path, sid: &str, receiver: &Receiver) -> Value {
    let before = receiver.spans().len();
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["replay", sid, "--verify", "--json", "--data-dir"])
        .arg(data)
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{}", receiver.addr),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "20")
        .output()
        .expect("run berth replay");
    assert!(
        out.status.success(),
        "berth replay --verify failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON replay report");
    assert!(report["cutShort"].is_null(), "{report}");
    assert_eq!(
        receiver.spans().len(),
        before,
        "berth replay exported spans"
    );
    report
}

const SPAN_KIND_SERVER: i32 = 2;
const SPAN_KIND_CLIENT: i32 = 3;

#[test]
fn suspend_and_resume_spans_pair_up_and_genai_spans_are_exported() {
    let receiver = Receiver::start();
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let endpoint = format!("http://{}", receiver.addr);
    let mut server = start_server(&data, &script, &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)]);
    let sid = server.new_session(2, &cwd);
    server.send(
        3,
        "session/prompt",
        json!({
            "sessionId": sid,
            "prompt": [{"type": "text", "text": "traced work"}],
            "_meta": {"traceparent": format!("00-{TRACE}-{PARENT}-01"), "tracestate": "vendor=x"},
        }),
    );
    let mut frames = server.until_note(|n| n["params"]["update"]["sessionUpdate"] == "tool_call");
    let tool_call_id = frames.last().unwrap()["params"]["update"]["toolCallId"]
        .as_str()
        .unwrap()
        .to_owned();
    server.send(
        4,
        "session/suspend",
        json!({"sessionId": sid, "mode": "finish_step", "reason": "operator break"}),
    );
    frames.extend(server.until_note(|n| n["params"]["type"] == "suspend_requested"));
    std::fs::write(cwd.join("release"), "").unwrap();
    let (notes, prompt) = server.until(3);
    frames.extend(notes);
    assert_eq!(
        prompt["result"]["_meta"]["berth"]["terminal"]["kind"], "suspended",
        "{prompt}"
    );
    let (notes, suspended) = server.until(4);
    frames.extend(notes);
    let handle = suspended["result"]["handle"].as_str().unwrap().to_owned();
    server.send(
        5,
        "session/resume",
        json!({"sessionId": sid, "handle": handle, "input": {"secret": SENTINEL}}),
    );
    let (notes, resumed) = server.until(5);
    frames.extend(notes);
    assert!(resumed.get("result").is_some(), "{resumed}");
    frames.extend(server.until_note(|n| n["params"]["type"] == "turn_ended"));
    // A refused control: its request span is an error, with the code.
    server.send(
        6,
        "session/resume",
        json!({"sessionId": sid, "handle": handle, "input": {"again": true}}),
    );
    let (_, refused) = server.until(6);
    assert_eq!(refused["error"]["code"], -32009, "{refused}");
    // Stopping flushes what the batch processor still holds.
    stop(server);

    let spans = receiver.spans();
    {
        let received = receiver.store.lock().unwrap();
        assert!(received.errors.is_empty(), "{:?}", received.errors);
        assert!(received
            .content_types
            .iter()
            .all(|c| c == "application/x-protobuf"));
        // Never the input itself: not in any attribute, event, link or name.
        for raw in &received.raw {
            assert!(!raw.contains(SENTINEL), "the resume input leaked: {raw}");
            assert!(
                raw.contains("berth-under-test"),
                "OTEL_SERVICE_NAME names the service"
            );
        }
    }
    let find = |what: &str, pred: &dyn Fn(&Span) -> bool| -> Span {
        spans
            .iter()
            .find(|s| pred(s))
            .cloned()
            .unwrap_or_else(|| panic!("no {what} span among {spans:#?}"))
    };
    let refused = find("refused resume request", &|s| {
        s.name == "session/resume" && s.attr("rpc.jsonrpc.request_id") == &json!("6")
    });
    assert_eq!(refused.status, 2, "a refused request is an error span");
    assert_eq!(refused.attr("rpc.jsonrpc.error_code"), &json!(-32009));
    let accepted = find("resume request", &|s| {
        s.name == "session/resume" && s.attr("rpc.jsonrpc.request_id") == &json!("5")
    });
    assert_eq!(accepted.status, 0, "an answered request keeps status unset");

    // The suspension: its span ends before the resume span starts.
    let suspend = find("suspend", &|s| s.name == "suspend");
    assert_eq!(suspend.attr("berth.suspension.handle"), &json!(handle));
    assert_eq!(suspend.attr("berth.suspension.initiator"), "client");
    assert_eq!(suspend.attr("berth.suspension.reason"), "operator break");
    assert_eq!(suspend.attr("berth.suspension.has_conditions"), false);
    assert_eq!(suspend.attr("berth.session.id"), &json!(sid));
    let resume = find("resume", &|s| s.name == "resume");
    assert!(suspend.end <= resume.start, "{suspend:#?} {resume:#?}");

    // The turn the prompt started: a child of the request, which is a child of
    // the `traceparent` in `_meta`; it ended when it parked.
    let first_turn = find("first turn", &|s| s.name == "turn" && s.trace == TRACE);
    let request = find("prompt request", &|s| s.id == first_turn.parent);
    assert_eq!(request.name, "session/prompt");
    assert_eq!(request.kind, SPAN_KIND_SERVER);
    assert_eq!(request.parent, PARENT, "the traceparent parents the work");
    assert_eq!(request.attr("rpc.system"), "jsonrpc");
    assert_eq!(first_turn.attr("gen_ai.conversation.id"), &json!(sid));
    assert!(
        first_turn.end <= resume.start,
        "no span stays open across the pause"
    );
    assert_eq!(
        suspend.parent, first_turn.id,
        "suspend is a child of the turn"
    );
    assert_eq!(suspend.trace, TRACE);

    // The resume span: a new root, linking (not parented) to both.
    assert_eq!(resume.parent, "", "the resume span is a root");
    assert_ne!(resume.trace, TRACE, "a new trace");
    let links = link_kinds(&resume);
    assert!(
        links.contains(&("suspension", suspend.trace.as_str(), suspend.id.as_str())),
        "{links:?}"
    );
    assert!(
        links.contains(&("turn", first_turn.trace.as_str(), first_turn.id.as_str())),
        "{links:?}"
    );
    let resume_request = find("resume request", &|s| s.name == "session/resume");
    assert!(
        links.contains(&(
            "caller",
            resume_request.trace.as_str(),
            resume_request.id.as_str()
        )),
        "{links:?}"
    );
    assert_eq!(resume.attr("berth.suspension.handle"), &json!(handle));
    assert_eq!(resume.attr("berth.suspension.initiator"), "client");
    assert_eq!(resume.attr("berth.suspension.reason"), "operator break");
    assert_eq!(resume.attr("berth.suspension.has_conditions"), false);
    assert_eq!(resume.attr("berth.resume.continue_transcript"), true);
    assert_eq!(resume.attr("berth.resume.had_resume_input"), true);
    assert_eq!(resume.attr("berth.resume.cause"), "explicit_resume");
    // The continued turn runs under the resume span.
    let second_turn = find("resumed turn", &|s| {
        s.name == "turn" && s.parent == resume.id
    });
    assert_eq!(second_turn.attr("berth.turn.resumed"), true);
    assert_eq!(
        second_turn.attr("berth.turn.id"),
        first_turn.attr("berth.turn.id")
    );

    // The receipts carry the suspension span's id.
    let suspension_receipt = agent_event(&frames, "suspension_receipt");
    assert_eq!(suspension_receipt[0]["span_id"], json!(suspend.id));
    let resumption_receipt = agent_event(&frames, "resumption_receipt");
    assert_eq!(
        resumption_receipt[0]["suspension_span_id"],
        json!(suspend.id)
    );

    // GenAI semantic conventions: the model call and the tool call.
    let chat = find("chat", &|s| {
        s.attr("gen_ai.operation.name") == "chat" && s.parent == first_turn.id
    });
    assert_eq!(chat.name, format!("chat {}", script.display()));
    assert_eq!(chat.kind, SPAN_KIND_CLIENT);
    assert_eq!(chat.attr("gen_ai.provider.name"), "scripted");
    assert_eq!(
        chat.attr("gen_ai.request.model"),
        &json!(script.display().to_string())
    );
    assert_eq!(chat.attr("gen_ai.usage.input_tokens"), 120);
    assert_eq!(chat.attr("gen_ai.usage.output_tokens"), 40);
    assert_eq!(chat.attr("gen_ai.conversation.id"), &json!(sid));
    let tool = find("execute_tool", &|s| {
        s.attr("gen_ai.operation.name") == "execute_tool"
    });
    assert_eq!(tool.name, "execute_tool shell");
    assert_eq!(tool.parent, first_turn.id);
    assert_eq!(tool.attr("gen_ai.tool.name"), "shell");
    assert_eq!(tool.attr("gen_ai.tool.call.id"), &json!(tool_call_id));
    assert_eq!(tool.attr("berth.tool_call.outcome"), "completed");
    assert!(
        tool.end <= suspend.start,
        "the tool settled before the park"
    );
    assert!(
        spans
            .iter()
            .any(|s| s.attr("gen_ai.operation.name") == "chat" && s.parent == second_turn.id),
        "the resumed turn calls the model under its own span"
    );

    // Replay reproduces the receipts that carry the span ids.
    let report = replay_verified(&data, &sid, &receiver);
    assert_eq!(report["runs"].as_array().map(Vec::len), Some(2), "{report}");
    assert!(report["receipts"].as_u64().unwrap() >= 4, "{report}");
}

#[test]
fn a_resume_after_a_sigkill_restart_still_links_back() {
    let receiver = Receiver::start();
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let endpoint = format!("http://{}/v1/traces", receiver.addr);
    // The first process exports OTLP/JSON, the second protobuf.
    let mut server = start_server(
        &data,
        &script,
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint.clone()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json".into()),
        ],
    );
    let sid = server.new_session(2, &cwd);
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "park until resumed"}]}),
    );
    let (frames, prompt) = server.until(3);
    assert_eq!(
        prompt["result"]["_meta"]["berth"]["terminal"]["kind"], "suspended",
        "{prompt}"
    );
    let receipt = agent_event(&frames, "suspension_receipt")[0].clone();
    let span_id = receipt["span_id"].as_str().expect("a span id").to_owned();
    // The suspend span reaches the receiver (batch delay 20 ms), then berth
    // dies without a chance to flush anything else.
    let suspend = receiver.wait_for("suspend", |s| s.name == "suspend");
    assert_eq!(suspend.id, span_id);
    assert_eq!(suspend.attr("berth.suspension.initiator"), "agent");
    assert_eq!(
        suspend.attr("berth.suspension.reason"),
        "waiting for the operator"
    );
    let turn = receiver.wait_for("turn", |s| s.name == "turn");
    assert_eq!(suspend.parent, turn.id);
    assert!(receiver
        .store
        .lock()
        .unwrap()
        .content_types
        .iter()
        .all(|c| c == "application/json"));
    drop(server);

    let mut server = start_server(
        &data,
        &script,
        &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)],
    );
    server.send(
        2,
        "session/resume",
        json!({"sessionId": sid, "input": {"secret": SENTINEL}}),
    );
    let (mut frames, resumed) = server.until(2);
    assert!(resumed.get("result").is_some(), "{resumed}");
    frames.extend(server.until_note(|n| n["params"]["type"] == "turn_ended"));
    let resumption = agent_event(&frames, "resumption_receipt")[0].clone();
    assert_eq!(resumption["suspension_span_id"], json!(span_id));
    stop(server);

    let resume = receiver.wait_for("resume", |s| s.name == "resume");
    assert_eq!(resume.parent, "");
    let links = link_kinds(&resume);
    assert!(
        links.contains(&("suspension", suspend.trace.as_str(), suspend.id.as_str())),
        "{links:?}"
    );
    assert!(
        links.contains(&("turn", turn.trace.as_str(), turn.id.as_str())),
        "{links:?}"
    );
    assert_eq!(resume.attr("berth.suspension.initiator"), "agent");
    assert_eq!(resume.attr("berth.resume.had_resume_input"), true);
    assert!(suspend.end <= resume.start);
    let received = receiver.store.lock().unwrap();
    assert!(received.errors.is_empty(), "{:?}", received.errors);
    for raw in &received.raw {
        assert!(!raw.contains(SENTINEL), "the resume input leaked: {raw}");
    }
    drop(received);

    // The park and the resume happened in two processes; replay still
    // reproduces both receipts with the span id the first one signed.
    let report = replay_verified(&data, &sid, &receiver);
    assert_eq!(report["runs"].as_array().map(Vec::len), Some(2), "{report}");
}

#[test]
fn sessions_recorded_with_export_on_replay_byte_for_byte() {
    let receiver = Receiver::start();
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let endpoint = format!("http://{}", receiver.addr);
    let mut server = start_server(&data, &script, &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)]);
    let sid = server.new_session(2, &cwd);

    // A turn that finishes, then parks (`wait_for_completion`: the park is
    // journaled with the turn's end).
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "traced work"}]}),
    );
    let mut frames = server.until_note(|n| n["params"]["update"]["sessionUpdate"] == "tool_call");
    server.send(
        4,
        "session/suspend",
        json!({"sessionId": sid, "mode": "wait_for_completion", "reason": "after this turn"}),
    );
    frames.extend(server.until_note(|n| n["params"]["type"] == "suspend_requested"));
    std::fs::write(cwd.join("release"), "").unwrap();
    let (notes, prompt) = server.until(3);
    frames.extend(notes);
    assert!(prompt.get("result").is_some(), "{prompt}");
    let (notes, suspended) = server.until(4);
    frames.extend(notes);
    let first = suspended["result"]["handle"].as_str().unwrap().to_owned();
    // Resumed with input: a fresh turn.
    server.send(
        5,
        "session/resume",
        json!({"sessionId": sid, "handle": first, "input": {"secret": SENTINEL}}),
    );
    let (notes, resumed) = server.until(5);
    frames.extend(notes);
    assert!(resumed.get("result").is_some(), "{resumed}");
    frames.extend(server.until_note(|n| n["params"]["type"] == "turn_ended"));

    // An idle session parks at once, and wakes without input.
    server.send(
        6,
        "session/suspend",
        json!({"sessionId": sid, "reason": "idle break"}),
    );
    let (notes, suspended) = server.until(6);
    frames.extend(notes);
    let second = suspended["result"]["handle"].as_str().unwrap().to_owned();
    server.send(
        7,
        "session/resume",
        json!({"sessionId": sid, "handle": second}),
    );
    let (notes, resumed) = server.until(7);
    frames.extend(notes);
    assert!(resumed.get("result").is_some(), "{resumed}");
    stop(server);

    // Both parks signed the id of their exported `suspend` span, and each
    // resume names it.
    let parks = agent_event(&frames, "suspension_receipt");
    let wakes = agent_event(&frames, "resumption_receipt");
    assert_eq!((parks.len(), wakes.len()), (2, 2), "{frames:#?}");
    for (handle, park, wake) in [(&first, parks[0], wakes[0]), (&second, parks[1], wakes[1])] {
        assert_eq!(park["handle"], json!(handle));
        let span_id = park["span_id"].as_str().expect("export on: a span id");
        let suspend = receiver.wait_for("suspend", |s| {
            s.name == "suspend" && s.attr("berth.suspension.handle") == &json!(handle)
        });
        assert_eq!(suspend.id, span_id);
        assert_eq!(wake["suspension_span_id"], json!(span_id));
    }

    let report = replay_verified(&data, &sid, &receiver);
    assert_eq!(report["runs"].as_array().map(Vec::len), Some(2), "{report}");
    assert!(report["receipts"].as_u64().unwrap() >= 6, "{report}");
}

/// An A2A request carries its W3C `traceparent` HTTP header into its work:
/// the `a2a.request` span is that remote span's child, and the turn the
/// message starts is in the same trace under it; a refused request's span
/// is an error.
#[test]
fn an_a2a_request_joins_the_callers_trace() {
    use std::io::{BufRead, BufReader, Read, Write};
    let receiver = Receiver::start();
    let (_dir, data, _cwd, script) = workspace(SCRIPT);
    const TOKEN: &str = "a2a-trace-token-0123456789";
    let mut command = serve_command(&data, &script);
    for (name, _) in std::env::vars() {
        if name.starts_with("OTEL_") {
            command.env_remove(name);
        }
    }
    let mut child = command
        .args(["--listen", "127.0.0.1:0"])
        .env("BERTH_API_KEYS", format!("{TOKEN}=alice:controller"))
        .env("OTEL_BSP_SCHEDULE_DELAY", "20")
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{}", receiver.addr),
        )
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn berth serve");
    let stderr = child.stderr.take().expect("stderr");
    let (addr_tx, addr_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("berth: listening on http://") {
                let _ = addr_tx.send(addr.trim().to_owned());
            }
        }
    });
    let addr = addr_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("berth serve announces its listener");
    let post = |body: &Value, traceparent: &str| -> Value {
        let body = body.to_string();
        let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
        write!(
            stream,
            "POST / HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nA2A-Version: 1.0\r\ntraceparent: {traceparent}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read");
        let (_, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {response}"))
    };
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    let sent = post(
        &json!({"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"message": {
            "role": "ROLE_USER", "messageId": "m-1", "parts": [{"text": "hello"}]}}}),
        &traceparent,
    );
    assert!(sent.get("result").is_some(), "{sent}");
    let request = receiver.wait_for("a2a.request", |s| {
        s.name == "SendMessage" && s.attr("rpc.service") == "a2a"
    });
    assert_eq!(request.trace, TRACE, "the caller's trace");
    assert_eq!(request.parent, PARENT, "the caller's span is the parent");
    assert_eq!(request.attr("rpc.jsonrpc.request_id"), "7");
    let turn = receiver.wait_for("turn", |s| s.name == "turn" && s.trace == TRACE);
    assert_ne!(turn.parent, "", "the turn is under the request, not a root");
    // A refused request (unknown task) is an error span, in its own trace
    // when the header is not valid W3C.
    let refused = post(
        &json!({"jsonrpc": "2.0", "id": 8, "method": "GetTask", "params": {"id": "nope"}}),
        "not-a-traceparent",
    );
    assert!(refused.get("error").is_some(), "{refused}");
    let failed = receiver.wait_for("refused a2a.request", |s| {
        s.name == "GetTask" && s.attr("rpc.service") == "a2a"
    });
    assert_eq!(failed.status, 2, "{failed:?}");
    assert_ne!(failed.trace, TRACE);
    assert_eq!(failed.parent, "");
    // With a listener, berth serves on after stdin closes; SIGTERM stops it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("a pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM berth");
    let status = child.wait().expect("wait for berth");
    assert!(status.success(), "{status}");
}
