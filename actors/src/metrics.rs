//! The metrics the actors emit, through the [`metrics`] facade (a no-op
//! until a recorder is installed; `berth-http` installs the Prometheus one
//! and serves it at `GET /metrics`).
//!
//! | name | kind | labels | unit |
//! |---|---|---|---|
//! | `berth_controls_total` | counter | `method`, `outcome` (`accepted` \| `idempotent` \| `rejected`) | controls (one per `control_outcome` receipt) |
//! | `berth_refusals_coalesced_total` | counter | `method` | role refusals answered but left out of the session's log (coalesced; see `session::lifecycle::refuse`) |
//! | `berth_turn_duration_seconds` | histogram | `terminal` (terminal kind, or `suspended` for a parked turn) | seconds from a turn's start to its seal or park |
//! | `berth_wakeup_lateness_seconds` | histogram | `kind` (`timeout` \| `trigger` \| `schedule`) | seconds a scheduled wake-up fired after it was due |
//!
//! Sessions by state (`berth_sessions`) are gauges computed at scrape time
//! from [`crate::Node::session_counts`]; the journal's commit latency is
//! `berth_storage::COMMIT_SECONDS`.

use berth_runtime::event::{ControlStatus, SessionEvent};

/// Counter of control outcomes by method and status.
pub const CONTROLS_TOTAL: &str = "berth_controls_total";
/// Histogram of turn durations (seconds).
pub const TURN_DURATION_SECONDS: &str = "berth_turn_duration_seconds";
/// Histogram of wake-up lateness (seconds after due).
pub const WAKEUP_LATENESS_SECONDS: &str = "berth_wakeup_lateness_seconds";

/// The wire name of a receipt status.
pub fn status_name(status: ControlStatus) -> &'static str {
    match status {
        ControlStatus::Accepted => "accepted",
        ControlStatus::Idempotent => "idempotent",
        ControlStatus::Rejected => "rejected",
    }
}

/// Counts one control outcome.
pub fn count_control(method: &str, status: ControlStatus) {
    metrics::counter!(CONTROLS_TOTAL, "method" => method.to_owned(), "outcome" => status_name(status))
        .increment(1);
}

/// Counts the `control_outcome` receipts among `events` (called once per
/// durable event, when [`crate::watch::Watchers::publish`] releases it).
pub(crate) fn count_receipts<'a>(events: impl IntoIterator<Item = &'a SessionEvent>) {
    for event in events {
        if let SessionEvent::ControlOutcome(outcome) = event {
            count_control(&outcome.receipt.method, outcome.receipt.status);
        }
    }
}

/// Records a turn's duration in milliseconds under its terminal label.
pub(crate) fn record_turn(terminal: &str, millis: i64) {
    metrics::histogram!(TURN_DURATION_SECONDS, "terminal" => terminal.to_owned())
        .record(millis.max(0) as f64 / 1000.0);
}

/// Records how late a wake-up fired (ms).
pub(crate) fn record_lateness(kind: &'static str, lateness_ms: u64) {
    metrics::histogram!(WAKEUP_LATENESS_SECONDS, "kind" => kind)
        .record(lateness_ms as f64 / 1000.0);
}
