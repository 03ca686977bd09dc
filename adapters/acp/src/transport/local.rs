//! ACP over a Unix domain socket: the local control socket of a running
//! `berth serve` (default `<data dir>/berth.sock`), so other processes on the
//! host — `berth event emit`, scripts — can reach the node that holds the
//! journal. The socket file is created mode 0600: only the host owner may
//! connect, and a connection is trusted like stdio.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_actors::Node;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

use crate::connection::{serve, ServeOptions};

/// Most connections served at once; more wait for a slot.
pub const MAX_CONNECTIONS: usize = 64;

/// A bound control socket; the file is removed when this is dropped.
#[derive(Debug)]
pub struct LocalSocket {
    path: PathBuf,
    listener: Option<UnixListener>,
}

impl LocalSocket {
    /// Binds `path` (replacing a stale socket file a dead berth left; the
    /// journal lock already guarantees no live berth uses this data dir) with
    /// mode 0600.
    ///
    /// # Errors
    /// I/O errors binding or setting permissions.
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        if std::fs::symlink_metadata(path).is_ok() {
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
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
    /// an ordinary ACP connection with `options`' bounds, at most
    /// [`MAX_CONNECTIONS`] at once.
    ///
    /// # Errors
    /// None today (accept errors are logged and retried); the `Result` is for
    /// the caller's `select!`.
    pub async fn serve(&mut self, node: Node, options: ServeOptions) -> std::io::Result<()> {
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
            let node = node.clone();
            tokio::spawn(async move {
                let (read, write) = stream.into_split();
                if let Err(e) = serve(node, read, write, options).await {
                    tracing::debug!(error = %e, "control socket connection ended");
                }
                drop(slot);
            });
        }
    }
}

impl Drop for LocalSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
