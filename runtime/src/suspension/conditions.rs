//! `resumeWhen` / `conditions` (RFC `ResumeConditions`): what may wake a parked
//! session besides an explicit `session/resume`. Firing them is the
//! scheduler's job; this module gives them a typed shape, validates them with
//! errors that name the offending field, and answers the two questions a
//! scheduler asks: does an event name match ([`event_matches`]) and when does a
//! trigger next fire ([`TriggerSpec::next_fire_after`]).
//!
//! [`ResumeConditions::parse`] is the edge: it takes the JSON as sent and
//! either returns typed conditions or a [`ConditionError`] whose `field` is
//! the full path of the first offending key
//! (`resumeWhen.timeout.durationMinutes`). Throughout, a key whose value is
//! `null` counts as absent, and keys an object does not define are rejected,
//! except `_meta` (ACP's extension envelope, allowed on every object): an
//! object or `null`, accepted and not kept.
//! The typed value serializes (`serde_json::to_value`) to the canonical
//! camelCase wire form, which is what a response echoes back.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

mod schedule;

/// Longest event name (`onEvent`, `trigger.event`) accepted, in characters.
pub const MAX_EVENT_NAME_CHARS: usize = 256;

/// Longest `timeout.durationMinutes` accepted: ten years (525 600 min a year).
pub const MAX_DURATION_MINUTES: f64 = 525_600.0 * 10.0;

/// RFC `ResumeConditions`. Empty (all `None`) means only an explicit resume wakes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeConditions {
    /// Resume on a named event (`ci.passed`, `file.changed:src/lib.rs`; a
    /// trailing `*` matches any suffix). Matching rules: [`event_matches`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_event: Option<String>,
    /// Resume on a trigger-spec match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<TriggerSpec>,
    /// Resume after a deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<ResumeTimeout>,
}

/// A typed trigger (`resumeWhen.trigger`). On the wire it is an object in
/// exactly one of three forms, told apart by its keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TriggerSpec {
    /// A cron schedule (`"0 9 * * 1-5"`) in an IANA timezone (default `UTC`),
    /// evaluated on that zone's wall clock.
    ///
    /// A 5-field expression is standard crontab: minute, hour, day of month,
    /// month, day of week, with days of week 0–7 (0 and 7 are Sunday, so
    /// `1-5` is Monday–Friday) or `sun`–`sat`, and a day firing when either
    /// day field matches if both are restricted (neither starts with `*`).
    /// 6 and 7 fields are the `cron` crate's dialect: seconds first, an
    /// optional trailing year, days of week 1–7 with Sunday 1, both day
    /// fields required to match. `@hourly`, `@daily`/`@midnight`, `@weekly`,
    /// `@monthly`, `@yearly`/`@annually` are accepted too.
    Cron {
        /// The cron expression.
        cron: String,
        /// IANA timezone name (`Europe/Berlin`); absent means `UTC`.
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
        /// Event name, as `onEvent` (same rules, same matching).
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
    /// (0.001 min = 60 ms), at most [`MAX_DURATION_MINUTES`].
    pub duration_minutes: f64,
    /// What happens when it elapses (default `resume_with_summary`).
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// The input a `resume_with_input` timeout resumes with (a berth
    /// extension: the RFC's `ResumeTimeoutSpec` has no such field); only
    /// with [`OnTimeout::ResumeWithInput`], which without it resumes with
    /// the timeout notice `resume_with_summary` gives.
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
    /// Resume with `timeout.input`, or with the timeout notice when it has
    /// none.
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

/// Keys of a `ResumeConditions` object.
const CONDITION_KEYS: &[&str] = &["onEvent", "trigger", "timeout"];
/// Keys of a `timeout` object.
const TIMEOUT_KEYS: &[&str] = &["durationMinutes", "onTimeout", "input"];
/// Keys of the cron form of `trigger`.
const CRON_KEYS: &[&str] = &["cron", "timezone"];
/// Keys of the instant form of `trigger`.
const AT_KEYS: &[&str] = &["at"];
/// Keys of the event form of `trigger`.
const EVENT_KEYS: &[&str] = &["event", "filter"];
/// Every key any `trigger` form defines.
const TRIGGER_KEYS: &[&str] = &["cron", "timezone", "at", "event", "filter"];
/// The `trigger` forms, for error messages.
const TRIGGER_FORMS: &str = "{\"cron\": \"0 9 * * 1-5\", \"timezone\"?: \"Europe/Berlin\"}, \
     {\"at\": \"2026-12-01T09:00:00Z\"}, or {\"event\": \"ci.passed\", \"filter\"?: {...}}";
/// The `onTimeout` values, for error messages.
const ON_TIMEOUT_VALUES: &str = "\"resume_with_summary\", \"fail\", \"resume_with_input\"";

impl ResumeConditions {
    /// Whether no condition is set (only an explicit resume wakes).
    pub fn is_empty(&self) -> bool {
        self.on_event.is_none() && self.trigger.is_none() && self.timeout.is_none()
    }

    /// Validates a wire `ResumeConditions` object; `path` is where it sits in
    /// the request (`resumeWhen`, `conditions`) and prefixes error fields.
    ///
    /// `null` is the empty conditions, and so is an object with every key
    /// absent or `null`. The rules per key:
    ///
    /// - `onEvent`: an event name: non-empty, at most
    ///   [`MAX_EVENT_NAME_CHARS`] characters, no whitespace or control
    ///   characters, `*` only as the last character (see [`event_matches`]).
    /// - `timeout`: `{durationMinutes, onTimeout?, input?}`; `durationMinutes`
    ///   a JSON number, finite, > 0 (fractions allowed), at most
    ///   [`MAX_DURATION_MINUTES`]; `onTimeout` one of `resume_with_summary`
    ///   (default), `fail`, `resume_with_input`; `input` allowed only with
    ///   `resume_with_input` (which without it resumes with the timeout
    ///   notice).
    /// - `_meta` on any of these objects: an object (or `null`), ignored.
    /// - `trigger`: exactly one of the [`TriggerSpec`] forms, decided by its
    ///   keys: `{cron, timezone?}` (a valid cron expression, an IANA zone),
    ///   `{at}` (RFC 3339 with an offset), `{event, filter?}` (an event name
    ///   as `onEvent`, a filter object).
    ///
    /// Nothing here reads the clock: an `at` in the past is accepted.
    ///
    /// # Errors
    /// [`ConditionError`] naming the first offending field by its full path
    /// (`resumeWhen.trigger.cron`), or `path` itself when `value` is not an
    /// object, and saying what is allowed. Never panics.
    pub fn parse(value: &Value, path: &str) -> Result<Self, ConditionError> {
        let map = match value {
            Value::Null => return Ok(Self::default()),
            Value::Object(map) => map,
            other => {
                return Err(error(
                    path,
                    format!(
                        "must be an object with any of the keys {}, got {}",
                        key_list(CONDITION_KEYS),
                        kind(other)
                    ),
                ))
            }
        };
        reject_unknown(map, path, CONDITION_KEYS, "")?;
        check_meta(map, path)?;
        let on_event = present(map, "onEvent")
            .map(|v| parse_event_name(v, &join(path, "onEvent")))
            .transpose()?;
        let trigger = present(map, "trigger")
            .map(|v| parse_trigger(v, &join(path, "trigger")))
            .transpose()?;
        let timeout = present(map, "timeout")
            .map(|v| parse_timeout(v, &join(path, "timeout")))
            .transpose()?;
        Ok(Self {
            on_event,
            trigger,
            timeout,
        })
    }
}

impl TriggerSpec {
    /// The first time strictly after `after` at which this trigger fires, in
    /// UTC.
    ///
    /// - `Cron`: the next matching wall-clock time in `timezone` (UTC when
    ///   absent), converted to UTC, so a daily `0 9 * * *` in `Europe/Berlin`
    ///   fires at 08:00Z in winter and 07:00Z in summer. A wall-clock time a
    ///   DST change skips does not fire that day; one it repeats fires once,
    ///   at its first occurrence. Schedules end with the year 2100.
    /// - `At`: the instant, if it is after `after`.
    /// - `Event`: never (`None`); events are matched, not scheduled.
    ///
    /// `None` also when the schedule has no later fire, or when a `Cron`
    /// trigger does not validate (one built without
    /// [`ResumeConditions::parse`]).
    pub fn next_fire_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Self::Cron { cron, timezone } => {
                let tz = schedule::timezone(timezone.as_deref()).ok()?;
                schedule::CronSchedule::parse(cron)
                    .ok()?
                    .next_after(tz, after)
            }
            Self::At { at } => (*at > after).then_some(*at),
            Self::Event { .. } => None,
        }
    }
}

/// Whether the event `name` matches `pattern` (an `onEvent` or
/// `trigger.event` value).
///
/// A pattern ending in `*` matches every name that starts with the part
/// before the `*`, including that part alone (`ci.*` matches `ci.passed` and
/// `ci.`; `*` matches every name). Any other pattern matches only the
/// identical name: comparison is exact and case-sensitive, and a `*` in
/// `name` is an ordinary character.
pub fn event_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == pattern,
    }
}

/// An event name: non-empty, at most [`MAX_EVENT_NAME_CHARS`] characters, no
/// whitespace or control characters, `*` only last.
fn parse_event_name(value: &Value, field: &str) -> Result<String, ConditionError> {
    let Value::String(name) = value else {
        return Err(error(
            field,
            format!(
                "must be an event name string such as \"ci.passed\", got {}",
                kind(value)
            ),
        ));
    };
    if name.trim().is_empty() {
        return Err(error(
            field,
            "must not be empty; give an event name such as \"ci.passed\"",
        ));
    }
    let chars = name.chars().count();
    if chars > MAX_EVENT_NAME_CHARS {
        return Err(error(
            field,
            format!("is {chars} characters long; at most {MAX_EVENT_NAME_CHARS} allowed"),
        ));
    }
    if let Some((at, c)) = name
        .chars()
        .enumerate()
        .find(|(_, c)| c.is_whitespace() || c.is_control())
    {
        return Err(error(
            field,
            format!("must not contain whitespace or control characters ({c:?} at character {at})"),
        ));
    }
    if name.find('*').is_some_and(|at| at + 1 != name.len()) {
        return Err(error(
            field,
            "`*` is allowed only as the last character (a trailing wildcard, as in \"ci.*\")",
        ));
    }
    Ok(name.clone())
}

/// A `timeout` object.
fn parse_timeout(value: &Value, field: &str) -> Result<ResumeTimeout, ConditionError> {
    let Value::Object(map) = value else {
        return Err(error(
            field,
            format!(
                "must be an object {{\"durationMinutes\": <number>, \"onTimeout\"?: ..., \
                 \"input\"?: ...}}, got {}",
                kind(value)
            ),
        ));
    };
    reject_unknown(map, field, TIMEOUT_KEYS, "")?;
    check_meta(map, field)?;

    let duration_field = join(field, "durationMinutes");
    let duration_minutes = match present(map, "durationMinutes") {
        None => {
            return Err(error(
                duration_field,
                "is required: minutes from the suspend commit, a positive number",
            ))
        }
        Some(value) => parse_duration_minutes(value, &duration_field)?,
    };

    let on_timeout = match present(map, "onTimeout") {
        None => OnTimeout::default(),
        Some(Value::String(s)) if s == "resume_with_summary" => OnTimeout::ResumeWithSummary,
        Some(Value::String(s)) if s == "fail" => OnTimeout::Fail,
        Some(Value::String(s)) if s == "resume_with_input" => OnTimeout::ResumeWithInput,
        Some(other) => {
            let got = match other {
                Value::String(s) => format!("{s:?}"),
                other => kind(other).to_owned(),
            };
            return Err(error(
                join(field, "onTimeout"),
                format!("must be one of {ON_TIMEOUT_VALUES}, got {got}"),
            ));
        }
    };

    let input = present(map, "input").cloned();
    if on_timeout != OnTimeout::ResumeWithInput && input.is_some() {
        return Err(error(
            join(field, "input"),
            "is allowed only with onTimeout \"resume_with_input\"",
        ));
    }

    Ok(ResumeTimeout {
        duration_minutes,
        on_timeout,
        input,
    })
}

/// `timeout.durationMinutes`: a finite JSON number in
/// (0, [`MAX_DURATION_MINUTES`]].
fn parse_duration_minutes(value: &Value, field: &str) -> Result<f64, ConditionError> {
    let minutes = match value {
        Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| error(field, format!("{n} is not representable as a 64-bit float")))?,
        Value::String(s) => {
            return Err(error(
                field,
                format!("must be a JSON number, not a string (got {s:?}); e.g. 5 or 0.5"),
            ))
        }
        other => {
            return Err(error(
                field,
                format!("must be a number of minutes, got {}", kind(other)),
            ))
        }
    };
    if !minutes.is_finite() {
        return Err(error(field, "must be a finite number of minutes"));
    }
    if minutes <= 0.0 {
        return Err(error(
            field,
            format!(
                "must be greater than 0 (got {minutes}); fractions are allowed, e.g. 0.5 = 30 s"
            ),
        ));
    }
    if minutes > MAX_DURATION_MINUTES {
        return Err(error(
            field,
            format!("must be at most {MAX_DURATION_MINUTES} minutes (ten years), got {minutes}"),
        ));
    }
    Ok(minutes)
}

/// A `trigger` object: exactly one form, decided by its non-null keys.
fn parse_trigger(value: &Value, field: &str) -> Result<TriggerSpec, ConditionError> {
    let Value::Object(map) = value else {
        return Err(error(
            field,
            format!(
                "must be an object, one of {TRIGGER_FORMS}; got {}",
                kind(value)
            ),
        ));
    };
    reject_unknown(map, field, TRIGGER_KEYS, " in any trigger form")?;
    check_meta(map, field)?;
    let forms: Vec<&str> = ["cron", "at", "event"]
        .into_iter()
        .filter(|key| present(map, key).is_some())
        .collect();
    match forms.as_slice() {
        ["cron"] => parse_cron_trigger(map, field),
        ["at"] => parse_at_trigger(map, field),
        ["event"] => parse_event_trigger(map, field),
        [] => Err(error(
            field,
            format!("must be one of {TRIGGER_FORMS}; it has none of cron, at, event"),
        )),
        several => Err(error(
            field,
            format!(
                "mixes the keys {} of different forms; it must be exactly one of {TRIGGER_FORMS}",
                key_list(several)
            ),
        )),
    }
}

/// `{"cron": ..., "timezone"?: ...}`.
fn parse_cron_trigger(
    map: &Map<String, Value>,
    field: &str,
) -> Result<TriggerSpec, ConditionError> {
    reject_other_form(map, field, CRON_KEYS, "a cron trigger")?;
    let cron_field = join(field, "cron");
    let cron = match present(map, "cron") {
        Some(Value::String(s)) => s.trim().to_owned(),
        other => {
            return Err(error(
                cron_field,
                format!(
                    "must be a cron expression string such as \"0 9 * * 1-5\", got {}",
                    other.map_or("nothing", kind)
                ),
            ))
        }
    };
    let schedule =
        schedule::CronSchedule::parse(&cron).map_err(|reason| error(&cron_field, reason))?;

    let timezone_field = join(field, "timezone");
    let timezone = match present(map, "timezone") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(error(
                timezone_field,
                format!(
                    "must be an IANA timezone name such as \"Europe/Berlin\", got {}",
                    kind(other)
                ),
            ))
        }
    };
    let tz =
        schedule::timezone(timezone.as_deref()).map_err(|reason| error(&timezone_field, reason))?;

    // The epoch is the earliest instant the `cron` crate schedules from.
    if schedule.next_after(tz, DateTime::UNIX_EPOCH).is_none() {
        return Err(error(
            cron_field,
            format!("{cron:?} never matches a date (such as February 30) before the year 2100"),
        ));
    }
    Ok(TriggerSpec::Cron { cron, timezone })
}

/// `{"at": ...}`.
fn parse_at_trigger(map: &Map<String, Value>, field: &str) -> Result<TriggerSpec, ConditionError> {
    reject_other_form(map, field, AT_KEYS, "an at trigger")?;
    let at_field = join(field, "at");
    const EXAMPLE: &str = "an RFC 3339 instant with an offset, e.g. \"2026-12-01T09:00:00Z\"";
    match present(map, "at") {
        Some(Value::String(s)) => DateTime::parse_from_rfc3339(s)
            .map(|at| TriggerSpec::At {
                at: at.with_timezone(&Utc),
            })
            .map_err(|e| error(at_field, format!("must be {EXAMPLE}; {s:?}: {e}"))),
        other => Err(error(
            at_field,
            format!("must be {EXAMPLE}, got {}", other.map_or("nothing", kind)),
        )),
    }
}

/// `{"event": ..., "filter"?: {...}}`.
fn parse_event_trigger(
    map: &Map<String, Value>,
    field: &str,
) -> Result<TriggerSpec, ConditionError> {
    reject_other_form(map, field, EVENT_KEYS, "an event trigger")?;
    let event_field = join(field, "event");
    let event = match present(map, "event") {
        Some(value) => parse_event_name(value, &event_field)?,
        None => return Err(error(event_field, "is required")),
    };
    let filter = match present(map, "filter") {
        None => None,
        Some(Value::Object(filter)) => Some(filter.clone()),
        Some(other) => {
            return Err(error(
                join(field, "filter"),
                format!(
                    "must be an object whose every key must equal the event payload's, got {}",
                    kind(other)
                ),
            ))
        }
    };
    Ok(TriggerSpec::Event { event, filter })
}

/// Rejects a non-null key of another trigger form (`filter` beside `cron`).
fn reject_other_form(
    map: &Map<String, Value>,
    field: &str,
    allowed: &[&str],
    form: &str,
) -> Result<(), ConditionError> {
    match map
        .iter()
        .find(|(key, value)| !value.is_null() && *key != META && !allowed.contains(&key.as_str()))
    {
        Some((key, _)) => Err(error(
            join(field, key),
            format!(
                "is not allowed in {form}; its keys are {}",
                key_list(allowed)
            ),
        )),
        None => Ok(()),
    }
}

/// Rejects the first key of `map` outside `allowed` and `_meta`, naming its
/// path.
fn reject_unknown(
    map: &Map<String, Value>,
    path: &str,
    allowed: &[&str],
    context: &str,
) -> Result<(), ConditionError> {
    match map
        .keys()
        .find(|key| *key != META && !allowed.contains(&key.as_str()))
    {
        Some(key) => Err(error(
            join(path, key),
            format!(
                "unknown key{context}; allowed keys are {}",
                key_list(allowed)
            ),
        )),
        None => Ok(()),
    }
}

/// ACP's extension envelope, allowed on every object.
const META: &str = "_meta";

/// Refuses a `_meta` of `map` that is neither an object nor `null`.
fn check_meta(map: &Map<String, Value>, path: &str) -> Result<(), ConditionError> {
    match present(map, META) {
        None | Some(Value::Object(_)) => Ok(()),
        Some(other) => Err(error(
            join(path, META),
            format!(
                "must be an object (ACP's extension envelope), got {}",
                kind(other)
            ),
        )),
    }
}

/// The value of `key`, `None` when absent or `null`.
fn present<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|value| !value.is_null())
}

/// `path.key`, or `key` at the root.
fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// `a, b, c` with each key quoted.
fn key_list(keys: &[&str]) -> String {
    keys.iter()
        .map(|key| format!("\"{key}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What kind of JSON value this is, for "got ..." in messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn error(field: impl Into<String>, reason: impl Into<String>) -> ConditionError {
    ConditionError {
        field: field.into(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use chrono::{Datelike, Weekday};
    use serde_json::json;

    use super::*;

    fn parse(value: Value) -> Result<ResumeConditions, ConditionError> {
        ResumeConditions::parse(&value, "resumeWhen")
    }

    /// The error's field, asserting there is one.
    fn field_of(value: Value) -> String {
        match parse(value.clone()) {
            Ok(ok) => panic!("{value} should not validate, got {ok:?}"),
            Err(e) => e.field,
        }
    }

    fn err(value: Value) -> ConditionError {
        match parse(value.clone()) {
            Ok(ok) => panic!("{value} should not validate, got {ok:?}"),
            Err(e) => e,
        }
    }

    fn trigger(value: Value) -> TriggerSpec {
        match parse(json!({ "trigger": value })) {
            Ok(ResumeConditions {
                trigger: Some(trigger),
                ..
            }) => trigger,
            other => panic!("expected a trigger, got {other:?}"),
        }
    }

    fn timeout(value: Value) -> ResumeTimeout {
        match parse(json!({ "timeout": value })) {
            Ok(ResumeConditions {
                timeout: Some(timeout),
                ..
            }) => timeout,
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    fn utc(s: &str) -> DateTime<Utc> {
        match DateTime::parse_from_rfc3339(s) {
            Ok(t) => t.with_timezone(&Utc),
            Err(e) => panic!("bad test instant {s}: {e}"),
        }
    }

    fn cron(expression: &str, timezone: Option<&str>) -> TriggerSpec {
        match timezone {
            Some(tz) => trigger(json!({ "cron": expression, "timezone": tz })),
            None => trigger(json!({ "cron": expression })),
        }
    }

    /// The first `n` fire times after `after`.
    fn fires(spec: &TriggerSpec, after: &str, n: usize) -> Vec<DateTime<Utc>> {
        let mut at = utc(after);
        let mut out = Vec::new();
        for _ in 0..n {
            match spec.next_fire_after(at) {
                Some(next) => {
                    assert!(next > at, "{next} is not after {at}");
                    out.push(next);
                    at = next;
                }
                None => break,
            }
        }
        out
    }

    // ---- the object itself ----

    #[test]
    fn null_and_empty_objects_are_empty_conditions() {
        for value in [
            json!(null),
            json!({}),
            json!({"onEvent": null, "trigger": null, "timeout": null}),
        ] {
            let parsed = parse(value.clone()).unwrap_or_else(|e| panic!("{value}: {e}"));
            assert!(parsed.is_empty(), "{value}");
            assert_eq!(parsed, ResumeConditions::default());
        }
    }

    #[test]
    fn non_objects_name_the_path() {
        for value in [json!([]), json!("ci.passed"), json!(5), json!(true)] {
            let e = err(value);
            assert_eq!(e.field, "resumeWhen");
            assert!(e.reason.contains("object"), "{}", e.reason);
        }
    }

    #[test]
    fn unknown_keys_are_rejected_by_path_listing_the_allowed_keys() {
        let e = err(json!({"onEvent": "ci.passed", "onevent": "x"}));
        assert_eq!(e.field, "resumeWhen.onevent");
        for key in ["onEvent", "trigger", "timeout"] {
            assert!(e.reason.contains(key), "{}", e.reason);
        }
        // Unknown even when null.
        assert_eq!(field_of(json!({"deadline": null})), "resumeWhen.deadline");
        // The path is whatever the caller says, and may be empty.
        let e = ResumeConditions::parse(&json!({"x": 1}), "conditions").unwrap_err();
        assert_eq!(e.field, "conditions.x");
        let e = ResumeConditions::parse(&json!({"x": 1}), "").unwrap_err();
        assert_eq!(e.field, "x");
    }

    #[test]
    fn error_displays_field_and_reason() {
        let e = err(json!({"onEvent": ""}));
        assert_eq!(e.to_string(), format!("resumeWhen.onEvent: {}", e.reason));
    }

    #[test]
    fn a_full_object_parses_and_echoes_the_canonical_wire_form() {
        let value = json!({
            "onEvent": "ci.*",
            "trigger": {"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"},
            "timeout": {"durationMinutes": 90, "onTimeout": "resume_with_input", "input": {"go": true}},
        });
        let parsed = parse(value).expect("valid");
        assert_eq!(
            parsed,
            ResumeConditions {
                on_event: Some("ci.*".into()),
                trigger: Some(TriggerSpec::Cron {
                    cron: "0 9 * * 1-5".into(),
                    timezone: Some("Europe/Berlin".into()),
                }),
                timeout: Some(ResumeTimeout {
                    duration_minutes: 90.0,
                    on_timeout: OnTimeout::ResumeWithInput,
                    input: Some(json!({"go": true})),
                }),
            }
        );
        let wire = serde_json::to_value(&parsed).expect("serializes");
        assert_eq!(
            wire,
            json!({
                "onEvent": "ci.*",
                "trigger": {"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"},
                "timeout": {"durationMinutes": 90.0, "onTimeout": "resume_with_input", "input": {"go": true}},
            })
        );
        // The echo validates to the same value, and serde reads it back too.
        assert_eq!(parse(wire.clone()), Ok(parsed.clone()));
        assert_eq!(
            serde_json::from_value::<ResumeConditions>(wire).ok(),
            Some(parsed)
        );
    }

    #[test]
    fn every_trigger_form_round_trips_through_the_wire_form() {
        for value in [
            json!({"cron": "*/5 * * * *"}),
            json!({"cron": "0 9 * * 1-5", "timezone": "America/New_York"}),
            json!({"at": "2026-12-01T09:00:00Z"}),
            json!({"event": "ci.passed"}),
            json!({"event": "ci.passed", "filter": {"branch": "main", "attempt": 2}}),
        ] {
            let spec = trigger(value.clone());
            let wire = serde_json::to_value(&spec).expect("serializes");
            assert_eq!(wire, value);
            assert_eq!(serde_json::from_value::<TriggerSpec>(wire).ok(), Some(spec));
        }
    }

    // ---- onEvent ----

    #[test]
    fn on_event_accepts_names_and_a_trailing_wildcard() {
        for name in ["ci.passed", "file.changed:src/lib.rs", "ci.*", "*", "ä.ü/ß"] {
            let parsed = parse(json!({ "onEvent": name })).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(parsed.on_event.as_deref(), Some(name));
        }
    }

    #[test]
    fn on_event_rejects_bad_names() {
        for bad in [
            json!(""),
            json!("   "),
            json!(" ci.passed"),
            json!("ci.passed "),
            json!("ci passed"),
            json!("ci\tpassed"),
            json!("ci\npassed"),
            json!("ci\u{7}passed"),
            json!("ci\u{a0}passed"),
            json!("c*i"),
            json!("*.passed"),
            json!("ci.**"),
            json!(5),
            json!(["ci.passed"]),
            json!({"name": "ci.passed"}),
        ] {
            let e = err(json!({ "onEvent": bad }));
            assert_eq!(e.field, "resumeWhen.onEvent", "{bad}");
        }
        assert!(err(json!({"onEvent": ""})).reason.contains("empty"));
        assert!(err(json!({"onEvent": "a b"})).reason.contains("whitespace"));
        assert!(err(json!({"onEvent": "a*b"}))
            .reason
            .contains("last character"));
    }

    #[test]
    fn on_event_length_is_counted_in_characters() {
        let at_limit: String = "é".repeat(MAX_EVENT_NAME_CHARS);
        assert!(parse(json!({ "onEvent": at_limit })).is_ok());
        let over = "a".repeat(MAX_EVENT_NAME_CHARS + 1);
        let e = err(json!({ "onEvent": over }));
        assert_eq!(e.field, "resumeWhen.onEvent");
        assert!(e.reason.contains("256"), "{}", e.reason);
    }

    #[test]
    fn event_matching_is_exact_or_trailing_prefix() {
        assert!(event_matches("ci.passed", "ci.passed"));
        assert!(!event_matches("ci.passed", "ci.passed.again"));
        assert!(!event_matches("ci.passed", "CI.passed"));
        assert!(!event_matches("ci.passed", "ci"));
        assert!(event_matches("ci.*", "ci.passed"));
        assert!(event_matches("ci.*", "ci.failed:build"));
        assert!(event_matches("ci.*", "ci."));
        assert!(!event_matches("ci.*", "ci"));
        assert!(!event_matches("ci.*", "cd.passed"));
        assert!(event_matches("*", "anything"));
        assert!(event_matches("*", ""));
        // A `*` in the name is literal.
        assert!(!event_matches("ci.passed", "ci.*"));
        assert!(event_matches(
            "file.changed:src/*",
            "file.changed:src/lib.rs"
        ));
    }

    // ---- timeout ----

    #[test]
    fn timeout_accepts_positive_minutes_including_fractions() {
        assert_eq!(timeout(json!({"durationMinutes": 5})).duration_minutes, 5.0);
        assert_eq!(
            timeout(json!({"durationMinutes": 0.001})).duration_minutes,
            0.001
        );
        assert_eq!(
            timeout(json!({"durationMinutes": 1e-9})).duration_minutes,
            1e-9
        );
        assert_eq!(
            timeout(json!({ "durationMinutes": MAX_DURATION_MINUTES })).duration_minutes,
            5_256_000.0
        );
        let t = timeout(json!({"durationMinutes": 5, "onTimeout": null, "input": null}));
        assert_eq!(t.on_timeout, OnTimeout::ResumeWithSummary);
        assert_eq!(t.input, None);
    }

    #[test]
    fn timeout_duration_must_be_a_positive_bounded_number() {
        let field = "resumeWhen.timeout.durationMinutes";
        for bad in [
            json!(0),
            json!(0.0),
            json!(-0.0),
            json!(-1),
            json!(-0.001),
            json!("5"),
            json!(true),
            json!([5]),
            json!({"minutes": 5}),
            json!(5_256_000.001),
            json!(1e300),
            json!(f64::MAX),
            json!(u64::MAX),
            json!(i64::MIN),
        ] {
            let e = err(json!({"timeout": {"durationMinutes": bad}}));
            assert_eq!(e.field, field, "{bad}");
        }
        assert!(err(json!({"timeout": {"durationMinutes": "5"}}))
            .reason
            .contains("not a string"));
        assert!(err(json!({"timeout": {"durationMinutes": 0}}))
            .reason
            .contains("greater than 0"));
        assert!(err(json!({"timeout": {"durationMinutes": 1e9}}))
            .reason
            .contains("ten years"));
        // Missing or null: required.
        for timeout in [
            json!({}),
            json!({"durationMinutes": null}),
            json!({"onTimeout": "fail"}),
        ] {
            let e = err(json!({ "timeout": timeout }));
            assert_eq!(e.field, field);
            assert!(e.reason.contains("required"), "{}", e.reason);
        }
    }

    #[test]
    fn timeout_must_be_an_object_with_known_keys() {
        for bad in [json!(5), json!("5m"), json!([5])] {
            assert_eq!(field_of(json!({ "timeout": bad })), "resumeWhen.timeout");
        }
        let e = err(json!({"timeout": {"durationMinutes": 5, "durationSeconds": 1}}));
        assert_eq!(e.field, "resumeWhen.timeout.durationSeconds");
        for key in ["durationMinutes", "onTimeout", "input"] {
            assert!(e.reason.contains(key), "{}", e.reason);
        }
    }

    #[test]
    fn on_timeout_values() {
        for (wire, expected) in [
            ("resume_with_summary", OnTimeout::ResumeWithSummary),
            ("fail", OnTimeout::Fail),
        ] {
            let t = timeout(json!({"durationMinutes": 1, "onTimeout": wire}));
            assert_eq!(t.on_timeout, expected);
        }
        let t = timeout(
            json!({"durationMinutes": 1, "onTimeout": "resume_with_input", "input": "go on"}),
        );
        assert_eq!(t.on_timeout, OnTimeout::ResumeWithInput);
        assert_eq!(t.input, Some(json!("go on")));

        for bad in [
            json!("retry"),
            json!("Fail"),
            json!("resumeWithSummary"),
            json!(1),
        ] {
            let e = err(json!({"timeout": {"durationMinutes": 1, "onTimeout": bad}}));
            assert_eq!(e.field, "resumeWhen.timeout.onTimeout", "{bad}");
            for value in ["resume_with_summary", "fail", "resume_with_input"] {
                assert!(e.reason.contains(value), "{}", e.reason);
            }
        }
    }

    #[test]
    fn timeout_input_goes_with_resume_with_input_only() {
        let field = "resumeWhen.timeout.input";
        // Optional for resume_with_input, as in the RFC's ResumeTimeoutSpec
        // (null counts as absent).
        for value in [
            json!({"durationMinutes": 1, "onTimeout": "resume_with_input"}),
            json!({"durationMinutes": 1, "onTimeout": "resume_with_input", "input": null}),
        ] {
            let t = timeout(value);
            assert_eq!(t.on_timeout, OnTimeout::ResumeWithInput);
            assert_eq!(t.input, None);
        }
        // Refused otherwise, including with the default onTimeout.
        for timeout in [
            json!({"durationMinutes": 1, "input": "x"}),
            json!({"durationMinutes": 1, "onTimeout": "fail", "input": {"a": 1}}),
            json!({"durationMinutes": 1, "onTimeout": "resume_with_summary", "input": false}),
        ] {
            let e = err(json!({ "timeout": timeout }));
            assert_eq!(e.field, field);
            assert!(e.reason.contains("resume_with_input"), "{}", e.reason);
        }
        // Any JSON value is an input.
        for input in [json!(0), json!(false), json!([]), json!({"nested": [1, 2]})] {
            let t = timeout(
                json!({"durationMinutes": 1, "onTimeout": "resume_with_input", "input": input}),
            );
            assert_eq!(t.input, Some(input));
        }
    }

    #[test]
    fn meta_is_accepted_on_every_object_and_not_kept() {
        let parsed = parse(json!({
            "_meta": {"a": 1},
            "onEvent": "ci.passed",
            "timeout": {"durationMinutes": 1, "_meta": {"b": 2}},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            serde_json::to_value(&parsed).ok(),
            Some(json!({"onEvent": "ci.passed",
                        "timeout": {"durationMinutes": 1.0, "onTimeout": "resume_with_summary"}}))
        );
        for form in [
            json!({"cron": "0 9 * * *", "timezone": "UTC", "_meta": {}}),
            json!({"at": "2026-12-01T09:00:00Z", "_meta": {"c": [1]}}),
            json!({"event": "ci.passed", "filter": {"branch": "main"}, "_meta": null}),
        ] {
            let with_meta = trigger(form.clone());
            let mut without = form;
            if let Some(map) = without.as_object_mut() {
                map.remove("_meta");
            }
            assert_eq!(with_meta, trigger(without));
        }
        // Other unknown keys are still refused beside it; a `_meta` that is
        // not an object is refused at its path.
        assert_eq!(
            field_of(json!({"timeout": {"durationMinutes": 1, "_meta": {}, "later": 1}})),
            "resumeWhen.timeout.later"
        );
        assert_eq!(
            field_of(json!({"trigger": {"at": "2026-12-01T09:00:00Z", "_meta": {}, "x": 1}})),
            "resumeWhen.trigger.x"
        );
        for (value, field) in [
            (json!({"_meta": "x"}), "resumeWhen._meta"),
            (
                json!({"timeout": {"durationMinutes": 1, "_meta": []}}),
                "resumeWhen.timeout._meta",
            ),
            (
                json!({"trigger": {"event": "ci.passed", "_meta": 1}}),
                "resumeWhen.trigger._meta",
            ),
        ] {
            assert_eq!(field_of(value.clone()), field, "{value}");
        }
    }

    // ---- trigger: forms ----

    #[test]
    fn malformed_triggers_name_trigger_and_list_the_forms() {
        for bad in [
            json!({}),
            json!({"cron": null}),
            json!({"timezone": "UTC"}),
            json!({"filter": {}}),
            json!({"cron": "* * * * *", "at": "2026-12-01T09:00:00Z"}),
            json!({"at": "2026-12-01T09:00:00Z", "event": "ci.passed"}),
            json!({"cron": "* * * * *", "event": "ci.passed"}),
            json!("0 9 * * *"),
            json!(["cron"]),
            json!(1),
        ] {
            let e = err(json!({ "trigger": bad }));
            assert_eq!(e.field, "resumeWhen.trigger", "{bad}");
            for form in ["cron", "at", "event"] {
                assert!(e.reason.contains(form), "{bad}: {}", e.reason);
            }
        }
    }

    #[test]
    fn trigger_keys_of_no_or_another_form_are_rejected_by_path() {
        assert_eq!(
            field_of(json!({"trigger": {"cron": "* * * * *", "tz": "UTC"}})),
            "resumeWhen.trigger.tz"
        );
        assert_eq!(
            field_of(json!({"trigger": {"when": "soon"}})),
            "resumeWhen.trigger.when"
        );
        assert_eq!(
            field_of(json!({"trigger": {"cron": "* * * * *", "filter": {}}})),
            "resumeWhen.trigger.filter"
        );
        assert_eq!(
            field_of(json!({"trigger": {"at": "2026-12-01T09:00:00Z", "timezone": "UTC"}})),
            "resumeWhen.trigger.timezone"
        );
        assert_eq!(
            field_of(json!({"trigger": {"event": "ci.passed", "timezone": "UTC"}})),
            "resumeWhen.trigger.timezone"
        );
        // Null keys of another form are absent.
        assert_eq!(
            trigger(json!({"cron": "0 9 * * *", "at": null, "filter": null, "timezone": null})),
            TriggerSpec::Cron {
                cron: "0 9 * * *".into(),
                timezone: None
            }
        );
    }

    // ---- trigger: cron ----

    #[test]
    fn cron_triggers_accept_standard_and_seconds_first_expressions() {
        for expression in [
            "0 9 * * 1-5",
            "*/15 * * * *",
            "0 0 1 jan *",
            "0 9 * * MON-FRI",
            "0 9 13 * 5",
            "30 0 9 * * Mon-Fri",
            "@daily",
            "@weekly",
        ] {
            let spec = cron(expression, None);
            assert_eq!(
                spec,
                TriggerSpec::Cron {
                    cron: expression.into(),
                    timezone: None
                }
            );
        }
        // Surrounding whitespace is dropped from the echo.
        assert_eq!(
            cron("  0 9 * * *  ", Some("UTC")),
            TriggerSpec::Cron {
                cron: "0 9 * * *".into(),
                timezone: Some("UTC".into())
            }
        );
    }

    #[test]
    fn bad_cron_expressions_name_trigger_cron() {
        for bad in [
            json!(""),
            json!("   "),
            json!("not a cron"),
            json!("0 9 * *"),
            json!("61 * * * *"),
            json!("0 24 * * *"),
            json!("0 9 32 * *"),
            json!("0 9 * 13 *"),
            json!("0 9 * * 8"),
            json!("0 9 * * 5-1"),
            json!("*/0 * * * *"),
            json!("0 9 * * L"),
            json!("0 0 30 2 *"),
            json!("0 0 0 31 4 *"),
            json!("0 0 9 * * * 2101"),
            json!("@reboot"),
            json!("1 2 3 4 5 6 7 8"),
            json!(5),
            json!({"minute": 0}),
            json!("* ".repeat(200)),
        ] {
            let e = err(json!({"trigger": {"cron": bad, "timezone": "UTC"}}));
            assert_eq!(e.field, "resumeWhen.trigger.cron", "{bad}: {}", e.reason);
        }
        assert!(err(json!({"trigger": {"cron": "0 0 30 2 *"}}))
            .reason
            .contains("never"));
    }

    #[test]
    fn bad_timezones_name_trigger_timezone() {
        for bad in [
            json!("Mars/Olympus"),
            json!("europe/berlin"),
            json!("CEST"),
            json!("+02:00"),
            json!(""),
            json!(1),
        ] {
            let e = err(json!({"trigger": {"cron": "0 9 * * *", "timezone": bad}}));
            assert_eq!(e.field, "resumeWhen.trigger.timezone", "{bad}");
        }
        for good in [
            "UTC",
            "Europe/Berlin",
            "America/Argentina/Buenos_Aires",
            "Asia/Kolkata",
        ] {
            let _ = cron("0 9 * * *", Some(good));
        }
    }

    // ---- trigger: at, event ----

    #[test]
    fn at_triggers_take_rfc3339_with_an_offset_and_store_utc() {
        assert_eq!(
            trigger(json!({"at": "2026-12-01T09:00:00Z"})),
            TriggerSpec::At {
                at: utc("2026-12-01T09:00:00Z")
            }
        );
        assert_eq!(
            trigger(json!({"at": "2026-12-01T10:30:00.250+01:30"})),
            TriggerSpec::At {
                at: utc("2026-12-01T09:00:00.250Z")
            }
        );
        for bad in [
            json!("2026-12-01"),
            json!("2026-12-01T09:00:00"),
            json!("2026-12-01 09:00"),
            json!("2026-13-01T09:00:00Z"),
            json!("tomorrow"),
            json!(""),
            json!(1_796_115_600),
            json!({"date": "2026-12-01"}),
        ] {
            let e = err(json!({"trigger": {"at": bad}}));
            assert_eq!(e.field, "resumeWhen.trigger.at", "{bad}");
            assert!(e.reason.contains("RFC 3339"), "{}", e.reason);
        }
    }

    #[test]
    fn event_triggers_take_an_event_name_and_an_optional_filter() {
        assert_eq!(
            trigger(json!({"event": "ci.*", "filter": {"branch": "main"}})),
            TriggerSpec::Event {
                event: "ci.*".into(),
                filter: json!({"branch": "main"}).as_object().cloned(),
            }
        );
        assert_eq!(
            trigger(json!({"event": "ci.passed", "filter": null})),
            TriggerSpec::Event {
                event: "ci.passed".into(),
                filter: None,
            }
        );
        for bad in [json!(""), json!("ci passed"), json!("c*i"), json!(3)] {
            assert_eq!(
                field_of(json!({"trigger": {"event": bad}})),
                "resumeWhen.trigger.event",
                "{bad}"
            );
        }
        for bad in [json!("branch=main"), json!([]), json!(1)] {
            assert_eq!(
                field_of(json!({"trigger": {"event": "ci.passed", "filter": bad}})),
                "resumeWhen.trigger.filter",
                "{bad}"
            );
        }
    }

    // ---- next_fire_after ----

    #[test]
    fn at_fires_once_strictly_after() {
        let spec = trigger(json!({"at": "2026-12-01T09:00:00Z"}));
        assert_eq!(
            spec.next_fire_after(utc("2026-11-30T00:00:00Z")),
            Some(utc("2026-12-01T09:00:00Z"))
        );
        assert_eq!(spec.next_fire_after(utc("2026-12-01T09:00:00Z")), None);
        assert_eq!(spec.next_fire_after(utc("2027-01-01T00:00:00Z")), None);
    }

    #[test]
    fn event_triggers_never_fire_on_the_clock() {
        let spec = trigger(json!({"event": "ci.passed"}));
        assert_eq!(spec.next_fire_after(utc("2026-01-01T00:00:00Z")), None);
    }

    #[test]
    fn daily_cron_in_berlin_follows_daylight_saving() {
        let spec = cron("0 9 * * *", Some("Europe/Berlin"));
        // Winter: CET, UTC+1.
        assert_eq!(
            spec.next_fire_after(utc("2026-01-15T00:00:00Z")),
            Some(utc("2026-01-15T08:00:00Z"))
        );
        // Summer: CEST, UTC+2.
        assert_eq!(
            spec.next_fire_after(utc("2026-07-15T00:00:00Z")),
            Some(utc("2026-07-15T07:00:00Z"))
        );
        // Across the spring change (2026-03-29) and the autumn one (2026-10-25).
        assert_eq!(
            fires(&spec, "2026-03-28T00:00:00Z", 2),
            vec![utc("2026-03-28T08:00:00Z"), utc("2026-03-29T07:00:00Z")]
        );
        assert_eq!(
            fires(&spec, "2026-10-24T00:00:00Z", 2),
            vec![utc("2026-10-24T07:00:00Z"), utc("2026-10-25T08:00:00Z")]
        );
        // The same schedule without a timezone is UTC.
        assert_eq!(
            cron("0 9 * * *", None).next_fire_after(utc("2026-07-15T00:00:00Z")),
            Some(utc("2026-07-15T09:00:00Z"))
        );
    }

    #[test]
    fn a_wall_clock_time_skipped_by_dst_fires_at_the_end_of_the_gap() {
        // 02:30 does not exist in Berlin on 2026-03-29: fires at 03:00 CEST.
        let spec = cron("30 2 * * *", Some("Europe/Berlin"));
        assert_eq!(
            fires(&spec, "2026-03-28T00:00:00Z", 3),
            vec![
                utc("2026-03-28T01:30:00Z"),
                utc("2026-03-29T01:00:00Z"),
                utc("2026-03-30T00:30:00Z")
            ]
        );
    }

    #[test]
    fn a_wall_clock_time_repeated_by_dst_fires_once_at_its_first_occurrence() {
        // 02:30 happens twice in Berlin on 2026-10-25: CEST (00:30Z), then CET
        // (01:30Z).
        let spec = cron("30 2 * * *", Some("Europe/Berlin"));
        assert_eq!(
            fires(&spec, "2026-10-24T12:00:00Z", 2),
            vec![utc("2026-10-25T00:30:00Z"), utc("2026-10-26T01:30:00Z")]
        );
        // Asked from inside the repeated hour, it has already fired.
        assert_eq!(
            spec.next_fire_after(utc("2026-10-25T01:00:00Z")),
            Some(utc("2026-10-26T01:30:00Z"))
        );
        // Every minute: the repeated hour (01:00Z-02:00Z) is not fired again.
        let every_minute = cron("* * * * *", Some("Europe/Berlin"));
        assert_eq!(
            every_minute.next_fire_after(utc("2026-10-25T00:59:00Z")),
            Some(utc("2026-10-25T02:00:00Z"))
        );
        assert_eq!(
            every_minute.next_fire_after(utc("2026-10-25T01:00:00Z")),
            Some(utc("2026-10-25T02:00:00Z"))
        );
        // Every second, asked from the start of the repeated hour: found
        // past it without giving up.
        let every_second = cron("* * * * * *", Some("Europe/Berlin"));
        assert_eq!(
            every_second.next_fire_after(utc("2026-10-25T01:00:00Z")),
            Some(utc("2026-10-25T02:00:00Z"))
        );
    }

    #[test]
    fn five_field_one_to_five_is_monday_to_friday() {
        let spec = cron("0 9 * * 1-5", None);
        // 2026-01-16 is a Friday: the next fire after its 09:00 is Monday.
        assert_eq!(utc("2026-01-16T00:00:00Z").weekday(), Weekday::Fri);
        assert_eq!(
            spec.next_fire_after(utc("2026-01-16T09:00:00Z")),
            Some(utc("2026-01-19T09:00:00Z"))
        );
        let days: Vec<Weekday> = fires(&spec, "2026-01-01T00:00:00Z", 15)
            .iter()
            .map(|t| t.weekday())
            .collect();
        assert_eq!(days.len(), 15);
        assert!(!days.contains(&Weekday::Sat) && !days.contains(&Weekday::Sun));
        for day in [
            Weekday::Mon,
            Weekday::Tue,
            Weekday::Wed,
            Weekday::Thu,
            Weekday::Fri,
        ] {
            assert_eq!(days.iter().filter(|d| **d == day).count(), 3, "{day}");
        }
        // Names mean the same.
        assert_eq!(
            fires(&cron("0 9 * * mon-fri", None), "2026-01-01T00:00:00Z", 15),
            fires(&spec, "2026-01-01T00:00:00Z", 15)
        );
    }

    #[test]
    fn five_field_sunday_is_zero_or_seven() {
        for expression in ["0 9 * * 0", "0 9 * * 7", "0 9 * * sun"] {
            let all = fires(&cron(expression, None), "2026-01-01T00:00:00Z", 4);
            assert_eq!(all.len(), 4);
            assert!(
                all.iter().all(|t| t.weekday() == Weekday::Sun),
                "{expression}: {all:?}"
            );
        }
        let weekend = fires(&cron("0 9 * * 6,0", None), "2026-01-01T00:00:00Z", 4);
        let days: Vec<Weekday> = weekend.iter().map(|t| t.weekday()).collect();
        assert_eq!(
            days,
            [Weekday::Sat, Weekday::Sun, Weekday::Sat, Weekday::Sun]
        );
    }

    #[test]
    fn five_field_restricted_day_fields_fire_on_either() {
        // The 13th of the month or any Friday (standard crontab).
        let days: Vec<(u32, Weekday)> = fires(&cron("0 9 13 * 5", None), "2026-01-01T00:00:00Z", 4)
            .iter()
            .map(|t| (t.day(), t.weekday()))
            .collect();
        assert_eq!(
            days,
            [
                (2, Weekday::Fri),
                (9, Weekday::Fri),
                (13, Weekday::Tue),
                (16, Weekday::Fri)
            ]
        );
        // With a `*`-led day-of-month both must match (Vixie rule).
        let days: Vec<u32> = fires(&cron("0 9 */2 * 5", None), "2026-01-01T00:00:00Z", 3)
            .iter()
            .map(|t| t.day())
            .collect();
        assert_eq!(days, [9, 23, 13]);
    }

    #[test]
    fn six_field_expressions_put_seconds_before_the_standard_five() {
        // Seconds first; day of week 1 is Monday, as in 5 fields.
        let spec = cron("30 0 9 * * 1", None);
        let all = fires(&spec, "2026-01-01T00:00:00Z", 2);
        assert_eq!(
            all,
            vec![utc("2026-01-05T09:00:30Z"), utc("2026-01-12T09:00:30Z")]
        );
        assert!(all.iter().all(|t| t.weekday() == Weekday::Mon));
    }

    #[test]
    fn seven_fields_and_reboot_are_refused_on_the_cron_field() {
        let e = err(json!({"trigger": {"cron": "0 0 0 1 1 * 2030"}}));
        assert_eq!(e.field, "resumeWhen.trigger.cron");
        assert!(e.reason.contains("standard 5-field"), "{e}");
        let e = err(json!({"trigger": {"cron": "@reboot"}}));
        assert_eq!(e.field, "resumeWhen.trigger.cron");
        assert!(e.reason.contains("no boot event"), "{e}");
    }

    #[test]
    fn cron_schedules_end_in_2100_without_panicking() {
        let spec = cron("0 9 * * *", Some("Pacific/Kiritimati"));
        assert_eq!(spec.next_fire_after(utc("2101-01-01T00:00:00Z")), None);
        assert_eq!(spec.next_fire_after(DateTime::<Utc>::MAX_UTC), None);
        assert_eq!(
            cron("0 9 * * *", None).next_fire_after(DateTime::<Utc>::MIN_UTC),
            Some(utc("1970-01-01T09:00:00Z"))
        );
        let yearly = cron("0 0 1 1 *", None);
        assert_eq!(
            yearly.next_fire_after(utc("2100-01-01T00:00:00Z")),
            None,
            "2100 is the last year scheduled"
        );
    }

    #[test]
    fn cron_triggers_built_without_parse_do_not_fire() {
        let after = utc("2026-01-01T00:00:00Z");
        let bad_cron = TriggerSpec::Cron {
            cron: "nonsense".into(),
            timezone: None,
        };
        let bad_zone = TriggerSpec::Cron {
            cron: "0 9 * * *".into(),
            timezone: Some("Nowhere/Land".into()),
        };
        assert_eq!(bad_cron.next_fire_after(after), None);
        assert_eq!(bad_zone.next_fire_after(after), None);
    }

    #[test]
    fn garbage_never_panics() {
        let nasty_strings = [
            "",
            " ",
            "*",
            "**",
            "/",
            "-",
            ",",
            "*/",
            "1-",
            "-1",
            "1--2",
            "1//2",
            "@",
            "@@daily",
            "9999999999999999999999 * * * *",
            "0-4294967295 * * * *",
            "*/4294967295 * * * *",
            "1-5/4294967296 * * * *",
            "0 0 * * 0-4294967295",
            "0 0 * * */4294967295",
            "\u{0}",
            "\u{202e}",
            "😀 * * * *",
            "0 9 * * 1-5 \u{0}",
            "? ? ? ? ?",
        ];
        for s in nasty_strings {
            let _ = parse(json!({ "onEvent": s }));
            let _ = parse(json!({"trigger": {"cron": s, "timezone": s}}));
            let _ = parse(json!({"trigger": {"cron": s}}));
            let _ = parse(json!({"trigger": {"at": s}}));
            let _ = parse(json!({"trigger": {"event": s}}));
            let _ = parse(json!({"timeout": {"durationMinutes": s, "onTimeout": s}}));
            let spec = TriggerSpec::Cron {
                cron: s.into(),
                timezone: Some(s.into()),
            };
            let _ = spec.next_fire_after(utc("2026-01-01T00:00:00Z"));
        }
        let nasty_values = [
            json!(null),
            json!(f64::MIN_POSITIVE),
            json!(-1e308),
            json!(i64::MIN),
            json!(u64::MAX),
            json!([[[[]]]]),
            json!({"": {"": null}}),
        ];
        for v in &nasty_values {
            let _ = parse(v.clone());
            let _ = parse(json!({"onEvent": v, "trigger": v, "timeout": v}));
            let _ = parse(json!({"trigger": {"cron": v, "timezone": v}}));
            let _ = parse(json!({"trigger": {"at": v}}));
            let _ = parse(json!({"trigger": {"event": v, "filter": v}}));
            let _ = parse(json!({"timeout": {"durationMinutes": v, "onTimeout": v, "input": v}}));
        }
    }
}
