//! Sealing a turn that was left open by a process or actor that died.

use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::history::Message;
use berth_runtime::ids::{EventId, SessionId};
use berth_runtime::model::Usage;
use berth_runtime::terminal::Terminal;
use berth_storage::{Batch, StorageError};

use super::SessionEnv;

/// If the session has an open turn, seals it with `terminal` in one durable
/// batch: a `turn_ended` event, the transcript extended by what the turn's last
/// checkpointed frame holds (or just its prompt), and the open-turn marker and
/// frame removed. The turn is never re-run. Returns the sealing event's id, or
/// `None` when no turn was open.
///
/// **Durable on return.**
///
/// # Errors
/// [`StorageError`] when the journal cannot be read or written; nothing changed.
pub async fn seal_open_turn(
    env: &SessionEnv,
    session_id: &SessionId,
    terminal: Terminal,
) -> Result<Option<EventId>, StorageError> {
    let journal = &env.journal;
    let Some(open) = journal.open_turn(session_id)? else {
        return Ok(None);
    };
    let start = journal.transcript_len(session_id)?;
    let (turn_messages, usage) = match journal.frame(session_id)? {
        Some(frame) if frame.turn_id == open.turn_id => {
            (frame.turn_messages, frame.accounting.usage)
        }
        _ => (
            vec![Message::User {
                text: open.prompt_text.clone(),
            }],
            Usage::default(),
        ),
    };
    let terminal = Terminal {
        reason: format!(
            "{} (turn started {})",
            terminal.reason,
            open.started_at.to_rfc3339()
        ),
        ..terminal
    };
    let record = EventRecord {
        at: env.config.clock.now(),
        event: SessionEvent::TurnEnded {
            turn_id: open.turn_id.clone(),
            stop_reason: terminal.stop_reason(),
            terminal,
            usage,
        },
    };
    let ids = journal
        .commit(
            Batch::new()
                .append(session_id, &record)
                .append_transcript(session_id, start, &turn_messages)
                .delete_frame(session_id)
                .close_turn(session_id),
        )
        .await?;
    tracing::warn!(session_id = %session_id, turn_id = %open.turn_id, "sealed a turn left open");
    Ok(ids.first().copied())
}
