//! ACP over stdio: stdin carries client frames, stdout only server frames.
//!
//! tokio's `Stdin`/`Stdout` run each read and write on the blocking pool. A
//! pipe driven by the runtime's poller instead (reopened through
//! `/proc/self/fd/N`, so that `O_NONBLOCK` never touches a description
//! shared with the rest of a shell pipeline) was tried: it halved the
//! context switches per tool step but moved steps/s within noise, and with
//! 100,000 sessions parked over one connection it held about 400 MiB more
//! RSS (952 vs 540 MiB after passivation, `bench-sched --park 100000`), so
//! stdio stays on tokio's streams.

use berth_actors::Node;

use crate::connection::{serve, ServeOptions};

/// Serves one ACP connection on stdin/stdout until stdin closes and every
/// in-flight request has been answered.
///
/// # Errors
/// I/O errors on stdin/stdout.
pub async fn serve_stdio(node: Node, options: ServeOptions) -> std::io::Result<()> {
    serve(node, tokio::io::stdin(), tokio::io::stdout(), options).await
}
