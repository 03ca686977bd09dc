//! The facts journaled per session.
//!
//! Each [`SessionEvent`] is appended to the session's event log (monotonic
//! [`EventId`](crate::ids::EventId)s) before any client hears of it, and renders
//! to exactly one ACP `session/update` (or, for facts that ACP has no update for,
//! one `_berth/agentEvent` notification) both live and when `session/load`
//! replays the log.

use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::content::Prompt;
use crate::directives::Directive;
use crate::engine::{PermissionDecision, PermissionRequest};
use crate::ids::{ToolCallId, TurnId};
use crate::model::Usage;
use crate::receipt::{DrainDecisionReceipt, ResumptionReceipt, Signed, SuspensionReceipt};
use crate::steering::{Injection, Seam};
use crate::suspension::{Initiator, ResumeCause, ResumeConditions, SuspendMode};
use crate::terminal::{StopReason, Terminal};

/// ACP `ToolKind`: how a client should present a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// Reading files or data.
    Read,
    /// Modifying files or content.
    Edit,
    /// Running commands or code.
    Execute,
    /// Anything else.
    Other,
}

/// ACP `ToolCallStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallStatus {
    /// Announced, not dispatched yet.
    Pending,
    /// Dispatched and running.
    InProgress,
    /// Finished successfully.
    Completed,
    /// Failed, or never ran (cancelled / interrupted before dispatch), or abandoned.
    Failed,
}

/// One journaled fact about a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SessionEvent {
    /// A prompt turn began with this user prompt. Renders as `user_message_chunk`s.
    TurnStarted {
        /// The new turn.
        turn_id: TurnId,
        /// The prompt blocks as the client sent them.
        prompt: Prompt,
    },
    /// Streamed answer text. Renders as `agent_message_chunk`.
    AgentMessageChunk {
        /// The text delta.
        text: String,
    },
    /// Streamed reasoning text. Renders as `agent_thought_chunk`.
    AgentThoughtChunk {
        /// The text delta.
        text: String,
    },
    /// The model asked for a tool call. Renders as `tool_call`.
    ToolCall {
        /// The call id.
        tool_call_id: ToolCallId,
        /// Tool name (`shell`, `write_file`, …).
        name: String,
        /// Human-readable title, e.g. `shell: ls -la`.
        title: String,
        /// Presentation kind.
        kind: ToolKind,
        /// Arguments as the model gave them (ACP `rawInput`).
        raw_input: Value,
    },
    /// A tool call changed status. Renders as `tool_call_update`.
    ToolCallUpdate {
        /// The call id.
        tool_call_id: ToolCallId,
        /// New status.
        status: ToolCallStatus,
        /// Structured result (ACP `rawOutput`), once there is one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raw_output: Option<Value>,
        /// Result text shown to the user (ACP `content`), once there is one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
    },
    /// A turn was sealed. Renders as `_berth/agentEvent` `turn_ended`.
    TurnEnded {
        /// The sealed turn.
        turn_id: TurnId,
        /// ACP stop reason, when the turn did not end in an error.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop_reason: Option<StopReason>,
        /// Typed terminal (kind, owner, reason).
        terminal: Terminal,
        /// Tokens the turn used, over all model calls.
        usage: Usage,
    },
    /// `session/inject` accepted a message for the running turn. Renders as
    /// `_berth/agentEvent` `injection_accepted`.
    InjectionAccepted {
        /// The message.
        injection: Injection,
    },
    /// An injected message reached the turn at `seam`. Renders as
    /// `user_message_chunk` with the message id.
    InjectionDelivered {
        /// The message as delivered.
        injection: Injection,
        /// Where the turn drained it.
        seam: Seam,
    },
    /// A pending injected message was revoked (`session/revoke_inject`).
    InjectionRevoked {
        /// The message id.
        message_id: String,
    },
    /// A pending injected message's content was replaced (`session/replace_inject`).
    InjectionReplaced {
        /// The message with its new content (same id, mode and place).
        injection: Injection,
    },
    /// The turn ended before a pending injected message was delivered.
    InjectionDropped {
        /// The message id.
        message_id: String,
        /// Why it was not delivered.
        reason: String,
    },
    /// A tool call waits for a client's approval (`session/request_permission`).
    PermissionRequested {
        /// The request.
        request: PermissionRequest,
    },
    /// The approval was answered (or the turn was cancelled meanwhile).
    PermissionResolved {
        /// The call.
        tool_call_id: ToolCallId,
        /// The answer.
        decision: PermissionDecision,
    },
    /// `session/rollback` popped the last turn (transcript and files).
    TurnRolledBack {
        /// The checkpoint used (`turn_<uuid>`).
        checkpoint_id: String,
    },
    /// `session/redo` pushed a rolled-back turn back.
    TurnRedone {
        /// The checkpoint used.
        checkpoint_id: String,
    },
    /// A directive was registered on the authority ladder: applied (now in
    /// front of the model) or overruled by a higher one. Renders as
    /// `_berth/agentEvent` `directive`.
    Directive {
        /// The directive.
        directive: Directive,
        /// Whether it is in force.
        applied: bool,
        /// The directive that outranks it, when it was overruled.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        overruled_by: Option<Directive>,
    },
    /// The receipt of one arbitrated control (`remote-session-control.md`,
    /// "Receipts"): emitted for accepted, idempotent and rejected controls,
    /// signed (see [`crate::receipt`]). Renders as `_berth/agentEvent`
    /// `control_outcome` (the seed's fields plus `decided_at` and `signature`).
    ControlOutcome(Signed<ControlOutcome>),
    /// The signed receipt of a committed suspension, journaled with the
    /// `suspended` event. Renders as `_berth/agentEvent` `suspension_receipt`.
    SuspensionReceipt(Signed<SuspensionReceipt>),
    /// The signed receipt of a won resume claim, journaled with the `resumed`
    /// event. Renders as `_berth/agentEvent` `resumption_receipt`.
    ResumptionReceipt(Signed<ResumptionReceipt>),
    /// The signed receipt of a drain decision (an injection delivered or
    /// dropped, a suspend request parked at a seam), journaled with the event
    /// it decides. Renders as `_berth/agentEvent` `drain_decision_receipt`.
    DrainDecisionReceipt(Signed<DrainDecisionReceipt>),
    /// The session was closed; it stays readable and refuses prompts.
    /// Renders as `_berth/agentEvent` `session_closed`.
    SessionClosed {},
    /// A `session/suspend` was accepted while a turn runs: the RFC's
    /// `requested` state, until the turn reaches the seam where it parks
    /// (then `quiescing`, shown by `session/list`, until `suspended`).
    /// Renders as `_berth/agentEvent` `suspend_requested`.
    SuspendRequested {
        /// The handle the suspension will have.
        handle: String,
        /// The mode in force.
        mode: SuspendMode,
        /// Who asked.
        initiator: Initiator,
        /// Why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// What may wake it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume_when: Option<ResumeConditions>,
        /// The state when journaled: `requested` (older journals say `quiescing`).
        state: String,
    },
    /// The session is parked (RFC `SessionUpdate_Suspended`). Renders as
    /// `session/update` `suspended` to clients that declared support, else
    /// as `_berth/agentEvent` `suspended`.
    Suspended {
        /// The handle to resume.
        handle: String,
        /// Why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Who parked it.
        initiator: Initiator,
        /// When it was committed.
        #[serde(with = "crate::clock::rfc3339")]
        suspended_at: DateTime<Utc>,
        /// What may wake it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume_when: Option<ResumeConditions>,
        /// A digest to show while parked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<String>,
        /// The parked turn (`None`: the session was idle).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_id: Option<TurnId>,
        /// The mode it was requested with.
        mode: SuspendMode,
    },
    /// A suspension was resumed (RFC `SessionUpdate_Resumed`). Renders as
    /// `session/update` `resumed` to clients that declared support, else as
    /// `_berth/agentEvent` `resumed`.
    Resumed {
        /// The handle that was claimed.
        handle: String,
        /// Why it woke.
        cause: ResumeCause,
        /// Whether an `input` was fed back.
        had_resume_input: bool,
        /// Whether the turn continues its transcript.
        continue_transcript: bool,
        /// When the claim was committed.
        #[serde(with = "crate::clock::rfc3339")]
        resumed_at: DateTime<Utc>,
        /// The turn that runs now (the parked one continued, or a fresh one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_id: Option<TurnId>,
        /// For a scheduled wake-up: how late it fired (ms after its due
        /// time; large when it came due while berth was down).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lateness_ms: Option<u64>,
        /// The input fed to the resume waitpoint, as given (absent without
        /// input, and in events journaled before berth recorded it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<Value>,
        /// The id of the client message that carried the input (an A2A
        /// `messageId`), when the resumer gave one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
    },
    /// A suspension was cancelled (`session/close` while suspended); its
    /// handle can no longer be resumed. Renders as `_berth/agentEvent`.
    SuspensionCancelled {
        /// The handle.
        handle: String,
        /// Why.
        reason: String,
    },
}

impl SessionEvent {
    /// The event's `type` tag as it appears in the `replayed` list of `session/load`.
    pub fn type_name(&self) -> &'static str {
        match self {
            SessionEvent::TurnStarted { .. } => "turn_started",
            SessionEvent::AgentMessageChunk { .. } => "agent_message_chunk",
            SessionEvent::AgentThoughtChunk { .. } => "agent_thought_chunk",
            SessionEvent::ToolCall { .. } => "tool_call",
            SessionEvent::ToolCallUpdate { .. } => "tool_call_update",
            SessionEvent::TurnEnded { .. } => "turn_ended",
            SessionEvent::InjectionAccepted { .. } => "injection_accepted",
            SessionEvent::InjectionDelivered { .. } => "injection_delivered",
            SessionEvent::InjectionRevoked { .. } => "injection_revoked",
            SessionEvent::InjectionReplaced { .. } => "injection_replaced",
            SessionEvent::InjectionDropped { .. } => "injection_dropped",
            SessionEvent::ControlOutcome(_) => "control_outcome",
            SessionEvent::SuspensionReceipt(_) => "suspension_receipt",
            SessionEvent::ResumptionReceipt(_) => "resumption_receipt",
            SessionEvent::DrainDecisionReceipt(_) => "drain_decision_receipt",
            SessionEvent::Directive { .. } => "directive",
            SessionEvent::TurnRolledBack { .. } => "turn_rolled_back",
            SessionEvent::PermissionRequested { .. } => "permission_requested",
            SessionEvent::PermissionResolved { .. } => "permission_resolved",
            SessionEvent::TurnRedone { .. } => "turn_redone",
            SessionEvent::SessionClosed {} => "session_closed",
            SessionEvent::SuspendRequested { .. } => "suspend_requested",
            SessionEvent::Suspended { .. } => "suspended",
            SessionEvent::Resumed { .. } => "resumed",
            SessionEvent::SuspensionCancelled { .. } => "suspension_cancelled",
        }
    }
}

/// A journaled event with the time it was recorded: JSON `{"at", "event"}`
/// (the row the journal stores, and what `session/load` replays).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// When the event was recorded (injected clock).
    #[serde(with = "crate::clock::rfc3339")]
    pub at: DateTime<Utc>,
    /// The fact.
    pub event: SessionEvent,
    /// `event` as JSON, once encoded (see [`EventRecord::event_json`]).
    #[serde(skip)]
    encoded: EncodedEvent,
}

impl EventRecord {
    /// `event`, recorded at `at`.
    pub fn new(at: DateTime<Utc>, event: SessionEvent) -> Self {
        Self {
            at,
            event,
            encoded: EncodedEvent::default(),
        }
    }

    /// `event` as compact JSON, byte for byte what serializing it writes.
    /// Encoded on the first call and then shared: the journal row that
    /// stores the record and every notification that renders it splice
    /// these bytes, so an event is serialized once however many watchers
    /// see it (`bench-sched`'s wake-up burst serialized each event twice,
    /// row and frame). Records are never changed once stamped; a change to
    /// `event` after this was called would not be seen by it.
    pub fn event_json(&self) -> &RawValue {
        self.encoded.0.get_or_init(|| {
            // Events serialize infallibly (string keys only), as every
            // journal row does (`berth_storage`'s encoding).
            let json = serde_json::value::to_raw_value(&self.event)
                .unwrap_or_else(|_| RawValue::NULL.to_owned());
            Arc::from(json)
        })
    }
}

/// A cache, not part of a record's value: never serialized, always equal,
/// and shared by clones.
#[derive(Clone, Default)]
struct EncodedEvent(OnceLock<Arc<RawValue>>);

impl PartialEq for EncodedEvent {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for EncodedEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "encoded"
        } else {
            "not encoded"
        })
    }
}

/// How a control was arbitrated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlStatus {
    /// It took effect.
    Accepted,
    /// It repeated one that already took effect (a second cancel).
    Idempotent,
    /// It was refused; `reason` says why.
    Rejected,
}

/// A `control_outcome` receipt (field names as in the seed's table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlOutcome {
    /// The session the control named.
    pub session_id: String,
    /// The control's own id (`ctl_…`).
    pub control_id: String,
    /// The ACP method, e.g. `session/cancel`.
    pub method: String,
    /// What happened: `cancelled`, `already_cancelled`, `accepted`, `revoked`, …
    pub outcome: String,
    /// Arbitration result.
    pub status: ControlStatus,
    /// Who sent it (e.g. `acp:stdio:1`).
    pub actor: String,
    /// What it named, e.g. `{"sessionId": …}` or `{"messageId": …}`.
    pub target: Value,
    /// Why it was rejected (machine-readable), when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Extra typed context.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub metadata: Value,
    /// When the control was arbitrated (signed with the rest).
    #[serde(with = "crate::clock::rfc3339")]
    pub decided_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared encoding is what serializing the event writes, a clone
    /// taken after encoding shares it, and it is no part of the record's
    /// value (equality, JSON).
    #[test]
    fn the_shared_encoding_is_the_events_json() {
        let record = EventRecord::new(
            DateTime::from_timestamp_millis(1_700_000_000_123).unwrap_or_default(),
            SessionEvent::AgentMessageChunk {
                text: "ü \"q\" \\ \n 😀 \u{2028}".into(),
            },
        );
        let fresh = record.clone();
        let json = record.event_json().get();
        assert_eq!(json, serde_json::to_string(&record.event).unwrap());
        let shared = record.clone();
        assert!(std::ptr::eq(shared.event_json().get(), json));
        assert_eq!(fresh, record);
        assert_eq!(
            serde_json::to_value(&record).unwrap(),
            serde_json::json!({
                "at": "2023-11-14T22:13:20.123Z",
                "event": {"type": "agent_message_chunk", "text": "ü \"q\" \\ \n 😀 \u{2028}"},
            })
        );
    }
}
