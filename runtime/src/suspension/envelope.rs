//! The durable suspension envelope and the resume claim.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::conditions::ResumeConditions;
use crate::frame::Frame;
use crate::ids::{SessionId, TurnId};

/// When a `session/suspend` takes effect (RFC `SessionSuspendRequest.mode`;
/// DESIGN.md, "Suspension and resumption").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuspendMode {
    /// Default: after the in-flight model call and its tool batch settle,
    /// before the next model call.
    #[default]
    FinishStep,
    /// At the next `pre_tool_dispatch` seam (or before the next model call,
    /// whichever comes first): unstarted calls are kept in the frame, started
    /// ones settle.
    InterruptImmediate,
    /// The running prompt turn finishes, then the session parks.
    WaitForCompletion,
}

impl SuspendMode {
    /// The wire name (`finish_step`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FinishStep => "finish_step",
            Self::InterruptImmediate => "interrupt_immediate",
            Self::WaitForCompletion => "wait_for_completion",
        }
    }
}

/// Who parked the session (RFC `SessionUpdate_Suspended.initiator`, extended
/// by DESIGN.md with the policy engine and the scheduler).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Initiator {
    /// A control client (`session/suspend`).
    Client,
    /// The agent itself (the `await_resumption` tool).
    Agent,
    /// A budget or limit policy.
    Policy,
    /// The scheduler.
    Scheduler,
}

/// Why a suspended session was woken (RFC `SessionUpdate_Resumed.cause`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeCause {
    /// `session/resume` from a client.
    ExplicitResume,
    /// A `trigger` condition matched.
    ConditionFired,
    /// The `timeout` elapsed.
    Timeout,
    /// An `onEvent` event arrived.
    ExternalEvent,
}

impl ResumeCause {
    /// Every cause, for `resumeCauses` in `initialize`.
    pub const ALL: [ResumeCause; 4] = [
        Self::ExplicitResume,
        Self::ConditionFired,
        Self::Timeout,
        Self::ExternalEvent,
    ];
}

/// An OpenTelemetry span link persisted with a suspension so a resume after a
/// restart can still link to it (filled by the telemetry layer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpanLink {
    /// W3C trace id (32 hex chars).
    pub trace_id: String,
    /// Span id (16 hex chars).
    pub span_id: String,
}

/// A parked session: everything a resume needs, journaled (with its receipt)
/// before the suspend is acknowledged. At most one per session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suspension {
    /// Server-assigned handle (`susp_<id>`), echoed by `session/resume`.
    pub handle: String,
    /// The session.
    pub session_id: SessionId,
    /// Free-form reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who parked it.
    pub initiator: Initiator,
    /// The authenticated actor that asked (a connection, `agent`, `policy`).
    pub actor: String,
    /// The mode it was requested with.
    pub mode: SuspendMode,
    /// What may wake it besides an explicit resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_when: Option<ResumeConditions>,
    /// A digest to show while parked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// When the suspension was committed.
    #[serde(with = "crate::clock::rfc3339")]
    pub suspended_at: DateTime<Utc>,
    /// The parked turn's frame; `None` when the session was idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame: Option<Frame>,
    /// The parked turn (same as `frame.turn_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    /// The session that spawned this one, for nested sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_id: Option<SessionId>,
    /// Span links (the suspension span and the turn span active at suspend).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub span_links: Vec<SpanLink>,
}

/// How a suspension handle was used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeClaimKind {
    /// A resume won the claim.
    Resumed,
    /// `session/close` cancelled the suspension; no resume can follow.
    Cancelled,
    /// A `fail` timeout ended it.
    Failed,
}

/// The one-time claim on a handle (table `resume_claims`). Taken in the same
/// storage transaction as the resumption; a second claim of the same handle is
/// refused by the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResumeClaim {
    /// The handle.
    pub handle: String,
    /// The session.
    pub session_id: SessionId,
    /// How it was used up.
    pub kind: ResumeClaimKind,
    /// Why it woke (resumes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<ResumeCause>,
    /// Who took it.
    pub actor: String,
    /// When.
    #[serde(with = "crate::clock::rfc3339")]
    pub claimed_at: DateTime<Utc>,
}

/// A `session/suspend` accepted while a turn runs, kept in the session record
/// until the turn parks (the RFC's `requested → quiescing` states). It is
/// durable: if berth stops while the turn quiesces, start-up completes the
/// suspension from the turn's last checkpoint instead of sealing the turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuspendRequest {
    /// The handle the suspension will have.
    pub handle: String,
    /// The mode in force (upgraded by a later, stronger request).
    pub mode: SuspendMode,
    /// Who asked.
    pub initiator: Initiator,
    /// The actor that asked.
    pub actor: String,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What may wake it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_when: Option<ResumeConditions>,
    /// When it was accepted.
    #[serde(with = "crate::clock::rfc3339")]
    pub requested_at: DateTime<Utc>,
}
