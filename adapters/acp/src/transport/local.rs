//! ACP over a Unix domain socket: the local control socket of a running
//! `berth serve` (default `<data dir>/berth.sock`), so other processes on the
//! host — `berth event emit`, scripts — can reach the node that holds the
//! journal. The socket file is created mode 0600: only the host owner may
//! connect, and a connection is trusted like stdio — except one from a
//! process inside a session's tool call (its peer pid descends from a live
//! tool supervisor): tool processes run as berth's user, and a session must
//! not drive berth as the host owner. That connection gets one JSON-RPC error
//! ([`TOOL_PROCESS_REFUSED`], id null) and is closed.
//!
//! What waits for a client is bounded as on a WebSocket
//! ([`default_bounds`]): at most [`MAX_OUTBOUND_BYTES`] (64 MiB) of frames
//! are queued per connection (one more cuts it off), and every write must
//! be taken within [`SEND_TIMEOUT`] (5 s): a client that stops reading
//! fills the socket's buffer, the next write passes the deadline, and the
//! connection is closed and its queue freed. The client reconnects and
//! catches up with `session/load` + `_meta.berth.lastEventId`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_actors::Node;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

use crate::connection::{serve_bounded, LineBounds, ServeOptions};

/// Most connections served at once; more wait for a slot.
pub const MAX_CONNECTIONS: usize = 64;

/// Removes the file at `path` if there is one and it is berth's user's
/// (a socket a dead berth left); refuses another user's.
fn remove_own(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.uid() != nix::unistd::geteuid().as_raw() => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} belongs to uid {}, not to uid {} that berth runs as; it is not \
                     replaced (remove it, and make the data dir private: `chmod 700`)",
                path.display(),
                meta.uid(),
                nix::unistd::geteuid().as_raw()
            ),
        )),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Checks, before a client connects, that the socket at `path` is a socket
/// owned by the user the client runs as (a socket another user planted
/// would receive the client's requests and answer them).
///
/// # Errors
/// [`std::io::ErrorKind::PermissionDenied`] naming the owner for another
/// user's file or a file that is no socket; I/O errors reading it.
pub fn check_owner(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::symlink_metadata(path)?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.file_type().is_socket() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} is not a socket", path.display()),
        ));
    }
    if meta.uid() != me {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "the control socket {} belongs to uid {}, not to uid {me} this command runs as; \
                 it is not used (another user may have planted it)",
                path.display(),
                meta.uid()
            ),
        ));
    }
    Ok(())
}

/// Bytes of frames that may wait for one control socket client (the
/// WebSocket transport's default bound).
pub const MAX_OUTBOUND_BYTES: u64 = 64 * 1024 * 1024;

/// Longest one write to a control socket client may take (the WebSocket
/// transport's default send deadline).
pub const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The bounds [`LocalSocket::serve`] uses: [`MAX_OUTBOUND_BYTES`],
/// [`SEND_TIMEOUT`].
pub fn default_bounds() -> LineBounds {
    LineBounds {
        max_outbound_bytes: Some(MAX_OUTBOUND_BYTES),
        send_timeout: Some(SEND_TIMEOUT),
        total_bytes: None,
    }
}

/// A bound control socket; the file is removed when this is dropped.
#[derive(Debug)]
pub struct LocalSocket {
    path: PathBuf,
    listener: Option<UnixListener>,
}

impl LocalSocket {
    /// Binds `path` (replacing a stale socket file a dead berth left; the
    /// journal lock already guarantees no live berth uses this data dir) with
    /// mode 0600 from the moment it appears: the socket is bound at
    /// `path` + `.new`, set 0600, then renamed to `path`.
    ///
    /// # Errors
    /// I/O errors binding or setting permissions;
    /// [`std::io::ErrorKind::PermissionDenied`] when a file at `path` (or
    /// the temporary name) belongs to another user: it is left alone.
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        let mut staging = path.as_os_str().to_owned();
        staging.push(".new");
        let staging = PathBuf::from(staging);
        remove_own(&staging)?;
        remove_own(path)?;
        let listener = UnixListener::bind(&staging)?;
        let placed = std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&staging, path));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&staging);
            return Err(e);
        }
        Ok(Self {
            path: path.to_owned(),
            listener: Some(listener),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves ACP connections until the task is dropped; each connection is
    /// an ordinary ACP connection with `options`' bounds and
    /// [`default_bounds`], at most [`MAX_CONNECTIONS`] at once.
    ///
    /// # Errors
    /// None today (accept errors are logged and retried); the `Result` is for
    /// the caller's `select!`.
    pub async fn serve(&mut self, node: Node, options: ServeOptions) -> std::io::Result<()> {
        self.serve_with(node, options, default_bounds()).await
    }

    /// [`LocalSocket::serve`] with other outbound `bounds` (each connection
    /// gets them; `bounds.total_bytes` sums the bytes queued over all).
    ///
    /// # Errors
    /// As [`LocalSocket::serve`].
    pub async fn serve_with(
        &mut self,
        node: Node,
        options: ServeOptions,
        bounds: LineBounds,
    ) -> std::io::Result<()> {
        let Some(listener) = self.listener.take() else {
            return Ok(());
        };
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return Ok(());
            };
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                // Out of descriptors and the like: the node goes on serving
                // stdio; try again shortly.
                Err(e) => {
                    tracing::warn!(error = %e, "control socket accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            if let Some(pid) = tool_process(&stream) {
                tracing::warn!(pid, "control socket connection from a tool process refused");
                tokio::spawn(refuse(stream, slot));
                continue;
            }
            let node = node.clone();
            let bounds = bounds.clone();
            tokio::spawn(async move {
                let (read, write) = stream.into_split();
                let stop = tokio_util::sync::CancellationToken::new();
                if let Err(e) = serve_bounded(node, None, read, write, options, bounds, stop).await
                {
                    tracing::debug!(error = %e, "control socket connection ended");
                }
                drop(slot);
            });
        }
    }
}

/// The JSON-RPC error code a refused connection gets (the not-authorized
/// code, `-32011`; `data.reason` is `"tool_process"`): the peer runs inside a
/// tool call's process tree.
pub const TOOL_PROCESS_REFUSED: i64 = -32011;

/// The peer's pid when it runs inside a tool call's process tree
/// ([`berth_runtime::tools::supervisor::is_in_tool_tree`]): a session's tool
/// must not drive berth as the host owner. A peer whose credentials cannot be
/// read is refused too.
fn tool_process(stream: &tokio::net::UnixStream) -> Option<i32> {
    match stream.peer_cred().map(|c| c.pid()) {
        Ok(Some(pid)) => berth_runtime::tools::supervisor::is_in_tool_tree(pid).then_some(pid),
        _ => Some(0),
    }
}

/// Answers a refused connection with one JSON-RPC error (id null) and closes
/// it.
async fn refuse(mut stream: tokio::net::UnixStream, slot: tokio::sync::OwnedSemaphorePermit) {
    use tokio::io::AsyncWriteExt;
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {
            "code": TOOL_PROCESS_REFUSED,
            "message": "the control socket does not serve tool processes: this connection \
                        comes from inside a session's tool call",
            "data": {"reason": "tool_process"},
        },
    });
    let mut line = error.to_string();
    line.push('\n');
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
        let _ = stream.write_all(line.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
    drop(slot);
}

impl Drop for LocalSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
