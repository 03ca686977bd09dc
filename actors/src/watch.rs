//! Watchers: who hears of a session's events, and from which event on.
//!
//! A watcher (typically one client connection) is registered with a watermark:
//! it is told only of events whose id is above it. Registration and publishing
//! take the same lock, and registration reads the journal under it, so a watcher
//! attaching while a turn streams gets every event exactly once — replayed or
//! live, never both, never neither.
//!
//! Two writers append to a session's log (its actor and its running turn), so
//! their commits can finish in one order and be published in the other.
//! Publishing therefore releases events strictly in id order: an event whose
//! predecessor is not published yet is held until it is.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use berth_runtime::engine::{PermissionDecision, PermissionRequest};
use berth_runtime::event::EventRecord;
use berth_runtime::ids::{EventId, SessionId};
use serde::Serialize;
use tokio::sync::oneshot;

use crate::auth::Principal;

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
    /// The watcher (connection) whose request wrote this event, when it was
    /// published live for one (`session/prompt`'s `turn_started`): that
    /// client already shows what it sent. `None` for replayed events.
    pub origin: Option<u64>,
}

/// Whether a client attached to or detached from a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PresenceChange {
    /// It attached (`session/load`, `session/resume`, or its first control).
    Attached,
    /// It detached (its connection closed or stopped reading).
    Detached,
}

/// An attach or detach, announced to the session's *other* watchers
/// (`_berth/presence`, issue 8). Presence is not journaled: it describes
/// connections, which do not survive a restart.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PresenceNotice {
    /// The session.
    pub session_id: SessionId,
    /// Attached or detached.
    pub change: PresenceChange,
    /// The client's watcher (connection) id.
    pub connection_id: u64,
    /// Who it is (authenticated actor and role).
    pub principal: Principal,
    /// The session's last published event id when it happened (the cursor
    /// the presence change sits at).
    pub event_id: EventId,
    /// Clients attached after the change.
    pub attached: usize,
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

    /// Who is behind this watcher, for presence announcements; `None`: it
    /// is not announced (an internal watcher).
    fn principal(&self) -> Option<Principal> {
        None
    }

    /// Hears that another client attached or detached. Returns `false` when
    /// the watcher is gone.
    fn presence(&self, notice: &PresenceNotice) -> bool {
        let _ = notice;
        true
    }
}

struct Entry {
    id: u64,
    watcher: Arc<dyn Watcher>,
    after: EventId,
}

/// The watchers of one session, and its last published event id.
#[derive(Default)]
pub struct Watchers {
    entries: Mutex<Inner>,
    last_event_id: AtomicU64,
}

/// The watchers and the events held back for order. A parked session keeps
/// its `Watchers` after its actor passivated (in
/// [`Passivated`](crate::session::passivate::Passivated)), so this is what
/// every parked session that a connection watches costs: the watchers are a
/// vector sorted by id (one or two entries, typically: a `BTreeMap` would
/// hold a 368-byte node for one), and `held` owns no node while empty.
#[derive(Default)]
struct Inner {
    /// Sorted by watcher id, ids unique.
    watchers: Vec<Entry>,
    /// Last event id released to watchers (all below it were released).
    released: EventId,
    /// Durable events waiting for a lower id to be published first (empty,
    /// without an allocated node, unless commits finish out of order).
    held: BTreeMap<EventId, Pending>,
}

/// A durable event on its way to the watchers, with the watcher whose
/// request wrote it (see [`SessionNotice::origin`]).
type Pending = (Arc<EventRecord>, Option<u64>);

impl Inner {
    /// Where watcher `id` is, or where it would be inserted.
    fn find(&self, id: u64) -> Result<usize, usize> {
        self.watchers.binary_search_by_key(&id, |e| e.id)
    }

    /// The next event to release: the first of `incoming` (in order) or the
    /// held one that follows `released`, if it is there.
    fn next_ready(
        &mut self,
        incoming: &mut impl Iterator<Item = (EventId, Pending)>,
    ) -> Option<(EventId, Pending)> {
        loop {
            if let Some(entry) = self.held.first_entry() {
                if *entry.key() == self.released + 1 {
                    let next = entry.remove_entry();
                    if self.held.is_empty() {
                        // An emptied map keeps its root node: drop it.
                        self.held = BTreeMap::new();
                    }
                    return Some(next);
                }
            }
            let (event_id, record) = incoming.next()?;
            if event_id == self.released + 1 {
                return Some((event_id, record));
            }
            if event_id > self.released {
                self.held.insert(event_id, record);
            }
        }
    }
}

impl std::fmt::Debug for Watchers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchers")
            .field("count", &self.lock().watchers.len())
            .field("last_event_id", &self.last_event_id())
            .finish()
    }
}

impl Watchers {
    /// Watchers starting from a session whose log ends at `last_event_id`.
    pub fn new(last_event_id: EventId) -> Self {
        Self {
            entries: Mutex::new(Inner {
                released: last_event_id,
                ..Inner::default()
            }),
            last_event_id: AtomicU64::new(last_event_id),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
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
        self.publish_from(session_id, events, None);
    }

    /// [`Watchers::publish`] for events a watcher's request wrote: their
    /// notices carry `origin` ([`SessionNotice::origin`]).
    pub fn publish_from(
        &self,
        session_id: &SessionId,
        events: impl IntoIterator<Item = (EventId, Arc<EventRecord>)>,
        origin: Option<u64>,
    ) {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let mut incoming = events
            .into_iter()
            .map(|(event_id, record)| (event_id, (record, origin)));
        while let Some((event_id, (record, origin))) = inner.next_ready(&mut incoming) {
            inner.released = event_id;
            // Every durable event is released here exactly once, whichever
            // path committed it: the one place receipts are counted.
            crate::metrics::count_receipts([&record.event]);
            self.last_event_id.store(event_id, Ordering::Release);
            let notice = SessionNotice {
                session_id: session_id.clone(),
                event_id,
                record,
                replayed: false,
                origin,
            };
            let mut gone = Vec::new();
            inner.watchers.retain_mut(|e| {
                if e.after >= event_id {
                    return true;
                }
                e.after = event_id;
                let kept = e.watcher.notify(&notice);
                if !kept {
                    gone.push(Arc::clone(&e.watcher));
                }
                kept
            });
            for watcher in gone {
                announce(inner, session_id, &*watcher, PresenceChange::Detached);
            }
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
        let mut inner = self.lock();
        let (replay, mut after) = backlog()?;
        let id = watcher.watcher_id();
        let slot = inner.find(id);
        if replay.is_empty() {
            // Re-attaching without replay keeps the watcher's position, so an
            // event committed but not yet published is not skipped.
            if let Ok(i) = slot {
                after = after.min(inner.watchers[i].after);
            }
        }
        for (event_id, record) in &replay {
            watcher.notify(&SessionNotice {
                session_id: session_id.clone(),
                event_id: *event_id,
                record: Arc::new(record.clone()),
                replayed: true,
                origin: None,
            });
        }
        let entry = Entry {
            id,
            watcher: Arc::clone(&watcher),
            after,
        };
        let new = match slot {
            Ok(i) => {
                inner.watchers[i] = entry;
                false
            }
            Err(i) => {
                // Grown one at a time: a session has a few watchers, and a
                // parked one keeps them (a doubling vector held 4 slots for 1).
                inner.watchers.reserve_exact(1);
                inner.watchers.insert(i, entry);
                true
            }
        };
        if new {
            announce(&mut inner, session_id, &*watcher, PresenceChange::Attached);
        }
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
            .watchers
            .iter()
            .find_map(|e| e.watcher.request_permission(session_id, request))
    }

    /// Removes a watcher and announces it to the others.
    pub fn detach(&self, session_id: &SessionId, watcher_id: u64) {
        let mut inner = self.lock();
        if let Ok(i) = inner.find(watcher_id) {
            let entry = inner.watchers.remove(i);
            if inner.watchers.is_empty() {
                inner.watchers = Vec::new();
            }
            announce(
                &mut inner,
                session_id,
                &*entry.watcher,
                PresenceChange::Detached,
            );
        }
    }

    /// Whether no watcher is attached.
    pub fn is_empty(&self) -> bool {
        self.lock().watchers.is_empty()
    }

    /// How many watchers are attached.
    pub fn count(&self) -> usize {
        self.lock().watchers.len()
    }
}

/// Tells every watcher except `subject` that `subject` attached or detached
/// (only a watcher with a principal is announced); drops watchers that are
/// gone.
fn announce(
    inner: &mut Inner,
    session_id: &SessionId,
    subject: &dyn Watcher,
    change: PresenceChange,
) {
    let Some(principal) = subject.principal() else {
        return;
    };
    let notice = PresenceNotice {
        session_id: session_id.clone(),
        change,
        connection_id: subject.watcher_id(),
        principal,
        event_id: inner.released,
        attached: inner.watchers.len(),
    };
    inner
        .watchers
        .retain(|e| e.id == notice.connection_id || e.watcher.presence(&notice));
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_runtime::event::SessionEvent;

    struct Recorder(Mutex<Vec<EventId>>);

    impl Watcher for Recorder {
        fn watcher_id(&self) -> u64 {
            1
        }
        fn notify(&self, notice: &SessionNotice) -> bool {
            self.0.lock().unwrap().push(notice.event_id);
            true
        }
    }

    fn record() -> Arc<EventRecord> {
        Arc::new(EventRecord::new(
            chrono::DateTime::from_timestamp_millis(0).unwrap(),
            SessionEvent::SessionClosed {},
        ))
    }

    #[test]
    fn events_published_out_of_order_are_released_in_order() {
        let sid = SessionId::from("s");
        let watchers = Watchers::new(4);
        let recorder = Arc::new(Recorder(Mutex::default()));
        watchers
            .attach::<()>(&sid, recorder.clone(), || Ok((Vec::new(), 4)))
            .unwrap();
        // The turn's commit (6) is published before the actor's (5).
        watchers.publish(&sid, [(6, record())]);
        assert!(recorder.0.lock().unwrap().is_empty(), "6 waits for 5");
        assert_eq!(watchers.last_event_id(), 4);
        watchers.publish(&sid, [(5, record())]);
        watchers.publish(&sid, [(7, record()), (8, record())]);
        assert_eq!(*recorder.0.lock().unwrap(), vec![5, 6, 7, 8]);
        assert_eq!(watchers.last_event_id(), 8);
    }
}
