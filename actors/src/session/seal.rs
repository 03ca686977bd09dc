//! Sealing a turn that was left open by a process or actor that died.

use berth_runtime::engine::PermissionDecision;
use berth_runtime::event::{EventRecord, SessionEvent, ToolCallStatus};
use berth_runtime::history::{close_open_tool_calls, Message};
use berth_runtime::ids::{EventId, SessionId, ToolCallId};
use berth_runtime::model::Usage;
use berth_runtime::terminal::Terminal;
use berth_storage::{Batch, StorageError, TurnCheckpoint};
use serde_json::json;

use super::SessionEnv;

/// What a tool call or permission request left unsettled reads as.
const RESTARTED: &str = "abandoned: berth stopped while this tool call ran; \
                         its effects, if any, were not undone";

/// The facts that settle what the open turn left hanging, from its events:
/// tool calls announced or running get a `failed` update, permission waits a
/// `cancelled` answer, accepted injections that never landed a `dropped`.
fn loose_ends(events: &[SessionEvent]) -> Vec<SessionEvent> {
    let mut calls: Vec<(ToolCallId, bool)> = Vec::new(); // (id, settled)
    let mut permissions: Vec<(ToolCallId, bool)> = Vec::new();
    let mut injections: Vec<(String, bool)> = Vec::new();
    let settle = |list: &mut Vec<(ToolCallId, bool)>, id: &ToolCallId| {
        if let Some(entry) = list.iter_mut().find(|(c, _)| c == id) {
            entry.1 = true;
        }
    };
    for event in events {
        match event {
            SessionEvent::ToolCall { tool_call_id, .. } => {
                calls.push((tool_call_id.clone(), false))
            }
            SessionEvent::ToolCallUpdate {
                tool_call_id,
                status: ToolCallStatus::Completed | ToolCallStatus::Failed,
                ..
            } => settle(&mut calls, tool_call_id),
            SessionEvent::PermissionRequested { request } => {
                permissions.push((request.tool_call_id.clone(), false))
            }
            SessionEvent::PermissionResolved { tool_call_id, .. } => {
                settle(&mut permissions, tool_call_id)
            }
            SessionEvent::InjectionAccepted { injection } => {
                injections.push((injection.message_id.clone(), false))
            }
            SessionEvent::InjectionDelivered { injection, .. } => {
                if let Some(e) = injections
                    .iter_mut()
                    .find(|(m, _)| *m == injection.message_id)
                {
                    e.1 = true;
                }
            }
            SessionEvent::InjectionRevoked { message_id }
            | SessionEvent::InjectionDropped { message_id, .. } => {
                if let Some(e) = injections.iter_mut().find(|(m, _)| m == message_id) {
                    e.1 = true;
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (tool_call_id, _) in permissions.into_iter().filter(|(_, done)| !done) {
        out.push(SessionEvent::PermissionResolved {
            tool_call_id,
            decision: PermissionDecision::Cancelled,
        });
    }
    for (tool_call_id, _) in calls.into_iter().filter(|(_, done)| !done) {
        out.push(SessionEvent::ToolCallUpdate {
            tool_call_id,
            status: ToolCallStatus::Failed,
            raw_output: Some(json!({"reason": RESTARTED})),
            content: Some(RESTARTED.into()),
        });
    }
    for (message_id, _) in injections.into_iter().filter(|(_, done)| !done) {
        out.push(SessionEvent::InjectionDropped {
            message_id,
            reason: "berth stopped before this message was delivered".into(),
        });
    }
    out
}

/// If the session has an open turn, seals it with `terminal` in one durable
/// batch: the turn's loose ends settled (see [`loose_ends`]), a `turn_ended`
/// event, the transcript extended by what the turn's last checkpointed frame
/// holds (or just its prompt) with every unanswered tool call given an error
/// result, a turn checkpoint (so `session/rollback` pops this turn first),
/// and the open-turn marker and frame removed. The turn is never re-run.
/// Returns the sealing event's id, or `None` when no turn was open.
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
    let turn_messages = close_open_tool_calls(turn_messages, RESTARTED);
    // This turn's events: everything after its `turn_started`.
    let all = journal.events(session_id, 0)?;
    let begin = all
        .iter()
        .rposition(|(_, r)| matches!(&r.event, SessionEvent::TurnStarted { turn_id, .. } if *turn_id == open.turn_id))
        .unwrap_or(all.len());
    let turn_events: Vec<SessionEvent> =
        all[begin..].iter().map(|(_, r)| r.event.clone()).collect();
    let terminal = Terminal {
        reason: format!(
            "{} (turn started {})",
            terminal.reason,
            open.started_at.to_rfc3339()
        ),
        ..terminal
    };
    let now = env.config.clock.now();
    let mut events: Vec<EventRecord> = loose_ends(&turn_events)
        .into_iter()
        .map(|event| EventRecord { at: now, event })
        .collect();
    events.push(EventRecord {
        at: now,
        event: SessionEvent::TurnEnded {
            turn_id: open.turn_id.clone(),
            stop_reason: terminal.stop_reason(),
            terminal,
            usage,
        },
    });
    let mut batch = events
        .iter()
        .fold(Batch::new(), |b, e| b.append(session_id, e));
    if let Some(mut record) = journal.session(session_id)? {
        record.checkpoint_head += 1;
        record.updated_at = now;
        let checkpoint = TurnCheckpoint {
            checkpoint_id: open.turn_id.0.clone(),
            before_message_count: start,
            after_message_count: start + turn_messages.len() as u64,
            messages: turn_messages.clone(),
            files: Vec::new(),
        };
        batch = batch
            .delete_checkpoints_from(session_id, record.checkpoint_head)
            .put_checkpoint(session_id, record.checkpoint_head, &checkpoint)
            .put_session(&record);
    }
    let ids = journal
        .commit(
            batch
                .append_transcript(session_id, start, &turn_messages)
                .delete_frame(session_id)
                .close_turn(session_id),
        )
        .await?;
    tracing::warn!(session_id = %session_id, turn_id = %open.turn_id, "sealed a turn left open");
    Ok(ids.last().copied())
}

/// What ends a parked turn that will not continue (`session/close` while
/// suspended, or a resume with `continueTranscript: false`): its settled tool
/// results and an error result for every call that will never run enter the
/// transcript, its suspended and unstarted calls get a `failed` update, and a
/// `turn_ended` with `terminal` and a turn checkpoint are written. `record`
/// gets the new checkpoint head; the caller commits the batch with it.
/// Returns the writes, the events and the transcript messages appended.
pub(crate) fn seal_parked(
    record: &mut berth_storage::SessionRecord,
    transcript_len: u64,
    frame: &berth_runtime::frame::Frame,
    terminal: Terminal,
    why: &str,
) -> (Batch, Vec<SessionEvent>, Vec<Message>) {
    use berth_runtime::frame::ToolOutcomeStatus;
    let session_id = record.session_id.clone();
    let mut messages = frame.turn_messages.clone();
    let mut events = Vec::new();
    for outcome in &frame.tool_outcomes {
        if outcome.status == ToolOutcomeStatus::Suspended {
            continue;
        }
        messages.push(Message::Tool {
            tool_call_id: outcome.call.id.clone(),
            content: outcome.content.clone(),
            is_error: outcome.status != ToolOutcomeStatus::Completed,
        });
    }
    let never_run = frame
        .tool_outcomes
        .iter()
        .filter(|o| o.status == ToolOutcomeStatus::Suspended)
        .map(|o| &o.call)
        .chain(&frame.unstarted_calls);
    for call in never_run {
        events.push(SessionEvent::ToolCallUpdate {
            tool_call_id: call.id.clone(),
            status: ToolCallStatus::Failed,
            raw_output: Some(json!({"dispatched": false, "reason": why})),
            content: Some(why.to_owned()),
        });
    }
    let messages = close_open_tool_calls(messages, why);
    events.push(SessionEvent::TurnEnded {
        turn_id: frame.turn_id.clone(),
        stop_reason: terminal.stop_reason(),
        terminal,
        usage: frame.accounting.usage,
    });
    record.checkpoint_head += 1;
    let checkpoint = TurnCheckpoint {
        checkpoint_id: frame.turn_id.0.clone(),
        before_message_count: transcript_len,
        after_message_count: transcript_len + messages.len() as u64,
        messages: messages.clone(),
        files: frame.file_changes.clone(),
    };
    let batch = Batch::new()
        .delete_checkpoints_from(&session_id, record.checkpoint_head)
        .put_checkpoint(&session_id, record.checkpoint_head, &checkpoint)
        .append_transcript(&session_id, transcript_len, &messages);
    (batch, events, messages)
}
