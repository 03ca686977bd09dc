//! `session/suspend` and the enriched `session/resume`
//! (`seeds/acp-session-suspend-rfc.md`, "Proposed wire format").

use berth_actors::error::ResumeConflict;
use berth_actors::{ControlError, ResumeOutcome, ResumeParams, SessionSelector, SuspendParams};
use berth_runtime::ids::SessionId;
use berth_runtime::suspension::{Initiator, ResumeCause, ResumeConditions, SuspendMode};
use serde_json::{json, Map, Value};

use super::{attach_controller, receipt_unknown_session, session_id};
use crate::connection::Connection;
use crate::jsonrpc::RpcError;

/// Longest `reason` accepted (characters).
const MAX_REASON: usize = 4096;

/// The params object, refusing keys the method does not define.
fn object<'a>(params: &'a Value, allowed: &[&str]) -> Result<&'a Map<String, Value>, RpcError> {
    let Some(object) = params.as_object() else {
        return Err(RpcError::invalid_params("params", "must be an object"));
    };
    if let Some(key) = object.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(RpcError::invalid_params(
            key,
            format!("unknown field (expected one of {})", allowed.join(", ")),
        ));
    }
    Ok(object)
}

fn optional_string(object: &Map<String, Value>, key: &str) -> Result<Option<String>, RpcError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.chars().count() <= MAX_REASON => Ok(Some(s.clone())),
        Some(Value::String(_)) => Err(RpcError::invalid_params(
            key,
            format!("longer than {MAX_REASON} characters"),
        )),
        Some(_) => Err(RpcError::invalid_params(key, "must be a string")),
    }
}

/// `session/suspend {sessionId, reason?, resumeWhen?, mode?, _meta?}`: answers
/// `{handle, reason, suspendedAt, resumeWhen, summary}` once the suspension
/// is durable (at once for an idle session; when the running turn reaches the
/// seam the mode names otherwise). A suspended session answers its existing
/// handle (`_meta.berth.alreadySuspended: true`).
///
/// # Errors
/// -32602 naming the field (`mode`, `resumeWhen.timeout.durationMinutes`, …);
/// -32004 unknown session; -32005 closed.
pub(crate) async fn suspend(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let id = session_id(&params)?;
    let object = object(
        &params,
        &["sessionId", "reason", "resumeWhen", "mode", "_meta"],
    )?;
    let reason = optional_string(object, "reason")?;
    let mode = match object.get("mode") {
        None | Some(Value::Null) => SuspendMode::FinishStep,
        Some(value) => serde_json::from_value(value.clone()).map_err(|_| {
            RpcError::invalid_params(
                "mode",
                "must be one of finish_step, interrupt_immediate, wait_for_completion",
            )
        })?,
    };
    let resume_when = match object.get("resumeWhen") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            ResumeConditions::parse(value, "resumeWhen")
                .map_err(|e| RpcError::invalid_params(&e.field, e.reason))?,
        ),
    };
    attach_controller(conn, "session/suspend", &id).await?;
    let outcome = conn
        .node
        .suspend(
            &id,
            SuspendParams {
                mode,
                reason,
                resume_when,
                actor: conn.actor(),
                initiator: Initiator::Client,
                require_running: false,
            },
        )
        .await
        .map_err(|e| receipt_unknown_session(conn, "session/suspend", &id, e))?;
    let mut answer = json!({
        "handle": outcome.handle,
        "reason": outcome.reason,
        "suspendedAt": outcome.suspended_at,
        "resumeWhen": outcome.resume_when,
        "summary": outcome.summary,
        "_meta": {"berth": {
            "initiator": outcome.initiator,
            "alreadySuspended": outcome.already_suspended,
            "state": "suspended",
        }},
    });
    // The RFC's optional fields are omitted rather than null.
    if let Value::Object(fields) = &mut answer {
        fields.retain(|_, v| !v.is_null());
    }
    Ok(answer)
}

/// What a `session/resume` asks beyond ACP #1726's silent restore.
pub(crate) struct ResumeRequest {
    /// The handle to claim (`handle`, or `_meta.berth.handle`).
    pub handle: Option<String>,
    /// RFC `input`.
    pub input: Option<Value>,
    /// RFC `continueTranscript` (default true).
    pub continue_transcript: bool,
    /// Whether any of the three was given: the caller means to wake a
    /// suspension, and a session with none to claim is an error.
    pub explicit: bool,
}

/// Reads the suspend RFC's resume fields. `cwd` and `mcpServers` (ACP) are
/// accepted and ignored.
///
/// # Errors
/// -32602 naming the field.
pub(crate) fn resume_request(params: &Value) -> Result<ResumeRequest, RpcError> {
    let object = object(
        params,
        &[
            "sessionId",
            "cwd",
            "mcpServers",
            "additionalDirectories",
            "input",
            "continueTranscript",
            "handle",
            "_meta",
        ],
    )?;
    let handle = match object
        .get("handle")
        .or_else(|| params.pointer("/_meta/berth/handle"))
    {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(_) => {
            return Err(RpcError::invalid_params(
                "handle",
                "must be a non-empty string",
            ))
        }
    };
    let continue_transcript = match object.get("continueTranscript") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(RpcError::invalid_params(
                "continueTranscript",
                "must be a boolean",
            ))
        }
    };
    let input = object.get("input").filter(|v| !v.is_null()).cloned();
    Ok(ResumeRequest {
        explicit: handle.is_some() || input.is_some() || continue_transcript.is_some(),
        handle,
        input,
        continue_transcript: continue_transcript.unwrap_or(true),
    })
}

/// What a `session/resume` did about the session's suspension.
pub(crate) enum Claimed {
    /// Nothing to claim and none was asked for: a plain reattach.
    Nothing,
    /// This resume claimed the suspension and woke the session.
    Resumed(ResumeOutcome),
    /// A bare resume found the suspension used up by another claim (another
    /// caller's resume, a wake-up, a cancel): it only reattached.
    Lost(Box<berth_runtime::suspension::ResumeClaim>),
}

/// Claims the session's suspension for this connection (`explicit_resume`).
/// A plain resume of a suspended session claims the handle it saw; one that
/// finds the suspension used up by another claim — before it looked or
/// between its look and its claim — answers [`Claimed::Lost`] naming that
/// claim. A closed session is refused, whatever the request carries.
///
/// # Errors
/// -32005 closed; -32009 (`already_resumed` / `not_suspended`, for a resume
/// that names a handle, input or `continueTranscript`), -32012, -32004.
pub(crate) async fn claim(
    conn: &Connection,
    id: &SessionId,
    request: ResumeRequest,
) -> Result<Claimed, RpcError> {
    let current = conn.node.suspension(id).map_err(RpcError::from)?;
    if !request.explicit && current.is_none() {
        let status = conn.node.session_status(id).await?;
        if status.record.closed_at.is_some() {
            return Err(ControlError::SessionClosed {
                session_id: id.clone(),
            }
            .into());
        }
        return Ok(match status.last_claim {
            Some(claim) => Claimed::Lost(Box::new(claim)),
            None => Claimed::Nothing,
        });
    }
    // A plain reattach is an observer's right; claiming a suspension is a
    // resume, which needs a controller.
    let needed = berth_actors::Role::Controller;
    if !conn.principal.may(needed) {
        return Err(super::authorize::refuse(conn, "session/resume", Some(id), needed, None).await);
    }
    let explicit = request.explicit;
    let handle = request.handle.or(current.map(|s| s.handle));
    let outcome = conn
        .node
        .resume(
            id,
            ResumeParams {
                handle,
                input: request.input,
                continue_transcript: request.continue_transcript,
                cause: ResumeCause::ExplicitResume,
                actor: conn.actor(),
                lateness_ms: None,
                message_id: None,
                trigger: None,
            },
        )
        .await;
    match outcome {
        Ok(outcome) => Ok(Claimed::Resumed(outcome)),
        Err(ControlError::ResumeConflict {
            reason: ResumeConflict::AlreadyResumed { claim },
            ..
        }) if !explicit => Ok(Claimed::Lost(claim)),
        Err(e) => Err(receipt_unknown_session(conn, "session/resume", id, e)),
    }
}

/// `_meta.berth.claim` of a bare resume that found the suspension used up:
/// `{handle, kind, cause, actor, claimedAt}` (the `claim` of -32009's data).
pub(crate) fn claim_meta(claim: &berth_runtime::suspension::ResumeClaim) -> Value {
    json!({
        "handle": claim.handle,
        "kind": claim.kind,
        "cause": claim.cause,
        "actor": claim.actor,
        "claimedAt": claim.claimed_at,
    })
}

/// `_meta.berth.resumed` of the resume answer (`turnId` only when a turn
/// runs now).
pub(crate) fn resumed_meta(outcome: &ResumeOutcome) -> Value {
    let mut meta = json!({
        "handle": outcome.handle,
        "cause": outcome.cause,
        "resumedAt": outcome.resumed_at,
        "hadResumeInput": outcome.had_resume_input,
        "continueTranscript": outcome.continue_transcript,
    });
    if let Some(turn_id) = &outcome.turn_id {
        meta["turnId"] = json!(turn_id);
    }
    meta
}

/// `_berth/event.emit {name, data?}`: an external event (DESIGN.md, "The
/// scheduler"). Journaled before the answer; every parked session whose
/// `onEvent` (exact name, or a prefix ending in `*`) or event trigger (name
/// and payload filter) matches is resumed with cause `external_event` and
/// `data` as input. Answers `{seq, receivedAt, woke: [{sessionId, handle,
/// resumed}]}`.
///
/// # Errors
/// -32602 naming `name` or `data`.
pub(crate) async fn emit_event(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let object = object(&params, &["name", "data", "_meta"])?;
    let name = match object.get("name") {
        Some(Value::String(name)) => name.clone(),
        Some(_) => return Err(RpcError::invalid_params("name", "must be a string")),
        None => return Err(RpcError::invalid_params("name", "is required")),
    };
    let data = object.get("data").cloned().unwrap_or(Value::Null);
    let outcome = conn.node.emit_event(&name, data, &conn.actor()).await?;
    Ok(json!({
        "seq": outcome.seq,
        "receivedAt": outcome.received_at,
        "woke": outcome.woke,
    }))
}

/// `_berth/suspend_many {all | label | sessionIds, mode?, reason?}`: the
/// operator's interrupt-and-suspend broadcast. Exactly one selector; `mode`
/// defaults to `interrupt_immediate`. Answers `{results: [{sessionId,
/// outcome: suspended | already_suspended | not_running | unknown | failed,
/// handle?}]}` once every selected running session has parked.
///
/// # Errors
/// -32602 naming the selector or field.
pub(crate) async fn suspend_many(conn: &Connection, params: Value) -> Result<Value, RpcError> {
    let object = object(
        &params,
        &["all", "label", "sessionIds", "mode", "reason", "_meta"],
    )?;
    let selectors = ["all", "label", "sessionIds"]
        .iter()
        .filter(|k| {
            object
                .get(**k)
                .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
        })
        .count();
    if selectors != 1 {
        return Err(RpcError::invalid_params(
            "params",
            "give exactly one of all: true, label, sessionIds",
        ));
    }
    let selector = if object.get("all") == Some(&Value::Bool(true)) {
        SessionSelector::All
    } else if let Some(label) = object.get("label").filter(|v| !v.is_null()) {
        SessionSelector::Label(
            label
                .as_str()
                .ok_or_else(|| RpcError::invalid_params("label", "must be a string"))?
                .to_owned(),
        )
    } else if let Some(ids) = object.get("sessionIds").filter(|v| !v.is_null()) {
        let ids = ids
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|v| {
                        v.as_str()
                            .filter(|s| !s.is_empty())
                            .map(|s| SessionId(s.to_owned()))
                    })
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| {
                RpcError::invalid_params("sessionIds", "must be an array of session ids")
            })?;
        SessionSelector::Ids(ids)
    } else {
        return Err(RpcError::invalid_params("all", "must be true"));
    };
    let mode = match object.get("mode") {
        None | Some(Value::Null) => SuspendMode::InterruptImmediate,
        Some(value) => serde_json::from_value(value.clone()).map_err(|_| {
            RpcError::invalid_params(
                "mode",
                "must be one of finish_step, interrupt_immediate, wait_for_completion",
            )
        })?,
    };
    let reason = optional_string(object, "reason")?;
    let results = conn
        .node
        .suspend_many(selector, mode, reason, &conn.actor())
        .await?;
    let results: Vec<Value> = results
        .into_iter()
        .map(|(id, outcome)| {
            let mut entry = serde_json::to_value(&outcome).unwrap_or_default();
            entry["sessionId"] = json!(id);
            entry
        })
        .collect();
    Ok(json!({ "results": results }))
}

/// `_berth/schedule.*`: standing schedules (Temporal Schedules) that prompt a
/// session on a cron.
///
/// - `create {sessionId, cron, timezone?, prompt, overlap?: skip |
///   buffer_one | allow_all, catchupWindowMs?}` → the schedule
/// - `list {}` → `{schedules: [...]}`
/// - `pause {scheduleId}` / `unpause {scheduleId}` → the schedule
/// - `delete {scheduleId}` → `{}`
///
/// # Errors
/// -32602 naming the field; -32004 / -32005 for the session.
pub(crate) async fn schedule(
    conn: &Connection,
    verb: &str,
    params: Value,
) -> Result<Value, RpcError> {
    let id = || -> Result<String, RpcError> {
        match params.get("scheduleId") {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            _ => Err(RpcError::invalid_params(
                "scheduleId",
                "must be a non-empty string",
            )),
        }
    };
    let answer = match verb {
        "create" => {
            let object = object(
                &params,
                &[
                    "sessionId",
                    "cron",
                    "timezone",
                    "prompt",
                    "overlap",
                    "catchupWindowMs",
                    "_meta",
                ],
            )?;
            let text = |key: &str| match object.get(key) {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => Err(RpcError::invalid_params(key, "must be a string")),
            };
            let overlap = match object.get("overlap") {
                None | Some(Value::Null) => Default::default(),
                Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
                    RpcError::invalid_params(
                        "overlap",
                        "must be one of skip, buffer_one, allow_all",
                    )
                })?,
            };
            let catchup_window_ms = match object.get("catchupWindowMs") {
                None | Some(Value::Null) => 0,
                Some(v) => v.as_u64().ok_or_else(|| {
                    RpcError::invalid_params("catchupWindowMs", "must be a non-negative integer")
                })?,
            };
            let timezone = match object.get("timezone") {
                None | Some(Value::Null) => None,
                Some(_) => Some(text("timezone")?),
            };
            let spec = berth_actors::ScheduleSpec {
                session_id: session_id(&params)?,
                cron: text("cron")?,
                timezone,
                prompt: text("prompt")?,
                overlap,
                catchup_window_ms,
            };
            serde_json::to_value(conn.node.schedule_create(spec).await?)
        }
        "list" => Ok(json!({"schedules": conn.node.schedule_list()?})),
        "pause" | "unpause" => {
            serde_json::to_value(conn.node.schedule_pause(&id()?, verb == "pause").await?)
        }
        "delete" => {
            conn.node.schedule_delete(&id()?).await?;
            Ok(json!({}))
        }
        other => {
            return Err(RpcError::method_not_found(&format!(
                "_berth/schedule.{other}"
            )))
        }
    };
    answer.map_err(RpcError::internal)
}
