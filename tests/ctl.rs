//! `berth ctl` against a running `berth serve --listen 127.0.0.1:0` with
//! tokens (issue 8, "How it is checked": "`berth ctl` drives suspend → ps →
//! resume against a running server"): every command is the real binary
//! talking ACP over the WebSocket, its `--json` output parsed; a wrong token
//! and a refused role exit non-zero with the cause and the remedy.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

const SCRIPT: &str = r#"
[[rules]]
match = "hello"
steps = [ { text = "hi from the script" }, { usage = { input_tokens = 120, output_tokens = 40 } } ]
[[rules]]
match = "slow"
steps = [
  { text = "working" }, { delay_ms = 300 },
  { tool_call = { name = "read_file", arguments = { path = "{cwd}/missing.txt" } } },
  { delay_ms = 300 }, { text = "still working" },
  { tool_call = { name = "read_file", arguments = { path = "{cwd}/missing.txt" } } },
  { delay_ms = 30000 }, { text = "never" },
]
[[rules]]
match = "go"
steps = [ { text = "going on" } ]
"#;

const CONTROLLER: &str = "ctl-test-controller-token";
const OBSERVER: &str = "ctl-test-observer-token";
const OWNER: &str = "ctl-test-owner-token";

/// A running `berth serve` with the HTTP listener on an ephemeral loopback
/// port; its stdio is a trusted local client the test creates sessions with.
struct Server {
    child: Child,
    stdin: ChildStdin,
    frames: mpsc::Receiver<Value>,
    url: String,
    data: PathBuf,
    _dir: tempfile::TempDir,
    cwd: PathBuf,
}

impl Server {
    fn start() -> Self {
        Self::start_with(|_| Vec::new())
    }

    /// Starts with extra `serve` arguments made in the temp dir (TLS files).
    fn start_with(extra: impl FnOnce(&std::path::Path) -> Vec<std::ffi::OsString>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let extra = extra(dir.path());
        let data = dir.path().join("data");
        let cwd = dir.path().join("work");
        let script = dir.path().join("s.toml");
        std::fs::create_dir_all(&cwd).unwrap();
        std::fs::write(&script, SCRIPT).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .arg("--model")
            .arg(format!("scripted:{}", script.display()))
            .args(extra)
            .env(
                "BERTH_API_KEYS",
                format!("{CONTROLLER}=alice:controller,{OBSERVER}=grafana:observer,{OWNER}=root:host_owner"),
            )
            .env("BERTH_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn berth serve");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, frames) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line).expect("stdout carries JSON frames");
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        // "berth: listening on http(s)://127.0.0.1:PORT" names the port.
        let (addr_tx, addr_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut addr_tx = Some(addr_tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let found = line
                    .strip_prefix("berth: listening on http://")
                    .map(|rest| format!("ws://{}/acp", rest.trim()))
                    .or_else(|| {
                        line.strip_prefix("berth: listening on https://")
                            .map(|rest| format!("wss://{}/acp", rest.trim()))
                    });
                if let (Some(url), Some(tx)) = (found, addr_tx.as_ref()) {
                    let _ = tx.send(url);
                    addr_tx = None;
                }
            }
        });
        let url = addr_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("berth serve announces its listener");
        let mut server = Self {
            child,
            stdin,
            frames,
            url,
            data,
            _dir: dir,
            cwd,
        };
        server.send(1, "initialize", json!({"protocolVersion": 1}));
        server.until(1);
        server
    }

    fn send(&mut self, id: u64, method: &str, params: Value) {
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{frame}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn until(&self, id: u64) -> Value {
        loop {
            let v = self
                .frames
                .recv_timeout(Duration::from_secs(20))
                .expect("no frame from berth within 20 s");
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    fn new_session(&mut self, id: u64) -> String {
        let cwd = self.cwd.clone();
        self.send(id, "session/new", json!({"cwd": cwd, "mcpServers": []}));
        self.until(id)["result"]["sessionId"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// `berth ctl ARGS` against this server with `token`.
    fn ctl(&self, token: &str, args: &[&str]) -> Output {
        ctl_command(&self.url, token, args)
            .output()
            .expect("run berth ctl")
    }

    /// `berth ctl --json ARGS`, which must succeed; its parsed stdout.
    fn ctl_json(&self, token: &str, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.ctl(token, &all);
        assert!(
            out.status.success(),
            "berth ctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "berth ctl {args:?} --json printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ctl_command(url: &str, token: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
    command
        .arg("ctl")
        .args(args)
        .env_remove("BERTH_DATA_DIR")
        .env("BERTH_SERVER", url)
        .env("BERTH_TOKEN", token)
        .stdin(Stdio::null());
    command
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `ps --json` row of `sid`.
fn row(server: &Server, sid: &str) -> Value {
    let ps = server.ctl_json(CONTROLLER, &["ps"]);
    ps["sessions"]
        .as_array()
        .expect("ps --json lists sessions")
        .iter()
        .find(|r| r["sessionId"] == json!(sid))
        .cloned()
        .unwrap_or_else(|| panic!("{sid} not in {ps}"))
}

#[test]
fn ctl_drives_suspend_ps_resume_over_the_websocket() {
    let mut server = Server::start();
    let sid = server.new_session(2);

    // Suspend with conditions: answered once durable.
    let suspended = server.ctl_json(
        CONTROLLER,
        &[
            "suspend",
            &sid,
            "--reason",
            "review",
            "--on-event",
            "ci.passed",
            "--timeout",
            "90",
            "--on-timeout",
            "fail",
        ],
    );
    let handle = suspended["handle"].as_str().expect("a handle").to_owned();
    assert_eq!(suspended["resumeWhen"]["onEvent"], "ci.passed");

    // ps shows it suspended, with its conditions (JSON and the table).
    let r = row(&server, &sid);
    assert_eq!(r["state"], "suspended", "{r}");
    assert_eq!(r["activePrompt"], false);
    assert_eq!(r["suspension"]["handle"], json!(handle));
    assert_eq!(r["suspension"]["reason"], "review");
    assert_eq!(
        r["suspension"]["actor"], "alice",
        "the token's actor, not a claim"
    );
    assert_eq!(r["suspension"]["resumeWhen"]["onEvent"], "ci.passed");
    assert_eq!(
        r["suspension"]["resumeWhen"]["timeout"],
        json!({"durationMinutes": 90.0, "onTimeout": "fail"})
    );
    assert!(r["suspension"]["suspendedAt"].is_string(), "{r}");
    let table = server.ctl(CONTROLLER, &["ps"]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = stdout(&table);
    let line = text
        .lines()
        .find(|l| l.starts_with(&sid))
        .unwrap_or_else(|| panic!("no row for {sid} in\n{text}"));
    assert!(text.starts_with("ID"), "{text}");
    assert!(line.contains("suspended"), "{line}");
    assert!(
        line.contains("event ci.passed | timeout 1h30m → fail"),
        "{line}"
    );

    // show: the same facts, one session.
    let shown = server.ctl_json(OBSERVER, &["show", &sid]);
    assert_eq!(shown["session"]["_meta"]["berth"]["state"], "suspended");
    assert_eq!(shown["view"]["run"]["status"], "suspended");

    // A second suspend is idempotent: the same handle.
    let again = server.ctl_json(CONTROLLER, &["suspend", &sid]);
    assert_eq!(again["handle"], json!(handle));
    assert_eq!(again["_meta"]["berth"]["alreadySuspended"], true);

    // Resume with input claims that handle once.
    let resumed = server.ctl_json(CONTROLLER, &["resume", &sid, "--input", "\"go\""]);
    assert_eq!(resumed["handle"], json!(handle));
    assert_eq!(resumed["cause"], "explicit_resume");
    assert_eq!(resumed["hadResumeInput"], true);
    assert_ne!(row(&server, &sid)["state"], "suspended");

    // A second resume finds nothing to claim: -32009, exit 1, JSON error.
    let twice = server.ctl(CONTROLLER, &["resume", &sid, "--json"]);
    assert_eq!(twice.status.code(), Some(1));
    let error: Value = serde_json::from_slice(&twice.stdout).unwrap();
    assert_eq!(error["error"]["code"], -32009, "{error}");
    assert!(stderr(&twice).contains("-32009"), "{}", stderr(&twice));

    // The events went through the journal: `tail --from-start` on a closed
    // session replays them and ends.
    let closed = server.ctl_json(OWNER, &["close", &sid]);
    assert_eq!(closed["closed"], true);
    let tail = server.ctl(OBSERVER, &["tail", &sid, "--from-start"]);
    assert!(tail.status.success(), "{}", stderr(&tail));
    let text = stdout(&tail);
    for needle in [
        "suspended: ",
        "resumed: ",
        "explicit_resume, with input",
        "control session/suspend accepted",
        "session closed",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
}

#[test]
fn a_wrong_token_and_a_refused_role_exit_non_zero_with_the_remedy() {
    let mut server = Server::start();
    let sid = server.new_session(2);

    let bad = server.ctl("not-a-token", &["ps", "--json"]);
    assert_eq!(bad.status.code(), Some(1));
    let err = stderr(&bad);
    assert!(err.contains("HTTP 401"), "{err}");
    assert!(
        err.contains("BERTH_TOKEN"),
        "the remedy names the setting: {err}"
    );
    let parsed: Value = serde_json::from_slice(&bad.stdout).unwrap();
    assert!(parsed["error"]["message"].as_str().unwrap().contains("401"));

    let none = ctl_command(&server.url, "", &["ps"])
        .env_remove("BERTH_TOKEN")
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(1));
    assert!(
        stderr(&none).contains("no token was given"),
        "{}",
        stderr(&none)
    );

    // An observer may look but not suspend: -32011 with who it is and what
    // the method needs.
    let refused = server.ctl(OBSERVER, &["suspend", &sid, "--json"]);
    assert_eq!(refused.status.code(), Some(1));
    let parsed: Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert_eq!(parsed["error"]["code"], -32011, "{parsed}");
    assert_eq!(parsed["error"]["data"]["requiredRole"], "controller");
    let err = stderr(&refused);
    assert!(err.contains("grafana has role observer"), "{err}");
    assert!(err.contains("needs controller"), "{err}");
    assert_ne!(row(&server, &sid)["state"], "suspended", "nothing changed");

    // The broadcast needs the host owner.
    let broadcast = server.ctl(CONTROLLER, &["suspend", "--all"]);
    assert_eq!(broadcast.status.code(), Some(1));
    assert!(
        stderr(&broadcast).contains("needs host_owner"),
        "{}",
        stderr(&broadcast)
    );

    // An unknown session names the remedy.
    let unknown = server.ctl(CONTROLLER, &["cancel", "sess_nope"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(stderr(&unknown).contains("-32004"), "{}", stderr(&unknown));
    assert!(
        stderr(&unknown).contains("berth ctl ps"),
        "{}",
        stderr(&unknown)
    );

    // Nothing listens: the error says what to check.
    let gone = ctl_command("ws://127.0.0.1:1/acp", CONTROLLER, &["ps"])
        .output()
        .unwrap();
    assert_eq!(gone.status.code(), Some(1));
    assert!(
        stderr(&gone).contains("cannot reach berth"),
        "{}",
        stderr(&gone)
    );
}

#[test]
fn prompt_steer_cancel_and_tail_follow_a_live_turn() {
    let mut server = Server::start();
    let sid = server.new_session(2);

    // tail follows live (from now) until the session closes.
    let mut tail = ctl_command(&server.url, OBSERVER, &["tail", &sid])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The stdio client hears the tail attach (presence), so the tail
    // follows before the turn starts.
    loop {
        let v = server
            .frames
            .recv_timeout(Duration::from_secs(20))
            .expect("presence of the tail");
        if v["method"] == "_berth/presence" && v["params"]["actor"] == "grafana" {
            break;
        }
    }
    // `prompt` streams the agent's text and ends with the stop reason.
    let hello = server.ctl(CONTROLLER, &["prompt", &sid, "hello", "there"]);
    assert!(hello.status.success(), "{}", stderr(&hello));
    let text = stdout(&hello);
    assert!(text.contains("hi from the script"), "{text}");
    assert!(text.contains("end_turn"), "{text}");
    assert!(text.contains("120 in / 40 out tokens"), "{text}");
    let spend = row(&server, &sid)["spend"].clone();
    assert_eq!(spend["inputTokens"], 120, "{spend}");

    // A slow turn from the stdio client; steer it, then cancel it.
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "slow"}]}),
    );
    // Wait until the turn runs (steer needs a running turn).
    loop {
        let v = server
            .frames
            .recv_timeout(Duration::from_secs(20))
            .expect("the slow turn streams");
        if v["params"]["update"]["content"]["text"] == "working" {
            break;
        }
    }
    let steered = server.ctl_json(
        CONTROLLER,
        &[
            "steer", &sid, "slow", "down,", "prefer", "the", "smaller", "fix", "--wait",
        ],
    );
    assert_eq!(steered["status"], "delivered", "{steered}");
    // Suspend the running turn: answered once it parked at its seam.
    let parked = server.ctl_json(
        CONTROLLER,
        &["suspend", &sid, "--mode", "interrupt_immediate"],
    );
    let handle = parked["handle"].clone();
    assert!(handle.is_string(), "{parked}");
    let prompt = server.until(3);
    assert_eq!(prompt["result"]["stopReason"], "end_turn", "{prompt}");
    assert_eq!(
        prompt["result"]["_meta"]["berth"]["terminal"]["kind"],
        "suspended"
    );
    let r = row(&server, &sid);
    assert_eq!(
        (r["state"].as_str(), r["activePrompt"].as_bool()),
        (Some("suspended"), Some(false)),
        "{r}"
    );
    // Resume continues the parked turn; cancel stops it.
    let resumed = server.ctl_json(CONTROLLER, &["resume", &sid]);
    assert_eq!(resumed["handle"], handle);
    assert!(
        resumed["turnId"].is_string(),
        "the parked turn runs again: {resumed}"
    );
    let cancelled = server.ctl_json(CONTROLLER, &["cancel", &sid]);
    assert_eq!(cancelled["status"], "cancelled");
    let idle = server.ctl(CONTROLLER, &["steer", &sid, "too late"]);
    assert_eq!(idle.status.code(), Some(1));
    assert!(
        stderr(&idle).contains("needs a running turn"),
        "{}",
        stderr(&idle)
    );

    // event emit reaches the server.
    let emitted = server.ctl_json(
        CONTROLLER,
        &["event", "emit", "ci.passed", "--data", "{\"ok\":true}"],
    );
    assert!(emitted["seq"].is_u64(), "{emitted}");

    // Closing ends the tail, which saw the whole conversation live.
    server.ctl_json(OWNER, &["close", &sid]);
    let status = wait_with_timeout(&mut tail, Duration::from_secs(20));
    assert_eq!(status, Some(0), "tail ends when the session closes");
    let mut out = String::new();
    tail.stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    for needle in [
        "agent: hi from the script",
        "turn ",
        "(injected ",
        "suspend requested: ",
        "suspended: ",
        "resumed: ",
        "control session/cancel accepted cancelled by alice",
        "session closed",
    ] {
        assert!(out.contains(needle), "{needle:?} not in\n{out}");
    }

    // The local control socket is the default when no server is given.
    let local = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["ctl", "ps", "--json", "--data-dir"])
        .arg(&server.data)
        .env_remove("BERTH_SERVER")
        .env_remove("BERTH_TOKEN")
        .output()
        .unwrap();
    assert!(local.status.success(), "{}", stderr(&local));
    let listed: Value = serde_json::from_slice(&local.stdout).unwrap();
    assert_eq!(listed["sessions"][0]["state"], "closed");
}

fn wait_with_timeout(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ctl_speaks_wss_trusting_the_given_ca() {
    // A self-signed end-entity certificate for 127.0.0.1 (not a CA: webpki
    // refuses a CA certificate as the server's own), made with the openssl
    // CLI.
    let server = Server::start_with(|dir| {
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let made = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"])
            .args(["-addext", "subjectAltName=IP:127.0.0.1"])
            .args(["-addext", "basicConstraints=critical,CA:FALSE", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run openssl");
        assert!(made.success(), "openssl made no certificate");
        vec![
            "--tls-cert".into(),
            cert.into_os_string(),
            "--tls-key".into(),
            key.into_os_string(),
        ]
    });
    assert!(server.url.starts_with("wss://"), "{}", server.url);
    let cert = server.data.parent().unwrap().join("cert.pem");

    // Without the CA the server's certificate is not trusted: the error
    // says how to trust it.
    let untrusted = server.ctl(CONTROLLER, &["ps"]);
    assert_eq!(untrusted.status.code(), Some(1));
    assert!(
        stderr(&untrusted).contains("--ca-cert"),
        "{}",
        stderr(&untrusted)
    );

    let mut command = ctl_command(&server.url, CONTROLLER, &["ps", "--json", "--ca-cert"]);
    let trusted = command.arg(&cert).output().unwrap();
    assert!(trusted.status.success(), "{}", stderr(&trusted));
    let listed: Value = serde_json::from_slice(&trusted.stdout).unwrap();
    assert!(listed["sessions"].is_array(), "{listed}");
}

/// A frame the server cannot read (here over `--max-frame-bytes`) is
/// answered with a null id; `ctl` on the control socket must fail with that
/// error instead of waiting for an answer by id forever.
#[test]
fn an_unreadable_frame_fails_the_waiting_request_on_the_control_socket() {
    let mut server = Server::start_with(|_| vec!["--max-frame-bytes".into(), "100000".into()]);
    let sid = server.new_session(2);
    let big = "x".repeat(120_000);
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["ctl", "prompt", &sid, &big, "--data-dir"])
        .arg(&server.data)
        .env_remove("BERTH_SERVER")
        .env_remove("BERTH_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run berth ctl");
    let code = wait_with_timeout(&mut child, Duration::from_secs(30));
    let _ = child.kill();
    let out = child.wait_with_output().expect("ctl output");
    let code = code.expect("ctl prompt with an oversized frame must not hang");
    assert_ne!(code, 0, "an unreadable frame is a failure");
    let err = stderr(&out);
    assert!(
        err.contains("frame_too_large") || err.contains("-32600"),
        "{err}"
    );
    // Nothing was prompted: the session is still idle.
    server.send(3, "_berth/session.get", json!({"sessionId": sid}));
    let got = server.until(3);
    assert_eq!(
        got["result"]["session"]["_meta"]["berth"]["state"],
        json!("idle"),
        "{got}"
    );
}

/// Usage problems clap cannot see exit 2 before connecting (no server runs
/// here, so reaching one would be a different failure, exit 1).
#[test]
fn usage_errors_exit_2_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    // `berth ctl ARGS --data-dir DIR`, no server or token from the
    // environment.
    let berth = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(args)
            .arg("--data-dir")
            .arg(dir.path())
            .env_remove("BERTH_SERVER")
            .env_remove("BERTH_TOKEN")
            .stdin(Stdio::null())
            .output()
            .expect("run berth")
    };
    let ctl = |args: &[&str]| berth(&[&["ctl"], args].concat());
    for args in [
        vec!["suspend"],
        vec!["suspend", "--all", "--timeout", "1"],
        vec!["resume", "sess_x", "--input", "go on"],
        vec!["event", "emit", "x", "--data", "{a:1}"],
        vec!["ps", "--server", "ftp://x"],
        vec!["suspend", "sess_x", "--timeout", "NaN"],
        vec!["ps", "--state", "bogus"],
    ] {
        let out = ctl(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("cannot reach"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // A token without a server is not an error, but it is not silently
    // dropped either.
    let out = ctl(&["ps", "--token", "t0ken"]);
    assert!(
        stderr(&out).contains("warning: --token"),
        "{}",
        stderr(&out)
    );
    // Nor by `berth event emit` and `berth schedule`, which take the same
    // endpoint flags.
    for args in [
        vec!["event", "emit", "ci.passed", "--token", "t0ken"],
        vec!["schedule", "list", "--token", "t0ken"],
    ] {
        let out = berth(&args);
        assert!(
            stderr(&out).contains("warning: --token"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}
