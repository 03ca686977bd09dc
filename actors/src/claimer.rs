//! The wake-up claimer: a due timeout or time trigger becomes its one-time
//! resume claim on a thread of its own, at its due time, however busy the
//! async runtime is (DESIGN.md, "The scheduler"; issue 5's lateness target).
//!
//! Claiming used to be the session actor's first step, so under a burst a
//! due wake-up waited behind every turn already queued on the runtime (in
//! `bench-sched` at 10,000 sessions: claims 200–400 ms after their due time,
//! though the scheduler handed them out within 8 ms). A resume by a timer is
//! now two phases:
//!
//! 1. **Claim** (this thread): the session's journaled wake-up is read and
//!    resolved ([`Firing::resolve`]), and a batch holding only the claim row
//!    for its handle (kind `resumed`, actor [`SCHEDULER`], `claimedAt` now)
//!    is queued for the next group commit. It is the same one-time claim an
//!    explicit `session/resume` takes, so whichever is committed first wins
//!    and the other gets `already_resumed`. The suspension and its wake-up
//!    row stay.
//! 2. **Complete** (the session actor,
//!    [`crate::session::lifecycle::resume::settle_claimed`]): a parked actor
//!    whose suspension's handle is claimed completes that resume before it
//!    handles anything else. It removes the suspension, journals `resumed`
//!    (its `resumedAt` is the claim's time) and starts what it resumes, as an
//!    explicit resume does. Once the claim is durable the node sends the
//!    actor [`SessionMsg::Claimed`](crate::session::SessionMsg::Claimed), so
//!    this happens at once. Nothing waits on these writes and none of them
//!    can be refused, so they are not committed on their own: they ride
//!    with the resumed turn's first write (`Prelude::held` in
//!    `session::lifecycle::prompt`), which for a model that answers at once
//!    is its seal — one commit for resume, turn and seal. A model that keeps
//!    the turn waiting gets them written while it waits. Watchers hear of
//!    `resumed` once it is durable, as always.
//!
//! Only a claim the claimer took can sit beside its suspension: every other
//! claim (a resume, a cancel, a close, a `fail` timeout) removes the
//! suspension in its own batch. A crash between the phases (or before the
//! woken turn's first write) loses nothing:
//! the wake-up row is still there, so the next start re-arms it, it fires at
//! once, its claim is refused as already taken by the scheduler on this very
//! handle, and the actor is told to complete it.
//!
//! `onTimeout: fail` and schedule runs go through the actor in one phase, as
//! before (they are not resumes).

use std::sync::Arc;

use berth_runtime::ids::EventId;
use berth_runtime::receipt::TriggerMatch;
use berth_runtime::suspension::{DueKind, OnTimeout, ResumeCause, ResumeClaim, ResumeClaimKind};
use berth_scheduler::{Fired, Firing};
use berth_storage::{Batch, StorageError};
use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::node::ResumeParams;
use crate::session::SessionEnv;

/// The `actor` of the claims and receipts of wake-ups.
pub const SCHEDULER: &str = "scheduler";

/// What the claimer hands to the async runtime.
pub(crate) enum Job {
    /// A claim was queued for commit; once it is durable (or refused as
    /// taken by an earlier firing of the same wake-up), the session actor
    /// completes it.
    Claimed {
        /// What fired.
        firing: Firing,
        /// The claim queued.
        claim: ResumeClaim,
        /// The commit's outcome.
        ack: oneshot::Receiver<Result<Vec<EventId>, StorageError>>,
    },
    /// A wake-up whose timeout fails the suspension (`onTimeout: fail`):
    /// the session actor decides it in one phase.
    Fail(Firing),
    /// A standing schedule's run (as [`Fired::Schedule`]).
    Schedule {
        /// The schedule.
        schedule_id: String,
        /// When the run was due.
        due: DateTime<Utc>,
        /// How late it fires (ms).
        lateness_ms: u64,
    },
}

/// What a due wake-up resumes with, or `None` for `onTimeout: fail`: a
/// timeout resumes with cause `timeout` (input: a reminder that the wait
/// timed out, or the condition's `input`), a time trigger with cause
/// `condition_fired` (`seeds/acp-session-suspend-rfc.md`, "Resume path
/// enrichment").
pub(crate) fn resume_params(firing: &Firing) -> Option<ResumeParams> {
    let wakeup = &firing.wakeup;
    let minutes = wakeup.timeout.as_ref().map_or(0.0, |t| t.duration_minutes);
    let (cause, input, trigger) = match firing.kind {
        DueKind::Trigger => (
            ResumeCause::ConditionFired,
            None,
            TriggerMatch::Time { due_at: firing.due },
        ),
        DueKind::Timeout => {
            let notice = || {
                Value::String(format!(
                    "the wait timed out after {minutes} minute(s) without the condition being met; continue without it"
                ))
            };
            let input = match wakeup.on_timeout() {
                OnTimeout::Fail => return None,
                // Without an `input` (the RFC's ResumeTimeoutSpec has no
                // such field): the notice, as `resume_with_summary`.
                OnTimeout::ResumeWithInput => Some(
                    wakeup
                        .timeout
                        .as_ref()
                        .and_then(|t| t.input.clone())
                        .unwrap_or_else(notice),
                ),
                OnTimeout::ResumeWithSummary => Some(notice()),
            };
            let trigger = TriggerMatch::Timeout {
                due_at: firing.due,
                on_timeout: wakeup.on_timeout(),
            };
            (ResumeCause::Timeout, input, trigger)
        }
    };
    Some(ResumeParams {
        handle: Some(wakeup.handle.clone()),
        input,
        continue_transcript: true,
        cause,
        actor: SCHEDULER.into(),
        lateness_ms: Some(firing.lateness_ms),
        message_id: None,
        trigger: Some(trigger),
    })
}

/// Logs how a timekeeping thread's request for real-time priority went
/// (`raised`: `Ok(true)` raised, `Ok(false)` not asked, `Err` refused), under
/// the scheduler crate's target. A refusal is a warning: the configuration
/// asked for it (`realtime_timers`, on by default) and did not get it.
pub(crate) fn log_timer_priority(thread: &str, raised: &Result<bool, String>) {
    match raised {
        Ok(true) => tracing::info!(
            target: "berth_scheduler",
            thread,
            "runs at real-time priority (SCHED_FIFO 1)"
        ),
        Ok(false) => {}
        Err(why) => tracing::warn!(
            target: "berth_scheduler",
            thread,
            reason = %why,
            "runs at normal priority: wake-ups may be handed out late while the CPUs are \
             saturated (set realtime_timers = false to stop asking)"
        ),
    }
}

/// Starts the claimer thread: it takes what the scheduler hands out and
/// sends [`Job`]s to the returned channel. It holds the node weakly and ends
/// with it (when the scheduler's channel closes).
///
/// # Panics
/// If the OS cannot start a thread.
pub(crate) fn start(
    env: &Arc<SessionEnv>,
    mut fired: mpsc::UnboundedReceiver<Fired>,
) -> mpsc::UnboundedReceiver<Job> {
    let (jobs, out) = mpsc::unbounded_channel();
    let realtime = env.config.realtime_timers;
    let env = Arc::downgrade(env);
    std::thread::Builder::new()
        .name("berth-claimer".into())
        .spawn(move || {
            // A claim is what a wake-up's lateness is measured to: it must
            // not wait for a time slice behind the turns it wakes.
            log_timer_priority(
                "claimer",
                &berth_scheduler::realtime::raise_current_thread_if(realtime),
            );
            while let Some(fired) = fired.blocking_recv() {
                let job = match fired {
                    Fired::Wakeup(due) => {
                        let Some(env) = env.upgrade() else {
                            return;
                        };
                        match claim(&env, &due) {
                            Some(job) => job,
                            None => continue,
                        }
                    }
                    Fired::Schedule {
                        schedule_id,
                        due,
                        lateness_ms,
                    } => Job::Schedule {
                        schedule_id,
                        due,
                        lateness_ms,
                    },
                };
                if jobs.send(job).is_err() {
                    return;
                }
            }
        })
        .expect("spawn the claimer thread");
    out
}

/// Phase 1 for one due entry: resolve it against the journal and queue its
/// claim. `None` when there is nothing to do (a stale entry) or it cannot be
/// done now (it fires again at the next start).
fn claim(env: &SessionEnv, due: &berth_scheduler::Due) -> Option<Job> {
    let firing = match env.journal.wakeup(&due.session_id) {
        Ok(wakeup) => match Firing::resolve(due, wakeup) {
            Some(firing) => firing,
            None => {
                tracing::debug!(session_id = %due.session_id, "a stale wake-up entry was dropped");
                return None;
            }
        },
        Err(e) => {
            tracing::error!(session_id = %due.session_id, error = %e, "could not read a due wake-up; it fires at the next start");
            return None;
        }
    };
    crate::metrics::record_lateness(
        match firing.kind {
            DueKind::Timeout => "timeout",
            DueKind::Trigger => "trigger",
        },
        firing.lateness_ms,
    );
    let Some(params) = resume_params(&firing) else {
        return Some(Job::Fail(firing));
    };
    let claim = ResumeClaim {
        handle: firing.wakeup.handle.clone(),
        session_id: firing.wakeup.session_id.clone(),
        kind: ResumeClaimKind::Resumed,
        cause: Some(params.cause),
        actor: SCHEDULER.into(),
        claimed_at: env.config.clock.now(),
    };
    match env.journal.submit_blocking(Batch::new().claim(&claim)) {
        Ok(ack) => Some(Job::Claimed { firing, claim, ack }),
        Err(e) => {
            tracing::error!(session_id = %due.session_id, error = %e, "could not claim a due wake-up; it fires at the next start");
            None
        }
    }
}
