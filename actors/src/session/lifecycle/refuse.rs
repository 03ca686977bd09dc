//! A control refused before its handler ran: the sender's role does not allow
//! the method. The refusal leaves a durable `control_outcome` receipt (status
//! `rejected`) in the session's log, like every other arbitrated control
//! (`remote-session-control.md`, "Receipts"), so an audit shows who tried
//! what — bounded: a principal the role check keeps refusing cannot grow the
//! log (and every watcher's stream) at its own pace.
//!
//! Refusals are coalesced per (actor, method, reason): the first one opens a
//! window of [`COALESCE_WINDOW_SECS`] seconds and is journaled; identical
//! refusals inside the window are answered the same way but not journaled,
//! only counted (`berth_controls_total{outcome="rejected"}` counts every
//! one, `berth_refusals_coalesced_total` the ones left out of the log). The
//! first refusal journaled after the window carries the count of those left
//! out since the previous one in its signed metadata (`coalesced`). A count
//! still open when the actor stops is only in the metric.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use berth_runtime::event::ControlStatus;

use super::super::receipt::{control_outcome, signed_outcome};
use super::super::SessionState;
use crate::error::ControlError;

/// Length of a coalescing window (seconds of the node clock).
pub const COALESCE_WINDOW_SECS: i64 = 60;
/// Most (actor, method, reason) windows one session tracks; when full, the
/// windows already over are forgotten, and if none is, the refusal is
/// journaled uncoalesced.
const MAX_WINDOWS: usize = 1024;

/// Counter of refusals answered but not journaled (label `method`).
pub const REFUSALS_COALESCED_TOTAL: &str = "berth_refusals_coalesced_total";

/// The open coalescing windows of a session's refusals.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    windows: HashMap<(String, String, String), Window>,
}

#[derive(Debug)]
struct Window {
    opened_at: DateTime<Utc>,
    /// Refusals inside the window that were not journaled.
    left_out: u64,
}

impl Refusals {
    /// Whether a refusal of `key` at `now` falls in an open window (it is
    /// then counted there); otherwise how many were left out of the previous
    /// window, which the journaled receipt reports.
    fn admit(&mut self, key: (String, String, String), now: DateTime<Utc>) -> Option<u64> {
        let window = chrono::Duration::seconds(COALESCE_WINDOW_SECS);
        if let Some(open) = self.windows.get_mut(&key) {
            if now - open.opened_at < window {
                open.left_out += 1;
                return None;
            }
            let left_out = open.left_out;
            *open = Window {
                opened_at: now,
                left_out: 0,
            };
            return Some(left_out);
        }
        if self.windows.len() >= MAX_WINDOWS {
            self.windows.retain(|_, w| now - w.opened_at < window);
            if self.windows.len() >= MAX_WINDOWS {
                return Some(0);
            }
        }
        self.windows.insert(
            key,
            Window {
                opened_at: now,
                left_out: 0,
            },
        );
        Some(0)
    }
}

/// Journals the rejected receipt of `method` by `actor` with `reason`
/// (`role_not_authorized`) and `metadata` — unless an identical refusal
/// opened a coalescing window less than [`COALESCE_WINDOW_SECS`] ago (see
/// the module docs); returns once it is durable (or counted).
///
/// # Errors
/// [`ControlError::Storage`]: nothing was written.
pub(crate) async fn refuse(
    state: &mut SessionState,
    method: &str,
    actor: &str,
    reason: &str,
    mut metadata: Value,
) -> Result<(), ControlError> {
    let now = state.env.config.clock.now();
    let key = (actor.to_owned(), method.to_owned(), reason.to_owned());
    let Some(left_out) = state.refusals.admit(key, now) else {
        crate::metrics::count_control(method, ControlStatus::Rejected);
        metrics::counter!(REFUSALS_COALESCED_TOTAL, "method" => method.to_owned()).increment(1);
        return Ok(());
    };
    if left_out > 0 {
        match &mut metadata {
            Value::Object(fields) => {
                fields.insert("coalesced".into(), json!(left_out));
            }
            other => *other = json!({"detail": other.take(), "coalesced": left_out}),
        }
    }
    let target = json!({"sessionId": state.record.session_id});
    let mut outcome = control_outcome(
        &state.env,
        &state.record.session_id,
        method,
        actor,
        ControlStatus::Rejected,
        "rejected",
        target,
        Some(reason),
    );
    // Set before signing: the signature covers the metadata too.
    outcome.metadata = metadata;
    state
        .record(vec![signed_outcome(&state.env, outcome)])
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(actor: &str) -> (String, String, String) {
        (
            actor.into(),
            "session/suspend".into(),
            "role_not_authorized".into(),
        )
    }

    #[test]
    fn one_refusal_per_window_is_journaled_and_the_next_counts_the_rest() {
        let mut refusals = Refusals::default();
        let t0 = Utc::now();
        assert_eq!(refusals.admit(key("a"), t0), Some(0));
        for i in 1..=999 {
            let at = t0 + chrono::Duration::milliseconds(i);
            assert_eq!(refusals.admit(key("a"), at), None);
        }
        // Another principal has its own window.
        assert_eq!(refusals.admit(key("b"), t0), Some(0));
        let later = t0 + chrono::Duration::seconds(COALESCE_WINDOW_SECS);
        assert_eq!(refusals.admit(key("a"), later), Some(999));
        assert_eq!(refusals.admit(key("a"), later), None);
    }
}
