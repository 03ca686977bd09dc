//! `GET /metrics` of a freshly started server lists every family with a
//! closed label set at zero (no series waits for its first event), and the
//! pending wake-up gauge follows the scheduler: a session parked with a
//! timeout counts one `timeout`, its resume brings it back to zero.
//!
//! Its own test binary: the Prometheus recorder is process-wide, so only
//! here is the first scrape a fresh process's.

use berth_actors::node::{NewSession, ResumeParams, SuspendParams};
use berth_actors::{Node, NodeConfig, Principal, Role};
use berth_http::{ApiToken, HttpConfig, HttpServer};
use berth_runtime::suspension::{
    Initiator, OnTimeout, ResumeCause, ResumeConditions, ResumeTimeout, SuspendMode,
};
use serde_json::json;
use tokio::sync::oneshot;

const OBSERVER: &str = "observer-token-0123456789";

/// The value of the sample `series` (name and labels exactly as rendered).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

async fn scrape(client: &reqwest::Client, base: &str) -> String {
    let response = client
        .get(format!("{base}/metrics"))
        .bearer_auth(OBSERVER)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

#[tokio::test]
async fn a_fresh_scrape_lists_every_known_series_and_the_wakeup_gauge_follows_suspend_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let model = berth_runtime::model::from_spec("scripted").unwrap();
    let node = Node::start(NodeConfig::new(dir.path().join("data"), model))
        .await
        .unwrap();
    let mut config = HttpConfig::new("127.0.0.1:0".parse().unwrap());
    config.tokens = vec![ApiToken {
        token: OBSERVER.into(),
        principal: Principal::new("grafana", Role::Observer),
    }];
    let server = HttpServer::builder(node.clone(), config)
        .build()
        .unwrap()
        .bind()
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server
            .serve(async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    let client = reqwest::Client::new();

    let fresh = scrape(&client, &base).await;
    let zero = [
        r#"berth_sessions{state="running"}"#,
        r#"berth_sessions{state="suspended"}"#,
        r#"berth_sessions{state="idle"}"#,
        "berth_sessions_live",
        r#"berth_pending_wakeups{kind="timeout"}"#,
        r#"berth_pending_wakeups{kind="trigger"}"#,
        r#"berth_pending_wakeups{kind="event"}"#,
        r#"berth_pending_wakeups{kind="schedule"}"#,
        r#"berth_controls_total{method="session/cancel",outcome="accepted"}"#,
        r#"berth_controls_total{method="session/resume",outcome="rejected"}"#,
        r#"berth_controls_total{method="session/suspend",outcome="idempotent"}"#,
        "berth_journal_commit_errors_total",
        r#"berth_turn_duration_seconds_count{terminal="completed"}"#,
        r#"berth_turn_duration_seconds_count{terminal="suspended"}"#,
        r#"berth_turn_duration_seconds_count{terminal="provider_error"}"#,
        r#"berth_wakeup_lateness_seconds_count{kind="timeout"}"#,
        r#"berth_wakeup_lateness_seconds_count{kind="trigger"}"#,
        r#"berth_wakeup_lateness_seconds_count{kind="schedule"}"#,
    ];
    for series in zero {
        assert_eq!(
            sample(&fresh, series),
            Some(0.0),
            "{series} is not listed at 0 by a fresh scrape:\n{fresh}"
        );
    }
    for histogram in [
        "berth_journal_commit_seconds_count",
        "berth_journal_commit_group_size_count",
    ] {
        assert!(
            sample(&fresh, histogram).is_some(),
            "{histogram} is not listed by a fresh scrape:\n{fresh}"
        );
    }

    let cwd = tempfile::tempdir().unwrap();
    let id = node
        .new_session(NewSession::in_dir(cwd.path().to_path_buf()))
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
                        duration_minutes: 60.0,
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
    let parked_scrape = scrape(&client, &base).await;
    assert_eq!(
        sample(&parked_scrape, r#"berth_pending_wakeups{kind="timeout"}"#),
        Some(1.0),
        "{parked_scrape}"
    );
    assert_eq!(
        sample(&parked_scrape, r#"berth_sessions{state="suspended"}"#),
        Some(1.0)
    );

    node.resume(
        &id,
        ResumeParams {
            handle: Some(parked.handle),
            input: None,
            continue_transcript: true,
            cause: ResumeCause::ExplicitResume,
            actor: "test".into(),
            lateness_ms: None,
            message_id: None,
            trigger: None,
        },
    )
    .await
    .unwrap();
    let resumed = scrape(&client, &base).await;
    assert_eq!(
        sample(&resumed, r#"berth_pending_wakeups{kind="timeout"}"#),
        Some(0.0),
        "{resumed}"
    );
    assert_eq!(
        sample(
            &resumed,
            r#"berth_controls_total{method="session/resume",outcome="accepted"}"#
        ),
        Some(1.0),
        "{resumed}"
    );

    let _ = stop.send(());
    task.await.unwrap();
}
