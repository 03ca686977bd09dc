//! `session/suspend` and parking (`seeds/acp-session-suspend-rfc.md`;
//! DESIGN.md, "Suspension and resumption").
//!
//! An idle session parks at once. A running one is asked through its turn's
//! control block: the request is journaled first (state `requested` while
//! the turn finishes its in-flight step; `quiescing` once the engine reached
//! the seam the mode names, dispatches nothing more and checkpoints its
//! frame), and only then is the
//! suspension — envelope, `suspended` event and receipt in one batch —
//! committed and the suspend answered. A second suspend of a suspended
//! session answers the existing handle (receipt `idempotent`); one while a
//! suspend is pending joins it (same handle, a stronger mode upgrades it)
//! when it names no `resumeWhen` or the pending one's, and is refused
//! (`SuspendPending`, receipt `rejected`) when it names others.

use std::sync::Arc;

use berth_runtime::engine::ExecutionSuspended;
use berth_runtime::event::{ControlStatus, EventRecord, SessionEvent};
use berth_runtime::frame::{Frame, ToolOutcomeStatus};
use berth_runtime::ids::TurnId;
use berth_runtime::steering::Seam;
use berth_runtime::suspension::{
    Initiator, ResumeClaim, ResumeClaimKind, SuspendMode, SuspendRequest, Suspension, Wakeup,
};
use berth_runtime::tape::Tape;
use berth_runtime::terminal::{StopReason, Terminal, TerminalKind, TerminalOwner};
use berth_storage::{Batch, SessionRecord};
use chrono::{DateTime, Utc};
use ractor::{ActorProcessingErr, RpcReplyPort};
use serde_json::json;

use super::super::receipt::{
    control_outcome_at, receipt, rejected, signed_outcome, stamp, suspend_drained,
    suspension_receipt, Stamper,
};
use super::super::seal::seal_parked;
use super::super::{RunningTurn, SessionState};
use crate::error::ControlError;
use crate::node::{PromptOutcome, SuspendOutcome, SuspendParams};

/// Where a suspend's answer goes once the suspension is committed.
pub(crate) type SuspendReply = RpcReplyPort<Result<SuspendOutcome, ControlError>>;

const METHOD: &str = "session/suspend";
/// The method an agent's self-park is recorded under.
pub(crate) const AGENT_METHOD: &str = "session/await_resumption";

/// Handles `session/suspend`.
///
/// # Errors
/// Answered, not returned: `SessionClosed` for a closed session, `Storage`
/// when the request cannot be journaled (nothing changed).
pub(crate) async fn suspend(
    state: &mut SessionState,
    params: SuspendParams,
    reply: SuspendReply,
) -> Result<(), ActorProcessingErr> {
    let session_id = state.record.session_id.clone();
    let target = json!({"sessionId": session_id});
    if state.record.closed_at.is_some() {
        let r = rejected(state, METHOD, &params.actor, target, "session_closed");
        let _ = state.record(vec![r]).await;
        let _ = reply.send(Err(ControlError::SessionClosed { session_id }));
        return Ok(());
    }
    if let Some(existing) = state.suspension.clone() {
        let target = json!({"sessionId": session_id, "handle": existing.handle});
        let r = receipt(
            state,
            METHOD,
            &params.actor,
            ControlStatus::Idempotent,
            "already_suspended",
            target,
            None,
        );
        let answer = state
            .record(vec![r])
            .await
            .map(|()| outcome(&existing, true));
        let _ = reply.send(answer);
        return Ok(());
    }
    let now = state.env.config.clock.now();
    if params.require_running && state.turn.is_none() {
        let _ = reply.send(Err(ControlError::NoActivePrompt { session_id }));
        return Ok(());
    }
    let Some(turn) = &state.turn else {
        // Idle: park at once.
        let request = request(state, &params, now);
        let mut suspension = envelope(&state.record, &request, None, None, now);
        let span = crate::telemetry::suspend_span(&mut suspension, None);
        let events = parked_events(&state.env, &suspension, METHOD, None);
        let batch = Batch::new().put_suspension(&suspension);
        // The suspend span ends before the suspension is persisted.
        drop(span);
        match state.record_with(batch, events).await {
            Ok(()) => {
                parked(state, suspension.clone());
                let _ = reply.send(Ok(outcome(&suspension, false)));
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
        return Ok(());
    };
    let control = Arc::clone(&turn.control);
    let mut record = state.record.clone();
    let events = match record.suspend_request.as_mut() {
        // A request with other conditions would have them dropped: refused,
        // naming the pending request's.
        Some(pending)
            if params
                .resume_when
                .as_ref()
                .filter(|c| !c.is_empty())
                .is_some_and(|c| pending.resume_when.as_ref() != Some(c)) =>
        {
            let handle = pending.handle.clone();
            let target = json!({"sessionId": session_id, "handle": handle});
            let r = rejected(state, METHOD, &params.actor, target, "suspend_pending");
            let _ = state.record(vec![r]).await;
            let _ = reply.send(Err(ControlError::SuspendPending {
                session_id,
                handle,
                resume_when: pending.resume_when.clone().map(Box::new),
            }));
            return Ok(());
        }
        // Already pending: this request joins it (a stronger mode upgrades
        // it); its conditions, if any, are the pending request's.
        Some(pending) => {
            pending.mode = control.request_suspend(params.mode);
            let target = json!({"sessionId": session_id, "handle": pending.handle});
            vec![receipt(
                state,
                METHOD,
                &params.actor,
                ControlStatus::Idempotent,
                "suspend_pending",
                target,
                Some(pending.mode.as_str()),
            )]
        }
        None => {
            let pending = request(state, &params, now);
            let events = vec![
                SessionEvent::SuspendRequested {
                    handle: pending.handle.clone(),
                    mode: pending.mode,
                    initiator: pending.initiator,
                    reason: pending.reason.clone(),
                    resume_when: pending.resume_when.clone(),
                    state: "requested".into(),
                },
                receipt(
                    state,
                    METHOD,
                    &params.actor,
                    ControlStatus::Accepted,
                    "requested",
                    json!({"sessionId": session_id, "handle": pending.handle}),
                    Some(pending.mode.as_str()),
                ),
            ];
            record.suspend_request = Some(pending);
            events
        }
    };
    record.updated_at = now;
    // Durable before the turn hears of it: a crash while quiescing still
    // completes the suspension at start-up.
    match state
        .record_with(Batch::new().put_session(&record), events)
        .await
    {
        Ok(()) => {
            if let Some(pending) = &record.suspend_request {
                control.request_suspend(pending.mode);
            }
            state.record = record;
            state.suspend_waiters.push(reply);
        }
        Err(e) => {
            let _ = reply.send(Err(e));
        }
    }
    Ok(())
}

fn request(state: &SessionState, params: &SuspendParams, now: DateTime<Utc>) -> SuspendRequest {
    SuspendRequest {
        handle: state.env.config.ids.new_id("susp"),
        mode: params.mode,
        initiator: params.initiator,
        actor: params.actor.clone(),
        reason: params.reason.clone(),
        resume_when: params.resume_when.clone().filter(|c| !c.is_empty()),
        requested_at: now,
    }
}

/// The durable envelope for `request`, parking `frame` (or an idle session).
pub(crate) fn envelope(
    record: &SessionRecord,
    request: &SuspendRequest,
    frame: Option<Frame>,
    summary: Option<String>,
    now: DateTime<Utc>,
) -> Suspension {
    let summary = summary.or_else(|| Some(digest(frame.as_ref(), request.reason.as_deref())));
    Suspension {
        handle: request.handle.clone(),
        session_id: record.session_id.clone(),
        reason: request.reason.clone(),
        initiator: request.initiator,
        actor: request.actor.clone(),
        mode: request.mode,
        resume_when: request.resume_when.clone(),
        summary,
        suspended_at: now,
        turn_id: frame.as_ref().map(|f| f.turn_id.clone()),
        frame,
        parent_session_id: record.parent_session_id.clone(),
        span_links: Vec::new(),
    }
}

/// A one-line account of where a parked turn stands (the response's `summary`).
fn digest(frame: Option<&Frame>, reason: Option<&str>) -> String {
    let why = reason.map(|r| format!(" ({r})")).unwrap_or_default();
    let Some(frame) = frame else {
        return format!("parked while idle{why}; a resume with input starts a new turn");
    };
    let waiting = frame
        .tool_outcomes
        .iter()
        .filter(|o| o.status == ToolOutcomeStatus::Suspended)
        .count();
    format!(
        "parked{why} after {} model call(s); on resume {} unstarted tool call(s) run and {} suspended one(s) continue",
        frame.accounting.model_calls,
        frame.unstarted_calls.len(),
        waiting
    )
}

/// A queued suspend request a park consumed: the mode in force when it was
/// drained, the seam (`None`: completed outside the turn loop), and the turn
/// that drained it.
pub(crate) type Drained = Option<(SuspendMode, Option<Seam>, TurnId)>;

/// The `suspended` event, its `control_outcome` receipt, its signed
/// `SuspensionReceipt`, and — when the park drained a queued request — that
/// request's signed drain receipt. Every receipt is decided at the
/// suspension's `suspended_at`.
pub(crate) fn parked_events(
    env: &impl Stamper,
    suspension: &Suspension,
    method: &str,
    drained: Drained,
) -> Vec<SessionEvent> {
    let mut events = vec![
        SessionEvent::Suspended {
            handle: suspension.handle.clone(),
            reason: suspension.reason.clone(),
            initiator: suspension.initiator,
            suspended_at: suspension.suspended_at,
            resume_when: suspension.resume_when.clone(),
            summary: suspension.summary.clone(),
            turn_id: suspension.turn_id.clone(),
            mode: suspension.mode,
        },
        signed_outcome(
            env,
            control_outcome_at(
                env,
                &suspension.session_id,
                method,
                &suspension.actor,
                ControlStatus::Accepted,
                "suspended",
                json!({"sessionId": suspension.session_id, "handle": suspension.handle}),
                suspension.reason.as_deref(),
                suspension.suspended_at,
            ),
        ),
        suspension_receipt(env, suspension),
    ];
    if let Some((mode, seam, turn_id)) = drained {
        events.push(suspend_drained(env, suspension, mode, seam, &turn_id));
    }
    events
}

/// The answer to a suspend.
pub(crate) fn outcome(suspension: &Suspension, already_suspended: bool) -> SuspendOutcome {
    SuspendOutcome {
        handle: suspension.handle.clone(),
        reason: suspension.reason.clone(),
        initiator: suspension.initiator,
        suspended_at: suspension.suspended_at,
        resume_when: suspension.resume_when.clone(),
        summary: suspension.summary.clone(),
        already_suspended,
    }
}

/// Records a committed suspension in memory, arms its wake-up (the journal
/// holds it already), and answers every waiting suspend.
pub(crate) fn parked(state: &mut SessionState, suspension: Suspension) {
    for reply in std::mem::take(&mut state.suspend_waiters) {
        let _ = reply.send(Ok(outcome(&suspension, false)));
    }
    if let Some(wakeup) = Wakeup::of(&suspension) {
        state.env.scheduler.arm(&wakeup);
    }
    state.last_claim = None;
    state.suspension = Some(suspension);
}

/// Answers every waiting suspend with `error` (the suspension did not happen).
pub(crate) fn fail_waiters(state: &mut SessionState, error: ControlError) {
    for reply in std::mem::take(&mut state.suspend_waiters) {
        let _ = reply.send(Err(error.clone()));
    }
}

/// The terminal a prompt answers with when its turn parks: `end_turn`, kind
/// `suspended`, owned by whoever initiated it.
pub(crate) fn suspended_terminal(suspension: &Suspension) -> Terminal {
    Terminal {
        kind: if suspension.initiator == Initiator::Policy {
            TerminalKind::PolicyBudget
        } else {
            TerminalKind::Suspended
        },
        owner: match suspension.initiator {
            Initiator::Client => TerminalOwner::User,
            Initiator::Agent => TerminalOwner::Agent,
            Initiator::Policy => TerminalOwner::Policy,
            Initiator::Scheduler => TerminalOwner::Harness,
        },
        reason: format!("the session was suspended (handle {})", suspension.handle),
    }
}

/// What parking a turn the engine suspended journals: a drop for every
/// message still queued, then [`parked_events`] for the suspension — a
/// client's (or a policy's) pending request, drained at the seam the turn
/// parked at, or else the agent's own park. Takes the request out of
/// `record`. Returns the events and the suspension (with the frame). The
/// same function re-derives the park in `berth replay`.
///
/// `link` fills the envelope's [`Suspension::span_links`] before the
/// receipts are derived from it (the `SuspensionReceipt` signs the first
/// link's span id): a live park opens its `suspend` span there
/// ([`crate::telemetry::suspend_span`]); replay feeds back the span id the
/// journal recorded, never a fresh span's.
pub(crate) fn parked_turn_events(
    env: &impl Stamper,
    record: &mut SessionRecord,
    control: &berth_runtime::engine::TurnControl,
    turn_id: &TurnId,
    suspended: ExecutionSuspended,
    now: DateTime<Utc>,
    link: impl FnOnce(&mut Suspension),
) -> (Vec<SessionEvent>, Suspension) {
    // A client's pending request names the suspension; otherwise the agent
    // parked itself.
    let pending = record
        .suspend_request
        .take()
        .or_else(|| policy_request(env, control, now));
    let (request, summary, method, drained) = match pending {
        Some(request) => {
            let drained = Some((request.mode, Some(suspended.seam), turn_id.clone()));
            (request, None, METHOD, drained)
        }
        None => {
            let (request, summary) = agent_request(env, suspended.park.clone(), now);
            (request, summary, AGENT_METHOD, None)
        }
    };
    let mut suspension = envelope(record, &request, Some(suspended.frame), summary, now);
    link(&mut suspension);
    let mut events = drop_pending(
        control,
        "the session suspended before this message was delivered",
    );
    events.extend(parked_events(env, &suspension, method, drained));
    (events, suspension)
}

/// Parks a turn the engine suspended: the envelope (with the checkpointed
/// frame), the events the turn still held for its next write, then
/// [`parked_turn_events`] (the leftover of the run's replay `tape` on the
/// first record), the open-turn marker and frame row removed and the
/// pending request cleared — one durable batch. Then the prompt answers
/// `end_turn` with terminal `suspended` and the handle, and every waiting
/// suspend gets the handle.
///
/// # Errors
/// A journal failure fails the actor (the restarted actor completes the
/// suspension from the journal).
pub(crate) async fn park_turn(
    state: &mut SessionState,
    mut turn: RunningTurn,
    suspended: ExecutionSuspended,
    tape: Tape,
) -> Result<(), ActorProcessingErr> {
    let now = state.env.config.clock.now();
    let session_id = state.record.session_id.clone();
    let mut record = state.record.clone();
    record.updated_at = now;
    let usage = suspended.frame.accounting.usage;
    let mut suspend_span = None;
    let (events, suspension) = parked_turn_events(
        &state.env,
        &mut record,
        &turn.control,
        &turn.turn_id,
        suspended,
        now,
        |suspension| {
            suspend_span = Some(crate::telemetry::suspend_span(suspension, Some(&turn.span)));
        },
    );
    let records = stamp(&state.env, &session_id, Some(&turn.turn_id), now, events);
    // Neither the suspend span nor the turn's stays open across the pause:
    // both end before the snapshot is persisted.
    drop(suspend_span);
    drop(std::mem::replace(&mut turn.span, tracing::Span::none()));
    // What the turn held for its next write goes first.
    let written = turn
        .held
        .write(
            &state.env.journal,
            &session_id,
            park_batch(&record, &suspension, &[]),
            records,
            || tape,
        )
        .await;
    match written {
        Ok((ids, records)) => {
            state.record = record;
            state.last_control = Some(Arc::clone(&turn.control));
            state.watchers.publish(
                &session_id,
                ids.into_iter().zip(records.into_iter().map(Arc::new)),
            );
            if let Some(reply) = turn.reply.take() {
                let _ = reply.send(Ok(PromptOutcome {
                    turn_id: turn.turn_id.clone(),
                    terminal: suspended_terminal(&suspension),
                    stop_reason: Some(StopReason::EndTurn),
                    usage,
                    suspension_handle: Some(suspension.handle.clone()),
                }));
            }
            parked(state, suspension);
            Ok(())
        }
        Err(e) => {
            if let Some(reply) = turn.reply.take() {
                let _ = reply.send(Err(e.clone().into()));
            }
            fail_waiters(state, e.clone().into());
            Err(Box::new(e))
        }
    }
}

/// What ending a suspension without a resume writes ([`cancel_suspension`]).
pub(crate) struct Cancelled {
    /// The claim, the envelope's removal and the parked turn's seal.
    pub batch: Batch,
    /// `suspension_cancelled` and the seal's events.
    pub events: Vec<SessionEvent>,
    /// The transcript messages the seal appends.
    pub appended: Vec<berth_runtime::history::Message>,
    /// The claim that uses up the handle.
    pub claim: ResumeClaim,
}

/// The writes that end the session's suspension without a resume: the handle
/// is used up (claim `kind`: `cancelled`, or `failed` for a `fail` timeout; a
/// later resume gets `already_resumed` naming it), the envelope is removed,
/// and a parked turn is sealed with `terminal` (see [`seal_parked`]).
/// `record` gets the new checkpoint head. `None` when the session is not
/// suspended.
pub(crate) fn cancel_suspension(
    state: &SessionState,
    record: &mut SessionRecord,
    actor: &str,
    kind: ResumeClaimKind,
    terminal: Terminal,
    why: &str,
) -> Option<Cancelled> {
    let suspension = state.suspension.as_ref()?;
    let now = state.env.config.clock.now();
    let claim = ResumeClaim {
        handle: suspension.handle.clone(),
        session_id: record.session_id.clone(),
        kind,
        cause: None,
        actor: actor.to_owned(),
        claimed_at: now,
    };
    let mut batch = Batch::new()
        .claim(&claim)
        .delete_suspension(&record.session_id);
    let mut events = vec![SessionEvent::SuspensionCancelled {
        handle: suspension.handle.clone(),
        reason: why.to_owned(),
    }];
    let mut appended = Vec::new();
    if let Some(frame) = &suspension.frame {
        let (ops, sealed, messages) = seal_parked(
            record,
            state.transcript.len() as u64,
            frame,
            terminal,
            &format!("not run: {why}"),
        );
        batch = batch.merge(ops);
        events.extend(sealed);
        appended = messages;
    }
    Some(Cancelled {
        batch,
        events,
        appended,
        claim,
    })
}

/// The request an agent's self-park amounts to (initiator `agent`), and the
/// summary it asked to show. A tool that yielded with no park and no client
/// request behind it parks as the agent too.
pub(crate) fn agent_request(
    env: &impl Stamper,
    park: Option<berth_runtime::tools::AgentPark>,
    now: DateTime<Utc>,
) -> (SuspendRequest, Option<String>) {
    let park = park.unwrap_or_else(|| berth_runtime::tools::AgentPark {
        reason: "a tool suspended the turn".into(),
        conditions: Default::default(),
        summary: None,
    });
    let request = SuspendRequest {
        handle: env.ids().new_id("susp"),
        mode: SuspendMode::FinishStep,
        initiator: Initiator::Agent,
        actor: "agent".into(),
        reason: Some(park.reason),
        resume_when: Some(park.conditions).filter(|c| !c.is_empty()),
        requested_at: now,
    };
    (request, park.summary)
}

/// The writes that park a turn: the envelope and the record, the frame row
/// and open-turn marker removed (the frame lives in the envelope now), and
/// `records` appended — one batch.
pub(crate) fn park_batch(
    record: &SessionRecord,
    suspension: &Suspension,
    records: &[EventRecord],
) -> Batch {
    let session_id = &record.session_id;
    records.iter().fold(
        Batch::new()
            .put_session(record)
            .put_suspension(suspension)
            .delete_frame(session_id)
            .close_turn(session_id),
        |b, e| b.append(session_id, e),
    )
}

/// `InjectionDropped` for every message still waiting in a turn's queue.
pub(crate) fn drop_pending(
    control: &berth_runtime::engine::TurnControl,
    reason: &str,
) -> Vec<SessionEvent> {
    control
        .drain_rest()
        .into_iter()
        .map(|injection| SessionEvent::InjectionDropped {
            message_id: injection.message_id,
            reason: reason.to_owned(),
        })
        .collect()
}

/// The suspension a budget breach asks for (mode `interrupt_immediate`,
/// initiator `policy`), when the turn's control block recorded one.
pub(crate) fn policy_request(
    env: &impl Stamper,
    control: &berth_runtime::engine::TurnControl,
    now: DateTime<Utc>,
) -> Option<SuspendRequest> {
    let reason = control.policy_breach()?;
    Some(SuspendRequest {
        handle: env.ids().new_id("susp"),
        mode: SuspendMode::InterruptImmediate,
        initiator: Initiator::Policy,
        actor: "policy".into(),
        reason: Some(format!("budget: {reason}")),
        resume_when: None,
        requested_at: now,
    })
}
