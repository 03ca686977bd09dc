//! `berth replay` through the real binary: a session steered and self-parked
//! over stdio, the server stopped, then `berth replay SESSION --verify
//! --json` → every run reproduced (exit 0); the journaled resume input
//! edited in the redb file → `berth replay` exits 3 naming the resumption
//! receipt whose input hash check failed, `--verify` exits 2.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use redb::{ReadableTable, TableDefinition};
use serde_json::{json, Value};

const SCRIPT: &str = r#"
[[rules]]
match = "park yourself"
steps = [
  { thought = "I need a window first." },
  { text = "Checking first." },
  { tool_call = { name = "shell", arguments = { command = "while [ ! -e release ]; do sleep 0.01; done; echo checked" , timeout_ms = 20000 } } },
  { text = "Checked." },
]

# The steer is what the model answers next: it parks itself.
[[rules]]
match = "smaller"
steps = [
  { text = "Taking the smaller path; parking until a window." },
  { tool_call = { name = "await_resumption", arguments = { reason = "need the deploy window" } } },
  { text = "Resumed with: {last_tool_result}" },
]
"#;

const ENV_KEYS: &str = "BERTH_RECEIPT_KEYS";

struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    frames: mpsc::Receiver<Value>,
}

impl Server {
    fn start(data: &Path, script: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["serve", "--data-dir"])
            .arg(data)
            .arg("--model")
            .arg(format!("scripted:{}", script.display()))
            .env_remove(ENV_KEYS)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn berth");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, frames) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line).expect("stdout carries JSON frames");
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let mut server = Self {
            child,
            stdin,
            frames,
        };
        server.send(1, "initialize", json!({"protocolVersion": 1}));
        server.until(|f| f["id"] == 1);
        server
    }

    fn send(&mut self, id: u64, method: &str, params: Value) {
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{frame}").unwrap();
        stdin.flush().unwrap();
    }

    /// Frames until one `pred` accepts (returned).
    fn until(&self, pred: impl Fn(&Value) -> bool) -> Value {
        loop {
            let frame = self
                .frames
                .recv_timeout(Duration::from_secs(20))
                .expect("no frame from berth within 20 s");
            if pred(&frame) {
                return frame;
            }
        }
    }

    /// Ends the server the gentle way (stdin closed) and waits for it.
    fn stop(mut self) {
        self.stdin.take();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn berth(args: &[&str], data: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .env_remove(ENV_KEYS)
        .output()
        .expect("run berth")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn berth_replay_reproduces_a_session_and_names_an_edited_resume_input() {
    let dir = tempfile::tempdir().unwrap();
    let (data, cwd, script) = (
        dir.path().join("data"),
        dir.path().join("work"),
        dir.path().join("s.toml"),
    );
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(&script, SCRIPT).unwrap();
    let mut server = Server::start(&data, &script);
    server.send(2, "session/new", json!({"cwd": cwd, "mcpServers": []}));
    let sid = server.until(|f| f["id"] == 2)["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "park yourself"}]}),
    );
    // While the check runs: a steer, delivered after it settles.
    server.until(|f| f["params"]["update"]["status"] == "in_progress");
    server.send(
        4,
        "session/inject",
        json!({"sessionId": sid, "mode": "steer", "content": "prefer the smaller path"}),
    );
    server.until(|f| f["id"] == 4);
    std::fs::write(cwd.join("release"), "").unwrap();
    let parked = server.until(|f| f["id"] == 3);
    assert_eq!(
        parked["result"]["_meta"]["berth"]["terminal"]["kind"], "suspended",
        "{parked}"
    );
    server.send(
        5,
        "session/resume",
        json!({"sessionId": sid, "input": {"window": "tonight", "ok": true}}),
    );
    server.until(|f| f["id"] == 5);
    server.until(|f| f["params"]["type"] == "turn_ended");
    server.stop();

    let out = berth(&["replay", &sid, "--verify", "--json"], &data);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{report}");
    assert_eq!(
        runs[0]["exit"], "suspended at post_tool_dispatch",
        "{report}"
    );
    assert_eq!(runs[1]["kind"], "resumed", "{report}");
    assert!(report["reproduced"].as_u64().unwrap() > 10, "{report}");
    assert!(report["receipts"].as_u64().unwrap() >= 4, "{report}");
    assert!(
        report["verified"]["events"].as_u64().unwrap() > 10,
        "{report}"
    );
    let out = berth(&["replay", &sid], &data);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("reproduced byte for byte"),
        "{}",
        text(&out)
    );

    // The journaled resume input edited (its row's chain hash left as it was).
    const EVENTS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("events");
    let db = redb::Database::create(data.join("journal.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    let mut edited = 0;
    {
        let mut table = txn.open_table(EVENTS).unwrap();
        let rows: Vec<(u64, Vec<u8>)> = table
            .range((sid.as_str(), 0)..=(sid.as_str(), u64::MAX))
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                (k.value().1, v.value().to_vec())
            })
            .collect();
        for (seq, row) in rows {
            let json = String::from_utf8(row[65..].to_vec()).unwrap();
            if json.contains(r#""type":"resumed""#) {
                let mut new = row[..65].to_vec();
                new.extend(json.replace("tonight", "at noon").as_bytes());
                table.insert((sid.as_str(), seq), new.as_slice()).unwrap();
                edited = seq;
            }
        }
    }
    txn.commit().unwrap();
    drop(db);
    assert!(edited > 0);

    let out = berth(&["replay", &sid, "--json"], &data);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let failed: Value = serde_json::from_slice(&out.stdout).expect("JSON error");
    let divergence = &failed["error"]["divergence"];
    assert_eq!(failed["error"]["kind"], "nondeterminism", "{failed}");
    assert_eq!(divergence["eventType"], "resumption_receipt", "{failed}");
    assert!(divergence["seq"].as_u64().unwrap() > edited, "{failed}");
    assert!(
        divergence["detail"]
            .as_str()
            .unwrap()
            .contains("input hash check failed"),
        "{failed}"
    );
    let out = berth(&["replay", &sid], &data);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("non-determinism at event"),
        "{}",
        text(&out)
    );
    // `--verify` refuses the tampered log instead.
    let out = berth(&["replay", &sid, "--verify"], &data);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("tampered at event {edited}")),
        "{}",
        text(&out)
    );
    // An unknown session.
    let out = berth(&["replay", "sess_nope"], &data);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("not in the journal"), "{}", text(&out));
}

/// SIGKILL mid-turn: every input the turn had consumed before the kill was
/// durable with the events that depend on it, so after a restart (which
/// seals the turn) `berth replay` reproduces everything up to the crash and
/// stops there, saying so.
#[test]
fn a_sigkill_mid_turn_replays_up_to_the_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (data, cwd, script) = (
        dir.path().join("data"),
        dir.path().join("work"),
        dir.path().join("s.toml"),
    );
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(&script, SCRIPT).unwrap();
    let mut server = Server::start(&data, &script);
    server.send(2, "session/new", json!({"cwd": cwd, "mcpServers": []}));
    let sid = server.until(|f| f["id"] == 2)["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "the smaller one"}]}),
    );
    server.until(|f| f["id"] == 3);
    server.send(
        4,
        "session/resume",
        json!({"sessionId": sid, "input": "go"}),
    );
    server.until(|f| f["id"] == 4);
    server.until(|f| f["params"]["type"] == "turn_ended");
    // A second turn, killed while its command runs.
    server.send(
        5,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "park yourself"}]}),
    );
    server.until(|f| f["params"]["update"]["status"] == "in_progress");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = server.child.wait();
    drop(server);
    // The restart seals the killed turn (process_restarted).
    Server::start(&data, &script).stop();

    let out = berth(&["replay", &sid, "--verify", "--json"], &data);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{report}");
    let cut = &report["cutShort"];
    assert!(
        cut["seq"].as_u64().unwrap() > runs[1]["lastSeq"].as_u64().unwrap(),
        "{report}"
    );
    let out = berth(&["replay", &sid], &data);
    assert!(text(&out).contains("stopped   at event"), "{}", text(&out));
}
