//! ACP over WebSocket at `/acp` (issue 8; DESIGN.md, "Adapters"): the same
//! [`Connection`] and method dispatch as stdio, one JSON-RPC message per
//! **text** message.
//!
//! - A binary message is answered with -32600 `{reason: "binary_frame"}`
//!   and the connection goes on.
//! - A message over [`WsOptions::acp`]`.max_frame_bytes` is refused by the
//!   WebSocket layer before it is buffered whole: the connection closes with
//!   code 1009 (message too big).
//! - At most [`WsOptions::acp`]`.max_in_flight` requests run at once per
//!   connection (more: -32007), at most [`WsOptions::max_connections`]
//!   connections at once (more: HTTP 503 before the upgrade), and at most
//!   [`WsOptions::max_outbound_bytes`] of frames wait for a client that does
//!   not read (more: the connection closes with 1008; the client reconnects
//!   and catches up, below).
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
            shutdown: CancellationToken::new(),
        }
    }
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
    let (conn, queue, closing) =
        Connection::open(node, Some(principal), options.max_outbound_bytes);
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
                            if text.contains("too long")
                                || text.contains("too big")
                                || text.contains("Space limit exceeded")
                            {
                                reason.set(CLOSE_TOO_BIG, "message too big");
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
    tracing::info!(connection = id, %actor, "websocket client detached");
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
    reason: Arc<CloseReason>,
) {
    let mut ticker = tokio::time::interval(ping_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let silent_limit = 2 * ping_interval.as_millis() as u64;
    let close = loop {
        tokio::select! {
            biased;
            () = closing.cancelled() => break true,
            frame = queue.recv() => match frame {
                Some(frame) => {
                    if sink.send(Message::Text(frame.into())).await.is_err() {
                        break false;
                    }
                }
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
                if sink.send(Message::Ping(Vec::new().into())).await.is_err() {
                    break false;
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
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code,
                reason: text.into(),
            })))
            .await;
    }
    let _ = sink.close().await;
}
