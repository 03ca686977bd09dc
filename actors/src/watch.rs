//! Watchers: who hears of a session's events, and from which event on.
//!
//! A watcher (typically one client connection) is registered with a watermark:
//! it is told only of events whose id is above it. Registration and publishing
//! take the same lock, and registration reads the journal under it, so a watcher
//! attaching while a turn streams gets every event exactly once — replayed or
//! live, never both, never neither.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use berth_runtime::engine::{PermissionDecision, PermissionRequest};
use berth_runtime::event::EventRecord;
use berth_runtime::ids::{EventId, SessionId};
use tokio::sync::oneshot;

/// One durable event, as a watcher receives it.
#[derive(Debug, Clone)]
pub struct SessionNotice {
    /// The session.
    pub session_id: SessionId,
    /// Its id in the session's log.
    pub event_id: EventId,
    /// The event.
    pub record: Arc<EventRecord>,
    /// `true` when re-sent by `session/load`, `false` when live.
    pub replayed: bool,
}

/// Receives a session's events. Called with the session's watcher lock held:
/// implementations must only enqueue (never block or call back into the node).
pub trait Watcher: Send + Sync {
    /// Stable id of this watcher (e.g. the connection id); attaching twice with
    /// the same id replaces the first registration.
    fn watcher_id(&self) -> u64;

    /// Delivers one notice. Returns `false` when the watcher is gone (its
    /// connection closed) so it can be dropped.
    fn notify(&self, notice: &SessionNotice) -> bool;

    /// Asks the client behind this watcher to approve a tool call; the
    /// receiver resolves with its answer. `None`: this watcher cannot be asked.
    fn request_permission(
        &self,
        session_id: &SessionId,
        request: &PermissionRequest,
    ) -> Option<oneshot::Receiver<PermissionDecision>> {
        let _ = (session_id, request);
        None
    }
}

struct Entry {
    watcher: Arc<dyn Watcher>,
    after: EventId,
}

/// The watchers of one session, and its last published event id.
#[derive(Default)]
pub struct Watchers {
    entries: Mutex<BTreeMap<u64, Entry>>,
    last_event_id: AtomicU64,
}

impl std::fmt::Debug for Watchers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchers")
            .field("count", &self.lock().len())
            .field("last_event_id", &self.last_event_id())
            .finish()
    }
}

impl Watchers {
    /// Watchers starting from a session whose log ends at `last_event_id`.
    pub fn new(last_event_id: EventId) -> Self {
        Self {
            entries: Mutex::default(),
            last_event_id: AtomicU64::new(last_event_id),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The id of the last durable event published.
    pub fn last_event_id(&self) -> EventId {
        self.last_event_id.load(Ordering::Acquire)
    }

    /// Publishes durable events (in id order) to every watcher whose watermark
    /// is below them.
    pub fn publish(
        &self,
        session_id: &SessionId,
        events: impl IntoIterator<Item = (EventId, Arc<EventRecord>)>,
    ) {
        let mut entries = self.lock();
        for (event_id, record) in events {
            self.last_event_id.fetch_max(event_id, Ordering::AcqRel);
            let notice = SessionNotice {
                session_id: session_id.clone(),
                event_id,
                record,
                replayed: false,
            };
            entries.retain(|_, e| {
                if e.after >= event_id {
                    return true;
                }
                e.after = event_id;
                e.watcher.notify(&notice)
            });
        }
    }

    /// Registers `watcher`. `backlog` runs under the lock and returns the events
    /// to replay to it (empty for no replay) and the watermark to start from;
    /// replayed events are delivered before this returns.
    ///
    /// # Errors
    /// Whatever `backlog` returns; the watcher is then not registered.
    pub fn attach<E>(
        &self,
        session_id: &SessionId,
        watcher: Arc<dyn Watcher>,
        backlog: impl FnOnce() -> Result<(Vec<(EventId, EventRecord)>, EventId), E>,
    ) -> Result<Vec<(EventId, EventRecord)>, E> {
        let mut entries = self.lock();
        let (replay, mut after) = backlog()?;
        if replay.is_empty() {
            // Re-attaching without replay keeps the watcher's position, so an
            // event committed but not yet published is not skipped.
            if let Some(existing) = entries.get(&watcher.watcher_id()) {
                after = after.min(existing.after);
            }
        }
        for (event_id, record) in &replay {
            watcher.notify(&SessionNotice {
                session_id: session_id.clone(),
                event_id: *event_id,
                record: Arc::new(record.clone()),
                replayed: true,
            });
        }
        entries.insert(watcher.watcher_id(), Entry { watcher, after });
        Ok(replay)
    }

    /// Asks the first watcher that can answer (the longest attached) to approve
    /// a tool call. `None` when no watcher can be asked.
    pub fn ask(
        &self,
        session_id: &SessionId,
        request: &PermissionRequest,
    ) -> Option<oneshot::Receiver<PermissionDecision>> {
        self.lock()
            .values()
            .find_map(|e| e.watcher.request_permission(session_id, request))
    }

    /// Removes a watcher.
    pub fn detach(&self, watcher_id: u64) {
        self.lock().remove(&watcher_id);
    }
}
