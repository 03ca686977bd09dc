//! Identifiers and the injected id source.
//!
//! Every id the engine generates comes from an [`IdSource`], never from a global
//! generator, so a test (or `berth replay`) can supply a deterministic sequence.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            /// The id as a string slice (its wire form).
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }
    };
}

string_id!(
    /// A session id (ACP `sessionId`), e.g. `sess_6f1c…`.
    SessionId
);
string_id!(
    /// One prompt turn of a session, e.g. `turn_2b7e…` (the seed's checkpoint id shape).
    TurnId
);
string_id!(
    /// A tool call id (ACP `toolCallId`), as the model produced it or as generated.
    ToolCallId
);

/// The per-session position in the event log: 1, 2, 3, … with no gaps.
/// Surfaces on the wire as `lastEventId` and `_meta.berth.eventId`.
pub type EventId = u64;

/// Source of fresh ids. Production uses [`RandomIds`]; tests and replay use
/// [`SequentialIds`].
pub trait IdSource: Send + Sync + fmt::Debug {
    /// A new unique id with the given prefix, e.g. `new_id("sess")` → `sess_…`.
    fn new_id(&self, prefix: &str) -> String;
}

/// UUIDv7-backed ids: `prefix_<32 hex>`, a millisecond timestamp then 74
/// random bits. Ids made close in time sort close together, so the journal's
/// rows of sessions created together share B-tree pages. A burst that
/// touches them all (a wake-up burst) then rewrites fewer pages per commit.
#[derive(Debug, Default)]
pub struct RandomIds;

impl IdSource for RandomIds {
    fn new_id(&self, prefix: &str) -> String {
        // What `format!("{prefix}_{}", uuid.simple())` writes, without the
        // formatting machinery (several ids are made per turn).
        let mut digits = [0; uuid::fmt::Simple::LENGTH];
        let digits = uuid::Uuid::now_v7().simple().encode_lower(&mut digits);
        let mut id = String::with_capacity(prefix.len() + 1 + digits.len());
        id.push_str(prefix);
        id.push('_');
        id.push_str(digits);
        id
    }
}

/// Deterministic ids `prefix_1`, `prefix_2`, … shared across prefixes.
#[derive(Debug, Default)]
pub struct SequentialIds {
    next: AtomicU64,
}

impl IdSource for SequentialIds {
    fn new_id(&self, prefix: &str) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{prefix}_{n}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_are_deterministic() {
        let ids = SequentialIds::default();
        assert_eq!(ids.new_id("sess"), "sess_1");
        assert_eq!(ids.new_id("turn"), "turn_2");
    }

    #[test]
    fn random_ids_are_prefixed_and_unique() {
        let ids = RandomIds;
        let (a, b) = (ids.new_id("sess"), ids.new_id("sess"));
        assert!(a.starts_with("sess_") && a.len() == 5 + 32);
        let digits = a.strip_prefix("sess_").unwrap_or_default();
        let uuid = uuid::Uuid::parse_str(digits).unwrap();
        assert_eq!(a, format!("sess_{}", uuid.simple()));
        assert_ne!(a, b);
    }
}
