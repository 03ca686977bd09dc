//! `resumeWhen` / `conditions` (RFC `ResumeConditions`): what may wake a parked
//! session besides an explicit `session/resume`. Firing them is the
//! scheduler's job; this module only gives them a typed shape and validates
//! them with errors that name the offending field.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// RFC `ResumeConditions`. Empty (all `None`) means only an explicit resume wakes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeConditions {
    /// Resume on a named event (`ci.passed`, `file.changed:src/lib.rs`; a
    /// trailing `*` matches any suffix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_event: Option<String>,
    /// Resume on a trigger-spec match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<TriggerSpec>,
    /// Resume after a deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<ResumeTimeout>,
}

/// A typed trigger (`resumeWhen.trigger`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TriggerSpec {
    /// A cron schedule (`"0 9 * * 1-5"`) in an IANA timezone (default `UTC`).
    Cron {
        /// The cron expression.
        cron: String,
        /// IANA timezone name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timezone: Option<String>,
    },
    /// A point in time.
    At {
        /// RFC 3339 instant.
        at: DateTime<Utc>,
    },
    /// A named event whose payload matches `filter` (every key of `filter`
    /// equal in the payload).
    Event {
        /// Event name, as `onEvent`.
        event: String,
        /// Payload filter.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filter: Option<Map<String, Value>>,
    },
}

/// RFC `ResumeTimeoutSpec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeTimeout {
    /// Minutes from the suspend commit; positive, fractions allowed
    /// (0.001 min = 60 ms).
    pub duration_minutes: f64,
    /// What happens when it elapses (default `resume_with_summary`).
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// The input a `resume_with_input` timeout resumes with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
}

/// RFC `ResumeTimeoutSpec.onTimeout`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Resume; the model is told the wait timed out.
    #[default]
    ResumeWithSummary,
    /// End the session's suspended turn with a typed failure.
    Fail,
    /// Resume with `timeout.input`.
    ResumeWithInput,
}

/// A condition that does not validate; `field` is its path as sent
/// (`resumeWhen.timeout.durationMinutes`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConditionError {
    /// Path of the offending field.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ResumeConditions {
    /// Whether no condition is set (only an explicit resume wakes).
    pub fn is_empty(&self) -> bool {
        self.on_event.is_none() && self.trigger.is_none() && self.timeout.is_none()
    }

    /// Validates a wire `ResumeConditions` object; `path` is where it sits in
    /// the request (`resumeWhen`, `conditions`) and prefixes error fields.
    ///
    /// # Errors
    /// [`ConditionError`] naming the first offending field.
    pub fn parse(value: &Value, path: &str) -> Result<Self, ConditionError> {
        let _ = (value, path);
        todo!("validation")
    }
}
