//! The two phases of a wake-up's resume (`berth_actors::claimer`): a claim
//! the claimer committed but whose completion never ran — berth died in
//! between, or the completion message was not handled yet — is completed
//! exactly once, as the claim says, before anything else sees the session.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use berth_actors::claimer::SCHEDULER;
use berth_actors::node::{NewSession, ResumeParams, SuspendParams};
use berth_actors::{ControlError, Node, NodeConfig};
use berth_runtime::clock::ManualClock;
use berth_runtime::event::SessionEvent;
use berth_runtime::ids::SessionId;
use berth_runtime::model::scripted::ScriptedModel;
use berth_runtime::suspension::{
    Initiator, OnTimeout, ResumeCause, ResumeClaim, ResumeClaimKind, ResumeConditions,
    ResumeTimeout, SuspendMode,
};
use berth_storage::Batch;
use chrono::{DateTime, Utc};
use serde_json::json;

const SCRIPT: &str = r#"
[[rules]]
match = "go on"
steps = [{ text = "going on" }]
"#;

/// 2026-01-01T00:00:00Z.
const T0_MS: i64 = 1_767_225_600_000;

fn config(data: &Path, clock: &Arc<ManualClock>) -> NodeConfig {
    let model = ScriptedModel::parse(SCRIPT, "toml", "scripted:claimer").unwrap();
    let mut config = NodeConfig::new(data, Arc::new(model));
    config.clock = clock.clone();
    config.passivate_after_ms = 600_000;
    config
}

/// `dir/work`, created: a session cwd beside the data dir `dir/data` (a
/// session root may not contain the data dir).
fn work(dir: &Path) -> std::path::PathBuf {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    work
}

/// Parks a new idle session with a one-minute `resume_with_input` timeout;
/// returns it and its handle.
async fn park(node: &Node, cwd: &Path) -> (SessionId, String) {
    let (id, parked) = park_for(node, cwd, 1.0).await;
    (id, parked.handle)
}

/// Parks a new idle session with a `resume_with_input` timeout of
/// `minutes`.
async fn park_for(
    node: &Node,
    cwd: &Path,
    minutes: f64,
) -> (SessionId, berth_actors::node::SuspendOutcome) {
    let id = node
        .new_session(NewSession::in_dir(cwd.to_path_buf()))
        .await
        .unwrap()
        .session_id;
    let parked = node
        .suspend(
            &id,
            SuspendParams {
                mode: SuspendMode::FinishStep,
                reason: None,
                resume_when: Some(ResumeConditions {
                    timeout: Some(ResumeTimeout {
                        duration_minutes: minutes,
                        on_timeout: OnTimeout::ResumeWithInput,
                        input: Some(json!("go on")),
                    }),
                    ..Default::default()
                }),
                actor: "test".into(),
                initiator: Initiator::Client,
                require_running: false,
            },
        )
        .await
        .unwrap();
    (id, parked)
}

/// The claim the claimer takes when the timeout fires.
fn scheduler_claim(id: &SessionId, handle: &str, at_ms: i64) -> ResumeClaim {
    ResumeClaim {
        handle: handle.to_owned(),
        session_id: id.clone(),
        kind: ResumeClaimKind::Resumed,
        cause: Some(ResumeCause::Timeout),
        actor: SCHEDULER.into(),
        claimed_at: DateTime::from_timestamp_millis(at_ms).unwrap(),
    }
}

/// A client's `session/resume` of `handle` with `input`.
fn client_resume(handle: &str, input: &str) -> ResumeParams {
    ResumeParams {
        handle: Some(handle.to_owned()),
        input: Some(json!(input)),
        continue_transcript: true,
        cause: ResumeCause::ExplicitResume,
        actor: "client".into(),
        lateness_ms: None,
        message_id: None,
        trigger: None,
    }
}

/// The session's `resumed` events: (resumedAt, cause, lateness ms).
fn resumes(node: &Node, id: &SessionId) -> Vec<(DateTime<Utc>, ResumeCause, Option<u64>)> {
    node.journal()
        .events(id, 0)
        .unwrap()
        .into_iter()
        .filter_map(|(_, record)| match record.event {
            SessionEvent::Resumed {
                resumed_at,
                cause,
                lateness_ms,
                ..
            } => Some((resumed_at, cause, lateness_ms)),
            _ => None,
        })
        .collect()
}

async fn until_idle(node: &Node, id: &SessionId) {
    for _ in 0..400 {
        if node.journal().open_turn(id).unwrap().is_none()
            && node.journal().suspension(id).unwrap().is_none()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the session did not wake and finish its turn");
}

/// The claim is durable but the actor never heard of it: the next control
/// that reaches the session completes the resume first, and is answered
/// against the resumed session (an explicit resume gets `already_resumed`,
/// naming the scheduler's claim).
#[tokio::test]
async fn a_claimed_resume_is_completed_before_the_next_control() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::at(T0_MS));
    let node = Node::start(config(&dir.path().join("data"), &clock))
        .await
        .unwrap();
    let (id, handle) = park(&node, &work(dir.path())).await;
    let claimed_at = T0_MS + 60_000 + 7;
    node.journal()
        .commit(Batch::new().claim(&scheduler_claim(&id, &handle, claimed_at)))
        .await
        .unwrap();
    clock.advance_ms(60_500);
    let late = node.resume(&id, client_resume(&handle, "me first")).await;
    match late {
        Err(ControlError::ResumeConflict { reason, .. }) => {
            let text = format!("{reason:?}");
            assert!(
                text.contains("AlreadyResumed") && text.contains(SCHEDULER),
                "{text}"
            );
        }
        other => panic!("expected already_resumed, got {other:?}"),
    }
    until_idle(&node, &id).await;
    let resumed = resumes(&node, &id);
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    let (at, cause, lateness) = resumed[0];
    assert_eq!(
        at.timestamp_millis(),
        claimed_at,
        "resumedAt is the claim's"
    );
    assert_eq!(cause, ResumeCause::Timeout);
    assert_eq!(lateness, Some(7), "the claim's lateness after the due time");
    // The turn it started read the timeout's input.
    let transcript = node.journal().transcript(&id).unwrap();
    assert!(
        format!("{transcript:?}").contains("going on"),
        "{transcript:?}"
    );
    node.shutdown().await;
}

/// berth died between the phases: the wake-up row is still there, so the
/// next start fires it at once; its claim is refused as taken, and the
/// actor completes the one already taken, once.
#[test]
fn a_claim_cut_off_by_a_crash_is_completed_once_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let clock = Arc::new(ManualClock::at(T0_MS));
    let claimed_at = T0_MS + 60_000 + 3;
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    // First life: park, then the claim lands and the process stops before
    // the completion (the journal is released with the runtime).
    let rt = runtime();
    let id = rt.block_on(async {
        let node = Node::start(config(&data, &clock)).await.unwrap();
        let (id, handle) = park(&node, &work(dir.path())).await;
        node.journal()
            .commit(Batch::new().claim(&scheduler_claim(&id, &handle, claimed_at)))
            .await
            .unwrap();
        node.shutdown().await;
        id
    });
    drop(rt);
    // Second life, well after the due time.
    clock.advance_ms(120_000);
    let rt = runtime();
    rt.block_on(async {
        let node = Node::start(config(&data, &clock)).await.unwrap();
        until_idle(&node, &id).await;
        let resumed = resumes(&node, &id);
        assert_eq!(resumed.len(), 1, "{resumed:?}");
        assert_eq!(resumed[0].0.timestamp_millis(), claimed_at);
        assert_eq!(resumed[0].1, ResumeCause::Timeout);
        assert!(node.journal().wakeup(&id).unwrap().is_none());
        node.shutdown().await;
    });
}

/// Closes and resumes sent around the due time race the claimer's claim:
/// whichever is committed first wins, and the other is answered as if it
/// came after — a close that lost stops the resumed turn and still closes,
/// a resume that lost gets `already_resumed` — never a storage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controls_racing_a_wake_up_get_typed_answers_and_take_effect() {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::parse(SCRIPT, "toml", "scripted:claimer").unwrap();
    let node = Node::start(NodeConfig::new(dir.path().join("data"), Arc::new(model)))
        .await
        .unwrap();
    let mut parked = Vec::new();
    for _ in 0..120 {
        parked.push(park_for(&node, &work(dir.path()), 0.004).await);
    }
    let races = parked.iter().enumerate().map(|(i, (id, outcome))| {
        let (node, id, handle) = (node.clone(), id.clone(), outcome.handle.clone());
        // 240 ms after the suspension, give or take 4 ms.
        let due = outcome.suspended_at + chrono::Duration::milliseconds(236 + (i % 9) as i64);
        tokio::spawn(async move {
            let wait = (due - Utc::now()).to_std().unwrap_or_default();
            tokio::time::sleep(wait).await;
            if i % 2 == 0 {
                (
                    id.clone(),
                    "close",
                    node.close(&id, "client").await.map(|_| ()),
                )
            } else {
                let resumed = node.resume(&id, client_resume(&handle, "go on")).await;
                (id, "resume", resumed.map(|_| ()))
            }
        })
    });
    for race in futures::future::join_all(races).await {
        let (id, what, answer) = race.unwrap();
        match (what, &answer) {
            ("close", Ok(())) | ("resume", Ok(())) => {}
            ("resume", Err(ControlError::ResumeConflict { .. })) => {}
            _ => panic!("{what} on {id}: {answer:?}"),
        }
        if what == "close" {
            let record = node.journal().session(&id).unwrap().unwrap();
            assert!(
                record.closed_at.is_some(),
                "{id}: the close was answered but not made"
            );
        }
    }
    // Each suspension ended exactly once: resumed, or cancelled by the close.
    for (id, _) in &parked {
        let events = node.journal().events(id, 0).unwrap();
        let resumed = events
            .iter()
            .filter(|(_, r)| matches!(r.event, SessionEvent::Resumed { .. }))
            .count();
        let cancelled = events
            .iter()
            .filter(|(_, r)| matches!(r.event, SessionEvent::SuspensionCancelled { .. }))
            .count();
        assert_eq!(
            resumed + cancelled,
            1,
            "{id}: {resumed} resumed, {cancelled} cancelled"
        );
    }
    node.shutdown().await;
}
