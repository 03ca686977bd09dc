//! The A2A operations (spec §3.1), each: decode → call the node → encode.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use berth_actors::{ControlError, NewSession, ResumeParams};
use berth_runtime::content::Prompt;
use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::suspension::ResumeCause;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::error::{A2aErrorKind, RpcError};
use crate::follow::Follower;
use crate::ids::{parse_task_id, task_id};
use crate::project::{Change, SessionProjection, TaskView};
use crate::rpc::Answer;
use crate::wire::{
    GetTaskRequest, ListTasksRequest, Role, SendMessageRequest, StreamResponse,
    TaskArtifactUpdateEvent, TaskIdRequest, TaskState, TaskStatusUpdateEvent,
};
use crate::{content, Shared};

/// Largest `pageSize` of `ListTasks` (spec §6.5: 1..=100).
const MAX_PAGE_SIZE: i64 = 100;
/// Default `pageSize`.
const DEFAULT_PAGE_SIZE: i64 = 50;

/// One request's context.
pub(crate) struct Ctx {
    pub shared: Arc<Shared>,
    /// Who asks (recorded in receipts).
    pub actor: String,
    /// The creator recorded on contexts this request creates (`None`: a
    /// local caller, as ACP's stdio records none).
    pub creator: Option<String>,
    /// An anonymous caller: it sees and controls only the contexts whose
    /// recorded creator is its `actor`; any other answers as if it did not
    /// exist.
    pub confined: bool,
}

impl Ctx {
    /// Whether this caller may see `session_id` (always, unless confined).
    fn sees(&self, session_id: &SessionId) -> Result<bool, RpcError> {
        if !self.confined {
            return Ok(true);
        }
        let record = self
            .shared
            .node
            .journal()
            .session(session_id)
            .map_err(RpcError::internal)?;
        Ok(record.is_some_and(|r| self.created(r.created_by.as_deref())))
    }

    /// Whether a context created by `creator` is this confined caller's.
    fn created(&self, creator: Option<&str>) -> bool {
        creator == Some(self.actor.as_str())
    }

    /// The task id's session and turn, if the caller may see that session;
    /// `-32001` otherwise (an invisible context answers as a missing one).
    fn task(&self, id: &str) -> Result<(SessionId, TurnId), RpcError> {
        let (session_id, turn) = parse_task_id(id).ok_or_else(|| RpcError::task_not_found(id))?;
        if !self.sees(&session_id)? {
            return Err(RpcError::task_not_found(id));
        }
        Ok((session_id, turn))
    }
}

/// Routes a method.
pub(crate) async fn dispatch(ctx: &Ctx, method: &str, params: Value) -> Result<Answer, RpcError> {
    match method {
        "SendMessage" => send(ctx, params, false).await,
        "SendStreamingMessage" => send(ctx, params, true).await,
        "GetTask" => get_task(ctx, params).map(Answer::Value),
        "ListTasks" => list_tasks(ctx, params).await.map(Answer::Value),
        "CancelTask" => cancel_task(ctx, params).await.map(Answer::Value),
        "SubscribeToTask" => subscribe(ctx, params).await,
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => Err(RpcError::a2a(
            A2aErrorKind::PushNotificationNotSupported,
            "push notifications are not supported (agent card capabilities.pushNotifications is false)",
            &[("method", method.to_owned())],
        )),
        "GetExtendedAgentCard" => Err(RpcError::unsupported(
            "there is no extended agent card (capabilities.extendedAgentCard is false)",
            "no_extended_card",
            &[],
        )),
        _ => Err(RpcError::method_not_found(method)),
    }
}

/// Decodes params, naming the offending field on failure.
fn parse<T: DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_json::from_value::<T>(params.clone()).map_err(|e| {
        let detail = e.to_string();
        // serde names missing fields as "missing field `x`".
        let field = detail
            .split('`')
            .nth(1)
            .map_or_else(|| "params".to_owned(), str::to_owned);
        RpcError::invalid_params(&field, detail)
    })
}

fn history_length(value: Option<i64>, field: &str) -> Result<Option<usize>, RpcError> {
    match value {
        None => Ok(None),
        Some(n) if n < 0 => Err(RpcError::invalid_params(field, "must be 0 or more")),
        Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
    }
}

/// Maps "the session does not exist" to TaskNotFoundError for `task`.
fn task_error(task: &str) -> impl Fn(ControlError) -> RpcError + '_ {
    move |e| match e {
        ControlError::UnknownSession { .. } => RpcError::task_not_found(task),
        other => other.into(),
    }
}

/// The projection of a task's session from its journal (no watcher).
fn load(ctx: &Ctx, id: &str) -> Result<(SessionProjection, TurnId), RpcError> {
    let (session_id, turn_id) = ctx.task(id)?;
    let events = ctx
        .shared
        .node
        .session_events(&session_id, 0)
        .map_err(task_error(id))?;
    let projection =
        SessionProjection::from_events(session_id, events.iter().map(|(i, r)| (*i, r)));
    if projection.task(&turn_id).is_none() {
        return Err(RpcError::task_not_found(id));
    }
    Ok((projection, turn_id))
}

fn to_value<T: serde::Serialize>(value: &T) -> Result<Value, RpcError> {
    serde_json::to_value(value).map_err(RpcError::internal)
}

/// `GetTask {id, historyLength?}` (spec §3.1.3).
fn get_task(ctx: &Ctx, params: Value) -> Result<Value, RpcError> {
    let request: GetTaskRequest = parse(params)?;
    let history = history_length(request.history_length, "historyLength")?;
    let (projection, turn) = load(ctx, &request.id)?;
    let view = projection
        .task(&turn)
        .ok_or_else(|| RpcError::task_not_found(&request.id))?;
    to_value(&view.to_task(history, true))
}

/// What a message does to its target.
enum Action {
    /// Start a new turn on the session.
    Prompt,
    /// Resume this suspension with the message as input.
    Resume(Option<String>),
    /// Steer the running turn.
    Inject,
}

/// `SendMessage` / `SendStreamingMessage` (spec §3.1.1, §3.1.2, §3.4).
async fn send(ctx: &Ctx, params: Value, streaming: bool) -> Result<Answer, RpcError> {
    let request: SendMessageRequest = parse(params)?;
    let message = request.message;
    let config = request.configuration.unwrap_or_default();
    if message.role != Role::User {
        return Err(RpcError::invalid_params(
            "message.role",
            "must be ROLE_USER",
        ));
    }
    if message.message_id.trim().is_empty() {
        return Err(RpcError::invalid_params(
            "message.messageId",
            "must be a non-empty string",
        ));
    }
    if config.task_push_notification_config.is_some() {
        return Err(RpcError::a2a(
            A2aErrorKind::PushNotificationNotSupported,
            "push notifications are not supported (capabilities.pushNotifications is false)",
            &[("field", "configuration.taskPushNotificationConfig".into())],
        ));
    }
    let history = history_length(config.history_length, "configuration.historyLength")?;
    let options = &ctx.shared.options;
    let node = &ctx.shared.node;
    let blocks = content::to_blocks(&message, options.message_ids_in_prompt)?;
    let model_text = Prompt(blocks.clone()).to_model_text();

    // The target: an existing task, an existing or new context.
    let (session_id, mut turn, action) = match &message.task_id {
        Some(id) => {
            let (session_id, turn) = ctx.task(id)?;
            if message
                .context_id
                .as_ref()
                .is_some_and(|c| *c != session_id.0)
            {
                return Err(RpcError::invalid_params(
                    "message.contextId",
                    format!("does not match the context of task {id} ({})", session_id.0),
                ));
            }
            let (projection, _) = load(ctx, id)?;
            let view = projection
                .task(&turn)
                .ok_or_else(|| RpcError::task_not_found(id))?;
            let action = match view.state {
                s if s.is_terminal() => {
                    return Err(RpcError::unsupported(
                        format!("task {id} is in a terminal state and accepts no further messages"),
                        "task_terminal",
                        &[("taskId", id.clone())],
                    ))
                }
                TaskState::InputRequired => match view.berth.get("suspension") {
                    Some(s) => Action::Resume(s["handle"].as_str().map(str::to_owned)),
                    None => {
                        return Err(RpcError::unsupported(
                            format!("task {id} waits for a tool approval, which an ACP client of the session answers"),
                            "awaiting_approval",
                            &[("taskId", id.clone())],
                        ))
                    }
                },
                _ => Action::Inject,
            };
            (session_id, Some(turn), action)
        }
        None => {
            let session_id = match &message.context_id {
                Some(c) => SessionId(c.clone()),
                None => SessionId(node.config().ids.new_id("ctx")),
            };
            ensure_context(ctx, &session_id).await?;
            (session_id, None, Action::Prompt)
        }
    };

    let mut follower = Follower::attach(node, &session_id)
        .await
        .map_err(RpcError::from)?;
    let input = Some(Value::String(model_text));
    let resume = |handle: Option<String>| ResumeParams {
        handle,
        input: input.clone(),
        continue_transcript: true,
        cause: ResumeCause::ExplicitResume,
        actor: ctx.actor.clone(),
        lateness_ms: None,
        message_id: Some(message.message_id.clone()),
        trigger: None,
    };
    // Only a message that started a task may be answered with a direct
    // Message (a task once created answers as a task: life-of-a-task.md).
    let new_task = matches!(action, Action::Prompt);
    match action {
        Action::Resume(handle) => {
            let outcome = node.resume(&session_id, resume(handle)).await?;
            turn = outcome.turn_id.or(turn);
        }
        Action::Inject => {
            node.inject(
                &session_id,
                "steer",
                &Value::Array(blocks.clone()),
                &ctx.actor,
            )
            .await?;
        }
        Action::Prompt => {
            let started = start_prompt(
                ctx,
                &session_id,
                &mut follower,
                Prompt(blocks.clone()),
                &message.message_id,
            )
            .await;
            turn = Some(match started {
                Ok(turn) => turn,
                // An idle parked context: the message resumes it, starting
                // the task (resume of an idle suspension with input).
                Err(ControlError::SessionSuspended { .. })
                    if node
                        .suspension(&session_id)?
                        .is_some_and(|s| s.turn_id.is_none()) =>
                {
                    node.resume(&session_id, resume(None))
                        .await?
                        .turn_id
                        .ok_or_else(|| RpcError::internal("the resume started no task"))?
                }
                Err(ControlError::SessionSuspended { session_id, handle }) => {
                    let parked = node
                        .suspension(&session_id)?
                        .and_then(|s| s.turn_id)
                        .map(|t| task_id(&session_id, &t))
                        .unwrap_or_default();
                    return Err(RpcError::unsupported(
                        format!("context {session_id} is suspended with task {parked} waiting for input: send the message with that taskId to resume it"),
                        "context_suspended",
                        &[("contextId", session_id.0.clone()), ("handle", handle), ("taskId", parked)],
                    ));
                }
                Err(e) => return Err(e.into()),
            });
        }
    }
    let Some(turn) = turn else {
        return Err(RpcError::internal("no task came of the message"));
    };
    follower.catch_up();
    if follower.projection.task(&turn).is_none() {
        // A fresh turn a resume started: its `turn_started` is on its way.
        wait_for(&mut follower, &turn, |v| v.is_some()).await?;
    }
    let task_id = task_id(&session_id, &turn);
    if streaming {
        return Ok(Answer::Stream(stream_task(follower, turn, history, true)));
    }
    if !config.return_immediately {
        // Blocking: until terminal or interrupted (spec §3.2.2). The state
        // the action leaves first (working) is folded already.
        wait_for(&mut follower, &turn, |v| {
            v.is_some_and(|v| v.state.is_terminal() || v.state.is_interrupted())
        })
        .await?;
    }
    let view = follower
        .projection
        .task(&turn)
        .ok_or_else(|| RpcError::task_not_found(&task_id))?;
    // The agent answered with a direct reply and nothing else: a Message
    // (spec §3.1.1). Streaming and non-blocking sends committed to a Task
    // before the agent spoke; there the reply is the status message.
    if new_task && !config.return_immediately {
        if let Some(message) = view.direct_reply() {
            return Ok(Answer::Value(json!({ "message": message })));
        }
    }
    Ok(Answer::Value(json!({"task": view.to_task(history, true)})))
}

/// Makes sure the context's session exists: an unknown `contextId` becomes
/// a new session with that id (cwd `<workspace_root>/<contextId>`, created
/// 0700 with the root), recording the caller as its creator. A context a
/// confined caller may not see cannot be taken: `-32602` on
/// `message.contextId` (its id is in use), nothing else said about it.
async fn ensure_context(ctx: &Ctx, session_id: &SessionId) -> Result<(), RpcError> {
    let node = &ctx.shared.node;
    let unavailable = || {
        let mut e = RpcError::invalid_params(
            "message.contextId",
            "this contextId is not available to this caller: omit it, or choose another",
        );
        e.data["reason"] = json!("context_unavailable");
        e
    };
    match node.ensure_exists(session_id).await {
        Ok(()) if ctx.sees(session_id)? => return Ok(()),
        Ok(()) => return Err(unavailable()),
        Err(ControlError::UnknownSession { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    berth_actors::node::validate_session_id(session_id).map_err(|_| {
        RpcError::invalid_params(
            "message.contextId",
            "this agent cannot accept it: a new contextId must be 1 to 128 characters of A-Z a-z 0-9 . _ : -",
        )
    })?;
    let cwd = ctx.shared.options.workspace_root.join(&session_id.0);
    // Not the client's fault: the server's contexts dir is unusable.
    let path = cwd.display().to_string();
    let dir_error = |detail: String| {
        let mut e = RpcError::internal(format!(
            "the context's working directory {path} is unusable: {detail}"
        ));
        e.data = json!({
            "reason": "context_dir_unusable",
            "path": path,
            "detail": detail,
            "hint": "check the server's --a2a-contexts-dir / [a2a] contexts_dir",
        });
        e
    };
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&cwd)
            .map_err(|e| dir_error(e.to_string()))?;
    }
    let created = node
        .new_session_by(
            NewSession {
                cwd,
                additional_directories: Vec::new(),
                mcp_servers: Vec::new(),
                parent_session_id: None,
                labels: vec!["a2a".into()],
                session_id: Some(session_id.clone()),
            },
            ctx.creator.as_deref(),
        )
        .await;
    match created {
        Ok(_) => Ok(()),
        // Created meanwhile by a racing request: use it if it may.
        Err(ControlError::InvalidParams { .. }) if node.ensure_exists(session_id).await.is_ok() => {
            if ctx.sees(session_id)? {
                Ok(())
            } else {
                Err(unavailable())
            }
        }
        Err(ControlError::InvalidParams { field, reason }) if field == "sessionId" => {
            Err(RpcError::invalid_params("message.contextId", reason))
        }
        // The session's directory was refused (cwd, roots): the server's.
        Err(ControlError::InvalidParams { field, reason }) => {
            Err(dir_error(format!("{field}: {reason}")))
        }
        Err(e) => Err(e.into()),
    }
}

/// Starts a turn and returns its id once `turn_started` is durable; the turn
/// runs on (its prompt call is not awaited here).
async fn start_prompt(
    ctx: &Ctx,
    session_id: &SessionId,
    follower: &mut Follower,
    prompt: Prompt,
    message_id: &str,
) -> Result<TurnId, ControlError> {
    let node = ctx.shared.node.clone();
    let sid = session_id.clone();
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    // In the request's span, so the turn is in the caller's trace.
    let span = tracing::Span::current();
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            let _ = tx.send(node.prompt(&sid, prompt).await);
        },
        span,
    ));
    loop {
        tokio::select! {
            biased;
            changes = follower.next() => {
                let Some(changes) = changes else {
                    return Err(ControlError::ActorFailed("the session stopped".into()));
                };
                for (turn, change) in changes {
                    let ours = change == Change::Started
                        && follower
                            .projection
                            .task(&turn)
                            .and_then(|v| v.history.first())
                            .is_some_and(|m| m.message_id == message_id);
                    if ours {
                        return Ok(turn);
                    }
                }
            }
            result = &mut rx => {
                return match result {
                    Ok(Ok(outcome)) => {
                        follower.catch_up();
                        Ok(outcome.turn_id)
                    }
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(ControlError::ActorFailed("the prompt task ended".into())),
                };
            }
        }
    }
}

/// Folds live changes until `done` holds for the turn's task.
async fn wait_for(
    follower: &mut Follower,
    turn: &TurnId,
    done: impl Fn(Option<&TaskView>) -> bool,
) -> Result<(), RpcError> {
    while !done(follower.projection.task(turn)) {
        if follower.next().await.is_none() {
            return Err(RpcError::internal("the session stopped while the task ran"));
        }
    }
    Ok(())
}

/// The SSE events of a task: the Task first, then its status and artifact
/// updates, until it is terminal (or, with `stop_when_interrupted`,
/// input-required: a suspended task may wait for days).
fn stream_task(
    follower: Follower,
    turn: TurnId,
    history: Option<usize>,
    stop_when_interrupted: bool,
) -> std::pin::Pin<Box<dyn futures::Stream<Item = Value> + Send>> {
    struct State {
        follower: Follower,
        turn: TurnId,
        history: Option<usize>,
        queue: std::collections::VecDeque<Value>,
        started: bool,
        done: bool,
        stop_when_interrupted: bool,
    }
    let state = State {
        follower,
        turn,
        history,
        queue: Default::default(),
        started: false,
        done: false,
        stop_when_interrupted,
    };
    let stream = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(item) = s.queue.pop_front() {
                return Some((item, s));
            }
            if s.done {
                return None;
            }
            let ends = |v: &TaskView, stop: bool| {
                v.state.is_terminal() || (stop && v.state.is_interrupted())
            };
            if !s.started {
                s.started = true;
                let view = s.follower.projection.task(&s.turn)?;
                s.done = ends(view, s.stop_when_interrupted);
                let task = StreamResponse::Task(view.to_task(s.history, true));
                s.queue
                    .push_back(serde_json::to_value(task).unwrap_or(Value::Null));
                continue;
            }
            let Some(changes) = s.follower.next().await else {
                let e = RpcError::internal("the session stopped while the task was streamed");
                s.queue.push_back(json!({"error": e.to_value()}));
                s.done = true;
                continue;
            };
            for (turn, change) in changes {
                if turn != s.turn {
                    continue;
                }
                let Some(view) = s.follower.projection.task(&s.turn) else {
                    continue;
                };
                let event = match change {
                    Change::Started => continue,
                    Change::Status => {
                        s.done = ends(view, s.stop_when_interrupted);
                        StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
                            task_id: view.id(),
                            context_id: view.session_id.0.clone(),
                            status: view.status(),
                            metadata: view.metadata(),
                        })
                    }
                    Change::Artifact {
                        artifact,
                        append,
                        last_chunk,
                    } => StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
                        task_id: view.id(),
                        context_id: view.session_id.0.clone(),
                        artifact,
                        append,
                        last_chunk,
                    }),
                };
                s.queue
                    .push_back(serde_json::to_value(event).unwrap_or(Value::Null));
            }
        }
    });
    stream.boxed()
}

/// `SubscribeToTask {id}` (spec §3.1.6): the Task first, then its updates
/// until a terminal state; a terminal task answers `-32004`.
async fn subscribe(ctx: &Ctx, params: Value) -> Result<Answer, RpcError> {
    let request: TaskIdRequest = parse(params)?;
    let (session_id, turn) = ctx.task(&request.id)?;
    let follower = Follower::attach(&ctx.shared.node, &session_id)
        .await
        .map_err(task_error(&request.id))?;
    let view = follower
        .projection
        .task(&turn)
        .ok_or_else(|| RpcError::task_not_found(&request.id))?;
    if view.state.is_terminal() {
        return Err(RpcError::unsupported(
            format!(
                "task {} is in a terminal state; there is nothing to subscribe to",
                request.id
            ),
            "task_terminal",
            &[("taskId", request.id.clone())],
        ));
    }
    Ok(Answer::Stream(stream_task(follower, turn, None, false)))
}

/// `CancelTask {id}` (spec §3.1.5): `session/cancel` of the task's session,
/// answered with the task once it stopped. Idempotent: a canceled task
/// answers itself; another terminal task `-32002`.
async fn cancel_task(ctx: &Ctx, params: Value) -> Result<Value, RpcError> {
    let request: TaskIdRequest = parse(params)?;
    let id = &request.id;
    let (session_id, turn) = ctx.task(id)?;
    let node = &ctx.shared.node;
    let mut follower = Follower::attach(node, &session_id)
        .await
        .map_err(task_error(id))?;
    let view = follower
        .projection
        .task(&turn)
        .ok_or_else(|| RpcError::task_not_found(id))?;
    match view.state {
        TaskState::Canceled => return to_value(&view.to_task(None, true)),
        s if s.is_terminal() => {
            return Err(RpcError::a2a(
                A2aErrorKind::TaskNotCancelable,
                format!("task {id} already ended ({s:?}) and cannot be canceled"),
                &[("taskId", id.clone())],
            ))
        }
        _ => {}
    }
    node.cancel(&session_id, &ctx.actor).await?;
    let wait = Duration::from_millis(ctx.shared.options.cancel_wait_ms);
    let _ = tokio::time::timeout(
        wait,
        wait_for(&mut follower, &turn, |v| {
            v.is_some_and(|v| v.state.is_terminal())
        }),
    )
    .await;
    let view = follower
        .projection
        .task(&turn)
        .ok_or_else(|| RpcError::task_not_found(id))?;
    to_value(&view.to_task(None, true))
}

/// A `ListTasks` cursor: the last task of the previous page.
fn encode_token(at: &DateTime<Utc>, id: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(format!("{}|{id}", at.timestamp_micros()))
}

fn decode_token(token: &str) -> Option<(i64, String)> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (micros, id) = text.split_once('|')?;
    Some((micros.parse().ok()?, id.to_owned()))
}

/// `ListTasks` (spec §3.1.4): tasks of every session the caller sees (or of
/// `contextId`; a confined caller sees only its own contexts),
/// most recently updated first, cursor-paginated; `totalSize` counts every
/// match. Reads each session's log from the journal (a full scan when no
/// `contextId` is given).
async fn list_tasks(ctx: &Ctx, params: Value) -> Result<Value, RpcError> {
    let request: ListTasksRequest = parse(params)?;
    let page_size = request.page_size.unwrap_or(DEFAULT_PAGE_SIZE);
    if !(1..=MAX_PAGE_SIZE).contains(&page_size) {
        return Err(RpcError::invalid_params(
            "pageSize",
            format!("must be between 1 and {MAX_PAGE_SIZE}, got {page_size}"),
        ));
    }
    let history = history_length(request.history_length, "historyLength")?.or(Some(0));
    let status: Option<TaskState> = match &request.status {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "TASK_STATE_UNSPECIFIED" || s.is_empty() => None,
        Some(v) => Some(serde_json::from_value(v.clone()).map_err(|_| {
            RpcError::invalid_params(
                "status",
                format!("{v} is not a TaskState (TASK_STATE_WORKING, …)"),
            )
        })?),
    };
    let after: Option<DateTime<Utc>> = match &request.status_timestamp_after {
        None => None,
        Some(s) => Some(
            DateTime::parse_from_rfc3339(s)
                .map_err(|e| RpcError::invalid_params("statusTimestampAfter", e))?
                .with_timezone(&Utc),
        ),
    };
    let cursor = match request.page_token.as_deref() {
        None | Some("") => None,
        Some(token) => Some(decode_token(token).ok_or_else(|| {
            RpcError::invalid_params("pageToken", "not a token this server issued")
        })?),
    };
    let node = &ctx.shared.node;
    let sessions: Vec<SessionId> = match &request.context_id {
        Some(c) if !c.is_empty() => {
            let id = SessionId(c.clone());
            if ctx.sees(&id)? {
                vec![id]
            } else {
                Vec::new()
            }
        }
        _ => {
            let mut ids = Vec::new();
            let mut next: Option<SessionId> = None;
            loop {
                let (page, more) = node.list(None, next.as_ref(), 500).await?;
                ids.extend(
                    page.into_iter()
                        .filter(|s| !ctx.confined || ctx.created(s.record.created_by.as_deref()))
                        .map(|s| s.record.session_id),
                );
                match more {
                    Some(c) => next = Some(c),
                    None => break,
                }
            }
            ids
        }
    };
    let mut matches: Vec<TaskView> = Vec::new();
    for session_id in sessions {
        let events = match node.session_events(&session_id, 0) {
            Ok(events) => events,
            Err(ControlError::UnknownSession { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let projection =
            SessionProjection::from_events(session_id, events.iter().map(|(i, r)| (*i, r)));
        matches.extend(
            projection
                .tasks()
                .iter()
                .filter(|v| {
                    status.is_none_or(|s| v.state == s) && after.is_none_or(|a| v.updated_at > a)
                })
                .cloned(),
        );
    }
    // Most recently updated first; the id breaks ties (a total order the
    // cursor can resume from).
    let key = |v: &TaskView| (std::cmp::Reverse(v.updated_at.timestamp_micros()), v.id());
    matches.sort_by_key(key);
    let total = matches.len();
    let start = match &cursor {
        None => 0,
        Some((micros, id)) => {
            let last = (std::cmp::Reverse(*micros), id.clone());
            matches.partition_point(|v| key(v) <= last)
        }
    };
    let page: Vec<&TaskView> = matches
        .iter()
        .skip(start)
        .take(page_size as usize)
        .collect();
    let next = if start + page.len() < total {
        page.last()
            .map(|v| encode_token(&v.updated_at, &v.id()))
            .unwrap_or_default()
    } else {
        String::new()
    };
    let include_artifacts = request.include_artifacts.unwrap_or(false);
    let tasks: Vec<_> = page
        .iter()
        .map(|v| v.to_task(history, include_artifacts))
        .collect();
    Ok(json!({
        "tasks": tasks,
        "nextPageToken": next,
        "pageSize": page_size,
        "totalSize": total,
    }))
}
