//! # berth-actors
//!
//! Session actors, their supervisor and the registry, wired together by a
//! [`Node`] (`DESIGN.md`, "The flow of one control event").
//!
//! - One [`ractor`] actor per session ([`session`]): its mailbox serializes every
//!   control that touches the session (prompt, cancel, close, status, attach), one
//!   handler at a time, in arrival order. Each handler lives in its own file under
//!   `session/lifecycle/`.
//! - A running turn is a task the actor owns, not part of a handler, so the
//!   mailbox answers a cancel or a status while a model call or tool runs.
//! - Every decision is journaled and durable before the caller hears of it; every
//!   event reaches the session's [`watch::Watcher`]s only after it is durable.
//! - The [`supervisor`] restarts a failed session actor from the journal; the
//!   [`registry`] routes by session id and spawns (rehydrates) on demand.

#![warn(missing_docs)]

pub mod auth;
pub mod claimer;
pub mod config;
pub mod error;
pub mod metrics;
pub mod node;
pub mod registry;
pub mod replay;
pub mod session;
pub mod supervisor;
pub mod telemetry;
pub mod watch;

pub use auth::{Principal, Role};
pub use config::NodeConfig;
pub use error::ControlError;
pub use node::{
    BroadcastOutcome, CancelStatus, NewSession, Node, PromptOutcome, Readiness, ResumeOutcome,
    ResumeParams, ScheduleSpec, SessionCounts, SessionSelector, SessionStatus, SuspendOutcome,
    SuspendParams,
};
pub use session::Replay;
pub use watch::{PresenceChange, PresenceNotice, SessionNotice, Watcher};
