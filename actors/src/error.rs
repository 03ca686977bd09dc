//! Typed control errors. Each maps to one JSON-RPC error code in the adapters.

use berth_runtime::engine::ResumeRefusal;
use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::steering::InjectionConflict;
use berth_runtime::suspension::ResumeClaim;
use berth_storage::StorageError;

/// Why a resume claim was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResumeConflict {
    /// The handle was already used up (resumed, cancelled by close, or failed).
    #[error("handle already used ({})", serde_json::to_value(.claim.kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default())]
    AlreadyResumed {
        /// The claim that won.
        claim: Box<ResumeClaim>,
    },
    /// The session is not suspended (and the handle, if given, is unknown).
    #[error("the session is not suspended")]
    NotSuspended,
    /// The session is suspended, but under another handle than the one
    /// given (which was never this session's, or not yet used up).
    #[error("the session is suspended under handle {current}, not the one given")]
    HandleMismatch {
        /// The handle of the session's current suspension.
        current: String,
    },
}

/// Why a control was refused or failed. A refused control changed nothing.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ControlError {
    /// The server holds no such session (`remote-session-control.md`: `-32004`).
    #[error("session {session_id} not found")]
    UnknownSession {
        /// The id asked for.
        session_id: SessionId,
    },
    /// The session was closed; it can be loaded but not prompted.
    #[error("session {session_id} is closed")]
    SessionClosed {
        /// The session.
        session_id: SessionId,
    },
    /// The control needs a running turn and there is none
    /// (`remote-session-control.md`, "Steer": `-32004 "Session has no active prompt"`).
    #[error("Session has no active prompt")]
    NoActivePrompt {
        /// The session.
        session_id: SessionId,
    },
    /// An injected message cannot be revoked or replaced.
    #[error("message {message_id}: {conflict}")]
    Injection {
        /// The message id.
        message_id: String,
        /// Why.
        conflict: InjectionConflict,
    },
    /// A prompt turn is already running on the session.
    #[error("session {session_id} already has an active prompt ({turn_id})")]
    PromptActive {
        /// The session.
        session_id: SessionId,
        /// The running turn.
        turn_id: TurnId,
    },
    /// A parameter is invalid (ACP `-32602`); `field` names it on the wire.
    #[error("invalid {field}: {reason}")]
    InvalidParams {
        /// The wire name of the field.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The control cannot run on a suspended session (a prompt, a rollback);
    /// resume it first.
    #[error("session {session_id} is suspended (handle {handle}); resume it first")]
    SessionSuspended {
        /// The session.
        session_id: SessionId,
        /// The suspension's handle.
        handle: String,
    },
    /// A `session/suspend` asked for other resume conditions than the suspend
    /// already pending on the running turn (which keeps its own; a repeated
    /// suspend joins it only with none or the same ones).
    #[error("session {session_id} has a suspend pending (handle {handle}) with other resumeWhen conditions")]
    SuspendPending {
        /// The session.
        session_id: SessionId,
        /// The pending suspension's handle.
        handle: String,
        /// The pending request's conditions (`None`: only an explicit resume wakes it).
        resume_when: Option<Box<berth_runtime::suspension::ResumeConditions>>,
    },
    /// A resume found nothing to claim (RFC: "the losers get a typed error").
    #[error("cannot resume session {session_id}: {reason}")]
    ResumeConflict {
        /// The session.
        session_id: SessionId,
        /// The handle asked for, or the current one.
        handle: Option<String>,
        /// Why.
        reason: ResumeConflict,
    },
    /// The suspended turn cannot continue under the current history or
    /// configuration; checked before the claim, which stays untaken.
    #[error("cannot resume session {session_id}: {refusal}")]
    ResumeRefused {
        /// The session.
        session_id: SessionId,
        /// The handle.
        handle: String,
        /// The engine's refusal.
        refusal: ResumeRefusal,
    },
    /// The journal failed; nothing was acknowledged.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The session actor failed while handling the control; the supervisor
    /// restarts it from the journal.
    #[error("session actor failed: {0}")]
    ActorFailed(String),
}

impl ControlError {
    /// Shorthand for [`ControlError::InvalidParams`].
    pub fn invalid(field: &str, reason: &str) -> Self {
        Self::InvalidParams {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
