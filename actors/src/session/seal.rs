//! Sealing a turn that was left open by a process or actor that died.

use berth_runtime::engine::PermissionDecision;
use berth_runtime::event::{EventRecord, SessionEvent, ToolCallStatus};
use berth_runtime::history::{close_open_tool_calls, Message};
use berth_runtime::ids::{EventId, SessionId, ToolCallId};
use berth_runtime::model::Usage;
use berth_runtime::terminal::{Terminal, TerminalKind};
use berth_storage::{Batch, StorageError, TurnCheckpoint};
use serde_json::json;

use super::lifecycle::suspend;
use super::receipt::stamp;
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

/// If the session has an open turn, seals it with `terminal` — or with
/// `user_cancelled` (owner `user`) when the journal holds the accepted
/// receipt of the `session/cancel` that stopped it: that cancel was answered
/// `cancelled`, and its durable receipt decides the seal — in one durable
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
    // A cancel the journal holds for this turn was answered `cancelled`:
    // the turn ends as the client was told, whatever stopped berth before
    // the seal.
    let terminal = if cancel_journaled(&turn_events) {
        Terminal::new(
            TerminalKind::UserCancelled,
            "a client sent session/cancel; berth stopped before the turn was sealed",
        )
    } else {
        terminal
    };
    let terminal = Terminal {
        reason: format!(
            "{} (turn started {})",
            terminal.reason,
            open.started_at.to_rfc3339()
        ),
        ..terminal
    };
    let now = env.config.clock.now();
    let mut events: Vec<EventRecord> = stamp(
        env,
        session_id,
        Some(&open.turn_id),
        now,
        loose_ends(&turn_events),
    );
    events.push(EventRecord::new(
        now,
        SessionEvent::TurnEnded {
            turn_id: open.turn_id.clone(),
            stop_reason: terminal.stop_reason(),
            terminal,
            usage,
        },
    ));
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

/// Whether `turn_events` (a turn's events from its `turn_started`) hold the
/// accepted receipt of a `session/cancel` that stopped it (outcome
/// `cancelled`).
fn cancel_journaled(turn_events: &[SessionEvent]) -> bool {
    turn_events.iter().any(|event| {
        matches!(event, SessionEvent::ControlOutcome(o)
            if o.receipt.method == "session/cancel"
                && o.receipt.status == berth_runtime::event::ControlStatus::Accepted
                && o.receipt.outcome == "cancelled")
    })
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

/// Settles a turn left open by a process or actor that died. A turn that was
/// parking — a suspension was requested (and journaled) while it ran, or the
/// agent parked itself — completes its suspension from its last checkpoint
/// ([`recover_suspension`]): the suspend had been accepted, so it is honoured,
/// and nothing that ran is run again. Any other open turn is sealed with
/// `terminal` ([`seal_open_turn`]).
///
/// **Durable on return.** `true` when there was an open turn to settle
/// (the session's record changed).
///
/// # Errors
/// [`StorageError`]; nothing changed.
pub async fn settle_open_turn(
    env: &SessionEnv,
    session_id: &SessionId,
    terminal: Terminal,
) -> Result<bool, StorageError> {
    let journal = &env.journal;
    let Some(open) = journal.open_turn(session_id)? else {
        return Ok(false);
    };
    let Some(record) = journal.session(session_id)? else {
        return Ok(false);
    };
    let frame = journal
        .frame(session_id)?
        .filter(|f| f.turn_id == open.turn_id);
    let all = journal.events(session_id, 0)?;
    let begin = all
        .iter()
        .rposition(|(_, r)| matches!(&r.event, SessionEvent::TurnStarted { turn_id, .. } if *turn_id == open.turn_id))
        .unwrap_or(0);
    let turn_events: Vec<SessionEvent> =
        all[begin..].iter().map(|(_, r)| r.event.clone()).collect();
    let frame = frame.map(|f| recover_frame(f, &turn_events));
    let parking =
        record.suspend_request.is_some() || frame.as_ref().is_some_and(|(f, _)| f.park().is_some());
    if !parking {
        seal_open_turn(env, session_id, terminal).await?;
        return Ok(true);
    }
    recover_suspension(env, record, open, frame, &turn_events).await?;
    Ok(true)
}

/// Completes the suspension of a turn that was parking when berth stopped:
/// the frame is its last checkpoint brought up to date from the journal
/// ([`recover_frame`]), or — before its first checkpoint — a frame about to
/// make its first model call. Loose ends are settled as for a seal, except
/// that calls which never started stay unstarted (they run after resume).
async fn recover_suspension(
    env: &SessionEnv,
    mut record: berth_storage::SessionRecord,
    open: berth_storage::OpenTurn,
    frame: Option<(berth_runtime::frame::Frame, Vec<ToolCallId>)>,
    turn_events: &[SessionEvent],
) -> Result<(), StorageError> {
    use berth_runtime::frame::{Accounting, Frame, Phase, FRAME_VERSION};
    let session_id = record.session_id.clone();
    let now = env.config.clock.now();
    let (frame, unknown) = match frame {
        Some(found) => found,
        None => {
            let from = usize::try_from(record.context_from).unwrap_or(usize::MAX);
            let transcript = env.journal.transcript(&session_id)?;
            let history = berth_runtime::history::Transcript::from_messages(
                transcript.get(from..).unwrap_or_default().to_vec(),
            );
            let frame = Frame {
                version: FRAME_VERSION,
                session_id: session_id.clone(),
                turn_id: open.turn_id.clone(),
                phase: Phase::Provider,
                iteration: 0,
                accounting: Accounting::default(),
                tool_outcomes: Vec::new(),
                unstarted_calls: Vec::new(),
                turn_messages: vec![Message::User {
                    text: open.prompt_text.clone(),
                }],
                history_fingerprint: history.fingerprint().to_owned(),
                config_fingerprint: berth_runtime::engine::config_fingerprint_of(
                    env.config.model.as_ref(),
                    &env.config.tools,
                    env.config.max_model_calls,
                ),
                dispatch_skipped: false,
                skip_reason: None,
                resume_notes: Vec::new(),
                file_changes: Vec::new(),
            };
            (frame, Vec::new())
        }
    };
    let (request, method, summary, drained) = match record.suspend_request.take() {
        // Completed at start-up, outside any seam.
        Some(request) => {
            let drained = Some((request.mode, None, open.turn_id.clone()));
            (request, "session/suspend", None, drained)
        }
        None => {
            let (request, summary) = suspend::agent_request(env, frame.park().cloned(), now);
            (request, suspend::AGENT_METHOD, summary, None)
        }
    };
    // Loose ends: permission waits and undelivered injections as for a
    // seal; a tool call only when it ran and its outcome is now unknown.
    let mut events: Vec<SessionEvent> = loose_ends(turn_events)
        .into_iter()
        .filter(|event| match event {
            SessionEvent::ToolCallUpdate { tool_call_id, .. } => unknown.contains(tool_call_id),
            _ => true,
        })
        .collect();
    record.updated_at = now;
    let mut suspension = suspend::envelope(&record, &request, Some(frame), summary, now);
    // The turn's span died with the process that ran it: only the suspend
    // span is linked.
    let span = crate::telemetry::suspend_span(&mut suspension, None);
    events.extend(suspend::parked_events(env, &suspension, method, drained));
    let records = stamp(env, &session_id, Some(&open.turn_id), now, events);
    drop(span);
    env.journal
        .commit(suspend::park_batch(&record, &suspension, &records))
        .await?;
    tracing::warn!(session_id = %session_id, handle = %suspension.handle, "completed a suspension left quiescing");
    Ok(())
}

/// Brings a turn's last checkpointed frame up to date with what its events
/// say happened after it: in a tool batch, calls that settled get their
/// recorded outcome, a call that yielded a continuation keeps it, a call that
/// was running has an unknown outcome (never re-run), and calls that never
/// started stay unstarted. When the whole batch settled, its results enter
/// the transcript and the frame stands before the next model call. Returns
/// the frame and the calls whose outcome is unknown.
fn recover_frame(
    mut frame: berth_runtime::frame::Frame,
    events: &[SessionEvent],
) -> (berth_runtime::frame::Frame, Vec<ToolCallId>) {
    use berth_runtime::frame::{Phase, ToolOutcome, ToolOutcomeStatus};
    use berth_runtime::tools::{AgentPark, ToolContinuation};
    let mut unknown = Vec::new();
    if frame.phase != Phase::Tools {
        return (frame, unknown);
    }
    let last_update = |id: &ToolCallId| {
        events.iter().rev().find_map(|event| match event {
            SessionEvent::ToolCallUpdate {
                tool_call_id,
                status,
                raw_output,
                content,
            } if tool_call_id == id => Some((*status, raw_output.clone(), content.clone())),
            _ => None,
        })
    };
    // A resume of this turn after a call last yielded claimed that call's
    // park: the agent's wait is over (its `await_resumption` was answered),
    // so a crash before the call settled must not park the turn again under
    // a new handle the agent never asked for.
    let resumed_at = events.iter().rposition(|event| {
        matches!(event, SessionEvent::Resumed { turn_id: Some(t), .. } if *t == frame.turn_id)
    });
    let yielded_at = |id: &ToolCallId| {
        events.iter().rposition(|event| {
            matches!(event, SessionEvent::ToolCallUpdate { tool_call_id, raw_output: Some(raw), .. }
                if tool_call_id == id && raw.get("suspended").is_some())
        })
    };
    // Suspended calls a resumed batch continued since the checkpoint.
    for outcome in &mut frame.tool_outcomes {
        if outcome.status != ToolOutcomeStatus::Suspended {
            continue;
        }
        if resumed_at.is_some() && resumed_at > yielded_at(&outcome.call.id) {
            outcome.park = None;
        }
        if let Some((status @ (ToolCallStatus::Completed | ToolCallStatus::Failed), _, content)) =
            last_update(&outcome.call.id)
        {
            outcome.status = if status == ToolCallStatus::Completed {
                ToolOutcomeStatus::Completed
            } else {
                ToolOutcomeStatus::Failed
            };
            outcome.content = content.unwrap_or_default();
            outcome.continuation = None;
            outcome.park = None;
        }
    }
    let calls = std::mem::take(&mut frame.unstarted_calls);
    let mut rest = calls.into_iter();
    for call in rest.by_ref() {
        let Some((status, raw, content)) = last_update(&call.id) else {
            frame.unstarted_calls.push(call);
            break;
        };
        let content = content.unwrap_or_default();
        let continuation = raw
            .as_ref()
            .filter(|raw| raw.get("suspended").is_some())
            .and_then(|raw| raw.get("continuation"))
            .and_then(|c| serde_json::from_value::<ToolContinuation>(c.clone()).ok());
        let outcome = match (status, continuation) {
            (ToolCallStatus::Completed, _) => (ToolOutcomeStatus::Completed, content, None),
            (ToolCallStatus::Failed, _) => (ToolOutcomeStatus::Failed, content, None),
            (_, Some(continuation)) => (ToolOutcomeStatus::Suspended, content, Some(continuation)),
            _ => {
                unknown.push(call.id.clone());
                (ToolOutcomeStatus::Unknown, RESTARTED.to_owned(), None)
            }
        };
        let park = outcome
            .2
            .as_ref()
            .filter(|c| c.tool == berth_runtime::tools::await_resumption::NAME)
            .and_then(|c| serde_json::from_value::<AgentPark>(c.state.clone()).ok());
        frame.tool_outcomes.push(ToolOutcome {
            call,
            status: outcome.0,
            content: outcome.1,
            continuation: outcome.2,
            park,
        });
    }
    frame.unstarted_calls.extend(rest);
    let parked = frame
        .tool_outcomes
        .iter()
        .any(|o| o.status == ToolOutcomeStatus::Suspended);
    if frame.unstarted_calls.is_empty() && !parked {
        for outcome in &frame.tool_outcomes {
            frame.turn_messages.push(Message::Tool {
                tool_call_id: outcome.call.id.clone(),
                content: outcome.content.clone(),
                is_error: outcome.status != ToolOutcomeStatus::Completed,
            });
        }
        frame.turn_messages.extend(
            std::mem::take(&mut frame.resume_notes)
                .into_iter()
                .map(|text| Message::User { text }),
        );
        frame.phase = Phase::Provider;
    }
    (frame, unknown)
}

#[cfg(test)]
mod tests {
    use berth_runtime::event::{SessionEvent, ToolCallStatus};
    use berth_runtime::frame::{Accounting, Frame, Phase, ToolOutcome, ToolOutcomeStatus};
    use berth_runtime::history::{Message, ToolCallRequest};
    use berth_runtime::ids::{SessionId, ToolCallId, TurnId};
    use berth_runtime::suspension::ResumeCause;
    use berth_runtime::tools::{AgentPark, ToolContinuation};
    use serde_json::json;

    use super::recover_frame;

    /// A turn parked on the agent's `await_resumption` (as the resume puts
    /// it back in the frame row), and the events up to its park.
    fn parked_on_await() -> (Frame, Vec<SessionEvent>) {
        let turn_id = TurnId("turn_1".into());
        let call = ToolCallRequest {
            id: ToolCallId("turn_1_1_0".into()),
            name: "await_resumption".into(),
            arguments: json!({"reason": "agent waits"}),
        };
        let continuation = ToolContinuation {
            tool: "await_resumption".into(),
            version: 1,
            state: json!({"reason": "agent waits"}),
        };
        let frame = Frame {
            version: berth_runtime::frame::FRAME_VERSION,
            session_id: SessionId("sess_1".into()),
            turn_id: turn_id.clone(),
            phase: Phase::Tools,
            iteration: 1,
            accounting: Accounting::default(),
            tool_outcomes: vec![ToolOutcome {
                call: call.clone(),
                status: ToolOutcomeStatus::Suspended,
                content: "parked: agent waits".into(),
                continuation: Some(continuation.clone()),
                park: Some(AgentPark {
                    reason: "agent waits".into(),
                    conditions: Default::default(),
                    summary: None,
                }),
            }],
            unstarted_calls: vec![],
            turn_messages: vec![Message::User {
                text: "selfpark".into(),
            }],
            history_fingerprint: String::new(),
            config_fingerprint: String::new(),
            dispatch_skipped: false,
            skip_reason: None,
            resume_notes: vec![],
            file_changes: vec![],
        };
        let events = vec![
            SessionEvent::ToolCallUpdate {
                tool_call_id: call.id.clone(),
                status: ToolCallStatus::InProgress,
                raw_output: None,
                content: None,
            },
            SessionEvent::ToolCallUpdate {
                tool_call_id: call.id.clone(),
                status: ToolCallStatus::InProgress,
                raw_output: Some(json!({"suspended": true, "continuation": continuation})),
                content: Some("parked: agent waits".into()),
            },
        ];
        (frame, events)
    }

    #[test]
    fn a_park_not_yet_resumed_is_kept() {
        let (frame, events) = parked_on_await();
        let (recovered, unknown) = recover_frame(frame, &events);
        assert!(recovered.park().is_some());
        assert!(unknown.is_empty());
    }

    /// Killed after a resume claimed the agent's park but before its
    /// `await_resumption` settled: the turn was running, not parking, so it
    /// is sealed at restart rather than parked again under a new handle.
    #[test]
    fn a_park_a_resume_claimed_does_not_park_the_turn_again() {
        let (frame, mut events) = parked_on_await();
        let call_id = frame.tool_outcomes[0].call.id.clone();
        events.push(SessionEvent::Resumed {
            handle: "susp_1".into(),
            cause: ResumeCause::ExplicitResume,
            had_resume_input: true,
            continue_transcript: true,
            resumed_at: chrono::Utc::now(),
            turn_id: Some(frame.turn_id.clone()),
            lateness_ms: None,
            input: None,
            message_id: None,
        });
        let (recovered, _) = recover_frame(frame.clone(), &events);
        assert!(recovered.park().is_none(), "{recovered:?}");
        // …also once the continued call reported it was running again.
        events.push(SessionEvent::ToolCallUpdate {
            tool_call_id: call_id,
            status: ToolCallStatus::InProgress,
            raw_output: None,
            content: None,
        });
        let (recovered, _) = recover_frame(frame, &events);
        assert!(recovered.park().is_none(), "{recovered:?}");
    }
}
