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
//!
//! A parent that stops reading stdout: frames wait in the connection's
//! queue up to [`MAX_OUTBOUND_BYTES`] (64 MiB, the WebSocket default), so
//! berth's memory stays bounded whatever the sessions produce. A
//! `session/load` replay waits for room (it is streamed under the bound, so
//! a paused parent gets it whole when it reads again); live notifications
//! do not wait, and one frame past the bound cuts the connection off: nothing more is queued (the events stay in
//! the journal), stdin is no longer read, and [`serve_stdio`] returns an
//! error once the write in progress returns (a blocked pipe write cannot be
//! abandoned), and berth exits as when its transport fails. There is no
//! send deadline: the parent is the one client, and may pause (a debugger,
//! `SIGSTOP`) without losing its connection as long as less than the bound
//! piles up meanwhile.

use berth_actors::Node;
use tokio_util::sync::CancellationToken;

use crate::connection::{serve_bounded, LineBounds, ServeOptions};

/// Bytes of frames that may wait for a parent that does not read stdout.
pub const MAX_OUTBOUND_BYTES: u64 = 64 * 1024 * 1024;

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
    serve_bounded(
        node,
        None,
        tokio::io::stdin(),
        tokio::io::stdout(),
        options,
        LineBounds {
            max_outbound_bytes: Some(MAX_OUTBOUND_BYTES),
            send_timeout: None,
            total_bytes: None,
        },
        stop,
    )
    .await
}
