//! # berth-scheduler
//!
//! One thread owns every pending wake-up of the node's parked sessions
//! (DESIGN.md, "The scheduler"). Per pending wake-up it holds only the due
//! time and the session (about 100 bytes: a million pending timers fit in
//! about 100 MiB), in time order (a `BTreeSet` of `(due ms, session)`: firing
//! pops from the front, never scans), plus an index of the event-name
//! patterns that parked sessions wait on (exact names in a hash map;
//! trailing-`*` patterns apart, checked per event). What a wake-up does (the
//! timeout's action and input, an event filter) stays in the journal's
//! `wakeups` row and is read when it fires: [`Firing::resolve`].
//!
//! It runs on its own OS thread, not on the async runtime, so that a busy
//! runtime (thousands of turns, a burst of suspends) does not delay a due
//! wake-up: the thread sleeps until the earliest due time (or a command) and
//! hands the due entry out at once.
//!
//! It decides nothing durable itself: a due wake-up is handed out as a
//! [`Fired`] on the channel [`Scheduler::start`] returns, and the node turns
//! it into a resume claim — the same one-time claim as an explicit
//! `session/resume`, so a timer, an event and a client racing produce one
//! resumption. A wake-up fires at most once per arming; it is re-armed from
//! the journal at the next start if its suspension is still there. An entry
//! whose suspension went away without being disarmed (a stale entry) is
//! harmless: [`Firing::resolve`] finds no matching wake-up in the journal.

#![warn(missing_docs)]

mod armed;
mod inbox;
pub mod realtime;

use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Duration;

use berth_runtime::clock::Clock;
use berth_runtime::ids::SessionId;
use berth_runtime::suspension::{DueKind, Wakeup};
use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};

use armed::{due_ms, Armed, Key};
pub use armed::{Entry, Pending};

/// A wake-up that is due, resolved against its journaled row.
#[derive(Debug, Clone)]
pub struct Firing {
    /// What fired.
    pub wakeup: Wakeup,
    /// The timeout or a time trigger.
    pub kind: DueKind,
    /// When it was due.
    pub due: DateTime<Utc>,
    /// How late the scheduler handed it out (ms after `due`; large after a
    /// restart).
    pub lateness_ms: u64,
}

impl Firing {
    /// Pairs a due entry with the session's journaled wake-up. `None` when
    /// that wake-up is gone or is no longer due at `due.due_ms` (the entry
    /// was stale: the suspension was resumed, or replaced by a later one).
    pub fn resolve(due: &Due, wakeup: Option<Wakeup>) -> Option<Self> {
        let wakeup = wakeup?;
        let (at, kind) = wakeup.next_due()?;
        (due_ms(at) == due.due_ms && wakeup.session_id == due.session_id).then_some(Self {
            wakeup,
            kind,
            due: at,
            lateness_ms: due.lateness_ms,
        })
    }
}

/// A session's wake-up that came due (what [`Fired::Wakeup`] carries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The parked session.
    pub session_id: SessionId,
    /// The due time it was armed for (ms since the epoch, rounded up).
    pub due_ms: i64,
    /// How late it was handed out (ms after `due_ms`).
    pub lateness_ms: u64,
}

/// Something the scheduler hands out when it is due.
#[derive(Debug, Clone)]
pub enum Fired {
    /// A parked session's wake-up; resolve it with [`Firing::resolve`].
    Wakeup(Due),
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

enum Command {
    Arm(Vec<Entry>),
    Disarm(Entry),
    ArmSchedule(Box<str>, i64),
    DisarmSchedule(Box<str>),
    Candidates(String, oneshot::Sender<Vec<SessionId>>),
    Len(oneshot::Sender<usize>),
    Pending(oneshot::Sender<Pending>),
}

/// Handle to the scheduler thread. Cheap to clone; the thread ends when every
/// handle is dropped.
#[derive(Debug, Clone)]
pub struct Scheduler {
    tx: inbox::Sender<Command>,
    thread: Arc<std::thread::JoinHandle<()>>,
}

impl Scheduler {
    /// Starts the thread. Due wake-ups and schedule runs are sent on the
    /// returned channel.
    ///
    /// # Panics
    /// If the OS cannot start a thread.
    pub fn start(clock: Arc<dyn Clock>) -> (Self, mpsc::UnboundedReceiver<Fired>) {
        let (scheduler, firings, _) = Self::start_with(clock, false);
        (scheduler, firings)
    }

    /// [`Scheduler::start`], with the thread first moved to real-time
    /// priority when `realtime` is set ([`realtime::raise_current_thread`]).
    /// The third value says how that went: `Ok(true)` raised, `Ok(false)`
    /// not asked, `Err` refused by the OS (the thread runs at normal
    /// priority; the error says why).
    ///
    /// # Panics
    /// If the OS cannot start a thread.
    pub fn start_with(
        clock: Arc<dyn Clock>,
        realtime: bool,
    ) -> (Self, mpsc::UnboundedReceiver<Fired>, Result<bool, String>) {
        let (tx, rx) = inbox::channel();
        let (fired, firings) = mpsc::unbounded_channel();
        let (raised_tx, raised_rx) = std_mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("berth-scheduler".into())
            .spawn(move || {
                let _ = raised_tx.send(realtime::raise_current_thread_if(realtime));
                run(&*clock, &rx, &fired);
            })
            .expect("spawn the scheduler thread");
        let raised = raised_rx
            .recv()
            .unwrap_or_else(|_| Err("the scheduler thread ended at once".into()));
        (
            Self {
                tx,
                thread: Arc::new(thread),
            },
            firings,
            raised,
        )
    }

    /// Arms the wake-up of `wakeup.session_id` (its due time and event
    /// patterns). Arming the same wake-up twice is harmless.
    pub fn arm(&self, wakeup: &Wakeup) {
        self.send_arm(vec![Entry::of(wakeup)]);
    }

    /// Arms many wake-ups in one command (start-up).
    pub fn arm_all(&self, entries: Vec<Entry>) {
        self.send_arm(entries);
    }

    /// Sends an arm, waking the thread only if an entry is due before it
    /// would wake by itself (event patterns are read only by commands that
    /// queue behind this one, so they need no wake-up).
    fn send_arm(&self, entries: Vec<Entry>) {
        match entries.iter().filter_map(|e| e.due_ms).min() {
            Some(due_ms) => self.tx.send_due(Command::Arm(entries), due_ms),
            None => self.tx.send_lazy(Command::Arm(entries)),
        }
    }

    /// Drops `wakeup` (its suspension was used up). Give the wake-up the
    /// suspension armed: its due time finds the entry without a scan.
    ///
    /// The thread is not woken for it: it applies the disarm, in order, when
    /// it next wakes, before it looks at what is due (its own due time
    /// included). Were the wake-up to fire anyway (a burst of commands is
    /// applied in bounded batches between clock checks), its claim would
    /// find the suspension used up: the claim is what makes a resume happen
    /// once; a firing is only a candidate.
    pub fn disarm(&self, wakeup: &Wakeup) {
        self.tx.send_lazy(Command::Disarm(Entry::of(wakeup)));
    }

    /// Arms (or moves) a schedule's next run.
    pub fn arm_schedule(&self, schedule_id: &str, due: DateTime<Utc>) {
        self.tx
            .send(Command::ArmSchedule(schedule_id.into(), due_ms(due)));
    }

    /// Drops a schedule's pending run (paused or deleted).
    pub fn disarm_schedule(&self, schedule_id: &str) {
        self.tx.send(Command::DisarmSchedule(schedule_id.into()));
    }

    /// The parked sessions with an event pattern matching `name`, sorted.
    /// Whether each wakes also depends on its wake-up's filter and
    /// suspension time ([`Wakeup::matches_event`]), which the caller checks
    /// against the journal before claiming. Empty when the scheduler is gone.
    pub async fn candidates(&self, name: &str) -> Vec<SessionId> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Command::Candidates(name.to_owned(), reply));
        answer.await.unwrap_or_default()
    }

    /// Whether the scheduler thread is running (it stops only when every
    /// handle is dropped, or if it panicked).
    pub fn is_running(&self) -> bool {
        !self.thread.is_finished()
    }

    /// How many sessions' wake-ups are armed with a due time.
    pub async fn armed(&self) -> usize {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Command::Len(reply));
        answer.await.unwrap_or_default()
    }

    /// How many wake-ups are held, by kind. Answered after every command
    /// sent before it (disarms included), so it reflects every arm and
    /// disarm that happened before the call. All zero when the scheduler is
    /// gone.
    pub async fn pending(&self) -> Pending {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Command::Pending(reply));
        answer.await.unwrap_or_default()
    }
}

/// Most queued commands applied between two looks at the clock.
const COMMANDS_PER_CLOCK_CHECK: usize = 64;

/// Nanoseconds since the epoch on `clock` (saturating).
fn now_ns(clock: &dyn Clock) -> i64 {
    clock.now().timestamp_nanos_opt().unwrap_or(i64::MAX)
}

fn run(
    clock: &dyn Clock,
    commands: &inbox::Receiver<Command>,
    fired: &mpsc::UnboundedSender<Fired>,
) {
    let mut armed = Armed::default();
    loop {
        let now = now_ns(clock);
        let now_ms = now.div_euclid(1_000_000);
        // Everything due fires now, earliest first.
        while let Some((due_ms, key)) = armed.pop_due(now_ms) {
            let lateness_ms = u64::try_from(now_ms - due_ms).unwrap_or(0);
            let out = match key {
                Key::Session(id, _) => Fired::Wakeup(Due {
                    session_id: SessionId::from(&*id),
                    due_ms,
                    lateness_ms,
                }),
                Key::Schedule(id) => Fired::Schedule {
                    schedule_id: id.into(),
                    due: DateTime::from_timestamp_millis(due_ms).unwrap_or_default(),
                    lateness_ms,
                },
            };
            if fired.send(out).is_err() {
                return;
            }
        }
        let command = match armed.next_due_ms() {
            Some(ms) => {
                let wait_ns = ms.saturating_mul(1_000_000).saturating_sub(now).max(0);
                match commands.recv_timeout(Duration::from_nanos(wait_ns.unsigned_abs()), ms) {
                    Ok(command) => command,
                    Err(inbox::Empty::Timeout) => continue,
                    Err(inbox::Empty::Closed) => return,
                }
            }
            None => match commands.recv() {
                Some(command) => command,
                None => return,
            },
        };
        apply(&mut armed, command);
        // Apply what else is queued before looking at the clock again, but
        // a bounded batch: in a burst (each woken session disarms its
        // wake-up, each suspend arms one) thousands can be queued, and
        // applying them all first would hold back what is due meanwhile.
        for _ in 0..COMMANDS_PER_CLOCK_CHECK {
            match commands.try_recv() {
                Ok(command) => apply(&mut armed, command),
                Err(_) => break,
            }
        }
    }
}

fn apply(armed: &mut Armed, command: Command) {
    match command {
        Command::Arm(entries) => entries.into_iter().for_each(|e| armed.insert(e)),
        Command::Disarm(entry) => armed.remove(&entry),
        Command::ArmSchedule(id, due) => armed.arm_schedule(id, due),
        Command::DisarmSchedule(id) => armed.disarm_schedule(&id),
        Command::Candidates(name, reply) => {
            let _ = reply.send(
                armed
                    .candidates(&name)
                    .into_iter()
                    .map(|id| SessionId::from(&*id))
                    .collect(),
            );
        }
        Command::Len(reply) => {
            let _ = reply.send(armed.sessions);
        }
        Command::Pending(reply) => {
            let _ = reply.send(armed.pending());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_runtime::clock::SystemClock;

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

    fn due(fired: Option<Fired>) -> Due {
        match fired {
            Some(Fired::Wakeup(due)) => due,
            other => panic!("expected a wake-up, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn fires_in_due_order_once_and_disarm_cancels() {
        let (s, mut fired) = Scheduler::start(Arc::new(SystemClock));
        let (a, b, c) = (
            wakeup("a", 20, None),
            wakeup("b", 60, None),
            wakeup("c", 40, None),
        );
        s.arm(&b);
        s.arm(&a);
        s.arm(&c);
        s.disarm(&c);
        let first = due(fired.recv().await);
        let second = due(fired.recv().await);
        assert_eq!(first.session_id.as_str(), "a");
        assert_eq!(second.session_id.as_str(), "b");
        let firing = Firing::resolve(&first, Some(a)).expect("the journaled wake-up matches");
        assert_eq!(firing.kind, DueKind::Timeout);
        assert_eq!(s.armed().await, 0);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), fired.recv())
                .await
                .is_err(),
            "a disarmed wake-up never fires"
        );
    }

    #[tokio::test]
    async fn a_stale_entry_resolves_to_nothing() {
        let (s, mut fired) = Scheduler::start(Arc::new(SystemClock));
        let old = wakeup("s", 10, None);
        s.arm(&old);
        let entry = due(fired.recv().await);
        // The journal now holds a later suspension of the same session.
        let newer = wakeup("s", 60_000, None);
        assert!(Firing::resolve(&entry, Some(newer)).is_none());
        assert!(Firing::resolve(&entry, None).is_none());
        assert!(Firing::resolve(&entry, Some(old)).is_some());
    }

    #[tokio::test]
    async fn overdue_wakeups_fire_at_once_with_their_lateness() {
        let (s, mut fired) = Scheduler::start(Arc::new(SystemClock));
        let mut late = wakeup("late", 0, None);
        late.timeout_at = Some(Utc::now() - chrono::Duration::seconds(5));
        s.arm_all(vec![Entry::of(&late)]);
        let firing = due(fired.recv().await);
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
    async fn events_find_exact_and_prefix_candidates_until_disarmed() {
        let (s, _fired) = Scheduler::start(Arc::new(SystemClock));
        let exact = wakeup("exact", -1, Some("ci.passed"));
        let prefix = wakeup("prefix", -1, Some("ci.*"));
        s.arm(&exact);
        s.arm(&prefix);
        s.arm(&wakeup("other", -1, Some("deploy.done")));
        let ids = |v: Vec<SessionId>| v.into_iter().map(|id| id.0).collect::<Vec<_>>();
        assert_eq!(ids(s.candidates("ci.passed").await), ["exact", "prefix"]);
        assert_eq!(ids(s.candidates("ci.failed").await), ["prefix"]);
        assert!(s.candidates("deploy").await.is_empty());
        s.disarm(&exact);
        s.disarm(&prefix);
        assert!(s.candidates("ci.passed").await.is_empty());
        assert_eq!(ids(s.candidates("deploy.done").await), ["other"]);
        // Only due times count as armed.
        assert_eq!(s.armed().await, 0);
    }

    #[tokio::test]
    async fn pending_counts_each_kind_until_disarmed_or_fired() {
        let (s, _fired) = Scheduler::start(Arc::new(SystemClock));
        let timeout = wakeup("t", 60_000, None);
        let mut trigger = wakeup("g", -1, None);
        trigger.trigger_at = Some(Utc::now() + chrono::Duration::seconds(60));
        let event = wakeup("e", -1, Some("ci.*"));
        s.arm(&timeout);
        s.arm(&timeout);
        s.arm(&trigger);
        s.arm(&event);
        s.arm(&event);
        s.arm_schedule("sched", Utc::now() + chrono::Duration::seconds(60));
        let held = Pending {
            timeouts: 1,
            triggers: 1,
            events: 1,
            schedules: 1,
        };
        assert_eq!(s.pending().await, held, "arming twice counts once");
        s.disarm(&timeout);
        s.disarm(&trigger);
        s.disarm(&event);
        s.disarm_schedule("sched");
        assert_eq!(s.pending().await, Pending::default());
    }
}
