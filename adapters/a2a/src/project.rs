//! Tasks from a session's journaled events: the A2A view of berth
//! (`DESIGN.md`, "Adapters": one A2A task is one prompt turn, contextId ↔
//! session; A2A has no paused state).
//!
//! [`SessionProjection::apply`] folds one durable event into the tasks of its
//! session and returns what changed, so the same code answers `GetTask` /
//! `ListTasks` (fold the whole log) and drives a stream (fold the replayed
//! log, then emit each live change as an A2A event). Pure: no I/O.
//!
//! | berth event | A2A |
//! |---|---|
//! | `turn_started` | a new task, `TASK_STATE_WORKING`; the prompt is the first history message |
//! | `agent_message_chunk` | a text artifact per run of text (`<turn>-text-<n>`), streamed as chunks (`append`) |
//! | `tool_call`, `tool_call_update` | `WORKING` status messages (title + `data` part `{toolCall: …}`); a completed `write_file` also becomes a file artifact (`raw`, filename, media type) |
//! | a completed `publish_artifact` call | an artifact (`<turn>-artifact-<call id>`, name, description) whose one part is the call's `text`, `data` or `url` (with `filename`, `mediaType`) |
//! | a completed `direct_reply` call | an agent history message (`<turn>-reply-<call id>`); it is the status message of the completed task, and [`TaskView::direct_reply`] the Message a blocking send answers with |
//! | `permission_requested` / `_resolved` | `TASK_STATE_INPUT_REQUIRED` with `metadata.berth.permission` / back to `WORKING` |
//! | `suspended` (of a turn) | `TASK_STATE_INPUT_REQUIRED` with `metadata.berth.suspension` = `{handle, reason, initiator, conditions, suspendedAt, summary, mode}` |
//! | `resumed` | `WORKING`; the resume input is a user history message (without the `[a2a messageId: …]` header the model read) |
//! | `injection_delivered` | a user history message (a message sent to a working task is a steer) |
//! | `turn_ended` | `completed` → `COMPLETED`; `refusal` → `REJECTED`; `user_cancelled`, `session_closed`, a parked turn sealed by a fresh-transcript resume → `CANCELED`; anything else (provider or internal error, limits, restart, suspension timeout) → `FAILED`; `metadata.berth.terminal` = `{kind, owner, reason}` |

use std::collections::HashMap;

use base64::Engine;
use berth_runtime::event::{EventRecord, SessionEvent, ToolCallStatus};
use berth_runtime::ids::{EventId, SessionId, TurnId};
use berth_runtime::terminal::TerminalKind;
use berth_runtime::tools::direct_reply;
use berth_runtime::tools::publish_artifact::{self, ArtifactContent, PublishedArtifact};
use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use crate::content;
use crate::ids;
use crate::wire::{Artifact, Message, Part, Role, Task, TaskState, TaskStatus};

/// Timestamps as the A2A spec §5.6.1 wants them: UTC, ms, `Z`.
pub fn timestamp(at: &DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// One task (turn) as folded so far.
#[derive(Debug, Clone)]
pub struct TaskView {
    /// The session.
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// Current state.
    pub state: TaskState,
    /// The latest status message.
    pub status_message: Option<Message>,
    /// When the state or status message last changed.
    pub updated_at: DateTime<Utc>,
    /// User and agent messages, in order.
    pub history: Vec<Message>,
    /// Outputs.
    pub artifacts: Vec<Artifact>,
    /// `metadata.berth`.
    pub berth: Map<String, Value>,
    /// The agent's `direct_reply` messages, in order (also in `history`).
    pub replies: Vec<Message>,
    open_text: Option<(usize, usize)>,
    text_runs: u32,
    calls: HashMap<String, (String, Value)>,
}

/// What one event changed in a task (the A2A stream events to send).
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The task came into being.
    Started,
    /// Its status (state or status message) changed.
    Status,
    /// An artifact (or a chunk of one) was produced.
    Artifact {
        /// The artifact or chunk.
        artifact: Artifact,
        /// Append to the artifact with the same id.
        append: bool,
        /// The artifact is complete.
        last_chunk: bool,
    },
}

impl TaskView {
    /// The task's A2A id.
    pub fn id(&self) -> String {
        ids::task_id(&self.session_id, &self.turn_id)
    }

    /// The task as A2A shows it. `history_length`: `None` all, `Some(0)` the
    /// field omitted, `Some(n)` the last `n` messages.
    pub fn to_task(&self, history_length: Option<usize>, include_artifacts: bool) -> Task {
        let history = match history_length {
            Some(0) => None,
            Some(n) => Some(self.history[self.history.len().saturating_sub(n)..].to_vec()),
            None => Some(self.history.clone()),
        };
        Task {
            id: self.id(),
            context_id: self.session_id.0.clone(),
            status: self.status(),
            artifacts: include_artifacts.then(|| self.artifacts.clone()),
            history,
            metadata: self.metadata(),
        }
    }

    /// The current status.
    pub fn status(&self) -> TaskStatus {
        TaskStatus {
            state: self.state,
            message: self.status_message.clone(),
            timestamp: Some(timestamp(&self.updated_at)),
        }
    }

    /// `{"berth": {...}}`, or `None` when there is nothing to say.
    pub fn metadata(&self) -> Option<Map<String, Value>> {
        (!self.berth.is_empty()).then(|| {
            let mut map = Map::new();
            map.insert("berth".into(), Value::Object(self.berth.clone()));
            map
        })
    }

    /// The task as a direct A2A `Message` (spec §3.1.1: "MAY return a
    /// direct Message response"): `Some` when the turn completed with
    /// exactly one `direct_reply` and no artifact, so the Message says all
    /// the task did. It has the context but no `taskId` (there is no task to
    /// track); `metadata.berth.taskId` names the journaled turn, which
    /// `GetTask` still answers.
    pub fn direct_reply(&self) -> Option<Message> {
        if self.state != TaskState::Completed || !self.artifacts.is_empty() {
            return None;
        }
        let [reply] = self.replies.as_slice() else {
            return None;
        };
        let mut berth = Map::new();
        berth.insert("taskId".into(), Value::String(self.id()));
        let mut metadata = Map::new();
        metadata.insert("berth".into(), Value::Object(berth));
        Some(Message {
            task_id: None,
            metadata: Some(metadata),
            ..reply.clone()
        })
    }

    fn agent_message(&self, message_id: String, parts: Vec<Part>) -> Message {
        Message::agent(message_id, &self.session_id.0, &self.id(), parts)
    }

    fn user_message(&self, message_id: String, parts: Vec<Part>) -> Message {
        Message {
            role: Role::User,
            ..self.agent_message(message_id, parts)
        }
    }

    fn set_status(&mut self, state: TaskState, message: Option<Message>, at: DateTime<Utc>) {
        self.state = state;
        self.status_message = message;
        self.updated_at = at;
    }

    /// Ends the current run of text: the next chunk starts a new artifact.
    fn close_text(&mut self) {
        self.open_text = None;
    }
}

/// The tasks of one session, folded from its events.
#[derive(Debug, Clone)]
pub struct SessionProjection {
    session_id: SessionId,
    tasks: Vec<TaskView>,
    by_turn: HashMap<TurnId, usize>,
    current: Option<usize>,
    /// `resumed` events naming a fresh turn: the message id of its input.
    pending_inputs: HashMap<TurnId, String>,
}

impl SessionProjection {
    /// An empty projection of `session_id`.
    pub fn new(session_id: SessionId) -> Self {
        Self {
            session_id,
            tasks: Vec::new(),
            by_turn: HashMap::new(),
            current: None,
            pending_inputs: HashMap::new(),
        }
    }

    /// Folds a whole log.
    pub fn from_events<'a>(
        session_id: SessionId,
        events: impl IntoIterator<Item = (EventId, &'a EventRecord)>,
    ) -> Self {
        let mut projection = Self::new(session_id);
        for (event_id, record) in events {
            projection.apply(event_id, record);
        }
        projection
    }

    /// Every task, oldest first.
    pub fn tasks(&self) -> &[TaskView] {
        &self.tasks
    }

    /// The task of `turn`.
    pub fn task(&self, turn: &TurnId) -> Option<&TaskView> {
        self.by_turn.get(turn).map(|&i| &self.tasks[i])
    }

    /// Folds one event; returns the changed task's turn and what changed.
    pub fn apply(&mut self, event_id: EventId, record: &EventRecord) -> Vec<(TurnId, Change)> {
        let at = record.at;
        let mut out = Vec::new();
        match &record.event {
            SessionEvent::TurnStarted { turn_id, prompt } => {
                let mut view = TaskView {
                    session_id: self.session_id.clone(),
                    turn_id: turn_id.clone(),
                    state: TaskState::Working,
                    status_message: None,
                    updated_at: at,
                    history: Vec::new(),
                    artifacts: Vec::new(),
                    berth: Map::new(),
                    replies: Vec::new(),
                    open_text: None,
                    text_runs: 0,
                    calls: HashMap::new(),
                };
                let message_id = content::message_id_of(&prompt.0)
                    .or_else(|| self.pending_inputs.remove(turn_id))
                    .unwrap_or_else(|| format!("{}-prompt", turn_id.0));
                let user = view.user_message(message_id, content::to_parts(&prompt.0));
                view.history.push(user);
                self.by_turn.insert(turn_id.clone(), self.tasks.len());
                self.current = Some(self.tasks.len());
                self.tasks.push(view);
                out.push((turn_id.clone(), Change::Started));
            }
            SessionEvent::AgentMessageChunk { text } => {
                let Some(view) = self.current.map(|i| &mut self.tasks[i]) else {
                    return out;
                };
                let (append, artifact_id) = match view.open_text {
                    Some((a, h)) => {
                        if let Some(part) = view.artifacts[a].parts.first_mut() {
                            part.text.get_or_insert_with(String::new).push_str(text);
                        }
                        if let Some(part) = view.history[h].parts.first_mut() {
                            part.text.get_or_insert_with(String::new).push_str(text);
                        }
                        (true, view.artifacts[a].artifact_id.clone())
                    }
                    None => {
                        view.text_runs += 1;
                        let artifact_id = format!("{}-text-{}", view.turn_id.0, view.text_runs);
                        view.artifacts.push(Artifact {
                            artifact_id: artifact_id.clone(),
                            name: Some("response".into()),
                            description: None,
                            parts: vec![Part::text(text.clone())],
                            metadata: None,
                        });
                        let message =
                            view.agent_message(artifact_id.clone(), vec![Part::text(text.clone())]);
                        view.history.push(message);
                        view.open_text = Some((view.artifacts.len() - 1, view.history.len() - 1));
                        (false, artifact_id)
                    }
                };
                out.push((
                    view.turn_id.clone(),
                    Change::Artifact {
                        artifact: Artifact {
                            artifact_id,
                            name: Some("response".into()),
                            description: None,
                            parts: vec![Part::text(text.clone())],
                            metadata: None,
                        },
                        append,
                        last_chunk: false,
                    },
                ));
            }
            SessionEvent::ToolCall {
                tool_call_id,
                name,
                title,
                kind,
                raw_input,
            } => {
                let Some(view) = self.current.map(|i| &mut self.tasks[i]) else {
                    return out;
                };
                view.close_text();
                view.calls
                    .insert(tool_call_id.0.clone(), (name.clone(), raw_input.clone()));
                let message = view.agent_message(
                    format!("{}-event-{event_id}", view.turn_id.0),
                    vec![
                        Part::text(title.clone()),
                        Part::data(json!({"toolCall": {
                            "toolCallId": tool_call_id.0,
                            "name": name,
                            "kind": kind,
                            "status": "pending",
                            "rawInput": raw_input,
                        }})),
                    ],
                );
                view.set_status(TaskState::Working, Some(message), at);
                out.push((view.turn_id.clone(), Change::Status));
            }
            SessionEvent::ToolCallUpdate {
                tool_call_id,
                status,
                raw_output,
                content: text,
            } => {
                let Some(view) = self.current.map(|i| &mut self.tasks[i]) else {
                    return out;
                };
                view.close_text();
                let mut call = json!({"toolCallId": tool_call_id.0, "status": status});
                if let Some(raw) = raw_output {
                    call["rawOutput"] = raw.clone();
                }
                let mut parts = Vec::new();
                if let Some(text) = text {
                    parts.push(Part::text(text.clone()));
                }
                parts.push(Part::data(json!({"toolCall": call})));
                let message =
                    view.agent_message(format!("{}-event-{event_id}", view.turn_id.0), parts);
                view.set_status(TaskState::Working, Some(message), at);
                out.push((view.turn_id.clone(), Change::Status));
                if *status == ToolCallStatus::Completed {
                    let name = view.calls.get(&tool_call_id.0).map(|(n, _)| n.as_str());
                    if name == Some(direct_reply::NAME) {
                        if let Some(text) = raw_output.as_ref().and_then(direct_reply::reply_of) {
                            let message = view.agent_message(
                                format!("{}-reply-{}", view.turn_id.0, tool_call_id.0),
                                vec![Part::text(text)],
                            );
                            view.history.push(message.clone());
                            view.replies.push(message);
                        }
                    }
                    let artifact = file_artifact(view, &tool_call_id.0)
                        .or_else(|| published_artifact(view, &tool_call_id.0, raw_output.as_ref()));
                    if let Some(artifact) = artifact {
                        view.artifacts.push(artifact.clone());
                        out.push((
                            view.turn_id.clone(),
                            Change::Artifact {
                                artifact,
                                append: false,
                                last_chunk: true,
                            },
                        ));
                    }
                }
            }
            SessionEvent::PermissionRequested { request } => {
                let Some(view) = self.current.map(|i| &mut self.tasks[i]) else {
                    return out;
                };
                view.close_text();
                view.berth.insert(
                    "permission".into(),
                    json!({"toolCallId": request.tool_call_id.0, "title": request.title, "rawInput": request.raw_input}),
                );
                let message = view.agent_message(
                    format!("{}-event-{event_id}", view.turn_id.0),
                    vec![Part::text(format!(
                        "waiting for a client to approve the tool call: {}",
                        request.title
                    ))],
                );
                view.set_status(TaskState::InputRequired, Some(message), at);
                out.push((view.turn_id.clone(), Change::Status));
            }
            SessionEvent::PermissionResolved { .. } => {
                let Some(view) = self.current.map(|i| &mut self.tasks[i]) else {
                    return out;
                };
                view.berth.remove("permission");
                view.set_status(TaskState::Working, None, at);
                out.push((view.turn_id.clone(), Change::Status));
            }
            SessionEvent::Suspended {
                handle,
                reason,
                initiator,
                suspended_at,
                resume_when,
                summary,
                turn_id: Some(turn_id),
                mode,
            } => {
                let Some(&i) = self.by_turn.get(turn_id) else {
                    return out;
                };
                let view = &mut self.tasks[i];
                view.close_text();
                view.berth.insert(
                    "suspension".into(),
                    json!({
                        "handle": handle,
                        "reason": reason,
                        "initiator": initiator,
                        "conditions": resume_when,
                        "suspendedAt": timestamp(suspended_at),
                        "summary": summary,
                        "mode": mode,
                    }),
                );
                let text = summary
                    .clone()
                    .or_else(|| reason.clone())
                    .unwrap_or_else(|| "the task is suspended".into());
                let message = view.agent_message(
                    format!("{}-event-{event_id}", view.turn_id.0),
                    vec![Part::text(format!(
                        "{text} (suspended: send a message to this task to resume it)"
                    ))],
                );
                view.set_status(TaskState::InputRequired, Some(message), at);
                out.push((view.turn_id.clone(), Change::Status));
            }
            SessionEvent::Resumed {
                turn_id: Some(turn_id),
                input,
                message_id,
                handle,
                ..
            } => match self.by_turn.get(turn_id) {
                Some(&i) => {
                    self.current = Some(i);
                    let view = &mut self.tasks[i];
                    view.berth.remove("suspension");
                    if let Some(input) = input {
                        let text = match input {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        let text = content::strip_message_id_header(&text, message_id.as_deref())
                            .to_owned();
                        let id = message_id
                            .clone()
                            .unwrap_or_else(|| format!("{handle}-input"));
                        let message = view.user_message(id, vec![Part::text(text)]);
                        view.history.push(message);
                    }
                    view.set_status(TaskState::Working, None, at);
                    out.push((view.turn_id.clone(), Change::Status));
                }
                None => {
                    if let Some(id) = message_id {
                        self.pending_inputs.insert(turn_id.clone(), id.clone());
                    }
                }
            },
            SessionEvent::InjectionDelivered { injection, .. } => {
                let Some(view) = self.current.map(|i| &mut self.tasks[i]) else {
                    return out;
                };
                view.close_text();
                let message = view.user_message(
                    injection.message_id.clone(),
                    content::to_parts(&injection.content.0),
                );
                view.history.push(message);
            }
            SessionEvent::TurnEnded {
                turn_id, terminal, ..
            } => {
                let Some(&i) = self.by_turn.get(turn_id) else {
                    return out;
                };
                if self.current == Some(i) {
                    self.current = None;
                }
                let view = &mut self.tasks[i];
                view.close_text();
                view.berth.remove("suspension");
                view.berth.remove("permission");
                view.berth.insert(
                    "terminal".into(),
                    serde_json::to_value(terminal).unwrap_or(Value::Null),
                );
                let state = match terminal.kind {
                    TerminalKind::Completed => TaskState::Completed,
                    TerminalKind::Refusal => TaskState::Rejected,
                    TerminalKind::UserCancelled
                    | TerminalKind::SessionClosed
                    | TerminalKind::Suspended => TaskState::Canceled,
                    _ => TaskState::Failed,
                };
                // A completed task's status message is the agent's direct
                // reply, if it gave one; another end's is the reason.
                let message = if state == TaskState::Completed {
                    view.replies.last().cloned()
                } else {
                    Some(view.agent_message(
                        format!("{}-event-{event_id}", view.turn_id.0),
                        vec![Part::text(terminal.reason.clone())],
                    ))
                };
                view.set_status(state, message, at);
                out.push((view.turn_id.clone(), Change::Status));
            }
            _ => {}
        }
        out
    }
}

/// A completed `publish_artifact` call as an artifact: its one part of the
/// kind the agent gave (`text`, `data`, or `url` with `filename` and
/// `mediaType`), from the call's validated `rawOutput`.
fn published_artifact(
    view: &TaskView,
    tool_call_id: &str,
    raw_output: Option<&Value>,
) -> Option<Artifact> {
    let (name, _) = view.calls.get(tool_call_id)?;
    if name != publish_artifact::NAME {
        return None;
    }
    let published = PublishedArtifact::from_raw_output(raw_output?)?;
    let mut part = Part {
        filename: published.part.filename,
        media_type: published.part.media_type,
        ..Part::default()
    };
    match published.part.content {
        ArtifactContent::Text(text) => part.text = Some(text),
        ArtifactContent::Data(data) => part.data = Some(data),
        ArtifactContent::Url(url) => part.url = Some(url),
    }
    Some(Artifact {
        artifact_id: format!("{}-artifact-{tool_call_id}", view.turn_id.0),
        name: published.name,
        description: published.description,
        parts: vec![part],
        metadata: None,
    })
}

/// A completed `write_file` call as a file artifact: the content written,
/// base64, named by the file's base name.
fn file_artifact(view: &TaskView, tool_call_id: &str) -> Option<Artifact> {
    let (name, input) = view.calls.get(tool_call_id)?;
    if name != "write_file" {
        return None;
    }
    let path = input.get("path")?.as_str()?;
    let text = input.get("content")?.as_str()?;
    let filename = std::path::Path::new(path)
        .file_name()?
        .to_string_lossy()
        .into_owned();
    Some(Artifact {
        artifact_id: format!("{}-file-{tool_call_id}", view.turn_id.0),
        name: Some(filename.clone()),
        description: Some(format!("written to {path}")),
        parts: vec![Part {
            raw: Some(base64::engine::general_purpose::STANDARD.encode(text)),
            media_type: Some(content::media_type_for(&filename).into()),
            filename: Some(filename),
            ..Part::default()
        }],
        metadata: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_runtime::content::Prompt;
    use berth_runtime::ids::ToolCallId;
    use berth_runtime::suspension::{Initiator, SuspendMode};
    use berth_runtime::terminal::Terminal;

    fn rec(event: SessionEvent) -> EventRecord {
        EventRecord::new(
            DateTime::from_timestamp_millis(1_700_000_000_123).unwrap(),
            event,
        )
    }

    #[test]
    fn a_turn_folds_into_a_task() {
        let turn = TurnId("turn_1".into());
        let events = [
            rec(SessionEvent::TurnStarted {
                turn_id: turn.clone(),
                prompt: Prompt::text("hi"),
            }),
            rec(SessionEvent::AgentMessageChunk { text: "Hel".into() }),
            rec(SessionEvent::AgentMessageChunk { text: "lo".into() }),
            rec(SessionEvent::ToolCall {
                tool_call_id: ToolCallId("c1".into()),
                name: "write_file".into(),
                title: "write".into(),
                kind: berth_runtime::event::ToolKind::Edit,
                raw_input: json!({"path": "/w/out.txt", "content": "data"}),
            }),
            rec(SessionEvent::ToolCallUpdate {
                tool_call_id: ToolCallId("c1".into()),
                status: ToolCallStatus::Completed,
                raw_output: None,
                content: None,
            }),
            rec(SessionEvent::AgentMessageChunk {
                text: "Done".into(),
            }),
        ];
        let mut p = SessionProjection::new(SessionId("s".into()));
        let mut changes = Vec::new();
        for (i, e) in events.iter().enumerate() {
            changes.extend(p.apply(i as u64 + 1, e));
        }
        let view = p.task(&turn).unwrap();
        assert_eq!(view.state, TaskState::Working);
        let task = view.to_task(None, true);
        assert_eq!(task.id, "turn_1.s");
        let artifacts = task.artifacts.unwrap();
        assert_eq!(artifacts.len(), 3);
        assert_eq!(artifacts[0].parts[0].text.as_deref(), Some("Hello"));
        assert_eq!(artifacts[1].parts[0].filename.as_deref(), Some("out.txt"));
        assert_eq!(
            artifacts[1].parts[0].media_type.as_deref(),
            Some("text/plain")
        );
        assert_eq!(artifacts[2].parts[0].text.as_deref(), Some("Done"));
        assert_eq!(task.history.as_ref().unwrap().len(), 3);
        assert_eq!(
            task.status.timestamp.as_deref(),
            Some("2023-11-14T22:13:20.123Z")
        );
        let appends: Vec<bool> = changes
            .iter()
            .filter_map(|(_, c)| match c {
                Change::Artifact { append, .. } => Some(*append),
                _ => None,
            })
            .collect();
        assert_eq!(appends, vec![false, true, false, false]);

        p.apply(
            7,
            &rec(SessionEvent::Suspended {
                handle: "susp_1".into(),
                reason: Some("why".into()),
                initiator: Initiator::Agent,
                suspended_at: Utc::now(),
                resume_when: None,
                summary: None,
                turn_id: Some(turn.clone()),
                mode: SuspendMode::FinishStep,
            }),
        );
        let view = p.task(&turn).unwrap();
        assert_eq!(view.state, TaskState::InputRequired);
        assert_eq!(view.berth["suspension"]["handle"], "susp_1");
        p.apply(
            8,
            &rec(SessionEvent::Resumed {
                handle: "susp_1".into(),
                cause: berth_runtime::suspension::ResumeCause::ExplicitResume,
                had_resume_input: true,
                continue_transcript: true,
                resumed_at: Utc::now(),
                turn_id: Some(turn.clone()),
                lateness_ms: None,
                input: Some(json!("go on")),
                message_id: Some("m2".into()),
            }),
        );
        let view = p.task(&turn).unwrap();
        assert_eq!(view.state, TaskState::Working);
        assert!(!view.berth.contains_key("suspension"));
        assert_eq!(view.history.last().unwrap().message_id, "m2");
        p.apply(
            9,
            &rec(SessionEvent::TurnEnded {
                turn_id: turn.clone(),
                stop_reason: None,
                terminal: Terminal::new(TerminalKind::Refusal, "no"),
                usage: Default::default(),
            }),
        );
        let task = p.task(&turn).unwrap().to_task(Some(0), false);
        assert_eq!(task.status.state, TaskState::Rejected);
        assert!(task.history.is_none() && task.artifacts.is_none());
        assert_eq!(
            task.metadata.unwrap()["berth"]["terminal"]["kind"],
            "refusal"
        );
    }

    fn call(id: &str, name: &str, raw_input: Value) -> EventRecord {
        rec(SessionEvent::ToolCall {
            tool_call_id: ToolCallId(id.into()),
            name: name.into(),
            title: name.into(),
            kind: berth_runtime::event::ToolKind::Other,
            raw_input,
        })
    }

    fn done(id: &str, status: ToolCallStatus, raw_output: Value) -> EventRecord {
        rec(SessionEvent::ToolCallUpdate {
            tool_call_id: ToolCallId(id.into()),
            status,
            raw_output: Some(raw_output),
            content: None,
        })
    }

    fn ended(turn: &TurnId) -> EventRecord {
        rec(SessionEvent::TurnEnded {
            turn_id: turn.clone(),
            stop_reason: None,
            terminal: Terminal::new(TerminalKind::Completed, "done"),
            usage: Default::default(),
        })
    }

    #[test]
    fn published_artifacts_and_direct_replies() {
        let turn = TurnId("turn_1".into());
        let mut p = SessionProjection::new(SessionId("s".into()));
        let data = json!({"key": "value", "count": 42});
        let events = [
            rec(SessionEvent::TurnStarted {
                turn_id: turn.clone(),
                prompt: Prompt::text("go"),
            }),
            call("c1", "publish_artifact", json!({"name": "d", "data": data})),
            done(
                "c1",
                ToolCallStatus::Completed,
                json!({"artifact": {"name": "d", "part": {"data": data}}}),
            ),
            // A refused call publishes nothing.
            call("c2", "publish_artifact", json!({"text": "a", "data": 1})),
            done(
                "c2",
                ToolCallStatus::Failed,
                json!({"error": "invalid_arguments", "message": "…"}),
            ),
            call(
                "c3",
                "publish_artifact",
                json!({"url": "https://e.com/o.txt"}),
            ),
            done(
                "c3",
                ToolCallStatus::Completed,
                json!({"artifact": {"part": {"url": "https://e.com/o.txt", "filename": "o.txt", "mediaType": "text/plain"}}}),
            ),
            call("c4", "direct_reply", json!({"text": "hi"})),
            done(
                "c4",
                ToolCallStatus::Completed,
                json!({"reply": {"text": "hi"}}),
            ),
            ended(&turn),
        ];
        let mut artifacts = Vec::new();
        for (i, e) in events.iter().enumerate() {
            for (_, change) in p.apply(i as u64 + 1, e) {
                if let Change::Artifact {
                    artifact,
                    append,
                    last_chunk,
                } = change
                {
                    assert!(!append && last_chunk);
                    artifacts.push(artifact);
                }
            }
        }
        let view = p.task(&turn).unwrap();
        assert_eq!(view.artifacts, artifacts);
        assert_eq!(artifacts.len(), 2);
        assert_eq!(artifacts[0].artifact_id, "turn_1-artifact-c1");
        assert_eq!(artifacts[0].name.as_deref(), Some("d"));
        assert_eq!(artifacts[0].parts, vec![Part::data(data)]);
        let url = &artifacts[1].parts[0];
        assert_eq!(url.url.as_deref(), Some("https://e.com/o.txt"));
        assert_eq!(url.filename.as_deref(), Some("o.txt"));
        assert_eq!(url.media_type.as_deref(), Some("text/plain"));
        // The reply is the completed task's status message and in history,
        // but with artifacts beside it the task is no direct Message.
        let status = view.status().message.unwrap();
        assert_eq!(status.parts, vec![Part::text("hi")]);
        assert_eq!(status.message_id, "turn_1-reply-c4");
        assert_eq!(view.history.last(), Some(&status));
        assert_eq!(view.direct_reply(), None);

        // A turn whose only output is one reply: a direct Message, with the
        // context and no task id.
        let turn2 = TurnId("turn_2".into());
        for (i, e) in [
            rec(SessionEvent::TurnStarted {
                turn_id: turn2.clone(),
                prompt: Prompt::text("hello"),
            }),
            call("d1", "direct_reply", json!({"text": "Direct"})),
            done(
                "d1",
                ToolCallStatus::Completed,
                json!({"reply": {"text": "Direct"}}),
            ),
        ]
        .iter()
        .enumerate()
        {
            p.apply(20 + i as u64, e);
        }
        // Not before the task completed.
        assert_eq!(p.task(&turn2).unwrap().direct_reply(), None);
        p.apply(30, &ended(&turn2));
        let message = p.task(&turn2).unwrap().direct_reply().unwrap();
        assert_eq!(message.role, Role::Agent);
        assert_eq!(message.parts, vec![Part::text("Direct")]);
        assert_eq!(message.context_id.as_deref(), Some("s"));
        assert_eq!(message.task_id, None);
        assert_eq!(
            message.metadata.unwrap()["berth"]["taskId"],
            json!("turn_2.s")
        );
    }
}
