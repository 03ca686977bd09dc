//! Transports. ACP over stdio: one JSON-RPC message per line
//! ([`framing::read_frame`]); [`stdio::serve_stdio`] runs a connection on the
//! process's stdin/stdout.

pub mod framing;
pub mod stdio;
