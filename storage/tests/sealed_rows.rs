//! The rows a session reloads into a model's context — transcript,
//! checkpoints, the open turn's frame, a parked turn's suspension (its frame)
//! and the open-turn marker (its prompt) — are covered by the journal's
//! integrity check: one byte of any of them edited behind berth's back is
//! `tampered` in `verify_journal` and `verify_session`, naming the row, and
//! a read through the `Journal` refuses the row instead of returning it.
//! A journal of the format before sealed rows is sealed when opened.

use std::path::{Path, PathBuf};

use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::frame::{Accounting, Frame, Phase, FRAME_VERSION};
use berth_runtime::history::Message;
use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::suspension::{Initiator, SuspendMode, Suspension};
use berth_storage::verify::{verify_journal, verify_session, Check, Verdict, VerifyReport};
use berth_storage::{
    Batch, Journal, JournalOptions, Keyring, OpenTurn, StorageError, TurnCheckpoint,
};
use redb::{ReadableTable, TableDefinition};

const INDEXED: [&str; 2] = ["transcript_messages", "checkpoints"];
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

fn at(ms: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(1_700_000_000_000 + ms).unwrap()
}

fn frame(session: &str, text: &str) -> Frame {
    Frame {
        version: FRAME_VERSION,
        session_id: SessionId::from(session),
        turn_id: TurnId::from("turn_1"),
        phase: Phase::Provider,
        iteration: 1,
        accounting: Accounting::default(),
        tool_outcomes: vec![],
        unstarted_calls: vec![],
        turn_messages: vec![Message::User { text: text.into() }],
        history_fingerprint: "00".into(),
        config_fingerprint: "11".into(),
        dispatch_skipped: false,
        skip_reason: None,
        resume_notes: Vec::new(),
        file_changes: Vec::new(),
    }
}

/// Session `a`: two events, a transcript of two messages, checkpoint 1, a
/// frame, an open turn; session `p`: parked with a suspension carrying a
/// frame. Each row's text holds a marker to flip.
async fn populate(dir: &Path) -> PathBuf {
    let path = dir.join("journal.redb");
    let j = Journal::open(&path, JournalOptions::default()).unwrap();
    let (a, p) = (SessionId::from("a"), SessionId::from("p"));
    let chunk =
        |text: &str| EventRecord::new(at(0), SessionEvent::AgentMessageChunk { text: text.into() });
    j.commit(
        Batch::new()
            .append(&a, &chunk("one"))
            .append(&a, &chunk("two"))
            .append(&p, &chunk("parked"))
            .append_transcript(
                &a,
                0,
                &[
                    Message::User {
                        text: "MARK-transcript-0".into(),
                    },
                    Message::User {
                        text: "MARK-transcript-1".into(),
                    },
                ],
            )
            .put_checkpoint(
                &a,
                1,
                &TurnCheckpoint {
                    checkpoint_id: "turn_0".into(),
                    before_message_count: 0,
                    after_message_count: 2,
                    messages: vec![Message::User {
                        text: "MARK-checkpoint".into(),
                    }],
                    files: vec![],
                },
            )
            .put_frame(&frame("a", "MARK-frame"))
            .open_turn(&OpenTurn {
                session_id: a.clone(),
                turn_id: TurnId::from("turn_1"),
                started_at: at(1),
                prompt_text: "MARK-open".into(),
            })
            .put_suspension(&Suspension {
                handle: "susp_1".into(),
                session_id: p.clone(),
                reason: None,
                initiator: Initiator::Agent,
                actor: "agent".into(),
                mode: SuspendMode::FinishStep,
                resume_when: None,
                summary: None,
                suspended_at: at(2),
                frame: Some(frame("p", "MARK-suspension")),
                turn_id: Some(TurnId::from("turn_1")),
                parent_session_id: None,
                span_links: vec![],
            }),
    )
    .await
    .unwrap();
    path
}

/// Flips one byte (the `K` of `MARK`) of row `key` of `table`, leaving its
/// JSON decodable.
fn flip(path: &Path, table: &str, session: &str, index: Option<u64>) {
    let flip_bytes = |mut bytes: Vec<u8>| {
        let at = bytes
            .windows(4)
            .position(|w| w == b"MARK")
            .expect("the marker in the row");
        bytes[at + 3] ^= 0x01;
        bytes
    };
    let db = redb::Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    match index {
        Some(i) => {
            let mut t = txn
                .open_table(TableDefinition::<(&str, u64), &[u8]>::new(table))
                .unwrap();
            let bytes = t.get((session, i)).unwrap().unwrap().value().to_vec();
            t.insert((session, i), flip_bytes(bytes).as_slice())
                .unwrap();
        }
        None => {
            let mut t = txn
                .open_table(TableDefinition::<&str, &[u8]>::new(table))
                .unwrap();
            let bytes = t.get(session).unwrap().unwrap().value().to_vec();
            t.insert(session, flip_bytes(bytes).as_slice()).unwrap();
        }
    }
    drop(txn.commit());
}

fn verify(dir: &Path) -> VerifyReport {
    verify_journal(&dir.join("journal.redb"), &Keyring::load(dir).unwrap()).unwrap()
}

/// The row one read through the journal returns or refuses.
fn read(j: &Journal, table: &str, session: &str, index: Option<u64>) -> Result<(), StorageError> {
    let sid = SessionId::from(session);
    match table {
        "transcript_messages" => j.transcript(&sid).map(drop),
        "checkpoints" => j.checkpoint(&sid, index.unwrap()).map(drop),
        "frames" => j.frame(&sid).map(drop),
        "suspensions" => j.suspension(&sid).map(drop),
        "open_turns" => j.open_turn(&sid).map(drop),
        other => panic!("no reader for {other}"),
    }
}

#[tokio::test]
async fn an_edited_byte_in_any_context_row_is_tampered_and_refused_on_read() {
    let rows: [(&str, &str, Option<u64>); 6] = [
        ("transcript_messages", "a", Some(1)),
        ("transcript_messages", "a", Some(0)),
        ("checkpoints", "a", Some(1)),
        ("frames", "a", None),
        ("open_turns", "a", None),
        ("suspensions", "p", None),
    ];
    for (table, session, index) in rows {
        assert_eq!(INDEXED.contains(&table), index.is_some());
        let dir = tempfile::tempdir().unwrap();
        let path = populate(dir.path()).await;
        let before = verify(dir.path());
        assert!(before.is_ok(), "{before:#?}");
        flip(&path, table, session, index);

        let name = match index {
            Some(i) => format!("{table}/{session}/{i}"),
            None => format!("{table}/{session}"),
        };
        let report = verify(dir.path());
        let s = report
            .sessions
            .iter()
            .find(|s| s.session_id == session)
            .unwrap();
        assert_eq!(s.status, Verdict::Tampered, "{name}: {report:#?}");
        let bad = s.first_bad.clone().unwrap();
        assert_eq!(bad.check, Check::Seal, "{name}");
        assert_eq!(bad.row.as_deref(), Some(name.as_str()));
        assert!(
            bad.message.contains("edited outside berth"),
            "{}",
            bad.message
        );
        // The other session is untouched.
        assert_eq!(report.tampered, 1, "{name}: {report:#?}");
        let one = verify_session(&path, &Keyring::load(dir.path()).unwrap(), session).unwrap();
        assert_eq!(one.status, Verdict::Tampered, "{name}");
        assert_eq!(one.first_bad.unwrap().row.as_deref(), Some(name.as_str()));

        let j = Journal::open(&path, JournalOptions::default()).unwrap();
        match read(&j, table, session, index) {
            Err(StorageError::Corrupt {
                table: t,
                key,
                message,
            }) => {
                assert_eq!(t, table);
                assert_eq!(format!("{t}/{key}"), name);
                assert!(message.contains("edited outside berth"), "{message}");
            }
            other => panic!("{name}: expected the row refused, got {other:?}"),
        }
    }
}

/// A journal stamped with the format before sealed rows (its rows plain
/// JSON) is read by `verify` as not covered, and sealed as it is when a
/// berth opens it: then it verifies, and an edit after that is caught.
#[tokio::test]
async fn a_journal_of_the_unsealed_format_is_sealed_when_opened() {
    let dir = tempfile::tempdir().unwrap();
    let path = populate(dir.path()).await;
    // Make it what a format-3 berth leaves: rows without seals.
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        for table in INDEXED {
            let mut t = txn
                .open_table(TableDefinition::<(&str, u64), &[u8]>::new(table))
                .unwrap();
            let rows: Vec<((String, u64), Vec<u8>)> = t
                .iter()
                .unwrap()
                .map(|e| {
                    let (k, v) = e.unwrap();
                    let (s, i) = k.value();
                    ((s.to_owned(), i), unsealed(v.value()))
                })
                .collect();
            for ((s, i), v) in rows {
                t.insert((s.as_str(), i), v.as_slice()).unwrap();
            }
        }
        for table in ["frames", "suspensions", "open_turns"] {
            let mut t = txn
                .open_table(TableDefinition::<&str, &[u8]>::new(table))
                .unwrap();
            let rows: Vec<(String, Vec<u8>)> = t
                .iter()
                .unwrap()
                .map(|e| {
                    let (k, v) = e.unwrap();
                    (k.value().to_owned(), unsealed(v.value()))
                })
                .collect();
            for (s, v) in rows {
                t.insert(s.as_str(), v.as_slice()).unwrap();
            }
        }
        txn.open_table(META)
            .unwrap()
            .insert("format_version", 3)
            .unwrap();
        txn.commit().unwrap();
    }
    let old = verify(dir.path());
    assert!(old.is_ok(), "{old:#?}");
    assert_eq!((old.format, old.rows_covered), (3, false));

    let j = Journal::open(&path, JournalOptions::default()).unwrap();
    assert_eq!(j.transcript(&SessionId::from("a")).unwrap().len(), 2);
    assert!(j.suspension(&SessionId::from("p")).unwrap().is_some());
    drop(j);
    let sealed = verify(dir.path());
    assert!(sealed.is_ok(), "{sealed:#?}");
    assert_eq!(
        (sealed.format, sealed.rows_covered),
        (berth_storage::JOURNAL_FORMAT, true)
    );
    flip(&path, "frames", "a", None);
    assert_eq!(verify(dir.path()).tampered, 1);
}

/// A row's JSON without its seal.
fn unsealed(row: &[u8]) -> Vec<u8> {
    // [version] [key id length] [key id] [32-byte tag] [value]: the tag may
    // hold any byte, so the value is found by the header's lengths.
    let at = 2 + usize::from(row[1]) + 32;
    row[at..].to_vec()
}
