//! Standing schedules (Temporal Schedules): a cron that starts a new prompt on
//! a session, with an overlap policy, pause/unpause and a catch-up window.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::conditions::{ConditionError, ResumeConditions, TriggerSpec};
use crate::ids::SessionId;

/// What a firing does while the session's previous run is still going.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// Skip this run (default).
    #[default]
    Skip,
    /// Keep at most one run waiting; it starts when the session is idle.
    BufferOne,
    /// Keep every run waiting (a session runs one prompt at a time, so they
    /// run one after another).
    AllowAll,
}

/// A standing schedule (table `schedules`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Schedule {
    /// `sched_<id>`.
    pub schedule_id: String,
    /// The session it prompts.
    pub session_id: SessionId,
    /// Cron expression: standard 5 fields, optionally a seconds field
    /// first, or an `@` shorthand (the dialect of `trigger.cron`).
    pub cron: String,
    /// IANA timezone (default UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// The prompt text each run sends.
    pub prompt: String,
    /// Overlap policy.
    #[serde(default)]
    pub overlap: OverlapPolicy,
    /// A run missed while berth was down fires at start-up if it is at most
    /// this late (ms); older ones are skipped.
    #[serde(default)]
    pub catchup_window_ms: u64,
    /// Paused schedules do not fire.
    #[serde(default)]
    pub paused: bool,
    /// The next run (none once the cron has no later time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_fire_at: Option<DateTime<Utc>>,
    /// When it last fired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fired_at: Option<DateTime<Utc>>,
    /// Runs started (or buffered).
    #[serde(default)]
    pub fired: u64,
    /// Runs skipped (overlap, suspended or closed session, missed).
    #[serde(default)]
    pub skipped: u64,
    /// Runs waiting behind the session's running turn (`buffer_one`: at most
    /// one). Durable: runs still waiting when berth stops are delivered again
    /// at the next start.
    #[serde(default)]
    pub buffered: u32,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

impl Schedule {
    /// Validates `cron`/`timezone` as a cron trigger.
    ///
    /// # Errors
    /// [`ConditionError`] naming `cron` or `timezone`.
    pub fn validate(cron: &str, timezone: Option<&str>) -> Result<TriggerSpec, ConditionError> {
        let mut trigger = json!({"cron": cron});
        if let Some(tz) = timezone {
            trigger["timezone"] = json!(tz);
        }
        let parsed = ResumeConditions::parse(&json!({"trigger": trigger}), "").map_err(|e| {
            ConditionError {
                field: e
                    .field
                    .trim_start_matches('.')
                    .trim_start_matches("trigger.")
                    .to_owned(),
                reason: e.reason,
            }
        })?;
        parsed.trigger.ok_or_else(|| ConditionError {
            field: "cron".into(),
            reason: "is required".into(),
        })
    }

    /// The first run strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        TriggerSpec::Cron {
            cron: self.cron.clone(),
            timezone: self.timezone.clone(),
        }
        .next_fire_after(after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        match DateTime::parse_from_rfc3339(s) {
            Ok(t) => t.with_timezone(&Utc),
            Err(e) => panic!("bad test instant {s}: {e}"),
        }
    }

    #[test]
    fn standing_schedules_share_the_trigger_cron_dialect() {
        let e = Schedule::validate("0 0 9 * * * 2030", None).unwrap_err();
        assert_eq!(e.field, "cron");
        assert!(e.reason.contains("standard 5-field"), "{}", e.reason);
        let e = Schedule::validate("@reboot", None).unwrap_err();
        assert_eq!(e.field, "cron");
        assert!(e.reason.contains("no boot event"), "{}", e.reason);
        assert!(Schedule::validate("*/10 * * * * *", Some("Europe/Berlin")).is_ok());

        let schedule = Schedule {
            schedule_id: "sched_1".into(),
            session_id: SessionId::from("sess_1"),
            cron: "30 2 * * *".into(),
            timezone: Some("Europe/Berlin".into()),
            prompt: "hi".into(),
            overlap: OverlapPolicy::Skip,
            catchup_window_ms: 0,
            paused: false,
            next_fire_at: None,
            last_fired_at: None,
            fired: 0,
            skipped: 0,
            buffered: 0,
            created_at: utc("2026-01-01T00:00:00Z"),
        };
        // 02:30 is skipped in Berlin on 2026-03-29: the run is at 03:00 CEST.
        assert_eq!(
            schedule.next_after(utc("2026-03-28T12:00:00Z")),
            Some(utc("2026-03-29T01:00:00Z"))
        );
    }
}
