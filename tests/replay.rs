//! `berth replay` through the real binary: a session steered and self-parked
//! over stdio, the server stopped, then `berth replay SESSION --verify
//! --json` → every run reproduced (exit 0); the journaled resume input
//! edited in the redb file → `berth replay` exits 3 naming the resumption
//! receipt whose input hash check failed, `--verify` exits 2.

use std::path::Path;
use std::process::Output;

use redb::{ReadableTable, TableDefinition};

mod common;
use common::{cli, serve_command, workspace, StdioServer as Server, ENV_KEYS};
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

/// `berth serve` with the data dir's own key file.
fn start_server(data: &Path, script: &Path) -> Server {
    let mut command = serve_command(data, script);
    command.env_remove(ENV_KEYS);
    Server::start(command)
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
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let mut server = start_server(&data, &script);
    let sid = server.new_session(2, &cwd);
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "park yourself"}]}),
    );
    // While the check runs: a steer, delivered after it settles.
    server.until_note(|f| f["params"]["update"]["status"] == "in_progress");
    server.send(
        4,
        "session/inject",
        json!({"sessionId": sid, "mode": "steer", "content": "prefer the smaller path"}),
    );
    server.until(4);
    std::fs::write(cwd.join("release"), "").unwrap();
    let parked = server.until(3).1;
    assert_eq!(
        parked["result"]["_meta"]["berth"]["terminal"]["kind"], "suspended",
        "{parked}"
    );
    server.send(
        5,
        "session/resume",
        json!({"sessionId": sid, "input": {"window": "tonight", "ok": true}}),
    );
    server.until(5);
    server.until_note(|f| f["params"]["type"] == "turn_ended");
    server.stop();

    let out = cli(&["replay", &sid, "--verify", "--json"], &data);
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
    let out = cli(&["replay", &sid], &data);
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

    let out = cli(&["replay", &sid, "--json"], &data);
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
    let out = cli(&["replay", &sid], &data);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("non-determinism at event"),
        "{}",
        text(&out)
    );
    // `--verify` refuses the tampered log instead.
    let out = cli(&["replay", &sid, "--verify"], &data);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("tampered at event {edited}")),
        "{}",
        text(&out)
    );
    // An unknown session.
    let out = cli(&["replay", "sess_nope"], &data);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("not in the journal"), "{}", text(&out));
}

/// SIGKILL mid-turn: every input the turn had consumed before the kill was
/// durable with the events that depend on it, so after a restart (which
/// seals the turn) `berth replay` reproduces everything up to the crash and
/// stops there, saying so.
#[test]
fn a_sigkill_mid_turn_replays_up_to_the_crash() {
    let (_dir, data, cwd, script) = workspace(SCRIPT);
    let mut server = start_server(&data, &script);
    let sid = server.new_session(2, &cwd);
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "the smaller one"}]}),
    );
    server.until(3);
    server.send(
        4,
        "session/resume",
        json!({"sessionId": sid, "input": "go"}),
    );
    server.until(4);
    server.until_note(|f| f["params"]["type"] == "turn_ended");
    // A second turn, killed while its command runs.
    server.send(
        5,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "park yourself"}]}),
    );
    server.until_note(|f| f["params"]["update"]["status"] == "in_progress");
    server.kill();
    // Before any restart the log ends inside the killed turn: everything
    // in it replays, and the report says the log ends there.
    let out = cli(&["replay", &sid, "--verify", "--json"], &data);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let cut = &report["cutShort"];
    assert_eq!(cut["cause"], "log_ends", "{report}");
    assert_eq!(
        cut["seq"].as_u64().unwrap(),
        report["events"].as_u64().unwrap() + 1,
        "past the last event: {report}"
    );
    let out = cli(&["replay", &sid], &data);
    assert!(
        text(&out).contains("stopped   at the end of the log"),
        "{}",
        text(&out)
    );
    // The restart seals the killed turn (process_restarted).
    start_server(&data, &script).stop();

    let out = cli(&["replay", &sid, "--verify", "--json"], &data);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{report}");
    let cut = &report["cutShort"];
    assert_eq!(cut["cause"], "recovered", "{report}");
    assert!(
        cut["seq"].as_u64().unwrap() > runs[1]["lastSeq"].as_u64().unwrap(),
        "{report}"
    );
    let out = cli(&["replay", &sid], &data);
    assert!(text(&out).contains("stopped   at event"), "{}", text(&out));
}

/// A transcript row (what the session reloads as model context) edited in
/// the redb file: `berth verify` and `berth replay --verify` both exit 2
/// naming the row, where before the edit both were ok.
#[test]
fn an_edited_transcript_row_is_tampered_for_verify_and_replay() {
    const ANSWER: &str = r#"
[[rules]]
match = "hello"
steps = [{ text = "MARKER answer to keep" }]
"#;
    let (_dir, data, cwd, script) = workspace(ANSWER);
    let mut server = start_server(&data, &script);
    let sid = server.new_session(2, &cwd);
    server.send(
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}),
    );
    server.until(3);
    server.stop();
    let out = cli(&["verify"], &data);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = cli(&["replay", &sid, "--verify"], &data);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    const TRANSCRIPTS: TableDefinition<(&str, u64), &[u8]> =
        TableDefinition::new("transcript_messages");
    let db = redb::Database::create(data.join("journal.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    let mut edited = None;
    {
        let mut table = txn.open_table(TRANSCRIPTS).unwrap();
        let rows: Vec<(u64, Vec<u8>)> = table
            .range((sid.as_str(), 0)..=(sid.as_str(), u64::MAX))
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                (k.value().1, v.value().to_vec())
            })
            .collect();
        for (index, mut row) in rows {
            if let Some(at) = row.windows(6).position(|w| w == b"MARKER") {
                row[at] ^= 0x01;
                table.insert((sid.as_str(), index), row.as_slice()).unwrap();
                edited = Some(index);
            }
        }
    }
    txn.commit().unwrap();
    drop(db);
    let edited = edited.expect("the answer is in the transcript");
    let row = format!("row transcript_messages/{sid}/{edited}");

    let out = cli(&["verify"], &data);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains(&row), "{}", text(&out));
    let out = cli(&["replay", &sid, "--verify"], &data);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains(&row), "{}", text(&out));

    // A berth started on it does not feed the edited transcript to a model.
    let mut server = start_server(&data, &script);
    server.send(
        2,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}),
    );
    let answer = server.until(2).1;
    let reason = answer["error"]["data"]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains(&format!("transcript_messages/{sid}/{edited}"))
            && reason.contains("does not match its seal")
            && !reason.contains("panicked"),
        "{answer}"
    );
    server.stop();
}
