//! # berth-scheduler
//!
//! One task owns every pending wake-up of the node's parked sessions
//! (DESIGN.md, "The scheduler"). It holds, per parked session, the compact
//! [`Wakeup`] the journal stores beside the suspension, keeps the due ones in
//! time order (a `BTreeSet` of `(due ms, session)`: firing never scans), and
//! indexes `onEvent` / event-trigger patterns by exact name (trailing-`*`
//! patterns are kept apart and checked per event).
//!
//! It decides nothing durable itself: a due wake-up is handed out as a
//! [`Firing`] on the channel [`Scheduler::start`] returns, and the node turns
//! it into a resume claim — the same one-time claim as an explicit
//! `session/resume`, so a timer, an event and a client racing produce one
//! resumption. A wake-up fires at most once per arming; it is re-armed from
//! the journal at the next start if its suspension is still there.

#![warn(missing_docs)]

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use berth_runtime::clock::Clock;
use berth_runtime::ids::SessionId;
use berth_runtime::suspension::{DueKind, ExternalEvent, Wakeup};
use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};

/// A wake-up that is due.
#[derive(Debug, Clone)]
pub struct Firing {
    /// What fired (removed from the scheduler).
    pub wakeup: Wakeup,
    /// The timeout or a time trigger.
    pub kind: DueKind,
    /// When it was due.
    pub due: DateTime<Utc>,
    /// How late it fires (ms after `due`; large after a restart).
    pub lateness_ms: u64,
}

/// Something the scheduler hands out when it is due.
#[derive(Debug, Clone)]
pub enum Fired {
    /// A parked session's wake-up.
    Wakeup(Box<Firing>),
    /// A standing schedule's run (the node re-arms its next run).
    Schedule {
        /// The schedule.
        schedule_id: String,
        /// When the run was due.
        due: DateTime<Utc>,
        /// How late it fires (ms).
        lateness_ms: u64,
    },
}

/// What a due entry is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    Session(SessionId),
    Schedule(String),
}

enum Command {
    Arm(Box<Wakeup>),
    ArmSchedule(String, DateTime<Utc>),
    DisarmSchedule(String),
    Disarm(SessionId),
    Match {
        event: Box<ExternalEvent>,
        reply: oneshot::Sender<Vec<Wakeup>>,
    },
    Len(oneshot::Sender<usize>),
}

/// Handle to the scheduler task. Cheap to clone; the task ends when every
/// handle is dropped.
#[derive(Debug, Clone)]
pub struct Scheduler {
    tx: mpsc::UnboundedSender<Command>,
}

impl Scheduler {
    /// Starts the task. Due wake-ups and schedule runs are sent on the
    /// returned channel.
    pub fn start(clock: Arc<dyn Clock>) -> (Self, mpsc::UnboundedReceiver<Fired>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (fired, firings) = mpsc::unbounded_channel();
        tokio::spawn(run(clock, rx, fired));
        (Self { tx }, firings)
    }

    /// Arms (or re-arms, replacing) the wake-up of `wakeup.session_id`.
    pub fn arm(&self, wakeup: Wakeup) {
        let _ = self.tx.send(Command::Arm(Box::new(wakeup)));
    }

    /// Arms (or moves) a schedule's next run.
    pub fn arm_schedule(&self, schedule_id: &str, due: DateTime<Utc>) {
        let _ = self
            .tx
            .send(Command::ArmSchedule(schedule_id.to_owned(), due));
    }

    /// Drops a schedule's pending run (paused or deleted).
    pub fn disarm_schedule(&self, schedule_id: &str) {
        let _ = self
            .tx
            .send(Command::DisarmSchedule(schedule_id.to_owned()));
    }

    /// Drops the session's wake-up (its suspension was used up).
    pub fn disarm(&self, session_id: &SessionId) {
        let _ = self.tx.send(Command::Disarm(session_id.clone()));
    }

    /// The wake-ups `event` wakes, removed from the scheduler (the caller
    /// claims them). Empty when the scheduler is gone.
    pub async fn matching(&self, event: ExternalEvent) -> Vec<Wakeup> {
        let (reply, answer) = oneshot::channel();
        let _ = self.tx.send(Command::Match {
            event: Box::new(event),
            reply,
        });
        answer.await.unwrap_or_default()
    }

    /// Whether the scheduler task is running (it stops only when every
    /// handle is dropped, or if it panicked).
    pub fn is_running(&self) -> bool {
        !self.tx.is_closed()
    }

    /// How many wake-ups are armed.
    pub async fn armed(&self) -> usize {
        let (reply, answer) = oneshot::channel();
        let _ = self.tx.send(Command::Len(reply));
        answer.await.unwrap_or_default()
    }
}

/// A due time in whole milliseconds, rounded up, so that nothing fires
/// before it is due (the clock is read in truncated milliseconds).
fn due_ms(due: DateTime<Utc>) -> i64 {
    due.timestamp_millis() + i64::from(!due.timestamp_subsec_nanos().is_multiple_of(1_000_000))
}

/// The scheduler's state.
#[derive(Default)]
struct Armed {
    by_session: HashMap<SessionId, Wakeup>,
    schedules: HashMap<String, i64>,
    due: BTreeSet<(i64, Key)>,
    exact: HashMap<String, HashSet<SessionId>>,
    prefixed: HashMap<SessionId, Vec<String>>,
}

impl Armed {
    fn patterns(wakeup: &Wakeup) -> impl Iterator<Item = &String> {
        wakeup
            .on_event
            .iter()
            .chain(wakeup.trigger_event.iter().map(|(p, _)| p))
    }

    fn insert(&mut self, wakeup: Wakeup) {
        self.remove(&wakeup.session_id);
        let id = wakeup.session_id.clone();
        if let Some((due, _)) = wakeup.next_due() {
            self.due.insert((due_ms(due), Key::Session(id.clone())));
        }
        for pattern in Self::patterns(&wakeup) {
            if pattern.ends_with('*') {
                self.prefixed
                    .entry(id.clone())
                    .or_default()
                    .push(pattern.clone());
            } else {
                self.exact
                    .entry(pattern.clone())
                    .or_default()
                    .insert(id.clone());
            }
        }
        self.by_session.insert(id, wakeup);
    }

    fn remove(&mut self, id: &SessionId) -> Option<Wakeup> {
        let wakeup = self.by_session.remove(id)?;
        if let Some((due, _)) = wakeup.next_due() {
            self.due.remove(&(due_ms(due), Key::Session(id.clone())));
        }
        for pattern in Self::patterns(&wakeup) {
            if let Some(set) = self.exact.get_mut(pattern) {
                set.remove(id);
                if set.is_empty() {
                    self.exact.remove(pattern);
                }
            }
        }
        self.prefixed.remove(id);
        Some(wakeup)
    }

    fn matching(&mut self, event: &ExternalEvent) -> Vec<Wakeup> {
        let mut candidates: Vec<SessionId> = self
            .exact
            .get(&event.name)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default();
        candidates.extend(
            self.prefixed
                .iter()
                .filter(|(_, patterns)| {
                    patterns
                        .iter()
                        .any(|p| event.name.starts_with(p.trim_end_matches('*')))
                })
                .map(|(id, _)| id.clone()),
        );
        candidates.sort();
        candidates.dedup();
        candidates.retain(|id| {
            self.by_session
                .get(id)
                .is_some_and(|w| w.matches_event(&event.name, &event.data, event.received_at))
        });
        candidates
            .into_iter()
            .filter_map(|id| self.remove(&id))
            .collect()
    }

    fn arm_schedule(&mut self, id: String, due_ms: i64) {
        self.disarm_schedule(&id);
        self.due.insert((due_ms, Key::Schedule(id.clone())));
        self.schedules.insert(id, due_ms);
    }

    fn disarm_schedule(&mut self, id: &str) -> Option<i64> {
        let due_ms = self.schedules.remove(id)?;
        self.due.remove(&(due_ms, Key::Schedule(id.to_owned())));
        Some(due_ms)
    }

    fn next_due_ms(&self) -> Option<i64> {
        self.due.first().map(|(ms, _)| *ms)
    }
}

async fn run(
    clock: Arc<dyn Clock>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    fired: mpsc::UnboundedSender<Fired>,
) {
    let mut armed = Armed::default();
    loop {
        let now_ms = clock.now().timestamp_millis();
        // Everything due fires now, earliest first.
        while let Some(due_ms) = armed.next_due_ms().filter(|ms| *ms <= now_ms) {
            let Some((_, key)) = armed.due.first().cloned() else {
                break;
            };
            let lateness_ms = u64::try_from(now_ms - due_ms).unwrap_or(0);
            match key {
                Key::Session(id) => {
                    let Some(wakeup) = armed.remove(&id) else {
                        continue;
                    };
                    let Some((due, kind)) = wakeup.next_due() else {
                        continue;
                    };
                    let _ = fired.send(Fired::Wakeup(Box::new(Firing {
                        wakeup,
                        kind,
                        due,
                        lateness_ms,
                    })));
                }
                Key::Schedule(schedule_id) => {
                    armed.disarm_schedule(&schedule_id);
                    let due = DateTime::from_timestamp_millis(due_ms).unwrap_or_default();
                    let _ = fired.send(Fired::Schedule {
                        schedule_id,
                        due,
                        lateness_ms,
                    });
                }
            }
        }
        let sleep = armed
            .next_due_ms()
            .map(|ms| Duration::from_millis(u64::try_from(ms - now_ms).unwrap_or(0).max(1)));
        let command = match sleep {
            Some(wait) => match tokio::time::timeout(wait, commands.recv()).await {
                Ok(command) => command,
                Err(_) => continue,
            },
            None => commands.recv().await,
        };
        match command {
            None => return,
            Some(Command::Arm(wakeup)) => armed.insert(*wakeup),
            Some(Command::ArmSchedule(id, due)) => armed.arm_schedule(id, due_ms(due)),
            Some(Command::DisarmSchedule(id)) => {
                armed.disarm_schedule(&id);
            }
            Some(Command::Disarm(id)) => {
                armed.remove(&id);
            }
            Some(Command::Match { event, reply }) => {
                let _ = reply.send(armed.matching(&event));
            }
            Some(Command::Len(reply)) => {
                let _ = reply.send(armed.by_session.len());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_runtime::clock::SystemClock;
    use serde_json::json;

    fn wakeup(id: &str, due_in_ms: i64, on_event: Option<&str>) -> Wakeup {
        let now = Utc::now();
        Wakeup {
            session_id: SessionId::from(id),
            handle: format!("susp_{id}"),
            suspended_at: now - chrono::Duration::seconds(1),
            timeout_at: (due_in_ms >= 0).then(|| now + chrono::Duration::milliseconds(due_in_ms)),
            timeout: None,
            trigger_at: None,
            on_event: on_event.map(str::to_owned),
            trigger_event: None,
        }
    }

    #[tokio::test]
    async fn fires_in_due_order_once_and_disarm_cancels() {
        let (s, mut fired) = Scheduler::start(Arc::new(SystemClock));
        s.arm(wakeup("b", 60, None));
        s.arm(wakeup("a", 20, None));
        s.arm(wakeup("c", 40, None));
        s.disarm(&SessionId::from("c"));
        let wakeup = |f: Option<Fired>| match f {
            Some(Fired::Wakeup(f)) => *f,
            other => panic!("expected a wake-up, got {other:?}"),
        };
        let first = wakeup(fired.recv().await);
        let second = wakeup(fired.recv().await);
        assert_eq!(first.wakeup.session_id.as_str(), "a");
        assert_eq!(second.wakeup.session_id.as_str(), "b");
        assert_eq!(first.kind, DueKind::Timeout);
        assert_eq!(s.armed().await, 0);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), fired.recv())
                .await
                .is_err(),
            "a disarmed wake-up never fires"
        );
    }

    #[tokio::test]
    async fn overdue_wakeups_fire_at_once_with_their_lateness() {
        let (s, mut fired) = Scheduler::start(Arc::new(SystemClock));
        let mut late = wakeup("late", 0, None);
        late.timeout_at = Some(Utc::now() - chrono::Duration::seconds(5));
        s.arm(late);
        let Some(Fired::Wakeup(firing)) = fired.recv().await else {
            panic!("expected a wake-up");
        };
        // Lateness counts from the due time rounded up to the millisecond.
        assert!(firing.lateness_ms >= 4_999, "{}", firing.lateness_ms);
        // Schedules share the due order; a moved schedule fires once.
        s.arm_schedule("sched_a", Utc::now() + chrono::Duration::seconds(60));
        s.arm_schedule("sched_a", Utc::now() + chrono::Duration::milliseconds(10));
        let Some(Fired::Schedule { schedule_id, .. }) = fired.recv().await else {
            panic!("expected a schedule run");
        };
        assert_eq!(schedule_id, "sched_a");
        assert!(
            tokio::time::timeout(Duration::from_millis(100), fired.recv())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn events_match_exact_and_prefix_patterns_once() {
        let (s, _fired) = Scheduler::start(Arc::new(SystemClock));
        s.arm(wakeup("exact", -1, Some("ci.passed")));
        s.arm(wakeup("prefix", -1, Some("ci.*")));
        s.arm(wakeup("other", -1, Some("deploy.done")));
        let event = |name: &str| ExternalEvent {
            name: name.into(),
            data: json!({}),
            received_at: Utc::now(),
            source: "test".into(),
        };
        let mut woke: Vec<_> = s
            .matching(event("ci.passed"))
            .await
            .into_iter()
            .map(|w| w.session_id.0)
            .collect();
        woke.sort();
        assert_eq!(woke, ["exact", "prefix"]);
        assert!(s.matching(event("ci.passed")).await.is_empty());
        assert_eq!(s.armed().await, 1);
        // An event received before the suspension does not wake it.
        let mut old = event("deploy.done");
        old.received_at = Utc::now() - chrono::Duration::seconds(60);
        assert!(s.matching(old).await.is_empty());
    }
}
