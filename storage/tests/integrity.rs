//! Signed receipts, the keyring and the hash chain, checked through the
//! journal as a later process sees it: a receipt signed before a reopen
//! verifies after it, and every edit of the redb file made behind berth's
//! back (a flipped byte, a dropped event, two events swapped, a re-hashed
//! forgery) is reported by `verify_journal` at the event it touched.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use berth_runtime::event::{ControlOutcome, ControlStatus, EventRecord, SessionEvent};
use berth_runtime::ids::SessionId;
use berth_runtime::receipt::{DrainAction, DrainDecisionReceipt, DrainedItem};
use berth_runtime::steering::Seam;
use berth_storage::verify::{verify_journal, Check, Verdict, VerifyReport};
use berth_storage::{Batch, Journal, JournalOptions, Keyring, KeyringError, StorageError};
use redb::{ReadableTable, TableDefinition};
use serde_json::{json, Value};

const EVENTS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("events");

fn at(ms: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(1_700_000_000_000 + ms).unwrap()
}

fn chunk(text: &str) -> EventRecord {
    EventRecord::new(at(0), SessionEvent::AgentMessageChunk { text: text.into() })
}

fn outcome(session: &str, n: i64) -> ControlOutcome {
    ControlOutcome {
        session_id: session.into(),
        control_id: format!("ctl_{n}"),
        method: "session/inject".into(),
        outcome: "accepted".into(),
        status: ControlStatus::Accepted,
        actor: "acp:stdio:1".into(),
        target: json!({"sessionId": session, "messageId": format!("msg_{n}")}),
        reason: None,
        metadata: Value::Null,
        decided_at: at(n),
    }
}

fn signed_outcome(journal: &Journal, session: &str, n: i64) -> EventRecord {
    EventRecord::new(
        at(n),
        SessionEvent::ControlOutcome(journal.keyring().sign(outcome(session, n))),
    )
}

fn drain(journal: &Journal, session: &str, n: i64) -> EventRecord {
    EventRecord::new(
        at(n),
        SessionEvent::DrainDecisionReceipt(journal.keyring().sign(DrainDecisionReceipt {
            session_id: SessionId::from(session),
            turn_id: None,
            item: DrainedItem::Injection {
                message_id: format!("msg_{n}"),
                mode: None,
            },
            seam: Some(Seam::PostToolDispatch),
            action: DrainAction::Delivered,
            reason: None,
            decided_at: at(n),
        })),
    )
}

fn open(dir: &Path) -> Journal {
    Journal::open(&dir.join("journal.redb"), JournalOptions::default()).unwrap()
}

/// Session `a`: chunk, receipt, chunk, drain receipt, chunk (events 1–5) in
/// two commits; session `b`: two events. Returns the journal path.
async fn populate(dir: &Path) -> PathBuf {
    let j = open(dir);
    let (a, b) = (SessionId::from("a"), SessionId::from("b"));
    j.commit(
        Batch::new()
            .append(&a, &chunk("one"))
            .append(&a, &signed_outcome(&j, "a", 2))
            .append(&b, &chunk("b-one")),
    )
    .await
    .unwrap();
    j.commit(
        Batch::new()
            .append(&a, &chunk("three"))
            .append(&a, &drain(&j, "a", 4))
            .append(&b, &signed_outcome(&j, "b", 2))
            .append(&a, &chunk("five")),
    )
    .await
    .unwrap();
    dir.join("journal.redb")
}

fn keys(dir: &Path) -> Keyring {
    Keyring::load(dir).unwrap()
}

fn verify(dir: &Path) -> VerifyReport {
    verify_journal(&dir.join("journal.redb"), &keys(dir)).unwrap()
}

/// The first bad event of session `a`: (seq, check).
fn first_bad_of_a(report: &VerifyReport) -> (u64, Check) {
    let a = report
        .sessions
        .iter()
        .find(|s| s.session_id == "a")
        .unwrap();
    assert_eq!(a.status, Verdict::Tampered, "{report:#?}");
    let bad = a.first_bad.clone().unwrap();
    (bad.seq, bad.check)
}

/// Rewrites the raw events table of a closed journal.
fn edit(path: &Path, change: impl FnOnce(&mut redb::Table<(&str, u64), &[u8]>)) {
    let db = redb::Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut events = txn.open_table(EVENTS).unwrap();
        change(&mut events);
    }
    txn.commit().unwrap();
}

fn row(events: &redb::Table<(&str, u64), &[u8]>, session: &str, seq: u64) -> Vec<u8> {
    events
        .get((session, seq))
        .unwrap()
        .unwrap()
        .value()
        .to_vec()
}

/// Flips one byte of the JSON of event `seq` of `a`, at the first occurrence
/// of `needle` (so the JSON stays decodable and only its meaning changes).
fn flip(path: &Path, seq: u64, needle: &str) {
    edit(path, |events| {
        let mut bytes = row(events, "a", seq);
        let at = bytes
            .windows(needle.len())
            .position(|w| w == needle.as_bytes())
            .expect("needle in row");
        bytes[at] ^= 0x01;
        events.insert(("a", seq), bytes.as_slice()).unwrap();
    });
}

#[tokio::test]
async fn a_receipt_signed_before_a_reopen_verifies_after_it() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path()).await;
    // A second open (a later process: nothing but the files carries over)
    // reads the key file and verifies what the first one signed.
    let j = open(dir.path());
    let events = j.events(&SessionId::from("a"), 0).unwrap();
    assert_eq!(events.len(), 5);
    let SessionEvent::ControlOutcome(signed) = &events[1].1.event else {
        panic!("event 2 is the receipt: {:?}", events[1]);
    };
    assert_eq!(signed.signature.key_id, "k1");
    j.keyring().verify(signed).unwrap();
    let SessionEvent::DrainDecisionReceipt(signed) = &events[3].1.event else {
        panic!("event 4 is the drain receipt");
    };
    j.keyring().verify(signed).unwrap();
    // The chain goes on across the reopen.
    j.commit(Batch::new().append(&SessionId::from("a"), &chunk("six")))
        .await
        .unwrap();
    drop(j);
    let report = verify(dir.path());
    assert!(report.is_ok(), "{report:#?}");
    assert_eq!(report.sessions.len(), 2);
    let a = &report.sessions[0];
    assert_eq!((a.events, a.receipts), (6, 2));
    assert_eq!(
        (report.sessions[1].events, report.sessions[1].receipts),
        (2, 1)
    );
}

#[tokio::test]
async fn the_key_file_is_created_0600_and_a_readable_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    let file = dir.path().join("receipt-keys.json");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let first = keys(dir.path());
    // Stable across loads (the same secret: it signs identically).
    let again = keys(dir.path());
    let r = first.sign(outcome("a", 1));
    again.verify(&r).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(matches!(
        Keyring::load(dir.path()),
        Err(KeyringError::Permissions { mode: 0o644, .. })
    ));
    let err =
        Journal::open(&dir.path().join("journal.redb"), JournalOptions::default()).unwrap_err();
    assert!(err.to_string().contains("chmod 600"), "{err}");
}

#[tokio::test]
async fn rotation_signs_with_the_new_key_and_old_receipts_still_verify() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path()).await;
    let rotated = Keyring::rotate(dir.path(), at(0)).unwrap();
    assert_eq!(rotated.active_key_id(), "k2");
    assert_eq!(rotated.keys().len(), 2);
    let mode = std::fs::metadata(dir.path().join("receipt-keys.json"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "a rotated key file stays 0600");
    let j = open(dir.path());
    let new = signed_outcome(&j, "a", 9);
    let SessionEvent::ControlOutcome(signed) = &new.event else {
        unreachable!()
    };
    assert_eq!(signed.signature.key_id, "k2");
    j.commit(Batch::new().append(&SessionId::from("a"), &new))
        .await
        .unwrap();
    drop(j);
    let report = verify(dir.path());
    assert!(report.is_ok(), "{report:#?}");
    assert_eq!(report.keys, vec!["k1", "k2"]);
    // Without the old key, the old receipts no longer verify.
    let only_new = Keyring::parse(&format!("k2:{}", "00".repeat(32))).unwrap();
    let report = verify_journal(&dir.path().join("journal.redb"), &only_new).unwrap();
    assert!(!report.is_ok());
}

#[tokio::test]
async fn a_flipped_byte_in_a_plain_event_is_reported_at_that_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = populate(dir.path()).await;
    flip(&path, 3, "three");
    assert_eq!(first_bad_of_a(&verify(dir.path())), (3, Check::Hash));
    // The other session is untouched.
    let report = verify(dir.path());
    assert_eq!(report.sessions[1].status, Verdict::Ok);
    assert_eq!((report.ok, report.tampered), (1, 1));
}

#[tokio::test]
async fn a_flipped_byte_in_a_receipt_is_reported_at_that_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let path = populate(dir.path()).await;
    // The chain header of the drain receipt (event 4), one bit off.
    edit(&path, |events| {
        let mut bytes = row(events, "a", 4);
        bytes[5] ^= 0x80;
        events.insert(("a", 4), bytes.as_slice()).unwrap();
    });
    assert_eq!(first_bad_of_a(&verify(dir.path())), (4, Check::Hash));
    // The control_outcome's signed `decided_at` (event 2), one bit off.
    flip(&path, 2, "\"decided_at\":\"2023-11-14T22:13:20.002Z");
    assert_eq!(first_bad_of_a(&verify(dir.path())), (2, Check::Hash));
}

#[tokio::test]
async fn a_receipt_edited_and_rehashed_without_the_key_fails_its_signature() {
    let dir = tempfile::tempdir().unwrap();
    let path = populate(dir.path()).await;
    // The forger rewrites receipt 2 (rejected instead of accepted) and
    // recomputes the row hash and the next row's link: the chain holds, the
    // signature does not.
    edit(&path, |events| {
        let old = row(events, "a", 2);
        let mut record: Value = serde_json::from_slice(&old[65..]).unwrap();
        record["event"]["status"] = json!("rejected");
        let json = serde_json::to_vec(&record).unwrap();
        let hash = rehash("a", 2, &old[1..33], &json);
        let mut forged = vec![1u8];
        forged.extend_from_slice(&old[1..33]);
        forged.extend_from_slice(&hash);
        forged.extend_from_slice(&json);
        events.insert(("a", 2), forged.as_slice()).unwrap();
        let mut next = row(events, "a", 3);
        next[1..33].copy_from_slice(&hash);
        let next_hash = rehash("a", 3, &next[1..33], &next[65..]);
        next[33..65].copy_from_slice(&next_hash);
        events.insert(("a", 3), next.as_slice()).unwrap();
    });
    let report = verify(dir.path());
    assert_eq!(first_bad_of_a(&report), (2, Check::Signature));
    let a = &report.sessions[0];
    assert!(a
        .first_bad
        .as_ref()
        .unwrap()
        .message
        .contains("MAC mismatch"));
}

/// The row hash as `chain.rs` defines it (a forger can compute it: it needs
/// no key).
fn rehash(session: &str, seq: u64, prev: &[u8], json: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"berth.event.v1\0");
    h.update((session.len() as u64).to_be_bytes());
    h.update(session.as_bytes());
    h.update(seq.to_be_bytes());
    h.update(prev);
    h.update(json);
    h.finalize().into()
}

#[tokio::test]
async fn a_dropped_event_is_reported_where_it_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let path = populate(dir.path()).await;
    edit(&path, |events| {
        events.remove(("a", 3)).unwrap();
    });
    assert_eq!(first_bad_of_a(&verify(dir.path())), (3, Check::Sequence));
}

#[tokio::test]
async fn a_dropped_last_event_is_caught_by_the_signed_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = populate(dir.path()).await;
    edit(&path, |events| {
        events.remove(("a", 5)).unwrap();
    });
    assert_eq!(first_bad_of_a(&verify(dir.path())), (5, Check::Sequence));
    // Appending after the drop does not launder it: the writer chains from
    // the signed head, not from the shortened tail.
    let j = open(dir.path());
    j.commit(Batch::new().append(&SessionId::from("a"), &chunk("after")))
        .await
        .unwrap();
    drop(j);
    assert_eq!(first_bad_of_a(&verify(dir.path())).0, 5);
}

#[tokio::test]
async fn two_swapped_events_are_reported_at_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = populate(dir.path()).await;
    edit(&path, |events| {
        let (three, four) = (row(events, "a", 3), row(events, "a", 4));
        events.insert(("a", 3), four.as_slice()).unwrap();
        events.insert(("a", 4), three.as_slice()).unwrap();
    });
    assert_eq!(first_bad_of_a(&verify(dir.path())), (3, Check::Hash));
}

#[tokio::test]
async fn a_log_rehashed_end_to_end_without_the_key_fails_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = populate(dir.path()).await;
    // Rewrite chunk 5's text and re-hash it: every row is self-consistent,
    // only the keyed head knows better.
    edit(&path, |events| {
        let old = row(events, "a", 5);
        let json = String::from_utf8(old[65..].to_vec())
            .unwrap()
            .replace("five", "FIVE");
        let hash = rehash("a", 5, &old[1..33], json.as_bytes());
        let mut forged = old[..33].to_vec();
        forged.extend_from_slice(&hash);
        forged.extend_from_slice(json.as_bytes());
        events.insert(("a", 5), forged.as_slice()).unwrap();
    });
    assert_eq!(first_bad_of_a(&verify(dir.path())), (5, Check::Head));
}

#[tokio::test]
async fn verify_refuses_a_journal_a_process_holds_and_reads_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path()).await;
    let j = open(dir.path());
    match verify_journal(&dir.path().join("journal.redb"), &keys(dir.path())) {
        Err(StorageError::Open { message, .. }) => {
            assert!(message.contains("stop `berth serve`"), "{message}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    drop(j);
    assert!(matches!(
        verify_journal(&dir.path().join("nothing.redb"), &keys(dir.path())),
        Err(StorageError::Open { .. })
    ));
}

#[tokio::test]
async fn a_journal_from_before_hash_chains_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.redb");
    {
        // A format-1 journal: rows of plain JSON, no format_version.
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut events = txn.open_table(EVENTS).unwrap();
            let json = serde_json::to_vec(&chunk("old")).unwrap();
            events.insert(("a", 1), json.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let err = Journal::open(&path, JournalOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::Format {
                found: None,
                expected: berth_storage::JOURNAL_FORMAT,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("predates hash chains"), "{err}");
}

#[tokio::test]
async fn every_row_carries_the_previous_rows_hash() {
    let dir = tempfile::tempdir().unwrap();
    let path = populate(dir.path()).await;
    let db = redb::Database::create(&path).unwrap();
    let txn = db.begin_write().unwrap();
    let events = txn.open_table(EVENTS).unwrap();
    let mut prev = [0u8; 32].to_vec();
    for seq in 1..=5 {
        let bytes = row(&events, "a", seq);
        assert_eq!(bytes[0], 1, "row version");
        assert_eq!(
            &bytes[1..33],
            prev.as_slice(),
            "event {seq} links to {}",
            seq - 1
        );
        assert_eq!(
            bytes[33..65],
            rehash("a", seq, &bytes[1..33], &bytes[65..]),
            "event {seq} hash"
        );
        prev = bytes[33..65].to_vec();
    }
    let _ = events.iter().unwrap().count();
}
