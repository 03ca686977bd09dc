//! What the binary's end-to-end tests share: a `berth serve` on stdio,
//! driven one JSON-RPC frame per line.
// Each test crate compiles this module and uses a different part of it.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

/// A temp dir holding `data/` (the data dir, not yet created), `work/` (a
/// session cwd) and `s.toml` (the scripted model's `script`): (dir, data,
/// cwd, script path). Keep the dir alive for the test.
pub fn workspace(script: &str) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (data, cwd, path) = (
        dir.path().join("data"),
        dir.path().join("work"),
        dir.path().join("s.toml"),
    );
    std::fs::create_dir_all(&cwd).expect("create the cwd");
    std::fs::write(&path, script).expect("write the script");
    (dir, data, cwd, path)
}

/// `berth serve --data-dir DATA --model scripted:SCRIPT`, as a command the
/// caller may add arguments and environment to before [`StdioServer::start`].
pub fn serve_command(data: &Path, script: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
    command
        .args(["serve", "--data-dir"])
        .arg(data)
        .arg("--model")
        .arg(format!("scripted:{}", script.display()));
    command
}

/// The variable a berth takes its receipt keys from instead of the key file.
pub const ENV_KEYS: &str = "BERTH_RECEIPT_KEYS";

/// `berth ARGS --data-dir DATA`, stdin closed, without the caller's
/// [`ENV_KEYS`] (a test adds its own to the command).
pub fn cli_command(args: &[&str], data: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
    command
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .stdin(Stdio::null())
        .env_remove(ENV_KEYS);
    command
}

/// Runs [`cli_command`] to its end.
pub fn cli(args: &[&str], data: &Path) -> Output {
    cli_command(args, data).output().expect("run berth")
}

/// A running `berth serve` on stdio: frames are read on a thread; responses
/// read while waiting for another are kept for their own wait (concurrent
/// requests answer in any order). Dropped, it is killed (SIGKILL).
pub struct StdioServer {
    child: Child,
    stdin: Option<ChildStdin>,
    frames: mpsc::Receiver<Value>,
    answered: RefCell<HashMap<u64, Value>>,
}

impl StdioServer {
    /// Spawns `command` with piped stdio (stderr discarded) and sends
    /// `initialize` as id 1.
    pub fn start(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn berth");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
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
            answered: RefCell::default(),
        };
        server.send(1, "initialize", json!({"protocolVersion": 1}));
        server.until(1);
        server
    }

    /// Writes one request.
    pub fn send(&mut self, id: u64, method: &str, params: Value) {
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{frame}").expect("write to berth");
        stdin.flush().expect("flush to berth");
    }

    /// The next frame (20 s at most).
    pub fn next(&self) -> Value {
        self.frames
            .recv_timeout(Duration::from_secs(20))
            .expect("no frame from berth within 20 s")
    }

    /// Notifications until the response with `id`; returns (notifications,
    /// response).
    pub fn until(&self, id: u64) -> (Vec<Value>, Value) {
        let mut notes = Vec::new();
        if let Some(answer) = self.answered.borrow_mut().remove(&id) {
            return (notes, answer);
        }
        loop {
            let v = self.next();
            match v["id"].as_u64() {
                Some(got) if got == id => return (notes, v),
                Some(other) => {
                    self.answered.borrow_mut().insert(other, v);
                }
                None => notes.push(v),
            }
        }
    }

    /// Notifications until one `pred` accepts; returns them all.
    pub fn until_note(&self, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let v = self.next();
            if let Some(other) = v["id"].as_u64() {
                self.answered.borrow_mut().insert(other, v);
                continue;
            }
            let done = pred(&v);
            seen.push(v);
            if done {
                return seen;
            }
        }
    }

    /// `session/new` in `cwd`; its session id.
    pub fn new_session(&mut self, id: u64, cwd: &Path) -> String {
        self.send(id, "session/new", json!({"cwd": cwd, "mcpServers": []}));
        self.until(id).1["result"]["sessionId"]
            .as_str()
            .expect("session/new answers a sessionId")
            .to_owned()
    }

    /// SIGKILLs the server and reaps it (a crash, for durability tests).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Ends the server the gentle way (stdin closed) and waits for it.
    pub fn stop(mut self) -> ExitStatus {
        self.stdin.take();
        self.child.wait().expect("wait for berth")
    }
}

impl Drop for StdioServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
