//! Journaled events → ACP notifications.
//!
//! Facts ACP has an update for go out as `session/update` using the official
//! schema types (`user_message_chunk`, `agent_message_chunk`,
//! `agent_thought_chunk`, `tool_call`, `tool_call_update`). Facts it has none
//! for (`turn_ended`, `session_closed`, the suspension lifecycle unless the
//! client declared `suspendUpdates`) go out as `_berth/agentEvent`, which a
//! stock client ignores (DESIGN.md, "Adapters"). Every notification carries
//! `_meta.berth.eventId`; a replayed one also `_meta.berth.replayed: true`.

use agent_client_protocol_schema::v1::{
    ContentBlock, ContentChunk, MessageId, SessionUpdate, TextContent, ToolCall, ToolCallContent,
    ToolCallStatus as AcpStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind as AcpKind,
};
use berth_actors::SessionNotice;
use berth_runtime::event::{SessionEvent, ToolCallStatus, ToolKind};
use serde_json::{json, Value};

use crate::jsonrpc::encode_notification;

/// The notification method for berth facts without an ACP update.
pub const AGENT_EVENT_METHOD: &str = "_berth/agentEvent";

/// The notification announcing that another client attached to or detached
/// from a session this connection watches (issue 8).
pub const PRESENCE_METHOD: &str = "_berth/presence";

/// `_berth/presence {sessionId, change: "attached" | "detached",
/// connectionId, actor, role, attached, _meta.berth.eventId}`: `attached` is
/// how many clients watch the session after the change; `eventId` is the
/// session's last published event id when it happened (presence itself is
/// not journaled).
pub fn render_presence(notice: &berth_actors::PresenceNotice) -> String {
    encode_notification(
        PRESENCE_METHOD,
        &json!({
            "sessionId": notice.session_id,
            "change": notice.change,
            "connectionId": notice.connection_id,
            "actor": notice.principal.actor,
            "role": notice.principal.role,
            "attached": notice.attached,
            "_meta": {"berth": {"eventId": notice.event_id}},
        }),
    )
}

/// Every notification's `_meta`: `{"berth": {"eventId": N}}`, plus
/// `"replayed": true` for one re-sent by `session/load`. Serialized straight
/// into the frame: a `Meta` map per frame was a handful of allocations on the
/// path every event takes (`bench-sched`'s wake-up burst renders six frames
/// per session).
#[derive(serde::Serialize)]
struct NoticeMeta {
    berth: BerthMeta,
}

#[derive(serde::Serialize)]
struct BerthMeta {
    #[serde(rename = "eventId")]
    event_id: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    replayed: bool,
}

fn notice_meta(notice: &SessionNotice) -> NoticeMeta {
    NoticeMeta {
        berth: BerthMeta {
            event_id: notice.event_id,
            replayed: notice.replayed,
        },
    }
}

fn text_block(text: &str) -> ContentBlock {
    ContentBlock::Text(TextContent::new(text))
}

fn acp_kind(kind: ToolKind) -> AcpKind {
    match kind {
        ToolKind::Read => AcpKind::Read,
        ToolKind::Edit => AcpKind::Edit,
        ToolKind::Execute => AcpKind::Execute,
        ToolKind::Other => AcpKind::Other,
    }
}

fn acp_status(status: ToolCallStatus) -> AcpStatus {
    match status {
        ToolCallStatus::Pending => AcpStatus::Pending,
        ToolCallStatus::InProgress => AcpStatus::InProgress,
        ToolCallStatus::Completed => AcpStatus::Completed,
        ToolCallStatus::Failed => AcpStatus::Failed,
    }
}

/// A `session/update`: the wire shape of ACP's `SessionNotification`
/// (`sessionId`, `update`, `_meta`, in that order; `update` is the schema
/// crate's own type), with the `_meta` of [`notice_meta`].
fn update(notice: &SessionNotice, update: SessionUpdate) -> String {
    #[derive(serde::Serialize)]
    struct Notification<'a> {
        #[serde(rename = "sessionId")]
        session_id: &'a berth_runtime::ids::SessionId,
        update: &'a SessionUpdate,
        #[serde(rename = "_meta")]
        meta: NoticeMeta,
    }
    encode_notification(
        "session/update",
        &Notification {
            session_id: &notice.session_id,
            update: &update,
            meta: notice_meta(notice),
        },
    )
}

/// A `_berth/agentEvent`; its `event` is the record's shared encoding (the
/// bytes the journal row holds), not serialized again per frame.
fn agent_event(notice: &SessionNotice) -> String {
    /// `_berth/agentEvent` params, in wire order.
    #[derive(serde::Serialize)]
    struct AgentEvent<'a, At> {
        #[serde(rename = "sessionId")]
        session_id: &'a berth_runtime::ids::SessionId,
        #[serde(rename = "eventId")]
        event_id: u64,
        #[serde(rename = "type")]
        kind: &'a str,
        event: &'a serde_json::value::RawValue,
        at: &'a At,
        #[serde(rename = "_meta")]
        meta: NoticeMeta,
    }
    encode_notification(
        AGENT_EVENT_METHOD,
        &AgentEvent {
            session_id: &notice.session_id,
            event_id: notice.event_id,
            kind: notice.record.event.type_name(),
            event: notice.record.event_json(),
            at: &notice.record.at,
            meta: notice_meta(notice),
        },
    )
}

/// One `user_message_chunk` per content block, tagged with `message_id` when
/// the blocks are an injected message.
fn user_chunks(notice: &SessionNotice, blocks: &[Value], message_id: Option<&str>) -> Vec<String> {
    blocks
        .iter()
        .map(|block| {
            let block = <ContentBlock as serde::Deserialize>::deserialize(block)
                .unwrap_or_else(|_| text_block(&block.to_string()));
            let mut chunk = ContentChunk::new(block);
            if let Some(id) = message_id {
                chunk = chunk.message_id(MessageId::new(id.to_owned()));
            }
            update(notice, SessionUpdate::UserMessageChunk(chunk))
        })
        .collect()
}

/// How one connection wants events rendered.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions {
    /// The client declared `clientCapabilities._meta.berth.suspendUpdates`:
    /// `suspended`/`resumed` go out as `session/update` variants (RFC
    /// `SessionUpdate_Suspended` / `SessionUpdate_Resumed`) instead of
    /// `_berth/agentEvent`.
    pub suspend_updates: bool,
}

/// A `session/update` whose variant the ACP schema crate does not have yet
/// (the suspend RFC's `suspended` / `resumed`), built as JSON. `extra` goes
/// into the update's `_meta.berth` (berth facts the RFC shape has no field
/// for).
fn raw_update(notice: &SessionNotice, mut update: Value, extra: Option<(&str, Value)>) -> String {
    // The RFC's optional fields are omitted rather than null.
    if let Value::Object(fields) = &mut update {
        fields.retain(|_, v| !v.is_null());
    }
    let meta = serde_json::to_value(notice_meta(notice)).unwrap_or_default();
    update["_meta"] = meta.clone();
    if let Some((key, value)) = extra {
        update["_meta"]["berth"][key] = value;
    }
    encode_notification(
        "session/update",
        &json!({"sessionId": notice.session_id, "update": update, "_meta": meta}),
    )
}

/// The frames one notice renders to (a prompt with several blocks renders to
/// one `user_message_chunk` per block; everything else to exactly one frame).
pub fn render_notice(notice: &SessionNotice, options: RenderOptions) -> Vec<String> {
    let event = &notice.record.event;
    match event {
        SessionEvent::Suspended {
            handle,
            reason,
            initiator,
            suspended_at,
            resume_when,
            ..
        } if options.suspend_updates => vec![raw_update(
            notice,
            json!({
                "sessionUpdate": "suspended",
                "handle": handle,
                "reason": reason,
                "initiator": initiator,
                "suspendedAt": suspended_at,
                "resumeWhen": resume_when,
            }),
            None,
        )],
        SessionEvent::Resumed {
            handle,
            cause,
            had_resume_input,
            continue_transcript,
            resumed_at,
            lateness_ms,
            ..
        } if options.suspend_updates => vec![raw_update(
            notice,
            json!({
                "sessionUpdate": "resumed",
                "handle": handle,
                "cause": cause,
                "hadResumeInput": had_resume_input,
                "continueTranscript": continue_transcript,
                "resumedAt": resumed_at,
            }),
            // A scheduled wake-up's lateness (the agentEvent's `lateness_ms`).
            lateness_ms.map(|ms| ("latenessMs", json!(ms))),
        )],
        SessionEvent::TurnStarted { prompt, .. } => user_chunks(notice, &prompt.0, None),
        // Delivery of an injected message is echoed with its message id.
        SessionEvent::InjectionDelivered { injection, .. } => {
            user_chunks(notice, &injection.content.0, Some(&injection.message_id))
        }
        SessionEvent::AgentMessageChunk { text } => vec![update(
            notice,
            SessionUpdate::AgentMessageChunk(ContentChunk::new(text_block(text))),
        )],
        SessionEvent::AgentThoughtChunk { text } => vec![update(
            notice,
            SessionUpdate::AgentThoughtChunk(ContentChunk::new(text_block(text))),
        )],
        SessionEvent::ToolCall {
            tool_call_id,
            title,
            kind,
            raw_input,
            ..
        } => vec![update(
            notice,
            SessionUpdate::ToolCall(
                ToolCall::new(tool_call_id.to_string(), title.clone())
                    .kind(acp_kind(*kind))
                    .status(AcpStatus::Pending)
                    .raw_input(raw_input.clone()),
            ),
        )],
        SessionEvent::ToolCallUpdate {
            tool_call_id,
            status,
            raw_output,
            content,
        } => {
            let mut fields = ToolCallUpdateFields::new().status(acp_status(*status));
            if let Some(raw) = raw_output {
                fields = fields.raw_output(raw.clone());
            }
            if let Some(text) = content {
                fields = fields.content(vec![ToolCallContent::from(text_block(text))]);
            }
            vec![update(
                notice,
                SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
                    tool_call_id.to_string(),
                    fields,
                )),
            )]
        }
        SessionEvent::TurnEnded { .. }
        | SessionEvent::SessionClosed {}
        | SessionEvent::InjectionAccepted { .. }
        | SessionEvent::InjectionRevoked { .. }
        | SessionEvent::InjectionReplaced { .. }
        | SessionEvent::InjectionDropped { .. }
        | SessionEvent::ControlOutcome(_)
        | SessionEvent::SuspensionReceipt(_)
        | SessionEvent::ResumptionReceipt(_)
        | SessionEvent::DrainDecisionReceipt(_)
        | SessionEvent::Directive { .. }
        | SessionEvent::TurnRolledBack { .. }
        | SessionEvent::TurnRedone { .. }
        | SessionEvent::PermissionRequested { .. }
        | SessionEvent::PermissionResolved { .. }
        | SessionEvent::SuspendRequested { .. }
        | SessionEvent::Suspended { .. }
        | SessionEvent::Resumed { .. }
        | SessionEvent::SuspensionCancelled { .. } => vec![agent_event(notice)],
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use agent_client_protocol_schema::v1::{Meta, SessionNotification};
    use berth_runtime::event::EventRecord;
    use berth_runtime::ids::SessionId;

    use super::*;

    fn notice(event: SessionEvent, replayed: bool) -> SessionNotice {
        SessionNotice {
            session_id: SessionId::from("sess_1"),
            event_id: 7,
            record: Arc::new(EventRecord::new(
                serde_json::from_value(json!("2023-11-14T22:13:20.123Z")).unwrap(),
                event,
            )),
            replayed,
            origin: None,
        }
    }

    /// `update` writes byte for byte what the schema crate's
    /// `SessionNotification` with the same `_meta` map serializes to.
    #[test]
    fn a_session_update_is_the_schema_crates_notification() {
        for replayed in [false, true] {
            let n = notice(
                SessionEvent::AgentMessageChunk {
                    text: "hi \"there\"\n".into(),
                },
                replayed,
            );
            let chunk = || {
                SessionUpdate::AgentMessageChunk(ContentChunk::new(text_block("hi \"there\"\n")))
            };
            let mut berth = serde_json::Map::new();
            berth.insert("eventId".into(), json!(7));
            if replayed {
                berth.insert("replayed".into(), json!(true));
            }
            let mut meta = Meta::new();
            meta.insert("berth".into(), Value::Object(berth));
            let expected = encode_notification(
                "session/update",
                &SessionNotification::new("sess_1", chunk()).meta(meta),
            );
            assert_eq!(update(&n, chunk()), expected);
            assert_eq!(render_notice(&n, RenderOptions::default()), vec![expected]);
        }
    }

    #[test]
    fn an_agent_event_carries_the_event_and_its_meta() {
        let n = notice(SessionEvent::SessionClosed {}, true);
        let frames = render_notice(&n, RenderOptions::default());
        let frame: Value = serde_json::from_str(&frames[0]).unwrap();
        assert_eq!(
            frame,
            json!({
                "jsonrpc": "2.0",
                "method": AGENT_EVENT_METHOD,
                "params": {
                    "sessionId": "sess_1",
                    "eventId": 7,
                    "type": "session_closed",
                    "event": {"type": "session_closed"},
                    "at": "2023-11-14T22:13:20.123Z",
                    "_meta": {"berth": {"eventId": 7, "replayed": true}},
                },
            })
        );
    }
}
