//! Human output of `berth ctl`: the `ps` table, `show`'s fields, and one
//! line per session event for `tail`. Pure functions of the JSON the server
//! sent (wire shapes: `session/list` entries, `berth.session_view.v1`,
//! `session/update`, `_berth/agentEvent`, `_berth/presence`).

use chrono::{DateTime, Utc};
use serde_json::Value;

/// A table: a header and rows of cells, printed with each column as wide as
/// its widest cell (the last column is not padded).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(cell);
                let pad = widths[i] - cell.chars().count() + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push('\n');
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// `ts` as `2026-11-02 09:00:00Z (3m12s ago)`; the input as given when it is
/// not RFC 3339.
pub fn since(ts: &str, now: DateTime<Utc>) -> String {
    match DateTime::parse_from_rfc3339(ts) {
        Ok(t) => {
            let t = t.with_timezone(&Utc);
            format!(
                "{} ({} ago)",
                t.format("%Y-%m-%d %H:%M:%SZ"),
                duration((now - t).num_seconds().max(0) as u64)
            )
        }
        Err(_) => ts.to_owned(),
    }
}

/// Seconds as `45s`, `3m12s`, `2h05m`, `3d04h`.
pub fn duration(seconds: u64) -> String {
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// Minutes (fractions allowed) as `30m`, `1.5m`, `2h`, `1h30m`, `36s`.
fn minutes(m: f64) -> String {
    if m < 1.0 {
        format!("{}s", (m * 60.0 * 1000.0).round() / 1000.0)
    } else if m >= 60.0 && m.fract() == 0.0 {
        let (h, rest) = ((m / 60.0).floor(), m % 60.0);
        if rest == 0.0 {
            format!("{h}h")
        } else {
            format!("{h}h{rest}m")
        }
    } else {
        format!("{m}m")
    }
}

/// Resume conditions (RFC `ResumeConditions`) in words:
/// `event ci.* | timeout 30m → fail`; `explicit resume` when empty.
pub fn conditions(when: Option<&Value>) -> String {
    let Some(when) = when.filter(|w| w.is_object()) else {
        return "explicit resume".into();
    };
    let mut parts = Vec::new();
    if let Some(event) = when.get("onEvent").and_then(Value::as_str) {
        parts.push(format!("event {event}"));
    }
    if let Some(trigger) = when.get("trigger").filter(|t| t.is_object()) {
        let text = if let Some(cron) = trigger.get("cron").and_then(Value::as_str) {
            let zone = trigger
                .get("timezone")
                .and_then(Value::as_str)
                .unwrap_or("UTC");
            format!("cron \"{cron}\" {zone}")
        } else if let Some(at) = trigger.get("at").and_then(Value::as_str) {
            format!("at {at}")
        } else if let Some(event) = trigger.get("event").and_then(Value::as_str) {
            match trigger.get("filter").filter(|f| !f.is_null()) {
                Some(filter) => format!("event {event} where {filter}"),
                None => format!("event {event}"),
            }
        } else {
            format!("trigger {trigger}")
        };
        parts.push(text);
    }
    if let Some(timeout) = when.get("timeout").filter(|t| t.is_object()) {
        let after = timeout
            .get("durationMinutes")
            .and_then(Value::as_f64)
            .map(minutes)
            .unwrap_or_else(|| "?".into());
        let action = timeout
            .get("onTimeout")
            .and_then(Value::as_str)
            .unwrap_or("resume_with_summary");
        parts.push(format!("timeout {after} → {action}"));
    }
    if parts.is_empty() {
        "explicit resume".into()
    } else {
        parts.join(" | ")
    }
}

/// A token count as `950`, `12.3k`, `4.1M`.
pub fn count(n: u64) -> String {
    match n {
        n if n < 1_000 => n.to_string(),
        n if n < 1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        n => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// Micro-USD as dollars: `$0.0123`, `$12.50`; `-` for zero.
pub fn cost(micro_usd: u64) -> String {
    if micro_usd == 0 {
        "-".into()
    } else if micro_usd < 1_000_000 {
        format!("${:.4}", micro_usd as f64 / 1e6)
    } else {
        format!("${:.2}", micro_usd as f64 / 1e6)
    }
}

/// One `ps` row as the `--json` output gives it: the facts of a
/// `session/list` entry, flattened.
pub fn ps_row(entry: &Value) -> Value {
    let berth = &entry["_meta"]["berth"];
    let suspended = berth.get("suspended").filter(|s| s.is_object());
    serde_json::json!({
        "sessionId": entry["sessionId"],
        "state": berth.get("state").cloned().unwrap_or(Value::Null),
        "activePrompt": berth.get("activePrompt").cloned().unwrap_or(Value::Bool(false)),
        "live": berth.get("liveState").and_then(Value::as_str) == Some("live"),
        "title": entry.get("title").cloned().unwrap_or(Value::Null),
        "cwd": entry.get("cwd").cloned().unwrap_or(Value::Null),
        "labels": berth.get("labels").cloned().unwrap_or(Value::Array(vec![])),
        "lastEventId": berth.get("lastEventId").cloned().unwrap_or(Value::from(0)),
        "suspension": suspended.cloned().unwrap_or(Value::Null),
        "spend": berth.get("spend").cloned().unwrap_or(Value::Null),
    })
}

/// The `ps` table's cells for one row ([`ps_row`]).
pub fn ps_cells(row: &Value, now: DateTime<Utc>) -> Vec<String> {
    let text = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    let suspension = &row["suspension"];
    let (since_cell, conditions_cell) = if suspension.is_object() {
        let since_cell = suspension
            .get("suspendedAt")
            .and_then(Value::as_str)
            .and_then(|ts| DateTime::parse_from_rfc3339(ts).ok())
            .map(|t| {
                format!(
                    "{} ago",
                    duration((now - t.with_timezone(&Utc)).num_seconds().max(0) as u64)
                )
            })
            .unwrap_or_else(|| "-".into());
        (since_cell, conditions(suspension.get("resumeWhen")))
    } else {
        ("-".into(), "-".into())
    };
    let spend = &row["spend"];
    let n = |key: &str| spend.get(key).and_then(Value::as_u64).unwrap_or(0);
    vec![
        text(&row["sessionId"]),
        text(&row["state"]),
        if row["activePrompt"] == Value::Bool(true) {
            "yes".into()
        } else {
            "no".into()
        },
        since_cell,
        conditions_cell,
        format!("{}/{}", count(n("inputTokens")), count(n("outputTokens"))),
        cost(n("costMicroUsd")),
    ]
}

/// The header of the `ps` table.
pub const PS_HEADER: [&str; 7] = [
    "ID",
    "STATE",
    "PROMPT",
    "SUSPENDED",
    "RESUME WHEN",
    "TOKENS IN/OUT",
    "COST",
];

/// What `show` prints for a session entry and its `berth.session_view.v1`
/// projection (`view` is null when it could not be read).
pub fn show(entry: &Value, view: &Value, now: DateTime<Utc>) -> String {
    let berth = &entry["_meta"]["berth"];
    let mut lines: Vec<(String, String)> = Vec::new();
    let mut put = |k: &str, v: String| lines.push((k.to_owned(), v));
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    put("session", text(&entry["sessionId"]));
    put("state", text(&berth["state"]));
    if let Some(status) = view.pointer("/run/status").and_then(Value::as_str) {
        let turn = view
            .pointer("/run/turnId")
            .and_then(Value::as_str)
            .map(|t| format!(" (turn {t})"))
            .unwrap_or_default();
        put("run", format!("{status}{turn}"));
    }
    put("title", text(&entry["title"]));
    put("cwd", text(&entry["cwd"]));
    put(
        "live",
        match berth["liveState"].as_str() {
            Some("live") => "yes (an actor holds it)".into(),
            _ => "no (on disk only)".into(),
        },
    );
    if let Some(labels) = berth["labels"].as_array().filter(|l| !l.is_empty()) {
        put(
            "labels",
            labels.iter().map(text).collect::<Vec<_>>().join(", "),
        );
    }
    if let Some(created) = berth["createdAt"].as_str() {
        put("created", since(created, now));
    }
    if let Some(by) = berth["createdBy"].as_str() {
        put("created by", by.to_owned());
    }
    if let Some(updated) = entry["updatedAt"].as_str() {
        put("updated", since(updated, now));
    }
    if let Some(closed) = berth["closedAt"].as_str() {
        put("closed", since(closed, now));
    }
    put("last event", text(&berth["lastEventId"]));
    let spend = &berth["spend"];
    if spend.is_object() {
        let n = |key: &str| spend.get(key).and_then(Value::as_u64).unwrap_or(0);
        put(
            "spend",
            format!(
                "{} input + {} output tokens, {} tool calls, {}, {} running",
                n("inputTokens"),
                n("outputTokens"),
                n("toolCalls"),
                cost(n("costMicroUsd")),
                duration(n("wallMs") / 1000)
            ),
        );
    }
    let suspended = &berth["suspended"];
    if suspended.is_object() {
        put("suspension", text(&suspended["handle"]));
        if let Some(at) = suspended["suspendedAt"].as_str() {
            put("  since", since(at, now));
        }
        put(
            "  by",
            format!(
                "{} ({}, mode {})",
                text(&suspended["actor"]),
                text(&suspended["initiator"]),
                text(&suspended["mode"])
            ),
        );
        if let Some(reason) = suspended["reason"].as_str() {
            put("  reason", reason.to_owned());
        }
        put("  resume when", conditions(suspended.get("resumeWhen")));
        if let Some(summary) = suspended["summary"].as_str() {
            put("  summary", summary.to_owned());
        }
    } else if let Some(s) = view.pointer("/run/suspension").filter(|s| s.is_object()) {
        // Pending: the request waits for its seam (`requested`), or the
        // turn reached it and is checkpointing (`quiescing`).
        put(
            "suspension",
            format!(
                "{} {} (mode {}), waiting for the turn's seam",
                text(&s["handle"]),
                s["state"].as_str().unwrap_or("requested"),
                text(&s["mode"])
            ),
        );
    }
    if let Some(pending) = view.get("pending") {
        for approval in pending["approvals"].as_array().into_iter().flatten() {
            put(
                "waiting approval",
                format!(
                    "{} {}",
                    text(&approval["toolCallId"]),
                    text(&approval["title"])
                ),
            );
        }
        for injection in pending["injections"].as_array().into_iter().flatten() {
            put(
                "pending inject",
                format!(
                    "{} ({})",
                    text(&injection["messageId"]),
                    text(&injection["mode"])
                ),
            );
        }
    }
    if let Some(count) = view.get("messageCount") {
        put("messages", text(count));
    }
    if let Some(hash) = view.get("prefix_hash") {
        put("prefix hash", text(hash));
    }
    let width = lines
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    lines
        .iter()
        .map(|(k, v)| format!("{k:<width$}  {v}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text of an ACP content block (or its JSON when it is not text).
fn content_text(block: &Value) -> String {
    match block.get("text").and_then(Value::as_str) {
        Some(text) => text.to_owned(),
        None => block.to_string(),
    }
}

/// The event id a notification carries (`_meta.berth.eventId`, or the
/// agentEvent's own `eventId`).
pub fn event_id(params: &Value) -> Option<u64> {
    params
        .pointer("/_meta/berth/eventId")
        .or_else(|| params.get("eventId"))
        .and_then(Value::as_u64)
}

/// One line for a session notification, `[eventId] what`; `None` for a
/// notification `tail` does not show (another session's, or one without
/// content).
pub fn event_line(method: &str, params: &Value) -> Option<String> {
    let id = event_id(params)
        .map(|id| format!("[{id}] "))
        .unwrap_or_default();
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    match method {
        "session/update" => {
            let update = &params["update"];
            let line = match update["sessionUpdate"].as_str()? {
                "user_message_chunk" => {
                    let injected = update
                        .get("messageId")
                        .and_then(Value::as_str)
                        .map(|m| format!(" (injected {m})"))
                        .unwrap_or_default();
                    format!("user{injected}: {}", content_text(&update["content"]))
                }
                "agent_message_chunk" => format!("agent: {}", content_text(&update["content"])),
                "agent_thought_chunk" => {
                    format!("agent thinks: {}", content_text(&update["content"]))
                }
                "tool_call" => format!(
                    "tool call {} {}{}",
                    text(&update["toolCallId"]),
                    text(&update["title"]),
                    update
                        .get("status")
                        .and_then(Value::as_str)
                        .map(|s| format!(" ({s})"))
                        .unwrap_or_default()
                ),
                "tool_call_update" => {
                    let mut line = format!(
                        "tool call {} {}",
                        text(&update["toolCallId"]),
                        text(&update["status"])
                    );
                    if let Some(first) = update["content"]
                        .as_array()
                        .and_then(|c| c.first())
                        .and_then(|c| c.pointer("/content/text"))
                        .and_then(Value::as_str)
                    {
                        let first: String = first
                            .lines()
                            .next()
                            .unwrap_or("")
                            .chars()
                            .take(120)
                            .collect();
                        line.push_str(&format!(": {first}"));
                    }
                    line
                }
                other => format!("{other}: {update}"),
            };
            Some(format!("{id}{line}"))
        }
        crate::ctl::AGENT_EVENT => {
            let event = &params["event"];
            let line = match params["type"].as_str()? {
                "turn_ended" => format!(
                    "turn {} ended: {} ({}, owner {}; {} in / {} out tokens)",
                    text(&event["turn_id"]),
                    event
                        .get("stop_reason")
                        .map(text)
                        .unwrap_or_else(|| "error".into()),
                    text(&event["terminal"]["kind"]),
                    text(&event["terminal"]["owner"]),
                    text(&event["usage"]["input_tokens"]),
                    text(&event["usage"]["output_tokens"]),
                ),
                "control_outcome" => {
                    let mut line = format!(
                        "control {} {} {} by {}",
                        text(&event["method"]),
                        text(&event["status"]),
                        text(&event["outcome"]),
                        text(&event["actor"])
                    );
                    if let Some(reason) = event.get("reason").and_then(Value::as_str) {
                        line.push_str(&format!(" ({reason})"));
                    }
                    line
                }
                "suspend_requested" => format!(
                    "suspend requested: {} (mode {}), waiting for the turn's seam",
                    text(&event["handle"]),
                    text(&event["mode"])
                ),
                "suspended" => format!(
                    "suspended: {} by {}{}; resume when: {}",
                    text(&event["handle"]),
                    text(&event["initiator"]),
                    event
                        .get("reason")
                        .and_then(Value::as_str)
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default(),
                    conditions(event.get("resume_when"))
                ),
                "resumed" => format!(
                    "resumed: {} ({}{})",
                    text(&event["handle"]),
                    text(&event["cause"]),
                    if event["had_resume_input"] == Value::Bool(true) {
                        ", with input"
                    } else {
                        ""
                    }
                ),
                "suspension_cancelled" => format!(
                    "suspension {} cancelled: {}",
                    text(&event["handle"]),
                    text(&event["reason"])
                ),
                "injection_accepted" => format!(
                    "inject {} accepted ({})",
                    text(&event["injection"]["message_id"]),
                    text(&event["injection"]["mode"])
                ),
                "injection_dropped" => format!(
                    "inject {} dropped: {}",
                    text(&event["message_id"]),
                    text(&event["reason"])
                ),
                "injection_revoked" => format!("inject {} revoked", text(&event["message_id"])),
                "permission_requested" => format!(
                    "tool call {} waits for approval",
                    text(&event["request"]["tool_call_id"])
                ),
                "session_closed" => "session closed".into(),
                // Signed receipts and other bookkeeping: named, not detailed
                // (`--json` has them whole).
                other => other.replace('_', " "),
            };
            Some(format!("{id}{line}"))
        }
        crate::ctl::PRESENCE => Some(format!(
            "{id}{} {} ({}), {} attached",
            text(&params["actor"]),
            text(&params["change"]),
            text(&params["role"]),
            text(&params["attached"])
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conditions_read_as_words() {
        assert_eq!(conditions(None), "explicit resume");
        assert_eq!(
            conditions(Some(&json!({"onEvent": "ci.*",
                "timeout": {"durationMinutes": 30, "onTimeout": "fail"}}))),
            "event ci.* | timeout 30m → fail"
        );
        assert_eq!(
            conditions(Some(&json!({"trigger": {"cron": "0 9 * * 1-5"},
                "timeout": {"durationMinutes": 120}}))),
            "cron \"0 9 * * 1-5\" UTC | timeout 2h → resume_with_summary"
        );
    }

    #[test]
    fn the_table_pads_every_column_but_the_last() {
        let out = table(&["ID", "STATE"], &[vec!["s1".into(), "idle".into()]]);
        assert_eq!(out, "ID  STATE\ns1  idle");
    }

    #[test]
    fn durations_and_money() {
        assert_eq!(duration(45), "45s");
        assert_eq!(duration(192), "3m12s");
        assert_eq!(duration(7500), "2h05m");
        assert_eq!(minutes(90.0), "1h30m");
        assert_eq!(minutes(0.5), "30s");
        assert_eq!(cost(0), "-");
        assert_eq!(cost(12_300), "$0.0123");
        assert_eq!(count(12_345), "12.3k");
    }
}
