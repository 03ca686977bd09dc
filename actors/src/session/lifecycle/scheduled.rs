//! A standing schedule's run on this session: start a prompt turn now, keep it
//! waiting behind the running one (overlap `buffer_one` / `allow_all`), or
//! skip it (`skip`, or the session is suspended or closed).
//!
//! Waiting runs are counted durably in the schedule row (`buffered`): this
//! actor changes the count as runs enter and leave its queue, so the count
//! and the queue change in the one place that serializes them. A run that
//! started but whose count change did not commit before a crash is
//! delivered again at the next start: at least once, never lost.

use berth_runtime::content::Prompt;
use berth_runtime::suspension::OverlapPolicy;
use ractor::{ActorProcessingErr, ActorRef};

use super::super::{SessionMsg, SessionState};
use super::prompt::{self, Prelude};

/// What became of one scheduled run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduledStart {
    /// A turn started.
    Started,
    /// It waits for the running turn to end.
    Buffered,
    /// It was skipped, and why.
    Skipped(String),
}

/// Handles one run of schedule `schedule_id` (`redelivered`: a run that was
/// buffered when berth stopped, already counted in `buffered`).
pub(crate) async fn run(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    schedule_id: String,
    text: String,
    overlap: OverlapPolicy,
    redelivered: bool,
) -> Result<ScheduledStart, ActorProcessingErr> {
    let id = schedule_id.clone();
    let started = decide(myself, state, schedule_id, text, overlap).await;
    let delta: i64 = match (&started, redelivered) {
        (ScheduledStart::Buffered, false) => 1,
        (ScheduledStart::Started | ScheduledStart::Skipped(_), true) => -1,
        _ => 0,
    };
    if delta != 0 {
        count_buffered(state, &id, delta).await;
    }
    Ok(started)
}

/// Moves schedule `id`'s durable `buffered` count by `delta`.
async fn count_buffered(state: &SessionState, id: &str, delta: i64) {
    let change = |s: &mut berth_runtime::suspension::Schedule| {
        s.buffered = if delta > 0 {
            s.buffered.saturating_add(1)
        } else {
            s.buffered.saturating_sub(1)
        };
    };
    if let Err(e) = state.env.update_schedule(id, change).await {
        tracing::error!(schedule_id = %id, error = %e, "could not record a buffered scheduled run");
    }
}

async fn decide(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    schedule_id: String,
    text: String,
    overlap: OverlapPolicy,
) -> ScheduledStart {
    if state.record.closed_at.is_some() {
        return ScheduledStart::Skipped("session_closed".into());
    }
    if state.suspension.is_some() {
        return ScheduledStart::Skipped("session_suspended".into());
    }
    if state.turn.is_some() {
        let waiting = state
            .scheduled
            .iter()
            .filter(|(id, _)| *id == schedule_id)
            .count();
        return match overlap {
            OverlapPolicy::Skip => ScheduledStart::Skipped("overlap".into()),
            OverlapPolicy::BufferOne if waiting > 0 => {
                ScheduledStart::Skipped("overlap_buffer_full".into())
            }
            OverlapPolicy::BufferOne | OverlapPolicy::AllowAll => {
                state.scheduled.push_back((schedule_id, text));
                ScheduledStart::Buffered
            }
        };
    }
    match prompt::begin(myself, state, Prompt::text(text), None, Prelude::default()).await {
        Ok(_) => ScheduledStart::Started,
        Err((e, _)) => ScheduledStart::Skipped(e.to_string()),
    }
}

/// Starts the next buffered run, if the session is idle and one waits.
pub(crate) async fn start_buffered(myself: &ActorRef<SessionMsg>, state: &mut SessionState) {
    if state.turn.is_some() || state.suspension.is_some() || state.record.closed_at.is_some() {
        return;
    }
    let Some((schedule_id, text)) = state.scheduled.pop_front() else {
        return;
    };
    if let Err((e, _)) =
        prompt::begin(myself, state, Prompt::text(text), None, Prelude::default()).await
    {
        tracing::warn!(%schedule_id, error = %e, "a buffered scheduled run could not start");
    }
    count_buffered(state, &schedule_id, -1).await;
}
