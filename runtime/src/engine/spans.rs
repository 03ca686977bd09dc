//! The engine's spans: one per model call and one per tool call, as plain
//! [`tracing`] spans named and attributed after the OpenTelemetry GenAI
//! semantic conventions (`gen-ai-spans.md`: "Inference" spans
//! `{gen_ai.operation.name} {gen_ai.request.model}`, kind client; "Execute
//! tool" spans `execute_tool {gen_ai.tool.name}`). They are children of the
//! current span (the turn's, which the caller instruments the turn with);
//! with no OpenTelemetry layer installed they are disabled and cost a
//! callsite check. `otel.name`, `otel.kind` and `otel.status_code` are the
//! fields `tracing-opentelemetry` maps to the span's name, kind and status;
//! integer attributes are recorded as `i64` (the OpenTelemetry integer type).

use tracing::field::Empty;
use tracing::Span;

use crate::frame::{ToolOutcome, ToolOutcomeStatus};
use crate::history::ToolCallRequest;
use crate::ids::{SessionId, TurnId};
use crate::model::{ModelError, ModelResponse, ModelStop};

/// The span of one model call (`gen_ai.operation.name = chat`). `model` is
/// the provider's name (`openai:gpt-4o`, `scripted:PATH`): the part before
/// the colon is `gen_ai.provider.name`, the rest `gen_ai.request.model`.
/// Usage and outcome are recorded by [`model_result`].
pub(crate) fn model_call(
    model: &str,
    session_id: &SessionId,
    turn_id: &TurnId,
    iteration: u32,
) -> Span {
    let (provider, name) = model.split_once(':').unwrap_or((model, model));
    tracing::info_span!(
        "chat",
        otel.name = %format_args!("chat {name}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider,
        gen_ai.request.model = name,
        gen_ai.conversation.id = %session_id,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        berth.turn.id = %turn_id,
        berth.model_call.iteration = i64::from(iteration),
        berth.model_call.stop = Empty,
        error.type = Empty,
    )
}

/// Records a model call's usage (tokens) and why it stopped, or its error
/// kind (`error.type`: `transport`, `http_status`, `protocol`, `config`,
/// or `recorded` for an error `berth replay` plays back from the journal).
pub(crate) fn model_result(span: &Span, result: &Result<ModelResponse, ModelError>) {
    if span.is_disabled() {
        return;
    }
    match result {
        Ok(response) => {
            // Integers are recorded as i64: OpenTelemetry has no unsigned
            // attribute type (a `u64` field would arrive as a string).
            span.record(
                "gen_ai.usage.input_tokens",
                int(response.usage.input_tokens),
            );
            span.record(
                "gen_ai.usage.output_tokens",
                int(response.usage.output_tokens),
            );
            span.record(
                "berth.model_call.stop",
                match response.stop {
                    ModelStop::EndTurn => "end_turn",
                    ModelStop::ToolUse => "tool_use",
                    ModelStop::MaxTokens => "max_tokens",
                    ModelStop::Refusal => "refusal",
                },
            );
        }
        Err(e) => {
            let kind = match e {
                ModelError::Transport(_) => "transport",
                ModelError::Status { .. } => "http_status",
                ModelError::Protocol(_) => "protocol",
                ModelError::Config(_) => "config",
                // Only `berth replay` plays recorded errors; the original
                // kind is not on the tape.
                ModelError::Recorded(_) => "recorded",
            };
            span.record("error.type", kind);
            span.record("otel.status_code", "ERROR");
        }
    }
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The span of one tool call (`gen_ai.operation.name = execute_tool`), a
/// fresh dispatch or the continuation of a suspended call (`resumed`). Its
/// outcome is recorded by [`tool_result`].
pub(crate) fn tool_call(call: &ToolCallRequest, turn_id: &TurnId, resumed: bool) -> Span {
    tracing::info_span!(
        "execute_tool",
        otel.name = %format_args!("execute_tool {}", call.name),
        otel.kind = "internal",
        otel.status_code = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.id,
        gen_ai.tool.type = "function",
        berth.turn.id = %turn_id,
        berth.tool_call.resumed = resumed,
        berth.tool_call.outcome = Empty,
        error.type = Empty,
    )
}

/// Records how a tool call settled (`berth.tool_call.outcome`: `completed`,
/// `failed`, `interrupted`, `unknown`, `suspended`, or `not_started`); a
/// failed call also gets `error.type = tool_error` and an error status.
pub(crate) fn tool_result<E>(span: &Span, outcome: &Result<Option<ToolOutcome>, E>) {
    if span.is_disabled() {
        return;
    }
    let status = match outcome {
        Ok(Some(outcome)) => outcome.status,
        Ok(None) => {
            span.record("berth.tool_call.outcome", "not_started");
            return;
        }
        Err(_) => {
            span.record("error.type", "journal");
            span.record("otel.status_code", "ERROR");
            return;
        }
    };
    let name = match status {
        ToolOutcomeStatus::Completed => "completed",
        ToolOutcomeStatus::Failed => "failed",
        ToolOutcomeStatus::Interrupted => "interrupted",
        ToolOutcomeStatus::Unknown => "unknown",
        ToolOutcomeStatus::Suspended => "suspended",
    };
    span.record("berth.tool_call.outcome", name);
    if status == ToolOutcomeStatus::Failed {
        span.record("error.type", "tool_error");
        span.record("otel.status_code", "ERROR");
    }
}
