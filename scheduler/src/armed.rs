//! What the scheduler holds: per pending wake-up its due time and session,
//! and per event-waiting session its name patterns. Nothing else — the full
//! wake-up (timeout action, input, filters) stays in the journal and is read
//! when it fires, so a million pending timers cost about 100 bytes each.

use std::collections::{BTreeSet, HashMap, HashSet};

use berth_runtime::suspension::{DueKind, Wakeup};
use chrono::{DateTime, Utc};

/// A due time in whole milliseconds, rounded up, so that nothing fires
/// before it is due (the clock is read in truncated milliseconds).
pub(crate) fn due_ms(due: DateTime<Utc>) -> i64 {
    due.timestamp_millis() + i64::from(!due.timestamp_subsec_nanos().is_multiple_of(1_000_000))
}

/// What a due entry is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Key {
    /// A parked session's wake-up (the journal's `wakeups` row of that
    /// session says what it does), and whether its earliest due time is a
    /// time trigger's (`true`) or the timeout's.
    Session(Box<str>, bool),
    /// A standing schedule's next run.
    Schedule(Box<str>),
}

/// The compact form of one wake-up, built by [`Entry::of`] on the caller's
/// thread so that the scheduler thread only moves small values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub(crate) session: Box<str>,
    pub(crate) due_ms: Option<i64>,
    /// The earliest due time is a time trigger's (not the timeout's).
    pub(crate) trigger: bool,
    pub(crate) patterns: Vec<Box<str>>,
}

impl Entry {
    /// The entry of `wakeup`: its session, its earliest due time (rounded up
    /// to the millisecond) and its event-name patterns (`onEvent` and an
    /// event trigger's).
    pub fn of(wakeup: &Wakeup) -> Self {
        let next = wakeup.next_due();
        Self {
            session: wakeup.session_id.as_str().into(),
            due_ms: next.map(|(due, _)| due_ms(due)),
            trigger: next.is_some_and(|(_, kind)| kind == DueKind::Trigger),
            patterns: wakeup
                .on_event
                .iter()
                .chain(wakeup.trigger_event.iter().map(|(p, _)| p))
                .map(|p| p.as_str().into())
                .collect(),
        }
    }
}

/// How many wake-ups the scheduler holds, by kind (the
/// `berth_pending_wakeups` gauge).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pending {
    /// Parked sessions whose next due time is their timeout.
    pub timeouts: usize,
    /// Parked sessions whose next due time is a time trigger (`at` or
    /// `after`).
    pub triggers: usize,
    /// Event subscriptions of parked sessions: (session, event-name
    /// pattern) pairs from `onEvent` and event triggers.
    pub events: usize,
    /// Standing schedules with an armed next run.
    pub schedules: usize,
}

/// The scheduler's state: the due order and the event index.
#[derive(Default)]
pub(crate) struct Armed {
    /// Every pending due time, earliest first: firing pops from the front,
    /// never scans.
    pub(crate) due: BTreeSet<(i64, Key)>,
    /// How many of `due` are sessions' (the rest are schedules').
    pub(crate) sessions: usize,
    /// How many of those sessions' are time triggers (the rest timeouts).
    triggers: usize,
    /// (session, pattern) pairs in `exact` and `prefixed`.
    events: usize,
    /// Schedule id → its armed run (so moving a run finds the old one).
    schedules: HashMap<Box<str>, i64>,
    /// Exact event name → sessions waiting for it.
    exact: HashMap<Box<str>, HashSet<Box<str>>>,
    /// Sessions waiting on a trailing-`*` pattern, with the prefixes.
    prefixed: HashMap<Box<str>, Vec<Box<str>>>,
}

impl Armed {
    pub(crate) fn insert(&mut self, entry: Entry) {
        if let Some(due) = entry.due_ms {
            let key = Key::Session(entry.session.clone(), entry.trigger);
            if self.due.insert((due, key)) {
                self.sessions += 1;
                self.triggers += usize::from(entry.trigger);
            }
        }
        for pattern in entry.patterns {
            match pattern.strip_suffix('*') {
                Some(prefix) => {
                    let prefixes = self.prefixed.entry(entry.session.clone()).or_default();
                    if !prefixes.iter().any(|p| **p == *prefix) {
                        prefixes.push(prefix.into());
                        self.events += 1;
                    }
                }
                None => {
                    if self
                        .exact
                        .entry(pattern)
                        .or_default()
                        .insert(entry.session.clone())
                    {
                        self.events += 1;
                    }
                }
            }
        }
    }

    pub(crate) fn remove(&mut self, entry: &Entry) {
        if let Some(due) = entry.due_ms {
            let key = Key::Session(entry.session.clone(), entry.trigger);
            if self.due.remove(&(due, key)) {
                self.sessions -= 1;
                self.triggers -= usize::from(entry.trigger);
            }
        }
        for pattern in &entry.patterns {
            if let Some(set) = self.exact.get_mut(pattern) {
                if set.remove(&entry.session) {
                    self.events -= 1;
                }
                if set.is_empty() {
                    self.exact.remove(pattern);
                }
            }
        }
        if let Some(prefixes) = self.prefixed.remove(&entry.session) {
            self.events -= prefixes.len();
        }
    }

    /// What is held, by kind.
    pub(crate) fn pending(&self) -> Pending {
        Pending {
            timeouts: self.sessions - self.triggers,
            triggers: self.triggers,
            events: self.events,
            schedules: self.schedules.len(),
        }
    }

    /// Sessions with a pattern that matches `name` (exact, or a trailing-`*`
    /// prefix), sorted. Whether each wakes also depends on its filter and
    /// suspension time, which the caller checks against the journal.
    pub(crate) fn candidates(&self, name: &str) -> Vec<Box<str>> {
        let mut out: Vec<Box<str>> = self
            .exact
            .get(name)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default();
        out.extend(
            self.prefixed
                .iter()
                .filter(|(_, prefixes)| prefixes.iter().any(|p| name.starts_with(&**p)))
                .map(|(id, _)| id.clone()),
        );
        out.sort();
        out.dedup();
        out
    }

    pub(crate) fn arm_schedule(&mut self, id: Box<str>, due_ms: i64) {
        self.disarm_schedule(&id);
        self.due.insert((due_ms, Key::Schedule(id.clone())));
        self.schedules.insert(id, due_ms);
    }

    pub(crate) fn disarm_schedule(&mut self, id: &str) {
        if let Some(due_ms) = self.schedules.remove(id) {
            self.due.remove(&(due_ms, Key::Schedule(id.into())));
        }
    }

    /// Removes and returns the earliest entry if it is due at `now_ms`.
    pub(crate) fn pop_due(&mut self, now_ms: i64) -> Option<(i64, Key)> {
        if self.due.first().is_none_or(|(ms, _)| *ms > now_ms) {
            return None;
        }
        let (due, key) = self.due.pop_first()?;
        match &key {
            Key::Session(_, trigger) => {
                self.sessions -= 1;
                self.triggers -= usize::from(*trigger);
            }
            Key::Schedule(id) => {
                self.schedules.remove(id);
            }
        }
        Some((due, key))
    }

    pub(crate) fn next_due_ms(&self) -> Option<i64> {
        self.due.first().map(|(ms, _)| *ms)
    }
}
