//! What the scheduler keeps per parked session: the compact [`Wakeup`]
//! derived from a suspension's conditions, stored (table `wakeups`) in the
//! same transaction as the suspension and removed with it.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::conditions::{event_matches, OnTimeout, ResumeTimeout, TriggerSpec};
use super::envelope::Suspension;
use crate::ids::SessionId;

/// The wake-up conditions of one suspension, with their due times resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wakeup {
    /// The parked session.
    pub session_id: SessionId,
    /// The suspension's handle (what firing claims).
    pub handle: String,
    /// When the suspension was committed; events received before it never
    /// match it.
    #[serde(with = "crate::clock::rfc3339")]
    pub suspended_at: DateTime<Utc>,
    /// When `resumeWhen.timeout` elapses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(with = "crate::clock::rfc3339::option")]
    pub timeout_at: Option<DateTime<Utc>>,
    /// The timeout's action and input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<ResumeTimeout>,
    /// When a `{cron}` / `{at}` trigger next fires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(with = "crate::clock::rfc3339::option")]
    pub trigger_at: Option<DateTime<Utc>>,
    /// Event name pattern from `onEvent` (exact, or a trailing `*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_event: Option<String>,
    /// Event name pattern of an `{event, filter}` trigger, with its filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_event: Option<(String, Option<Map<String, Value>>)>,
}

/// Why a wake-up fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DueKind {
    /// The timeout.
    Timeout,
    /// A time trigger.
    Trigger,
}

impl Wakeup {
    /// The wake-up of `suspension`, or `None` when nothing but an explicit
    /// resume can wake it. A cron trigger's first fire is the first match
    /// after `suspended_at`; an `at` trigger fires at its instant, at once
    /// when that is not after `suspended_at`.
    pub fn of(suspension: &Suspension) -> Option<Self> {
        let conditions = suspension.resume_when.as_ref()?;
        let at = suspension.suspended_at;
        let timeout_at = conditions.timeout.as_ref().map(|t| {
            let ms = (t.duration_minutes * 60_000.0).round();
            // Bounded by validation (ten years); saturate anyway.
            at + Duration::milliseconds(if ms.is_finite() {
                ms as i64
            } else {
                i64::MAX / 2
            })
        });
        let (trigger_at, trigger_event) = match &conditions.trigger {
            Some(TriggerSpec::Event { event, filter }) => {
                (None, Some((event.clone(), filter.clone())))
            }
            // An instant already past when the suspension is committed (given
            // in the past, or passed while the turn quiesced) is overdue: it
            // fires at once, late, as one that came due while berth was down.
            Some(TriggerSpec::At { at }) => (Some(*at), None),
            Some(spec) => (spec.next_fire_after(at), None),
            None => (None, None),
        };
        let wakeup = Self {
            session_id: suspension.session_id.clone(),
            handle: suspension.handle.clone(),
            suspended_at: at,
            timeout_at,
            timeout: conditions.timeout.clone(),
            trigger_at,
            on_event: conditions.on_event.clone(),
            trigger_event,
        };
        wakeup.is_armed().then_some(wakeup)
    }

    /// Whether anything can fire it.
    pub fn is_armed(&self) -> bool {
        self.timeout_at.is_some()
            || self.trigger_at.is_some()
            || self.on_event.is_some()
            || self.trigger_event.is_some()
    }

    /// The earliest due time and what it is.
    pub fn next_due(&self) -> Option<(DateTime<Utc>, DueKind)> {
        let timeout = self.timeout_at.map(|t| (t, DueKind::Timeout));
        let trigger = self.trigger_at.map(|t| (t, DueKind::Trigger));
        match (timeout, trigger) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// Whether an event named `name` with `payload`, received at
    /// `received_at`, wakes it: `onEvent` matches the name, or an event
    /// trigger matches the name and every key of its filter equals the
    /// payload's. Events received before the suspension never match.
    pub fn matches_event(&self, name: &str, payload: &Value, received_at: DateTime<Utc>) -> bool {
        if received_at < self.suspended_at {
            return false;
        }
        if self
            .on_event
            .as_deref()
            .is_some_and(|p| event_matches(p, name))
        {
            return true;
        }
        match &self.trigger_event {
            Some((pattern, filter)) if event_matches(pattern, name) => filter
                .as_ref()
                .is_none_or(|filter| filter.iter().all(|(k, v)| payload.get(k) == Some(v))),
            _ => false,
        }
    }

    /// What a timeout does.
    pub fn on_timeout(&self) -> OnTimeout {
        self.timeout
            .as_ref()
            .map(|t| t.on_timeout)
            .unwrap_or_default()
    }
}

/// An event that entered berth from outside (`_berth/event.emit`, `berth
/// event emit`), journaled before it is acknowledged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalEvent {
    /// Its name (`ci.passed`, `file.changed:src/lib.rs`).
    pub name: String,
    /// Its payload (the resume input of what it wakes).
    #[serde(default)]
    pub data: Value,
    /// When berth accepted it.
    #[serde(with = "crate::clock::rfc3339")]
    pub received_at: DateTime<Utc>,
    /// Who sent it.
    pub source: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suspension::{Initiator, ResumeConditions, SuspendMode};

    fn suspended_at(at: DateTime<Utc>, trigger: TriggerSpec) -> Suspension {
        Suspension {
            handle: "susp_1".into(),
            session_id: SessionId::from("s"),
            reason: None,
            initiator: Initiator::Client,
            actor: "test".into(),
            mode: SuspendMode::FinishStep,
            resume_when: Some(ResumeConditions {
                trigger: Some(trigger),
                ..Default::default()
            }),
            summary: None,
            suspended_at: at,
            frame: None,
            turn_id: None,
            parent_session_id: None,
            span_links: vec![],
        }
    }

    #[test]
    fn an_at_trigger_already_past_at_the_suspension_is_due_at_once() {
        let now = Utc::now();
        for at in [now - Duration::seconds(2), now, now + Duration::seconds(2)] {
            let wakeup = Wakeup::of(&suspended_at(now, TriggerSpec::At { at }))
                .expect("an at trigger is always armed");
            assert_eq!(wakeup.next_due(), Some((at, DueKind::Trigger)));
        }
    }
}
