//! SIGKILL the group-commit writer mid-stream and check that every append it
//! acknowledged survives, with no gaps and nothing half-written.
//!
//! The test re-runs its own binary as the child (`BERTH_KILL_CHILD_DIR` set):
//! the child appends from many concurrent sessions and prints `ack <session>
//! <event id>` only after `commit` returned; the parent kills it with SIGKILL
//! while appends are in flight and then reopens the journal.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::ids::SessionId;
use berth_storage::{Batch, Journal, JournalOptions};

const SESSIONS: usize = 16;

fn record(text: String) -> EventRecord {
    EventRecord {
        at: chrono::DateTime::from_timestamp_millis(0).unwrap_or_default(),
        event: SessionEvent::AgentMessageChunk { text },
    }
}

/// The child half; a no-op unless run by `acked_appends_survive_sigkill`.
#[test]
fn kill_child() {
    let Ok(dir) = std::env::var("BERTH_KILL_CHILD_DIR") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let journal = Journal::open(
            &std::path::Path::new(&dir).join("journal.redb"),
            JournalOptions::default(),
        )
        .unwrap();
        let mut tasks = Vec::new();
        for s in 0..SESSIONS {
            let journal = journal.clone();
            tasks.push(tokio::spawn(async move {
                let sid = SessionId(format!("sess_{s}"));
                for n in 0u64.. {
                    let ids = journal
                        .commit(Batch::new().append(&sid, &record(format!("{s}:{n}"))))
                        .await
                        .unwrap();
                    println!("ack {} {}", sid, ids[0]);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

#[test]
fn acked_appends_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "kill_child", "--nocapture", "--test-threads=1"])
        .env("BERTH_KILL_CHILD_DIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut acked: std::collections::HashMap<String, u64> = Default::default();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = 0;
    while seen < 2000 {
        let line = lines.next().expect("child ended early").unwrap();
        let mut parts = line.split_whitespace();
        if parts.next() != Some("ack") {
            continue;
        }
        let (sid, id) = (
            parts.next().unwrap().to_owned(),
            parts.next().unwrap().parse::<u64>().unwrap(),
        );
        let max = acked.entry(sid).or_default();
        *max = (*max).max(id);
        seen += 1;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Acks printed after our last read but before the kill are durable too;
    // read them so the check is against everything acknowledged.
    for line in lines.map_while(Result::ok) {
        let mut parts = line.split_whitespace();
        if parts.next() == Some("ack") {
            let (sid, id) = (
                parts.next().unwrap().to_owned(),
                parts.next().unwrap().parse::<u64>().unwrap(),
            );
            let max = acked.entry(sid).or_default();
            *max = (*max).max(id);
        }
    }
    child.wait().unwrap();

    let journal =
        Journal::open(&dir.path().join("journal.redb"), JournalOptions::default()).unwrap();
    for (sid, max_acked) in &acked {
        let sid = SessionId(sid.clone());
        let events = journal.events(&sid, 0).unwrap();
        let last = journal.last_event_id(&sid).unwrap();
        // No gaps, ids 1..=last, each event intact and in order.
        for (i, (id, rec)) in events.iter().enumerate() {
            assert_eq!(*id, i as u64 + 1);
            let SessionEvent::AgentMessageChunk { text } = &rec.event else {
                panic!("wrong event")
            };
            assert_eq!(text, &format!("{}:{}", &sid.as_str()[5..], i));
        }
        // Everything acked is there; at most the one in-flight append beyond it.
        assert!(
            last >= *max_acked,
            "{sid}: acked {max_acked} but only {last} survived"
        );
        assert!(
            last <= max_acked + 1,
            "{sid}: {last} present but only {max_acked} acked, one in flight at most"
        );
    }
    assert!(
        acked.len() > 1,
        "appends from several sessions were in flight"
    );
}
