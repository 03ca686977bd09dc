//! A standing schedule's run on this session: start a prompt turn now, keep it
//! waiting behind the running one (overlap `buffer_one` / `allow_all`), or
//! skip it (`skip`, or the session is suspended or closed).

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

/// Handles one run of schedule `schedule_id`.
pub(crate) async fn run(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    schedule_id: String,
    text: String,
    overlap: OverlapPolicy,
) -> Result<ScheduledStart, ActorProcessingErr> {
    if state.record.closed_at.is_some() {
        return Ok(ScheduledStart::Skipped("session_closed".into()));
    }
    if state.suspension.is_some() {
        return Ok(ScheduledStart::Skipped("session_suspended".into()));
    }
    if state.turn.is_some() {
        let waiting = state
            .scheduled
            .iter()
            .filter(|(id, _)| *id == schedule_id)
            .count();
        return Ok(match overlap {
            OverlapPolicy::Skip => ScheduledStart::Skipped("overlap".into()),
            OverlapPolicy::BufferOne if waiting > 0 => {
                ScheduledStart::Skipped("overlap_buffer_full".into())
            }
            OverlapPolicy::BufferOne | OverlapPolicy::AllowAll => {
                state.scheduled.push_back((schedule_id, text));
                ScheduledStart::Buffered
            }
        });
    }
    Ok(
        match prompt::begin(myself, state, Prompt::text(text), None, Prelude::default()).await {
            Ok(_) => ScheduledStart::Started,
            Err((e, _)) => ScheduledStart::Skipped(e.to_string()),
        },
    )
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
}
