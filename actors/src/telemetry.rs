//! Tracing spans of a session's lifecycle, and how they pair up across a
//! suspension (`seeds/acp-session-suspend-rfc.md`, "OTel `Suspension` /
//! `Resume` span pairing": the suspend span closes before the snapshot
//! persists; the resume span *links* — does not parent — back to the suspend
//! span and to the turn span active at suspend time).
//!
//! Every span here is a plain [`tracing`] span. Whether it becomes an
//! OpenTelemetry span is up to the subscriber the binary installs (OTLP
//! export when `OTEL_EXPORTER_OTLP_*` is set, see `src/telemetry.rs`); without
//! one, the spans are disabled and cost a callsite check, no link is
//! recorded, and no envelope or receipt carries a span id.
//!
//! The shape of a session's traces:
//!
//! ```text
//! acp.request (session/prompt; child of `_meta.traceparent` when given)
//! └── turn                                   ─┐
//!     ├── chat MODEL            (engine)      │ closed when the turn parks
//!     ├── execute_tool TOOL     (engine)      │
//!     └── suspend  ──────────────────────────┘ closed before the envelope commits
//!
//! resume  (a new root; links: [suspension] [turn] [caller request])
//! └── turn  (the parked turn continued, or a fresh one)
//!     └── …
//! ```
//!
//! The links are persisted in the envelope ([`Suspension::span_links`]:
//! first the suspend span, then the turn span when a turn parked), so a
//! resume in a later process — after a restart or a SIGKILL — still links
//! back; the suspend span's id is also signed into the `SuspensionReceipt`
//! (`span_id`) and the `ResumptionReceipt` (`suspension_span_id`). Replay
//! (`crate::replay`) never opens these spans: it re-derives the receipts
//! with the span id the journal recorded, so they stay byte-identical.
//!
//! Attribute names: OpenTelemetry semantic conventions where one exists
//! (`gen_ai.conversation.id`, `rpc.*`), `berth.*` otherwise
//! (`berth.suspension.handle`, `berth.suspension.initiator`,
//! `berth.suspension.reason`, `berth.suspension.has_conditions`,
//! `berth.resume.continue_transcript`, `berth.resume.had_resume_input`, …).
//! The resume input itself is never recorded, only whether there was one.

use std::collections::HashMap;

use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::suspension::{Initiator, ResumeCause, SpanLink, Suspension};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::KeyValue;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde_json::Value;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::node::ResumeParams;

/// Longest `_meta.traceparent` considered (bytes). A version-00 header is 55;
/// later versions may append fields (W3C Trace Context §3.2.4), so some room
/// is left, but not an unbounded amount.
const MAX_TRACEPARENT: usize = 256;
/// Longest `_meta.tracestate` considered (bytes; W3C Trace Context §3.3.1.5
/// asks vendors to propagate at least 512). A longer one is dropped, the
/// traceparent still used.
const MAX_TRACESTATE: usize = 512;

/// The link attribute naming what a link points at (`suspension`, `turn`,
/// `caller`).
pub const LINK_KIND: &str = "berth.link.kind";

/// The W3C trace context in an ACP request's `_meta` (`_meta.traceparent`,
/// `_meta.tracestate`: the keys ACP reserves for W3C trace context
/// propagation). `None` when there is none or it does not parse: an invalid
/// `traceparent` is ignored and the work starts a trace of its own, as W3C
/// Trace Context §4.3 requires of a receiver (never an error to the client).
pub fn remote_parent(meta: &Value) -> Option<SpanContext> {
    let traceparent = meta.get("traceparent")?.as_str()?;
    if traceparent.len() > MAX_TRACEPARENT {
        return None;
    }
    let mut carrier = HashMap::with_capacity(2);
    carrier.insert("traceparent".to_owned(), traceparent.to_owned());
    if let Some(state) = meta.get("tracestate").and_then(Value::as_str) {
        if state.len() <= MAX_TRACESTATE {
            carrier.insert("tracestate".to_owned(), state.to_owned());
        }
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    let parent = cx.span().span_context().clone();
    parent.is_valid().then_some(parent)
}

/// Makes the span context in `meta` (see [`remote_parent`]) the parent of
/// `span`, which must not have been entered yet. Returns whether it did
/// (`false`: no valid `traceparent`, or no OpenTelemetry layer is installed).
pub fn adopt_remote_parent(span: &Span, meta: &Value) -> bool {
    match remote_parent(meta) {
        Some(parent) => span
            .set_parent(opentelemetry::Context::new().with_remote_span_context(parent))
            .is_ok(),
        None => false,
    }
}

/// The OpenTelemetry identity of `span`, as a persisted link; `None` when the
/// span is not exported (no OpenTelemetry layer, or the span is disabled).
/// Starts the span's OpenTelemetry side if it was not yet.
pub fn span_link(span: &Span) -> Option<SpanLink> {
    let cx = span.context();
    let context = cx.span().span_context().clone();
    context.is_valid().then(|| SpanLink {
        trace_id: context.trace_id().to_string(),
        span_id: context.span_id().to_string(),
    })
}

/// A persisted link as an OpenTelemetry span context (remote, sampled);
/// `None` when its ids are not valid hex ids (a hand-edited journal).
pub fn link_context(link: &SpanLink) -> Option<SpanContext> {
    let trace_id = TraceId::from_hex(&link.trace_id).ok()?;
    let span_id = SpanId::from_hex(&link.span_id).ok()?;
    let context = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// The span of one turn run (a fresh turn, or a parked one continued): a
/// child of the current span (the request that started it, or the `resume`
/// span). The engine's model and tool spans are its children.
pub(crate) fn turn_span(session_id: &SessionId, turn_id: &TurnId, resumed: bool) -> Span {
    tracing::info_span!(
        "turn",
        gen_ai.conversation.id = %session_id,
        berth.session.id = %session_id,
        berth.turn.id = %turn_id,
        berth.turn.resumed = resumed,
    )
}

/// Opens the `suspend` span of `suspension` — a child of the parked turn's
/// span, or of the current span (the request) for an idle session — and
/// records the links in the envelope: the suspend span first, then the turn
/// span. The caller drops the returned span before it commits the envelope
/// (no span stays open across a pause).
pub(crate) fn suspend_span(suspension: &mut Suspension, turn: Option<&Span>) -> Span {
    let parent = turn.cloned().unwrap_or_else(Span::current);
    let span = tracing::info_span!(
        parent: &parent,
        "suspend",
        berth.session.id = %suspension.session_id,
        berth.suspension.handle = %suspension.handle,
        berth.suspension.initiator = initiator(suspension.initiator),
        berth.suspension.reason = tracing::field::Empty,
        berth.suspension.has_conditions = suspension.resume_when.is_some(),
        berth.suspension.mode = suspension.mode.as_str(),
        berth.turn.id = tracing::field::Empty,
    );
    if let Some(reason) = &suspension.reason {
        span.record("berth.suspension.reason", reason.as_str());
    }
    if let Some(turn_id) = &suspension.turn_id {
        span.record("berth.turn.id", turn_id.as_str());
    }
    suspension.span_links = match span_link(&span) {
        Some(own) => std::iter::once(own)
            .chain(turn.and_then(span_link))
            .collect(),
        None => Vec::new(),
    };
    span
}

/// The `resume` span of a claim on `suspension`: a new root (never a child of
/// the suspension's trace) that links to the persisted suspension and turn
/// spans and to the caller's span (the request that resumed it, when one is
/// exported). The claim and whatever it starts run inside it.
pub(crate) fn resume_span(suspension: &Suspension, params: &ResumeParams) -> Span {
    let caller = Span::current();
    let span = tracing::info_span!(
        parent: None,
        "resume",
        berth.session.id = %suspension.session_id,
        berth.suspension.handle = %suspension.handle,
        berth.suspension.initiator = initiator(suspension.initiator),
        berth.suspension.reason = tracing::field::Empty,
        berth.suspension.has_conditions = suspension.resume_when.is_some(),
        berth.resume.cause = cause(params.cause),
        berth.resume.continue_transcript = params.continue_transcript,
        berth.resume.had_resume_input = params.input.is_some(),
        berth.turn.id = tracing::field::Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(reason) = &suspension.reason {
        span.record("berth.suspension.reason", reason.as_str());
    }
    if let Some(turn_id) = &suspension.turn_id {
        span.record("berth.turn.id", turn_id.as_str());
    }
    for (i, link) in suspension.span_links.iter().enumerate() {
        if let Some(context) = link_context(link) {
            let kind = if i == 0 { "suspension" } else { "turn" };
            span.add_link_with_attributes(context, vec![KeyValue::new(LINK_KIND, kind)]);
        }
    }
    if let Some(context) = caller_context(&caller) {
        span.add_link_with_attributes(context, vec![KeyValue::new(LINK_KIND, "caller")]);
    }
    span
}

fn caller_context(caller: &Span) -> Option<SpanContext> {
    if caller.is_disabled() {
        return None;
    }
    let cx = caller.context();
    let context = cx.span().span_context().clone();
    context.is_valid().then_some(context)
}

/// The wire name of an initiator (`client`, `agent`, `policy`, `scheduler`).
fn initiator(initiator: Initiator) -> &'static str {
    match initiator {
        Initiator::Client => "client",
        Initiator::Agent => "agent",
        Initiator::Policy => "policy",
        Initiator::Scheduler => "scheduler",
    }
}

/// The wire name of a resume cause (`explicit_resume`, …).
fn cause(cause: ResumeCause) -> &'static str {
    match cause {
        ResumeCause::ExplicitResume => "explicit_resume",
        ResumeCause::ConditionFired => "condition_fired",
        ResumeCause::Timeout => "timeout",
        ResumeCause::ExternalEvent => "external_event",
    }
}

/// The span one inbound JSON-RPC request runs in, for ACP and A2A alike:
/// a root (`parent: None`) named `$name`, with the OpenTelemetry RPC
/// attributes (`rpc.system = jsonrpc`, `rpc.service = $service`,
/// `rpc.method`, kind server, named after the method) and, empty until
/// recorded, `rpc.jsonrpc.request_id` and the error fields
/// [`record_rpc_error`] fills. A macro because a span's name and fields are
/// static metadata. The caller needs `tracing` among its dependencies.
#[macro_export]
macro_rules! jsonrpc_server_span {
    ($name:literal, $service:literal, $method:expr) => {
        ::tracing::info_span!(
            parent: None,
            $name,
            otel.name = $method,
            otel.kind = "server",
            rpc.system = "jsonrpc",
            rpc.service = $service,
            rpc.method = $method,
            rpc.jsonrpc.version = "2.0",
            rpc.jsonrpc.request_id = ::tracing::field::Empty,
            rpc.jsonrpc.error_code = ::tracing::field::Empty,
            rpc.jsonrpc.error_message = ::tracing::field::Empty,
            error.type = ::tracing::field::Empty,
            otel.status_code = ::tracing::field::Empty,
            otel.status_description = ::tracing::field::Empty,
        )
    };
}

/// Marks a request's span as failed (OpenTelemetry JSON-RPC conventions:
/// `rpc.jsonrpc.error_code` / `_message`; span status Error with
/// `error.type` = the code), so a refused request shows as an error in a
/// trace backend rather than as a success. The span must declare those
/// fields (as `Empty`), as the ACP and A2A request spans do.
pub fn record_rpc_error(span: &Span, code: i64, message: &str) {
    span.record("rpc.jsonrpc.error_code", code);
    span.record("rpc.jsonrpc.error_message", message);
    span.record("error.type", tracing::field::display(code));
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", message);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const PARENT: &str = "00f067aa0ba902b7";

    #[test]
    fn a_valid_traceparent_is_the_remote_parent() {
        let meta = json!({"traceparent": format!("00-{TRACE}-{PARENT}-01"), "tracestate": "rojo=00f067aa0ba902b7"});
        let parent = remote_parent(&meta).expect("valid");
        assert_eq!(parent.trace_id().to_string(), TRACE);
        assert_eq!(parent.span_id().to_string(), PARENT);
        assert!(parent.is_remote() && parent.is_sampled());
        assert_eq!(parent.trace_state().get("rojo"), Some("00f067aa0ba902b7"));
    }

    #[test]
    fn an_invalid_traceparent_is_ignored() {
        for bad in [
            json!({}),
            json!({"traceparent": 7}),
            json!({"traceparent": ""}),
            json!({"traceparent": format!("00-{TRACE}-{PARENT}")}),
            json!({"traceparent": format!("00-{}-{PARENT}-01", "0".repeat(32))}),
            json!({"traceparent": format!("00-{TRACE}-{}-01", "0".repeat(16))}),
            json!({"traceparent": format!("ff-{TRACE}-{PARENT}-01")}),
            json!({"traceparent": format!("00-{}-{PARENT}-01", TRACE.to_uppercase())}),
            json!({"traceparent": format!("00-{TRACE}-{PARENT}-01{}", "x".repeat(300))}),
        ] {
            assert!(remote_parent(&bad).is_none(), "{bad} must be ignored");
        }
        // An oversized tracestate is dropped; the traceparent still counts.
        let meta = json!({"traceparent": format!("00-{TRACE}-{PARENT}-01"), "tracestate": "a=".to_owned() + &"b".repeat(600)});
        let parent = remote_parent(&meta).expect("traceparent kept");
        assert_eq!(parent.trace_state().header(), "");
    }

    #[test]
    fn persisted_links_round_trip_and_bad_ids_are_dropped() {
        let link = SpanLink {
            trace_id: TRACE.into(),
            span_id: PARENT.into(),
        };
        let context = link_context(&link).expect("valid");
        assert_eq!(context.trace_id().to_string(), link.trace_id);
        assert_eq!(context.span_id().to_string(), link.span_id);
        for (trace_id, span_id) in [("zz", PARENT), (TRACE, "0000000000000000"), ("", "")] {
            let bad = SpanLink {
                trace_id: trace_id.into(),
                span_id: span_id.into(),
            };
            assert!(link_context(&bad).is_none());
        }
    }

    #[test]
    fn without_an_opentelemetry_layer_nothing_is_linked() {
        let span = tracing::info_span!("probe");
        assert!(span_link(&span).is_none());
        assert!(!adopt_remote_parent(
            &span,
            &json!({"traceparent": format!("00-{TRACE}-{PARENT}-01")})
        ));
    }
}
