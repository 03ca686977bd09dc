//! Receipts: `control_outcome` (`remote-session-control.md`, "Receipts") and
//! the signed lifecycle receipts (`berth_runtime::receipt`): suspension,
//! resumption and drain decision. Each is signed with the journal's keyring
//! when it is built and journaled in the same batch as the decision it
//! records.

use std::sync::Arc;

use berth_runtime::clock::Clock;
use berth_runtime::event::{ControlOutcome, ControlStatus, EventRecord, SessionEvent};
use berth_runtime::frame::Frame;
use berth_runtime::ids::{IdSource, SessionId, TurnId};
use berth_runtime::receipt::{
    sha256_of_json, DrainAction, DrainDecisionReceipt, DrainedItem, Receipt, Signed,
    SuspensionReceipt,
};
use berth_runtime::steering::Seam;
use berth_runtime::suspension::{SuspendMode, Suspension};
use berth_runtime::tape::Tape;
use berth_storage::Batch;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{SessionEnv, SessionState};

/// What building a receipt reads: the clock, the id source and the signing
/// key. A node's [`SessionEnv`] is one; `berth replay` supplies its own, fed
/// from the journal (recorded times and ids, the recorded signing key).
pub(crate) trait Stamper {
    /// The clock decisions are timed by.
    fn clock(&self) -> &dyn Clock;
    /// The source of `ctl_…`, `susp_…` ids.
    fn ids(&self) -> &dyn IdSource;
    /// Signs a receipt.
    fn sign<T: Receipt>(&self, receipt: T) -> Signed<T>;
}

impl Stamper for SessionEnv {
    fn clock(&self) -> &dyn Clock {
        self.config.clock.as_ref()
    }

    fn ids(&self) -> &dyn IdSource {
        self.config.ids.as_ref()
    }

    fn sign<T: Receipt>(&self, receipt: T) -> Signed<T> {
        self.journal.keyring().sign(receipt)
    }
}

impl<S: Stamper> Stamper for Arc<S> {
    fn clock(&self) -> &dyn Clock {
        (**self).clock()
    }

    fn ids(&self) -> &dyn IdSource {
        (**self).ids()
    }

    fn sign<T: Receipt>(&self, receipt: T) -> Signed<T> {
        (**self).sign(receipt)
    }
}

/// Builds the signed receipt of one arbitrated control on this session.
pub(crate) fn receipt(
    state: &SessionState,
    method: &str,
    actor: &str,
    status: ControlStatus,
    outcome: &str,
    target: Value,
    reason: Option<&str>,
) -> SessionEvent {
    receipt_in(
        &state.env,
        &state.record.session_id,
        method,
        actor,
        status,
        outcome,
        target,
        reason,
    )
}

/// [`receipt`] without an actor state (start-up recovery).
#[allow(clippy::too_many_arguments)]
pub(crate) fn receipt_in(
    env: &impl Stamper,
    session_id: &SessionId,
    method: &str,
    actor: &str,
    status: ControlStatus,
    outcome: &str,
    target: Value,
    reason: Option<&str>,
) -> SessionEvent {
    signed_outcome(
        env,
        control_outcome(
            env, session_id, method, actor, status, outcome, target, reason,
        ),
    )
}

/// An unsigned `control_outcome`, decided now (finish it with
/// [`signed_outcome`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn control_outcome(
    env: &impl Stamper,
    session_id: &SessionId,
    method: &str,
    actor: &str,
    status: ControlStatus,
    outcome: &str,
    target: Value,
    reason: Option<&str>,
) -> ControlOutcome {
    let now = env.clock().now();
    control_outcome_at(
        env, session_id, method, actor, status, outcome, target, reason, now,
    )
}

/// [`control_outcome`] decided at `decided_at` (a decision journaled in one
/// batch with others carries the batch's time).
#[allow(clippy::too_many_arguments)]
pub(crate) fn control_outcome_at(
    env: &impl Stamper,
    session_id: &SessionId,
    method: &str,
    actor: &str,
    status: ControlStatus,
    outcome: &str,
    target: Value,
    reason: Option<&str>,
    decided_at: DateTime<Utc>,
) -> ControlOutcome {
    ControlOutcome {
        session_id: session_id.0.clone(),
        control_id: env.ids().new_id("ctl"),
        method: method.into(),
        outcome: outcome.into(),
        status,
        actor: actor.into(),
        target,
        reason: reason.map(str::to_owned),
        metadata: Value::Null,
        decided_at,
    }
}

/// Signs a `control_outcome` with the journal's keyring.
pub(crate) fn signed_outcome(env: &impl Stamper, outcome: ControlOutcome) -> SessionEvent {
    SessionEvent::ControlOutcome(env.sign(outcome))
}

/// The receipt of a refused control: status `rejected`, outcome `rejected`,
/// and the machine-readable `reason`.
pub(crate) fn rejected(
    state: &SessionState,
    method: &str,
    actor: &str,
    target: Value,
    reason: &str,
) -> SessionEvent {
    receipt(
        state,
        method,
        actor,
        ControlStatus::Rejected,
        "rejected",
        target,
        Some(reason),
    )
}

/// The signed `SuspensionReceipt` of a suspension about to be committed.
pub(crate) fn suspension_receipt(env: &impl Stamper, suspension: &Suspension) -> SessionEvent {
    let frame_sha256 = suspension.frame.as_ref().map(frame_hash);
    SessionEvent::SuspensionReceipt(env.sign(SuspensionReceipt {
        handle: suspension.handle.clone(),
        session_id: suspension.session_id.clone(),
        initiator: suspension.initiator,
        actor: suspension.actor.clone(),
        mode: suspension.mode,
        reason: suspension.reason.clone(),
        conditions: suspension.resume_when.clone(),
        suspended_at: suspension.suspended_at,
        turn_id: suspension.turn_id.clone(),
        frame_sha256,
        span_id: suspension.span_links.first().map(|l| l.span_id.clone()),
    }))
}

fn frame_hash(frame: &Frame) -> String {
    sha256_of_json(&serde_json::to_value(frame).unwrap_or(Value::Null))
}

/// The signed receipt of a drain decision taken at `decided_at` (the time
/// of the batch that journals it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn drain_receipt(
    env: &impl Stamper,
    session_id: &SessionId,
    turn_id: Option<&TurnId>,
    item: DrainedItem,
    seam: Option<Seam>,
    action: DrainAction,
    reason: Option<String>,
    decided_at: DateTime<Utc>,
) -> SessionEvent {
    SessionEvent::DrainDecisionReceipt(env.sign(DrainDecisionReceipt {
        session_id: session_id.clone(),
        turn_id: turn_id.cloned(),
        item,
        seam,
        action,
        reason,
        decided_at,
    }))
}

/// The drain receipt of a suspend request turn `turn_id` parked for at
/// `seam` (`None`: completed outside the loop), decided when the suspension
/// was committed.
pub(crate) fn suspend_drained(
    env: &impl Stamper,
    suspension: &Suspension,
    mode: SuspendMode,
    seam: Option<Seam>,
    turn_id: &TurnId,
) -> SessionEvent {
    drain_receipt(
        env,
        &suspension.session_id,
        Some(turn_id),
        DrainedItem::SuspendRequest {
            handle: suspension.handle.clone(),
            mode,
        },
        seam,
        DrainAction::Parked,
        None,
        suspension.suspended_at,
    )
}

/// Appends `records` to `batch`, the first one carrying `tape` (the replay
/// inputs consumed before it; see `berth_runtime::tape`).
pub(crate) fn append_records(
    batch: Batch,
    session_id: &SessionId,
    records: &[EventRecord],
    tape: &Tape,
) -> Batch {
    records.iter().enumerate().fold(batch, |b, (i, r)| {
        if i == 0 && !tape.is_empty() {
            b.append_taped(session_id, r, tape)
        } else {
            b.append(session_id, r)
        }
    })
}

/// `events` as journal records stamped `now`, each injection delivery or drop
/// followed by its signed drain receipt decided at `now` (same batch, so the
/// decision and its receipt are durable together).
pub(crate) fn stamp(
    env: &impl Stamper,
    session_id: &SessionId,
    turn_id: Option<&TurnId>,
    now: DateTime<Utc>,
    events: Vec<SessionEvent>,
) -> Vec<EventRecord> {
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        let drained = match &event {
            SessionEvent::InjectionDelivered { injection, seam } => Some((
                DrainedItem::Injection {
                    message_id: injection.message_id.clone(),
                    mode: Some(injection.mode),
                },
                Some(*seam),
                DrainAction::Delivered,
                None,
            )),
            SessionEvent::InjectionDropped { message_id, reason } => Some((
                DrainedItem::Injection {
                    message_id: message_id.clone(),
                    mode: None,
                },
                None,
                DrainAction::Dropped,
                Some(reason.clone()),
            )),
            _ => None,
        };
        out.push(EventRecord::new(now, event));
        if let Some((item, seam, action, reason)) = drained {
            out.push(EventRecord::new(
                now,
                drain_receipt(env, session_id, turn_id, item, seam, action, reason, now),
            ));
        }
    }
    out
}
