//! The Prometheus recorder's histogram samples are bounded: the upkeep thread
//! that `berth_http::metrics::handle()` starts drains them into buckets, so a
//! node that is never scraped does not keep every observation
//! (README "Benchmarks", bench-ws heap profile).
//!
//! This file is its own test binary: it counts the live heap bytes of the
//! process with a wrapping global allocator.

#[global_allocator]
static ALLOCATOR: berth_conformance::counting::Counting = berth_conformance::counting::Counting;

fn live() -> isize {
    berth_conformance::counting::live_bytes()
}

/// Rounds of 200,000 observations of the commit-latency histogram: each
/// round's raw samples (≥ 1.6 MB) are held until an upkeep drains them; with
/// an upkeep after every round the heap stays within a few rounds' worth
/// (drained blocks are freed by epoch reclamation once later observations
/// advance the epoch), and no observation is lost (`_count` stays exact).
/// Without upkeep the ten rounds would hold ten rounds' worth.
#[test]
fn histogram_samples_are_bounded_by_upkeep_and_still_counted() {
    const SAMPLES: usize = 200_000;
    const ROUNDS: usize = 10;
    let handle = berth_http::metrics::handle().expect("recorder installs");
    let record = || {
        let histogram = metrics::histogram!(berth_storage::COMMIT_SECONDS);
        for i in 0..SAMPLES {
            histogram.record((i % 100) as f64 * 0.0001);
        }
    };
    let count = |text: &str| -> u64 {
        let name = format!("{}_count", berth_storage::COMMIT_SECONDS);
        text.lines()
            .find_map(|l| l.strip_prefix(name.as_str()))
            .and_then(|rest| rest.trim().parse().ok())
            .unwrap_or(0)
    };

    berth_http::metrics::upkeep();
    let before = live();
    record();
    let round = live() - before;
    assert!(
        round >= (SAMPLES * 8) as isize,
        "the recorder holds {round} bytes for {SAMPLES} pending samples"
    );
    berth_http::metrics::upkeep();
    for _ in 1..ROUNDS {
        record();
        berth_http::metrics::upkeep();
    }
    let held = live() - before;
    assert!(
        held < 3 * round,
        "after {ROUNDS} rounds with upkeep {held} bytes are held; one round of samples is {round}"
    );
    assert_eq!(count(&handle.render()), (SAMPLES * ROUNDS) as u64);
}

/// Installing the recorder starts the upkeep thread: it drains without any
/// call from the application (its first run is one [`UPKEEP_INTERVAL`]
/// after installation).
///
/// [`UPKEEP_INTERVAL`]: berth_http::metrics::UPKEEP_INTERVAL
#[test]
fn installing_the_recorder_starts_the_upkeep_thread() {
    berth_http::metrics::handle().expect("recorder installs");
    let start = berth_http::metrics::upkeep_thread_runs();
    while berth_http::metrics::upkeep_thread_runs() == start {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
