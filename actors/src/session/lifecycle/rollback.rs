//! `session/rollback` and `session/redo` (`remote-session-control.md`, "Turn
//! checkpoints"): pop the last completed turn, or push it back.
//!
//! A checkpoint is not addressable: both take only the session; the answer's
//! `checkpointId` says which one was used. Files the turn's `write_file` calls
//! changed are put back to their text before (rollback) or after (redo) the
//! turn; effects of `shell` commands are not tracked and not undone.

use berth_runtime::event::{ControlStatus, SessionEvent};
use berth_runtime::history::Transcript;
use berth_runtime::tools::files::{read_beneath, Beneath, Entry, MAX_REPLACED_BYTES};
use berth_runtime::tools::{FileChange, ToolContext};
use berth_storage::Batch;
use serde_json::{json, Value};

use super::super::receipt::{receipt, rejected};
use super::super::SessionState;
use crate::error::ControlError;

/// Puts `text` at the change's path (or removes it for `None`), resolved
/// beneath the session's roots as `write_file` resolves it: no symlink
/// followed, a temporary file renamed over the name, never a hard-linked file.
fn restore(ctx: &ToolContext, change: &FileChange, text: Option<&str>) -> Result<(), String> {
    let shown = change.path.display().to_string();
    let at = Beneath::locate(ctx, &shown).map_err(|e| e.to_string())?;
    match text {
        Some(text) => at.replace(text.as_bytes(), true),
        None => match at.entry().map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(entry) => at.replaceable(entry).and_then(|()| at.remove()),
        },
    }
    .map_err(|e| e.to_string())
}

fn session_ctx(state: &SessionState) -> ToolContext {
    ToolContext {
        additional_directories: state.record.additional_directories.clone(),
        processes: std::sync::Arc::clone(&state.processes),
        ..ToolContext::new(state.record.cwd.clone())
    }
}

/// Why a checkpoint's files cannot be moved: a path now outside the session's
/// directories (or behind a symlink), something that is not a regular file,
/// or a file changed since the checkpoint (it is never overwritten blindly).
fn check_files(state: &SessionState, changes: &[FileChange], redo: bool) -> Vec<String> {
    let ctx = session_ctx(state);
    let mut problems = Vec::new();
    for change in changes {
        let shown = change.path.display().to_string();
        let expected = if redo { &change.before } else { &change.after };
        let at = match Beneath::locate(&ctx, &shown) {
            Ok(at) if at.real() != change.path => {
                problems.push(format!("{shown}: now resolves to {}", at.real().display()));
                continue;
            }
            Err(e) => {
                problems.push(format!("{shown}: {e}"));
                continue;
            }
            Ok(at) => at,
        };
        match at.entry() {
            Err(e) => problems.push(format!("{shown}: {e}")),
            Ok(Some(entry @ Entry::File { .. })) => match at
                .replaceable(entry)
                .and_then(|()| read_beneath(&at, &shown, MAX_REPLACED_BYTES))
            {
                Err(e) => problems.push(format!("{shown}: {e}")),
                Ok(current) => {
                    let current = current.map(|b| String::from_utf8_lossy(&b).into_owned());
                    if current.as_deref() != expected.as_deref() {
                        problems.push(format!("{shown}: changed since the checkpoint"));
                    }
                }
            },
            Ok(Some(Entry::Symlink)) => problems.push(format!("{shown}: a symlink")),
            Ok(Some(Entry::Other)) => problems.push(format!("{shown}: not a regular file")),
            Ok(None) if expected.is_some() => {
                problems.push(format!("{shown}: deleted since the checkpoint"))
            }
            Ok(None) => {}
        }
    }
    problems
}

fn restore_all<'a>(
    ctx: &ToolContext,
    changes: impl Iterator<Item = &'a FileChange>,
    after: bool,
) -> Result<(), ControlError> {
    for change in changes {
        let text = if after { &change.after } else { &change.before };
        restore(ctx, change, text.as_deref()).map_err(|e| {
            ControlError::ActorFailed(format!("cannot restore {}: {e}", change.path.display()))
        })?;
    }
    Ok(())
}

/// Rolls back (`redo: false`) or redoes the last turn. Answers
/// `{status: "rolled_back" | "redone", checkpointId, beforeMessageCount,
/// afterMessageCount}`, or `{status: "prompt_active"}` while a turn runs and
/// `{status: "nothing_to_rollback" | "nothing_to_redo"}`, or
/// `{status: "files_conflict", paths}` — changing nothing — when a file the turn
/// wrote has changed since (by hand, or by a later shell command), is no longer
/// a regular file, or now resolves outside the session's directories. The
/// receipt and the transcript change are durable before the answer. The files
/// and the journal are not one transaction: a crash between them leaves the
/// files moved and the turn in place (a later rollback then reports the
/// conflict instead of guessing).
///
/// # Errors
/// [`ControlError::Storage`]; a file that cannot be restored
/// ([`ControlError::ActorFailed`], nothing journaled).
pub(crate) async fn rollback(
    state: &mut SessionState,
    redo: bool,
    actor: &str,
) -> Result<Value, ControlError> {
    let method = if redo {
        "session/redo"
    } else {
        "session/rollback"
    };
    let session_id = state.record.session_id.clone();
    let target = json!({"sessionId": session_id});
    let refuse =
        |state: &SessionState, status: &str| rejected(state, method, actor, target.clone(), status);
    if state.record.closed_at.is_some() {
        state.record(vec![refuse(state, "session_closed")]).await?;
        return Err(ControlError::SessionClosed { session_id });
    }
    if state.turn.is_some() {
        state.record(vec![refuse(state, "prompt_active")]).await?;
        return Ok(json!({"status": "prompt_active"}));
    }
    // A parked turn's frame is tied to the transcript it started from.
    if let Some(suspension) = &state.suspension {
        let handle = suspension.handle.clone();
        state
            .record(vec![refuse(state, "session_suspended")])
            .await?;
        return Err(ControlError::SessionSuspended { session_id, handle });
    }
    let head = state.record.checkpoint_head;
    let seq = if redo { head + 1 } else { head };
    let checkpoint = match seq {
        0 => None,
        seq => state.env.journal.checkpoint(&session_id, seq)?,
    };
    let Some(checkpoint) = checkpoint else {
        let status = if redo {
            "nothing_to_redo"
        } else {
            "nothing_to_rollback"
        };
        state.record(vec![refuse(state, status)]).await?;
        return Ok(json!({ "status": status }));
    };
    let problems = check_files(state, &checkpoint.files, redo);
    if !problems.is_empty() {
        state.record(vec![refuse(state, "files_conflict")]).await?;
        return Ok(json!({
            "status": "files_conflict",
            "checkpointId": checkpoint.checkpoint_id,
            "paths": problems,
        }));
    }
    // Files first (the effect), newest change undone first.
    let ctx = session_ctx(state);
    if redo {
        restore_all(&ctx, checkpoint.files.iter(), true)?;
    } else {
        restore_all(&ctx, checkpoint.files.iter().rev(), false)?;
    }
    let mut record = state.record.clone();
    record.checkpoint_head = if redo { seq } else { seq - 1 };
    record.updated_at = state.env.config.clock.now();
    let (status, outcome) = if redo {
        ("redone", "redone")
    } else {
        ("rolled_back", "rolled_back")
    };
    let answer = json!({
        "status": status,
        "checkpointId": checkpoint.checkpoint_id,
        "beforeMessageCount": checkpoint.before_message_count,
        "afterMessageCount": checkpoint.after_message_count,
    });
    let fact = if redo {
        SessionEvent::TurnRedone {
            checkpoint_id: checkpoint.checkpoint_id.clone(),
        }
    } else {
        SessionEvent::TurnRolledBack {
            checkpoint_id: checkpoint.checkpoint_id.clone(),
        }
    };
    let r = receipt(
        state,
        method,
        actor,
        ControlStatus::Accepted,
        outcome,
        target.clone(),
        None,
    );
    let transcript_change = if redo {
        Batch::new().append_transcript(
            &session_id,
            checkpoint.before_message_count,
            &checkpoint.messages,
        )
    } else {
        Batch::new().truncate_transcript(&session_id, checkpoint.before_message_count)
    };
    // One transaction: the transcript change, the head, the fact, the receipt.
    state
        .record_with(transcript_change.put_session(&record), vec![fact, r])
        .await?;
    state.record = record;
    let mut messages = state.transcript.messages().as_ref().clone();
    messages.truncate(checkpoint.before_message_count as usize);
    if redo {
        messages.extend(checkpoint.messages);
    }
    state.transcript = Transcript::from_messages(messages);
    Ok(answer)
}
