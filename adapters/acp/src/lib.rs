//! # berth-acp
//!
//! ACP (Agent Client Protocol, v1) over newline-delimited JSON-RPC 2.0: a thin
//! adapter that decodes a frame, sends a typed message to the session's actor
//! through the [`berth_actors::Node`], and encodes the answer.
//!
//! - [`transport`]: framing (one JSON-RPC message per line, bounded length) and
//!   the stdio entry point [`transport::stdio::serve_stdio`].
//! - [`connection`]: one client connection: concurrent request handling with a
//!   bound on in-flight requests, an ordered outbound queue, and the watcher
//!   that turns durable session events into `session/update` notifications.
//! - [`methods`]: one file per ACP method group.
//! - [`render`]: journaled events → ACP `session/update` / `_berth/agentEvent`.
//! - [`jsonrpc`]: message classification and the typed errors (codes + `data`).
//!
//! stdout carries only ACP frames; logs go to stderr.

#![warn(missing_docs)]

pub mod connection;
pub mod jsonrpc;
pub mod methods;
pub mod render;
pub mod transport;

pub use connection::{serve, ServeOptions};
