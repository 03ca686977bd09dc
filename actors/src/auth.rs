//! Who is asking: the authenticated principal of a control and its role.
//!
//! Every transport resolves its client to a [`Principal`] before anything
//! reaches a session: stdio and the local control socket are trusted (the
//! local host owner); the HTTP listener maps each bearer token to an actor id
//! and a [`Role`] (issue 8, "Auth and roles"). The actor id is what receipts
//! record (`control_outcome.actor`), never what a client claims about itself.
//!
//! Roles are ordered: `observer < controller < host_owner`. Observers may
//! list, load, query and subscribe; controllers may also prompt, inject,
//! suspend, resume and cancel; only the host owner — or the session's creator
//! — may close a session or revoke another client's injection. Which wire
//! method needs which role is the adapters' table (each adapter speaks its own
//! method names); [`Principal::may`] is the one comparison they all use.

use serde::{Deserialize, Serialize};

/// A client's role (`host_owner | controller | observer`, as in config files
/// and on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads: list, load, query, subscribe.
    Observer,
    /// Reads plus prompt, inject, suspend, resume, cancel.
    Controller,
    /// Everything, including close and revoking others' injections.
    HostOwner,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Role; 3] = [Role::Observer, Role::Controller, Role::HostOwner];

    /// The wire / config name (`observer`, `controller`, `host_owner`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Observer => "observer",
            Role::Controller => "controller",
            Role::HostOwner => "host_owner",
        }
    }

    /// Parses a wire / config name.
    ///
    /// # Errors
    /// A message naming the accepted values when `s` is none of them.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "observer" => Ok(Role::Observer),
            "controller" => Ok(Role::Controller),
            "host_owner" => Ok(Role::HostOwner),
            other => Err(format!(
                "unknown role {other:?}; expected host_owner, controller or observer"
            )),
        }
    }

    /// The roles a client holding this one may act as (this one and every
    /// lower one), highest first: `session/list`'s `attachableRoles`
    /// (`remote-session-control.md`, "Status").
    pub fn attachable(self) -> Vec<&'static str> {
        Role::ALL
            .iter()
            .rev()
            .filter(|r| **r <= self)
            .map(|r| r.as_str())
            .collect()
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An authenticated client: the actor id receipts record and its role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// The actor id (`alice`, `ci-bot`; `acp:N` for a local connection).
    pub actor: String,
    /// What it may do.
    pub role: Role,
}

impl Principal {
    /// A principal with `actor` and `role`.
    pub fn new(actor: impl Into<String>, role: Role) -> Self {
        Self {
            actor: actor.into(),
            role,
        }
    }

    /// The trusted local host owner (stdio, the control socket).
    pub fn local(actor: impl Into<String>) -> Self {
        Self::new(actor, Role::HostOwner)
    }

    /// Whether this principal holds `needed` (or a higher role).
    pub fn may(&self, needed: Role) -> bool {
        self.role >= needed
    }

    /// Whether this principal may act as the owner of a session that
    /// `creator` created (`None`: created before creators were recorded, or
    /// by a local client): the host owner always may; anyone else only if
    /// they created it.
    pub fn owns(&self, creator: Option<&str>) -> bool {
        self.role == Role::HostOwner || creator == Some(self.actor.as_str())
    }
}

/// Checks an actor id taken from configuration: 1 to 128 characters of
/// `A-Z a-z 0-9 . _ : @ / -`.
///
/// # Errors
/// A message saying what is wrong.
pub fn validate_actor_id(actor: &str) -> Result<(), String> {
    if actor.is_empty() || actor.chars().count() > 128 {
        return Err("must be 1 to 128 characters".into());
    }
    if let Some(bad) = actor
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._:@/-".contains(*c)))
    {
        return Err(format!(
            "contains {bad:?}; use only A-Z a-z 0-9 . _ : @ / -"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_and_named() {
        assert!(Role::Observer < Role::Controller && Role::Controller < Role::HostOwner);
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Ok(role));
            assert_eq!(
                serde_json::to_value(role).unwrap(),
                serde_json::json!(role.as_str())
            );
        }
        assert!(Role::parse("admin").unwrap_err().contains("host_owner"));
        assert_eq!(
            Role::Controller.attachable(),
            vec!["controller", "observer"]
        );
    }

    #[test]
    fn owners_are_the_host_owner_and_the_creator() {
        let alice = Principal::new("alice", Role::Controller);
        assert!(alice.owns(Some("alice")));
        assert!(!alice.owns(Some("bob")));
        assert!(!alice.owns(None));
        assert!(Principal::local("acp:1").owns(Some("bob")));
        assert!(alice.may(Role::Observer) && !alice.may(Role::HostOwner));
    }

    #[test]
    fn actor_ids_are_checked() {
        assert!(validate_actor_id("ci-bot@example.com").is_ok());
        assert!(validate_actor_id("").is_err());
        assert!(validate_actor_id("a b").unwrap_err().contains("' '"));
    }
}

/// Marks a request whose [`Principal`] was not authenticated but admitted
/// under a configured anonymous role (`--a2a-anonymous-role`): the listener
/// inserts it beside the principal, and an adapter confines such a caller to
/// what anonymous callers created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anonymous;
