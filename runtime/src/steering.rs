//! Steering: messages injected into a running turn (`session/inject`) and the
//! seams at which the turn drains them (`seeds/remote-session-control.md`,
//! "Steer", "Queue", "Interrupt"; DESIGN.md, "The turn engine").
//!
//! | mode | drained at |
//! |---|---|
//! | `steer` | `turn_start`, `post_tool_dispatch`, `turn_end` — never `pre_tool_dispatch` |
//! | `queue` | `loop_exit` only; recorded in the transcript, never shown to a model |
//! | `interrupt_immediate` (alias `interrupt`) | every steer seam plus `pre_tool_dispatch` |
//!
//! The [`SteeringQueue`] is shared by the session actor (which pushes, revokes
//! and replaces) and the running turn (which drains); its lock makes "revoke
//! vs. delivery" a clean race with exactly one winner.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::content::Prompt;

/// How an injected message is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InjectMode {
    /// After the current step: the model reads it before its next call.
    Steer,
    /// Audit only: lands in the transcript when the loop ends.
    Queue,
    /// Before the pending tool batch dispatches (skipping it), or at any steer seam.
    InterruptImmediate,
}

impl InjectMode {
    /// Parses a wire mode; `interrupt` is accepted for `interrupt_immediate`.
    pub fn parse(mode: &str) -> Option<Self> {
        match mode {
            "steer" => Some(Self::Steer),
            "queue" => Some(Self::Queue),
            "interrupt_immediate" | "interrupt" => Some(Self::InterruptImmediate),
            _ => None,
        }
    }

    /// Whether a message of this mode is drained at `seam`.
    pub fn drains_at(self, seam: Seam) -> bool {
        match self {
            Self::Steer => matches!(
                seam,
                Seam::TurnStart | Seam::PostToolDispatch | Seam::TurnEnd
            ),
            Self::Queue => seam == Seam::LoopExit,
            Self::InterruptImmediate => matches!(
                seam,
                Seam::TurnStart | Seam::PreToolDispatch | Seam::PostToolDispatch | Seam::TurnEnd
            ),
        }
    }
}

/// The points of the turn loop where queued control is drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Seam {
    /// Start of an iteration, before the model call.
    TurnStart,
    /// A tool batch is about to dispatch.
    PreToolDispatch,
    /// A tool batch has settled.
    PostToolDispatch,
    /// The model ended its turn; the loop is about to exit.
    TurnEnd,
    /// The loop exited (for any reason).
    LoopExit,
}

/// One injected message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Injection {
    /// Server-assigned id (`msg_…`), returned by `session/inject`.
    pub message_id: String,
    /// Delivery mode.
    pub mode: InjectMode,
    /// The message.
    pub content: Prompt,
    /// Who injected it (the control's actor); only they may revoke or replace it.
    #[serde(default)]
    pub owner: String,
}

/// Why an injection cannot be revoked or replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InjectionConflict {
    /// It already reached the turn.
    #[error("the message was already delivered")]
    AlreadyDelivered,
    /// It was revoked before.
    #[error("the message was already revoked")]
    AlreadyRevoked,
    /// No such message in this session's running turn.
    #[error("no such message id")]
    UnknownMessageId,
    /// Another client injected it.
    #[error("only the client that injected the message may revoke or replace it")]
    NotOwnerOrNotAuthorized,
}

impl InjectionConflict {
    /// The wire reason (`already_delivered`, …).
    pub fn reason(self) -> &'static str {
        match self {
            Self::AlreadyDelivered => "already_delivered",
            Self::AlreadyRevoked => "already_revoked",
            Self::UnknownMessageId => "unknown_message_id",
            Self::NotOwnerOrNotAuthorized => "not_owner_or_not_authorized",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    Delivered,
    Revoked,
}

/// Pending injections of one turn, FIFO, plus what became of the others.
#[derive(Debug, Default)]
pub struct SteeringQueue {
    pending: VecDeque<Injection>,
    settled: HashMap<String, Settled>,
}

impl SteeringQueue {
    /// Appends an injection.
    pub fn push(&mut self, injection: Injection) {
        self.pending.push_back(injection);
    }

    /// Pending injections in delivery (FIFO) order.
    pub fn pending(&self) -> impl Iterator<Item = &Injection> {
        self.pending.iter()
    }

    fn position(
        &self,
        message_id: &str,
        actor: &str,
        override_owner: bool,
    ) -> Result<usize, InjectionConflict> {
        if let Some(i) = self.pending.iter().position(|p| p.message_id == message_id) {
            if self.pending[i].owner != actor && !override_owner {
                return Err(InjectionConflict::NotOwnerOrNotAuthorized);
            }
            return Ok(i);
        }
        Err(match self.settled.get(message_id) {
            Some(Settled::Delivered) => InjectionConflict::AlreadyDelivered,
            Some(Settled::Revoked) => InjectionConflict::AlreadyRevoked,
            None => InjectionConflict::UnknownMessageId,
        })
    }

    /// Removes a pending injection so it is never delivered. Only its owner
    /// (`actor`) may.
    ///
    /// # Errors
    /// [`InjectionConflict`] when it is not pending or not `actor`'s.
    pub fn revoke(
        &mut self,
        message_id: &str,
        actor: &str,
    ) -> Result<Injection, InjectionConflict> {
        self.revoke_as(message_id, actor, false)
    }

    /// [`SteeringQueue::revoke`]; with `override_owner` (the session's owner
    /// — host owner or creator — revoking another client's message) the
    /// owner check is skipped.
    ///
    /// # Errors
    /// [`InjectionConflict`] when it is not pending, or not `actor`'s and
    /// `override_owner` is false.
    pub fn revoke_as(
        &mut self,
        message_id: &str,
        actor: &str,
        override_owner: bool,
    ) -> Result<Injection, InjectionConflict> {
        let i = self.position(message_id, actor, override_owner)?;
        let revoked = self
            .pending
            .remove(i)
            .ok_or(InjectionConflict::UnknownMessageId)?;
        self.settled
            .insert(revoked.message_id.clone(), Settled::Revoked);
        Ok(revoked)
    }

    /// Replaces a pending injection's content, keeping its id, mode and place.
    /// Only its owner (`actor`) may.
    ///
    /// # Errors
    /// [`InjectionConflict`] when it is not pending or not `actor`'s.
    pub fn replace(
        &mut self,
        message_id: &str,
        actor: &str,
        content: Prompt,
    ) -> Result<Injection, InjectionConflict> {
        let i = self.position(message_id, actor, false)?;
        let entry = &mut self.pending[i];
        entry.content = content;
        Ok(entry.clone())
    }

    /// Takes every pending injection, whatever its mode (the turn is over).
    pub fn drain_all(&mut self) -> Vec<Injection> {
        std::mem::take(&mut self.pending).into()
    }

    /// Takes, in FIFO order, every pending injection that drains at `seam`.
    pub fn drain(&mut self, seam: Seam) -> Vec<Injection> {
        let (due, keep): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.mode.drains_at(seam));
        self.pending = keep;
        for injection in &due {
            self.settled
                .insert(injection.message_id.clone(), Settled::Delivered);
        }
        due.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inj(id: &str, mode: InjectMode) -> Injection {
        Injection {
            message_id: id.into(),
            mode,
            content: Prompt::text(id),
            owner: "me".into(),
        }
    }

    #[test]
    fn seams_follow_the_seed() {
        use InjectMode::*;
        use Seam::*;
        assert!(!Steer.drains_at(PreToolDispatch));
        assert!(
            Steer.drains_at(TurnStart)
                && Steer.drains_at(PostToolDispatch)
                && Steer.drains_at(TurnEnd)
        );
        assert!(!Steer.drains_at(LoopExit));
        assert!(
            Queue.drains_at(LoopExit) && !Queue.drains_at(TurnEnd) && !Queue.drains_at(TurnStart)
        );
        for seam in [TurnStart, PreToolDispatch, PostToolDispatch, TurnEnd] {
            assert!(InterruptImmediate.drains_at(seam));
        }
        assert_eq!(InjectMode::parse("interrupt"), Some(InterruptImmediate));
        assert_eq!(InjectMode::parse("Steer"), None);
    }

    #[test]
    fn drain_is_fifo_per_seam_and_revoke_races_cleanly() {
        let mut q = SteeringQueue::default();
        q.push(inj("a", InjectMode::Steer));
        q.push(inj("b", InjectMode::InterruptImmediate));
        q.push(inj("c", InjectMode::Queue));
        q.push(inj("d", InjectMode::Steer));
        let pre: Vec<_> = q
            .drain(Seam::PreToolDispatch)
            .into_iter()
            .map(|i| i.message_id)
            .collect();
        assert_eq!(pre, ["b"]);
        q.replace("d", "me", Prompt::text("d2")).unwrap();
        let post: Vec<_> = q
            .drain(Seam::PostToolDispatch)
            .into_iter()
            .map(|i| i.message_id)
            .collect();
        assert_eq!(post, ["a", "d"]);
        assert_eq!(
            q.revoke("a", "me").unwrap_err(),
            InjectionConflict::AlreadyDelivered
        );
        assert_eq!(q.revoke("c", "me").unwrap().message_id, "c");
        assert_eq!(
            q.revoke("c", "me").unwrap_err(),
            InjectionConflict::AlreadyRevoked
        );
        assert_eq!(
            q.replace("zz", "me", Prompt::text("x")).unwrap_err(),
            InjectionConflict::UnknownMessageId
        );
        assert!(q.drain(Seam::LoopExit).is_empty());
    }
}
