//! Suspension rows and one-time resume claims: round trips, the claim that
//! wins once and only once (also under 100 concurrent commits), claims combined
//! with turn fences, and survival across reopen.

use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::frame::{Accounting, Frame, Phase, FRAME_VERSION};
use berth_runtime::history::Message;
use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::suspension::{
    Initiator, ResumeCause, ResumeClaim, ResumeClaimKind, ResumeConditions, ResumeTimeout,
    SpanLink, SuspendMode, Suspension,
};
use berth_storage::{Batch, Journal, JournalOptions, OpenTurn, StorageError};

fn at(ms: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(1_700_000_000_000 + ms).unwrap()
}

fn chunk(text: &str) -> EventRecord {
    EventRecord::new(at(0), SessionEvent::AgentMessageChunk { text: text.into() })
}

fn texts(j: &Journal, sid: &SessionId) -> Vec<String> {
    j.events(sid, 0)
        .unwrap()
        .into_iter()
        .map(|(_, rec)| match rec.event {
            SessionEvent::AgentMessageChunk { text } => text,
            other => panic!("unexpected event {other:?}"),
        })
        .collect()
}

/// A parked session with every optional part filled, so the round trip
/// covers the whole envelope.
fn parked(session: &str, handle: &str) -> Suspension {
    let sid = SessionId::from(session);
    let turn = TurnId::from("turn_1");
    Suspension {
        handle: handle.into(),
        session_id: sid.clone(),
        reason: Some("waiting for CI".into()),
        initiator: Initiator::Agent,
        actor: "agent".into(),
        mode: SuspendMode::FinishStep,
        resume_when: Some(ResumeConditions {
            on_event: Some("ci.passed".into()),
            trigger: None,
            timeout: Some(ResumeTimeout {
                duration_minutes: 0.5,
                on_timeout: Default::default(),
                input: None,
            }),
        }),
        summary: Some("half done".into()),
        suspended_at: at(1),
        frame: Some(Frame {
            version: FRAME_VERSION,
            session_id: sid,
            turn_id: turn.clone(),
            phase: Phase::Provider,
            iteration: 2,
            accounting: Accounting::default(),
            tool_outcomes: vec![],
            unstarted_calls: vec![],
            turn_messages: vec![Message::User { text: "go".into() }],
            history_fingerprint: "00".into(),
            config_fingerprint: "11".into(),
            dispatch_skipped: false,
            skip_reason: None,
            resume_notes: Vec::new(),
            file_changes: Vec::new(),
        }),
        turn_id: Some(turn),
        parent_session_id: Some(SessionId::from("parent")),
        span_links: vec![SpanLink {
            trace_id: "0".repeat(32),
            span_id: "1".repeat(16),
        }],
    }
}

fn claim(session: &str, handle: &str, actor: &str) -> ResumeClaim {
    ResumeClaim {
        handle: handle.into(),
        session_id: SessionId::from(session),
        kind: ResumeClaimKind::Resumed,
        cause: Some(ResumeCause::ExplicitResume),
        actor: actor.into(),
        claimed_at: at(2),
    }
}

fn open(dir: &tempfile::TempDir) -> Journal {
    Journal::open(&dir.path().join("j.redb"), JournalOptions::default()).unwrap()
}

#[tokio::test]
async fn suspension_rows_round_trip_one_per_session_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir);
    let (a, b) = (SessionId::from("a"), SessionId::from("b"));
    assert!(j.suspension(&a).unwrap().is_none());
    assert!(j.suspensions().unwrap().is_empty());

    let first = parked("a", "susp_a1");
    j.commit(
        Batch::new()
            .put_suspension(&first)
            .put_suspension(&parked("b", "susp_b1")),
    )
    .await
    .unwrap();
    assert_eq!(j.suspension(&a).unwrap(), Some(first));

    // A second suspension of the same session replaces the first.
    let mut second = parked("a", "susp_a2");
    second.frame = None;
    second.turn_id = None;
    j.commit(Batch::new().put_suspension(&second))
        .await
        .unwrap();
    assert_eq!(j.suspension(&a).unwrap(), Some(second.clone()));
    assert_eq!(
        j.suspensions()
            .unwrap()
            .iter()
            .map(|s| s.handle.as_str())
            .collect::<Vec<_>>(),
        vec!["susp_a2", "susp_b1"]
    );

    j.commit(Batch::new().delete_suspension(&b)).await.unwrap();
    assert!(j.suspension(&b).unwrap().is_none());
    assert_eq!(j.suspensions().unwrap(), vec![second]);
    // Deleting what is not there is not an error.
    j.commit(Batch::new().delete_suspension(&b)).await.unwrap();
}

#[tokio::test]
async fn the_first_claim_commits_with_the_rest_of_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir);
    let sid = SessionId::from("s");
    j.commit(Batch::new().put_suspension(&parked("s", "susp_1")))
        .await
        .unwrap();
    assert!(j.resume_claim("susp_1").unwrap().is_none());

    let won = claim("s", "susp_1", "alice");
    let ids = j
        .commit(
            Batch::new()
                .claim(&won)
                .delete_suspension(&sid)
                .append(&sid, &chunk("resumed")),
        )
        .await
        .unwrap();
    assert_eq!(ids, vec![1]);
    assert_eq!(j.resume_claim("susp_1").unwrap(), Some(won));
    assert!(j.suspension(&sid).unwrap().is_none());
    assert_eq!(texts(&j, &sid), vec!["resumed"]);
}

#[tokio::test]
async fn a_claim_alone_is_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir);
    let cancelled = ResumeClaim {
        kind: ResumeClaimKind::Cancelled,
        cause: None,
        ..claim("s", "susp_1", "closer")
    };
    let batch = Batch::new().claim(&cancelled);
    assert!(!batch.is_empty());
    assert!(j.commit(batch).await.unwrap().is_empty());
    assert_eq!(j.resume_claim("susp_1").unwrap(), Some(cancelled));
}

#[tokio::test]
async fn a_second_claim_is_refused_with_the_first_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir);
    let sid = SessionId::from("s");
    let suspension = parked("s", "susp_1");
    j.commit(Batch::new().put_suspension(&suspension))
        .await
        .unwrap();
    let first = claim("s", "susp_1", "alice");
    j.commit(
        Batch::new()
            .claim(&first)
            .append(&sid, &chunk("alice resumed")),
    )
    .await
    .unwrap();

    let err = j
        .commit(
            Batch::new()
                .claim(&claim("s", "susp_1", "bob"))
                .append(&sid, &chunk("bob resumed"))
                .delete_suspension(&sid),
        )
        .await
        .unwrap_err();
    match &err {
        StorageError::AlreadyClaimed { handle, existing } => {
            assert_eq!(handle, "susp_1");
            assert_eq!(**existing, first);
        }
        other => panic!("expected AlreadyClaimed, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("susp_1") && message.contains("already resumed by alice"),
        "{message}"
    );
    // Nothing of bob's batch landed.
    assert_eq!(texts(&j, &sid), vec!["alice resumed"]);
    assert_eq!(j.suspension(&sid).unwrap(), Some(suspension));
    assert_eq!(j.resume_claim("susp_1").unwrap(), Some(first));
    // Another handle is unaffected.
    j.commit(Batch::new().claim(&claim("s", "susp_2", "bob")))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_a_hundred_concurrent_claims_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir);
    let sid = SessionId::from("s");
    j.commit(Batch::new().put_suspension(&parked("s", "susp_1")))
        .await
        .unwrap();

    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(100));
    let tasks: Vec<_> = (0..100)
        .map(|n| {
            let (j, sid, barrier) = (j.clone(), sid.clone(), barrier.clone());
            tokio::spawn(async move {
                let actor = format!("c{n}");
                barrier.wait().await;
                let result = j
                    .commit(
                        Batch::new()
                            .claim(&claim("s", "susp_1", &actor))
                            .delete_suspension(&sid)
                            .append(&sid, &chunk(&format!("resumed by {actor}"))),
                    )
                    .await;
                (actor, result)
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            (actor, Ok(ids)) => winners.push((actor, ids)),
            (_, Err(StorageError::AlreadyClaimed { existing, .. })) => losers.push(existing),
            (actor, Err(other)) => panic!("{actor}: unexpected {other}"),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(losers.len(), 99);
    let (winner, ids) = &winners[0];
    assert_eq!(ids, &vec![1]);
    let stored = j.resume_claim("susp_1").unwrap().unwrap();
    assert_eq!(&stored.actor, winner);
    assert!(losers.iter().all(|existing| **existing == stored));
    assert_eq!(texts(&j, &sid), vec![format!("resumed by {winner}")]);
    assert!(j.suspension(&sid).unwrap().is_none());
}

#[tokio::test]
async fn a_claim_and_a_fence_must_both_hold() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir);
    let sid = SessionId::from("s");
    let turn = TurnId::from("turn_1");
    let attempt = |actor: &str, handle: &str| {
        Batch::new()
            .fenced_by_turn(&sid, &turn)
            .claim(&claim("s", handle, actor))
            .append(&sid, &chunk(actor))
    };

    // Fence fails, claim free: refused as Fenced, and the claim is not taken.
    let err = j.commit(attempt("early", "susp_1")).await.unwrap_err();
    assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
    assert!(j.resume_claim("susp_1").unwrap().is_none());

    j.commit(Batch::new().open_turn(&OpenTurn {
        session_id: sid.clone(),
        turn_id: turn.clone(),
        started_at: at(0),
        prompt_text: String::new(),
    }))
    .await
    .unwrap();
    // Both hold: lands.
    assert_eq!(j.commit(attempt("first", "susp_1")).await.unwrap(), vec![1]);
    // Fence holds, claim taken: refused as AlreadyClaimed.
    let err = j.commit(attempt("second", "susp_1")).await.unwrap_err();
    assert!(
        matches!(&err, StorageError::AlreadyClaimed { existing, .. } if existing.actor == "first"),
        "{err}"
    );
    // Neither holds: the fence is checked first.
    j.commit(Batch::new().close_turn(&sid)).await.unwrap();
    let err = j.commit(attempt("late", "susp_1")).await.unwrap_err();
    assert!(matches!(err, StorageError::Fenced { .. }), "{err}");

    assert_eq!(texts(&j, &sid), vec!["first"]);
    assert_eq!(j.resume_claim("susp_1").unwrap().unwrap().actor, "first");
}

#[tokio::test]
async fn suspensions_and_claims_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (SessionId::from("a"), SessionId::from("b"));
    let kept = parked("b", "susp_b");
    let won = claim("a", "susp_a", "alice");
    {
        let j = open(&dir);
        j.commit(
            Batch::new()
                .put_suspension(&parked("a", "susp_a"))
                .put_suspension(&kept),
        )
        .await
        .unwrap();
        j.commit(Batch::new().claim(&won).delete_suspension(&a))
            .await
            .unwrap();
    }
    let j = open(&dir);
    assert_eq!(j.suspensions().unwrap(), vec![kept.clone()]);
    assert_eq!(j.suspension(&b).unwrap(), Some(kept));
    assert_eq!(j.resume_claim("susp_a").unwrap(), Some(won.clone()));
    // The handle stays used up after a restart.
    let err = j
        .commit(Batch::new().claim(&claim("a", "susp_a", "bob")))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StorageError::AlreadyClaimed { existing, .. } if **existing == won),
        "{err}"
    );
}

/// A claimed suspension is completed at most once: two completions racing
/// (one queued by a failed actor's stale turn, one by its successor), in
/// separate commits or folded into one group, and only the first lands.
#[tokio::test]
async fn a_suspension_is_completed_once_whoever_races_to_complete_it() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(&dir);
    let sid = SessionId::from("s");
    let complete = |handle: &str, text: &str| {
        Batch::new()
            .completing_suspension(&sid, handle)
            .delete_suspension(&sid)
            .append(&sid, &chunk(text))
    };
    // Not the session's suspension (none stored): refused, nothing written.
    let err = j.commit(complete("susp_1", "early")).await.unwrap_err();
    assert!(matches!(err, StorageError::SuspensionGone { .. }), "{err}");
    j.commit(Batch::new().put_suspension(&parked("s", "susp_1")))
        .await
        .unwrap();
    // Another handle than the stored one: refused.
    assert!(matches!(
        j.commit(complete("susp_0", "stale")).await,
        Err(StorageError::SuspensionGone { .. })
    ));
    // Two completions in one group: the first lands, the second is refused.
    let (a, b) = tokio::join!(
        j.commit(complete("susp_1", "first")),
        j.commit(complete("susp_1", "second"))
    );
    let landed = [a.is_ok(), b.is_ok()];
    assert_eq!(landed.iter().filter(|ok| **ok).count(), 1, "{landed:?}");
    assert!(j.suspension(&sid).unwrap().is_none());
    assert_eq!(texts(&j, &sid).len(), 1);
    // And later: refused.
    assert!(j.commit(complete("susp_1", "late")).await.is_err());
    assert_eq!(texts(&j, &sid).len(), 1);
}
