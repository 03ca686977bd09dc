//! Kill `berth serve` (SIGKILL, SIGTERM) in the middle of a turn, start it again on the
//! same data dir, and check what survived: every event a client was sent (each
//! is durable before it is sent), contiguous ids, and the interrupted turn
//! sealed with a harness-owned terminal — never re-run — with the session still
//! promptable.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

mod common;

const SCRIPT: &str = r#"
[[rules]]
match = "slow"
steps = [
  { text = "one" }, { delay_ms = 200 }, { text = "two" }, { delay_ms = 200 },
  { text = "three" }, { delay_ms = 20000 }, { text = "never" },
]
[[rules]]
match = "hi"
steps = [ { text = "hello again" } ]
"#;

struct Server {
    child: Child,
    stdin: ChildStdin,
    frames: mpsc::Receiver<Value>,
}

impl Server {
    fn start(data: &std::path::Path, script: &std::path::Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["serve", "--data-dir"])
            .arg(data)
            .arg("--model")
            .arg(format!("scripted:{}", script.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn berth");
        let stdin = child.stdin.take().unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (tx, frames) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value =
                    serde_json::from_str(&line).expect("stdout carries only JSON frames");
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            stdin,
            frames,
        }
    }

    /// [`Server::start`], then `initialize` (request id 1) answered.
    fn initialized(data: &std::path::Path, script: &std::path::Path) -> Self {
        let mut server = Self::start(data, script);
        server.send(1, "initialize", json!({"protocolVersion": 1}));
        server.until(1);
        server
    }

    fn send(&mut self, id: u64, method: &str, params: Value) {
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{frame}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn next(&self) -> Value {
        self.frames
            .recv_timeout(Duration::from_secs(15))
            .expect("no frame from berth within 15 s")
    }

    /// Notifications until the response with `id`, and the response.
    fn until(&self, id: u64) -> (Vec<Value>, Value) {
        let mut notes = Vec::new();
        loop {
            let v = self.next();
            if v["id"] == json!(id) {
                return (notes, v);
            }
            notes.push(v);
        }
    }
}

impl Server {
    /// `session/prompt` of `text` to `session` as request `id` (not awaited).
    fn prompt(&mut self, id: u64, session: &str, text: &str) {
        self.send(
            id,
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        );
    }

    /// `session/new` in `cwd` as request `id`; returns the session id.
    fn new_session(&mut self, id: u64, cwd: &std::path::Path) -> String {
        self.send(id, "session/new", json!({"cwd": cwd, "mcpServers": []}));
        self.until(id).1["result"]["sessionId"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

/// A temp dir with a data dir path, a session cwd and `script` written out.
fn workspace(
    script: &str,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let dir = tempfile::tempdir().unwrap();
    let (data, cwd, path) = (
        dir.path().join("data"),
        dir.path().join("work"),
        dir.path().join("s.toml"),
    );
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(&path, script).unwrap();
    (dir, data, cwd, path)
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn event_id(note: &Value) -> u64 {
    note["params"]["_meta"]["berth"]["eventId"]
        .as_u64()
        .expect("every notification names its event")
}

#[test]
fn acknowledged_events_survive_sigkill_and_the_turn_is_sealed() {
    let (_dir, data, cwd, script) = workspace(SCRIPT);

    let mut server = Server::initialized(&data, &script);
    let sid = server.new_session(2, &cwd);
    server.prompt(3, &sid, "slow");
    let mut seen = Vec::new();
    let mut chunks = 0;
    while chunks < 3 {
        let note = server.next();
        seen.push(event_id(&note));
        if note["params"]["update"]["sessionUpdate"] == "agent_message_chunk" {
            chunks += 1;
        }
    }
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    drop(server);

    let mut server = Server::start(&data, &script);
    server.send(1, "session/list", json!({}));
    let (_, list) = server.until(1);
    let entry = &list["result"]["sessions"][0]["_meta"]["berth"];
    assert_eq!(entry["activePrompt"], false);
    server.send(2, "session/load", json!({"sessionId": sid}));
    let (replayed, load) = server.until(2);
    let ids: Vec<u64> = replayed.iter().map(event_id).collect();
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "contiguous ids, nothing lost or half-written"
    );
    for id in &seen {
        assert!(
            ids.contains(id),
            "event {id} was sent before the kill but did not survive"
        );
    }
    let last = replayed.last().unwrap();
    assert_eq!(last["method"], "_berth/agentEvent");
    assert_eq!(last["params"]["type"], "turn_ended");
    let terminal = &last["params"]["event"]["terminal"];
    assert_eq!(
        (terminal["kind"].as_str(), terminal["owner"].as_str()),
        (Some("process_restarted"), Some("harness"))
    );
    assert!(terminal["reason"].as_str().unwrap().contains("restarted"));
    assert_eq!(last["params"]["event"]["stop_reason"], "cancelled");
    assert_eq!(
        load["result"]["_meta"]["berth"]["replayed"]
            .as_array()
            .unwrap()
            .len(),
        ids.len()
    );
    // Nothing re-ran the interrupted turn: the text after the long delay never appears.
    assert!(!replayed
        .iter()
        .any(|n| n["params"]["update"]["content"]["text"] == "never"));

    server.prompt(3, &sid, "hi");
    let (notes, done) = server.until(3);
    assert_eq!(done["result"]["stopReason"], "end_turn");
    // Event ids.len() + 1 is the prompt's own user_message_chunk, which is
    // not echoed to the connection that sent it.
    assert_eq!(
        event_id(&notes[0]),
        ids.len() as u64 + 2,
        "new events continue the log"
    );
}

const SLEEPER: &str = r#"
[[rules]]
match = "sleep"
steps = [
  # Returns at once: its shell exits, the background sleep lives on leaderless.
  { tool_call = { name = "shell", arguments = { command = "sleep 300 >/dev/null 2>&1 & echo $! > detached.pid" } } },
  # Still running when berth is killed.
  { tool_call = { name = "shell", arguments = { command = "sleep 300 & echo $! > inflight.pid; sleep 300" } } },
]
"#;

fn alive(pid: i32) -> bool {
    // A zombie waiting for init to reap it is dead for our purposes.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn read_pid(path: &std::path::Path) -> i32 {
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A server running the SLEEPER turn, killed or not yet: its two session
/// processes are up (one leaderless, one in a running tool call).
struct SleeperRun {
    _dir: tempfile::TempDir,
    data: std::path::PathBuf,
    script: std::path::PathBuf,
    server: Server,
    sid: String,
    pids: [i32; 2],
}

fn start_sleeper_turn() -> SleeperRun {
    let (dir, data, cwd, script) = workspace(SLEEPER);
    let mut server = Server::start(&data, &script);
    let sid = server.new_session(1, &cwd);
    server.prompt(2, &sid, "sleep");
    // Wait for the second call to be in flight.
    let mut in_progress = 0;
    while in_progress < 2 {
        if server.next()["params"]["update"]["status"] == "in_progress" {
            in_progress += 1;
        }
    }
    let pids = [
        read_pid(&cwd.join("detached.pid")),
        read_pid(&cwd.join("inflight.pid")),
    ];
    SleeperRun {
        _dir: dir,
        data,
        script,
        server,
        sid,
        pids,
    }
}

/// Waits up to 2 s for every pid to be gone.
fn all_gone(pids: &[i32]) -> bool {
    (0..200).any(|_| {
        let gone = !pids.iter().any(|&pid| alive(pid));
        if !gone {
            std::thread::sleep(Duration::from_millis(10));
        }
        gone
    })
}

#[test]
fn processes_a_killed_berth_left_behind_are_killed_at_restart() {
    let mut run = start_sleeper_turn();
    run.server.child.kill().unwrap();
    run.server.child.wait().unwrap();
    for pid in run.pids {
        assert!(
            alive(pid),
            "background child {pid} outlives a SIGKILLed berth"
        );
    }
    let mut server = Server::start(&run.data, &run.script);
    server.send(1, "session/list", json!({}));
    server.until(1); // start-up (and the reaping) is done before the first answer
    assert!(
        all_gone(&run.pids),
        "processes {:?} started by the session survived berth's restart",
        run.pids
    );
}

#[test]
fn sigterm_stops_cleanly_kills_session_processes_and_the_turn_is_sealed_at_restart() {
    let mut run = start_sleeper_turn();
    let berth = nix::unistd::Pid::from_raw(run.server.child.id() as i32);
    nix::sys::signal::kill(berth, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = run.server.child.wait().unwrap();
    assert!(
        status.success(),
        "berth exits cleanly on SIGTERM: {status:?}"
    );
    assert!(
        all_gone(&run.pids),
        "session processes die with a clean shutdown"
    );

    let mut server = Server::start(&run.data, &run.script);
    server.send(1, "session/load", json!({"sessionId": run.sid}));
    let (replayed, _) = server.until(1);
    let last = replayed.last().unwrap();
    assert_eq!(
        last["params"]["event"]["terminal"]["kind"],
        "process_restarted"
    );
}

#[test]
fn the_session_view_hashes_are_the_same_after_a_restart() {
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let mut server = Server::start(&data, &script);
    let sid = server.new_session(1, &cwd);
    server.prompt(2, &sid, "hi");
    server.until(2);
    server.send(3, "berth.session_view.query", json!({"sessionId": sid}));
    let before = server.until(3).1["result"].clone();
    assert_eq!(before["schema"], "berth.session_view.v1");
    assert_eq!(before["run"]["status"], "idle");
    assert_eq!(before["messageCount"], 2);
    assert_eq!(before["prefix_hash"].as_str().map(str::len), Some(64));
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(server);

    let mut server = Server::start(&data, &script);
    server.send(1, "session/load", json!({"sessionId": sid}));
    server.until(1);
    server.send(2, "_berth/session_view", json!({"sessionId": sid}));
    let after = server.until(2).1["result"].clone();
    assert_eq!(after, before, "same history, same projection, same hashes");
    // A new turn extends the prefix: the old hash no longer names the whole history.
    server.prompt(3, &sid, "hi");
    server.until(3);
    server.send(4, "berth.session_view.query", json!({"sessionId": sid}));
    let later = server.until(4).1["result"].clone();
    assert_ne!(later["prefix_hash"], before["prefix_hash"]);
    assert_eq!(later["messageCount"], 4);
}

#[test]
fn a_crash_settles_the_turns_loose_ends_and_leaves_it_rollbackable() {
    let mut run = start_sleeper_turn();
    run.server.send(
        3,
        "session/inject",
        json!({"sessionId": run.sid, "mode": "queue", "content": "note for later"}),
    );
    let (_, accepted) = run.server.until(3);
    let message_id = accepted["result"]["messageId"].as_str().unwrap().to_owned();
    run.server.child.kill().unwrap();
    run.server.child.wait().unwrap();

    let mut server = Server::start(&run.data, &run.script);
    server.send(1, "session/load", json!({"sessionId": run.sid}));
    let (replayed, _) = server.until(1);
    let agent_events: Vec<&Value> = replayed
        .iter()
        .filter(|n| n["method"] == "_berth/agentEvent")
        .collect();
    assert!(
        agent_events
            .iter()
            .any(|n| n["params"]["type"] == "injection_dropped"
                && n["params"]["event"]["message_id"] == message_id.as_str()),
        "an accepted injection is settled, not lost"
    );
    // Every announced tool call ends settled: no call stays in progress forever.
    let mut open_calls: Vec<String> = Vec::new();
    for n in &replayed {
        let u = &n["params"]["update"];
        let id = u["toolCallId"].as_str().unwrap_or_default().to_owned();
        match u["sessionUpdate"].as_str() {
            Some("tool_call") => open_calls.push(id),
            Some("tool_call_update") if u["status"] == "completed" || u["status"] == "failed" => {
                open_calls.retain(|c| *c != id)
            }
            _ => {}
        }
    }
    assert!(open_calls.is_empty(), "calls left open: {open_calls:?}");
    let ended = agent_events
        .iter()
        .rev()
        .find(|n| n["params"]["type"] == "turn_ended")
        .unwrap();
    let crashed_turn = ended["params"]["event"]["turn_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The crashed turn is the one a rollback pops, and the transcript it left
    // answers every tool call (a provider would refuse it otherwise).
    server.send(2, "session/rollback", json!({"sessionId": run.sid}));
    let (_, rolled) = server.until(2);
    assert_eq!(rolled["result"]["status"], "rolled_back");
    assert_eq!(rolled["result"]["checkpointId"], crashed_turn.as_str());
    assert_eq!(rolled["result"]["beforeMessageCount"], 0);
    server.send(3, "session/redo", json!({"sessionId": run.sid}));
    let (_, redone) = server.until(3);
    assert_eq!(redone["result"]["status"], "redone");
    let after = redone["result"]["afterMessageCount"].as_u64().unwrap();
    // user, assistant(call 1), tool 1, assistant(call 2), tool 2 (synthetic).
    assert_eq!(after, 5, "{redone}");
}

#[test]
fn berth_event_emit_reaches_the_running_server_and_wakes_a_parked_session() {
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let mut server = Server::initialized(&data, &script);
    let sid = server.new_session(2, &cwd);
    server.send(
        3,
        "session/suspend",
        json!({"sessionId": sid, "resumeWhen": {"onEvent": "ci.*"}}),
    );
    let handle = server.until(3).1["result"]["handle"].clone();
    let run = |name: &str, payload: &str| {
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["event", "emit", name, "--data", payload, "--data-dir"])
            .arg(&data)
            .output()
            .expect("run berth event emit")
    };
    let bad = run("bad name", "1");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("\"field\":\"name\""));
    let out = run("ci.passed", "\"hi\"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["woke"][0]["sessionId"], json!(sid));
    assert_eq!(answer["woke"][0]["handle"], handle);
    assert_eq!(answer["woke"][0]["resumed"], true);
    // The resumed turn streams to the stdio client: cause external_event, the
    // payload as input (the script answers "hi" with "hello again").
    let mut saw = (false, false);
    while !(saw.0 && saw.1) {
        let note = server.next();
        if note["params"]["type"] == "resumed" {
            assert_eq!(note["params"]["event"]["cause"], "external_event");
            saw.0 = true;
        }
        if note["params"]["update"]["content"]["text"] == "hello again" {
            saw.1 = true;
        }
    }
}

#[test]
fn a_buffered_scheduled_run_survives_sigkill_and_runs_after_the_restart() {
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let mut server = Server::initialized(&data, &script);
    let sid = server.new_session(2, &cwd);
    // A long turn, so that the schedule's run must wait behind it.
    server.prompt(3, &sid, "slow");
    server.send(
        4,
        "_berth/schedule.create",
        json!({"sessionId": sid, "cron": "* * * * * *", "prompt": "hi", "overlap": "buffer_one"}),
    );
    let created = server.until(4).1;
    let schedule_id = created["result"]["scheduleId"].as_str().unwrap().to_owned();
    // Wait until a run is buffered (durable in the schedule row), then pause
    // the schedule so that no new run muddies what the restart delivers.
    let mut id = 10;
    loop {
        id += 1;
        server.send(id, "_berth/schedule.list", json!({}));
        let list = server.until(id).1;
        if list["result"]["schedules"][0]["buffered"] == json!(1) {
            break;
        }
        assert!(id < 100, "no run was buffered: {list}");
        std::thread::sleep(Duration::from_millis(100));
    }
    server.send(
        200,
        "_berth/schedule.pause",
        json!({"scheduleId": schedule_id}),
    );
    assert_eq!(server.until(200).1["result"]["buffered"], json!(1));
    drop(server); // SIGKILL

    let mut server = Server::initialized(&data, &script);
    // The buffered run was delivered again at start-up: a turn with the
    // schedule's prompt ("hi" → "hello again") ran, and the count is back to 0.
    server.send(
        2,
        "session/load",
        json!({"sessionId": sid, "cwd": cwd, "mcpServers": []}),
    );
    loop {
        let note = server.next();
        if note["params"]["update"]["content"]["text"] == "hello again" {
            break;
        }
    }
    let mut id = 10;
    loop {
        id += 1;
        server.send(id, "_berth/schedule.list", json!({}));
        let schedule = server.until(id).1["result"]["schedules"][0].clone();
        if schedule["buffered"] == json!(0) {
            assert_eq!(schedule["paused"], json!(true));
            break;
        }
        assert!(
            id < 100,
            "the buffered count never went back to 0: {schedule}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

const WAKE: &str = r#"
[[rules]]
match = "wake"
steps = [ { text = "woke" } ]
"#;

/// SIGKILL in the middle of a burst of timer wake-ups: some claims are
/// durable with their resume still held for the turn's first write (see
/// `berth_actors::claimer`), some resumes are sealed, some wake-ups have not
/// fired. After the restart every suspension is resumed exactly once
/// (cause `timeout`), every woken session ends exactly one turn, and each
/// session's log is contiguous.
#[test]
fn wake_ups_cut_off_by_sigkill_resume_exactly_once_after_the_restart() {
    const N: u64 = 150;
    let (_dir, data, cwd, script) = workspace(WAKE);
    let mut server = Server::initialized(&data, &script);
    let sids: Vec<String> = (0..N).map(|i| server.new_session(10 + i, &cwd)).collect();
    // In windows within the connection's in-flight limit (64).
    for window in (0..N).collect::<Vec<_>>().chunks(50) {
        for &i in window {
            let timeout = json!({"durationMinutes": 0.005, "onTimeout": "resume_with_input", "input": "wake up"});
            server.send(
                1000 + i,
                "session/suspend",
                json!({"sessionId": sids[i as usize], "resumeWhen": {"timeout": timeout}}),
            );
        }
        let mut answered = 0;
        while answered < window.len() {
            let frame = server.next();
            if frame["id"].as_u64().is_some_and(|id| id >= 1000) {
                assert!(frame["result"]["handle"].is_string(), "{frame}");
                answered += 1;
            }
        }
    }
    // The burst (300 ms after the suspends) is under way: kill it.
    while server.next()["params"]["type"] != "resumed" {}
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    drop(server);

    let mut server = Server::initialized(&data, &script);
    let mut id = 2;
    let settled = (0..400).any(|_| {
        // Every page of `session/list`.
        let (mut sessions, mut cursor) = (Vec::new(), Value::Null);
        loop {
            id += 1;
            server.send(id, "session/list", json!({"cursor": cursor}));
            let (_, list) = server.until(id);
            sessions.extend(list["result"]["sessions"].as_array().unwrap().clone());
            cursor = list["result"]["nextCursor"].clone();
            if cursor.is_null() {
                break;
            }
        }
        let idle = sessions.iter().all(|s| {
            let meta = &s["_meta"]["berth"];
            meta["state"] == "idle" && meta["activePrompt"] == false
        });
        if !idle {
            std::thread::sleep(Duration::from_millis(25));
        }
        idle && sessions.len() == N as usize
    });
    assert!(settled, "every woken session settles after the restart");
    for sid in &sids {
        id += 1;
        server.send(id, "session/load", json!({"sessionId": sid}));
        let (replayed, _) = server.until(id);
        let ids: Vec<u64> = replayed.iter().map(event_id).collect();
        assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "{sid}");
        let of = |kind: &str| {
            replayed
                .iter()
                .filter(|n| n["params"]["type"] == kind)
                .collect::<Vec<_>>()
        };
        let resumed = of("resumed");
        assert_eq!(resumed.len(), 1, "{sid}: {resumed:?}");
        assert_eq!(resumed[0]["params"]["event"]["cause"], "timeout");
        assert_eq!(of("turn_ended").len(), 1, "{sid}");
        assert_eq!(of("resumption_receipt").len(), 1, "{sid}");
    }
}

const PARK_MID_BATCH: &str = r#"
[[rules]]
match = "park me"
steps = [
  { tool_calls = [
    { name = "shell", arguments = { command = "sleep 0.5" } },
    { name = "shell", arguments = { command = "echo ran >> runs.txt; sleep 0.3" } },
  ] },
  { text = "batch done" },
]
"#;

/// A parked turn with an unstarted call, woken by its timer: the woken
/// turn's start is durable before the call runs (a tool acts outside the
/// journal), so a SIGKILL the moment the call has started leaves the turn
/// known to be open: it is sealed at the restart and the call never runs a
/// second time.
#[test]
fn a_call_a_woken_turn_started_before_a_sigkill_is_not_run_again() {
    let (_dir, data, cwd, script) = workspace(PARK_MID_BATCH);
    let mut server = Server::initialized(&data, &script);
    let sid = server.new_session(2, &cwd);
    server.prompt(3, &sid, "park me");
    while server.next()["params"]["update"]["status"] != "in_progress" {}
    // The first call is running: park before the second starts, for 1 s.
    let timeout =
        json!({"durationMinutes": 1.0 / 60.0, "onTimeout": "resume_with_input", "input": "go on"});
    server.send(
        4,
        "session/suspend",
        json!({"sessionId": sid, "mode": "interrupt_immediate", "resumeWhen": {"timeout": timeout}}),
    );
    let mut answered = Vec::new();
    while answered.len() < 2 {
        let frame = server.next();
        if let Some(id) = frame["id"].as_u64() {
            answered.push((id, frame));
        }
    }
    let prompt = answered.iter().find(|(id, _)| *id == 3).unwrap();
    assert_eq!(
        prompt.1["result"]["_meta"]["berth"]["terminal"]["kind"], "suspended",
        "{}",
        prompt.1
    );
    let runs = cwd.join("runs.txt");
    assert!(!runs.exists(), "the second call waits for the wake-up");
    // The wake-up dispatches the unstarted call: kill the moment it runs.
    let started = std::time::Instant::now();
    while !runs.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the call never ran"
        );
        std::hint::spin_loop();
    }
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    drop(server);

    let mut server = Server::initialized(&data, &script);
    let mut id = 1;
    let idle = (0..200).any(|_| {
        id += 1;
        server.send(id, "_berth/session.get", json!({"sessionId": sid}));
        let meta = server.until(id).1["result"]["session"]["_meta"]["berth"].clone();
        let idle = meta["state"] == "idle" && meta["activePrompt"] == false;
        if !idle {
            std::thread::sleep(Duration::from_millis(25));
        }
        idle
    });
    assert!(idle, "the session settles after the restart");
    let ran = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(
        ran.lines().count(),
        1,
        "the started call ran again: {ran:?}"
    );
    id += 1;
    server.send(id, "session/load", json!({"sessionId": sid}));
    let (replayed, _) = server.until(id);
    let resumed = replayed
        .iter()
        .filter(|n| n["params"]["type"] == "resumed")
        .count();
    assert_eq!(resumed, 1);
}

/// The commit log is part of the journal after a crash: with it deleted,
/// `berth serve` refuses to start and `berth verify` reports the log
/// damaged (exit 2), both saying how to go on; `journal.log` created empty
/// accepts the loss. (`storage/tests/kill_writer.rs` checks what survives.)
#[test]
fn a_commit_log_deleted_after_sigkill_is_refused_until_put_back() {
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let mut server = Server::initialized(&data, &script);
    server.new_session(2, &cwd); // acknowledged: in the log
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    drop(server);
    let log = data.join("journal.log");
    std::fs::remove_file(&log).unwrap();

    let berth = |args: &[&str]| common::cli(args, &data);
    let serve = berth(&["serve"]);
    let text = String::from_utf8_lossy(&serve.stderr);
    assert_eq!(serve.status.code(), Some(1), "{text}");
    assert!(
        text.contains("the commit log is missing") && text.contains("create it empty"),
        "{text}"
    );
    let verify = berth(&["verify"]);
    let text = String::from_utf8_lossy(&verify.stdout);
    assert_eq!(verify.status.code(), Some(2), "{text}");
    assert!(
        text.starts_with(&format!("damaged   {}:", log.display())),
        "{text}"
    );
    assert!(!log.exists(), "a refused start creates no log");

    std::fs::write(&log, b"").unwrap();
    let verify = berth(&["verify"]);
    assert_eq!(
        verify.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
}

#[test]
fn a_cancel_answered_before_a_sigkill_seals_the_turn_user_cancelled() {
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let mut server = Server::initialized(&data, &script);
    let sid = server.new_session(2, &cwd);
    server.prompt(3, &sid, "slow");
    let mut chunks = 0;
    while chunks < 3 {
        if server.next()["params"]["update"]["sessionUpdate"] == "agent_message_chunk" {
            chunks += 1;
        }
    }
    // The turn waits in its long model delay; the cancel is durable once
    // answered, and berth dies right after.
    server.send(4, "session/cancel", json!({"sessionId": sid}));
    let mut answer = server.next();
    while answer["id"] != json!(4) {
        answer = server.next();
    }
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    assert_eq!(answer["result"]["status"], "cancelled", "{answer}");
    drop(server);

    let mut server = Server::start(&data, &script);
    server.send(1, "session/load", json!({"sessionId": sid}));
    let (replayed, _) = server.until(1);
    let ended: Vec<&Value> = replayed
        .iter()
        .filter(|n| n["params"]["type"] == "turn_ended")
        .collect();
    assert_eq!(ended.len(), 1, "{replayed:?}");
    let terminal = &ended[0]["params"]["event"]["terminal"];
    assert_eq!(
        (terminal["kind"].as_str(), terminal["owner"].as_str()),
        (Some("user_cancelled"), Some("user")),
        "{terminal}"
    );
    assert_eq!(ended[0]["params"]["event"]["stop_reason"], "cancelled");
    drop(server);
    let out = common::cli(&["replay", &sid, "--verify"], &data);
    assert!(
        out.status.success(),
        "replay --verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = common::cli(&["verify"], &data);
    assert!(
        out.status.success(),
        "verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
