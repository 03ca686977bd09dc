//! One client connection.
//!
//! Inbound frames are read in order; each request runs as its own task, so a
//! `session/cancel` or `session/list` never waits behind a running
//! `session/prompt`. At most [`ServeOptions::max_in_flight`] requests run at
//! once; past that a request is refused at once with -32007 (the reader never
//! blocks, so a cancel can always get through). Everything outbound — responses
//! and notifications — goes through one ordered queue to a single writer, so a
//! turn's updates always precede its prompt response.
//!
//! The connection is transport-neutral: [`drive`] reads [`InFrame`]s from
//! any stream (lines on stdio and the control socket, text messages on a
//! WebSocket) and the transport writes what [`OutboundQueue`] yields. Each
//! connection runs as one authenticated [`Principal`]: stdio and the local
//! control socket are the trusted host owner; a WebSocket connection is the
//! bearer token's actor and role.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use berth_actors::{Node, PresenceNotice, Principal, SessionNotice, Watcher};
use berth_runtime::engine::{PermissionDecision, PermissionRequest};
use berth_runtime::event::SessionEvent;
use berth_runtime::ids::SessionId;
use berth_runtime::suspension::Initiator;
use futures::{Stream, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::jsonrpc::{classify, encode_error, encode_result, Incoming, RpcError};
use crate::methods;
use crate::render::{render_notice, render_presence, RenderOptions};
use crate::transport::framing::{read_frame, Frame};

/// Bounds of a connection.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Longest accepted frame (bytes, default 8 MiB); longer ones are refused
    /// with -32600 without being read into memory whole.
    pub max_frame_bytes: usize,
    /// Requests handled at once (default 64); more are refused with -32007.
    pub max_in_flight: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            max_frame_bytes: 8 * 1024 * 1024,
            max_in_flight: 64,
        }
    }
}

static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

/// A connection's shared state, handed to every method handler.
pub struct Connection {
    /// Unique per process; also the connection's watcher id.
    pub id: u64,
    /// The node.
    pub node: Node,
    /// Who this connection is: receipts record its actor, and its role
    /// decides which methods it may call.
    pub principal: Principal,
    outbound: Outbound,
    requests: Arc<ClientRequests>,
    /// This connection as a watcher: one for every session it watches (a
    /// parked session keeps its watchers while passivated, so a watcher per
    /// attach cost 112 bytes per watched session).
    watcher: Arc<ConnectionWatcher>,
    attached: Mutex<HashSet<SessionId>>,
    /// The `clientCapabilities` sent in `initialize` (null before).
    pub client_capabilities: Mutex<Value>,
    /// The berth extensions the client declared in
    /// `clientCapabilities._meta.berth`.
    pub extensions: Arc<ClientExtensions>,
}

/// What a client declared it understands, under
/// `clientCapabilities._meta.berth` in `initialize`:
/// `suspendUpdates: true` — `session/update` variants `suspended` and
/// `resumed` (the stock ACP client rejects unknown variants, so others get
/// these facts as `_berth/agentEvent`); `awaitResumption: true` — berth sends
/// it the `session/await_resumption` request when the agent parks itself.
#[derive(Debug, Default)]
pub struct ClientExtensions {
    /// Understands `session/update` `suspended` / `resumed`.
    pub suspend_updates: std::sync::atomic::AtomicBool,
    /// Wants `session/await_resumption` requests.
    pub await_resumption: std::sync::atomic::AtomicBool,
}

impl ClientExtensions {
    /// Reads the declaration from `clientCapabilities` (a JSON object).
    pub fn declare(&self, capabilities: &Value) {
        let berth = &capabilities["_meta"]["berth"];
        let flag = |key: &str| berth.get(key).and_then(Value::as_bool).unwrap_or(false);
        self.suspend_updates
            .store(flag("suspendUpdates"), Ordering::Release);
        self.await_resumption
            .store(flag("awaitResumption"), Ordering::Release);
    }
}

/// The sending half of a connection's outbound queue, bounded in bytes: a
/// client that stops reading while frames pile up past the bound is cut off
/// (its connection closes; it reconnects and catches up with
/// `session/load` + `_meta.berth.lastEventId`), so a slow consumer cannot
/// grow the server's memory without limit. The watcher side never blocks.
#[derive(Clone)]
pub struct Outbound {
    tx: mpsc::UnboundedSender<String>,
    queued_bytes: Arc<AtomicU64>,
    /// The transport's total over all its connections, when it keeps one.
    total_bytes: Option<Arc<AtomicU64>>,
    limit_bytes: u64,
    overflowed: Arc<std::sync::atomic::AtomicBool>,
    closing: CancellationToken,
    /// Signalled whenever the writer takes a frame (queue space freed).
    drained: Arc<tokio::sync::Notify>,
}

impl Outbound {
    /// Queues a frame. Returns `false` when the connection is closing or the
    /// frame would pass the bound (which starts closing the connection).
    pub fn send(&self, frame: String) -> bool {
        if self.closing.is_cancelled() {
            return false;
        }
        let bytes = frame.len() as u64;
        let before = self.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        if before.saturating_add(bytes) > self.limit_bytes {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.overflowed.store(true, Ordering::Release);
            tracing::warn!(
                queued_bytes = before,
                limit_bytes = self.limit_bytes,
                "a client is not reading its frames; closing its connection"
            );
            self.closing.cancel();
            return false;
        }
        if let Some(total) = &self.total_bytes {
            total.fetch_add(bytes, Ordering::AcqRel);
        }
        if self.tx.send(frame).is_err() {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            if let Some(total) = &self.total_bytes {
                total.fetch_sub(bytes, Ordering::AcqRel);
            }
            return false;
        }
        true
    }

    /// Queues the end mark (an empty frame, which no message is) behind
    /// everything queued so far: the writer stops there. Sent once
    /// `closing` is cancelled, when `send` refuses frames: only a frame
    /// racing the cut can land behind the mark, and it goes with the
    /// connection, as anything decided at the cut does.
    fn end(&self) {
        let _ = self.tx.send(String::new());
    }

    /// Waits until at most `bytes` are queued. `false` when the connection
    /// closes first.
    async fn wait_below(&self, bytes: u64) -> bool {
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.closing.is_cancelled() {
                return false;
            }
            if self.queued_bytes.load(Ordering::Acquire) <= bytes {
                return true;
            }
            tokio::select! {
                () = drained => {}
                () = self.closing.cancelled() => return false,
            }
        }
    }
}

/// The receiving half of a connection's outbound queue (the transport's
/// writer reads it).
pub struct OutboundQueue {
    rx: mpsc::UnboundedReceiver<String>,
    queued_bytes: Arc<AtomicU64>,
    total_bytes: Option<Arc<AtomicU64>>,
    overflowed: Arc<std::sync::atomic::AtomicBool>,
    drained: Arc<tokio::sync::Notify>,
}

impl OutboundQueue {
    /// The next frame; `None` once every sender is gone.
    pub async fn recv(&mut self) -> Option<String> {
        let frame = self.rx.recv().await?;
        let bytes = frame.len() as u64;
        self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
        self.drained.notify_waiters();
        if let Some(total) = &self.total_bytes {
            total.fetch_sub(bytes, Ordering::AcqRel);
        }
        Some(frame)
    }

    /// Bytes of frames waiting in this queue right now.
    pub fn queued_bytes(&self) -> u64 {
        self.queued_bytes.load(Ordering::Acquire)
    }

    /// Whether no frame is waiting right now.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }

    /// Whether the connection was cut off because its client stopped
    /// reading (the queue passed its bound).
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }
}

impl Drop for OutboundQueue {
    /// The frames left unsent are freed with the queue: they leave the
    /// transport's total (a frame racing the drop is refused and never
    /// counted).
    fn drop(&mut self) {
        self.rx.close();
        while let Ok(frame) = self.rx.try_recv() {
            let bytes = frame.len() as u64;
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            if let Some(total) = &self.total_bytes {
                total.fetch_sub(bytes, Ordering::AcqRel);
            }
        }
    }
}

/// One inbound unit of a transport.
#[derive(Debug, PartialEq, Eq)]
pub enum InFrame {
    /// One JSON-RPC message (a line, or a WebSocket text message).
    Message(Vec<u8>),
    /// A message over the size bound, discarded; `bytes` is its length.
    TooLarge {
        /// Its length (bytes).
        bytes: usize,
    },
    /// A WebSocket binary message (JSON-RPC rides in text frames only).
    Binary,
}

impl Connection {
    /// A connection of `principal` on `node` whose outbound queue holds at
    /// most `max_outbound_bytes`, with the queue its writer drains and the
    /// token that is cancelled when the connection must close (the queue
    /// overflowed, or the transport cancels it).
    pub fn open(
        node: Node,
        principal: Option<Principal>,
        max_outbound_bytes: u64,
    ) -> (Arc<Self>, OutboundQueue, CancellationToken) {
        Self::open_counted(node, principal, max_outbound_bytes, None)
    }

    /// [`Connection::open`], also counting the bytes waiting in its queue
    /// into `total_bytes` (a transport's sum over its connections).
    pub fn open_counted(
        node: Node,
        principal: Option<Principal>,
        max_outbound_bytes: u64,
        total_bytes: Option<Arc<AtomicU64>>,
    ) -> (Arc<Self>, OutboundQueue, CancellationToken) {
        let (tx, rx) = mpsc::unbounded_channel::<String>();
        let queued_bytes = Arc::new(AtomicU64::new(0));
        let overflowed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let closing = CancellationToken::new();
        let drained = Arc::new(tokio::sync::Notify::new());
        let id = NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed);
        let principal = principal.unwrap_or_else(|| Principal::local(format!("acp:{id}")));
        let outbound = Outbound {
            tx,
            queued_bytes: Arc::clone(&queued_bytes),
            total_bytes: total_bytes.clone(),
            limit_bytes: max_outbound_bytes,
            overflowed: Arc::clone(&overflowed),
            closing: closing.clone(),
            drained: Arc::clone(&drained),
        };
        let requests = Arc::<ClientRequests>::default();
        let extensions = Arc::<ClientExtensions>::default();
        let watcher = Arc::new(ConnectionWatcher {
            id,
            principal: principal.clone(),
            outbound: outbound.clone(),
            requests: Arc::clone(&requests),
            extensions: Arc::clone(&extensions),
        });
        let conn = Arc::new(Connection {
            id,
            node,
            principal,
            outbound,
            requests,
            watcher,
            attached: Mutex::default(),
            client_capabilities: Mutex::new(Value::Null),
            extensions,
        });
        (
            conn,
            OutboundQueue {
                rx,
                queued_bytes,
                total_bytes,
                overflowed,
                drained,
            },
            closing,
        )
    }

    /// Queues a frame for the writer. Returns `false` when the writer is gone.
    pub fn send(&self, frame: String) -> bool {
        self.outbound.send(frame)
    }

    /// Waits until at most half of the outbound bound is queued, so that a
    /// producer that pages through a long stream (a `session/load` replay)
    /// stays under the bound for a client that reads. `false` when the
    /// connection closes first (a client that stops reading is closed by its
    /// transport's send deadline).
    pub async fn wait_for_room(&self) -> bool {
        self.outbound
            .wait_below(self.outbound.limit_bytes / 2)
            .await
    }

    /// Who this connection is in receipts (`control_outcome.actor`): the
    /// authenticated actor, never what the client claims.
    pub fn actor(&self) -> String {
        self.principal.actor.clone()
    }

    /// This connection as a session watcher (the same one for every
    /// session it watches).
    pub fn watcher(&self) -> Arc<dyn Watcher> {
        Arc::clone(&self.watcher) as Arc<dyn Watcher>
    }

    /// Routes the client's response to a request berth sent it.
    fn client_answered(&self, id: &Value, payload: Value) {
        let waiting = id.as_u64().and_then(|id| {
            self.requests
                .waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
        });
        match waiting {
            Some(answer) => {
                let _ = answer.send(payload);
            }
            None => tracing::debug!(%id, "response to no request of ours"),
        }
    }

    /// Records that this connection watches `session_id`; returns `false` when
    /// it already did.
    pub fn mark_attached(&self, session_id: &SessionId) -> bool {
        self.attached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(session_id.clone())
    }

    /// Whether this connection watches `session_id`.
    pub fn is_attached(&self, session_id: &SessionId) -> bool {
        self.attached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(session_id)
    }

    /// Attaches this connection to a session it does not watch yet (no replay).
    ///
    /// # Errors
    /// As [`Node::attach`].
    pub async fn ensure_attached(&self, session_id: &SessionId) -> Result<(), RpcError> {
        let known = self
            .attached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(session_id);
        if !known {
            self.node.attach(session_id, self.watcher(), false).await?;
            self.mark_attached(session_id);
        }
        Ok(())
    }
}

/// Requests berth sent the client, waiting for its answer, by request id.
#[derive(Default)]
struct ClientRequests {
    next_id: AtomicU64,
    waiting: Mutex<std::collections::HashMap<u64, oneshot::Sender<Value>>>,
    /// The client's input ended: it can answer nothing any more.
    closed: std::sync::atomic::AtomicBool,
}

impl ClientRequests {
    /// A new request id and the receiver of the client's answer; `None` once
    /// the client is gone.
    fn register(&self) -> Option<(u64, oneshot::Receiver<Value>)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (answered, answer) = oneshot::channel::<Value>();
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        waiting.insert(id, answered);
        Some((id, answer))
    }

    /// The client is gone: every waiting request is answered "disconnected"
    /// and no new one is sent.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// Renders durable session events onto the connection's outbound queue, and
/// asks the client for approvals (ACP `session/request_permission`).
struct ConnectionWatcher {
    id: u64,
    principal: Principal,
    outbound: Outbound,
    requests: Arc<ClientRequests>,
    extensions: Arc<ClientExtensions>,
}

impl ConnectionWatcher {
    /// Sends the RFC's `session/await_resumption` (agent → client) for a live
    /// agent self-park. The client's answer is informational: berth holds
    /// the suspension and assigned the handle (in `_meta.berth`).
    fn await_resumption(&self, notice: &SessionNotice) {
        let SessionEvent::Suspended {
            handle,
            reason,
            initiator: Initiator::Agent,
            suspended_at,
            resume_when,
            summary,
            ..
        } = &notice.record.event
        else {
            return;
        };
        if notice.replayed || !self.extensions.await_resumption.load(Ordering::Acquire) {
            return;
        }
        let Some((id, answer)) = self.requests.register() else {
            return;
        };
        let mut params = json!({
            "sessionId": notice.session_id,
            "reason": reason.clone().unwrap_or_default(),
            "conditions": resume_when,
            "summary": summary,
            "_meta": {"berth": {
                "handle": handle,
                "suspendedAt": suspended_at,
                "eventId": notice.event_id,
            }},
        });
        // The RFC's optional fields are omitted rather than null.
        if let Value::Object(fields) = &mut params {
            fields.retain(|_, v| !v.is_null());
        }
        let frame = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "session/await_resumption",
            "params": params,
        });
        if self.outbound.send(frame.to_string()) {
            tokio::spawn(async move {
                if let Ok(reply) = answer.await {
                    tracing::debug!(%reply, "client answered session/await_resumption");
                }
            });
        }
    }
}

impl Watcher for ConnectionWatcher {
    fn watcher_id(&self) -> u64 {
        self.id
    }

    fn notify(&self, notice: &SessionNotice) -> bool {
        // A prompt this connection sent is not echoed back to it live (it
        // shows the user's message already); other watchers and a later
        // `session/load` replay get it.
        if notice.origin == Some(self.id)
            && matches!(notice.record.event, SessionEvent::TurnStarted { .. })
        {
            return true;
        }
        let options = RenderOptions {
            suspend_updates: self.extensions.suspend_updates.load(Ordering::Acquire),
        };
        let sent = render_notice(notice, options)
            .into_iter()
            .all(|frame| self.outbound.send(frame));
        self.await_resumption(notice);
        sent
    }

    fn principal(&self) -> Option<Principal> {
        Some(self.principal.clone())
    }

    fn presence(&self, notice: &PresenceNotice) -> bool {
        self.outbound.send(render_presence(notice))
    }

    /// Only a client that may control the session is asked: an observer
    /// watches a tool call wait, it never approves one.
    fn request_permission(
        &self,
        session_id: &SessionId,
        request: &PermissionRequest,
    ) -> Option<oneshot::Receiver<PermissionDecision>> {
        if !self.principal.may(berth_actors::Role::Controller) {
            return None;
        }
        let (id, answer) = self.requests.register()?;
        let frame = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "session/request_permission",
            "params": permission_params(session_id, request),
        });
        if !self.outbound.send(frame.to_string()) {
            return None;
        }
        let (decided, decision) = oneshot::channel();
        tokio::spawn(async move {
            let decision = match answer.await {
                Ok(payload) => decision_of(&payload),
                Err(_) => PermissionDecision::Rejected {
                    reason: "the client disconnected before answering".into(),
                },
            };
            let _ = decided.send(decision);
        });
        Some(decision)
    }
}

/// ACP `RequestPermissionRequest` params for a waiting call: options
/// `allow` (allow_once) and `reject` (reject_once).
fn permission_params(session_id: &SessionId, request: &PermissionRequest) -> Value {
    use agent_client_protocol_schema::v1::{
        PermissionOption, PermissionOptionKind, RequestPermissionRequest, ToolCallUpdate,
        ToolCallUpdateFields,
    };
    let fields = ToolCallUpdateFields::new()
        .title(request.title.clone())
        .raw_input(request.raw_input.clone());
    let params = RequestPermissionRequest::new(
        session_id.to_string(),
        ToolCallUpdate::new(request.tool_call_id.to_string(), fields),
        vec![
            PermissionOption::new("allow", "Allow", PermissionOptionKind::AllowOnce),
            PermissionOption::new("reject", "Reject", PermissionOptionKind::RejectOnce),
        ],
    );
    serde_json::to_value(params).unwrap_or(Value::Null)
}

/// Maps the client's answer: only the offered `allow` option allows; the
/// offered `reject`, any other option id, `cancelled`, an error or nonsense
/// does not.
fn decision_of(payload: &Value) -> PermissionDecision {
    match payload.pointer("/outcome/outcome").and_then(Value::as_str) {
        Some("selected") => match payload.pointer("/outcome/optionId").and_then(Value::as_str) {
            Some("allow") => PermissionDecision::Allowed,
            Some("reject") => PermissionDecision::Rejected {
                reason: "reject".into(),
            },
            Some(other) => PermissionDecision::Rejected {
                reason: format!("unknown option {other:?}"),
            },
            None => PermissionDecision::Rejected {
                reason: "no option was selected".into(),
            },
        },
        Some("cancelled") => PermissionDecision::Cancelled,
        _ => PermissionDecision::Rejected {
            reason: format!("the client answered {payload}"),
        },
    }
}

/// Serves one connection over `reader`/`writer` (one JSON-RPC message per
/// line) as the trusted local host owner, until the reader ends and every
/// in-flight request has been answered.
///
/// # Errors
/// I/O errors of the reader or writer.
pub async fn serve<R, W>(
    node: Node,
    reader: R,
    writer: W,
    options: ServeOptions,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve_as(node, None, reader, writer, options).await
}

/// Bytes a connection's writer gathers before it writes (a pipe's
/// capacity); it also writes whenever its queue runs dry.
const WRITE_BUFFER_BYTES: usize = 64 * 1024;

/// [`serve`] as `principal` (`None`: the trusted local host owner, actor
/// `acp:<connection id>`).
///
/// # Errors
/// I/O errors of the reader or writer.
pub async fn serve_as<R, W>(
    node: Node,
    principal: Option<Principal>,
    reader: R,
    writer: W,
    options: ServeOptions,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve_until(
        node,
        principal,
        reader,
        writer,
        options,
        CancellationToken::new(),
    )
    .await
}

/// [`serve_as`], cut off when `stop` is cancelled (berth shutting down):
/// reading ends, requests in flight are dropped unanswered, no new frame is
/// queued, and the writer finishes writing the frames already queued, whole,
/// then returns. A client that stops reading keeps it waiting: the caller
/// bounds how long it waits for this to return. No outbound bound and no
/// send deadline ([`serve_bounded`] has them).
///
/// # Errors
/// I/O errors of the reader or writer.
pub async fn serve_until<R, W>(
    node: Node,
    principal: Option<Principal>,
    reader: R,
    writer: W,
    options: ServeOptions,
    stop: CancellationToken,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve_bounded(
        node,
        principal,
        reader,
        writer,
        options,
        LineBounds::UNBOUNDED,
        stop,
    )
    .await
}

/// Outbound bounds of a line transport (the control socket, stdio).
#[derive(Debug, Clone, Default)]
pub struct LineBounds {
    /// Bytes of frames that may wait for a client that does not read; one
    /// more frame past it cuts the connection off (nothing more is queued
    /// for it, its input is no longer read, the writer stops at its next
    /// frame). `None`: unbounded.
    pub max_outbound_bytes: Option<u64>,
    /// Longest one write (or flush) may take; past it the connection is
    /// closed and its queue freed. `None`: no deadline.
    pub send_timeout: Option<std::time::Duration>,
    /// A transport-wide total the connection's queued bytes are counted
    /// into (for tests and metrics).
    pub total_bytes: Option<Arc<AtomicU64>>,
}

impl LineBounds {
    /// No bound and no deadline.
    pub const UNBOUNDED: Self = Self {
        max_outbound_bytes: None,
        send_timeout: None,
        total_bytes: None,
    };
}

/// Runs one write of the writer under `deadline`.
async fn write_within(
    deadline: Option<std::time::Duration>,
    write: impl std::future::Future<Output = std::io::Result<()>>,
) -> std::io::Result<()> {
    match deadline {
        None => write.await,
        Some(d) => tokio::time::timeout(d, write).await.unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the client did not take a frame within {} ms",
                    d.as_millis()
                ),
            ))
        }),
    }
}

/// [`serve_until`] with `bounds` on what waits for the client: at most
/// `bounds.max_outbound_bytes` queued (past it the connection is cut off,
/// as the WebSocket transport does), and every write of the writer within
/// `bounds.send_timeout` (past it the connection is closed and its queue
/// freed). A client cut off reconnects and catches up with `session/load`
/// + `_meta.berth.lastEventId`: its events are in the journal.
///
/// # Errors
/// I/O errors of the reader or writer; [`std::io::ErrorKind::TimedOut`]
/// when a write passed the deadline; [`std::io::ErrorKind::WouldBlock`]
/// when the queue passed its bound.
pub async fn serve_bounded<R, W>(
    node: Node,
    principal: Option<Principal>,
    reader: R,
    writer: W,
    options: ServeOptions,
    bounds: LineBounds,
    stop: CancellationToken,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (conn, mut queue, closing) = Connection::open_counted(
        node,
        principal,
        bounds.max_outbound_bytes.unwrap_or(u64::MAX),
        bounds.total_bytes.clone(),
    );
    // Stopping cuts the connection off as an overflow does: no frame is
    // queued after it, so what the writer drains is all there will be.
    let relay = {
        let (closing, outbound) = (closing.clone(), conn.outbound.clone());
        tokio::spawn(async move {
            stop.cancelled().await;
            closing.cancel();
            outbound.end();
        })
    };
    let deadline = bounds.send_timeout;
    let writer_closing = closing.clone();
    let writer_task = tokio::spawn(async move {
        // Buffered: a frame and its newline are one write, and a backlog of
        // frames goes out in a few large writes (flushed whenever the queue
        // runs dry). Unbuffered, every frame cost two writes — over stdio,
        // two round trips through tokio's blocking pool — which capped a
        // busy connection at a few thousand frames a second. The buffer is a
        // pipe's capacity (64 KiB): with tokio's 8 KiB default a burst of
        // 1,000 wake-ups (6,000 frames, 3.6 MB) took 450 of those round
        // trips, and its last turn ended ≈ 4 ms later (`bench-sched`).
        let mut writer = tokio::io::BufWriter::with_capacity(WRITE_BUFFER_BYTES, writer);
        let written = async {
            // Once stopped, the writer ends at the end mark, behind the last
            // frame queued (watchers may still hold senders it would
            // otherwise wait for).
            while let Some(frame) = queue.recv().await {
                if queue.overflowed() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::WouldBlock,
                        "the client is not reading its frames",
                    ));
                }
                if frame.is_empty() {
                    break;
                }
                write_within(deadline, writer.write_all(frame.as_bytes())).await?;
                write_within(deadline, writer.write_all(b"\n")).await?;
                if queue.is_empty() {
                    write_within(deadline, writer.flush()).await?;
                }
            }
            write_within(deadline, writer.flush()).await
        }
        .await;
        if written.is_err() {
            // The reader stops too; the queue is freed as this task ends.
            writer_closing.cancel();
        }
        drop(queue);
        written
    });
    let max = options.max_frame_bytes;
    let lines = futures::stream::unfold(BufReader::new(reader), move |mut reader| async move {
        match read_frame(&mut reader, max).await {
            Ok(Frame::Eof) => None,
            Ok(Frame::TooLarge { bytes }) => Some((Ok(InFrame::TooLarge { bytes }), reader)),
            Ok(Frame::Line(line)) => Some((Ok(InFrame::Message(line)), reader)),
            Err(e) => Some((Err(e), reader)),
        }
    });
    let read_result = drive(&conn, Box::pin(lines), closing, options).await;
    relay.abort();
    // The writer stops behind what is queued now (an overflowed connection's
    // writer stops at its next frame instead).
    conn.outbound.end();
    drop(conn);
    let write_result = writer_task
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    read_result.and(write_result)
}

/// Runs a connection: reads frames from `inbound` until it ends, fails or
/// `closing` is cancelled; dispatches each (requests concurrently, at most
/// `options.max_in_flight` at once); then waits for the in-flight requests
/// and detaches the connection from every session it watched. The caller
/// drops its `Arc<Connection>` afterwards so the writer sees the queue end.
///
/// # Errors
/// The first error of `inbound`.
pub async fn drive<S>(
    conn: &Arc<Connection>,
    mut inbound: S,
    closing: CancellationToken,
    options: ServeOptions,
) -> std::io::Result<()>
where
    S: Stream<Item = std::io::Result<InFrame>> + Unpin,
{
    let slots = Arc::new(Semaphore::new(options.max_in_flight));
    let mut tasks = JoinSet::new();
    let read_result = loop {
        let next = tokio::select! {
            next = inbound.next() => next,
            () = closing.cancelled() => break Ok(()),
        };
        let frame = match next {
            None => break Ok(()),
            Some(Err(e)) => break Err(e),
            Some(Ok(InFrame::TooLarge { bytes })) => {
                let mut err = RpcError::invalid_request("frame too large");
                err.data = json!({"reason": "frame_too_large", "bytes": bytes, "limitBytes": options.max_frame_bytes});
                conn.send(encode_error(&Value::Null, &err));
                continue;
            }
            Some(Ok(InFrame::Binary)) => {
                let mut err = RpcError::invalid_request("binary frame");
                err.data = json!({"reason": "binary_frame", "hint": "send each JSON-RPC message as one text frame"});
                conn.send(encode_error(&Value::Null, &err));
                continue;
            }
            Some(Ok(InFrame::Message(message))) => message,
        };
        if frame.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        while tasks.try_join_next().is_some() {}
        match classify(&frame) {
            Err(rejected) => {
                conn.send(encode_error(&rejected.id, &rejected.error));
            }
            Ok(Incoming::Response { id, payload }) => conn.client_answered(&id, payload),
            Ok(Incoming::Notification { method, params }) => {
                let conn = Arc::clone(conn);
                let span = request_span(&method, None, &params);
                tasks.spawn(
                    async move { methods::handle_notification(&conn, &method, params).await }
                        .instrument(span),
                );
            }
            Ok(Incoming::Request { id, method, params }) => {
                let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                    let err = RpcError::new(
                        -32007,
                        "Too many requests in flight",
                        json!({"reason": "too_many_requests", "limit": options.max_in_flight}),
                    );
                    conn.send(encode_error(&id, &err));
                    continue;
                };
                let conn = Arc::clone(conn);
                let span = request_span(&method, Some(&id), &params);
                tasks.spawn(
                    async move {
                        let frame = match methods::handle_request(&conn, &method, params).await {
                            Ok(result) => encode_result(&id, result),
                            Err(err) => {
                                berth_actors::telemetry::record_rpc_error(
                                    &tracing::Span::current(),
                                    err.code,
                                    &err.message,
                                );
                                encode_error(&id, &err)
                            }
                        };
                        conn.send(frame);
                        drop(permit);
                    }
                    .instrument(span),
                );
            }
        }
    };
    // The client's input ended: requests berth sent it will not be answered,
    // so a turn waiting on one must not hold the connection open.
    conn.requests.close();
    if closing.is_cancelled() {
        // Cut off (overflow, liveness, shutdown): nobody reads the answers.
        tasks.abort_all();
    }
    while tasks.join_next().await.is_some() {}
    let sessions: Vec<SessionId> = conn
        .attached
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain()
        .collect();
    for session_id in sessions {
        conn.node.detach(&session_id, conn.id).await;
    }
    read_result
}

/// The span one inbound request or notification runs in (a tracing layer
/// around every method, OpenTelemetry RPC conventions: `rpc.system =
/// jsonrpc`, kind server, named after the method). It is a root, unless the
/// message carries a W3C `traceparent` in `params._meta` (the key ACP
/// reserves for trace context): then that remote span is its parent, and so
/// the ancestor of the work the request starts (a turn, a suspension). An
/// invalid `traceparent` is ignored (W3C Trace Context §4.3).
fn request_span(method: &str, id: Option<&Value>, params: &Value) -> tracing::Span {
    let span = berth_actors::jsonrpc_server_span!("acp.request", "acp", method);
    if span.is_disabled() {
        return span;
    }
    if let Some(id) = id {
        span.record("rpc.jsonrpc.request_id", tracing::field::display(id));
    }
    if let Some(meta) = params.get("_meta") {
        berth_actors::telemetry::adopt_remote_parent(&span, meta);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parked session keeps its watchers while passivated: a connection
    /// that watches 100,000 of them must not hold 100,000 watchers.
    #[tokio::test]
    async fn a_connection_is_one_watcher_for_all_its_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let model =
            berth_runtime::model::scripted::ScriptedModel::parse("", "toml", "scripted:one")
                .unwrap();
        let config = berth_actors::NodeConfig::new(dir.path().join("data"), Arc::new(model));
        let node = Node::start(config).await.unwrap();
        let (conn, _queue, _closing) = Connection::open(node, None, u64::MAX);
        assert!(Arc::ptr_eq(&conn.watcher(), &conn.watcher()));
        assert_eq!(conn.watcher().watcher_id(), conn.id);
    }

    #[test]
    fn only_the_offered_allow_option_allows() {
        let pick =
            |id: &str| decision_of(&json!({"outcome": {"outcome": "selected", "optionId": id}}));
        assert_eq!(pick("allow"), PermissionDecision::Allowed);
        assert!(matches!(
            pick("allowance-denied"),
            PermissionDecision::Rejected { .. }
        ));
        assert!(matches!(
            pick("reject"),
            PermissionDecision::Rejected { .. }
        ));
        assert_eq!(
            decision_of(&json!({"outcome": {"outcome": "cancelled"}})),
            PermissionDecision::Cancelled
        );
        assert!(matches!(
            decision_of(&Value::Null),
            PermissionDecision::Rejected { .. }
        ));
    }
}
