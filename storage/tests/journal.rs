//! Journal behaviour: atomic batches, event id assignment, reads.

use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::history::Message;
use berth_runtime::ids::{SessionId, TurnId};
use berth_storage::{Batch, Journal, JournalOptions, OpenTurn, SessionRecord};

fn at() -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(1_700_000_000_000).unwrap()
}

fn chunk(text: &str) -> EventRecord {
    EventRecord::new(at(), SessionEvent::AgentMessageChunk { text: text.into() })
}

fn session(id: &str) -> SessionRecord {
    SessionRecord {
        session_id: SessionId::from(id),
        cwd: "/tmp".into(),
        additional_directories: vec![],
        mcp_servers: vec![],
        mode_id: "default".into(),
        title: None,
        created_at: at(),
        updated_at: at(),
        closed_at: None,
        checkpoint_head: 0,
        parent_session_id: None,
        context_from: 0,
        suspend_request: None,
        created_by: None,
        labels: vec![],
        spend: Default::default(),
        budget_grant: Default::default(),
    }
}

#[tokio::test]
async fn event_ids_are_per_session_and_contiguous() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(&dir.path().join("j.redb"), JournalOptions::default()).unwrap();
    let (a, b) = (SessionId::from("a"), SessionId::from("b"));
    let ids = j
        .commit(
            Batch::new()
                .append(&a, &chunk("1"))
                .append(&b, &chunk("x"))
                .append(&a, &chunk("2")),
        )
        .await
        .unwrap();
    assert_eq!(ids, vec![1, 1, 2]);
    let ids = j
        .commit(Batch::new().append(&a, &chunk("3")))
        .await
        .unwrap();
    assert_eq!(ids, vec![3]);
    assert_eq!(j.last_event_id(&a).unwrap(), 3);
    assert_eq!(j.last_event_id(&SessionId::from("none")).unwrap(), 0);
    let after_one: Vec<u64> = j
        .events(&a, 1)
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(after_one, vec![2, 3]);
}

#[tokio::test]
async fn concurrent_commits_all_land_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.redb");
    {
        let j = Journal::open(&path, JournalOptions::default()).unwrap();
        let mut tasks = Vec::new();
        for s in 0..20 {
            let j = j.clone();
            tasks.push(tokio::spawn(async move {
                let sid = SessionId(format!("s{s}"));
                j.commit(Batch::new().put_session(&session(sid.as_str())))
                    .await
                    .unwrap();
                for n in 0..25 {
                    j.commit(Batch::new().append(&sid, &chunk(&n.to_string())))
                        .await
                        .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    let j = Journal::open(
        &path,
        JournalOptions {
            quick_repair: true,
            ..JournalOptions::default()
        },
    )
    .unwrap();
    assert_eq!(j.sessions(None, 100).unwrap().len(), 20);
    let page = j.sessions(Some(&SessionId::from("s1")), 3).unwrap();
    assert_eq!(
        page.iter()
            .map(|s| s.session_id.as_str())
            .collect::<Vec<_>>(),
        vec!["s10", "s11", "s12"]
    );
    for s in 0..20 {
        assert_eq!(j.last_event_id(&SessionId(format!("s{s}"))).unwrap(), 25);
    }
}

#[tokio::test]
async fn turn_markers_frames_and_transcripts() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(&dir.path().join("j.redb"), JournalOptions::default()).unwrap();
    let sid = SessionId::from("s");
    let open = OpenTurn {
        session_id: sid.clone(),
        turn_id: TurnId::from("turn_1"),
        started_at: at(),
        prompt_text: "hi".into(),
    };
    j.commit(Batch::new().open_turn(&open)).await.unwrap();
    assert_eq!(j.open_turns().unwrap(), vec![open.clone()]);
    assert_eq!(j.open_turn(&sid).unwrap(), Some(open));
    let msgs = vec![Message::User { text: "hi".into() }];
    j.commit(
        Batch::new()
            .close_turn(&sid)
            .append_transcript(&sid, 0, &msgs)
            .delete_frame(&sid),
    )
    .await
    .unwrap();
    assert!(j.open_turns().unwrap().is_empty());
    assert_eq!(j.transcript(&sid).unwrap(), msgs);
    let more = vec![Message::User {
        text: "again".into(),
    }];
    j.commit(Batch::new().append_transcript(&sid, 1, &more))
        .await
        .unwrap();
    assert_eq!(j.transcript(&sid).unwrap(), [msgs, more].concat());
    assert_eq!(j.transcript_len(&sid).unwrap(), 2);
    assert_eq!(j.transcript_len(&SessionId::from("none")).unwrap(), 0);
    assert!(j.frame(&sid).unwrap().is_none());
    assert!(j.commit(Batch::new()).await.unwrap().is_empty());
}

#[test]
fn a_second_process_cannot_open_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.redb");
    let _first = Journal::open(&path, JournalOptions::default()).unwrap();
    let err = Journal::open(&path, JournalOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("another process holds it"),
        "{err}"
    );
}

#[tokio::test]
async fn fenced_batches_land_only_while_their_turn_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(&dir.path().join("j.redb"), JournalOptions::default()).unwrap();
    let sid = SessionId::from("s");
    let turn = TurnId::from("turn_1");
    let fenced = |text: &str| {
        Batch::new()
            .fenced_by_turn(&sid, &turn)
            .append(&sid, &chunk(text))
    };
    // No open turn: refused, nothing written.
    let err = j.commit(fenced("early")).await.unwrap_err();
    assert!(
        matches!(err, berth_storage::StorageError::Fenced { .. }),
        "{err}"
    );
    assert_eq!(j.last_event_id(&sid).unwrap(), 0);
    let open = OpenTurn {
        session_id: sid.clone(),
        turn_id: turn.clone(),
        started_at: at(),
        prompt_text: String::new(),
    };
    j.commit(Batch::new().open_turn(&open)).await.unwrap();
    assert_eq!(j.commit(fenced("during")).await.unwrap(), vec![1]);
    j.commit(Batch::new().close_turn(&sid)).await.unwrap();
    assert!(j.commit(fenced("late")).await.is_err());
    // A refused batch in a group does not take the others down with it.
    let other = SessionId::from("t");
    let (a, b) = tokio::join!(
        j.commit(fenced("late again")),
        j.commit(Batch::new().append(&other, &chunk("ok")))
    );
    assert!(a.is_err());
    assert_eq!(b.unwrap(), vec![1]);
    assert_eq!(j.last_event_id(&sid).unwrap(), 1);
}

/// A held turn start merged into the turn's first (fenced) write: the
/// fence is satisfied by the batch itself, which opens that turn; a fence
/// on any other turn still holds.
#[tokio::test]
async fn a_batch_that_opens_a_turn_carries_that_turns_fenced_write() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(&dir.path().join("j.redb"), JournalOptions::default()).unwrap();
    let sid = SessionId::from("s");
    let open = |turn: &str| OpenTurn {
        session_id: sid.clone(),
        turn_id: TurnId::from(turn),
        started_at: at(),
        prompt_text: String::new(),
    };
    let fenced = |turn: &str, text: &str| {
        Batch::new()
            .fenced_by_turn(&sid, &TurnId::from(turn))
            .append(&sid, &chunk(text))
    };
    let start = |turn: &str| {
        Batch::new()
            .open_turn(&open(turn))
            .append(&sid, &chunk("started"))
    };
    // Fenced by another turn than the one the start opens: refused whole.
    let err = j
        .commit(start("turn_1").merge(fenced("turn_0", "stale")))
        .await
        .unwrap_err();
    assert!(
        matches!(err, berth_storage::StorageError::Fenced { .. }),
        "{err}"
    );
    assert_eq!(j.last_event_id(&sid).unwrap(), 0);
    assert!(j.open_turn(&sid).unwrap().is_none());
    // Fenced by the turn it opens: lands, start first.
    let ids = j
        .commit(start("turn_1").merge(fenced("turn_1", "first write")))
        .await
        .unwrap();
    assert_eq!(ids, vec![1, 2]);
    assert_eq!(j.open_turn(&sid).unwrap().unwrap().turn_id.0, "turn_1");
    // Merged the other way round the fence is checked before the open.
    assert!(j
        .commit(fenced("turn_2", "early").merge(start("turn_2")))
        .await
        .is_err());
}

/// Commits session `sid` with one event (`chunk("a")`).
async fn first_write(journal: &Journal, sid: &SessionId) {
    journal
        .commit(
            Batch::new()
                .put_session(&session(sid.as_str()))
                .append(sid, &chunk("a")),
        )
        .await
        .unwrap();
}

/// `flush_log` answers once the redb file holds every acknowledged write
/// and the commit log is empty (its file truncated).
#[tokio::test]
async fn flush_log_leaves_nothing_to_replay() {
    let dir = tempfile::tempdir().unwrap();
    let journal =
        Journal::open(&dir.path().join("journal.redb"), JournalOptions::default()).unwrap();
    let sid = SessionId::from("s");
    first_write(&journal, &sid).await;
    let log = dir.path().join("journal.log");
    let first_header = || std::fs::read(&log).unwrap()[..16].to_vec();
    assert_ne!(first_header(), [0; 16], "the commit is in the log");
    journal.flush_log().await.unwrap();
    assert_eq!(
        std::fs::metadata(&log).unwrap().len(),
        0,
        "the log is empty"
    );
    assert_eq!(journal.events(&sid, 0).unwrap().len(), 1);
}

/// A log deleted after a clean stop held nothing: the journal opens
/// without it (whole) and makes a new one. After `flush_log` the journal
/// keeps working, and a write after it is in the log again.
#[tokio::test]
async fn a_log_missing_after_a_clean_stop_is_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.redb");
    let log = dir.path().join("journal.log");
    let sid = SessionId::from("s");
    let journal = Journal::open(&path, JournalOptions::default()).unwrap();
    first_write(&journal, &sid).await;
    journal.flush_log().await.unwrap();
    journal
        .commit(Batch::new().append(&sid, &chunk("b")))
        .await
        .unwrap();
    assert_ne!(
        std::fs::read(&log).unwrap()[..16],
        [0; 16],
        "a write after flush_log is in the log"
    );
    drop(journal); // the writer's last checkpoint, then a clean stop
    std::fs::remove_file(&log).unwrap();

    let journal = Journal::open(&path, JournalOptions::default()).unwrap();
    assert_eq!(journal.events(&sid, 0).unwrap().len(), 2);
    assert!(log.is_file(), "the log is made again");
}
