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
use tokio_util::sync::CancellationToken;

use crate::connection::{serve_until, ServeOptions};

/// Serves one ACP connection on stdin/stdout until stdin closes and every
/// in-flight request has been answered, or until `stop` is cancelled: then
/// it stops reading, drops the requests in flight, and returns once the
/// frames already queued are written whole (so a client reading up to the
/// end of stdout never meets half a frame; a client that stops reading
/// keeps it from returning, so the caller bounds the wait).
///
/// # Errors
/// I/O errors on stdin/stdout.
pub async fn serve_stdio(
    node: Node,
    options: ServeOptions,
    stop: CancellationToken,
) -> std::io::Result<()> {
    serve_until(
        node,
        None,
        tokio::io::stdin(),
        tokio::io::stdout(),
        options,
        stop,
    )
    .await
}
