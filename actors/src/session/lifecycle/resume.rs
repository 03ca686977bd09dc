//! `session/resume` with a suspension to wake (`seeds/acp-session-suspend-rfc.md`,
//! "Resume path enrichment"; `seeds/execution-suspension.md`, admission claim).
//!
//! Resume is a one-time claim: the claim row, the removal of the envelope and
//! whatever the resume starts (the parked turn reopened, or a fresh turn) are
//! one storage transaction, and the journal refuses a second claim of the same
//! handle. History/configuration fingerprints, the closed state and the handle
//! are checked before the claim; nothing is retried implicitly.

use std::sync::Arc;

use berth_runtime::budget::BudgetLimits;
use berth_runtime::content::Prompt;
use berth_runtime::engine::{check_resumable, TurnControl};
use berth_runtime::event::{ControlStatus, SessionEvent};
use berth_runtime::frame::Frame;
use berth_runtime::history::Message;
use berth_runtime::ids::TurnId;
use berth_runtime::receipt::{sha256_of_json, ResumptionReceipt};
use berth_runtime::suspension::{ResumeClaim, ResumeClaimKind, Suspension, Wakeup};
use berth_runtime::terminal::{Terminal, TerminalKind, TerminalOwner};
use berth_runtime::tools::ResumeInput;
use berth_storage::{Batch, OpenTurn, StorageError};
use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{json, Value};
use tracing::Instrument;

use super::super::receipt::{receipt, rejected, stamp};
use super::super::seal::seal_parked;
use super::super::sink::Held;
use super::super::{SessionMsg, SessionState};
use super::prompt::{self, Prelude, Run};
use crate::error::{ControlError, ResumeConflict};
use crate::node::{ResumeOutcome, ResumeParams};

const METHOD: &str = "session/resume";
/// What a parked turn's never-run calls read when a resume starts a fresh
/// transcript instead of continuing it.
pub(crate) const FRESH_TRANSCRIPT_WHY: &str =
    "not run: the session was resumed with a fresh transcript";
/// Longest quote of one message in a fresh-transcript digest (characters).
const QUOTE_CHARS: usize = 400;

/// Handles a resume claim. Answered (not returned): the outcome, or
/// `SessionClosed`, `ResumeConflict` (`already_resumed` / `not_suspended`),
/// `ResumeRefused` (fingerprints), `Storage`.
pub(crate) async fn resume(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    params: ResumeParams,
    reply: RpcReplyPort<Result<ResumeOutcome, ControlError>>,
) -> Result<(), ActorProcessingErr> {
    let answer = match claim(myself, state, &params).await {
        // A wake-up's claim landed between this resume's check and its
        // commit: that resume is completed, and this one is answered
        // against the resumed session, as if it had come after.
        Err(e) if lost_to_a_claim_on_commit(state, &e) => {
            if let Some(Err(e)) = settle_claimed(myself, state).await {
                tracing::warn!(session_id = %state.record.session_id, error = %e, "a resume lost to a wake-up whose resume could not be completed");
            }
            claim(myself, state, &params).await
        }
        other => other,
    };
    let _ = reply.send(answer);
    Ok(())
}

/// A claim refused at commit: `already_resumed` naming a claim on the
/// suspension the session still holds (a refusal found before the commit
/// names a handle that is no longer the session's, and was journaled).
fn lost_to_a_claim_on_commit(state: &SessionState, error: &ControlError) -> bool {
    match (error, &state.suspension) {
        (
            ControlError::ResumeConflict {
                reason: ResumeConflict::AlreadyResumed { claim },
                ..
            },
            Some(suspension),
        ) => claim.handle == suspension.handle,
        _ => false,
    }
}

async fn claim(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    params: &ResumeParams,
) -> Result<ResumeOutcome, ControlError> {
    let suspension = match current(state, params) {
        Ok(suspension) => suspension,
        Err(e) => return Err(refuse(state, params, e).await),
    };
    // A new root that links back to the suspension (see `crate::telemetry`);
    // the turn the resume starts is its child.
    let span = crate::telemetry::resume_span(&suspension, params);
    wake(myself, state, params, &suspension, None)
        .instrument(span)
        .await
}

/// Whether a control's write lost to a claim on the session's suspension:
/// the claimer's claim landed after the control's check and before its
/// commit. The caller completes that resume ([`settle_claimed`]) and applies
/// the control to what it started.
pub(crate) fn lost_to_a_claim(error: &ControlError) -> bool {
    matches!(
        error,
        ControlError::Storage(StorageError::AlreadyClaimed { .. })
    )
}

/// Phase 2 of a wake-up's resume (see [`crate::claimer`]): when the
/// session's suspension's handle carries a claim, the claimer took it and
/// the resume is completed now, as that claim says (`resumedAt` is the
/// claim's time; cause, input and trigger come from the wake-up, as the
/// claimer derived them). A parked turn that cannot continue under today's
/// configuration resumes with a fresh transcript instead (the claim is
/// taken: the session must wake). `None` when there is nothing to complete.
pub(crate) async fn settle_claimed(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
) -> Option<Result<ResumeOutcome, ControlError>> {
    settle_claim(myself, state, None).await
}

/// [`settle_claimed`], given the claim the claimer just committed
/// (`committed`), which spares reading it back from the journal when it is
/// on the current suspension.
pub(crate) async fn settle_claim(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    committed: Option<ResumeClaim>,
) -> Option<Result<ResumeOutcome, ControlError>> {
    let suspension = state.suspension.clone()?;
    let stored = match committed.filter(|claim| claim.handle == suspension.handle) {
        Some(claim) => Ok(Some(claim)),
        None => state.env.journal.resume_claim(&suspension.handle),
    };
    let claim = match stored {
        Ok(Some(claim)) if claim.session_id == state.record.session_id => claim,
        Ok(_) => return None,
        Err(e) => return Some(Err(e.into())),
    };
    let Some(firing) = Wakeup::of(&suspension).and_then(|wakeup| {
        let (due, kind) = wakeup.next_due()?;
        let lateness_ms = u64::try_from((claim.claimed_at - due).num_milliseconds()).unwrap_or(0);
        Some(berth_scheduler::Firing {
            wakeup,
            kind,
            due,
            lateness_ms,
        })
    }) else {
        tracing::error!(session_id = %claim.session_id, handle = %claim.handle, "a claimed suspension has no wake-up to complete it from");
        return None;
    };
    let params = crate::claimer::resume_params(&firing)?;
    let span = crate::telemetry::resume_span(&suspension, &params);
    let first = wake(myself, state, &params, &suspension, Some(&claim))
        .instrument(span.clone())
        .await;
    Some(match first {
        Err(ControlError::ResumeRefused { refusal, .. }) => {
            tracing::warn!(session_id = %claim.session_id, %refusal, "a woken parked turn cannot continue; resuming with a fresh transcript");
            let params = ResumeParams {
                continue_transcript: false,
                ..params
            };
            wake(myself, state, &params, &suspension, Some(&claim))
                .instrument(span)
                .await
        }
        other => other,
    })
}

/// Takes the claim on `suspension` (or completes `taken`, the claimer's
/// durable claim on it) and starts what it resumes; a resume that lands is
/// remembered as the session's last claim (what a later bare resume that
/// found nothing to claim reports).
async fn wake(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    params: &ResumeParams,
    suspension: &Suspension,
    taken: Option<&ResumeClaim>,
) -> Result<ResumeOutcome, ControlError> {
    let outcome = wake_once(myself, state, params, suspension, taken).await?;
    state.last_claim = Some(taken.cloned().unwrap_or_else(|| ResumeClaim {
        handle: outcome.handle.clone(),
        session_id: state.record.session_id.clone(),
        kind: ResumeClaimKind::Resumed,
        cause: Some(params.cause),
        actor: params.actor.clone(),
        claimed_at: outcome.resumed_at,
    }));
    Ok(outcome)
}

async fn wake_once(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    params: &ResumeParams,
    suspension: &Suspension,
    taken: Option<&ResumeClaim>,
) -> Result<ResumeOutcome, ControlError> {
    let session_id = state.record.session_id.clone();
    // An operator's refill: `{"budget": {max_tokens, max_cost_usd,
    // max_tool_calls, max_wall_ms}}` in the input raises the allowance.
    let grant = match params
        .input
        .as_ref()
        .and_then(|i| i.get(berth_runtime::budget::GRANT_KEY))
    {
        None => BudgetLimits::default(),
        Some(value) => match serde_json::from_value::<BudgetLimits>(value.clone()) {
            Ok(grant) => grant,
            Err(e) => {
                let e = ControlError::invalid("input.budget", &e.to_string());
                return Err(refuse(state, params, e).await);
            }
        },
    };
    // What the model is shown of the input: never the top-up berth consumed.
    let shown = berth_runtime::budget::model_input(params.input.as_ref());
    let handle = suspension.handle.clone();
    let now = state.env.config.clock.now();
    // When the session was resumed: the claim's time.
    let resumed_at = taken.map_or(now, |claim| claim.claimed_at);
    let claim = ResumeClaim {
        handle: handle.clone(),
        session_id: session_id.clone(),
        kind: ResumeClaimKind::Resumed,
        cause: Some(params.cause),
        actor: params.actor.clone(),
        claimed_at: now,
    };
    let continue_transcript = params.continue_transcript;
    let resumed = |turn_id| SessionEvent::Resumed {
        handle: handle.clone(),
        cause: params.cause,
        had_resume_input: params.input.is_some(),
        continue_transcript,
        resumed_at,
        turn_id,
        lateness_ms: params.lateness_ms,
        input: params.input.clone(),
        message_id: params.message_id.clone(),
    };
    // The signed ResumptionReceipt, in the claim's batch.
    let input_sha256 = params.input.as_ref().map(sha256_of_json);
    let keyring = state.env.journal.keyring().clone();
    let resumption = |turn_id: Option<TurnId>| {
        SessionEvent::ResumptionReceipt(keyring.sign(ResumptionReceipt {
            handle: handle.clone(),
            session_id: session_id.clone(),
            cause: params.cause,
            actor: params.actor.clone(),
            input_sha256: input_sha256.clone(),
            continue_transcript,
            suspension_span_id: suspension.span_links.first().map(|l| l.span_id.clone()),
            suspended_at: suspension.suspended_at,
            trigger: params.trigger.clone(),
            lateness_ms: params.lateness_ms,
            turn_id,
            resumed_at,
        }))
    };
    let accepted = receipt(
        state,
        METHOD,
        &params.actor,
        ControlStatus::Accepted,
        "resumed",
        json!({"sessionId": session_id, "handle": handle}),
        None,
    );
    // A claim already taken is completed at most once: of two completions
    // (a failed actor's stale turn and its successor's), one lands.
    let prelude_batch = match taken {
        Some(_) => Batch::new().completing_suspension(&session_id, &handle),
        None => Batch::new().claim(&claim),
    }
    .delete_suspension(&session_id);
    let outcome = |turn_id| ResumeOutcome {
        handle: handle.clone(),
        cause: params.cause,
        resumed_at,
        had_resume_input: params.input.is_some(),
        continue_transcript,
        turn_id,
    };
    match (suspension.frame.clone(), continue_transcript) {
        // The parked turn continues where it stopped.
        (Some(frame), true) => {
            let prompt = first_prompt(&frame);
            let control = Arc::new(TurnControl::default());
            let (spec, deps) =
                prompt::turn_setup(state, frame.turn_id.clone(), prompt.clone(), &control);
            if let Err(refusal) = check_resumable(&frame, &spec, &deps) {
                let e = ControlError::ResumeRefused {
                    session_id: session_id.clone(),
                    handle: handle.clone(),
                    refusal,
                };
                return Err(refuse(state, params, e).await);
            }
            let turn_id = frame.turn_id.clone();
            let open = OpenTurn {
                session_id: session_id.clone(),
                turn_id: turn_id.clone(),
                started_at: now,
                prompt_text: prompt.to_model_text(),
            };
            let mut record = state.record.clone();
            record.budget_grant.add(&grant);
            record.updated_at = now;
            let events = vec![
                resumed(Some(turn_id.clone())),
                accepted,
                resumption(Some(turn_id.clone())),
            ];
            let batch = prelude_batch
                .put_session(&record)
                .open_turn(&open)
                .put_frame(&frame);
            // A wake-up's claim is durable: the rest of its resume rides
            // with the turn's first write (see `Prelude::held`).
            let held = if taken.is_some() {
                let records = stamp(&state.env, &session_id, None, now, events);
                let batch = records.iter().fold(batch, |b, r| b.append(&session_id, r));
                Held::starting(batch, records)
            } else {
                state
                    .record_with(batch, events)
                    .await
                    .map_err(|e| conflict(&session_id, &handle, e))?;
                Held::default()
            };
            state.record = record;
            state.unpark();
            let input = ResumeInput {
                input: shown,
                cause: params.cause,
            };
            prompt::spawn(
                myself,
                state,
                turn_id.clone(),
                prompt,
                Run::Resume {
                    frame: Box::new(frame),
                    input,
                },
                None,
                held,
            );
            Ok(outcome(Some(turn_id)))
        }
        // A fresh turn: the parked turn (if any) is sealed, the model's
        // context restarts at a digest of what came before plus the input.
        // `continueTranscript: false` always takes this path (RFC: "the
        // agent starts a fresh turn with a pre-suspend digest"), also for an
        // idle suspension resumed without input.
        (frame, _) if frame.is_some() || shown.is_some() || !continue_transcript => {
            let mut record = state.record.clone();
            record.budget_grant.add(&grant);
            // The `resumed` event names the fresh turn it starts.
            let fresh = TurnId(state.env.config.ids.new_id("turn"));
            let mut prelude = Prelude {
                batch: prelude_batch,
                events: vec![],
                transcript: vec![],
                turn_id: Some(fresh.clone()),
                held: taken.is_some(),
                origin: None,
            };
            if let Some(frame) = &frame {
                let terminal = Terminal {
                    kind: TerminalKind::Suspended,
                    owner: TerminalOwner::User,
                    reason: format!(
                        "resumed with continueTranscript: false (handle {handle}); a fresh turn continues"
                    ),
                };
                let (batch, events, messages) = seal_parked(
                    &mut record,
                    state.transcript.len() as u64,
                    frame,
                    terminal,
                    FRESH_TRANSCRIPT_WHY,
                );
                prelude.batch = prelude.batch.merge(batch);
                prelude.events = events;
                prelude.transcript = messages;
            }
            let text = if continue_transcript {
                input_text(shown.as_ref())
            } else {
                record.context_from =
                    state.transcript.len() as u64 + prelude.transcript.len() as u64;
                let mut before: Vec<Message> = state
                    .transcript
                    .messages()
                    .get(usize::try_from(state.record.context_from).unwrap_or(usize::MAX)..)
                    .unwrap_or_default()
                    .to_vec();
                before.extend(prelude.transcript.iter().cloned());
                digest(suspension, &before, shown.as_ref())
            };
            prelude.events.push(resumed(Some(fresh.clone())));
            prelude.events.push(accepted);
            prelude.events.push(resumption(Some(fresh)));
            let saved = std::mem::replace(&mut state.record, record);
            match prompt::begin(myself, state, Prompt::text(text), None, prelude).await {
                Ok(turn_id) => {
                    state.unpark();
                    Ok(outcome(Some(turn_id)))
                }
                Err((e, _)) => {
                    state.record = saved;
                    Err(conflict(&session_id, &handle, e))
                }
            }
        }
        // An idle session with no input, continuing its transcript: it just
        // wakes.
        _ => {
            let events = vec![resumed(None), accepted, resumption(None)];
            state
                .record_with(prelude_batch, events)
                .await
                .map_err(|e| conflict(&session_id, &handle, e))?;
            state.unpark();
            Ok(outcome(None))
        }
    }
}

/// The suspension this resume may claim.
fn current(state: &SessionState, params: &ResumeParams) -> Result<Suspension, ControlError> {
    let session_id = state.record.session_id.clone();
    let used_up = |handle: &str| -> Result<Option<ControlError>, ControlError> {
        Ok(state
            .env
            .journal
            .resume_claim(handle)?
            // Another session's handle is not this session's to report on.
            .filter(|claim| claim.session_id == session_id)
            .map(|claim| ControlError::ResumeConflict {
                session_id: session_id.clone(),
                handle: Some(handle.to_owned()),
                reason: ResumeConflict::AlreadyResumed {
                    claim: Box::new(claim),
                },
            }))
    };
    let not_suspended = || ControlError::ResumeConflict {
        session_id: session_id.clone(),
        handle: params.handle.clone(),
        reason: ResumeConflict::NotSuspended,
    };
    // A closed session resumes under no handle, whatever the claim on it
    // says (a close uses up the suspension it cancels).
    if state.record.closed_at.is_some() {
        return Err(ControlError::SessionClosed {
            session_id: session_id.clone(),
        });
    }
    match (&state.suspension, &params.handle) {
        (Some(s), None) => Ok(s.clone()),
        (Some(s), Some(h)) if *h == s.handle => Ok(s.clone()),
        (Some(s), Some(h)) => Err(used_up(h)?.unwrap_or_else(|| ControlError::ResumeConflict {
            session_id: session_id.clone(),
            handle: Some(h.clone()),
            reason: ResumeConflict::HandleMismatch {
                current: s.handle.clone(),
            },
        })),
        (None, Some(h)) => Err(used_up(h)?.unwrap_or_else(not_suspended)),
        (None, None) => Err(not_suspended()),
    }
}

/// Journals the rejected receipt (best effort) and hands the error back.
async fn refuse(state: &SessionState, params: &ResumeParams, error: ControlError) -> ControlError {
    let reason = match &error {
        ControlError::ResumeConflict {
            reason: ResumeConflict::AlreadyResumed { .. },
            ..
        } => "already_resumed",
        ControlError::ResumeConflict { .. } => "not_suspended",
        ControlError::ResumeRefused { .. } => "resume_refused",
        ControlError::SessionClosed { .. } => "session_closed",
        _ => "rejected",
    };
    let target = json!({"sessionId": state.record.session_id, "handle": params.handle});
    let r = rejected(state, METHOD, &params.actor, target, reason);
    if let Err(e) = state.record(vec![r]).await {
        tracing::warn!(error = %e, "could not journal a rejected resume's receipt");
    }
    error
}

/// A lost claim race is a typed conflict, not a storage failure.
fn conflict(
    session_id: &berth_runtime::ids::SessionId,
    handle: &str,
    error: ControlError,
) -> ControlError {
    match error {
        ControlError::Storage(StorageError::AlreadyClaimed { existing, .. }) => {
            ControlError::ResumeConflict {
                session_id: session_id.clone(),
                handle: Some(handle.to_owned()),
                reason: ResumeConflict::AlreadyResumed { claim: existing },
            }
        }
        e => e,
    }
}

/// The prompt of a parked turn (its first user message).
pub(crate) fn first_prompt(frame: &Frame) -> Prompt {
    let text = frame
        .turn_messages
        .iter()
        .find_map(|m| match m {
            Message::User { text } => Some(text.clone()),
            _ => None,
        })
        .unwrap_or_default();
    Prompt::text(text)
}

fn input_text(input: Option<&Value>) -> String {
    match input {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

fn quote(text: &str) -> String {
    let mut quoted: String = text.chars().take(QUOTE_CHARS).collect();
    if quoted.len() < text.len() {
        quoted.push('…');
    }
    quoted
}

/// The first message of a fresh-transcript resume: a digest of the context
/// before the suspension (requests, the last answer, the tools used, the
/// suspension's reason and summary) and the resume input.
fn digest(suspension: &Suspension, before: &[Message], input: Option<&Value>) -> String {
    let mut out = String::from(
        "[resumed with a fresh transcript] Digest of this session before it was suspended:\n",
    );
    let requests: Vec<&str> = before
        .iter()
        .filter_map(|m| match m {
            Message::User { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    for text in requests.iter().rev().take(5).rev() {
        out.push_str(&format!("- user asked: {}\n", quote(text)));
    }
    if let Some(last) = before.iter().rev().find_map(|m| match m {
        Message::Assistant { text, .. } if !text.trim().is_empty() => Some(text.as_str()),
        _ => None,
    }) {
        out.push_str(&format!("- last answer: {}\n", quote(last)));
    }
    let tools = before
        .iter()
        .filter(|m| matches!(m, Message::Tool { .. }))
        .count();
    out.push_str(&format!("- tool results: {tools}\n"));
    if let Some(reason) = &suspension.reason {
        out.push_str(&format!("- suspended because: {}\n", quote(reason)));
    }
    if let Some(summary) = &suspension.summary {
        out.push_str(&format!("- summary: {}\n", quote(summary)));
    }
    match input {
        Some(input) => out.push_str(&format!("Resume input: {}", input_text(Some(input)))),
        None => out.push_str("No resume input was given; continue the work."),
    }
    out
}

/// Fails the session's suspension `handle` (a `fail` timeout): the handle is
/// used up (claim kind `failed`; later resumes get `already_resumed`), a
/// parked turn is sealed with terminal `suspension_timeout` (owner `policy`),
/// and the session is idle again. Answered: `ResumeConflict` when `handle` is
/// not the session's suspension any more (it was resumed or closed first).
pub(crate) async fn fail(
    state: &mut SessionState,
    handle: String,
    reason: String,
    reply: RpcReplyPort<Result<(), ControlError>>,
) -> Result<(), ActorProcessingErr> {
    let session_id = state.record.session_id.clone();
    if state.suspension.as_ref().is_none_or(|s| s.handle != handle) {
        let _ = reply.send(Err(ControlError::ResumeConflict {
            session_id,
            handle: Some(handle),
            reason: ResumeConflict::NotSuspended,
        }));
        return Ok(());
    }
    let mut record = state.record.clone();
    let Some(super::suspend::Cancelled {
        batch,
        mut events,
        appended,
        claim,
    }) = super::suspend::cancel_suspension(
        state,
        &mut record,
        crate::claimer::SCHEDULER,
        ResumeClaimKind::Failed,
        Terminal::new(TerminalKind::SuspensionTimeout, reason.clone()),
        &reason,
    )
    else {
        let _ = reply.send(Ok(()));
        return Ok(());
    };
    events.push(receipt(
        state,
        "session/resume",
        crate::claimer::SCHEDULER,
        ControlStatus::Accepted,
        "failed",
        json!({"sessionId": session_id, "handle": handle}),
        Some("timeout"),
    ));
    let answer = state.record_with(batch.put_session(&record), events).await;
    if answer.is_ok() {
        state.record = record;
        state.unpark();
        state.transcript.extend(appended);
        state.last_claim = Some(claim);
    }
    let _ = reply.send(answer.map_err(|e| conflict(&session_id, &handle, e)));
    Ok(())
}
