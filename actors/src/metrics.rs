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
//! Sessions by state (`berth_sessions`) and pending wake-ups
//! (`berth_pending_wakeups`) are gauges computed at scrape time from
//! [`crate::Node::session_counts`] and [`crate::Node::pending_wakeups`]; the
//! journal's commit latency is `berth_storage::COMMIT_SECONDS`.
//!
//! [`register_known_series`] creates every series whose label values form a
//! closed set, at zero, so that a scrape right after a start shows them
//! before their first event.

use berth_runtime::event::{ControlStatus, SessionEvent};
use berth_runtime::terminal::TerminalKind;

/// Counter of control outcomes by method and status.
pub const CONTROLS_TOTAL: &str = "berth_controls_total";
/// Histogram of turn durations (seconds).
pub const TURN_DURATION_SECONDS: &str = "berth_turn_duration_seconds";
/// Histogram of wake-up lateness (seconds after due).
pub const WAKEUP_LATENESS_SECONDS: &str = "berth_wakeup_lateness_seconds";

/// The control methods that journal a `control_outcome` receipt (the
/// `method` label values of [`CONTROLS_TOTAL`] registered at start).
pub const CONTROL_METHODS: [&str; 11] = [
    "session/cancel",
    "session/cancel_tool_call",
    "session/close",
    "session/inject",
    "session/replace_inject",
    "session/revoke_inject",
    "session/rollback",
    "session/redo",
    "session/suspend",
    "session/await_resumption",
    "session/resume",
];

/// Every receipt status (the `outcome` label values of [`CONTROLS_TOTAL`]).
pub const CONTROL_STATUSES: [ControlStatus; 3] = [
    ControlStatus::Accepted,
    ControlStatus::Idempotent,
    ControlStatus::Rejected,
];

/// Every terminal kind a turn can end with (with `suspended`, the
/// [`TURN_DURATION_SECONDS`] label values).
pub const TERMINAL_KINDS: [TerminalKind; 12] = [
    TerminalKind::Completed,
    TerminalKind::MaxTokens,
    TerminalKind::MaxTurnRequests,
    TerminalKind::Refusal,
    TerminalKind::UserCancelled,
    TerminalKind::SessionClosed,
    TerminalKind::ProcessRestarted,
    TerminalKind::ProviderError,
    TerminalKind::InternalError,
    TerminalKind::Suspended,
    TerminalKind::SuspensionTimeout,
    TerminalKind::PolicyBudget,
];

/// The `kind` label values of [`WAKEUP_LATENESS_SECONDS`].
pub const WAKEUP_KINDS: [&str; 3] = ["timeout", "trigger", "schedule"];

/// The label of a terminal kind: its wire name (`completed`, ...).
pub fn terminal_label(kind: TerminalKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

/// Creates, at zero, every series of this crate's families whose label
/// values are known: [`CONTROLS_TOTAL`] for each of [`CONTROL_METHODS`] ×
/// [`CONTROL_STATUSES`], [`TURN_DURATION_SECONDS`] for each terminal kind,
/// [`WAKEUP_LATENESS_SECONDS`] for each wake-up kind. Idempotent; a no-op
/// without a recorder.
pub fn register_known_series() {
    for method in CONTROL_METHODS {
        for status in CONTROL_STATUSES {
            metrics::counter!(CONTROLS_TOTAL, "method" => method, "outcome" => status_name(status))
                .increment(0);
        }
    }
    for kind in TERMINAL_KINDS {
        let _ = metrics::histogram!(TURN_DURATION_SECONDS, "terminal" => terminal_label(kind));
    }
    for kind in WAKEUP_KINDS {
        let _ = metrics::histogram!(WAKEUP_LATENESS_SECONDS, "kind" => kind);
    }
}

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
