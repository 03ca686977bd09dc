//! `session/prompt`: start a turn, and seal it when it finishes.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use berth_runtime::content::Prompt;
use berth_runtime::engine::{run_turn, TurnControl, TurnDeps, TurnOutcome, TurnSpec};
use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::history::Message;
use berth_runtime::ids::TurnId;
use berth_runtime::terminal::{Terminal, TerminalKind};
use berth_storage::{Batch, OpenTurn, TurnCheckpoint};
use futures::FutureExt;
use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};

use super::super::sink::JournalSink;
use super::super::{RunningTurn, SessionMsg, SessionState};
use crate::error::ControlError;
use crate::node::PromptOutcome;

/// Longest title derived from a first prompt (characters).
const TITLE_CHARS: usize = 80;

/// Accepts a prompt: journals `turn_started` and the open-turn marker (durable),
/// then runs the turn as a task owned by the actor. The reply is held until
/// [`finish`] seals the turn. Refuses with `SessionClosed` / `PromptActive`.
pub(crate) async fn start(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    prompt: Prompt,
    reply: RpcReplyPort<Result<PromptOutcome, ControlError>>,
) -> Result<(), ActorProcessingErr> {
    let session_id = state.record.session_id.clone();
    if state.record.closed_at.is_some() {
        let _ = reply.send(Err(ControlError::SessionClosed { session_id }));
        return Ok(());
    }
    if let Some(turn) = &state.turn {
        let _ = reply.send(Err(ControlError::PromptActive {
            session_id,
            turn_id: turn.turn_id.clone(),
        }));
        return Ok(());
    }
    let env = Arc::clone(&state.env);
    let now = env.config.clock.now();
    let turn_id = TurnId(env.config.ids.new_id("turn"));
    let prompt_text = prompt.to_model_text();
    let mut record = state.record.clone();
    record.updated_at = now;
    if record.title.is_none() {
        let first_line: String = prompt_text
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(TITLE_CHARS)
            .collect();
        record.title = Some(first_line).filter(|t| !t.trim().is_empty());
    }
    let started = EventRecord {
        at: now,
        event: SessionEvent::TurnStarted {
            turn_id: turn_id.clone(),
            prompt: prompt.clone(),
        },
    };
    let open = OpenTurn {
        session_id: session_id.clone(),
        turn_id: turn_id.clone(),
        started_at: now,
        prompt_text,
    };
    let batch = Batch::new()
        .put_session(&record)
        .append(&session_id, &started)
        .open_turn(&open);
    let ids = match env.journal.commit(batch).await {
        Ok(ids) => ids,
        Err(e) => {
            let _ = reply.send(Err(e.into()));
            return Ok(());
        }
    };
    state.record = record;
    let started = Arc::new(started);
    state.watchers.publish(
        &session_id,
        ids.into_iter().map(|id| (id, Arc::clone(&started))),
    );

    let control = Arc::new(TurnControl::default());
    let spec = TurnSpec {
        session_id: session_id.clone(),
        turn_id: turn_id.clone(),
        cwd: state.record.cwd.clone(),
        additional_directories: state.record.additional_directories.clone(),
        history: state.transcript.clone(),
        prompt,
        max_model_calls: env.config.max_model_calls,
    };
    let deps = TurnDeps {
        model: Arc::clone(&env.config.model),
        tools: env.config.tools.clone(),
        processes: Arc::clone(&state.processes),
        control: Arc::clone(&control),
        judge: env.config.completion_judge.clone(),
        needs_approval: env.config.needs_approval.clone(),
    };
    let sink = JournalSink {
        env,
        session_id,
        turn_id: turn_id.clone(),
        watchers: Arc::clone(&state.watchers),
    };
    let actor = myself.clone();
    let finished_id = turn_id.clone();
    let task = tokio::spawn(async move {
        // A panic inside the turn (a tool, a provider) must still seal the turn.
        let outcome = match AssertUnwindSafe(run_turn(&spec, &deps, &sink))
            .catch_unwind()
            .await
        {
            Ok(outcome) => outcome,
            Err(panic) => panicked_turn(&spec, panic.as_ref()),
        };
        // Release the turn's share of the transcript before the actor extends it.
        drop((spec, deps, sink));
        // If the actor is gone, its successor seals the turn from the journal.
        let _ = actor.send_message(SessionMsg::TurnFinished {
            turn_id: finished_id,
            outcome,
        });
    });
    state.turn = Some(RunningTurn {
        turn_id,
        control,
        reply: Some(reply),
        task: task.abort_handle(),
    });
    Ok(())
}

/// The outcome of a turn whose task panicked: an `internal_error` terminal
/// naming the panic; the transcript keeps the prompt.
fn panicked_turn(spec: &TurnSpec, panic: &(dyn std::any::Any + Send)) -> TurnOutcome {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    tracing::error!(session_id = %spec.session_id, turn_id = %spec.turn_id, panic = %what, "turn task panicked");
    TurnOutcome {
        terminal: Terminal::new(
            TerminalKind::InternalError,
            format!("the turn failed inside berth: {what}"),
        ),
        usage: Default::default(),
        turn_messages: vec![Message::User {
            text: spec.prompt.to_model_text(),
        }],
        file_changes: Vec::new(),
    }
}

/// Seals the finished turn: one durable batch with `turn_ended`, the new
/// transcript, and the open-turn marker and frame removed; then answers the
/// prompt and completes a close that was waiting for the turn.
///
/// # Errors
/// A journal failure fails the actor after answering the prompt with it; the
/// supervisor restarts the actor, which seals the turn from the journal.
pub(crate) async fn finish(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    turn_id: TurnId,
    outcome: TurnOutcome,
) -> Result<(), ActorProcessingErr> {
    if state.turn.as_ref().is_none_or(|t| t.turn_id != turn_id) {
        return Ok(());
    }
    let Some(mut turn) = state.turn.take() else {
        return Ok(());
    };
    let env = Arc::clone(&state.env);
    let session_id = state.record.session_id.clone();
    let now = env.config.clock.now();
    let start = state.transcript.len() as u64;
    let terminal = outcome.terminal;
    let stop_reason = terminal.stop_reason();
    // Injections accepted after the turn's loop exited never reached it.
    let late = turn.control.steering().drain_all();
    let mut events: Vec<EventRecord> = late
        .into_iter()
        .map(|injection| EventRecord {
            at: now,
            event: SessionEvent::InjectionDropped {
                message_id: injection.message_id,
                reason: "the turn ended before this message was delivered".into(),
            },
        })
        .collect();
    events.push(EventRecord {
        at: now,
        event: SessionEvent::TurnEnded {
            turn_id: turn_id.clone(),
            stop_reason,
            terminal: terminal.clone(),
            usage: outcome.usage,
        },
    });
    // The turn's checkpoint; a new turn discards what was rolled back.
    let mut record = state.record.clone();
    record.updated_at = now;
    record.checkpoint_head += 1;
    let checkpoint = TurnCheckpoint {
        checkpoint_id: turn_id.0.clone(),
        before_message_count: start,
        after_message_count: start + outcome.turn_messages.len() as u64,
        messages: outcome.turn_messages.clone(),
        files: outcome.file_changes.clone(),
    };
    let batch = events
        .iter()
        .fold(Batch::new().put_session(&record), |b, e| {
            b.append(&session_id, e)
        })
        .delete_checkpoints_from(&session_id, record.checkpoint_head)
        .put_checkpoint(&session_id, record.checkpoint_head, &checkpoint)
        .append_transcript(&session_id, start, &outcome.turn_messages)
        .delete_frame(&session_id)
        .close_turn(&session_id);
    match env.journal.commit(batch).await {
        Ok(ids) => {
            state.record = record;
            state.transcript.extend(outcome.turn_messages);
            state.last_control = Some(Arc::clone(&turn.control));
            state.watchers.publish(
                &session_id,
                ids.into_iter().zip(events.into_iter().map(Arc::new)),
            );
            if let Some(reply) = turn.reply.take() {
                let _ = reply.send(Ok(PromptOutcome {
                    turn_id,
                    terminal,
                    stop_reason,
                    usage: outcome.usage,
                }));
            }
        }
        Err(e) => {
            if let Some(reply) = turn.reply.take() {
                let _ = reply.send(Err(e.clone().into()));
            }
            return Err(Box::new(e));
        }
    }
    if !state.pending_close.is_empty() {
        super::close::finalize(myself, state).await?;
    }
    Ok(())
}
