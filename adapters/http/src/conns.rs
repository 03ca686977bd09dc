//! The listener's book of open connections: which ones are busy (a request
//! in flight, or upgraded to a WebSocket) and since when the others have
//! been idle, so that at the connection cap the oldest idle one can be
//! closed to make room, and an idle one past the idle timeout is closed.
//!
//! "Idle" is a connection with no request in flight that is not upgraded:
//! one that has sent nothing yet, one still trickling its request head, one
//! in its TLS handshake, or a keep-alive connection between requests. A
//! request is in flight from the moment its head is parsed until its
//! response body has been sent whole (an SSE stream stays busy while it
//! streams).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

struct Entry {
    in_flight: usize,
    upgraded: bool,
    idle_since: Instant,
    close: Arc<Notify>,
}

/// Every open connection of one listener.
#[derive(Default)]
pub(crate) struct Registry {
    entries: Mutex<HashMap<u64, Entry>>,
    next_id: AtomicU64,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Books a newly accepted connection (idle since now).
    pub(crate) fn register(self: &Arc<Self>) -> Tracked {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let close = Arc::new(Notify::new());
        self.lock().insert(
            id,
            Entry {
                in_flight: 0,
                upgraded: false,
                idle_since: Instant::now(),
                close: Arc::clone(&close),
            },
        );
        Tracked {
            handle: Handle {
                id,
                registry: Arc::clone(self),
            },
            close,
        }
    }

    /// Tells the idle connection idle the longest to close, and forgets it.
    /// Returns `false` when every open connection is busy.
    pub(crate) fn evict_oldest_idle(&self) -> bool {
        let mut entries = self.lock();
        let oldest = entries
            .iter()
            .filter(|(_, e)| e.in_flight == 0 && !e.upgraded)
            .min_by_key(|(_, e)| e.idle_since)
            .map(|(id, _)| *id);
        match oldest.and_then(|id| entries.remove(&id)) {
            Some(entry) => {
                entry.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// A booked connection; dropping it (the socket closes) removes the entry.
pub(crate) struct Tracked {
    handle: Handle,
    close: Arc<Notify>,
}

impl Tracked {
    /// A handle the connection's service keeps.
    pub(crate) fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Resolves when the listener evicts this connection.
    pub(crate) fn evicted(&self) -> Arc<Notify> {
        Arc::clone(&self.close)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.handle.registry.lock().remove(&self.handle.id);
    }
}

/// A connection's entry, for its request service and its idle watchdog.
#[derive(Clone)]
pub(crate) struct Handle {
    id: u64,
    registry: Arc<Registry>,
}

impl Handle {
    /// A request of this connection starts; it ends when the guard drops.
    pub(crate) fn begin(&self) -> RequestGuard {
        if let Some(e) = self.registry.lock().get_mut(&self.id) {
            e.in_flight += 1;
        }
        RequestGuard {
            handle: self.clone(),
        }
    }

    /// When this connection passes `idle` without a request in flight;
    /// `None` while it is busy (or upgraded, or already evicted).
    pub(crate) fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        let entries = self.registry.lock();
        let e = entries.get(&self.id)?;
        (e.in_flight == 0 && !e.upgraded).then(|| e.idle_since + idle)
    }
}

/// One request in flight (held by its response body until sent whole).
pub(crate) struct RequestGuard {
    handle: Handle,
}

impl RequestGuard {
    /// The response switched protocols (a WebSocket): the connection is
    /// never idle again in the listener's sense; the upgraded protocol
    /// bounds it.
    pub(crate) fn upgraded(&self) {
        if let Some(e) = self.handle.registry.lock().get_mut(&self.handle.id) {
            e.upgraded = true;
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if let Some(e) = self.handle.registry.lock().get_mut(&self.handle.id) {
            e.in_flight = e.in_flight.saturating_sub(1);
            if e.in_flight == 0 {
                e.idle_since = Instant::now();
            }
        }
    }
}
