//! ACP over stdio: stdin carries client frames, stdout only server frames.
//!
//! When stdin and stdout are pipes (how an ACP client spawns its agent),
//! they are driven by the async runtime's poller, like sockets: a frame in or
//! out is then no hand-off to a blocking thread (tokio's `Stdin`/`Stdout`
//! run every read and write on the blocking pool, two thread switches per
//! flush). Non-blocking I/O needs `O_NONBLOCK`, which lives on the open file
//! description, and berth's fds 0 and 1 may share theirs with other programs
//! (the rest of a shell pipeline): setting it there would make their writes
//! fail with `EAGAIN`, during berth's run and after it (even a SIGKILL'd
//! one). So each pipe is opened anew through `/proc/self/fd/N`, which gives
//! berth a description of its own, and only that one is non-blocking.
//! Anything else (a terminal, a file, no `/proc`, a pipe with no reader)
//! keeps tokio's blocking-pool streams.

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
    let input: Box<dyn AsyncRead + Unpin + Send> = match pipe_of(&std::io::stdin(), false) {
        Some(file) => match pipe::Receiver::from_file(file) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdin()),
        },
        None => Box::new(tokio::io::stdin()),
    };
    let output: Box<dyn AsyncWrite + Unpin + Send> = match pipe_of(&std::io::stdout(), true) {
        Some(file) => match pipe::Sender::from_file(file) {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdout()),
        },
        None => Box::new(tokio::io::stdout()),
    };
    serve(node, input, output, options).await
}

/// `stream`'s pipe (FIFO) opened anew, non-blocking, with an open file
/// description of its own (see the module doc); `None` when it is not a
/// pipe or cannot be reopened (`write`: opening a pipe with no reader fails
/// with `ENXIO`).
fn pipe_of(stream: &impl AsFd, write: bool) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let fd = stream.as_fd();
    let is_pipe = std::fs::File::from(fd.try_clone_to_owned().ok()?)
        .metadata()
        .ok()?
        .file_type()
        .is_fifo();
    if !is_pipe {
        return None;
    }
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .ok()
}
