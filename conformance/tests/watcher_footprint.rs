//! What a watched session's watcher set costs while the session is parked.
//!
//! A parked session gives up its actor but keeps its `Watchers` (the
//! connections attached to it) until it rehydrates, so with 100,000 parked
//! sessions watched by the connection that created them this is paid
//! 100,000 times (bench-sched `--park`). Counted exactly: this file is its own
//! test binary, whose global allocator counts the live heap bytes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use berth_actors::watch::Watchers;
use berth_actors::{SessionNotice, Watcher};
use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::ids::SessionId;

#[global_allocator]
static ALLOCATOR: berth_conformance::counting::Counting = berth_conformance::counting::Counting;

fn live() -> isize {
    berth_conformance::counting::live_bytes()
}

/// Counts the notices it is given.
struct Counter(AtomicUsize);

impl Watcher for Counter {
    fn watcher_id(&self) -> u64 {
        1
    }
    fn notify(&self, _notice: &SessionNotice) -> bool {
        self.0.fetch_add(1, Ordering::Relaxed);
        true
    }
}

fn record() -> Arc<EventRecord> {
    Arc::new(EventRecord::new(
        chrono::DateTime::from_timestamp_millis(0).expect("epoch"),
        SessionEvent::SessionClosed {},
    ))
}

/// One connection watching sessions whose events were published in order
/// (a session's life up to parking): each set holds its one entry and no
/// held-back events, in well under 200 bytes (the set itself is 88; a
/// `BTreeMap` of watchers held a 368-byte node for the one entry, and the
/// emptied map of held events kept its 192-byte root node).
#[test]
fn a_parked_sessions_watcher_set_holds_its_entries_and_nothing_more() {
    const SESSIONS: usize = 1_000;
    let sid = SessionId::from("s");
    let connection = Arc::new(Counter(AtomicUsize::new(0)));
    let watcher: Arc<dyn Watcher> = connection.clone();
    let events: Vec<_> = (1..=4).map(|id| (id, record())).collect();

    let before = live();
    let sets: Vec<Arc<Watchers>> = (0..SESSIONS)
        .map(|_| {
            let set = Arc::new(Watchers::new(0));
            set.attach::<()>(&sid, Arc::clone(&watcher), || Ok((Vec::new(), 0)))
                .expect("attach");
            // In order, and one out of order (the turn's commit before the
            // actor's): both leave nothing held.
            set.publish(&sid, events[..2].iter().cloned());
            set.publish(&sid, [events[3].clone()]);
            set.publish(&sid, [events[2].clone()]);
            set
        })
        .collect();
    let per_set = (live() - before) as usize / SESSIONS;

    assert_eq!(connection.0.load(Ordering::Relaxed), 4 * SESSIONS);
    assert!(sets
        .iter()
        .all(|s| s.last_event_id() == 4 && s.count() == 1));
    assert!(
        per_set < 200,
        "a watched parked session's watcher set holds {per_set} bytes"
    );
}
