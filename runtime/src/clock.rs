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

/// Serde for a `DateTime<Utc>` field that writes exactly chrono's own serde
/// form (RFC 3339, `SecondsFormat::AutoSi`, `Z`: `2026-12-01T09:00:00.123Z`)
/// through `to_rfc3339_opts`, the function chrono's `Serialize` calls too,
/// but into one string handed to the serializer at once: chrono's own impl
/// goes through `collect_str`, which serde_json escapes a character at a
/// time (3.8 % of berth's CPU in the wake-up benchmark, where every event,
/// record and signed receipt carries timestamps). Same bytes, so receipts
/// signed over the old form still verify. Reading is chrono's.
///
/// `#[serde(with = "berth_runtime::clock::rfc3339")]`; for an
/// `Option<DateTime<Utc>>`, `rfc3339::option`.
pub mod rfc3339 {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `at` as chrono's serde form.
    ///
    /// # Errors
    /// Only the serializer's own.
    pub fn serialize<S: Serializer>(at: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&at.to_rfc3339_opts(SecondsFormat::AutoSi, true))
    }

    /// Reads an RFC 3339 timestamp as chrono does.
    ///
    /// # Errors
    /// The deserializer's, for anything that is not an RFC 3339 timestamp.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<DateTime<Utc>, D::Error> {
        DateTime::<Utc>::deserialize(deserializer)
    }

    /// The same for an optional timestamp (`None` is `null`).
    pub mod option {
        use chrono::{DateTime, Utc};
        use serde::{Deserialize, Deserializer, Serializer};

        /// Writes `at` as chrono's serde form, or `null`.
        ///
        /// # Errors
        /// Only the serializer's own.
        pub fn serialize<S: Serializer>(
            at: &Option<DateTime<Utc>>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            match at {
                Some(at) => super::serialize(at, serializer),
                None => serializer.serialize_none(),
            }
        }

        /// Reads an optional RFC 3339 timestamp as chrono does.
        ///
        /// # Errors
        /// The deserializer's, for anything that is neither `null` nor an
        /// RFC 3339 timestamp.
        pub fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<DateTime<Utc>>, D::Error> {
            Option::<DateTime<Utc>>::deserialize(deserializer)
        }
    }

    #[cfg(test)]
    mod tests {
        use chrono::{DateTime, NaiveDate, Utc};
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Ours {
            #[serde(with = "super")]
            at: DateTime<Utc>,
            #[serde(with = "super::option")]
            maybe: Option<DateTime<Utc>>,
        }

        #[derive(Serialize)]
        struct Chronos {
            at: DateTime<Utc>,
            maybe: Option<DateTime<Utc>>,
        }

        #[test]
        fn writes_chronos_own_bytes_and_reads_them_back() {
            let day = NaiveDate::from_ymd_opt(2026, 12, 1).unwrap();
            let mut stamps: Vec<DateTime<Utc>> =
                [0, 1, 120_000_000, 123_456_000, 123_456_789, 999_999_999]
                    .into_iter()
                    .map(|nanos| day.and_hms_nano_opt(9, 5, 7, nanos).unwrap().and_utc())
                    .collect();
            // A leap second, years before 1000 and after 9999, the epoch.
            stamps.push(
                day.and_hms_nano_opt(23, 59, 59, 1_500_000_000)
                    .unwrap()
                    .and_utc(),
            );
            stamps.push(
                NaiveDate::from_ymd_opt(7, 1, 2)
                    .unwrap()
                    .and_hms_opt(3, 4, 5)
                    .unwrap()
                    .and_utc(),
            );
            stamps.push(
                NaiveDate::from_ymd_opt(12_345, 6, 7)
                    .unwrap()
                    .and_hms_opt(0, 0, 0)
                    .unwrap()
                    .and_utc(),
            );
            stamps.push(
                NaiveDate::from_ymd_opt(-44, 3, 15)
                    .unwrap()
                    .and_hms_opt(12, 0, 0)
                    .unwrap()
                    .and_utc(),
            );
            stamps.push(DateTime::UNIX_EPOCH);
            // And a spread of clock readings.
            let mut nanos: i64 = 1_764_579_600_000_000_000;
            for step in 0..2_000_i64 {
                nanos = nanos.wrapping_add(step * 7_919 * 1_000_003 + 13);
                stamps.push(DateTime::from_timestamp_nanos(nanos));
            }
            for (i, at) in stamps.into_iter().enumerate() {
                let maybe = (i % 2 == 0).then_some(at);
                let ours = serde_json::to_string(&Ours { at, maybe }).unwrap();
                let chronos = serde_json::to_string(&Chronos { at, maybe }).unwrap();
                assert_eq!(ours, chronos);
                assert_eq!(
                    serde_json::to_value(Ours { at, maybe }).unwrap(),
                    serde_json::to_value(Chronos { at, maybe }).unwrap()
                );
                let back: Ours = serde_json::from_str(&ours).unwrap();
                assert_eq!(back, Ours { at, maybe });
            }
        }
    }
}
