//! The cron dialect of `trigger.cron` and its next fire time in a timezone.
//!
//! The dialect is standard (Vixie/POSIX) crontab: 5 fields (minute hour
//! day-of-month month day-of-week), days of week 0–7 (0 and 7 are Sunday)
//! or names, and a day matching *either* day field when both are
//! restricted. A sixth field in front is seconds (`*/10 * * * * *` is every
//! ten seconds); the other five keep their standard meaning. The
//! `@hourly`/`@daily`/`@weekly`/`@monthly`/`@yearly` shorthands (plus
//! `@midnight`, `@annually`) are accepted; a seven-field (year) form and
//! `@reboot` are refused.
//!
//! The [`cron`] crate wants a seconds field first, numbers days of week 1–7
//! from Sunday and requires a day to match *both* day fields. So an
//! expression is translated before the crate sees it:
//!
//! - `0 ` (second zero) is prepended to a 5-field expression;
//! - the day-of-week field is rewritten into the crate's numbering (names,
//!   lists, ranges and steps as in crontab: `1-5` is Monday–Friday, `*/2`
//!   is Sunday, Tuesday, Thursday, Saturday);
//! - when both day fields are restricted (neither starts with `*` or `?`,
//!   the Vixie rule) the schedule is the union of "day-of-month matches"
//!   and "day-of-week matches".
//!
//! Fire times are computed on the wall clock of the timezone, as cronie
//! does: a time that a spring-forward change skips fires at the first
//! instant after the gap (02:30 in Berlin on the change day fires at 03:00
//! CEST); a time that a fall-back change repeats fires once, at its first
//! occurrence.

use std::str::FromStr;

use chrono::{DateTime, Datelike, LocalResult, NaiveDateTime, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;

/// Longest cron expression accepted, in characters.
const MAX_CRON_CHARS: usize = 256;

/// Last year the `cron` crate schedules (its year field ends there).
const LAST_YEAR: i32 = 2100;

/// How many candidates to look at past an instant before giving up. More
/// than one only while asked from inside a repeated (DST fall-back) stretch
/// of wall-clock time, whose times all fired at their first occurrence: a
/// per-second schedule over a fold of up to a day.
const MAX_CANDIDATES: usize = 2 * 86_400 + 16;

/// A validated cron expression: one `cron` schedule, or two whose union is
/// the standard day-of-month-or-day-of-week rule.
#[derive(Debug, Clone)]
pub(super) struct CronSchedule {
    alternatives: Vec<cron::Schedule>,
}

impl CronSchedule {
    /// Parses a 5-field standard expression, a 6-field one with seconds
    /// first, or an `@` shorthand.
    ///
    /// # Errors
    /// A sentence saying what is wrong with the expression.
    pub(super) fn parse(expression: &str) -> Result<Self, String> {
        let expression = expression.trim();
        if expression.is_empty() {
            return Err("must not be empty; e.g. \"0 9 * * 1-5\"".into());
        }
        let chars = expression.chars().count();
        if chars > MAX_CRON_CHARS {
            return Err(format!(
                "is {chars} characters; at most {MAX_CRON_CHARS} allowed"
            ));
        }
        let fields: Vec<&str> = expression.split_whitespace().collect();
        let (second, standard) = match fields.as_slice() {
            [shorthand] if shorthand.starts_with('@') => {
                return shorthand_schedule(shorthand).map(|schedule| Self {
                    alternatives: vec![schedule],
                });
            }
            [minute, hour, day_of_month, month, day_of_week] => {
                ("0", [*minute, *hour, *day_of_month, *month, *day_of_week])
            }
            [second, minute, hour, day_of_month, month, day_of_week] => (
                *second,
                [*minute, *hour, *day_of_month, *month, *day_of_week],
            ),
            _ => {
                return Err(format!(
                    "has {} fields; expected a standard 5-field expression (minute \
                     hour day-of-month month day-of-week, e.g. \"0 9 * * 1-5\"), \
                     optionally with a seconds field first, or an @ shorthand such \
                     as \"@daily\"",
                    fields.len()
                ))
            }
        };
        let [minute, hour, day_of_month, month, day_of_week] = standard;
        let dow = standard_day_of_week(day_of_week)?;
        let unrestricted = |field: &str| field.starts_with('*') || field.starts_with('?');
        let sources = if unrestricted(day_of_month) || unrestricted(day_of_week) {
            vec![format!(
                "{second} {minute} {hour} {day_of_month} {month} {dow}"
            )]
        } else {
            vec![
                format!("{second} {minute} {hour} {day_of_month} {month} *"),
                format!("{second} {minute} {hour} * {month} {dow}"),
            ]
        };
        let alternatives = sources
            .iter()
            .map(|source| cron::Schedule::from_str(source))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                format!(
                    "is not a valid cron expression: {}",
                    parser_reason(&e.to_string())
                )
            })?;
        Ok(Self { alternatives })
    }

    /// The first fire time strictly after `after`, computed on the wall clock
    /// of `tz` and returned in UTC.
    ///
    /// A wall-clock time that a DST change skips fires at the first instant
    /// after the gap; one it repeats fires once, at its first occurrence.
    /// `None` when the schedule has no fire after `after` (the `cron` crate
    /// schedules from 1970 to 2100).
    pub(super) fn next_after(&self, tz: Tz, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Also keeps the crate's `after + 1s` from overflowing near the end
        // of chrono's range.
        if after.year() > LAST_YEAR {
            return None;
        }
        // The crate reads a year before 1970 as a huge unsigned one; a day
        // before its first year is early enough.
        let start = after.max(DateTime::UNIX_EPOCH - TimeDelta::days(1));
        // The schedule runs on the naive wall clock (carried as UTC, which
        // has no DST), each candidate then placed on `tz`'s timeline. That
        // placement never goes backwards, so the first candidate after
        // `after` is the earliest.
        let wall_clock = start.with_timezone(&tz).naive_local().and_utc();
        self.alternatives
            .iter()
            .filter_map(|schedule| {
                schedule
                    .after(&wall_clock)
                    .take(MAX_CANDIDATES)
                    .filter_map(|fire| place_on(tz, fire.naive_utc()))
                    .find(|fire| *fire > after)
            })
            .min()
    }
}

/// The instant a wall-clock time `local` of `tz` fires at: itself; the
/// first of the two when a fall-back change repeats it; the first instant
/// after the gap when a spring-forward change skips it. `None` only at the
/// edges of chrono's range.
fn place_on(tz: Tz, local: NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&local) {
        LocalResult::Single(fire) => Some(fire.with_timezone(&Utc)),
        LocalResult::Ambiguous(earlier, _) => Some(earlier.with_timezone(&Utc)),
        LocalResult::None => end_of_gap(tz, local),
    }
}

/// The first instant whose wall-clock time in `tz` is past `local`, a time
/// inside a gap: the instant the clock jumps. Searched to the second over
/// the day and a bit around `local` (UTC offsets lie within ±14 hours, and
/// tz data has no fold that close to a gap).
fn end_of_gap(tz: Tz, local: NaiveDateTime) -> Option<DateTime<Utc>> {
    let past = |instant: i64| {
        DateTime::from_timestamp(instant, 0)
            .is_some_and(|t| t.with_timezone(&tz).naive_local() > local)
    };
    let around = local.and_utc().timestamp();
    // `past(low)` is false and `past(high)` true throughout the search.
    let (mut low, mut high) = (around - 15 * 3600, around + 15 * 3600);
    if past(low) || !past(high) {
        return None;
    }
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if past(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    DateTime::from_timestamp(high, 0)
}

/// The schedule of an `@` shorthand.
///
/// # Errors
/// `@reboot` (berth has no boot event) and unknown names, each with what
/// to use instead.
fn shorthand_schedule(shorthand: &str) -> Result<cron::Schedule, String> {
    let source = match shorthand {
        "@hourly" | "@daily" | "@weekly" | "@monthly" | "@yearly" => shorthand,
        "@midnight" => "@daily",
        "@annually" => "@yearly",
        "@reboot" => {
            return Err(
                "\"@reboot\" is not supported: berth has no boot event to fire \
                        it on. To act when berth starts, have whatever starts it emit an \
                        event (`_berth/event.emit`) and wait for that with onEvent; for \
                        a time, use a 5-field expression, an @ shorthand such as \
                        \"@daily\", or {\"at\": RFC 3339}"
                    .into(),
            )
        }
        other => {
            return Err(format!(
                "{other:?} is not a cron shorthand; use one of @hourly, @daily \
                 (@midnight), @weekly, @monthly, @yearly (@annually), or a 5-field \
                 expression such as \"0 9 * * 1-5\""
            ))
        }
    };
    cron::Schedule::from_str(source).map_err(|e| {
        format!(
            "is not a valid cron expression: {}",
            parser_reason(&e.to_string())
        )
    })
}

/// Resolves a `timezone` (absent = UTC) to a chrono-tz zone.
///
/// # Errors
/// A sentence naming the unknown zone.
pub(super) fn timezone(name: Option<&str>) -> Result<Tz, String> {
    match name {
        None => Ok(Tz::UTC),
        Some(name) => Tz::from_str(name).map_err(|_| {
            format!(
                "{name:?} is not an IANA timezone name; use one such as \"UTC\" or \
                 \"Europe/Berlin\" (case-sensitive)"
            )
        }),
    }
}

/// Rewrites a standard crontab day-of-week field (0–7 with 0 and 7 Sunday,
/// `sun`–`sat`, lists, ranges, steps) into the `cron` crate's numbering
/// (1–7 with 1 Sunday). `*` and `?` pass through unchanged.
fn standard_day_of_week(field: &str) -> Result<String, String> {
    if field == "*" || field == "?" {
        return Ok(field.to_owned());
    }
    let mut days = [false; 7];
    for item in field.split(',') {
        let (base, step) = match item.split_once('/') {
            Some((base, step)) => (base, Some(step)),
            None => (item, None),
        };
        let (first, last) = match base {
            "*" | "?" => (0, 7),
            _ => match base.split_once('-') {
                Some((first, last)) => (weekday(first)?, weekday(last)?),
                // `a/n` runs from `a` to the end of the week, as in cronie.
                None if step.is_some() => (weekday(base)?, 7),
                None => {
                    let day = weekday(base)?;
                    (day, day)
                }
            },
        };
        if first > last {
            return Err(format!(
                "day-of-week range {base:?} runs backwards; write it as a list \
                 (e.g. \"5,6,0\" for Friday to Sunday)"
            ));
        }
        let step = match step {
            None => 1,
            Some(step) => match step.parse::<u32>() {
                Ok(step) if step > 0 => step,
                _ => {
                    return Err(format!(
                        "day-of-week step {step:?} in {item:?} must be a positive integer"
                    ))
                }
            },
        };
        let mut day = first;
        while day <= last {
            days[(day % 7) as usize] = true;
            day = match day.checked_add(step) {
                Some(next) => next,
                None => break,
            };
        }
    }
    Ok(days
        .iter()
        .enumerate()
        .filter(|(_, set)| **set)
        .map(|(day, _)| (day + 1).to_string())
        .collect::<Vec<_>>()
        .join(","))
}

/// One standard day of week: `0`–`7` (0 and 7 Sunday) or an English name.
fn weekday(token: &str) -> Result<u32, String> {
    if !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) {
        return match token.parse::<u32>() {
            Ok(day) if day <= 7 => Ok(day),
            _ => Err(format!(
                "day of week {token:?} is out of range; use 0-7 (0 and 7 are Sunday) or sun-sat"
            )),
        };
    }
    let day = match token.to_ascii_lowercase().as_str() {
        "sun" | "sunday" => 0,
        "mon" | "monday" => 1,
        "tue" | "tues" | "tuesday" => 2,
        "wed" | "wednesday" => 3,
        "thu" | "thurs" | "thursday" => 4,
        "fri" | "friday" => 5,
        "sat" | "saturday" => 6,
        _ => {
            return Err(format!(
                "{token:?} is not a day of week; use 0-7 (0 and 7 are Sunday) or sun-sat"
            ))
        }
    };
    Ok(day)
}

/// The `cron` crate's parse error as a reason about the expression the
/// client wrote, on one line. The crate's message repeats the expression it
/// parsed (ours, rewritten to its 6- or 7-field form, with a caret line
/// under it): only what follows the caret is kept. Its range message says
/// "must be less than N" of the largest value allowed (`25` hours gives
/// "less than 23", though 23 is valid): said as "at most N".
fn parser_reason(message: &str) -> String {
    let mut lines: Vec<&str> = message.lines().collect();
    if let Some(caret) = lines.iter().position(|l| l.trim() == "^") {
        lines.drain(..=caret);
    }
    lines
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" must be less than ", " must be at most ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dow(field: &str) -> Result<String, String> {
        standard_day_of_week(field)
    }

    #[test]
    fn range_errors_name_the_largest_value_allowed() {
        for (expression, reason) in [
            ("0 25 * * *", "Hours must be at most 23. ('25' specified.)"),
            (
                "61 * * * *",
                "Minutes must be at most 59. ('61' specified.)",
            ),
            ("0 0 1 13 *", "Months must be at most 12. ('13' specified.)"),
        ] {
            let e = CronSchedule::parse(expression).unwrap_err();
            assert_eq!(e, format!("is not a valid cron expression: {reason}"));
        }
        assert!(
            CronSchedule::parse("59 23 31 12 *").is_ok(),
            "the maxima are valid"
        );
    }

    #[test]
    fn day_of_week_numbers_shift_to_sunday_one() {
        assert_eq!(dow("1-5").as_deref(), Ok("2,3,4,5,6"));
        assert_eq!(dow("0").as_deref(), Ok("1"));
        assert_eq!(dow("7").as_deref(), Ok("1"));
        assert_eq!(dow("6").as_deref(), Ok("7"));
        assert_eq!(dow("0,6").as_deref(), Ok("1,7"));
        assert_eq!(dow("5-7").as_deref(), Ok("1,6,7"));
    }

    #[test]
    fn day_of_week_names_lists_and_steps() {
        assert_eq!(dow("MON-FRI").as_deref(), Ok("2,3,4,5,6"));
        assert_eq!(dow("sat,sun").as_deref(), Ok("1,7"));
        assert_eq!(dow("1-fri").as_deref(), Ok("2,3,4,5,6"));
        assert_eq!(dow("*/2").as_deref(), Ok("1,3,5,7"));
        assert_eq!(dow("1-5/2").as_deref(), Ok("2,4,6"));
        assert_eq!(dow("1/3").as_deref(), Ok("1,2,5"));
        assert_eq!(dow("*").as_deref(), Ok("*"));
        assert_eq!(dow("?").as_deref(), Ok("?"));
    }

    #[test]
    fn day_of_week_rejects_what_crontab_rejects() {
        for bad in [
            "8",
            "5-1",
            "fri-mon",
            "*/0",
            "1-5/x",
            "",
            "1,,2",
            "1-",
            "-1",
            "funday",
            "L",
            "5#2",
            "99999999999999",
        ] {
            assert!(dow(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn field_counts() {
        assert!(CronSchedule::parse("0 9 * * 1-5").is_ok());
        assert!(CronSchedule::parse("30 0 9 * * Mon-Fri").is_ok());
        assert!(CronSchedule::parse("30 0 9 * * Mon-Fri 2030").is_err());
        assert!(CronSchedule::parse("@daily").is_ok());
        assert!(CronSchedule::parse("@midnight").is_ok());
        assert!(CronSchedule::parse("@annually").is_ok());
        assert!(CronSchedule::parse("@reboot").is_err());
        assert!(CronSchedule::parse("0 9 * *").is_err());
        assert!(CronSchedule::parse("0 0 9 * * * 2030 x").is_err());
        assert!(CronSchedule::parse("   ").is_err());
    }

    fn at(s: &str) -> DateTime<Utc> {
        match DateTime::parse_from_rfc3339(s) {
            Ok(t) => t.with_timezone(&Utc),
            Err(e) => panic!("bad test instant {s}: {e}"),
        }
    }

    fn next(expression: &str, tz: Tz, after: &str) -> Option<DateTime<Utc>> {
        match CronSchedule::parse(expression) {
            Ok(schedule) => schedule.next_after(tz, at(after)),
            Err(e) => panic!("{expression:?}: {e}"),
        }
    }

    #[test]
    fn seven_fields_are_refused_naming_the_standard_form() {
        for expression in ["30 0 9 * * Mon-Fri 2030", "0 0 0 1 1 * 2030"] {
            let e = CronSchedule::parse(expression).unwrap_err();
            assert!(e.contains("standard 5-field"), "{expression:?} gave {e:?}");
            assert!(e.contains("has 7 fields"), "{expression:?} gave {e:?}");
        }
    }

    #[test]
    fn six_fields_are_a_seconds_field_before_the_standard_five() {
        // Day of week 1 is Monday, as in the 5-field form.
        let monday = next("30 0 9 * * 1", Tz::UTC, "2026-01-01T00:00:00Z");
        assert_eq!(monday, Some(at("2026-01-05T09:00:30Z")));
        assert_eq!(
            next("0 0 9 * * 0", Tz::UTC, "2026-01-01T00:00:00Z"),
            Some(at("2026-01-04T09:00:00Z")),
            "0 is Sunday"
        );
        // Both day fields restricted: either matches, as in the 5-field form.
        assert_eq!(
            next("0 0 9 13 * 5", Tz::UTC, "2026-01-10T00:00:00Z"),
            Some(at("2026-01-13T09:00:00Z"))
        );
        assert_eq!(
            next("* * * * * *", Tz::UTC, "2026-01-01T00:00:00Z"),
            Some(at("2026-01-01T00:00:01Z"))
        );
    }

    #[test]
    fn reboot_is_refused_with_a_reason_saying_what_to_use() {
        let e = CronSchedule::parse("@reboot").unwrap_err();
        assert!(e.contains("no boot event"), "{e:?}");
        assert!(e.contains("onEvent"), "{e:?}");
        let e = CronSchedule::parse("@fortnightly").unwrap_err();
        assert!(e.contains("@hourly"), "{e:?}");
    }

    #[test]
    fn a_time_in_a_spring_forward_gap_fires_at_the_end_of_the_gap() {
        // Berlin skips 02:00-03:00 CET on 2026-03-29: 03:00 CEST is 01:00Z.
        let berlin = Tz::Europe__Berlin;
        assert_eq!(
            next("30 2 * * *", berlin, "2026-03-28T12:00:00Z"),
            Some(at("2026-03-29T01:00:00Z"))
        );
        // The next day is back to 02:30 CEST.
        assert_eq!(
            next("30 2 * * *", berlin, "2026-03-29T01:00:00Z"),
            Some(at("2026-03-30T00:30:00Z"))
        );
        // A yearly schedule on the gap does not skip a year.
        assert_eq!(
            next("30 2 29 3 *", berlin, "2026-01-01T00:00:00Z"),
            Some(at("2026-03-29T01:00:00Z"))
        );
        // Every minute of the gap is one fire at its end, then 03:01 CEST.
        assert_eq!(
            next("* * * * *", berlin, "2026-03-29T00:59:00Z"),
            Some(at("2026-03-29T01:00:00Z"))
        );
        assert_eq!(
            next("* * * * *", berlin, "2026-03-29T01:00:00Z"),
            Some(at("2026-03-29T01:01:00Z"))
        );
        // New York skips 02:00-03:00 EST on 2026-03-08: 03:00 EDT is 07:00Z.
        assert_eq!(
            next("15 2 * * *", Tz::America__New_York, "2026-03-07T12:00:00Z"),
            Some(at("2026-03-08T07:00:00Z"))
        );
    }

    #[test]
    fn a_time_repeated_by_fall_back_fires_once_at_its_first_occurrence() {
        // 02:30 happens twice in Berlin on 2026-10-25: 00:30Z (CEST), 01:30Z (CET).
        let berlin = Tz::Europe__Berlin;
        assert_eq!(
            next("30 2 25 10 *", berlin, "2026-10-01T00:00:00Z"),
            Some(at("2026-10-25T00:30:00Z"))
        );
        assert_eq!(
            next("30 2 25 10 *", berlin, "2026-10-25T00:30:00Z"),
            Some(at("2027-10-25T00:30:00Z")),
            "2027 falls back on 2027-10-31"
        );
    }

    #[test]
    fn unknown_timezone_is_an_error() {
        assert_eq!(timezone(None), Ok(Tz::UTC));
        assert_eq!(timezone(Some("Europe/Berlin")), Ok(Tz::Europe__Berlin));
        assert!(timezone(Some("europe/berlin")).is_err());
        assert!(timezone(Some("Mars/Olympus")).is_err());
        assert!(timezone(Some("")).is_err());
    }
}
