//! # berth-http
//!
//! The HTTP listener of a berth node (issue 8): off unless configured, on
//! loopback by default. It owns the socket (TCP, or TLS through rustls when
//! a certificate and key are configured), the cross-cutting layers, the
//! operations routes, and the composition of the adapters' routers.
//!
//! A request passes, in order:
//!
//! 1. the **connection bound** ([`HttpConfig::max_connections`] sockets at
//!    once; at the cap a new connection closes the one idle the longest —
//!    silent, trickling its head, or keep-alive between requests — so a
//!    flood of idle sockets never locks out `/healthz`; when every socket is
//!    busy more wait in the kernel's backlog), with TLS the handshake
//!    (bounded by [`HttpConfig::handshake_timeout`]), then the **time
//!    bounds**: a request head must arrive within
//!    [`HttpConfig::header_read_timeout`] and a connection with no request
//!    in flight closes after [`HttpConfig::idle_timeout`];
//! 2. the **Origin check** ([`layers::check_origin`]): a request that
//!    carries an `Origin` header (a browser) is refused with 403 unless the
//!    origin is listed in [`HttpConfig::allowed_origins`]; clients that send
//!    none (CLIs, SDKs) pass;
//! 3. the **request bound** ([`HttpConfig::max_requests_in_flight`]
//!    requests handled at once; more get 503 at once) and the **body bound**
//!    ([`HttpConfig::max_body_bytes`]; more get 413);
//! 4. **bearer-token auth** ([`auth::authenticate`]) on every route except
//!    `GET /healthz`, `GET /readyz` and the routers mounted with
//!    [`HttpServerBuilder::mount_public`]: `Authorization: Bearer TOKEN`
//!    maps to a [`berth_actors::Principal`] (actor id + role), inserted into
//!    the request's extensions for the adapters; a missing or unknown token
//!    gets 401 (`WWW-Authenticate: Bearer`) before any handler runs — before
//!    a WebSocket upgrade too. A JSON-RPC endpoint mounted with
//!    [`HttpServerBuilder::mount_jsonrpc`] (A2A's `POST /`) is checked by
//!    [`auth::authenticate_jsonrpc`] instead: the same tokens, a JSON-RPC
//!    error body on its 401s, and optionally an anonymous principal for
//!    requests that present no token;
//! 5. the route: [`ops`] (health, readiness, Prometheus metrics, events,
//!    read-only sessions) or a mounted adapter router (ACP over WebSocket at
//!    `/acp`, A2A, …), which checks the principal's role per method.
//!
//! Errors are JSON: `{"error": {"code", "message", "data"}}` with the
//! JSON-RPC-style code where one applies (-32602 bad params, -32011
//! `role_not_authorized`, -32004 unknown session).

#![warn(missing_docs)]

pub mod auth;
pub mod config;
mod conns;
pub mod error;
pub mod layers;
pub mod metrics;
pub mod ops;
pub mod server;
pub mod tls;

pub use auth::Tokens;
pub use config::{parse_api_keys, ApiToken, HttpConfig, TlsFiles};
pub use error::ApiError;
pub use server::{BoundServer, HttpServer, HttpServerBuilder};
