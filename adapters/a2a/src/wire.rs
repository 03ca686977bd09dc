//! A2A 1.0 wire types, as JSON (A2A spec §4 "Protocol Data Model", §5.5
//! ProtoJSON naming: camelCase fields, SCREAMING_SNAKE_CASE enum names;
//! `specification/a2a.proto` of A2A v1.0.0).
//!
//! Only what berth reads or writes is modelled. Unknown request fields are
//! ignored (spec §5.7 "Unrecognized Fields"); as ProtoJSON parsers do, the
//! proto field names (`history_length`) are accepted beside the JSON names
//! (`historyLength`), and integers also as decimal strings.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// ProtoJSON integers: a number or a decimal string (`null`: unset).
fn int_or_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("{n} is not an integer"))),
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not an integer"))),
        Some(other) => Err(serde::de::Error::custom(format!(
            "{other} is not an integer"
        ))),
    }
}

/// A2A `Role` (proto enum `Role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// `ROLE_USER`: sent by the client.
    #[serde(rename = "ROLE_USER")]
    User,
    /// `ROLE_AGENT`: sent by the agent (berth).
    #[serde(rename = "ROLE_AGENT")]
    Agent,
}

/// A2A `Part` (spec §4.1.6): exactly one of `text`, `raw` (base64 bytes),
/// `url` or `data`, plus optional `metadata`, `filename`, `mediaType`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// Text content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// File bytes, base64 (ProtoJSON `bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
    /// A file by reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Structured data (any JSON value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Part metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// File name of a `raw`/`url` part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// Media type (e.g. `text/plain`).
    #[serde(alias = "media_type", default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            ..Self::default()
        }
    }

    /// A data part.
    pub fn data(data: Value) -> Self {
        Self {
            data: Some(data),
            ..Self::default()
        }
    }

    /// How many of the four content fields are set (valid parts have one).
    pub fn content_count(&self) -> usize {
        [
            self.text.is_some(),
            self.raw.is_some(),
            self.url.is_some(),
            self.data.is_some(),
        ]
        .into_iter()
        .filter(|set| *set)
        .count()
    }
}

/// A2A `Message` (spec §4.1.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// Sender-chosen id.
    #[serde(alias = "message_id")]
    pub message_id: String,
    /// The conversation (berth session) it belongs to.
    #[serde(alias = "context_id", default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// The task (berth turn) it continues.
    #[serde(alias = "task_id", default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Who sent it.
    pub role: Role,
    /// Content (at least one part).
    pub parts: Vec<Part>,
    /// Message metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// Extension URIs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
    /// Tasks this message refers to.
    #[serde(
        alias = "reference_task_ids",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub reference_task_ids: Vec<String>,
}

impl Message {
    /// An agent message with these parts.
    pub fn agent(message_id: String, context_id: &str, task_id: &str, parts: Vec<Part>) -> Self {
        Self {
            message_id,
            context_id: Some(context_id.to_owned()),
            task_id: Some(task_id.to_owned()),
            role: Role::Agent,
            parts,
            metadata: None,
            extensions: Vec::new(),
            reference_task_ids: Vec::new(),
        }
    }
}

/// A2A `TaskState` (spec §4.1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskState {
    /// `TASK_STATE_SUBMITTED`
    #[serde(rename = "TASK_STATE_SUBMITTED")]
    Submitted,
    /// `TASK_STATE_WORKING`: the turn runs.
    #[serde(rename = "TASK_STATE_WORKING")]
    Working,
    /// `TASK_STATE_COMPLETED`: the model ended the turn.
    #[serde(rename = "TASK_STATE_COMPLETED")]
    Completed,
    /// `TASK_STATE_FAILED`: provider/internal failure, a limit, a restart.
    #[serde(rename = "TASK_STATE_FAILED")]
    Failed,
    /// `TASK_STATE_CANCELED`: cancelled or closed.
    #[serde(rename = "TASK_STATE_CANCELED")]
    Canceled,
    /// `TASK_STATE_INPUT_REQUIRED`: suspended, or waiting on an approval.
    #[serde(rename = "TASK_STATE_INPUT_REQUIRED")]
    InputRequired,
    /// `TASK_STATE_REJECTED`: the model refused.
    #[serde(rename = "TASK_STATE_REJECTED")]
    Rejected,
    /// `TASK_STATE_AUTH_REQUIRED` (never produced by berth).
    #[serde(rename = "TASK_STATE_AUTH_REQUIRED")]
    AuthRequired,
}

impl TaskState {
    /// Completed, failed, canceled or rejected (spec §3.1.6).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Canceled | Self::Rejected
        )
    }

    /// Input- or auth-required: where a blocking send returns (spec §3.2.2).
    pub fn is_interrupted(self) -> bool {
        matches!(self, Self::InputRequired | Self::AuthRequired)
    }
}

/// A2A `TaskStatus` (spec §4.1.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    /// The state.
    pub state: TaskState,
    /// A message about it (progress, the question, the failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    /// When it was entered (RFC 3339, UTC, ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

/// A2A `Artifact` (spec §4.1.7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// Unique within the task.
    pub artifact_id: String,
    /// Display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Content.
    pub parts: Vec<Part>,
    /// Metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// A2A `Task` (spec §4.1.1): one berth prompt turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// `<turn id>.<session id>` (see [`crate::ids`]).
    pub id: String,
    /// The berth session id.
    #[serde(alias = "context_id")]
    pub context_id: String,
    /// Current status.
    pub status: TaskStatus,
    /// Outputs; omitted when not asked for (ListTasks, spec §3.1.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<Vec<Artifact>>,
    /// Messages exchanged; omitted for `historyLength: 0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<Message>>,
    /// `{"berth": {...}}`: terminal, suspension, pending approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// A2A `TaskStatusUpdateEvent` (spec §4.2.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatusUpdateEvent {
    /// The task.
    #[serde(alias = "task_id")]
    pub task_id: String,
    /// Its context.
    #[serde(alias = "context_id")]
    pub context_id: String,
    /// The new status.
    pub status: TaskStatus,
    /// Metadata (as the task's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// A2A `TaskArtifactUpdateEvent` (spec §4.2.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskArtifactUpdateEvent {
    /// The task.
    #[serde(alias = "task_id")]
    pub task_id: String,
    /// Its context.
    #[serde(alias = "context_id")]
    pub context_id: String,
    /// The artifact (or the chunk of it).
    pub artifact: Artifact,
    /// `true`: append these parts to the artifact with this id.
    #[serde(default)]
    pub append: bool,
    /// `true`: the artifact is complete.
    #[serde(default)]
    pub last_chunk: bool,
}

/// A2A `StreamResponse` (spec §3.2.3): one SSE event's `result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamResponse {
    /// The task (first event).
    Task(Task),
    /// A direct message.
    Message(Message),
    /// A status change.
    StatusUpdate(TaskStatusUpdateEvent),
    /// An artifact (chunk).
    ArtifactUpdate(TaskArtifactUpdateEvent),
}

/// A2A `SendMessageConfiguration` (spec §3.2.2).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageConfiguration {
    /// Output media types the client accepts (not enforced: berth answers text).
    #[serde(alias = "accepted_output_modes", default)]
    pub accepted_output_modes: Vec<String>,
    /// Push config (berth declares no push support: refused).
    #[serde(alias = "task_push_notification_config", default)]
    pub task_push_notification_config: Option<Value>,
    /// Most recent history messages to return.
    #[serde(alias = "history_length", default, deserialize_with = "int_or_string")]
    pub history_length: Option<i64>,
    /// Non-blocking send.
    #[serde(alias = "return_immediately", default)]
    pub return_immediately: bool,
}

/// A2A `SendMessageRequest` (spec §3.2.1).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageRequest {
    /// The message.
    pub message: Message,
    /// Options.
    #[serde(default)]
    pub configuration: Option<SendMessageConfiguration>,
    /// Request metadata.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

/// A2A `GetTaskRequest`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetTaskRequest {
    /// The task id.
    pub id: String,
    /// Most recent history messages to return.
    #[serde(alias = "history_length", default, deserialize_with = "int_or_string")]
    pub history_length: Option<i64>,
}

/// A2A `CancelTaskRequest` / `SubscribeToTaskRequest`: a task id.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskIdRequest {
    /// The task id.
    pub id: String,
}

/// A2A `ListTasksRequest` (spec §3.1.4).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksRequest {
    /// Only this context's tasks.
    #[serde(alias = "context_id", default)]
    pub context_id: Option<String>,
    /// Only tasks in this state.
    #[serde(default)]
    pub status: Option<Value>,
    /// 1..=100 (default 50).
    #[serde(alias = "page_size", default, deserialize_with = "int_or_string")]
    pub page_size: Option<i64>,
    /// Cursor from a previous page.
    #[serde(alias = "page_token", default)]
    pub page_token: Option<String>,
    /// Most recent history messages per task (default 0 here: none).
    #[serde(alias = "history_length", default, deserialize_with = "int_or_string")]
    pub history_length: Option<i64>,
    /// Only tasks whose status changed after this instant (RFC 3339).
    #[serde(alias = "status_timestamp_after", default)]
    pub status_timestamp_after: Option<String>,
    /// Include artifacts (default false: the field is omitted).
    #[serde(alias = "include_artifacts", default)]
    pub include_artifacts: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn enums_and_fields_use_protojson_names() {
        let status = TaskStatus {
            state: TaskState::InputRequired,
            message: None,
            timestamp: Some("2026-01-01T00:00:00.000Z".into()),
        };
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            json!({"state": "TASK_STATE_INPUT_REQUIRED", "timestamp": "2026-01-01T00:00:00.000Z"})
        );
        let event = StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: "t".into(),
            context_id: "c".into(),
            status,
            metadata: None,
        });
        let value = serde_json::to_value(&event).unwrap();
        assert_eq!(value["statusUpdate"]["taskId"], "t");
        let message: Message = serde_json::from_value(json!({
            "messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}], "unknown": 1
        }))
        .unwrap();
        assert_eq!(message.parts[0].text.as_deref(), Some("hi"));
        assert!(serde_json::from_value::<Message>(
            json!({"messageId": "m", "role": "user", "parts": []})
        )
        .is_err());
    }
}
