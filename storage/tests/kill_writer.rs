//! SIGKILL the group-commit writer mid-stream and check that every append it
//! acknowledged survives, with no gaps and nothing half-written.
//!
//! The test re-runs its own binary as the child (`BERTH_KILL_CHILD_DIR` set):
//! the child appends from many concurrent sessions and prints `ack <session>
//! <event id>` only after `commit` returned; the parent kills it with SIGKILL
//! while appends are in flight and then reopens the journal.
//!
//! `claims_survive_sigkill_once_each` does the same with suspend/resume rounds
//! whose resumes race on one handle (`BERTH_KILL_CLAIM_DIR`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::ids::SessionId;
use berth_runtime::suspension::{Initiator, ResumeClaim, ResumeClaimKind, SuspendMode, Suspension};
use berth_storage::{Batch, Journal, JournalOptions, StorageError};

const SESSIONS: usize = 16;

fn record(text: String) -> EventRecord {
    EventRecord::new(
        chrono::DateTime::from_timestamp_millis(0).unwrap_or_default(),
        SessionEvent::AgentMessageChunk { text },
    )
}

/// In a child run of this binary with `var` set to a data dir: opens the
/// journal there and runs `body` on it (a no-op in a normal test run).
fn child_journal<F, Fut>(var: &str, body: F)
where
    F: FnOnce(Journal) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Ok(dir) = std::env::var(var) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let journal = Journal::open(
            &std::path::Path::new(&dir).join("journal.redb"),
            JournalOptions::default(),
        )
        .unwrap();
        body(journal).await;
    });
}

/// Re-runs this test binary as the child test `name`, with `var` = `dir`,
/// its stdout piped.
fn spawn_child(name: &str, var: &str, dir: &std::path::Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(var, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn sigkill(child: &std::process::Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

/// The child half; a no-op unless run by `acked_appends_survive_sigkill`.
#[test]
fn kill_child() {
    child_journal("BERTH_KILL_CHILD_DIR", |journal| async move {
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
    let mut child = spawn_child("kill_child", "BERTH_KILL_CHILD_DIR", dir.path());
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
    sigkill(&child);
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

    // The hash chains and their signed heads commit with the events: after
    // the SIGKILL every session still verifies, from the file as the killed
    // process left it (`verify_journal` repairs a copy, never the original).
    let keys = berth_storage::Keyring::load(dir.path()).unwrap();
    let report =
        berth_storage::verify::verify_journal(&dir.path().join("journal.redb"), &keys).unwrap();
    assert!(report.is_ok(), "{report:#?}");
    assert!(report.sessions.len() >= acked.len(), "{report:#?}");

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

/// Sessions suspending and resuming concurrently in the claim child.
const CLAIM_SESSIONS: usize = 4;
/// Resumes racing for each handle.
const CONTENDERS: usize = 8;

fn parked(sid: &SessionId, handle: &str) -> Suspension {
    Suspension {
        handle: handle.to_owned(),
        session_id: sid.clone(),
        reason: None,
        initiator: Initiator::Client,
        actor: "client".into(),
        mode: SuspendMode::FinishStep,
        resume_when: None,
        summary: None,
        suspended_at: chrono::DateTime::from_timestamp_millis(0).unwrap_or_default(),
        frame: None,
        turn_id: None,
        parent_session_id: None,
        span_links: vec![],
    }
}

/// The child half of `claims_survive_sigkill_once_each`: each session loops
/// suspend (row + `suspended <h>` event), then `CONTENDERS` concurrent resumes
/// of `<h>`, each a batch claim + delete row + `resumed <h> <actor>` event.
/// Prints `won <session> <h> <actor>` after a resume's commit returned.
#[test]
fn claim_child() {
    child_journal("BERTH_KILL_CLAIM_DIR", |journal| async move {
        let mut sessions = Vec::new();
        for s in 0..CLAIM_SESSIONS {
            let journal = journal.clone();
            sessions.push(tokio::spawn(async move {
                let sid = SessionId(format!("sess_{s}"));
                for n in 0u64.. {
                    let handle = format!("susp_{s}_{n}");
                    journal
                        .commit(
                            Batch::new()
                                .put_suspension(&parked(&sid, &handle))
                                .append(&sid, &record(format!("suspended {handle}"))),
                        )
                        .await
                        .unwrap();
                    let contenders: Vec<_> = (0..CONTENDERS)
                        .map(|c| {
                            let (journal, sid, handle) =
                                (journal.clone(), sid.clone(), handle.clone());
                            tokio::spawn(async move {
                                let actor = format!("c{c}");
                                let claim = ResumeClaim {
                                    handle: handle.clone(),
                                    session_id: sid.clone(),
                                    kind: ResumeClaimKind::Resumed,
                                    cause: None,
                                    actor: actor.clone(),
                                    claimed_at: chrono::DateTime::from_timestamp_millis(0)
                                        .unwrap_or_default(),
                                };
                                let result = journal
                                    .commit(
                                        Batch::new().claim(&claim).delete_suspension(&sid).append(
                                            &sid,
                                            &record(format!("resumed {handle} {actor}")),
                                        ),
                                    )
                                    .await;
                                match result {
                                    Ok(_) => {
                                        println!("won {sid} {handle} {actor}");
                                        true
                                    }
                                    Err(StorageError::AlreadyClaimed { .. }) => false,
                                    Err(e) => panic!("{e}"),
                                }
                            })
                        })
                        .collect();
                    let mut wins = 0;
                    for c in contenders {
                        wins += usize::from(c.await.unwrap());
                    }
                    assert_eq!(wins, 1, "{handle}");
                }
            }));
        }
        for s in sessions {
            s.await.unwrap();
        }
    });
}

#[test]
fn claims_survive_sigkill_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn_child("claim_child", "BERTH_KILL_CLAIM_DIR", dir.path());
    // handle -> (session, winning actor), as acknowledged by the child.
    let mut won: std::collections::HashMap<String, (String, String)> = Default::default();
    let mut record_win = |line: &str| {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if let ["won", sid, handle, actor] = parts[..] {
            let previous = won.insert(handle.to_owned(), (sid.to_owned(), actor.to_owned()));
            assert!(previous.is_none(), "{handle} acknowledged twice");
        }
    };
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = 0;
    while seen < 400 {
        let line = lines.next().expect("child ended early").unwrap();
        if line.starts_with("won ") {
            record_win(&line);
            seen += 1;
        }
    }
    sigkill(&child);
    for line in lines.map_while(Result::ok) {
        record_win(&line);
    }
    child.wait().unwrap();

    let journal =
        Journal::open(&dir.path().join("journal.redb"), JournalOptions::default()).unwrap();
    // Every acknowledged resume holds its claim.
    for (handle, (_, actor)) in &won {
        let claim = journal.resume_claim(handle).unwrap();
        assert_eq!(claim.map(|c| c.actor), Some(actor.clone()), "{handle}");
    }
    for s in 0..CLAIM_SESSIONS {
        let sid = SessionId(format!("sess_{s}"));
        let texts: Vec<String> = journal
            .events(&sid, 0)
            .unwrap()
            .into_iter()
            .map(|(_, rec)| match rec.event {
                SessionEvent::AgentMessageChunk { text } => text,
                _ => panic!("wrong event"),
            })
            .collect();
        // The log alternates suspended/resumed, one resume per handle, and each
        // resume event matches the stored claim (they committed together).
        for (n, pair) in texts.chunks(2).enumerate() {
            let handle = format!("susp_{s}_{n}");
            assert_eq!(pair[0], format!("suspended {handle}"));
            match pair.get(1) {
                Some(resumed) => {
                    let claim = journal.resume_claim(&handle).unwrap().expect("claim");
                    assert_eq!(resumed, &format!("resumed {handle} {}", claim.actor));
                }
                // Killed between suspend and resume: still parked, unclaimed.
                None => {
                    assert_eq!(
                        journal.suspension(&sid).unwrap().map(|p| p.handle),
                        Some(handle.clone())
                    );
                    assert!(journal.resume_claim(&handle).unwrap().is_none());
                }
            }
        }
        if texts.len().is_multiple_of(2) {
            // Last round resumed (or none began): no row, next handle unclaimed.
            assert!(journal.suspension(&sid).unwrap().is_none(), "{sid}");
            let next = format!("susp_{s}_{}", texts.len() / 2);
            assert!(journal.resume_claim(&next).unwrap().is_none(), "{next}");
        }
    }
    assert!(
        won.values()
            .map(|(sid, _)| sid)
            .collect::<std::collections::HashSet<_>>()
            .len()
            > 1,
        "resumes from several sessions were in flight"
    );
}

/// The child half of the missing-log tests: commits, then (with `flush`)
/// empties the log as a stopping server does and commits once more, says
/// so, then idles (the writer checkpoints after `IDLE_CHECKPOINT`).
fn idle_child(var: &str, flush: bool) {
    child_journal(var, |journal| async move {
        let sid = SessionId::from("sess_idle");
        for n in 0..50 {
            if flush && n == 49 {
                journal.flush_log().await.unwrap();
            }
            journal
                .commit(Batch::new().append(&sid, &record(format!("idle {n}"))))
                .await
                .unwrap();
        }
        println!("acked");
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    });
}

/// The child half of `a_log_deleted_after_a_crash_is_refused`.
#[test]
fn idle_child_plain() {
    idle_child("BERTH_KILL_IDLE_DIR", false);
}

/// The child half of `a_log_deleted_after_a_flush_and_a_crash_is_refused`.
#[test]
fn idle_child_flushed() {
    idle_child("BERTH_KILL_FLUSH_DIR", true);
}

/// Runs `child` on a fresh dir until it has acknowledged its 50 commits;
/// once `wait_for_checkpoint`, also until its writer has emptied the log.
/// Then SIGKILLs it and deletes `journal.log`; returns the dir.
fn kill_and_delete_log(child: &str, var: &str, wait_for_checkpoint: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("journal.log");
    let mut child = spawn_child(child, var, dir.path());
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // The harness prints `test <name> ... ` on the same line first.
    while !lines
        .next()
        .expect("child ended early")
        .unwrap()
        .ends_with("acked")
    {}
    // The log is emptied by zeroing its first record's header.
    let first_header = || std::fs::read(&log).unwrap()[..16].to_vec();
    if wait_for_checkpoint {
        assert_ne!(first_header(), [0; 16], "acked groups are in the log");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while first_header() != [0; 16] {
            assert!(
                std::time::Instant::now() < deadline,
                "the idle writer never emptied its log"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    sigkill(&child);
    child.wait().unwrap();
    std::fs::remove_file(&log).unwrap();
    dir
}

/// Opening (and verifying) a journal whose commit log was deleted after a
/// crash is refused as corrupt (table `commit_log`), whether or not the log
/// still held groups: the file alone knew. An empty `journal.log` put back
/// accepts the loss; here the writer had checkpointed before the kill, so
/// nothing was lost and all 50 events are there.
#[test]
fn a_log_deleted_after_a_crash_is_refused() {
    let dir = kill_and_delete_log("idle_child_plain", "BERTH_KILL_IDLE_DIR", true);
    let path = dir.path().join("journal.redb");
    let refused = |what: &str, e: StorageError| {
        assert!(
            matches!(
                &e,
                StorageError::Corrupt {
                    table: "commit_log",
                    ..
                }
            ),
            "{what}: {e:?}"
        );
        assert!(e.to_string().contains("create it empty"), "{what}: {e}");
    };
    let keys = berth_storage::Keyring::load(dir.path()).unwrap();
    refused(
        "verify",
        berth_storage::verify::verify_journal(&path, &keys).unwrap_err(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        refused(
            "open",
            Journal::open(&path, JournalOptions::default()).unwrap_err(),
        );
        assert!(
            !dir.path().join("journal.log").exists(),
            "a refused open creates nothing"
        );
        // A symlink to nothing in its place is as missing.
        let gone = dir.path().join("gone.log");
        std::os::unix::fs::symlink(&gone, dir.path().join("journal.log")).unwrap();
        refused(
            "open through a dangling link",
            Journal::open(&path, JournalOptions::default()).unwrap_err(),
        );
        refused(
            "verify through a dangling link",
            berth_storage::verify::verify_journal(&path, &keys).unwrap_err(),
        );
        assert!(!gone.exists(), "a refused open creates nothing");
        std::fs::remove_file(dir.path().join("journal.log")).unwrap();
        std::fs::write(dir.path().join("journal.log"), b"").unwrap();
        let journal = Journal::open(&path, JournalOptions::default()).unwrap();
        let events = journal.events(&SessionId::from("sess_idle"), 0).unwrap();
        assert_eq!(events.len(), 50);
    });
}

/// A write after `flush_log` (which records a clean stop) marks the log in
/// use again before it is written: killed with that write only in the log,
/// the journal without its log is refused, not opened one event short.
#[test]
fn a_log_deleted_after_a_flush_and_a_crash_is_refused() {
    let dir = kill_and_delete_log("idle_child_flushed", "BERTH_KILL_FLUSH_DIR", false);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let e =
            Journal::open(&dir.path().join("journal.redb"), JournalOptions::default()).unwrap_err();
        assert!(
            matches!(
                &e,
                StorageError::Corrupt {
                    table: "commit_log",
                    ..
                }
            ),
            "{e:?}"
        );
    });
}

/// A log given up on after a crash (deleted, `journal.log` created empty)
/// and put back later holds records the journal never applied: they are
/// not replayed on top of what the journal did since, though their
/// sequence numbers would follow its own (each open numbers its records
/// from far past the last one's).
#[test]
fn a_stale_log_put_back_after_its_loss_was_accepted_is_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.redb");
    let log = dir.path().join("journal.log");
    let mut child = spawn_child("kill_child", "BERTH_KILL_CHILD_DIR", dir.path());
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Never idle: the acknowledged groups are only in the log.
    let mut acked = 0;
    while acked < 500 {
        if lines
            .next()
            .expect("child ended early")
            .unwrap()
            .starts_with("ack ")
        {
            acked += 1;
        }
    }
    sigkill(&child);
    child.wait().unwrap();
    let stale = std::fs::read(&log).unwrap();
    std::fs::write(&log, b"").unwrap(); // the loss accepted

    let sessions: Vec<SessionId> = (0..SESSIONS)
        .map(|s| SessionId(format!("sess_{s}")))
        .collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let kept = rt.block_on(async {
        let journal = Journal::open(&path, JournalOptions::default()).unwrap();
        let kept: Vec<u64> = sessions
            .iter()
            .map(|sid| journal.last_event_id(sid).unwrap())
            .collect();
        let fresh = SessionId::from("sess_after");
        journal
            .commit(Batch::new().append(&fresh, &record("after".into())))
            .await
            .unwrap();
        kept
    }); // dropped: a clean stop
    assert!(
        kept.iter().sum::<u64>() < acked,
        "the test needs acknowledged groups that were only in the log"
    );
    std::fs::write(&log, &stale).unwrap();
    rt.block_on(async {
        let journal = Journal::open(&path, JournalOptions::default()).unwrap();
        for (sid, kept) in sessions.iter().zip(&kept) {
            assert_eq!(journal.last_event_id(sid).unwrap(), *kept, "{sid}");
        }
        let fresh = journal.events(&SessionId::from("sess_after"), 0).unwrap();
        assert_eq!(fresh.len(), 1);
    });
    let keys = berth_storage::Keyring::load(dir.path()).unwrap();
    let report = berth_storage::verify::verify_journal(&path, &keys).unwrap();
    assert!(report.is_ok(), "{report:#?}");
}
