//! Transports. ACP over stdio: one JSON-RPC message per line
//! ([`framing::read_frame`]); [`stdio::serve_stdio`] runs a connection on the
//! process's stdin/stdout; [`local::LocalSocket`] serves connections on the
//! node's Unix control socket; [`websocket::router`] serves connections over
//! WebSocket at `/acp` (one message per text frame).

pub mod framing;
pub mod local;
pub mod stdio;
pub mod websocket;
