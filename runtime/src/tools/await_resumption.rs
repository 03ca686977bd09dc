//! `await_resumption {reason, conditions?, summary?}`: the agent parks its own
//! session until a condition holds or a client resumes it (RFC
//! `session/await_resumption`, the agent-initiated dual of `session/suspend`).
//!
//! The call never completes on its own: it returns [`ToolExit::Suspended`]
//! with an [`AgentPark`], and the engine checkpoints the turn and parks the
//! session (initiator `agent`). On resume, [`Tool::resume_execution`] answers
//! the call with the resume input, so the model reads it as this call's
//! result — the resume waitpoint.

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{
    AgentPark, ResumeInput, Tool, ToolContext, ToolContinuation, ToolError, ToolExit, ToolOutput,
    ToolSuspension,
};
use crate::event::ToolKind;
use crate::model::ToolSpec;
use crate::suspension::{ResumeCause, ResumeConditions};

/// The tool's name, as the model calls it.
pub const NAME: &str = "await_resumption";
/// Continuation format written by this build.
const CONTINUATION_VERSION: u32 = 1;
/// Longest `reason` / `summary` kept (characters).
const MAX_TEXT: usize = 4096;

/// The built-in self-park tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct AwaitResumption;

/// Parses and validates the call's arguments.
///
/// # Errors
/// [`ToolError::InvalidArguments`] naming the field (`reason`,
/// `conditions.timeout.durationMinutes`, …); the model reads it and the
/// session is not parked.
pub fn parse_park(arguments: &Value) -> Result<AgentPark, ToolError> {
    let Some(object) = arguments.as_object() else {
        return Err(ToolError::invalid("arguments must be an object"));
    };
    if let Some(key) = object
        .keys()
        .find(|k| !matches!(k.as_str(), "reason" | "conditions" | "summary"))
    {
        return Err(ToolError::invalid(format!(
            "unknown field `{key}` (expected reason, conditions, summary)"
        )));
    }
    let reason = match object.get("reason") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.chars().take(MAX_TEXT).collect(),
        _ => return Err(ToolError::invalid("`reason` must be a non-empty string")),
    };
    let summary = match object.get("summary") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.chars().take(MAX_TEXT).collect()),
        Some(_) => return Err(ToolError::invalid("`summary` must be a string")),
    };
    let conditions = match object.get("conditions") {
        None | Some(Value::Null) => ResumeConditions::default(),
        Some(value) => ResumeConditions::parse(value, "conditions")
            .map_err(|e| ToolError::invalid(e.to_string()))?,
    };
    Ok(AgentPark {
        reason,
        conditions,
        summary,
    })
}

/// The text the model reads when its park is resumed.
pub fn resumed_text(resume: &ResumeInput) -> String {
    let cause = match resume.cause {
        ResumeCause::ExplicitResume => "a client resumed the session",
        ResumeCause::ConditionFired => "a resume condition fired",
        ResumeCause::Timeout => "the wait timed out",
        ResumeCause::ExternalEvent => "the awaited event arrived",
    };
    match &resume.input {
        Some(Value::String(text)) => format!("resumed ({cause}) with input: {text}"),
        Some(input) => format!("resumed ({cause}) with input: {input}"),
        None => format!("resumed ({cause}) without input"),
    }
}

#[async_trait]
impl Tool for AwaitResumption {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: NAME.into(),
            description: "Park this session until a condition holds or a client resumes it. \
                          Use when there is nothing to do until something external happens \
                          (a build finishes, a deadline arrives). The result is the input the \
                          session is resumed with."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "reason": {"type": "string", "description": "Why the session parks."},
                    "conditions": {
                        "type": "object",
                        "description": "What wakes it: onEvent (event name, trailing * allowed), trigger ({cron, timezone} | {at} | {event, filter}), timeout ({durationMinutes, onTimeout}).",
                        "properties": {
                            "onEvent": {"type": "string"},
                            "trigger": {"type": "object"},
                            "timeout": {"type": "object"}
                        }
                    },
                    "summary": {"type": "string", "description": "What to show while parked."}
                },
                "required": ["reason"]
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Other
    }

    fn title(&self, arguments: &Value) -> String {
        format!(
            "await resumption: {}",
            arguments
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or("?")
        )
    }

    /// Without a suspension host there is nothing to park in: refused.
    async fn call(&self, _ctx: &ToolContext, _arguments: Value) -> Result<ToolOutput, ToolError> {
        Err(ToolError::invalid(
            "await_resumption needs a host that can suspend the session",
        ))
    }

    async fn execute(&self, _ctx: &ToolContext, arguments: Value) -> Result<ToolExit, ToolError> {
        let park = parse_park(&arguments)?;
        Ok(ToolExit::Suspended(Box::new(ToolSuspension {
            continuation: ToolContinuation {
                tool: NAME.into(),
                version: CONTINUATION_VERSION,
                state: serde_json::to_value(&park).unwrap_or(Value::Null),
            },
            park: Some(park),
        })))
    }

    async fn resume_execution(
        &self,
        _ctx: &ToolContext,
        continuation: &ToolContinuation,
        resume: &ResumeInput,
    ) -> Result<ToolExit, ToolError> {
        if continuation.version != CONTINUATION_VERSION {
            return Err(ToolError::NotResumable {
                tool: NAME.into(),
                message: format!("unknown continuation version {}", continuation.version),
            });
        }
        Ok(ToolExit::Done(ToolOutput {
            content: resumed_text(resume),
            raw: json!({"resumed": true, "cause": resume.cause, "input": resume.input}),
            file_changes: Vec::new(),
        }))
    }
}
