//! The scheduler thread's command queue: a mutex-guarded queue and a
//! condition variable.
//!
//! Not `std::sync::mpsc`: its receiver spins (`sched_yield`) on a slot that a
//! sender has claimed but not yet written. When that sender is preempted
//! and the receiver runs at real-time priority (see [`crate::realtime`]), the
//! spinning receiver keeps its core and the sender waits for the other one.
//! Measured with 10,000 sessions parked: the scheduler spun for up to 130 ms
//! and handed wake-ups out that late (p99 57–100 ms in one run of four).
//! Here a receiver that finds the lock taken sleeps on a futex, so the
//! holder can run.
//!
//! A sender also says how soon the receiver must see a value
//! ([`Sender::send_due`], [`Sender::send_lazy`]): the receiver records,
//! while it waits, the time it will wake by itself (its next due time), and
//! a value it need not act on before then is only queued. Every wake-up of
//! the scheduler thread is a context switch that, at real-time priority,
//! preempts a worker: a burst of 1,000 suspends (each arms a later timer)
//! or of 1,000 resumes (each disarms a timer that already fired) then costs
//! none instead of 1,000. Whatever wakes the receiver next (a due time, an
//! urgent value) drains the queue in order first, so a lazy value is never
//! overtaken by a later one.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The sending half. Cloning adds a sender; the queue is closed once the
/// last one is dropped.
pub(crate) struct Sender<T>(Arc<Shared<T>>);

/// The receiving half (one; the scheduler thread).
pub(crate) struct Receiver<T>(Arc<Shared<T>>);

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("inbox::Sender")
    }
}

struct Shared<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

struct State<T> {
    queue: VecDeque<T>,
    senders: usize,
    /// While the receiver waits: when it wakes by itself, in the senders'
    /// due-time unit (ms since the epoch; `i64::MAX`: never). `None` while
    /// it runs (it looks at the queue before it waits again).
    waiting_until: Option<i64>,
}

/// How many values may wait unseen before a lazy send wakes the receiver
/// anyway (bounds the queue of a receiver that sleeps for long).
const LAZY_LIMIT: usize = 4_096;

/// Why a receive returned nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Empty {
    /// Nothing came before the deadline (or nothing is queued, for
    /// [`Receiver::try_recv`]).
    Timeout,
    /// Every sender is gone and the queue is drained.
    Closed,
}

/// A new queue.
pub(crate) fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            senders: 1,
            waiting_until: None,
        }),
        ready: Condvar::new(),
    });
    (Sender(Arc::clone(&shared)), Receiver(shared))
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic while holding the lock leaves a queue that is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> Sender<T> {
    /// Queues `value` and wakes the receiver.
    pub(crate) fn send(&self, value: T) {
        self.0.lock().queue.push_back(value);
        self.0.ready.notify_one();
    }

    /// Queues `value`, which the receiver must act on by `due_ms` (ms since
    /// the epoch): wakes it only if it waits to wake later than that.
    pub(crate) fn send_due(&self, value: T, due_ms: i64) {
        self.queue(value, |until| due_ms < until);
    }

    /// Queues `value`, which the receiver may act on whenever it next wakes.
    pub(crate) fn send_lazy(&self, value: T) {
        self.queue(value, |_| false);
    }

    fn queue(&self, value: T, sooner: impl FnOnce(i64) -> bool) {
        let mut state = self.0.lock();
        state.queue.push_back(value);
        let wake = match state.waiting_until {
            None => false,
            Some(until) => sooner(until) || state.queue.len() >= LAZY_LIMIT,
        };
        drop(state);
        if wake {
            self.0.ready.notify_one();
        }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.0.lock().senders += 1;
        Self(Arc::clone(&self.0))
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.senders -= 1;
        if state.senders == 0 {
            drop(state);
            self.0.ready.notify_one();
        }
    }
}

impl<T> Receiver<T> {
    /// The next value, waiting until one comes or every sender is gone
    /// (`None` once they are and the queue is drained).
    pub(crate) fn recv(&self) -> Option<T> {
        let mut state = self.0.lock();
        loop {
            if let Some(value) = state.queue.pop_front() {
                return Some(value);
            }
            if state.senders == 0 {
                return None;
            }
            state = self.wait(state, i64::MAX, None);
        }
    }

    /// The next value, waiting at most `timeout`, which ends at `until_ms`
    /// in the senders' due-time unit (see [`Sender::send_due`]).
    pub(crate) fn recv_timeout(&self, timeout: Duration, until_ms: i64) -> Result<T, Empty> {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = self.0.lock();
        loop {
            if let Some(value) = state.queue.pop_front() {
                return Ok(value);
            }
            if state.senders == 0 {
                return Err(Empty::Closed);
            }
            state = match deadline.map(|d| d.saturating_duration_since(Instant::now())) {
                Some(left) if left.is_zero() => return Err(Empty::Timeout),
                Some(left) => self.wait(state, until_ms, Some(left)),
                // A timeout too long to represent: wait as `recv` does.
                None => self.wait(state, i64::MAX, None),
            };
        }
    }

    /// Waits for a send (at most `left`, when given), recording meanwhile
    /// that the receiver wakes by itself at `until_ms`.
    fn wait<'a>(
        &'a self,
        mut state: MutexGuard<'a, State<T>>,
        until_ms: i64,
        left: Option<Duration>,
    ) -> MutexGuard<'a, State<T>> {
        state.waiting_until = Some(until_ms);
        let mut state = match left {
            Some(left) => {
                self.0
                    .ready
                    .wait_timeout(state, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => self
                .0
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner),
        };
        state.waiting_until = None;
        state
    }

    /// The next value if one is queued, without waiting.
    pub(crate) fn try_recv(&self) -> Result<T, Empty> {
        let mut state = self.0.lock();
        match state.queue.pop_front() {
            Some(value) => Ok(value),
            None if state.senders == 0 => Err(Empty::Closed),
            None => Err(Empty::Timeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_arrive_in_order_and_the_queue_closes_with_its_last_sender() {
        let (tx, rx) = channel();
        let tx2 = tx.clone();
        tx.send(1);
        tx2.send(2);
        assert_eq!(rx.recv(), Some(1));
        assert_eq!(rx.try_recv(), Ok(2));
        assert_eq!(rx.try_recv(), Err(Empty::Timeout));
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(5), 0),
            Err(Empty::Timeout)
        );
        drop(tx);
        tx2.send(3);
        drop(tx2);
        // Drained first, then closed.
        assert_eq!(rx.recv_timeout(Duration::from_secs(5), 0), Ok(3));
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5), 0),
            Err(Empty::Closed)
        );
        assert_eq!(rx.recv(), None);
    }

    #[test]
    fn a_waiting_receiver_wakes_for_a_value_and_for_the_close() {
        let (tx, rx) = channel();
        let waiter = std::thread::spawn(move || {
            let first = rx.recv_timeout(Duration::from_secs(30), i64::MAX);
            let second = rx.recv();
            (first, second)
        });
        std::thread::sleep(Duration::from_millis(20));
        tx.send("due");
        std::thread::sleep(Duration::from_millis(20));
        drop(tx);
        assert_eq!(waiter.join().unwrap(), (Ok("due"), None));
    }

    /// Waits until the receiver is waiting (it records when it wakes).
    fn until_waiting<T>(tx: &Sender<T>) {
        let start = Instant::now();
        while tx.0.lock().waiting_until.is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "receiver never waited"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn values_due_later_than_the_receivers_own_wake_do_not_wake_it() {
        let (tx, rx) = channel();
        let waiter = std::thread::spawn(move || {
            // Wakes by itself after 300 ms, at "time" 1,000.
            let started = Instant::now();
            let got = rx.recv_timeout(Duration::from_millis(300), 1_000);
            (got, started.elapsed(), rx)
        });
        until_waiting(&tx);
        tx.send_lazy("lazy");
        tx.send_due("later", 5_000);
        tx.send_due("same time", 1_000);
        let (got, waited, rx) = waiter.join().unwrap();
        // Nothing woke it: it woke at its own deadline and found the queue.
        assert_eq!(got, Ok("lazy"));
        assert!(
            waited >= Duration::from_millis(300),
            "woken after {waited:?}"
        );
        assert_eq!(rx.try_recv(), Ok("later"));
        assert_eq!(rx.try_recv(), Ok("same time"));

        // A value due sooner wakes it at once, behind what was queued.
        let waiter = std::thread::spawn(move || {
            let first = rx.recv_timeout(Duration::from_secs(30), 1_000);
            (first, rx.try_recv(), rx)
        });
        until_waiting(&tx);
        tx.send_lazy("queued first");
        tx.send_due("sooner", 999);
        let (first, second, _) = waiter.join().unwrap();
        assert_eq!((first, second), (Ok("queued first"), Ok("sooner")));

        // Lazy values wake a receiver that waits forever once LAZY_LIMIT wait.
        let (tx, rx) = channel();
        let waiter = std::thread::spawn(move || {
            let first = rx.recv();
            let mut rest = 0;
            while rx.try_recv().is_ok() {
                rest += 1;
            }
            (first, rest)
        });
        until_waiting(&tx);
        for i in 0..LAZY_LIMIT {
            tx.send_lazy(i);
        }
        let (first, rest) = waiter.join().unwrap();
        assert_eq!(first, Some(0));
        assert!(rest >= 1, "woken only by the last of the limit");
    }
}
