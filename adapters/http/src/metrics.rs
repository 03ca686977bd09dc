//! Prometheus metrics at `GET /metrics` (text exposition format 0.0.4).
//!
//! berth's crates emit through the [`metrics`] facade; this module installs
//! the process-wide Prometheus recorder (once) with histogram buckets for
//! each histogram, and renders it. The families:
//!
//! | family | type | labels | what |
//! |---|---|---|---|
//! | `berth_sessions` | gauge | `state` = `running` \| `suspended` \| `idle` | sessions by state (idle includes closed), set at each scrape |
//! | `berth_sessions_live` | gauge | | sessions held in memory by an actor |
//! | `berth_pending_wakeups` | gauge | `kind` = `timeout` \| `trigger` \| `event` \| `schedule` | wake-ups the scheduler holds: parked sessions whose next due time is their timeout or a time trigger, event subscriptions of parked sessions, armed schedule runs; set at each scrape |
//! | `berth_controls_total` | counter | `method`, `outcome` = `accepted` \| `idempotent` \| `rejected` | one per `control_outcome` receipt |
//! | `berth_journal_commit_seconds` | histogram | | one successful group commit, from its commit-log append to its applied transaction (durable) |
//! | `berth_journal_commit_errors_total` | counter | | failed group commits |
//! | `berth_journal_commit_group_size` | histogram | | requests folded into one commit |
//! | `berth_wakeup_lateness_seconds` | histogram | `kind` = `timeout` \| `trigger` \| `schedule` | how late a scheduled wake-up fired |
//! | `berth_turn_duration_seconds` | histogram | `terminal` (terminal kind, or `suspended`) | a turn from start to seal or park |
//!
//! Every series whose label values form a closed set exists from the first
//! scrape, at zero: the session and wake-up gauges for each state and kind,
//! `berth_controls_total` for each receipt-journaling control method ×
//! outcome, the commit error counter, and each histogram (per terminal kind
//! and wake-up kind) with zero counts — so a scrape right after a start or
//! restart lists them instead of having them appear at their first event.
//!
//! ## Upkeep
//!
//! The recorder keeps every histogram observation as a raw sample until
//! something drains it into the buckets; without draining, each journal
//! commit (two observations) and each turn (one) would stay in memory until
//! the next scrape — forever on a node nobody scrapes (8 bytes a sample,
//! measured by the `bench-ws` heap profile, README "Benchmarks"). Installing
//! the recorder therefore starts one `berth-metrics-upkeep` thread that
//! drains the samples every [`UPKEEP_INTERVAL`] ([`upkeep`]); a scrape
//! drains them too. Draining loses nothing: a drained sample is counted in
//! its buckets, `_sum` and `_count`.

use std::sync::OnceLock;

use berth_actors::Node;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Gauge of sessions by state.
pub const SESSIONS: &str = "berth_sessions";
/// Gauge of sessions held in memory.
pub const SESSIONS_LIVE: &str = "berth_sessions_live";
/// Gauge of pending wake-ups by kind.
pub const PENDING_WAKEUPS: &str = "berth_pending_wakeups";

static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// How often the upkeep thread drains histogram samples into their buckets
/// (5 s, the period `metrics-exporter-prometheus` uses for its own upkeep
/// task). Between two drains the pending samples are bounded by the
/// observation rate times this period.
pub const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

static UPKEEP_THREAD_RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Drains every histogram's pending samples into its buckets now (what the
/// upkeep thread does every [`UPKEEP_INTERVAL`]). Does nothing when no
/// recorder is installed.
pub fn upkeep() {
    if let Some(Ok(handle)) = HANDLE.get() {
        handle.run_upkeep();
    }
}

/// How many times the upkeep thread has drained the histograms in this
/// process (0 before the recorder is installed).
pub fn upkeep_thread_runs() -> u64 {
    UPKEEP_THREAD_RUNS.load(std::sync::atomic::Ordering::Acquire)
}

/// Starts the upkeep thread (once per process, after the recorder was
/// installed). It runs for the life of the process, as the recorder does.
fn start_upkeep() -> Result<(), String> {
    std::thread::Builder::new()
        .name("berth-metrics-upkeep".into())
        .spawn(|| loop {
            std::thread::sleep(UPKEEP_INTERVAL);
            upkeep();
            UPKEEP_THREAD_RUNS.fetch_add(1, std::sync::atomic::Ordering::Release);
        })
        .map(drop)
        .map_err(|e| format!("cannot start the metrics upkeep thread: {e}"))
}

/// The process-wide Prometheus recorder, installed on first use together
/// with its upkeep thread (see [Upkeep](self#upkeep)).
///
/// # Errors
/// A message when another metrics recorder was installed first, or when the
/// upkeep thread could not be started.
pub fn handle() -> Result<&'static PrometheusHandle, String> {
    HANDLE
        .get_or_init(|| {
            let secs = |v: &[f64]| v.to_vec();
            PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(berth_storage::COMMIT_SECONDS.into()),
                    &secs(&[
                        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                        0.25, 0.5, 1.0,
                    ]),
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(berth_storage::COMMIT_GROUP_SIZE.into()),
                        &[
                            1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
                        ],
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(berth_actors::metrics::WAKEUP_LATENESS_SECONDS.into()),
                        &[
                            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                            30.0, 60.0, 300.0,
                        ],
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(berth_actors::metrics::TURN_DURATION_SECONDS.into()),
                        &[
                            0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                            300.0, 600.0, 1800.0,
                        ],
                    )
                })
                .map_err(|e| e.to_string())
                .and_then(|b| b.install_recorder().map_err(|e| e.to_string()))
                .and_then(|handle| start_upkeep().map(|()| handle))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Describes every family (HELP lines) once the recorder is installed.
fn describe() {
    static DESCRIBED: OnceLock<()> = OnceLock::new();
    DESCRIBED.get_or_init(|| {
        metrics::describe_gauge!(SESSIONS, "Sessions by state (idle includes closed).");
        metrics::describe_gauge!(SESSIONS_LIVE, "Sessions held in memory by an actor.");
        metrics::describe_gauge!(
            PENDING_WAKEUPS,
            "Wake-ups the scheduler holds: timeouts, time triggers, event subscriptions, schedule runs."
        );
        metrics::describe_counter!(
            berth_actors::metrics::CONTROLS_TOTAL,
            "Controls by method and outcome (one per control_outcome receipt)."
        );
        metrics::describe_histogram!(
            berth_storage::COMMIT_SECONDS,
            metrics::Unit::Seconds,
            "Journal group commit latency, begin to durable."
        );
        metrics::describe_counter!(
            berth_storage::COMMIT_ERRORS_TOTAL,
            "Failed journal group commits."
        );
        metrics::describe_histogram!(
            berth_storage::COMMIT_GROUP_SIZE,
            "Requests folded into one journal group commit."
        );
        metrics::describe_histogram!(
            berth_actors::metrics::WAKEUP_LATENESS_SECONDS,
            metrics::Unit::Seconds,
            "How late a scheduled wake-up fired after it was due."
        );
        metrics::describe_histogram!(
            berth_actors::metrics::TURN_DURATION_SECONDS,
            metrics::Unit::Seconds,
            "Turn duration from start to seal or park."
        );
        berth_actors::metrics::register_known_series();
        metrics::counter!(berth_storage::COMMIT_ERRORS_TOTAL).increment(0);
        let _ = metrics::histogram!(berth_storage::COMMIT_SECONDS);
        let _ = metrics::histogram!(berth_storage::COMMIT_GROUP_SIZE);
    });
}

/// Installs the recorder and creates every known series at zero
/// ([`render`] does this too); the server calls it when it starts, so that
/// the families exist before the first scrape and count from the start.
///
/// # Errors
/// As [`handle`].
pub fn install() -> Result<(), String> {
    handle()?;
    describe();
    Ok(())
}

/// Sets the scrape-time gauges from `node` and renders every family.
///
/// # Errors
/// The recorder could not be installed, or the journal could not be read.
pub async fn render(node: &Node) -> Result<String, String> {
    let handle = handle()?;
    describe();
    let counts = node.session_counts().await.map_err(|e| e.to_string())?;
    metrics::gauge!(SESSIONS, "state" => "running").set(counts.running as f64);
    metrics::gauge!(SESSIONS, "state" => "suspended").set(counts.suspended as f64);
    metrics::gauge!(SESSIONS, "state" => "idle").set(counts.idle as f64);
    metrics::gauge!(SESSIONS_LIVE).set(counts.live as f64);
    let pending = node.pending_wakeups().await;
    for (kind, n) in [
        ("timeout", pending.timeouts),
        ("trigger", pending.triggers),
        ("event", pending.events),
        ("schedule", pending.schedules),
    ] {
        metrics::gauge!(PENDING_WAKEUPS, "kind" => kind).set(n as f64);
    }
    Ok(handle.render())
}
