//! ACP over WebSocket at `/acp` (issue 8; DESIGN.md, "Adapters"): the same
//! [`Connection`] and method dispatch as stdio, one JSON-RPC message per
//! **text** message.
//!
//! - A binary message is answered with -32600 `{reason: "binary_frame"}`
//!   and the connection goes on.
//! - A message over [`WsOptions::acp`]`.max_frame_bytes` is refused by the
//!   WebSocket layer before it is buffered whole: the connection closes with
//!   code 1009 (message too big). A text message that is not UTF-8 closes it
//!   with 1007 (invalid payload), a frame that breaks RFC 6455's framing
//!   (unmasked, reserved bits, unknown opcode) with 1002 (protocol error).
//!   A text message that is UTF-8 but not JSON is valid WebSocket payload:
//!   it is answered -32700 and the connection goes on.
//! - At most [`WsOptions::acp`]`.max_in_flight` requests run at once per
//!   connection (more: -32007), at most [`WsOptions::max_connections`]
//!   connections at once (more: HTTP 503 before the upgrade), and at most
//!   [`WsOptions::max_outbound_bytes`] of frames wait for a client that does
//!   not read (more: the connection closes with 1008; the client reconnects
//!   and catches up, below). Every send has a deadline,
//!   [`WsOptions::send_timeout`]: a client whose socket stops taking frames
//!   is closed with 1008 once it passes (dropped when even the close frame
//!   does not fit), so a non-reading client holds at most the bound, for at
//!   most the deadline.
//! - Memory per connection: the socket's read buffer starts at
//!   [`READ_BUFFER_BYTES`] (8 KiB) instead of tungstenite's 128 KiB, which
//!   was most of the ~150 KiB each of the 1,000 connections of `bench-ws`
//!   held (heap profile, README "Benchmarks"); it grows to hold a larger
//!   frame, up to the frame bound.
//! - Liveness: berth pings every [`WsOptions::ping_interval`]; a client that
//!   sends nothing (not even the pong its WebSocket library answers
//!   automatically) for two intervals is closed with 1001.
//! - Auth happens before the upgrade, in the HTTP listener's layer
//!   (`berth-http`): this router only serves a request that carries an
//!   authenticated [`Principal`] extension, and answers 401 otherwise. The
//!   principal's actor is what receipts record; its role gates every method
//!   (`methods::authorize`).
//!
//! Several clients may attach to one session; each session notification
//! carries `_meta.berth.eventId`. A client that reconnects calls
//! `session/load` with `_meta.berth.lastEventId` = the last event id it
//! acknowledged and receives only the events after it. Other clients of a
//! session hear attaches and detaches as `_berth/presence`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use berth_actors::{Node, Principal};
use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::connection::{drive, Connection, InFrame, OutboundQueue, ServeOptions};

/// WebSocket close code: normal closure.
const CLOSE_NORMAL: u16 = 1000;
/// WebSocket close code: going away (server shutdown, client silent).
const CLOSE_GOING_AWAY: u16 = 1001;
/// WebSocket close code: protocol error (RFC 6455 §7.4.1: a frame that
/// breaks the framing rules).
const CLOSE_PROTOCOL: u16 = 1002;
/// WebSocket close code: invalid frame payload data (a text message that is
/// not UTF-8).
const CLOSE_INVALID_PAYLOAD: u16 = 1007;
/// WebSocket close code: policy violation (the client stopped reading).
const CLOSE_POLICY: u16 = 1008;
/// WebSocket close code: message too big.
const CLOSE_TOO_BIG: u16 = 1009;

/// Bounds of the WebSocket transport.
#[derive(Debug, Clone)]
pub struct WsOptions {
    /// Per-connection bounds: `max_frame_bytes` (longest text message,
    /// bytes) and `max_in_flight` (concurrent requests).
    pub acp: ServeOptions,
    /// WebSocket connections served at once (default 1024).
    pub max_connections: usize,
    /// Frames (bytes) waiting for a client that does not read before its
    /// connection is closed (default 64 MiB).
    pub max_outbound_bytes: u64,
    /// How often berth pings each client (default 20 s); a client silent
    /// for two intervals is closed.
    pub ping_interval: Duration,
    /// Longest the socket may take to accept one frame (default 5 s): a
    /// client that stops reading fills the socket's buffers, the next send
    /// passes this deadline, and the connection is closed with 1008 (or
    /// just dropped when not even the close frame fits), freeing its queue.
    pub send_timeout: Duration,
    /// Live counts of this router's connections (shared; read them for
    /// metrics or tests).
    pub stats: Arc<WsStats>,
    /// Cancelled when the server shuts down: every connection closes with
    /// 1001.
    pub shutdown: CancellationToken,
}

impl Default for WsOptions {
    fn default() -> Self {
        Self {
            acp: ServeOptions::default(),
            max_connections: 1024,
            max_outbound_bytes: 64 * 1024 * 1024,
            ping_interval: Duration::from_secs(20),
            send_timeout: Duration::from_secs(5),
            stats: Arc::default(),
            shutdown: CancellationToken::new(),
        }
    }
}

/// Live counts of a WebSocket router's connections.
#[derive(Debug, Default)]
pub struct WsStats {
    /// Connections open now (upgraded, not yet torn down).
    pub connections: AtomicU64,
    /// Bytes of frames waiting in the outbound queues of all of them.
    pub outbound_bytes: Arc<AtomicU64>,
}

#[derive(Clone)]
struct AcpWs {
    node: Node,
    options: Arc<WsOptions>,
    slots: Arc<Semaphore>,
}

/// Initial capacity of a connection's read buffer (bytes): 8 KiB holds a
/// typical JSON-RPC control frame in one read. tungstenite's default of
/// 128 KiB per connection is meant for high read throughput on few
/// connections; berth serves many connections of small frames. A larger
/// frame still arrives whole: the buffer grows to it (up to
/// `max_frame_bytes`).
pub const READ_BUFFER_BYTES: usize = 8 * 1024;

/// The router serving ACP over WebSocket at `GET /acp`. Mount it behind the
/// HTTP listener's auth layer (which inserts the [`Principal`]).
pub fn router(node: Node, options: WsOptions) -> Router {
    let state = AcpWs {
        node,
        slots: Arc::new(Semaphore::new(options.max_connections)),
        options: Arc::new(options),
    };
    Router::new().route("/acp", get(upgrade)).with_state(state)
}

async fn upgrade(
    State(state): State<AcpWs>,
    principal: Option<Extension<Principal>>,
    ws: WebSocketUpgrade,
) -> Response {
    let Some(Extension(principal)) = principal else {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "unauthenticated", "reason": "no authenticated principal; /acp must be served behind the HTTP listener's auth layer"})),
        )
            .into_response();
    };
    let Ok(slot) = Arc::clone(&state.slots).try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "too_many_connections", "limit": state.options.max_connections})),
        )
            .into_response();
    };
    let max = state.options.acp.max_frame_bytes;
    ws.max_message_size(max)
        .max_frame_size(max)
        .read_buffer_size(READ_BUFFER_BYTES)
        .on_upgrade(move |socket| async move {
            serve_socket(state.node, principal, socket, &state.options).await;
            drop(slot);
        })
}

/// Why berth closes a connection (sent in the close frame).
#[derive(Default)]
struct CloseReason(Mutex<Option<(u16, String)>>);

impl CloseReason {
    fn set(&self, code: u16, reason: impl Into<String>) {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert((code, reason.into()));
    }

    fn take(&self) -> Option<(u16, String)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

async fn serve_socket(node: Node, principal: Principal, socket: WebSocket, options: &WsOptions) {
    let actor = principal.actor.clone();
    let (conn, queue, closing) = Connection::open_counted(
        node,
        Some(principal),
        options.max_outbound_bytes,
        Some(Arc::clone(&options.stats.outbound_bytes)),
    );
    options.stats.connections.fetch_add(1, Ordering::AcqRel);
    tracing::info!(connection = conn.id, %actor, "websocket client attached");
    let (sink, stream) = socket.split();
    let started = Instant::now();
    let last_seen = Arc::new(AtomicU64::new(0));
    let reason = Arc::new(CloseReason::default());
    let shutdown = options.shutdown.clone();
    let writer = tokio::spawn(write_loop(
        sink,
        queue,
        closing.clone(),
        shutdown.clone(),
        Arc::clone(&last_seen),
        started,
        options.ping_interval,
        options.send_timeout,
        Arc::clone(&reason),
    ));
    let inbound = {
        let last_seen = Arc::clone(&last_seen);
        let reason = Arc::clone(&reason);
        let closing = closing.clone();
        futures::stream::unfold(stream, move |mut stream| {
            let last_seen = Arc::clone(&last_seen);
            let reason = Arc::clone(&reason);
            let closing = closing.clone();
            async move {
                loop {
                    let Some(message) = stream.next().await else {
                        // The socket is gone: nobody can read answers any
                        // more, so in-flight requests are not waited for
                        // (their effects go on in the session actors).
                        reason.set(CLOSE_NORMAL, "");
                        closing.cancel();
                        return None;
                    };
                    let now = started.elapsed().as_millis() as u64;
                    last_seen.store(now, Ordering::Release);
                    let frame = match message {
                        Ok(Message::Text(text)) => InFrame::Message(text.as_bytes().to_vec()),
                        Ok(Message::Binary(_)) => InFrame::Binary,
                        Ok(Message::Ping(_) | Message::Pong(_)) => continue,
                        Ok(Message::Close(_)) => {
                            reason.set(CLOSE_NORMAL, "");
                            closing.cancel();
                            return None;
                        }
                        Err(e) => {
                            let text = e.to_string();
                            if let Some((code, why)) = close_for(&text) {
                                reason.set(code, why);
                                closing.cancel();
                                return None;
                            }
                            return Some((Err(std::io::Error::other(text)), stream));
                        }
                    };
                    return Some((Ok(frame), stream));
                }
            }
        })
    };
    // Server shutdown cuts the connection through the same token as the
    // other reasons, so the teardown (detaching from sessions) always runs.
    let shutdown_watch = {
        let stop = closing.clone();
        let reason = Arc::clone(&reason);
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => {
                    reason.set(CLOSE_GOING_AWAY, "berth is shutting down");
                    stop.cancel();
                }
                () = stop.cancelled() => {}
            }
        })
    };
    let stop = closing.clone();
    if let Err(e) = drive(&conn, Box::pin(inbound), closing, options.acp).await {
        tracing::debug!(connection = conn.id, error = %e, "websocket read failed");
    }
    shutdown_watch.abort();
    // The client is gone or cut off: the writer sends its close frame (when
    // the socket still takes one) and ends.
    stop.cancel();
    let id = conn.id;
    drop(conn);
    let _ = writer.await;
    options.stats.connections.fetch_sub(1, Ordering::AcqRel);
    tracing::info!(connection = id, %actor, "websocket client detached");
}

/// The close code and reason for a read error of the WebSocket layer
/// (tungstenite's error text; RFC 6455 §7.4.1): a message over the bound is
/// 1009, a text message that is not UTF-8 is 1007, a framing violation
/// (unmasked client frame, reserved bits, bad opcode, bad control frame) is
/// 1002. `None` for I/O errors (the socket is gone: nothing to send).
fn close_for(error: &str) -> Option<(u16, &'static str)> {
    if error.contains("too long") || error.contains("too big") || error.contains("Space limit") {
        Some((CLOSE_TOO_BIG, "message too big"))
    } else if error.contains("UTF-8") || error.contains("utf-8") {
        Some((CLOSE_INVALID_PAYLOAD, "text message is not UTF-8"))
    } else if error.contains("protocol error") || error.contains("Protocol") {
        Some((CLOSE_PROTOCOL, "WebSocket protocol error"))
    } else {
        None
    }
}

/// Sends `message` unless the socket takes longer than `deadline` to accept
/// it. Returns `Err(true)` on a passed deadline, `Err(false)` when the
/// socket failed.
async fn send_within(
    sink: &mut futures::stream::SplitSink<WebSocket, Message>,
    message: Message,
    deadline: Duration,
) -> Result<(), bool> {
    match tokio::time::timeout(deadline, sink.send(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(false),
        Err(_) => Err(true),
    }
}

#[allow(clippy::too_many_arguments)]
async fn write_loop(
    mut sink: futures::stream::SplitSink<WebSocket, Message>,
    mut queue: OutboundQueue,
    closing: CancellationToken,
    shutdown: CancellationToken,
    last_seen: Arc<AtomicU64>,
    started: Instant,
    ping_interval: Duration,
    send_timeout: Duration,
    reason: Arc<CloseReason>,
) {
    let stalled = |reason: &CloseReason, closing: &CancellationToken| {
        reason.set(
            CLOSE_POLICY,
            format!(
                "the client did not take a frame within {} ms",
                send_timeout.as_millis()
            ),
        );
        closing.cancel();
    };
    let mut ticker = tokio::time::interval(ping_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let silent_limit = 2 * ping_interval.as_millis() as u64;
    let close = loop {
        tokio::select! {
            biased;
            () = closing.cancelled() => break true,
            frame = queue.recv() => match frame {
                Some(frame) => match send_within(&mut sink, Message::Text(frame.into()), send_timeout).await {
                    Ok(()) => {}
                    Err(true) => {
                        stalled(&reason, &closing);
                        break true;
                    }
                    Err(false) => break false,
                },
                // Every sender is gone: the connection ended on its own.
                None => break true,
            },
            _ = ticker.tick() => {
                let now = started.elapsed().as_millis() as u64;
                if now.saturating_sub(last_seen.load(Ordering::Acquire)) > silent_limit {
                    reason.set(CLOSE_GOING_AWAY, format!("no frame or pong for {silent_limit} ms"));
                    closing.cancel();
                    break true;
                }
                match send_within(&mut sink, Message::Ping(Vec::new().into()), send_timeout).await {
                    Ok(()) => {}
                    Err(true) => {
                        stalled(&reason, &closing);
                        break true;
                    }
                    Err(false) => break false,
                }
            }
        }
    };
    if close {
        let (code, text) = reason.take().unwrap_or_else(|| {
            if queue.overflowed() {
                (CLOSE_POLICY, "the client is not reading its frames".into())
            } else if shutdown.is_cancelled() || closing.is_cancelled() {
                (CLOSE_GOING_AWAY, "berth is closing the connection".into())
            } else {
                (CLOSE_NORMAL, String::new())
            }
        });
        // Bounded too: a socket that stopped taking frames takes no close
        // frame either; then the TCP connection is just dropped.
        let _ = send_within(
            &mut sink,
            Message::Close(Some(CloseFrame {
                code,
                reason: text.into(),
            })),
            send_timeout,
        )
        .await;
    }
    let _ = tokio::time::timeout(send_timeout, sink.close()).await;
}
