//! How a turn ends: the typed terminal of `seeds/remote-session-control.md`
//! ("Stop", "Receipts"). It rides on the prompt result as
//! `_meta.berth.terminal = {kind, owner, reason}` next to ACP `stopReason`.

use serde::{Deserialize, Serialize};

/// What ended a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminalKind {
    /// The model ended its turn (ACP `end_turn`).
    Completed,
    /// The model hit its output token limit (ACP `max_tokens`).
    MaxTokens,
    /// The turn used up its model-call allowance (ACP `max_turn_requests`).
    MaxTurnRequests,
    /// The model refused to continue (ACP `refusal`).
    Refusal,
    /// A client sent `session/cancel` (ACP `cancelled`).
    UserCancelled,
    /// `session/close` ended the running turn (ACP `cancelled`).
    SessionClosed,
    /// The berth process stopped while the turn ran; sealed at the next start-up
    /// and never re-run silently.
    ProcessRestarted,
    /// The model provider failed (network, protocol, auth).
    ProviderError,
    /// berth itself failed (journal write, internal error).
    InternalError,
    /// The session was suspended while this prompt ran (ACP `end_turn`); the
    /// turn continues after a resume. The owner is whoever initiated it.
    Suspended,
    /// A suspension's timeout with `onTimeout: fail` elapsed: the parked turn
    /// failed and its handle can no longer be resumed.
    SuspensionTimeout,
    /// A budget policy suspended the session while this prompt ran (ACP
    /// `end_turn`); an operator resumes it with `{"budget": {...}}`.
    PolicyBudget,
}

/// Who ended a turn. A control client that wants to know *who* stopped a turn
/// reads the owner, not the kind (`remote-session-control.md`, "Receipts").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminalOwner {
    /// A control client (cancel, close).
    User,
    /// The agent (model) finished or refused.
    Agent,
    /// A budget or limit policy.
    Policy,
    /// The runtime (restart, internal failure).
    Harness,
    /// The model provider outside berth.
    Provider,
}

/// ACP `stopReason` values (ACP schema, `StopReason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// `end_turn`
    EndTurn,
    /// `max_tokens`
    MaxTokens,
    /// `max_turn_requests`
    MaxTurnRequests,
    /// `refusal`
    Refusal,
    /// `cancelled`
    Cancelled,
}

/// The sealed end of a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terminal {
    /// What ended it.
    pub kind: TerminalKind,
    /// Who ended it.
    pub owner: TerminalOwner,
    /// A sentence for humans; clients should branch on `kind`/`owner`.
    pub reason: String,
}

impl Terminal {
    /// A terminal with the owner that `kind` always has.
    pub fn new(kind: TerminalKind, reason: impl Into<String>) -> Self {
        Self {
            kind,
            owner: kind.owner(),
            reason: reason.into(),
        }
    }

    /// The ACP `stopReason` reported with this terminal, or `None` when the turn
    /// ended in an error (reported as a JSON-RPC error instead).
    pub fn stop_reason(&self) -> Option<StopReason> {
        match self.kind {
            TerminalKind::Completed | TerminalKind::Suspended | TerminalKind::PolicyBudget => {
                Some(StopReason::EndTurn)
            }
            TerminalKind::MaxTokens => Some(StopReason::MaxTokens),
            TerminalKind::MaxTurnRequests => Some(StopReason::MaxTurnRequests),
            TerminalKind::Refusal => Some(StopReason::Refusal),
            TerminalKind::UserCancelled
            | TerminalKind::SessionClosed
            | TerminalKind::ProcessRestarted => Some(StopReason::Cancelled),
            TerminalKind::ProviderError
            | TerminalKind::InternalError
            | TerminalKind::SuspensionTimeout => None,
        }
    }
}

impl TerminalKind {
    /// The owner a terminal of this kind always has.
    pub fn owner(self) -> TerminalOwner {
        match self {
            TerminalKind::Completed | TerminalKind::Refusal | TerminalKind::Suspended => {
                TerminalOwner::Agent
            }
            TerminalKind::MaxTokens | TerminalKind::ProviderError => TerminalOwner::Provider,
            TerminalKind::MaxTurnRequests
            | TerminalKind::SuspensionTimeout
            | TerminalKind::PolicyBudget => TerminalOwner::Policy,
            TerminalKind::UserCancelled | TerminalKind::SessionClosed => TerminalOwner::User,
            TerminalKind::ProcessRestarted | TerminalKind::InternalError => TerminalOwner::Harness,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_is_user_owned_and_reads_cancelled() {
        let t = Terminal::new(TerminalKind::UserCancelled, "session/cancel");
        assert_eq!(t.owner, TerminalOwner::User);
        assert_eq!(t.stop_reason(), Some(StopReason::Cancelled));
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(json["kind"], "user_cancelled");
        assert_eq!(json["owner"], "user");
    }

    #[test]
    fn restart_is_harness_owned() {
        assert_eq!(
            TerminalKind::ProcessRestarted.owner(),
            TerminalOwner::Harness
        );
    }
}
