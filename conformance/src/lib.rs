//! # berth-conformance
//!
//! Black-box checks and measurements of a live `berth`: ACP scenarios driven
//! over the wire, end-to-end tests with third-party clients (`e2e/`), and the
//! benchmark binaries `bench-core` (`src/bin/bench-core.rs`: turn, journal,
//! inject and suspend/resume costs) and `bench-sched` (`src/bin/bench-sched.rs`:
//! wake-up lateness, timer arming, a million pending timers).
//!
//! The library part holds helpers those binaries share; today that is
//! [`stats`], the latency summary the benchmarks print.

pub mod stats {
    //! Latency summaries: percentiles over a set of timed samples.
    //!
    //! Percentiles use the nearest-rank method (the smallest sample such that
    //! at least p% of all samples are ≤ it), so every figure reported is a
    //! latency that was actually observed, never an interpolation.

    use std::time::Duration;

    /// Percentiles, mean and maximum of a set of latency samples, in microseconds.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct LatencySummary {
        /// Number of samples.
        pub count: usize,
        /// Arithmetic mean (µs).
        pub mean_us: f64,
        /// Median (µs).
        pub p50_us: u64,
        /// 90th percentile (µs).
        pub p90_us: u64,
        /// 99th percentile (µs).
        pub p99_us: u64,
        /// Largest sample (µs).
        pub max_us: u64,
    }

    impl LatencySummary {
        /// Summarizes `samples` (sorted in place). `None` when there are none.
        pub fn from_samples(samples: &mut [Duration]) -> Option<Self> {
            if samples.is_empty() {
                return None;
            }
            samples.sort_unstable();
            let total: Duration = samples.iter().sum();
            Some(Self {
                count: samples.len(),
                mean_us: total.as_secs_f64() * 1e6 / samples.len() as f64,
                p50_us: micros(percentile(samples, 50)),
                p90_us: micros(percentile(samples, 90)),
                p99_us: micros(percentile(samples, 99)),
                max_us: micros(samples[samples.len() - 1]),
            })
        }
    }

    /// Nearest-rank percentile `p` (0..=100) of `sorted`, which must be
    /// non-empty and sorted ascending.
    pub fn percentile(sorted: &[Duration], p: u32) -> Duration {
        let n = sorted.len();
        // rank = ceil(p/100 · n), at least 1.
        let rank = (p as usize * n).div_ceil(100).max(1);
        sorted[rank.min(n) - 1]
    }

    fn micros(d: Duration) -> u64 {
        u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn us(v: &[u64]) -> Vec<Duration> {
            v.iter().map(|&u| Duration::from_micros(u)).collect()
        }

        #[test]
        fn nearest_rank_percentiles_of_one_to_a_hundred() {
            let mut samples = us(&(1..=100).rev().collect::<Vec<_>>());
            let s = LatencySummary::from_samples(&mut samples).unwrap();
            assert_eq!((s.p50_us, s.p90_us, s.p99_us, s.max_us), (50, 90, 99, 100));
            assert_eq!(s.count, 100);
            assert!((s.mean_us - 50.5).abs() < 1e-9);
        }

        #[test]
        fn a_single_sample_is_every_percentile() {
            let mut samples = us(&[7]);
            let s = LatencySummary::from_samples(&mut samples).unwrap();
            assert_eq!((s.p50_us, s.p90_us, s.p99_us, s.max_us), (7, 7, 7, 7));
        }

        #[test]
        fn no_samples_no_summary() {
            assert!(LatencySummary::from_samples(&mut []).is_none());
        }
    }
}
