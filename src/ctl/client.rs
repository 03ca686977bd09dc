//! A JSON-RPC 2.0 client of a running `berth serve`, over one of its two
//! control transports:
//!
//! - **WebSocket** (`--server ws://HOST:PORT/acp` or `wss://…`, env
//!   `BERTH_SERVER`): ACP at `/acp` on the HTTP listener, one JSON-RPC
//!   message per text frame, the bearer token (`--token`, env `BERTH_TOKEN`)
//!   sent as `Authorization: Bearer …` on the upgrade request (issue 8).
//! - **the local control socket** (default: `<data dir>/berth.sock`): the
//!   same methods, one message per line, as the trusted local host owner.
//!
//! The connection is opened with ACP `initialize` (protocol version 1). A
//! reader task routes responses to the request that waits for them and
//! everything else — session notifications, `_berth/presence`, requests
//! the server sends (`session/request_permission`) — to [`Client::next_message`].
//! Errors name their cause and the remedy (a 401 says which token setting to
//! fix; a refused method says which role it needs).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::Message;

/// How long connecting (TCP, TLS and the upgrade, or the socket) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest frame the client accepts from the server (bytes); berth's own
/// default frame bound is 8 MiB, a replayed event is far smaller.
const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// Where the running server is (`berth ctl …`, `berth event emit`,
/// `berth schedule …`).
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Connection")]
pub struct Endpoint {
    /// The server's ACP WebSocket: `ws://HOST:PORT/acp` or `wss://…`
    /// (`http(s)://HOST:PORT` and a bare `HOST:PORT` are read as its `/acp`).
    /// Without it, the local control socket of the data dir is used.
    #[arg(long, env = "BERTH_SERVER", global = true)]
    pub server: Option<String>,
    /// The bearer token for `--server` (configured on the server in `[http]
    /// tokens` or `BERTH_API_KEYS`).
    #[arg(long, env = "BERTH_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// A PEM file of extra CA certificates to trust for `wss://` (a
    /// self-signed server certificate); the public web roots are trusted
    /// too.
    #[arg(long, env = "BERTH_CA_CERT", global = true)]
    pub ca_cert: Option<PathBuf>,
    /// The server's data directory, for the local control socket [default:
    /// ./berth-data].
    #[arg(long, env = "BERTH_DATA_DIR", global = true)]
    pub data_dir: Option<PathBuf>,
    /// The local control socket [default: <data dir>/berth.sock].
    #[arg(long, global = true)]
    pub socket: Option<PathBuf>,
}

impl Endpoint {
    /// The local control socket this endpoint names (when no `--server`).
    pub fn socket_path(&self) -> PathBuf {
        let path = self.socket.clone().unwrap_or_else(|| {
            self.data_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("berth-data"))
                .join(crate::CONTROL_SOCKET)
        });
        // Absolute, as the server's data dir is; a current directory that
        // cannot be read leaves it relative (the connect then says so).
        std::path::absolute(&path).unwrap_or(path)
    }

    /// A short description for messages: the URL or the socket path.
    pub fn describe(&self) -> String {
        match &self.server {
            Some(server) => ws_url(server).unwrap_or_else(|_| server.clone()),
            None => self.socket_path().display().to_string(),
        }
    }
}

/// A JSON-RPC error the server answered: `code`, `message` and the `data`
/// object saying what was wrong.
#[derive(Debug, Clone)]
pub struct RpcFailure {
    /// The method that was refused.
    pub method: String,
    /// JSON-RPC error code (-32011 role not authorized, -32004 unknown
    /// session, …; README "Errors").
    pub code: i64,
    /// The server's message.
    pub message: String,
    /// The server's `data` object (`reason`, `field`, …); `null` when none.
    pub data: Value,
}

impl RpcFailure {
    /// `data.reason`, when the server gave one.
    pub fn reason(&self) -> Option<&str> {
        self.data.get("reason").and_then(Value::as_str)
    }

    /// The error as JSON for `--json` output: `{method, code, message, data}`.
    pub fn to_json(&self) -> Value {
        json!({"method": self.method, "code": self.code, "message": self.message, "data": self.data})
    }

    /// What to do about it, in a sentence (by code; README "Errors").
    fn remedy(&self) -> Option<String> {
        let data = &self.data;
        let text = |key: &str| data.get(key).and_then(Value::as_str).unwrap_or("?");
        Some(match self.code {
            -32011 => format!(
                "the token's actor {} has role {}, and {} needs {}{}; use a token with that role \
                 (tokens are set on the server in [http] tokens or BERTH_API_KEYS)",
                text("actor"),
                text("role"),
                text("method"),
                text("requiredRole"),
                data.get("detail")
                    .and_then(Value::as_str)
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default(),
            ),
            -32004 if self.reason() == Some("no_active_prompt")
                || self.message.contains("no active prompt") =>
            {
                "a steer needs a running turn (remote-session-control.md, \"Steer\"); \
                 start one with `berth ctl prompt ID TEXT`"
                    .into()
            }
            -32004 => "no such session on this server; `berth ctl ps` lists them".into(),
            -32005 => "it can still be read (`berth ctl show`, `tail`), not driven".into(),
            -32006 => "a prompt is already running; steer it (`berth ctl steer`) or cancel it first".into(),
            -32007 => "the server's per-connection request bound was hit; retry".into(),
            -32009 => match self.reason() {
                Some("not_suspended") => "`berth ctl ps` shows its state".into(),
                Some("already_resumed") => "another resume claimed this suspension first".into(),
                Some("handle_mismatch") => "that handle is not the session's current suspension \
                     (data.currentHandle is); `berth ctl show ID` shows it"
                    .into(),
                _ => return None,
            },
            -32010 => "`berth ctl resume ID` wakes it".into(),
            -32012 => "the parked turn cannot continue under today's history or configuration; resume with --fresh".into(),
            -32601 => "this server does not know the method (an older berth?)".into(),
            -32602 => format!(
                "field `{}`: {}",
                text("field"),
                data.get("reason")
                    .and_then(Value::as_str)
                    .or_else(|| data.get("message").and_then(Value::as_str))
                    .unwrap_or(&self.message)
            ),
            _ => return None,
        })
    }
}

impl std::fmt::Display for RpcFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} was refused ({}", self.method, self.code)?;
        // A machine-readable reason (`role_not_authorized`), not prose.
        if let Some(reason) = self.reason().filter(|r| !r.contains(' ')) {
            write!(f, " {reason}")?;
        }
        write!(f, "): {}", self.message)?;
        if let Some(remedy) = self.remedy() {
            write!(f, "; {remedy}")?;
        }
        if !self.data.is_null() {
            write!(f, "\n  data: {}", self.data)?;
        }
        Ok(())
    }
}

impl std::error::Error for RpcFailure {}

/// A message from the server that is not the answer to one of our requests.
#[derive(Debug, Clone)]
pub enum Incoming {
    /// A notification (`session/update`, `_berth/agentEvent`,
    /// `_berth/presence`, …): `method` and `params`.
    Notification {
        /// The method.
        method: String,
        /// Its params.
        params: Value,
    },
    /// A request the server sends the client (ACP
    /// `session/request_permission`); answer it with [`Client::answer`].
    Request {
        /// Its id (echo it in the answer).
        id: Value,
        /// The method.
        method: String,
        /// Its params.
        params: Value,
    },
}

/// Requests waiting for their answer, by id.
type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// One open connection to a running server (see the module docs).
pub struct Client {
    outbound: mpsc::UnboundedSender<String>,
    waiting: Waiting,
    incoming: tokio::sync::Mutex<mpsc::UnboundedReceiver<Incoming>>,
    next_id: AtomicU64,
    /// Why the connection ended, once it did (a WebSocket close frame's code
    /// and reason, or the socket's end).
    closed: Arc<Mutex<Option<String>>>,
    /// `{actor, role}` from `initialize` (`_meta.berth.principal`).
    pub principal: Value,
    /// The URL or socket path, for messages.
    pub endpoint: String,
}

impl Client {
    /// Connects to `endpoint` and initializes the ACP connection.
    ///
    /// # Errors
    /// The server cannot be reached (refused, timed out, no socket), the
    /// upgrade was refused (401 bad or missing token, 403, 503), TLS failed,
    /// or `initialize` was refused — each with what to do about it.
    pub async fn connect(endpoint: &Endpoint) -> anyhow::Result<Self> {
        let (outbound, frames_out) = mpsc::unbounded_channel::<String>();
        let (frames_in_tx, frames_in) = mpsc::unbounded_channel::<String>();
        let closed = Arc::new(Mutex::new(None));
        let described = endpoint.describe();
        match &endpoint.server {
            Some(server) => {
                let url = ws_url(server)?;
                let socket = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    open_websocket(&url, endpoint.token.as_deref(), endpoint.ca_cert.as_deref()),
                )
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "connecting to {url} timed out after {} s; is `berth serve --listen` running there?",
                        CONNECT_TIMEOUT.as_secs()
                    )
                })??;
                spawn_websocket(socket, frames_out, frames_in_tx, Arc::clone(&closed));
            }
            None => {
                if endpoint.token.is_some() {
                    tracing::debug!("--token is ignored on the local control socket");
                }
                let path = endpoint.socket_path();
                // Another user's socket is not talked to (a missing one is
                // reported by the connect below).
                if std::fs::symlink_metadata(&path).is_ok() {
                    berth_acp::transport::local::check_owner(&path)?;
                }
                let stream = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tokio::net::UnixStream::connect(&path),
                )
                .await
                .map_err(|_| anyhow::anyhow!("connecting to {} timed out", path.display()))?
                .with_context(|| {
                    format!(
                        "cannot reach a running berth at {} (is `berth serve` running on that data dir? \
                         for a remote server pass --server ws://HOST:PORT/acp or set BERTH_SERVER)",
                        path.display()
                    )
                })?;
                spawn_unix(stream, frames_out, frames_in_tx, Arc::clone(&closed));
            }
        }
        let (incoming_tx, incoming) = mpsc::unbounded_channel();
        let waiting: Waiting = Arc::default();
        tokio::spawn(route(frames_in, Arc::clone(&waiting), incoming_tx));
        let mut client = Client {
            outbound,
            waiting,
            incoming: tokio::sync::Mutex::new(incoming),
            next_id: AtomicU64::new(0),
            closed,
            principal: Value::Null,
            endpoint: described,
        };
        let init = client
            .request(
                "initialize",
                json!({
                    "protocolVersion": 1,
                    "clientCapabilities": {},
                    "clientInfo": {"name": "berth-ctl", "version": env!("CARGO_PKG_VERSION")},
                }),
            )
            .await?;
        client.principal = init
            .pointer("/_meta/berth/principal")
            .cloned()
            .unwrap_or(Value::Null);
        Ok(client)
    }

    /// Sends one request and waits for its answer.
    ///
    /// # Errors
    /// An [`RpcFailure`] (downcastable from the `anyhow::Error`) when the
    /// server answered with an error; a message naming the close reason when
    /// the connection ended first.
    pub async fn request(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (answered, answer) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, answered);
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if self.outbound.send(frame.to_string()).is_err() {
            anyhow::bail!("{}", self.gone(method));
        }
        let Ok(message) = answer.await else {
            anyhow::bail!("{}", self.gone(method));
        };
        if let Some(error) = message.get("error") {
            return Err(RpcFailure {
                method: method.to_owned(),
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                data: error.get("data").cloned().unwrap_or(Value::Null),
            }
            .into());
        }
        Ok(message.get("result").cloned().unwrap_or(Value::Null))
    }

    /// Sends a notification (no answer).
    ///
    /// # Errors
    /// The connection is gone.
    pub fn notify(&self, method: &str, params: Value) -> anyhow::Result<()> {
        let frame = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.outbound
            .send(frame.to_string())
            .map_err(|_| anyhow::anyhow!("{}", self.gone(method)))
    }

    /// Answers a request the server sent ([`Incoming::Request`]).
    pub fn answer(&self, id: &Value, result: Value) {
        let frame = json!({"jsonrpc": "2.0", "id": id, "result": result});
        let _ = self.outbound.send(frame.to_string());
    }

    /// Answers a request the server sent with a JSON-RPC error.
    pub fn answer_error(&self, id: &Value, code: i64, message: &str) {
        let frame =
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
        let _ = self.outbound.send(frame.to_string());
    }

    /// The next notification or server request; `None` once the connection
    /// ended ([`Client::close_reason`] says why). Cancel-safe (a message is
    /// never lost when the future is dropped).
    pub async fn next_message(&self) -> Option<Incoming> {
        self.incoming.lock().await.recv().await
    }

    /// A message that has already arrived, without waiting.
    pub fn try_next_message(&self) -> Option<Incoming> {
        self.incoming.try_lock().ok()?.try_recv().ok()
    }

    /// Why the connection ended (`None` while it is open).
    pub fn close_reason(&self) -> Option<String> {
        self.closed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn gone(&self, method: &str) -> String {
        match self.close_reason() {
            Some(reason) => format!(
                "the connection to {} ended before {method} was answered: {reason}",
                self.endpoint
            ),
            None => format!(
                "the connection to {} ended before {method} was answered",
                self.endpoint
            ),
        }
    }
}

/// Routes inbound frames: answers to their waiting request, everything else
/// to the incoming queue. When the frames end, every waiting request fails.
async fn route(
    mut frames: mpsc::UnboundedReceiver<String>,
    waiting: Waiting,
    incoming: mpsc::UnboundedSender<Incoming>,
) {
    while let Some(frame) = frames.recv().await {
        let Ok(message) = serde_json::from_str::<Value>(&frame) else {
            tracing::debug!(%frame, "not JSON; ignored");
            continue;
        };
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let id = message.get("id").cloned().filter(|id| !id.is_null());
        match (method, id) {
            (None, Some(id)) => {
                let sender = id.as_u64().and_then(|id| {
                    waiting
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&id)
                });
                match sender {
                    Some(sender) => {
                        let _ = sender.send(message);
                    }
                    None => tracing::debug!(%id, "an answer to no request of ours"),
                }
            }
            (None, None) => {
                // An error with a null id: the server could not read a frame
                // of ours (too large, not JSON). It names no request, so
                // every request still waiting gets it as its answer rather
                // than waiting forever.
                tracing::debug!(%message, "the server answered a frame it could not read");
                let waiters: Vec<_> = waiting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .drain()
                    .collect();
                for (_, sender) in waiters {
                    let _ = sender.send(message.clone());
                }
            }
            (Some(method), Some(id)) => {
                let params = message.get("params").cloned().unwrap_or(Value::Null);
                let _ = incoming.send(Incoming::Request { id, method, params });
            }
            (Some(method), None) => {
                let params = message.get("params").cloned().unwrap_or(Value::Null);
                let _ = incoming.send(Incoming::Notification { method, params });
            }
        }
    }
    waiting.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

/// The WebSocket URL `server` names: `ws(s)://…` as given (path `/acp` when
/// it has none), `http(s)://…` as `ws(s)://…`, a bare `HOST:PORT` as
/// `ws://HOST:PORT/acp`.
///
/// # Errors
/// A scheme other than ws, wss, http or https.
pub fn ws_url(server: &str) -> anyhow::Result<String> {
    let server = server.trim();
    let (scheme, rest) = match server.split_once("://") {
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
        None => ("ws".to_owned(), server),
    };
    let scheme = match scheme.as_str() {
        "ws" | "http" => "ws",
        "wss" | "https" => "wss",
        other => anyhow::bail!(
            "--server {server}: unknown scheme `{other}`; give ws://HOST:PORT/acp or wss://HOST:PORT/acp"
        ),
    };
    if rest.is_empty() || rest.starts_with('/') {
        anyhow::bail!("--server {server}: no host; give ws://HOST:PORT/acp");
    }
    let rest = match rest.find('/') {
        None => format!("{rest}/acp"),
        Some(i) if &rest[i..] == "/" => format!("{}/acp", &rest[..i]),
        Some(_) => rest.to_owned(),
    };
    Ok(format!("{scheme}://{rest}"))
}

type WsStream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// TCP (+ TLS) and the WebSocket upgrade with the bearer token; maps each
/// refusal to what to do about it.
async fn open_websocket(
    url: &str,
    token: Option<&str>,
    ca_cert: Option<&std::path::Path>,
) -> anyhow::Result<WsStream> {
    let mut request = url
        .into_client_request()
        .with_context(|| format!("--server {url} is not a valid WebSocket URL"))?;
    if let Some(token) = token {
        let value = format!("Bearer {token}")
            .parse()
            .context("--token holds characters an HTTP header cannot carry")?;
        request.headers_mut().insert("authorization", value);
    }
    let connector = if url.starts_with("wss://") {
        Some(tokio_tungstenite::Connector::Rustls(Arc::new(tls_config(
            ca_cert,
        )?)))
    } else {
        None
    };
    let config = tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES));
    match tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, connector)
        .await
    {
        Ok((socket, _response)) => Ok(socket),
        Err(tungstenite::Error::Http(response)) => {
            let status = response.status();
            let body = response
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            let reason = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| {
                    v.pointer("/error/data/reason")
                        .or_else(|| v.get("reason"))
                        .or_else(|| v.get("error"))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| body.trim().to_owned());
            match status.as_u16() {
                401 if token.is_none() => anyhow::bail!(
                    "{url} refused the connection: HTTP 401 ({reason}): no token was given; \
                     pass --token TOKEN or set BERTH_TOKEN"
                ),
                401 => anyhow::bail!(
                    "{url} refused the token: HTTP 401 ({reason}); check --token / BERTH_TOKEN \
                     against the server's [http] tokens or BERTH_API_KEYS"
                ),
                403 => anyhow::bail!("{url} refused the connection: HTTP 403 ({reason})"),
                404 => anyhow::bail!(
                    "{url}: HTTP 404; the server has no ACP WebSocket at that path (it is /acp)"
                ),
                503 => anyhow::bail!(
                    "{url} is busy: HTTP 503 ({reason}); it serves a bounded number of connections, retry later"
                ),
                code => anyhow::bail!("{url} refused the upgrade: HTTP {code} ({reason})"),
            }
        }
        Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            anyhow::bail!(
                "cannot reach berth at {url}: connection refused (is `berth serve --listen` running there?)"
            )
        }
        Err(tungstenite::Error::Tls(e)) => anyhow::bail!(
            "TLS with {url} failed: {e}; for a self-signed server certificate pass --ca-cert PEM"
        ),
        // rustls failures arrive as I/O errors of the stream.
        Err(e) if e.to_string().contains("certificate") => anyhow::bail!(
            "TLS with {url} failed: {e}; for a self-signed server certificate pass --ca-cert PEM \
             (an end-entity certificate, or the CA that issued it)"
        ),
        Err(e) => Err(anyhow::Error::new(e).context(format!("cannot connect to {url}"))),
    }
}

/// A rustls client config trusting the public web roots plus the
/// certificates in `ca_cert`.
fn tls_config(
    ca_cert: Option<&std::path::Path>,
) -> anyhow::Result<tokio_rustls::rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_cert {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .with_context(|| format!("--ca-cert {}: cannot read it", path.display()))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("--ca-cert {}: not PEM certificates", path.display()))?;
        if certs.is_empty() {
            anyhow::bail!("--ca-cert {}: no certificate in it", path.display());
        }
        for cert in certs {
            roots.add(cert).with_context(|| {
                format!("--ca-cert {}: a certificate is invalid", path.display())
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS setup failed")?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Runs the socket: frames to write come from `outbound`, text frames read
/// go to `inbound`; the close frame's code and reason go to `closed`.
fn spawn_websocket(
    socket: WsStream,
    mut outbound: mpsc::UnboundedReceiver<String>,
    inbound: mpsc::UnboundedSender<String>,
    closed: Arc<Mutex<Option<String>>>,
) {
    let (mut sink, mut stream) = socket.split();
    tokio::spawn(async move {
        while let Some(frame) = outbound.recv().await {
            if sink.send(Message::Text(frame.into())).await.is_err() {
                return;
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    });
    tokio::spawn(async move {
        let why = loop {
            match stream.next().await {
                Some(Ok(Message::Text(text))) => {
                    if inbound.send(text.as_str().to_owned()).is_err() {
                        break "the client stopped reading".to_owned();
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    break match frame {
                        Some(f) if f.reason.is_empty() => {
                            format!("closed by the server (code {})", u16::from(f.code))
                        }
                        Some(f) => format!(
                            "closed by the server (code {}: {})",
                            u16::from(f.code),
                            f.reason
                        ),
                        None => "closed by the server".to_owned(),
                    };
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => break format!("read failed: {e}"),
                None => break "the server closed the connection".to_owned(),
            }
        };
        closed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(why);
    });
}

/// Runs the control socket: one message per line each way.
fn spawn_unix(
    stream: tokio::net::UnixStream,
    mut outbound: mpsc::UnboundedReceiver<String>,
    inbound: mpsc::UnboundedSender<String>,
    closed: Arc<Mutex<Option<String>>>,
) {
    let (read, mut write) = stream.into_split();
    tokio::spawn(async move {
        while let Some(frame) = outbound.recv().await {
            if write
                .write_all(format!("{frame}\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
        }
    });
    tokio::spawn(async move {
        let mut lines = BufReader::new(read).lines();
        let why = loop {
            match lines.next_line().await {
                Ok(Some(line)) => {
                    if inbound.send(line).is_err() {
                        break "the client stopped reading".to_owned();
                    }
                }
                Ok(None) => break "the server closed the control socket".to_owned(),
                Err(e) => break format!("read failed: {e}"),
            }
        };
        closed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(why);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_forms_become_the_acp_websocket_url() {
        assert_eq!(
            ws_url("ws://127.0.0.1:9/acp").unwrap(),
            "ws://127.0.0.1:9/acp"
        );
        assert_eq!(ws_url("127.0.0.1:9").unwrap(), "ws://127.0.0.1:9/acp");
        assert_eq!(ws_url("http://h:9/").unwrap(), "ws://h:9/acp");
        assert_eq!(ws_url("https://h:9").unwrap(), "wss://h:9/acp");
        assert_eq!(ws_url("WSS://h:9/x").unwrap(), "wss://h:9/x");
        assert!(ws_url("ftp://h:9").is_err());
        assert!(ws_url("ws://").is_err());
    }

    #[test]
    fn refusals_name_the_remedy() {
        let role = RpcFailure {
            method: "session/suspend".into(),
            code: -32011,
            message: "Role not authorized".into(),
            data: json!({"reason": "role_not_authorized", "method": "session/suspend",
                         "actor": "grafana", "role": "observer", "requiredRole": "controller"}),
        };
        let text = role.to_string();
        assert!(text.contains("-32011 role_not_authorized"), "{text}");
        assert!(text.contains("grafana has role observer"), "{text}");
        assert!(text.contains("needs controller"), "{text}");
        let field = RpcFailure {
            method: "session/suspend".into(),
            code: -32602,
            message: "Invalid params".into(),
            data: json!({"field": "mode", "reason": "must be one of …"}),
        };
        assert!(field.to_string().contains("field `mode`"));
    }
}
