//! The listener's sockets: TCP, or TLS through rustls (ring provider), with
//! a bound on sockets served at once.
//!
//! Accepting runs in its own task: it accepts, takes a connection slot, and
//! (with TLS) runs each handshake in a task of its own bounded by the
//! handshake timeout, so one slow or silent client never holds up the
//! others. When every slot is taken, the connection idle the longest (no
//! request in flight, not a WebSocket: silent, trickling its head, in its
//! handshake, or keep-alive between requests) is closed to make room, so a
//! flood of idle connections cannot lock out `/healthz`, `/readyz` or
//! `/metrics`; when every connection is busy, the new one waits for a slot.
//! Finished sockets are handed to the server through [`BoundedListener`],
//! each carrying its slot until it closes.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::conns::{Registry, Tracked};

/// Errors loading TLS material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file is unreadable or holds no certificate.
    #[error("TLS certificate {path}: {reason}")]
    Cert {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The key file is unreadable or holds no private key.
    #[error("TLS key {path}: {reason}")]
    Key {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The certificate and key do not make a server configuration.
    #[error("TLS certificate and key do not match or are unsupported: {0}")]
    Config(String),
}

/// Loads a certificate chain and key (PEM) into a rustls acceptor that
/// speaks HTTP/1.1 (ALPN `http/1.1`).
///
/// # Errors
/// [`TlsError`] naming the file and what is wrong.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let cert_err = |reason: String| TlsError::Cert {
        path: cert.display().to_string(),
        reason,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_err("no CERTIFICATE block in the file".into()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.display().to_string(),
        reason: format!("{e} (expected a PKCS#8, PKCS#1 or SEC1 PEM private key)"),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// One accepted socket, plain or TLS, holding its connection slot.
pub struct Conn {
    stream: Stream,
    tracked: Tracked,
    _slot: OwnedSemaphorePermit,
}

impl Conn {
    /// Its entry in the listener's book of connections.
    pub(crate) fn tracked(&self) -> &Tracked {
        &self.tracked
    }
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// The axum listener: yields sockets the accept task finished.
pub struct BoundedListener {
    ready: mpsc::Receiver<(Conn, SocketAddr)>,
    local_addr: SocketAddr,
    accept_task: tokio::task::JoinHandle<()>,
}

impl BoundedListener {
    /// Starts accepting on `listener`: at most `max_connections` sockets at
    /// once (at the cap, the longest-idle one is closed for a new one), each
    /// through `tls` (when given) within `handshake_timeout`.
    ///
    /// # Errors
    /// The listener's local address cannot be read.
    pub fn start(
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
        max_connections: usize,
        handshake_timeout: Duration,
    ) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let slots = Arc::new(Semaphore::new(max_connections.max(1)));
        let registry = Arc::new(Registry::default());
        let accept_task = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors and the like: back off briefly.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let slot = match Arc::clone(&slots).try_acquire_owned() {
                    Ok(slot) => slot,
                    Err(_) => {
                        if registry.evict_oldest_idle() {
                            tracing::debug!(%peer, "at the connection cap: closed the longest-idle connection");
                        }
                        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                            return;
                        };
                        slot
                    }
                };
                let tracked = registry.register();
                let _ = tcp.set_nodelay(true);
                match &tls {
                    None => {
                        let conn = Conn {
                            stream: Stream::Plain(tcp),
                            tracked,
                            _slot: slot,
                        };
                        if tx.send((conn, peer)).await.is_err() {
                            return;
                        }
                    }
                    Some(acceptor) => {
                        let acceptor = acceptor.clone();
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            let evicted = tracked.evicted();
                            let handshake =
                                tokio::time::timeout(handshake_timeout, acceptor.accept(tcp));
                            let done = tokio::select! {
                                done = handshake => done,
                                () = evicted.notified() => {
                                    tracing::debug!(%peer, "TLS handshake evicted at the connection cap");
                                    return;
                                }
                            };
                            match done {
                                Ok(Ok(tls)) => {
                                    let conn = Conn {
                                        stream: Stream::Tls(Box::new(tls)),
                                        tracked,
                                        _slot: slot,
                                    };
                                    let _ = tx.send((conn, peer)).await;
                                }
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed")
                                }
                                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                            }
                        });
                    }
                }
            }
        });
        Ok(Self {
            ready,
            local_addr,
            accept_task,
        })
    }
}

impl Drop for BoundedListener {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl axum::serve::Listener for BoundedListener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept task ended (it only does when dropped): serve
            // nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
