//! Signed receipts and `berth verify`, end to end through the real binary:
//! a turn steered, suspended and resumed over stdio, berth killed with
//! SIGKILL, `berth verify` → ok (the receipts a dead process signed verify in
//! a new one); `berth keys rotate`, a second server signing with the new key,
//! verify → ok with both keys; then one bit of a journaled receipt flipped in
//! the redb file → `berth verify` names that event and exits 2. And the same
//! with the keys given in `BERTH_RECEIPT_KEYS` instead of the key file.

use std::path::Path;
use std::process::Output;

use redb::{ReadableTable, TableDefinition};

mod common;
use common::{cli_command, serve_command, workspace, StdioServer as Server, ENV_KEYS};
use serde_json::{json, Value};

const SCRIPT: &str = r#"
fallback = "noted: {input}"

[[rules]]
match = "two steps"
steps = [
  { text = "Step A, then step B." },
  { tool_call = { name = "shell", arguments = { command = "while [ ! -e release-a ]; do sleep 0.02; done; echo A >> log", timeout_ms = 20000 } } },
  { tool_call = { name = "shell", arguments = { command = "echo B >> log" } } },
  { text = "Both steps done." },
]

[[rules]]
match = "one batch"
steps = [
  { text = "One batch: A then B." },
  { tool_calls = [
      { name = "shell", arguments = { command = "while [ ! -e release-b ]; do sleep 0.02; done; echo A >> log", timeout_ms = 20000 } },
      { name = "shell", arguments = { command = "echo B >> log" } },
  ] },
  { text = "Batch done." },
]
"#;

/// `berth serve` with the receipt keys from `keys` (`BERTH_RECEIPT_KEYS`),
/// or from the data dir's key file when `None`.
fn start_server(data: &Path, script: &Path, keys: Option<&str>) -> Server {
    let mut command = serve_command(data, script);
    command.env_remove(ENV_KEYS);
    if let Some(keys) = keys {
        command.env(ENV_KEYS, keys);
    }
    Server::start(command)
}

fn agent_event<'a>(frames: &'a [Value], kind: &str) -> Vec<&'a Value> {
    frames
        .iter()
        .filter(|f| f["method"] == "_berth/agentEvent" && f["params"]["type"] == kind)
        .map(|f| &f["params"]["event"])
        .collect()
}

fn berth(args: &[&str], data: &Path, keys: Option<&str>) -> Output {
    let mut command = cli_command(args, data);
    if let Some(keys) = keys {
        command.env(ENV_KEYS, keys);
    }
    command.output().expect("run berth")
}

fn verify_json(data: &Path, keys: Option<&str>) -> (Option<i32>, Value) {
    let out = berth(&["verify", "--json"], data, keys);
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "verify printed no JSON: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), report)
}

/// Suspends the idle session and resumes it; returns every frame seen.
fn park_and_wake(server: &mut Server, sid: &str, first_id: u64) -> Vec<Value> {
    server.send(first_id, "session/suspend", json!({"sessionId": sid}));
    let (mut frames, suspended) = server.until(first_id);
    let handle = suspended["result"]["handle"].as_str().unwrap().to_owned();
    server.send(
        first_id + 1,
        "session/resume",
        json!({"sessionId": sid, "handle": handle}),
    );
    let (more, resumed) = server.until(first_id + 1);
    assert!(resumed.get("result").is_some(), "{resumed}");
    frames.extend(more);
    frames
}

#[test]
fn receipts_signed_before_a_sigkill_verify_and_a_flipped_bit_is_named() {
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let mut server = start_server(&data, &script, None);
    let sid = server.new_session(2, &cwd);
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "two steps"}]}),
    );
    let mut frames = server.until_note(|n| n["params"]["update"]["sessionUpdate"] == "tool_call");
    // While the gated call runs: a steer, then a suspend (finish_step).
    server.send(
        4,
        "session/inject",
        json!({"sessionId": sid, "mode": "steer", "content": "also say why"}),
    );
    let (notes, injected) = server.until(4);
    frames.extend(notes);
    let message_id = injected["result"]["messageId"].as_str().unwrap().to_owned();
    server.send(
        5,
        "session/suspend",
        json!({"sessionId": sid, "mode": "finish_step"}),
    );
    frames.extend(server.until_note(|n| n["params"]["type"] == "suspend_requested"));
    std::fs::write(cwd.join("release-a"), "").unwrap();
    let (notes, prompt) = server.until(3);
    frames.extend(notes);
    assert_eq!(prompt["result"]["stopReason"], "end_turn", "{prompt}");
    let (notes, suspended) = server.until(5);
    frames.extend(notes);
    let handle = suspended["result"]["handle"].as_str().unwrap().to_owned();
    let input = json!({"note": "go", "a": [1, {"z": true, "b": null}]});
    server.send(
        6,
        "session/resume",
        json!({"sessionId": sid, "handle": handle, "input": input}),
    );
    let (notes, resumed) = server.until(6);
    frames.extend(notes);
    assert!(resumed.get("result").is_some(), "{resumed}");
    frames.extend(server.until_note(|n| n["params"]["type"] == "turn_ended"));

    // What went out: the steer's drain at post_tool_dispatch, the suspend
    // request's drain at turn_start, the suspension and resumption receipts,
    // all signed with the data dir's first key.
    let drains = agent_event(&frames, "drain_decision_receipt");
    let delivered = drains
        .iter()
        .find(|d| d["item"]["kind"] == "injection" && d["item"]["message_id"] == message_id)
        .unwrap_or_else(|| panic!("no drain receipt for the steer: {drains:#?}"));
    assert_eq!(delivered["seam"], "post_tool_dispatch");
    assert_eq!(delivered["action"], "delivered");
    let parked = drains
        .iter()
        .find(|d| d["item"]["kind"] == "suspend_request")
        .expect("a drain receipt for the suspend request");
    assert_eq!(parked["item"]["handle"], handle);
    assert_eq!(parked["seam"], "turn_start");
    assert_eq!(parked["action"], "parked");
    let turn_id = &prompt["result"]["_meta"]["berth"]["turnId"];
    assert!(turn_id.is_string(), "{prompt}");
    assert_eq!(&parked["turn_id"], turn_id, "the turn that drained it");
    assert_eq!(&delivered["turn_id"], turn_id);
    let suspension = agent_event(&frames, "suspension_receipt");
    assert_eq!(suspension.len(), 1);
    assert_eq!(suspension[0]["handle"], handle);
    assert_eq!(suspension[0]["initiator"], "client");
    assert!(suspension[0]["frame_sha256"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    let resumption = agent_event(&frames, "resumption_receipt");
    assert_eq!(resumption.len(), 1);
    let resumption = resumption[0];
    assert_eq!(resumption["handle"], handle);
    assert_eq!(resumption["cause"], "explicit_resume");
    assert_eq!(resumption["continue_transcript"], true);
    // SHA-256 over the canonical JSON (keys sorted at every depth, no spaces).
    let canonical = r#"{"a":[1,{"b":null,"z":true}],"note":"go"}"#;
    assert_eq!(
        resumption["input_sha256"],
        format!("sha256:{}", sha256_hex(canonical.as_bytes()))
    );
    for receipt in agent_event(&frames, "control_outcome")
        .into_iter()
        .chain([suspension[0], resumption])
        .chain(drains.iter().copied())
    {
        assert_eq!(receipt["signature"]["key_id"], "k1", "{receipt}");
        assert_eq!(receipt["signature"]["alg"], "HMAC-SHA256");
    }

    // SIGKILL, then verify in a new process (no server running).
    drop(server);
    let (code, report) = verify_json(&data, None);
    assert_eq!(code, Some(0), "{report:#}");
    let session = &report["sessions"][0];
    assert_eq!(session["sessionId"], sid);
    assert_eq!(session["status"], "ok");
    assert!(session["receipts"].as_u64().unwrap() >= 8, "{report:#}");
    println!(
        "verify after SIGKILL: {} events, {} receipts, repairedCopy={}",
        session["events"], session["receipts"], report["repairedCopy"]
    );

    // Rotate; a new server signs with k2, the old receipts keep verifying.
    let rotated = berth(&["keys", "rotate"], &data, None);
    assert!(rotated.status.success(), "{rotated:?}");
    let listed: Value = serde_json::from_slice(&rotated.stdout).unwrap();
    assert_eq!(listed["active"], "k2");
    assert!(!String::from_utf8_lossy(&rotated.stdout).contains("secret"));
    let mut server = start_server(&data, &script, None);
    let second = server.new_session(2, &cwd);
    let frames = park_and_wake(&mut server, &second, 3);
    for receipt in agent_event(&frames, "suspension_receipt")
        .into_iter()
        .chain(agent_event(&frames, "resumption_receipt"))
    {
        assert_eq!(receipt["signature"]["key_id"], "k2");
    }
    server.stop();
    let (code, report) = verify_json(&data, None);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["keys"], json!(["k1", "k2"]));
    assert_eq!(report["ok"], 2);

    // One bit of the first session's resumption receipt, flipped on disk.
    let seq = flip_in_event(
        &data.join("journal.redb"),
        &sid,
        "\"resumption_receipt\"",
        "sha256:",
    );
    let out = berth(&["verify"], &data, None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains(&format!("tampered  {sid}  at event {seq} (Hash)")),
        "{text}"
    );
    assert!(text.contains(&format!("ok        {second}")), "{text}");
}

#[test]
fn keys_from_the_environment_are_not_written_and_verify_needs_them() {
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let keys = format!("ops-1:{},ops-2:{}", "a1".repeat(32), "b2".repeat(32));
    let mut server = start_server(&data, &script, Some(&keys));
    let sid = server.new_session(2, &cwd);
    let frames = park_and_wake(&mut server, &sid, 3);
    let receipts = agent_event(&frames, "suspension_receipt");
    assert_eq!(
        receipts[0]["signature"]["key_id"], "ops-2",
        "the last key signs"
    );
    server.stop();
    assert!(
        !data.join("receipt-keys.json").exists(),
        "keys from the environment are never written to disk"
    );
    let out = berth(&["verify"], &data, None);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(ENV_KEYS));
    let (code, report) = verify_json(&data, Some(&keys));
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["sessions"][0]["status"], "ok");
    // The wrong secret under the same id: every receipt fails.
    let wrong = format!("ops-2:{}", "c3".repeat(32));
    let (code, report) = verify_json(&data, Some(&wrong));
    assert_eq!(code, Some(2), "{report:#}");
    assert_eq!(report["sessions"][0]["firstBad"]["check"], "signature");
}

/// Runs `prompt`, suspends with `mode` while its gated call runs, releases the
/// call with `release`; returns the frames, the prompt's turn id and the
/// handle.
fn suspend_mid_turn(
    server: &mut Server,
    sid: &str,
    cwd: &Path,
    (prompt, mode, release): (&str, &str, &str),
    first_id: u64,
) -> (Vec<Value>, Value, String) {
    server.send(
        first_id,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": prompt}]}),
    );
    let mut frames = server.until_note(|n| n["params"]["update"]["sessionUpdate"] == "tool_call");
    server.send(
        first_id + 1,
        "session/suspend",
        json!({"sessionId": sid, "mode": mode}),
    );
    frames.extend(server.until_note(|n| n["params"]["type"] == "suspend_requested"));
    std::fs::write(cwd.join(release), "").unwrap();
    let (notes, answered) = server.until(first_id);
    frames.extend(notes);
    let (notes, suspended) = server.until(first_id + 1);
    frames.extend(notes);
    let handle = suspended["result"]["handle"].as_str().unwrap().to_owned();
    (
        frames,
        answered["result"]["_meta"]["berth"]["turnId"].clone(),
        handle,
    )
}

/// The drain receipt of the suspend request `handle`.
fn parked_drain<'a>(frames: &'a [Value], handle: &str) -> &'a Value {
    agent_event(frames, "drain_decision_receipt")
        .into_iter()
        .find(|d| d["item"]["kind"] == "suspend_request" && d["item"]["handle"] == handle)
        .unwrap_or_else(|| panic!("no drain receipt for {handle}"))
}

#[test]
fn each_suspend_mode_journals_the_seam_it_was_drained_at() {
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let mut server = start_server(&data, &script, None);
    let sid = server.new_session(2, &cwd);

    // interrupt_immediate: A settles, B stays unstarted — parked before the
    // next tool dispatch.
    let (frames, turn_id, handle) = suspend_mid_turn(
        &mut server,
        &sid,
        &cwd,
        ("one batch", "interrupt_immediate", "release-b"),
        3,
    );
    let drain = parked_drain(&frames, &handle);
    assert_eq!(drain["seam"], "pre_tool_dispatch", "{drain}");
    assert_eq!(drain["item"]["mode"], "interrupt_immediate");
    assert_eq!(drain["turn_id"], turn_id);
    server.send(
        5,
        "session/resume",
        json!({"sessionId": sid, "handle": handle}),
    );
    server.until(5);
    server.until_note(|n| n["params"]["type"] == "turn_ended");

    // wait_for_completion: the turn finishes, then parks after its loop.
    let (frames, turn_id, handle) = suspend_mid_turn(
        &mut server,
        &sid,
        &cwd,
        ("two steps", "wait_for_completion", "release-a"),
        6,
    );
    let drain = parked_drain(&frames, &handle);
    assert_eq!(drain["seam"], "loop_exit", "{drain}");
    assert_eq!(drain["item"]["mode"], "wait_for_completion");
    assert_eq!(drain["turn_id"], turn_id);
    let receipt = agent_event(&frames, "suspension_receipt");
    assert_eq!(receipt[0]["handle"], handle);
    assert!(
        receipt[0].get("turn_id").is_none(),
        "the session parked idle"
    );
    server.stop();
    let (code, report) = verify_json(&data, None);
    assert_eq!(code, Some(0), "{report:#}");
}

#[test]
fn a_woken_resume_signs_the_trigger_that_fired_it() {
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let mut server = start_server(&data, &script, None);
    let sid = server.new_session(2, &cwd);
    // An event wakes it: the receipt names the event and its journal seq,
    // and hashes the payload it was fed.
    server.send(
        3,
        "session/suspend",
        json!({"sessionId": sid, "resumeWhen": {"onEvent": "ci.passed"}}),
    );
    let handle = server.until(3).1["result"]["handle"].clone();
    server.send(
        4,
        "_berth/event.emit",
        json!({"name": "ci.passed", "data": {"sha": "abc", "checks": 3}}),
    );
    let frames = server.until_note(|n| n["params"]["type"] == "resumption_receipt");
    // The woken turn may end before the emit is answered: wait for both.
    server.until_note(|n| n["params"]["type"] == "turn_ended");
    server.until(4);
    let receipt = agent_event(&frames, "resumption_receipt")[0].clone();
    assert_eq!(receipt["handle"], handle);
    assert_eq!(receipt["cause"], "external_event");
    assert_eq!(receipt["actor"], "event:ci.passed");
    assert_eq!(receipt["trigger"]["kind"], "event");
    assert_eq!(receipt["trigger"]["name"], "ci.passed");
    assert_eq!(receipt["trigger"]["seq"], 1);
    assert_eq!(
        receipt["input_sha256"],
        format!("sha256:{}", sha256_hex(br#"{"checks":3,"sha":"abc"}"#))
    );
    // A timeout wakes it: the receipt names the due time and the action.
    server.send(
        5,
        "session/suspend",
        json!({"sessionId": sid, "resumeWhen": {"timeout": {"durationMinutes": 0.001}}}),
    );
    let handle = server.until(5).1["result"]["handle"].clone();
    let frames = server.until_note(|n| n["params"]["type"] == "resumption_receipt");
    let receipt = agent_event(&frames, "resumption_receipt")[0].clone();
    assert_eq!(receipt["handle"], handle);
    assert_eq!(receipt["cause"], "timeout");
    assert_eq!(receipt["trigger"]["kind"], "timeout");
    assert_eq!(receipt["trigger"]["on_timeout"], "resume_with_summary");
    assert!(receipt["trigger"]["due_at"].is_string());
    assert!(receipt["lateness_ms"].is_u64());
    assert!(receipt["input_sha256"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    server.until_note(|n| n["params"]["type"] == "turn_ended");
    server.stop();
    let (code, report) = verify_json(&data, None);
    assert_eq!(code, Some(0), "{report:#}");
}

const EVENTS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("events");

/// Flips one bit of the first event of `session` whose row contains
/// `marker`, at the first `needle` after the marker; returns its seq.
fn flip_in_event(journal: &Path, session: &str, marker: &str, needle: &str) -> u64 {
    let db = redb::Database::create(journal).unwrap();
    let txn = db.begin_write().unwrap();
    let seq;
    {
        let mut events = txn.open_table(EVENTS).unwrap();
        let found = events
            .range((session, 0)..=(session, u64::MAX))
            .unwrap()
            .map(Result::unwrap)
            .find(|(_, v)| contains(v.value(), marker.as_bytes()))
            .map(|(k, v)| (k.value().1, v.value().to_vec()))
            .expect("an event with the marker");
        seq = found.0;
        let mut bytes = found.1;
        let from = find(&bytes, marker.as_bytes()).unwrap();
        let at = from + find(&bytes[from..], needle.as_bytes()).unwrap() + needle.len();
        bytes[at] ^= 0x01;
        events.insert((session, seq), bytes.as_slice()).unwrap();
    }
    txn.commit().unwrap();
    seq
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle).is_some()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `verify`, `replay` and `keys list` on a data dir that does not exist
/// name the dir, not a key file inside it, and exit 1.
#[test]
fn a_missing_data_dir_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nowhere");
    for args in [&["verify"][..], &["replay", "sess_x"], &["keys", "list"]] {
        let out = berth(args, &missing, None);
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {text}");
        assert!(
            text.contains(&format!("no data dir at {}", missing.display())),
            "{args:?}: {text}"
        );
    }
    assert!(!missing.exists(), "nothing was created");
}
