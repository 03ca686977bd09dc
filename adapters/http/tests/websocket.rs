//! ACP over WebSocket at the wire level, with a raw RFC 6455 client (so it
//! can send what a library refuses to: bad UTF-8, reserved bits, unmasked
//! frames, and never read): the close codes of protocol errors, and a client
//! that stops reading is closed within the send deadline with its queue
//! freed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use berth_acp::transport::websocket::{router, WsOptions, WsStats};
use berth_actors::{Node, NodeConfig, Principal, Role};
use berth_http::{ApiToken, HttpConfig, HttpServer};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "controller-token-0123456789";
const BOUNDED: Duration = Duration::from_secs(30);

struct Running {
    addr: String,
    stats: Arc<WsStats>,
    task: tokio::task::JoinHandle<()>,
    _node: Node,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(dir: &std::path::Path, tune: impl FnOnce(&mut WsOptions)) -> Running {
    let model = berth_runtime::model::from_spec("scripted").unwrap();
    let node = Node::start(NodeConfig::new(dir.join("data"), model))
        .await
        .unwrap();
    let mut config = HttpConfig::new("127.0.0.1:0".parse().unwrap());
    config.tokens = vec![ApiToken {
        token: TOKEN.into(),
        principal: Principal::new("alice", Role::Controller),
    }];
    let mut options = WsOptions::default();
    tune(&mut options);
    let stats = Arc::clone(&options.stats);
    let server = HttpServer::builder(node.clone(), config)
        .mount(router(node.clone(), options))
        .build()
        .unwrap()
        .bind()
        .await
        .unwrap();
    let addr = server.local_addr().to_string();
    let task = tokio::spawn(async move {
        server.serve(std::future::pending()).await.unwrap();
    });
    Running {
        addr,
        stats,
        task,
        _node: node,
    }
}

/// Opens `/acp` by hand; `recv_buffer` shrinks the client's socket buffer
/// (a client that stops reading then fills it at once).
async fn connect(addr: &str, recv_buffer: Option<u32>) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    if let Some(bytes) = recv_buffer {
        socket.set_recv_buffer_size(bytes).unwrap();
    }
    let mut stream = socket.connect(addr.parse().unwrap()).await.unwrap();
    let request = format!(
        "GET /acp HTTP/1.1\r\nhost: berth\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
         sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\
         authorization: Bearer {TOKEN}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream
}

/// A client frame: `first` is the FIN/RSV/opcode byte; masked unless
/// `masked` is false.
fn frame(first: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mut out = vec![first];
    let mask_bit = if masked { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(mask_bit | n as u8),
        n if n <= 0xffff => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if masked {
        let key = [0x11, 0x22, 0x33, 0x44];
        out.extend_from_slice(&key);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

fn text(payload: &[u8]) -> Vec<u8> {
    frame(0x81, payload, true)
}

/// Reads one server frame: (opcode, payload); `None` at EOF or reset.
async fn read_frame(stream: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await.ok()?;
    let len = match head[1] & 0x7f {
        126 => {
            let mut b = [0u8; 2];
            stream.read_exact(&mut b).await.ok()?;
            u64::from(u16::from_be_bytes(b))
        }
        127 => {
            let mut b = [0u8; 8];
            stream.read_exact(&mut b).await.ok()?;
            u64::from_be_bytes(b)
        }
        n => u64::from(n),
    };
    let mut payload = vec![0u8; len as usize];
    stream.read_exact(&mut payload).await.ok()?;
    Some((head[0] & 0x0f, payload))
}

/// Reads frames until the server's close frame: its code (`None`: the
/// connection ended without one).
async fn close_code(stream: &mut TcpStream) -> Option<u16> {
    tokio::time::timeout(BOUNDED, async {
        loop {
            match read_frame(stream).await? {
                (0x8, payload) if payload.len() >= 2 => {
                    return Some(u16::from_be_bytes([payload[0], payload[1]]))
                }
                (0x8, _) => return None,
                _ => {}
            }
        }
    })
    .await
    .expect("the server did not close the connection")
}

/// Reads text frames until the JSON-RPC response with `id`.
async fn response(stream: &mut TcpStream, id: u64) -> Value {
    tokio::time::timeout(BOUNDED, async {
        loop {
            let (opcode, payload) = read_frame(stream).await.expect("connection closed");
            if opcode != 0x1 {
                continue;
            }
            let v: Value = serde_json::from_slice(&payload).unwrap();
            if v["id"] == json!(id) {
                return v;
            }
        }
    })
    .await
    .expect("no response")
}

async fn call(stream: &mut TcpStream, id: u64, method: &str, params: Value) -> Value {
    let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    stream
        .write_all(&text(message.to_string().as_bytes()))
        .await
        .unwrap();
    response(stream, id).await
}

#[tokio::test]
async fn protocol_errors_close_with_their_codes() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), |o| o.acp.max_frame_bytes = 4096).await;
    // UTF-8 that is not JSON is valid payload: -32700, and the connection goes on.
    let mut c = connect(&server.addr, None).await;
    c.write_all(&text(b"hello")).await.unwrap();
    let (_, payload) = read_frame(&mut c).await.unwrap();
    let v: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(v["error"]["code"], -32700, "{v}");
    let list = call(&mut c, 1, "session/list", json!({})).await;
    assert!(list["result"].is_object(), "{list}");
    // A text message that is not UTF-8: 1007.
    c.write_all(&text(&[0x7b, 0xff, 0xfe, 0x7d])).await.unwrap();
    assert_eq!(close_code(&mut c).await, Some(1007));
    // Reserved bits set without an extension: 1002.
    let mut c = connect(&server.addr, None).await;
    c.write_all(&frame(0xC1, b"{}", true)).await.unwrap();
    assert_eq!(close_code(&mut c).await, Some(1002));
    // An unmasked client frame: 1002.
    let mut c = connect(&server.addr, None).await;
    c.write_all(&frame(0x81, b"{}", false)).await.unwrap();
    assert_eq!(close_code(&mut c).await, Some(1002));
    // An unknown opcode: 1002.
    let mut c = connect(&server.addr, None).await;
    c.write_all(&frame(0x83, b"{}", true)).await.unwrap();
    assert_eq!(close_code(&mut c).await, Some(1002));
    // Over the frame bound: 1009.
    let mut c = connect(&server.addr, None).await;
    c.write_all(&text(&vec![b' '; 8192])).await.unwrap();
    assert_eq!(close_code(&mut c).await, Some(1009));
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_and_its_queue_freed() {
    // The data dir lies outside every session root.
    let (dir, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let server = start(data.path(), |o| {
        o.send_timeout = Duration::from_millis(500);
        o.ping_interval = Duration::from_secs(600);
    })
    .await;
    // A reading client writes a session of about 12 MB of events: more than
    // the kernel's socket buffers hold.
    let mut writer = connect(&server.addr, None).await;
    let new = call(
        &mut writer,
        1,
        "session/new",
        json!({"cwd": dir.path(), "mcpServers": []}),
    )
    .await;
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let big = "x".repeat(300 * 1024);
    for i in 0..40u64 {
        let r = call(
            &mut writer,
            10 + i,
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": big}]}),
        )
        .await;
        assert!(r["result"].is_object(), "{r}");
    }
    // A second client loads it all and never reads.
    let mut idle = connect(&server.addr, Some(4096)).await;
    let load = json!({"jsonrpc": "2.0", "id": 1, "method": "session/load",
        "params": {"sessionId": sid, "cwd": dir.path(), "mcpServers": []}});
    idle.write_all(&text(load.to_string().as_bytes()))
        .await
        .unwrap();
    // The server closes it within the send deadline (bounded wait here),
    // and the frames it queued for it are freed.
    let closed = tokio::time::timeout(BOUNDED, async {
        while server.stats.connections.load(Ordering::Acquire) != 1
            || server.stats.outbound_bytes.load(Ordering::Acquire) != 0
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the non-reading client is still served: {} connections, {} bytes queued",
        server.stats.connections.load(Ordering::Acquire),
        server.stats.outbound_bytes.load(Ordering::Acquire)
    );
    // Reading now: what the socket held, then 1008 or the bare TCP close.
    let code = close_code(&mut idle).await;
    assert!(matches!(code, Some(1008) | None), "{code:?}");
    // The reading client is unaffected.
    let list = call(&mut writer, 99, "session/list", json!({})).await;
    assert!(list["result"].is_object(), "{list}");
}

/// A `session/load` replay larger than the connection's outbound bound is
/// streamed under it: a client that reads gets every replayed event and
/// then the answer listing them; one that does not read is still closed.
#[tokio::test]
async fn a_replay_larger_than_the_outbound_bound_loads_for_a_reading_client() {
    let dir = tempfile::tempdir().unwrap();
    // Sessions work outside the data dir (their roots may not contain it).
    let work = tempfile::tempdir().unwrap();
    let server = start(dir.path(), |o| {
        o.max_outbound_bytes = 1024 * 1024;
        o.send_timeout = Duration::from_millis(500);
        o.ping_interval = Duration::from_secs(600);
    })
    .await;
    // About 6 MB of events: six times the bound.
    let mut writer = connect(&server.addr, None).await;
    let new = call(
        &mut writer,
        1,
        "session/new",
        json!({"cwd": work.path(), "mcpServers": []}),
    )
    .await;
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let big = "x".repeat(300 * 1024);
    for i in 0..20u64 {
        let r = call(
            &mut writer,
            10 + i,
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": big}]}),
        )
        .await;
        assert!(r["result"].is_object(), "{r}");
    }
    let last = server
        ._node
        .journal()
        .last_event_id(&sid.as_str().into())
        .unwrap();

    // A reading client: every replayed notification, in order, then the
    // answer, on an open connection.
    let mut reader = connect(&server.addr, None).await;
    let load = json!({"jsonrpc": "2.0", "id": 1, "method": "session/load",
        "params": {"sessionId": sid, "cwd": work.path(), "mcpServers": []}});
    reader
        .write_all(&text(load.to_string().as_bytes()))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let answer = tokio::time::timeout(BOUNDED, async {
        loop {
            let (opcode, payload) = read_frame(&mut reader)
                .await
                .expect("the reading client was disconnected during the replay");
            assert_ne!(
                opcode,
                0x8,
                "closed: {:?}",
                &payload[..payload.len().min(2)]
            );
            if opcode != 0x1 {
                continue;
            }
            let v: Value = serde_json::from_slice(&payload).unwrap();
            if v["id"] == json!(1) {
                return v;
            }
            if let Some(id) = v
                .pointer("/params/_meta/berth/eventId")
                .and_then(Value::as_u64)
            {
                assert_eq!(
                    v.pointer("/params/_meta/berth/replayed"),
                    Some(&json!(true)),
                    "{v}"
                );
                if seen.last() != Some(&id) {
                    seen.push(id);
                }
            }
        }
    })
    .await
    .expect("no load answer");
    let replayed = answer
        .pointer("/result/_meta/berth/replayed")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{answer}"));
    let listed: Vec<u64> = replayed
        .iter()
        .map(|r| r["eventId"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, (1..=last).collect::<Vec<_>>());
    assert_eq!(
        answer.pointer("/result/_meta/berth/lastEventId"),
        Some(&json!(last))
    );
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert_eq!(seen.last(), Some(&last));
    // Live events follow on the same connection.
    let r = call(
        &mut writer,
        90,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "after"}]}),
    )
    .await;
    assert!(r["result"].is_object(), "{r}");
    let live = tokio::time::timeout(BOUNDED, async {
        loop {
            let (opcode, payload) = read_frame(&mut reader).await.expect("closed");
            if opcode != 0x1 {
                continue;
            }
            let v: Value = serde_json::from_slice(&payload).unwrap();
            if let Some(id) = v
                .pointer("/params/_meta/berth/eventId")
                .and_then(Value::as_u64)
            {
                return (id, v);
            }
        }
    })
    .await
    .expect("no live event");
    assert_eq!(live.0, last + 1, "{}", live.1);
    assert_ne!(
        live.1.pointer("/params/_meta/berth/replayed"),
        Some(&json!(true))
    );

    // A client that loads and never reads is still cut off.
    let mut idle = connect(&server.addr, Some(4096)).await;
    idle.write_all(&text(load.to_string().as_bytes()))
        .await
        .unwrap();
    let closed = tokio::time::timeout(BOUNDED, async {
        while server.stats.connections.load(Ordering::Acquire) != 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        while server.stats.connections.load(Ordering::Acquire) != 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(closed.is_ok(), "the non-reading client is still served");
    let code = close_code(&mut idle).await;
    assert!(matches!(code, Some(1008) | None), "{code:?}");
}
