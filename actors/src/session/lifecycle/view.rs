//! `berth.session_view.query`: what the session has done, as the
//! `berth.session_view.v1` projection (`remote-session-control.md`, "Status",
//! "What resumed from can actually name").

use berth_runtime::steering::Injection;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::super::SessionState;

/// The projection's schema name.
pub const SCHEMA: &str = "berth.session_view.v1";

/// Builds the projection:
///
/// ```json
/// {"schema": "berth.session_view.v1", "sessionId": "…",
///  "run": {"status": "idle" | "running" | "closed", "turnId": "…"?},
///  "pending": {"approvals": [], "auth": [], "injections": [{messageId, mode}]},
///  "lastEventId": 42, "messageCount": 12,
///  "prefix_hash": "…", "projection_hash": "…"}
/// ```
///
/// `prefix_hash` is the transcript's SHA-256 chain (message *n* hashed onto the
/// hash of the first *n − 1*), so two clients that agree on it agree on the
/// whole history up to that point, across restarts. `projection_hash` is
/// SHA-256 over the canonical JSON (sorted keys, no whitespace) of every other
/// field. `pending.approvals` lists tool calls waiting for a client's
/// approval; `pending.auth` stays empty until providers can ask for logins.
/// `run.status` is `idle`, `running`, `requested` (a suspend was accepted;
/// the turn has not reached the seam where it parks), `quiescing` (it
/// reached it and dispatches nothing more; see
/// `TurnControl::begin_quiescing`), `suspended` (with `run.suspension`) or
/// `closed`; while a suspend is pending `run.suspension.state` is the same
/// `requested` or `quiescing`.
pub(crate) fn view(state: &SessionState) -> Value {
    let pending = pending_state(state);
    let (status, turn_id) = match (&state.turn, state.record.closed_at, &state.suspension) {
        (_, Some(_), _) => ("closed", None),
        (Some(turn), None, _) if state.record.suspend_request.is_some() => {
            (pending, Some(turn.turn_id.clone()))
        }
        (Some(turn), None, _) => ("running", Some(turn.turn_id.clone())),
        (None, None, Some(s)) => ("suspended", s.turn_id.clone()),
        (None, None, None) => ("idle", None),
    };
    let injections: Vec<Value> = state
        .turn
        .as_ref()
        .map(|t| t.control.steering().pending().map(summary).collect())
        .unwrap_or_default();
    let approvals: Vec<Value> = state
        .turn
        .as_ref()
        .map(|t| {
            t.control
                .pending_approvals()
                .into_iter()
                .map(|r| json!({"toolCallId": r.tool_call_id, "title": r.title, "kind": r.kind}))
                .collect()
        })
        .unwrap_or_default();
    let mut run = json!({ "status": status });
    if let Some(turn_id) = turn_id {
        run["turnId"] = json!(turn_id);
    }
    if let Some(s) = &state.suspension {
        run["suspension"] = json!({
            "handle": s.handle,
            "reason": s.reason,
            "initiator": s.initiator,
            "suspendedAt": s.suspended_at,
            "resumeWhen": s.resume_when,
            "summary": s.summary,
        });
    } else if let Some(r) = &state.record.suspend_request {
        run["suspension"] = json!({"handle": r.handle, "mode": r.mode, "state": pending});
    }
    let mut view = json!({
        "schema": SCHEMA,
        "sessionId": state.record.session_id,
        "run": run,
        "pending": {"approvals": approvals, "auth": [], "injections": injections},
        "lastEventId": state.watchers.last_event_id(),
        "messageCount": state.transcript.len(),
        "prefix_hash": state.transcript.fingerprint(),
    });
    // Keys sorted at every depth: this workspace's serde_json keeps objects
    // in insertion order (`preserve_order`), so its plain encoding is not
    // the canonical form the doc promises a client can recompute.
    let canonical = berth_runtime::receipt::canonical_json(&view);
    view["projection_hash"] = json!(hex::encode(Sha256::digest(canonical.as_bytes())));
    view
}

/// `requested` or `quiescing`: where a pending suspend stands.
fn pending_state(state: &SessionState) -> &'static str {
    if state
        .turn
        .as_ref()
        .is_some_and(|t| t.control.is_quiescing())
    {
        "quiescing"
    } else {
        "requested"
    }
}

fn summary(injection: &Injection) -> Value {
    json!({"messageId": injection.message_id, "mode": injection.mode})
}
