//! The control socket (`<data dir>/berth.sock`) bounds what waits for a
//! client as the WebSocket transport does: a client that loads a large
//! session and never reads is disconnected once a write passes the send
//! deadline, its queue is freed, and the node goes on serving others.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use berth_acp::connection::LineBounds;
use berth_acp::transport::local::LocalSocket;
use berth_acp::ServeOptions;
use berth_actors::{Node, NodeConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Longest any awaited step may take before the test fails (not a speed
/// claim: a generous bound on waits that must end).
const BOUNDED: Duration = Duration::from_secs(30);

struct Client {
    read: BufReader<tokio::net::unix::OwnedReadHalf>,
    write: tokio::net::unix::OwnedWriteHalf,
}

impl Client {
    async fn connect(path: &std::path::Path) -> Self {
        let (read, write) = UnixStream::connect(path).await.unwrap().into_split();
        Self {
            read: BufReader::new(read),
            write,
        }
    }

    async fn send(&mut self, id: u64, method: &str, params: Value) {
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.write
            .write_all(format!("{frame}\n").as_bytes())
            .await
            .unwrap();
    }

    async fn call(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(id, method, params).await;
        tokio::time::timeout(BOUNDED, async {
            loop {
                let mut line = String::new();
                assert!(self.read.read_line(&mut line).await.unwrap() > 0, "EOF");
                let frame: Value = serde_json::from_str(&line).unwrap();
                if frame["id"] == json!(id) && frame.get("method").is_none() {
                    return frame;
                }
            }
        })
        .await
        .expect("no response")
    }
}

#[tokio::test]
async fn a_client_that_loads_and_never_reads_is_disconnected_and_its_queue_freed() {
    let dir = tempfile::tempdir().unwrap();
    // Sessions work outside the data dir (their roots may not contain it).
    let work = tempfile::tempdir().unwrap();
    let model = berth_runtime::model::from_spec("scripted").unwrap();
    let node = Node::start(NodeConfig::new(dir.path().join("data"), model))
        .await
        .unwrap();
    let path = dir.path().join("berth.sock");
    let mut socket = LocalSocket::bind(&path).unwrap();
    let queued = Arc::new(AtomicU64::new(0));
    let bounds = LineBounds {
        max_outbound_bytes: Some(64 * 1024 * 1024),
        send_timeout: Some(Duration::from_millis(500)),
        total_bytes: Some(Arc::clone(&queued)),
    };
    let serving = {
        let node = node.clone();
        tokio::spawn(async move {
            socket
                .serve_with(node, ServeOptions::default(), bounds)
                .await
        })
    };

    // A reading client writes a session of about 12 MB of events: more than
    // the socket's buffers hold.
    let mut writer = Client::connect(&path).await;
    let new = writer
        .call(
            1,
            "session/new",
            json!({"cwd": work.path(), "mcpServers": []}),
        )
        .await;
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let big = "x".repeat(300 * 1024);
    for i in 0..40u64 {
        let r = writer
            .call(
                10 + i,
                "session/prompt",
                json!({"sessionId": sid, "prompt": [{"type": "text", "text": big}]}),
            )
            .await;
        assert!(r["result"].is_object(), "{r}");
    }

    // A second client loads it all and never reads.
    let mut idle = Client::connect(&path).await;
    idle.send(
        1,
        "session/load",
        json!({"sessionId": sid, "cwd": work.path(), "mcpServers": []}),
    )
    .await;
    // Its replay is queued, then freed once a write passes the deadline
    // (bounded wait here).
    let freed = tokio::time::timeout(BOUNDED, async {
        while queued.load(Ordering::Acquire) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        while queued.load(Ordering::Acquire) != 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        freed.is_ok(),
        "the non-reading client's queue still holds {} bytes",
        queued.load(Ordering::Acquire)
    );
    // Reading now: what the socket held, then the end of the stream — never
    // the load's answer.
    let mut held = Vec::new();
    tokio::time::timeout(BOUNDED, idle.read.read_to_end(&mut held))
        .await
        .expect("the server did not close the non-reading client")
        .unwrap();
    let answered = held
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice::<Value>(line).ok())
        .any(|frame| frame["id"] == json!(1) && frame.get("result").is_some());
    assert!(!answered, "the cut-off client got its load answer");

    // The node and the other client are unaffected; a new client is served.
    let list = writer.call(99, "session/list", json!({})).await;
    assert!(list["result"].is_object(), "{list}");
    let mut fresh = Client::connect(&path).await;
    let list = fresh.call(1, "session/list", json!({})).await;
    assert!(list["result"].is_object(), "{list}");
    serving.abort();
}

/// stdio's bounds (an outbound bound, no send deadline): a parent that
/// pauses while it loads a session larger than the bound is not cut off —
/// the replay waits for it, the queue never holds more than the bound — and
/// when it reads again it gets the whole replay and the answer.
#[tokio::test]
async fn a_paused_stdio_parent_gets_a_replay_larger_than_the_bound_when_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    // Sessions work outside the data dir (their roots may not contain it).
    let work = tempfile::tempdir().unwrap();
    let model = berth_runtime::model::from_spec("scripted").unwrap();
    let node = Node::start(NodeConfig::new(dir.path().join("data"), model))
        .await
        .unwrap();
    let path = dir.path().join("berth.sock");
    let mut socket = LocalSocket::bind(&path).unwrap();
    let serving = {
        let node = node.clone();
        tokio::spawn(async move { socket.serve(node, ServeOptions::default()).await })
    };
    let mut writer = Client::connect(&path).await;
    let new = writer
        .call(
            1,
            "session/new",
            json!({"cwd": work.path(), "mcpServers": []}),
        )
        .await;
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let big = "x".repeat(300 * 1024);
    for i in 0..8u64 {
        let r = writer
            .call(
                10 + i,
                "session/prompt",
                json!({"sessionId": sid, "prompt": [{"type": "text", "text": big}]}),
            )
            .await;
        assert!(r["result"].is_object(), "{r}");
    }

    // The "parent": a pipe of 64 KiB, a 512 KiB bound, no deadline.
    const LIMIT: u64 = 512 * 1024;
    let (parent, berth_side) = tokio::io::duplex(64 * 1024);
    let (berth_read, berth_write) = tokio::io::split(berth_side);
    let queued = Arc::new(AtomicU64::new(0));
    let bounds = LineBounds {
        max_outbound_bytes: Some(LIMIT),
        send_timeout: None,
        total_bytes: Some(Arc::clone(&queued)),
    };
    let stdio = tokio::spawn(berth_acp::connection::serve_bounded(
        node.clone(),
        None,
        berth_read,
        berth_write,
        ServeOptions::default(),
        bounds,
        tokio_util::sync::CancellationToken::new(),
    ));
    let (parent_read, mut parent_write) = tokio::io::split(parent);
    let load = json!({"jsonrpc": "2.0", "id": 1, "method": "session/load",
        "params": {"sessionId": sid, "cwd": work.path(), "mcpServers": []}});
    parent_write
        .write_all(format!("{load}\n").as_bytes())
        .await
        .unwrap();
    // Paused: the replay fills the queue up to about half the bound and
    // waits there.
    tokio::time::timeout(BOUNDED, async {
        while queued.load(Ordering::Acquire) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("nothing was queued");
    assert!(queued.load(Ordering::Acquire) <= LIMIT);
    // Reading again: the whole replay, then the answer.
    let mut lines = BufReader::new(parent_read);
    let answer = tokio::time::timeout(BOUNDED, async {
        loop {
            let mut line = String::new();
            assert!(
                lines.read_line(&mut line).await.unwrap() > 0,
                "stdout ended"
            );
            let frame: Value = serde_json::from_str(&line).unwrap();
            if frame["id"] == json!(1) {
                return frame;
            }
        }
    })
    .await
    .expect("no load answer");
    let last = node.journal().last_event_id(&sid.as_str().into()).unwrap();
    assert_eq!(
        answer.pointer("/result/_meta/berth/lastEventId"),
        Some(&json!(last)),
        "{answer}"
    );
    drop(parent_write);
    drop(lines);
    let _ = tokio::time::timeout(BOUNDED, stdio).await;
    serving.abort();
}
