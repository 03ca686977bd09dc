//! Suspension: the domain model of `seeds/acp-session-suspend-rfc.md` over the
//! cooperative engine suspension of `seeds/execution-suspension.md`.
//!
//! - [`conditions`]: [`ResumeConditions`] (`resumeWhen`), validated with errors
//!   that name the offending field.
//! - [`envelope`]: the durable [`Suspension`] envelope (handle, reason,
//!   initiator, conditions, `suspendedAt`, frame, span links, parent session),
//!   the [`SuspendMode`]s and the one-time [`ResumeClaim`].
//! - [`wakeup`]: the compact [`Wakeup`] the scheduler keeps per parked session.

pub mod conditions;
pub mod envelope;
pub mod schedule;
pub mod wakeup;

pub use conditions::{
    event_matches, ConditionError, OnTimeout, ResumeConditions, ResumeTimeout, TriggerSpec,
};
pub use envelope::{
    Initiator, ResumeCause, ResumeClaim, ResumeClaimKind, SpanLink, SuspendMode, SuspendRequest,
    Suspension,
};
pub use schedule::{OverlapPolicy, Schedule};
pub use wakeup::{DueKind, ExternalEvent, Wakeup};
