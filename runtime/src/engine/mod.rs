//! The turn engine.
//!
//! A turn is a loop of iterations — model call → tool batch → model call … —
//! until the model ends the turn, a limit stops it, it is cancelled, or it
//! suspends ([`run_turn`]; a suspended turn continues with [`resume_turn`]). Its state between steps is an explicit [`crate::frame::Frame`],
//! checkpointed at each phase boundary through the [`TurnSink`].
//!
//! The engine never writes anything itself: every fact goes through
//! [`TurnSink::emit`], which returns only once the fact is durable, so a client
//! never hears of something the journal does not hold. Control reaches the turn
//! only through its [`TurnControl`] and only at the seams of
//! `seeds/remote-session-control.md`; the seam before a tool is dispatched is
//! where cancel's "an unsent tool call is never sent" is enforced.

mod control;
mod spans;
mod turn;

pub use control::{CallCancel, SteeringFeed, TurnControl};
pub use turn::{
    check_resumable, config_fingerprint, config_fingerprint_of, resume_turn, run_turn,
    ExecutionSuspended, ResumeRefusal, TurnDeps, TurnExit, TurnOutcome, TurnSpec,
};

use async_trait::async_trait;

use crate::event::SessionEvent;
use crate::frame::Frame;

/// A sink refused a write (the journal is unavailable).
#[derive(Debug, Clone, thiserror::Error)]
#[error("journal write failed: {0}")]
pub struct SinkError(pub String);

/// Where a running turn sends what happens.
#[async_trait]
pub trait TurnSink: Send + Sync {
    /// Journals `event` and forwards it to the session's watchers.
    /// Returns once the event is durable.
    ///
    /// # Errors
    /// [`SinkError`] when it could not be made durable; the turn then ends with
    /// an `internal_error` terminal.
    async fn emit(&self, event: SessionEvent) -> Result<(), SinkError>;

    /// Journals `event` with the sink's next write instead of on its own.
    /// For events nothing waits on: the tail of a model answer that has
    /// already completed. The turn's next write then carries them, whether that is a
    /// tool batch's announcement or the turn's exit, so the answer costs one
    /// commit instead of two. As with [`TurnSink::emit`], no watcher hears of
    /// the event before that write is durable. The engine calls
    /// [`TurnSink::flush`] when a model call keeps it waiting (a model that
    /// answers at once, like the scripted one, leaves what is held for the
    /// write after its answer); a journaling sink
    /// also flushes before a client is asked to approve a call, and puts
    /// held events first in whatever else the session writes meanwhile (a
    /// steer accepted), so nothing decided after them is recorded before
    /// them. The default emits at once.
    ///
    /// # Errors
    /// [`SinkError`] as for [`TurnSink::emit`] (a holding sink reports its
    /// failure at the write that carries the event).
    async fn emit_with_next_write(&self, event: SessionEvent) -> Result<(), SinkError> {
        self.emit(event).await
    }

    /// Makes durable now what the sink holds (what
    /// [`TurnSink::emit_with_next_write`] held; a journaling sink may also
    /// hold the turn's start), and does nothing when it holds nothing (the
    /// default). The engine calls it before any tool runs.
    ///
    /// # Errors
    /// [`SinkError`] as for [`TurnSink::emit`].
    async fn flush(&self) -> Result<(), SinkError> {
        Ok(())
    }

    /// Asks a client to approve a tool call (ACP `session/request_permission`)
    /// and waits for the answer. The default has no client to ask and rejects.
    ///
    /// # Errors
    /// [`SinkError`] when the request could not be journaled.
    async fn request_permission(
        &self,
        request: &PermissionRequest,
    ) -> Result<PermissionDecision, SinkError> {
        let _ = request;
        Ok(PermissionDecision::Rejected {
            reason: "no client is attached to answer permission requests".into(),
        })
    }

    /// Durably stores `frame` as the turn's latest checkpoint; returns once durable.
    ///
    /// # Errors
    /// [`SinkError`] as for [`TurnSink::emit`].
    async fn checkpoint(&self, frame: &Frame) -> Result<(), SinkError>;

    /// [`TurnSink::emit`] of each of `events`, in order, then
    /// [`TurnSink::checkpoint`] of `frame`. A journaling sink makes them one
    /// write (one commit instead of `events.len() + 1`: a tool step's
    /// announced calls and the frame that lists them land together); the
    /// default does them one by one.
    ///
    /// # Errors
    /// [`SinkError`] as for [`TurnSink::emit`]; a journaling sink then wrote
    /// none of them.
    async fn emit_with_checkpoint(
        &self,
        events: Vec<SessionEvent>,
        frame: &Frame,
    ) -> Result<(), SinkError> {
        for event in events {
            self.emit(event).await?;
        }
        self.checkpoint(frame).await
    }

    /// Whether a running call's `in_progress` update may wait (up to a
    /// short grace) to be written with the call's outcome. `true` for a
    /// journaling sink that joins writes ([`TurnSink::emit_with_checkpoint`]
    /// as one commit): a fast call then costs one commit instead of two. The
    /// default, `false`, emits it before the call runs, as a replaying sink
    /// must: there the call answers from the record, and a call that never
    /// settled has only its `in_progress` to show.
    fn joins_in_progress(&self) -> bool {
        false
    }
}

/// A tool call waiting for a client's approval.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PermissionRequest {
    /// The call.
    pub tool_call_id: crate::ids::ToolCallId,
    /// Its title.
    pub title: String,
    /// Its presentation kind.
    pub kind: crate::event::ToolKind,
    /// Its arguments.
    pub raw_input: serde_json::Value,
}

/// A client's answer to a permission request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PermissionDecision {
    /// Run the call.
    Allowed,
    /// Do not run it.
    Rejected {
        /// Why (the option chosen, or that nobody could be asked).
        reason: String,
    },
    /// The turn was cancelled while waiting (ACP: outcome `cancelled`).
    Cancelled,
}
