//! Composing and running the listener.
//!
//! ```no_run
//! # async fn run(node: berth_actors::Node, config: berth_http::HttpConfig) -> Result<(), Box<dyn std::error::Error>> {
//! let server = berth_http::HttpServer::builder(node.clone(), config)
//!     // ACP over WebSocket at /acp (berth-acp), behind auth:
//!     .mount(berth_acp::transport::websocket::router(node.clone(), Default::default()))
//!     // e.g. an adapter's public discovery document:
//!     // .mount_public(berth_a2a::card_router(...))
//!     .build()?;
//! let bound = server.bind().await?;
//! println!("listening on {}", bound.local_addr());
//! bound.serve(std::future::pending()).await?;
//! # Ok(()) }
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::Router;
use berth_actors::Node;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::auth::{authenticate, authenticate_jsonrpc, JsonRpcAuth, Tokens};
use crate::config::HttpConfig;
use crate::conns::RequestGuard;
use crate::layers::{check_origin, limit_in_flight, Origins};
use crate::tls::{acceptor, BoundedListener, Conn, TlsError};

/// Errors building or starting the listener.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The configuration cannot work (no tokens, duplicate tokens, a zero
    /// bound).
    #[error("invalid [http] configuration: {0}")]
    Config(String),
    /// TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The metrics recorder cannot be installed.
    #[error("cannot install the Prometheus recorder: {0}")]
    Metrics(String),
    /// Serving failed.
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// Collects the routers to serve; see the module example.
pub struct HttpServerBuilder {
    node: Node,
    config: HttpConfig,
    authenticated: Vec<Router>,
    public: Vec<Router>,
    jsonrpc: Vec<(Router, Option<berth_actors::Principal>)>,
}

impl HttpServerBuilder {
    /// Serves `router` behind bearer-token auth: its handlers find the
    /// caller's [`berth_actors::Principal`] in the request extensions.
    pub fn mount(mut self, router: Router) -> Self {
        self.authenticated.push(router);
        self
    }

    /// Serves a JSON-RPC endpoint (A2A's `POST /`) behind the bearer
    /// tokens with JSON-RPC-shaped 401s ([`crate::auth::authenticate_jsonrpc`]);
    /// with `anonymous`, a request that presents no token acts as that
    /// principal (marked [`berth_actors::auth::Anonymous`]), while a presented
    /// token still decides.
    pub fn mount_jsonrpc(
        mut self,
        router: Router,
        anonymous: Option<berth_actors::Principal>,
    ) -> Self {
        self.jsonrpc.push((router, anonymous));
        self
    }

    /// Serves `router` without auth (discovery documents such as an A2A
    /// agent card). The Origin check and the bounds still apply.
    pub fn mount_public(mut self, router: Router) -> Self {
        self.public.push(router);
        self
    }

    /// Validates the configuration and composes the layers (see the crate
    /// docs for their order).
    ///
    /// # Errors
    /// [`HttpError::Config`] without tokens, with a repeated token or a zero
    /// bound; [`HttpError::Tls`] for unusable TLS files.
    pub fn build(self) -> Result<HttpServer, HttpError> {
        let c = &self.config;
        if c.tokens.is_empty() {
            return Err(HttpError::Config(
                "no tokens: add [[http.tokens]] entries or set BERTH_API_KEYS (every route but /healthz and /readyz needs one)".into(),
            ));
        }
        if c.max_body_bytes == 0 || c.max_connections == 0 || c.max_requests_in_flight == 0 {
            return Err(HttpError::Config(
                "max_body_bytes, max_connections and max_requests_in_flight must be at least 1"
                    .into(),
            ));
        }
        if c.header_read_timeout.is_zero() || c.idle_timeout.is_zero() {
            return Err(HttpError::Config(
                "header_read_timeout and idle_timeout must be at least 1 ms".into(),
            ));
        }
        let tokens = Tokens::new(&c.tokens).map_err(HttpError::Config)?;
        let tls = match &c.tls {
            Some(files) => Some(acceptor(&files.cert, &files.key)?),
            None => None,
        };
        let jsonrpc = self.jsonrpc.into_iter().map(|(router, anonymous)| {
            router.layer(from_fn_with_state(
                JsonRpcAuth {
                    tokens: tokens.clone(),
                    anonymous,
                },
                authenticate_jsonrpc,
            ))
        });
        let jsonrpc: Vec<Router> = jsonrpc.collect();
        let authenticated = self
            .authenticated
            .into_iter()
            .fold(crate::ops::routes(self.node.clone()), Router::merge)
            .layer(from_fn_with_state(tokens, authenticate));
        let public = self
            .public
            .into_iter()
            .chain(jsonrpc)
            .fold(crate::ops::public_routes(self.node.clone()), Router::merge);
        let app = public
            .merge(authenticated)
            .layer(DefaultBodyLimit::max(c.max_body_bytes))
            .layer(from_fn_with_state(
                Arc::new(Semaphore::new(c.max_requests_in_flight)),
                limit_in_flight,
            ))
            .layer(from_fn_with_state(
                Origins(Arc::new(c.allowed_origins.clone())),
                check_origin,
            ));
        Ok(HttpServer {
            app,
            config: self.config,
            tls,
        })
    }
}

/// A composed listener, not yet bound.
pub struct HttpServer {
    app: Router,
    config: HttpConfig,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl HttpServer {
    /// Starts composing a listener for `node` with `config`; the ops routes
    /// are always there.
    pub fn builder(node: Node, config: HttpConfig) -> HttpServerBuilder {
        HttpServerBuilder {
            node,
            config,
            authenticated: Vec::new(),
            public: Vec::new(),
            jsonrpc: Vec::new(),
        }
    }

    /// Binds the address and installs the Prometheus recorder (so every
    /// metric from now on is kept).
    ///
    /// # Errors
    /// [`HttpError::Bind`], [`HttpError::Metrics`].
    pub async fn bind(self) -> Result<BoundServer, HttpError> {
        crate::metrics::install().map_err(HttpError::Metrics)?;
        let addr = self.config.listen;
        let tcp = TcpListener::bind(addr)
            .await
            .map_err(|source| HttpError::Bind { addr, source })?;
        let listener = BoundedListener::start(
            tcp,
            self.tls,
            self.config.max_connections,
            self.config.handshake_timeout,
        )
        .map_err(|source| HttpError::Bind { addr, source })?;
        let local_addr = axum::serve::Listener::local_addr(&listener)
            .map_err(|source| HttpError::Bind { addr, source })?;
        Ok(BoundServer {
            app: self.app,
            listener,
            local_addr,
            tls: self.config.tls.is_some(),
            header_read_timeout: self.config.header_read_timeout,
            idle_timeout: self.config.idle_timeout,
        })
    }
}

/// A bound listener.
pub struct BoundServer {
    app: Router,
    listener: BoundedListener,
    local_addr: SocketAddr,
    tls: bool,
    header_read_timeout: Duration,
    idle_timeout: Duration,
}

impl BoundServer {
    /// The address actually bound (the port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Whether it serves TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// Serves until `shutdown` resolves, then stops accepting and lets
    /// in-flight requests finish (idle keep-alive connections close at once;
    /// upgraded WebSockets are closed by their own shutdown token).
    ///
    /// Each connection is HTTP/1.1 driven by hyper with
    /// [`HttpConfig::header_read_timeout`] on every request head and
    /// [`HttpConfig::idle_timeout`] on the time without a request in flight.
    ///
    /// # Errors
    /// None today; the `Result` is for the caller's `?`.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), HttpError> {
        use axum::serve::Listener as _;
        let BoundServer {
            app,
            mut listener,
            header_read_timeout,
            idle_timeout,
            ..
        } = self;
        let (stop, stopping) = watch::channel(false);
        let mut connections = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let (conn, _peer) = tokio::select! {
                accepted = listener.accept() => accepted,
                () = &mut shutdown => break,
            };
            while connections.try_join_next().is_some() {}
            connections.spawn(serve_connection(
                app.clone(),
                conn,
                header_read_timeout,
                idle_timeout,
                stopping.clone(),
            ));
        }
        drop(listener);
        let _ = stop.send(true);
        while connections.join_next().await.is_some() {}
        Ok(())
    }
}

/// Serves one connection until it ends, is evicted (at the connection cap),
/// passes the idle timeout, or — once `stopping` turns true — finishes its
/// request in flight.
async fn serve_connection(
    app: Router,
    conn: Conn,
    header_read_timeout: Duration,
    idle_timeout: Duration,
    mut stopping: watch::Receiver<bool>,
) {
    let handle = conn.tracked().handle();
    let evicted = conn.tracked().evicted();
    let service = {
        let handle = handle.clone();
        let app = TowerToHyperService::new(app);
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let guard = handle.begin();
            let answer = hyper::service::Service::call(&app, request);
            async move {
                let response = match answer.await {
                    Ok(response) => response,
                    Err(never) => match never {},
                };
                if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                    guard.upgraded();
                }
                Ok::<_, Infallible>(response.map(|body| Guarded {
                    inner: body,
                    _guard: guard,
                }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let served = builder
        .serve_connection(TokioIo::new(conn), service)
        .with_upgrades();
    let mut served = std::pin::pin!(served);
    let mut draining = *stopping.borrow();
    if draining {
        served.as_mut().graceful_shutdown();
    }
    loop {
        let check = handle
            .idle_deadline(idle_timeout)
            .unwrap_or_else(|| Instant::now() + idle_timeout);
        tokio::select! {
            result = served.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "HTTP connection ended");
                }
                return;
            }
            () = evicted.notified() => return,
            changed = stopping.changed(), if !draining => {
                draining = true;
                if changed.is_ok() {
                    served.as_mut().graceful_shutdown();
                }
            }
            () = tokio::time::sleep_until(check) => {
                if handle.idle_deadline(idle_timeout).is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!("closing an HTTP connection idle past the idle timeout");
                    return;
                }
            }
        }
    }
}

/// A response body that keeps its request counted as in flight until it has
/// been sent whole (or dropped).
struct Guarded {
    inner: Body,
    _guard: RequestGuard,
}

impl http_body::Body for Guarded {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
