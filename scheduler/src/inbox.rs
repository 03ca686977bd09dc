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
}

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
            state = self
                .0
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The next value, waiting at most `timeout`.
    pub(crate) fn recv_timeout(&self, timeout: Duration) -> Result<T, Empty> {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = self.0.lock();
        loop {
            if let Some(value) = state.queue.pop_front() {
                return Ok(value);
            }
            if state.senders == 0 {
                return Err(Empty::Closed);
            }
            let Some(left) = deadline.map(|d| d.saturating_duration_since(Instant::now())) else {
                // A timeout too long to represent: wait as `recv` does.
                state = self
                    .0
                    .ready
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            if left.is_zero() {
                return Err(Empty::Timeout);
            }
            state = self
                .0
                .ready
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
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
            rx.recv_timeout(Duration::from_millis(5)),
            Err(Empty::Timeout)
        );
        drop(tx);
        tx2.send(3);
        drop(tx2);
        // Drained first, then closed.
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(3));
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Err(Empty::Closed));
        assert_eq!(rx.recv(), None);
    }

    #[test]
    fn a_waiting_receiver_wakes_for_a_value_and_for_the_close() {
        let (tx, rx) = channel();
        let waiter = std::thread::spawn(move || {
            let first = rx.recv_timeout(Duration::from_secs(30));
            let second = rx.recv();
            (first, second)
        });
        std::thread::sleep(Duration::from_millis(20));
        tx.send("due");
        std::thread::sleep(Duration::from_millis(20));
        drop(tx);
        assert_eq!(waiter.join().unwrap(), (Ok("due"), None));
    }
}
