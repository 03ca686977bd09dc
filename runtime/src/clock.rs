//! The injected clock. Nothing in the engine reads the system time directly.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, TimeZone, Utc};

/// A source of wall-clock time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Current time, UTC, millisecond precision.
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that only moves when told to (tests, replay).
#[derive(Debug)]
pub struct ManualClock {
    unix_ms: AtomicI64,
}

impl ManualClock {
    /// A clock stopped at `unix_ms` milliseconds since the epoch.
    pub fn at(unix_ms: i64) -> Self {
        Self {
            unix_ms: AtomicI64::new(unix_ms),
        }
    }

    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance_ms(&self, ms: i64) {
        self.unix_ms.fetch_add(ms, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        let ms = self.unix_ms.load(Ordering::Relaxed);
        Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
    }
}
