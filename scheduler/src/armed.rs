//! What the scheduler holds: per pending wake-up its due time and session,
//! and per event-waiting session its name patterns. Nothing else — the full
//! wake-up (timeout action, input, filters) stays in the journal and is read
//! when it fires, so a million pending timers cost about 100 bytes each.

use std::collections::{BTreeSet, HashMap, HashSet};

use berth_runtime::suspension::Wakeup;
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
    /// session says what it does).
    Session(Box<str>),
    /// A standing schedule's next run.
    Schedule(Box<str>),
}

/// The compact form of one wake-up, built by [`Entry::of`] on the caller's
/// thread so that the scheduler thread only moves small values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub(crate) session: Box<str>,
    pub(crate) due_ms: Option<i64>,
    pub(crate) patterns: Vec<Box<str>>,
}

impl Entry {
    /// The entry of `wakeup`: its session, its earliest due time (rounded up
    /// to the millisecond) and its event-name patterns (`onEvent` and an
    /// event trigger's).
    pub fn of(wakeup: &Wakeup) -> Self {
        Self {
            session: wakeup.session_id.as_str().into(),
            due_ms: wakeup.next_due().map(|(due, _)| due_ms(due)),
            patterns: wakeup
                .on_event
                .iter()
                .chain(wakeup.trigger_event.iter().map(|(p, _)| p))
                .map(|p| p.as_str().into())
                .collect(),
        }
    }
}

/// The scheduler's state: the due order and the event index.
#[derive(Default)]
pub(crate) struct Armed {
    /// Every pending due time, earliest first: firing pops from the front,
    /// never scans.
    pub(crate) due: BTreeSet<(i64, Key)>,
    /// How many of `due` are sessions' (the rest are schedules').
    pub(crate) sessions: usize,
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
            if self.due.insert((due, Key::Session(entry.session.clone()))) {
                self.sessions += 1;
            }
        }
        for pattern in entry.patterns {
            match pattern.strip_suffix('*') {
                Some(prefix) => self
                    .prefixed
                    .entry(entry.session.clone())
                    .or_default()
                    .push(prefix.into()),
                None => {
                    self.exact
                        .entry(pattern)
                        .or_default()
                        .insert(entry.session.clone());
                }
            }
        }
    }

    pub(crate) fn remove(&mut self, entry: &Entry) {
        if let Some(due) = entry.due_ms {
            if self.due.remove(&(due, Key::Session(entry.session.clone()))) {
                self.sessions -= 1;
            }
        }
        for pattern in &entry.patterns {
            if let Some(set) = self.exact.get_mut(pattern) {
                set.remove(&entry.session);
                if set.is_empty() {
                    self.exact.remove(pattern);
                }
            }
        }
        self.prefixed.remove(&entry.session);
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
            Key::Session(_) => self.sessions -= 1,
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
