//! ACP over stdio: stdin carries client frames, stdout only server frames.
//!
//! When stdin and stdout are pipes (how an ACP client spawns its agent),
//! they are driven by the async runtime's poller, like sockets: a frame in or
//! out is then no hand-off to a blocking thread (tokio's `Stdin`/`Stdout`
//! run every read and write on the blocking pool, two thread switches per
//! flush). This sets `O_NONBLOCK` on the pipes' open file descriptions, which
//! the client's ends (separate descriptions) do not see. Anything else (a
//! terminal, a file) keeps tokio's blocking-pool streams.

use std::os::fd::AsFd;

use berth_actors::Node;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

use crate::connection::{serve, ServeOptions};

/// Serves one ACP connection on stdin/stdout until stdin closes and every
/// in-flight request has been answered.
///
/// # Errors
/// I/O errors on stdin/stdout.
pub async fn serve_stdio(node: Node, options: ServeOptions) -> std::io::Result<()> {
    let input: Box<dyn AsyncRead + Unpin + Send> = match pipe_of(&std::io::stdin()) {
        Some(file) => match pipe::Receiver::from_file(file) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdin()),
        },
        None => Box::new(tokio::io::stdin()),
    };
    let output: Box<dyn AsyncWrite + Unpin + Send> = match pipe_of(&std::io::stdout()) {
        Some(file) => match pipe::Sender::from_file(file) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdout()),
        },
        None => Box::new(tokio::io::stdout()),
    };
    serve(node, input, output, options).await
}

/// A duplicate of `stream`'s descriptor when it is a pipe (FIFO).
fn pipe_of(stream: &impl AsFd) -> Option<std::fs::File> {
    let fd = stream.as_fd().try_clone_to_owned().ok()?;
    let file = std::fs::File::from(fd);
    use std::os::unix::fs::FileTypeExt;
    file.metadata().ok()?.file_type().is_fifo().then_some(file)
}
