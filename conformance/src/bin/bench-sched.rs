//! `bench-sched`: measures berth's wake-up scheduler and prints figures.
//!
//! This is a measurement tool, not a test: nothing here asserts on timings
//! (the 10 ms p99 target is printed beside the figure, not checked). Run it
//! with
//!
//! ```text
//! cargo build --release --bin berth
//! cargo run --release -p berth-conformance --bin bench-sched -- --help
//! ```
//!
//! It answers: wake-up lateness p50/p99/max for 10,000 sessions parked with
//! 1 s timeouts (target: p99 ≤ 10 ms after the due time), timers armed per
//! second, the memory held with 1,000,000 pending timers, and the start-up
//! time to re-arm them.
//!
//! # 1. Timeouts over the wire (the real binary)
//!
//! Spawns `berth serve` (`$BERTH_BIN`, default
//! `<target dir>/release/berth`) on a fresh data directory with the `scripted`
//! model, `--max-in-flight` 2·N+64 (or `--max-in-flight`), and speaks ACP
//! JSON-RPC over its stdin/stdout (newline-delimited JSON). A reader task
//! stamps every line berth writes with the monotonic instant and the wall
//! clock (`Utc::now()`) at which the read that brought it returned, before
//! parsing (one stamp per read: see `read_stamped`).
//!
//! 1. `initialize` (no `suspendUpdates` capability, so the suspension
//!    lifecycle arrives as `_berth/agentEvent`), then `--sessions` N
//!    (default 10,000) `session/new`, written back to back and all answered
//!    before the next step.
//! 2. N `session/suspend {sessionId, resumeWhen: {timeout: {durationMinutes:
//!    T/60, onTimeout: "resume_with_input", input: "<small text>"}}}`
//!    (T = `--timeout-secs`, default 1), written back to back on the one
//!    connection. Each answer's `suspendedAt` (berth's clock when the
//!    suspension was built, just before its commit — the instant the timeout
//!    runs from) gives the session's due time: `suspendedAt + round(T·1000)`
//!    ms, the same arithmetic as `Wakeup::of`. Every answer's `summary` must
//!    say the session parked while idle.
//! 3. Every timeout fires (berth's scheduler task → `Node::fire` → the
//!    session actor's one-time resume claim, the same path as an explicit
//!    `session/resume`), and each idle session's resume with input starts a
//!    fresh turn; the script answers that input with one zero-latency text
//!    step. The benchmark reads, per session, the `resumed` agent event
//!    (`cause: timeout`, its `resumed_at`, `lateness_ms`, the handle the
//!    suspend answered) and the turn's `turn_ended`; the run ends when every
//!    session's turn has ended. Nothing is written to berth in this phase.
//!
//! Lateness is reported three ways, each p50/p99/max over the N sessions:
//!
//! * **fire** — berth's own `lateness_ms`: the scheduler task's clock reading
//!   when it handed the wake-up out minus its due time, both truncated to
//!   whole milliseconds (so ±1 ms of rounding).
//! * **claim** — `resumed_at − due`: `resumed_at` is the claim's time, the
//!   claimer thread's clock reading when it builds the one-time claim, just
//!   before the claim row is queued for commit (`berth_actors::claimer`;
//!   the session actor then completes the resume: suspension removal, the
//!   fresh turn's start, the `resumed` event). It includes the fire
//!   lateness and the hand-off from the scheduler thread to the claimer
//!   thread; not the claim's commit, nor the completion (both are in
//!   **delivered**).
//! * **client** — the benchmark's monotonic clock when it read the `resumed`
//!   notification minus (the instant it wrote the suspend + T): the timer
//!   as the client that asked for it sees it, suspend commit included.
//! * **delivered** — the benchmark's wall clock when it read the `resumed`
//!   notification minus the due time: what a client sees. Adds the claim's
//!   group commit (fsync) and delivery over stdout. Both clocks are the same
//!   machine's `CLOCK_REALTIME`.
//!
//! `--rate R` writes the suspends R per second instead of back to back, so
//! the timeouts come due at R per second too: with R below what berth
//! sustains (suspend + fire + claim + one turn per session), lateness is the
//! scheduler's and the claim path's own; above it, and with the default
//! burst, it is mostly queueing behind the backlog (compare the deciles with
//! the suspend window and with suspends/s).
//!
//! Also printed: suspend → durable-answer latency, suspend answer read −
//! `suspendedAt` (how long after berth built a suspension its answer
//! reached the client: the commit plus the outbound queue), suspends/s (N over first
//! suspend written → last answer read: timers armed per second over the
//! wire, each arming a durable commit), the wall time from the first suspend
//! written to the last `resumed` read, berth's CPU time over the run (from
//! `/proc/<pid>/task/*/schedstat`), and — to show *when* lateness happens —
//! the fire and claim lateness of each tenth of the sessions in due-time
//! order, beside the window during which suspends were still being answered
//! (timeouts that come due inside it compete with the remaining suspends and
//! with the turns of the sessions that already woke).
//!
//! # 2. A million pending timers (in-process)
//!
//! No binary. Against [`berth_storage::Journal`] in a fresh temporary data
//! directory and a [`berth_scheduler::Scheduler`] on this process's tokio
//! runtime:
//!
//! 1. **write**: `--timers` M (default 1,000,000) suspensions of idle
//!    sessions (random-looking `sess_<32 hex>` ids, as berth makes, so rows
//!    land in random key order), each with a `resume_with_input` timeout due
//!    between one day and one year ahead, committed through
//!    [`Batch::put_suspension`] — which writes the suspension row and its
//!    wake-up row in the same transaction — `--batch` (default 10,000)
//!    suspensions per commit, one commit at a time. Timed from the first
//!    build to the last commit's durable return; rows/s counts suspensions
//!    (each is two rows).
//! 2. The journal is dropped (closed), then **start-up** is replayed as
//!    `Node::start` does it: `Journal::open` (timed), then
//!    `Journal::for_each_wakeup` streams every row, each decoded and turned
//!    into its compact scheduler [`Entry`] (due ms, session id, event
//!    patterns), sent to a fresh `Scheduler` 4,096 per `arm_all` command,
//!    and `armed()` is awaited: the scheduler's command channel is FIFO, so
//!    `armed()` answers only after every arm before it was applied. Timed
//!    from the first row read to `armed()` returning M. Nothing may fire
//!    (all are due in the future; checked).
//! 3. Memory: `VmRSS` and `VmHWM` from `/proc/self/status` at each step, and
//!    the bytes live on the heap, counted exactly by this binary's global
//!    allocator (a counting wrapper around the system allocator). After
//!    `armed()` the journal is closed (untimed): the scan fills redb's page
//!    cache (bounded by `JournalOptions::cache_bytes`, 64 MiB by default),
//!    so the live heap after closing is the armed scheduler's alone (its
//!    due-time index, event index and id strings). RSS also keeps pages the
//!    allocator freed but did not return to the OS: live heap is what the
//!    scheduler needs, RSS what the process costs. The on-disk size of
//!    `journal.redb` is printed after writing.
//! 4. **restart** (unless `--skip-restart` or the binary is missing): the real
//!    `berth serve` is started on that data directory. Printed: the time from
//!    spawn to the `initialize` answer (berth serves only after `Node::start`
//!    has loaded the wake-ups and queued every arm; the scheduler thread may
//!    still be applying them), and the time until berth's CPU went quiet
//!    (polled every 20 ms; quiet = under 10 ms of CPU over 500 ms, the
//!    first instant of that window is reported) with its `VmRSS`/`VmHWM`
//!    then — an outside estimate of when the re-arming finished, since berth
//!    reports no count over the wire. berth keeps its journal open, so its
//!    RSS includes redb's page cache as filled by the start-up scan. The journal has only suspension and
//!    wake-up rows (a real one also holds sessions, events and transcripts,
//!    which start-up does not read).
//!
//! The page cache is warm in step 2 and 4 (the file was just written): these
//! are warm-restart figures.
//!
//! # 3. Parked density over the wire (`--park N`)
//!
//! The real binary again, with real sessions: `--park` N sessions are
//! created and parked idle with a one-day `resume_with_input` timeout, plus
//! `--park-probes` P sessions parked with a `--timeout-secs` timeout, over
//! one connection with `--park-window` requests in flight. Printed: creation
//! and parking rates; berth's `VmRSS` after `initialize` (empty) and once its
//! CPU went quiet with every session parked, per parked session; the data
//! directory's apparent and allocated size after a clean stop, per parked
//! session. Then, with berth stopped, the benchmark waits until every probe
//! is overdue and restarts berth on the same data directory: spawn →
//! `initialize` answered; spawn → every probe's `resumed` event seen (after a
//! `session/load` of each probe: a replayed or a live `resumed` both mean its
//! overdue wake-up fired — an upper bound on when); spawn → CPU quiet (the
//! wake-ups are re-armed); and `VmRSS` then (no session actor is live after
//! a restart but the probes' own).
//!
//! `--skip-wire` / `--skip-scale` skip a section. The machine's load average
//! (`/proc/loadavg`) is printed before and after. The last line of output is
//! a one-line JSON summary of everything printed.

use berth_conformance::host::{
    berth_binary, cpu_ns, cpus, load_average, next_from_berth, spawn_berth, stderr_tail,
};
use berth_conformance::wire::{classify_frame, classify_line, Frame, Lean};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use berth_runtime::clock::SystemClock;
use berth_runtime::ids::SessionId;
use berth_runtime::suspension::{
    Initiator, OnTimeout, ResumeConditions, ResumeTimeout, SuspendMode, Suspension, Wakeup,
};
use berth_scheduler::{Entry, Scheduler};

/// Wake-ups per scheduler command at start-up (as `Node::start`).
const ARM_CHUNK: usize = 4096;
use berth_storage::{Batch, Journal, JournalOptions};
use chrono::{DateTime, Utc};
use clap::Parser;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

/// Live heap bytes, counted exactly (see `berth_conformance::counting`).
#[global_allocator]
static ALLOCATOR: berth_conformance::counting::Counting = berth_conformance::counting::Counting;

/// How long to wait for any single frame from the child before giving up.
const FRAME_TIMEOUT: Duration = Duration::from_secs(30);

/// What the timeout's resume input contains; the script answers it with one
/// zero-latency text step.
const WAKE_MATCH: &str = "bench-sched-wake";

/// Measures berth's wake-up lateness, timer arming rate and the memory and
/// start-up cost of a million pending timers.
#[derive(Parser, Debug)]
#[command(name = "bench-sched")]
struct Args {
    /// Sessions parked with a timeout over the wire (section 1).
    #[arg(long, default_value_t = 10_000)]
    sessions: usize,
    /// The timeout of each parked session, in seconds (sent as
    /// `durationMinutes` = this / 60).
    #[arg(long, default_value_t = 1.0)]
    timeout_secs: f64,
    /// Suspends written per second (0: all back to back, the default). At
    /// a rate berth keeps up with, the timeouts come due at that rate too.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// `berth serve --max-in-flight` (default 2·sessions + 64).
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// Pending timers written and re-armed in-process (section 2).
    #[arg(long, default_value_t = 1_000_000)]
    timers: usize,
    /// Suspensions per journal commit when writing the timers.
    #[arg(long, default_value_t = 10_000)]
    batch: usize,
    /// Skip section 1 (over the wire).
    #[arg(long)]
    skip_wire: bool,
    /// Skip section 2 (in-process scale).
    #[arg(long)]
    skip_scale: bool,
    /// In section 2, skip restarting the real binary on the timers' journal.
    #[arg(long)]
    skip_restart: bool,
    /// Section 3: sessions parked over the wire with a one-day timeout, to
    /// measure memory and disk per parked session and the restart (0 skips).
    #[arg(long, default_value_t = 0)]
    park: usize,
    /// Section 3: extra sessions parked with a `--timeout-secs` timeout that
    /// comes due while berth is stopped (they must fire at the restart).
    #[arg(long, default_value_t = 100)]
    park_probes: usize,
    /// Section 3: seconds to wait after parking before sampling RSS again,
    /// once berth has passivated the parked sessions (its default
    /// `passivate_after_ms` is 10 s); 0 skips the second sample
    #[arg(long, default_value_t = 12)]
    park_settle_secs: u64,
    /// Section 3: requests kept in flight while creating and parking.
    #[arg(long, default_value_t = 512)]
    park_window: usize,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-sched: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<()> {
    if !(args.timeout_secs > 0.0 && args.timeout_secs.is_finite()) {
        bail!("--timeout-secs must be a positive number of seconds");
    }
    if !(args.rate >= 0.0 && args.rate.is_finite()) {
        bail!("--rate must be a non-negative number of suspends per second");
    }
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let wants_bin = (!args.skip_wire && args.sessions > 0)
        || (!args.skip_scale && !args.skip_restart && args.timers > 0)
        || args.park > 0;
    let bin = if wants_bin {
        match berth_binary("--skip-wire --skip-restart") {
            Ok(bin) => Some(bin),
            Err(e) if args.skip_wire || args.sessions == 0 => {
                eprintln!("note: {e:#}\nnote: skipping the restart of the real binary");
                None
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    let load_before = load_average();
    if let Some(load) = &load_before {
        println!("load average      {load} (before; {} CPUs)\n", cpus());
    }
    let mut summary = json!({"cpus": cpus(), "load_before": load_before});
    if let (Some(bin), false, true) = (&bin, args.skip_wire, args.sessions > 0) {
        let report = wire_bench(args, bin).await?;
        report.print();
        summary["wire"] = report.json();
    }
    if !args.skip_scale && args.timers > 0 {
        let restart_bin = bin.as_deref().filter(|_| !args.skip_restart);
        let report = scale_bench(args, restart_bin).await?;
        report.print();
        summary["scale"] = report.json();
    }
    if args.park > 0 {
        let bin = bin
            .as_deref()
            .context("--park needs the berth binary (build it, or set BERTH_BIN)")?;
        let report = density_bench(args, bin).await?;
        report.print();
        summary["density"] = report.json();
    }
    let load_after = load_average();
    if let Some(load) = &load_after {
        println!("load average      {load} (after)");
    }
    summary["load_after"] = json!(load_after);
    println!("{summary}");
    Ok(())
}

// ---------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------

/// `VmRSS` and `VmHWM` (bytes) from a `/proc/<…>/status` file.
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    rss: u64,
    hwm: u64,
}

fn mem_of(status_path: &str) -> Mem {
    let text = std::fs::read_to_string(status_path).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    Mem {
        rss: field("VmRSS:"),
        hwm: field("VmHWM:"),
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn live_heap() -> u64 {
    berth_conformance::counting::live_bytes().max(0) as u64
}

/// Nearest-rank percentile `p` of `sorted` (non-empty, ascending); the same
/// method as `berth_conformance::stats`, over signed values.
fn percentile(sorted: &[i64], p: usize) -> i64 {
    let n = sorted.len();
    let rank = (p * n).div_ceil(100).max(1);
    sorted[rank.min(n) - 1]
}

/// p50/p99/max of signed microsecond samples.
#[derive(Debug, Clone, Copy, Default)]
struct Spread {
    count: usize,
    min_us: i64,
    p50_us: i64,
    p90_us: i64,
    p99_us: i64,
    max_us: i64,
    mean_us: f64,
}

impl Spread {
    fn of(samples: &[i64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        Self {
            count: sorted.len(),
            min_us: sorted[0],
            p50_us: percentile(&sorted, 50),
            p90_us: percentile(&sorted, 90),
            p99_us: percentile(&sorted, 99),
            max_us: sorted[sorted.len() - 1],
            mean_us: sorted.iter().map(|&v| v as f64).sum::<f64>() / sorted.len() as f64,
        }
    }

    fn row(&self, label: &str) -> String {
        let ms = |us: i64| us as f64 / 1e3;
        format!(
            "{label:<11} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            ms(self.min_us),
            ms(self.p50_us),
            ms(self.p90_us),
            ms(self.p99_us),
            ms(self.max_us),
            self.mean_us / 1e3
        )
    }

    fn json(&self) -> Value {
        json!({
            "count": self.count, "min_us": self.min_us, "p50_us": self.p50_us,
            "p90_us": self.p90_us, "p99_us": self.p99_us, "max_us": self.max_us,
            "mean_us": self.mean_us.round(),
        })
    }
}

/// The timeout's length in ms exactly as berth derives it (`Wakeup::of`).
fn timeout_ms(duration_minutes: f64) -> i64 {
    (duration_minutes * 60_000.0).round() as i64
}

/// `later − earlier` in µs, negative when `later` is earlier.
fn signed_micros(later: Instant, earlier: Instant) -> i64 {
    match later.checked_duration_since(earlier) {
        Some(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        None => -i64::try_from((earlier - later).as_micros()).unwrap_or(i64::MAX),
    }
}

fn micros_between(later: DateTime<Utc>, earlier: DateTime<Utc>) -> i64 {
    (later - earlier).num_microseconds().unwrap_or(i64::MAX)
}

// ---------------------------------------------------------------------------
// 1. Timeouts over the wire
// ---------------------------------------------------------------------------

/// A line berth wrote, stamped when it was read.
struct Stamped {
    at: Instant,
    wall: DateTime<Utc>,
    line: String,
}

/// Reads berth's stdout until it closes and hands the complete lines of
/// each read on as one batch, every line stamped with the instant that read
/// returned: when its bytes reached this process. One stamp and one channel
/// message per read, not per line — the reader shares the machine's two
/// cores with the berth it measures, so in a burst of thousands of frames
/// its own cost moves berth's figures (per line, the hand-off and the
/// wake-up of the main task cost more than classifying the line).
async fn read_stamped(
    mut stdout: tokio::process::ChildStdout,
    tx: mpsc::UnboundedSender<Vec<Stamped>>,
) {
    use tokio::io::AsyncReadExt;
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
    loop {
        if buf.capacity() - buf.len() < 1 << 14 {
            buf.reserve(1 << 16);
        }
        match stdout.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let at = Instant::now();
        let wall = Utc::now();
        let Some(end) = buf.iter().rposition(|&b| b == b'\n') else {
            continue;
        };
        let rest = buf.split_off(end + 1);
        let stamped = |line: String| Stamped { at, wall, line };
        // Checked as UTF-8 once per read (berth writes only UTF-8); a read
        // that is not is taken line by line, lossily.
        let lines = match std::str::from_utf8(&buf[..end]) {
            Ok(text) => text.split('\n').map(|l| stamped(l.to_owned())).collect(),
            Err(_) => buf[..end]
                .split(|&b| b == b'\n')
                .map(|l| stamped(String::from_utf8_lossy(l).into_owned()))
                .collect(),
        };
        buf = rest;
        if tx.send(lines).is_err() {
            break;
        }
    }
}

/// A `berth serve` child whose stdout is read by its own task, which stamps
/// each line on arrival, so requests can be pipelined.
struct AcpPipe {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Lines from the reader task, a read's worth at a time.
    frames: mpsc::UnboundedReceiver<Vec<Stamped>>,
    /// Lines received and not yet taken.
    ready: std::collections::VecDeque<Stamped>,
    stderr_path: PathBuf,
    next_id: u64,
}

impl AcpPipe {
    /// Starts `berth serve` on `data_dir` with the scripted model playing
    /// `script`, stderr to `stderr_path`.
    fn spawn(
        bin: &Path,
        data_dir: &Path,
        script: &Path,
        stderr_path: &Path,
        extra_args: &[&std::ffi::OsStr],
    ) -> anyhow::Result<Self> {
        let (child, stdin, stdout) = spawn_berth(bin, data_dir, script, stderr_path, extra_args)?;
        let (tx, frames) = mpsc::unbounded_channel();
        tokio::spawn(read_stamped(stdout, tx));
        Ok(Self {
            child,
            stdin: Some(stdin),
            frames,
            ready: std::collections::VecDeque::new(),
            stderr_path: stderr_path.to_owned(),
            next_id: 1,
        })
    }

    fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// A request line (newline included) with a fresh id.
    fn request_line(&mut self, method: &str, params: Value) -> (u64, String) {
        let id = self.next_id;
        self.next_id += 1;
        let mut line =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        line.push('\n');
        (id, line)
    }

    /// Writes one line; returns the instant and wall time just before.
    async fn write(&mut self, line: &str) -> anyhow::Result<(Instant, DateTime<Utc>)> {
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        let at = (Instant::now(), Utc::now());
        let written = match stdin.write_all(line.as_bytes()).await {
            Ok(()) => stdin.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            bail!(
                "cannot write to berth's stdin: {e}\n{}",
                stderr_tail(&self.stderr_path)
            );
        }
        Ok(at)
    }

    /// The next frame, with when it was read.
    async fn recv(&mut self) -> anyhow::Result<(Instant, DateTime<Utc>, Value)> {
        let stamped = self.recv_line().await?;
        let frame = serde_json::from_str(&stamped.line)
            .with_context(|| format!("berth sent a non-JSON line: {}", stamped.line))?;
        Ok((stamped.at, stamped.wall, frame))
    }

    /// The next line, unparsed, with when it was read.
    async fn recv_line(&mut self) -> anyhow::Result<Stamped> {
        loop {
            if let Some(stamped) = self.ready.pop_front() {
                return Ok(stamped);
            }
            let batch = next_from_berth(&mut self.frames, FRAME_TIMEOUT, &self.stderr_path).await?;
            self.ready.extend(batch);
        }
    }

    /// One request, answered before anything else is sent; notifications in
    /// between are dropped.
    async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let (id, line) = self.request_line(method, params);
        self.write(&line).await?;
        loop {
            let (_, _, frame) = self.recv().await?;
            if let Frame::Response(got, result) = classify_frame(&frame)? {
                if got != id {
                    bail!("unexpected response (waiting for id {id}): {frame}");
                }
                return result.cloned().map_err(|e| anyhow!("{method} failed: {e}"));
            }
        }
    }

    /// Closes stdin and waits for the child to exit (kills it after 10 s).
    async fn shutdown(self) -> anyhow::Result<()> {
        self.shutdown_within(Duration::from_secs(10)).await?;
        Ok(())
    }

    /// Closes stdin and waits up to `limit` for the child to exit, then kills
    /// it. Returns how long it took to exit and whether it exited by itself.
    async fn shutdown_within(mut self, limit: Duration) -> anyhow::Result<(Duration, bool)> {
        let started = Instant::now();
        drop(self.stdin.take());
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    eprintln!(
                        "note: berth exited with {status}\n{}",
                        stderr_tail(&self.stderr_path)
                    );
                }
                Ok((started.elapsed(), true))
            }
            Err(_) => {
                eprintln!(
                    "note: berth did not exit {} s after stdin closed; killing it",
                    limit.as_secs()
                );
                self.child.kill().await?;
                Ok((started.elapsed(), false))
            }
        }
    }
}

/// The script: the timeout's input plays one zero-latency text step.
fn wake_script() -> String {
    format!(
        "# Written by bench-sched: a timed-out session's input gets one text step.\n\
         [[rules]]\n\
         match = \"{WAKE_MATCH}\"\n\
         steps = [ {{ text = \"woke\" }} ]\n"
    )
}

/// What one parked session went through.
#[derive(Debug, Clone, Default)]
struct Park {
    suspend_sent: Option<Instant>,
    suspend_ack: Option<(Instant, DateTime<Utc>)>,
    handle: Option<String>,
    suspended_at: Option<DateTime<Utc>>,
    /// When the `resumed` notification was read.
    resumed_read: Option<(Instant, DateTime<Utc>)>,
    resumed_at: Option<DateTime<Utc>>,
    lateness_ms: Option<u64>,
    ended: bool,
}

/// The fields of a `resumed` agent event the benchmark checks.
#[derive(Debug, serde::Deserialize)]
struct Resumed {
    cause: Option<String>,
    resumed_at: Option<DateTime<Utc>>,
    lateness_ms: Option<u64>,
    handle: Option<String>,
}

/// Section 1's figures.
#[derive(Debug)]
struct WireReport {
    binary: PathBuf,
    sessions: usize,
    timeout_secs: f64,
    /// Suspends written per second (0: back to back).
    rate: f64,
    max_in_flight: usize,
    /// Frames read from the first suspend on.
    frames: usize,
    sessions_created_in: Duration,
    suspend_ack: Spread,
    /// Suspend answer read (this process's clock) − `suspendedAt`.
    ack_after_built: Spread,
    suspend_window: Duration,
    suspends_per_sec: f64,
    fire: Spread,
    claim: Spread,
    delivered: Spread,
    /// `resumed` read − (suspend written + timeout), both on this process's
    /// monotonic clock: what the client that asked for the timer sees.
    client: Spread,
    /// Claim lateness minus fire lateness (derived; ±1 ms of the truncation).
    fire_to_claim: Spread,
    /// First suspend written → last `resumed` read.
    wall: Duration,
    /// First suspend written → last `turn_ended` read.
    wall_ended: Duration,
    /// The suspend window relative to the first due time (ms): [start, end].
    window_vs_due_ms: (f64, f64),
    deciles: Vec<Decile>,
    cpu_ms: Option<f64>,
}

/// One tenth of the sessions in due-time order.
#[derive(Debug)]
struct Decile {
    /// Due times, ms after the first due time.
    due_from_ms: f64,
    due_to_ms: f64,
    fire: Spread,
    claim: Spread,
}

impl WireReport {
    fn print(&self) {
        println!("== wake-up lateness over stdio (real binary) ==");
        println!("binary            {}", self.binary.display());
        println!(
            "sessions          {} parked idle, each with resumeWhen.timeout = {} s (durationMinutes {}), onTimeout resume_with_input",
            self.sessions,
            self.timeout_secs,
            self.timeout_secs / 60.0
        );
        println!(
            "berth             --max-in-flight {}; {} sessions created in {:.2} s",
            self.max_in_flight,
            self.sessions,
            self.sessions_created_in.as_secs_f64()
        );
        let written = if self.rate > 0.0 {
            format!("written at {} /s", self.rate)
        } else {
            "written back to back".into()
        };
        println!(
            "suspends          {:.0}/s (timers armed over the wire: first suspend written -> last durable answer, {:.3} s; {written})",
            self.suspends_per_sec,
            self.suspend_window.as_secs_f64()
        );
        println!("                     min ms    p50 ms    p90 ms    p99 ms    max ms   mean ms");
        println!("{}", self.suspend_ack.row("suspend ack"));
        println!("{}", self.ack_after_built.row("ack-built"));
        println!(
            "  suspend ack = suspend written -> its answer read\n  \
             ack-built   = answer read (this clock) - suspendedAt (berth's clock as it built the suspension, before its commit)"
        );
        println!();
        println!("lateness after the due time (suspendedAt + timeout), ms; target p99 <= 10 ms");
        println!("                     min ms    p50 ms    p90 ms    p99 ms    max ms   mean ms");
        println!("{}", self.fire.row("fire"));
        println!("{}", self.claim.row("claim"));
        println!("{}", self.delivered.row("delivered"));
        println!("{}", self.client.row("client"));
        println!("{}", self.fire_to_claim.row("fire->claim"));
        println!(
            "  fire        = berth's lateness_ms (scheduler clock when handed out - due; whole ms)\n  \
             claim       = resumed_at - due (the claimer thread's clock as it builds the claim, before its commit)\n  \
             delivered   = this process's clock reading the `resumed` notification - due\n  \
             client      = `resumed` read - (suspend written + timeout), this process's monotonic clock\n  \
             fire->claim = claim - fire (derived; +-1 ms)"
        );
        println!(
            "suspend window    {:.0} .. {:.0} ms relative to the first due time (suspends still being answered then)",
            self.window_vs_due_ms.0, self.window_vs_due_ms.1
        );
        println!("by due time       tenth  due from..to ms   fire p50/p99/max ms     claim p50/p99/max ms");
        for (i, d) in self.deciles.iter().enumerate() {
            println!(
                "                  {:>5}  {:>7.0}..{:<7.0}  {:>6.1} {:>6.1} {:>6.1}    {:>6.1} {:>6.1} {:>6.1}",
                i + 1,
                d.due_from_ms,
                d.due_to_ms,
                d.fire.p50_us as f64 / 1e3,
                d.fire.p99_us as f64 / 1e3,
                d.fire.max_us as f64 / 1e3,
                d.claim.p50_us as f64 / 1e3,
                d.claim.p99_us as f64 / 1e3,
                d.claim.max_us as f64 / 1e3,
            );
        }
        println!(
            "wall              {:.3} s first suspend written -> last resumed read ({:.3} s -> last turn_ended); {} frames read ({:.1} per session)",
            self.wall.as_secs_f64(),
            self.wall_ended.as_secs_f64(),
            self.frames,
            self.frames as f64 / self.sessions as f64
        );
        if let Some(cpu) = self.cpu_ms {
            println!(
                "berth CPU         {:.0} ms over that ({:.1} µs per session: suspend + fire + claim + one scripted turn)",
                cpu,
                cpu * 1e3 / self.sessions as f64
            );
        }
        println!();
    }

    fn json(&self) -> Value {
        json!({
            "sessions": self.sessions,
            "timeout_secs": self.timeout_secs,
            "rate": self.rate,
            "frames": self.frames,
            "max_in_flight": self.max_in_flight,
            "sessions_created_s": self.sessions_created_in.as_secs_f64(),
            "suspends_per_sec": self.suspends_per_sec.round(),
            "suspend_window_s": self.suspend_window.as_secs_f64(),
            "suspend_ack": self.suspend_ack.json(),
            "suspend_ack_after_suspended_at": self.ack_after_built.json(),
            "lateness_fire": self.fire.json(),
            "lateness_claim": self.claim.json(),
            "lateness_delivered": self.delivered.json(),
            "lateness_client": self.client.json(),
            "fire_to_claim": self.fire_to_claim.json(),
            "suspend_window_vs_first_due_ms": [self.window_vs_due_ms.0, self.window_vs_due_ms.1],
            "deciles": self.deciles.iter().map(|d| json!({
                "due_from_ms": d.due_from_ms, "due_to_ms": d.due_to_ms,
                "fire": d.fire.json(), "claim": d.claim.json(),
            })).collect::<Vec<_>>(),
            "wall_to_last_resumed_s": self.wall.as_secs_f64(),
            "wall_to_last_turn_ended_s": self.wall_ended.as_secs_f64(),
            "berth_cpu_ms": self.cpu_ms,
        })
    }
}

async fn wire_bench(args: &Args, bin: &Path) -> anyhow::Result<WireReport> {
    let n = args.sessions;
    let dir = tempfile::Builder::new()
        .prefix("berth-bench-sched-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd)?;
    let script = dir.path().join("wake.toml");
    std::fs::write(&script, wake_script())?;
    let max_in_flight = args.max_in_flight.unwrap_or(2 * n + 64);
    let max_in_flight_arg = max_in_flight.to_string();
    let mut acp = AcpPipe::spawn(
        bin,
        &dir.path().join("data"),
        &script,
        &dir.path().join("berth.stderr"),
        &["--max-in-flight".as_ref(), max_in_flight_arg.as_ref()],
    )?;
    acp.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
    .await
    .context("initialize")?;

    // All sessions first, pipelined.
    let mut pending: HashMap<u64, usize> = HashMap::with_capacity(n);
    let mut lines = Vec::with_capacity(n);
    for i in 0..n {
        let (id, line) = acp.request_line("session/new", json!({"cwd": cwd, "mcpServers": []}));
        pending.insert(id, i);
        lines.push(line);
    }
    let mut first_write = None;
    for line in &lines {
        let (at, _) = acp.write(line).await?;
        first_write.get_or_insert(at);
    }
    let mut session_ids = vec![String::new(); n];
    let mut last = Instant::now();
    while !pending.is_empty() {
        let (at, _, frame) = acp.recv().await?;
        if let Frame::Response(id, result) = classify_frame(&frame)? {
            let i = pending
                .remove(&id)
                .with_context(|| format!("unexpected response: {frame}"))?;
            let result = result.map_err(|e| anyhow!("session/new failed: {e}"))?;
            session_ids[i] = result["sessionId"]
                .as_str()
                .with_context(|| format!("session/new answered without a sessionId: {result}"))?
                .to_owned();
            last = at;
        }
    }
    let sessions_created_in = last - first_write.unwrap_or(last);
    let index: HashMap<&str, usize> = session_ids
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str(), i))
        .collect();

    // Suspend them all, back to back.
    let duration_minutes = args.timeout_secs / 60.0;
    let timeout = chrono::Duration::milliseconds(timeout_ms(duration_minutes));
    let lines: Vec<(u64, String)> = session_ids
        .iter()
        .enumerate()
        .map(|(i, s)| {
            acp.request_line(
                "session/suspend",
                json!({
                    "sessionId": s,
                    "reason": "bench-sched",
                    "resumeWhen": {"timeout": {
                        "durationMinutes": duration_minutes,
                        "onTimeout": "resume_with_input",
                        "input": format!("{WAKE_MATCH} session {i}"),
                    }},
                }),
            )
        })
        .collect();
    let pid = acp.pid();
    let cpu_start = pid.and_then(cpu_ns);
    let mut parks = vec![Park::default(); n];
    let mut first_suspend: Option<(Instant, DateTime<Utc>)> = None;
    let pace = (args.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / args.rate));
    let pace_from = tokio::time::Instant::now();
    for (i, (id, line)) in lines.iter().enumerate() {
        if let Some(pace) = pace {
            tokio::time::sleep_until(pace_from + pace.mul_f64(i as f64)).await;
        }
        pending.insert(*id, i);
        let at = acp.write(line).await?;
        first_suspend.get_or_insert(at);
        parks[i].suspend_sent = Some(at.0);
    }
    let (first_suspend, first_suspend_wall) = first_suspend.context("no suspend was written")?;
    let mut last_ack = (first_suspend, first_suspend_wall);
    let mut last_resumed = first_suspend;
    let mut last_ended = first_suspend;
    let mut ended = 0;
    let mut frames = 0usize;
    while ended < n || !pending.is_empty() {
        let Stamped { at, wall, line } = acp.recv_line().await?;
        frames += 1;
        // Notifications are read without a JSON tree (`classify_line`): this
        // process shares the machine with the berth it measures.
        match classify_line(&line)? {
            Lean::Response => {
                let frame: Value = serde_json::from_str(&line)
                    .with_context(|| format!("berth sent a non-JSON line: {line}"))?;
                let Frame::Response(id, result) = classify_frame(&frame)? else {
                    bail!("the two frame readers disagree on a line: {line}");
                };
                let i = pending
                    .remove(&id)
                    .with_context(|| format!("unexpected response: {frame}"))?;
                let result = result.map_err(|e| anyhow!("session/suspend failed: {e}"))?;
                if !result["summary"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("parked while idle"))
                {
                    bail!("a session did not park while idle: {result}");
                }
                let p = &mut parks[i];
                p.suspend_ack = Some((at, wall));
                last_ack = (at, wall);
                p.handle = result["handle"].as_str().map(str::to_owned);
                p.suspended_at = Some(
                    serde_json::from_value(result["suspendedAt"].clone()).with_context(|| {
                        format!("suspend answered without a valid suspendedAt: {result}")
                    })?,
                );
            }
            Lean::Note(session, kind, event) => {
                let Some(&i) = index.get(session.as_ref()) else {
                    continue;
                };
                let p = &mut parks[i];
                match kind.as_ref() {
                    "resumed" => {
                        let event: Resumed = serde_json::from_str(
                            event
                                .with_context(|| {
                                    format!("a resumed agent event without its event: {line}")
                                })?
                                .get(),
                        )
                        .with_context(|| format!("a resumed event that does not parse: {line}"))?;
                        if event.cause.as_deref() != Some("timeout") {
                            bail!("a session resumed for another cause than its timeout: {line}");
                        }
                        if p.resumed_read.is_some() {
                            bail!("a session resumed twice: {line}");
                        }
                        p.resumed_read = Some((at, wall));
                        last_resumed = at;
                        p.resumed_at = Some(event.resumed_at.with_context(|| {
                            format!("a resumed event without resumed_at: {line}")
                        })?);
                        p.lateness_ms = event.lateness_ms;
                        if p.lateness_ms.is_none() {
                            bail!("a timeout's resumed event without lateness_ms: {line}");
                        }
                        if let (Some(h), Some(got)) = (&p.handle, event.handle.as_deref()) {
                            if h != got {
                                bail!("resumed handle {got} is not the suspend's {h}");
                            }
                        }
                    }
                    // The session's first turn is the one its timeout started.
                    "turn_ended" if p.resumed_read.is_some() && !p.ended => {
                        p.ended = true;
                        ended += 1;
                        last_ended = at;
                    }
                    "turn_ended" => bail!("a turn ended before its session resumed: {line}"),
                    _ => {}
                }
            }
        }
    }
    let cpu_end = pid.and_then(cpu_ns);
    acp.shutdown().await?;

    let mut acks = Vec::with_capacity(n);
    let mut ack_after_built = Vec::with_capacity(n);
    let mut fire = Vec::with_capacity(n);
    let mut claim = Vec::with_capacity(n);
    let mut delivered = Vec::with_capacity(n);
    let mut client = Vec::with_capacity(n);
    let timeout_std = Duration::from_millis(timeout_ms(duration_minutes).max(0) as u64);
    let mut fire_to_claim = Vec::with_capacity(n);
    let mut by_due: Vec<(DateTime<Utc>, i64, i64)> = Vec::with_capacity(n);
    for p in &parks {
        let (
            Some(sent),
            Some(ack),
            Some(suspended_at),
            Some((read_at, read_wall)),
            Some(resumed_at),
            Some(late),
        ) = (
            p.suspend_sent,
            p.suspend_ack,
            p.suspended_at,
            p.resumed_read,
            p.resumed_at,
            p.lateness_ms,
        )
        else {
            bail!("a session's run left a mark unset: {p:?}");
        };
        let due = suspended_at + timeout;
        acks.push((ack.0 - sent).as_micros() as i64);
        ack_after_built.push(micros_between(ack.1, suspended_at));
        let fire_us = late as i64 * 1000;
        let claim_us = micros_between(resumed_at, due);
        fire.push(fire_us);
        claim.push(claim_us);
        delivered.push(micros_between(read_wall, due));
        client.push(signed_micros(read_at, sent + timeout_std));
        // The scheduler fires at its whole-ms clock: fire time = due ms
        // (truncated) + lateness ms.
        let fired_at_ms = due.timestamp_millis() + late as i64;
        fire_to_claim.push(resumed_at.timestamp_micros() - fired_at_ms * 1000);
        by_due.push((due, fire_us, claim_us));
    }
    by_due.sort_by_key(|(due, _, _)| *due);
    let first_due = by_due[0].0;
    let rel_ms = |t: DateTime<Utc>| micros_between(t, first_due) as f64 / 1e3;
    let deciles = (0..10)
        .filter_map(|d| {
            let chunk = &by_due[d * n / 10..(d + 1) * n / 10];
            let (first, last) = (chunk.first()?, chunk.last()?);
            Some(Decile {
                due_from_ms: rel_ms(first.0),
                due_to_ms: rel_ms(last.0),
                fire: Spread::of(&chunk.iter().map(|c| c.1).collect::<Vec<_>>()),
                claim: Spread::of(&chunk.iter().map(|c| c.2).collect::<Vec<_>>()),
            })
        })
        .collect();
    let suspend_window = last_ack.0 - first_suspend;
    Ok(WireReport {
        binary: bin.to_owned(),
        sessions: n,
        timeout_secs: args.timeout_secs,
        rate: args.rate,
        max_in_flight,
        frames,
        sessions_created_in,
        suspend_ack: Spread::of(&acks),
        ack_after_built: Spread::of(&ack_after_built),
        suspend_window,
        suspends_per_sec: n as f64 / suspend_window.as_secs_f64(),
        fire: Spread::of(&fire),
        claim: Spread::of(&claim),
        delivered: Spread::of(&delivered),
        client: Spread::of(&client),
        fire_to_claim: Spread::of(&fire_to_claim),
        wall: last_resumed - first_suspend,
        wall_ended: last_ended - first_suspend,
        window_vs_due_ms: (rel_ms(first_suspend_wall), rel_ms(last_ack.1)),
        deciles,
        cpu_ms: match (cpu_start, cpu_end) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / 1e6),
            _ => None,
        },
    })
}

// ---------------------------------------------------------------------------
// 2. A million pending timers
// ---------------------------------------------------------------------------

/// A step's memory: the process's RSS and high-water mark, and live heap.
#[derive(Debug, Clone, Copy)]
struct MemPoint {
    rss: u64,
    hwm: u64,
    heap: u64,
}

impl MemPoint {
    fn now() -> Self {
        let m = mem_of("/proc/self/status");
        Self {
            rss: m.rss,
            hwm: m.hwm,
            heap: live_heap(),
        }
    }

    fn json(&self) -> Value {
        json!({"rss_bytes": self.rss, "hwm_bytes": self.hwm, "live_heap_bytes": self.heap})
    }
}

/// The real binary restarted on the timers' journal.
#[derive(Debug)]
struct Restart {
    to_initialize: Duration,
    to_quiet: Option<Duration>,
    mem: Mem,
    cpu_ms: Option<f64>,
}

/// Section 2's figures.
#[derive(Debug)]
struct ScaleReport {
    timers: usize,
    batch: usize,
    write: Duration,
    file_bytes: u64,
    open: Duration,
    load: Duration,
    arm: Duration,
    armed: usize,
    mem: Vec<(&'static str, MemPoint)>,
    restart: Option<Result<Restart, String>>,
}

impl ScaleReport {
    fn print(&self) {
        let per_sec = |d: Duration| self.timers as f64 / d.as_secs_f64();
        println!("== {} pending timers (in-process) ==", self.timers);
        println!(
            "write             {:.2} s: {:.0} suspensions/s ({} per commit; each a suspension row and a wake-up row)",
            self.write.as_secs_f64(),
            per_sec(self.write),
            self.batch
        );
        println!(
            "scheduler entry   (due ms, session id) in a BTreeSet: {} B inline + the id's heap bytes; the rest of a wake-up stays in the journal",
            std::mem::size_of::<(i64, Box<str>)>() + 8
        );
        println!(
            "journal.redb      {:.1} MiB ({:.0} bytes per parked session)",
            mib(self.file_bytes),
            self.file_bytes as f64 / self.timers as f64
        );
        println!("start-up, as Node::start does it (warm page cache):");
        println!(
            "  Journal::open   {:>9.1} ms",
            self.open.as_secs_f64() * 1e3
        );
        println!(
            "  stream + send   {:>9.1} ms ({:.0} rows/s read, decoded and sent as entries, {ARM_CHUNK} per command)",
            self.load.as_secs_f64() * 1e3,
            per_sec(self.load)
        );
        println!(
            "  armed           {:>9.1} ms until armed() = {} ({:.0} timers armed/s)",
            self.arm.as_secs_f64() * 1e3,
            self.armed,
            per_sec(self.arm)
        );
        println!(
            "  total           {:>9.1} ms",
            (self.open + self.arm).as_secs_f64() * 1e3
        );
        println!("memory of this process      VmRSS MiB  VmHWM MiB  live heap MiB");
        for (label, m) in &self.mem {
            println!(
                "  {label:<25} {:>9.1}  {:>9.1}  {:>13.1}",
                mib(m.rss),
                mib(m.hwm),
                mib(m.heap)
            );
        }
        let at = |label: &str| self.mem.iter().find(|(l, _)| *l == label).map(|(_, m)| *m);
        if let (Some(before), Some(open), Some(closed)) = (
            at("before loading"),
            at("armed (journal open)"),
            at("armed, journal closed"),
        ) {
            let per = |bytes: u64| bytes as f64 / self.timers as f64;
            let cache = open.heap.saturating_sub(closed.heap);
            let heap = closed.heap.saturating_sub(before.heap);
            let rss = open.rss.saturating_sub(before.rss);
            println!(
                "  the armed scheduler holds {:.1} MiB live heap ({:.0} B/timer); redb's page cache after the scan {:.1} MiB; RSS grew {:.1} MiB while loading ({:.0} B/timer)",
                mib(heap),
                per(heap),
                mib(cache),
                mib(rss),
                per(rss)
            );
        }
        match &self.restart {
            None => {}
            Some(Err(e)) => println!("restart of berth serve: failed: {e}"),
            Some(Ok(r)) => {
                println!("restart of the real `berth serve` on this journal:");
                println!(
                    "  spawn -> initialize answered  {:.1} ms (Node::start done: wake-ups loaded, arms queued)",
                    r.to_initialize.as_secs_f64() * 1e3
                );
                match r.to_quiet {
                    Some(d) => println!(
                        "  spawn -> CPU quiet            {:.1} ms (re-arming done, by that estimate)",
                        d.as_secs_f64() * 1e3
                    ),
                    None => println!("  spawn -> CPU quiet            (not within 60 s)"),
                }
                println!(
                    "  berth VmRSS {:.1} MiB, VmHWM {:.1} MiB then{}",
                    mib(r.mem.rss),
                    mib(r.mem.hwm),
                    r.cpu_ms
                        .map(|c| format!("; {c:.0} ms of CPU until then"))
                        .unwrap_or_default()
                );
            }
        }
        println!();
    }

    fn json(&self) -> Value {
        json!({
            "timers": self.timers,
            "batch": self.batch,
            "write_s": self.write.as_secs_f64(),
            "write_per_sec": (self.timers as f64 / self.write.as_secs_f64()).round(),
            "journal_bytes": self.file_bytes,
            "open_ms": self.open.as_secs_f64() * 1e3,
            "wakeups_load_ms": self.load.as_secs_f64() * 1e3,
            "arm_ms": self.arm.as_secs_f64() * 1e3,
            "armed_per_sec": (self.timers as f64 / self.arm.as_secs_f64()).round(),
            "armed": self.armed,
            "wakeup_size_bytes": std::mem::size_of::<Wakeup>(),
            "mem": self.mem.iter().map(|(l, m)| (l.to_string(), m.json())).collect::<serde_json::Map<_, _>>(),
            "restart": match &self.restart {
                None => Value::Null,
                Some(Err(e)) => json!({"error": e}),
                Some(Ok(r)) => json!({
                    "to_initialize_ms": r.to_initialize.as_secs_f64() * 1e3,
                    "to_quiet_ms": r.to_quiet.map(|d| d.as_secs_f64() * 1e3),
                    "rss_bytes": r.mem.rss,
                    "hwm_bytes": r.mem.hwm,
                    "cpu_ms": r.cpu_ms,
                }),
            },
        })
    }
}

/// splitmix64: a cheap, well-mixed stream for ids that look random.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The `i`-th idle suspension: an id like berth's (`sess_` + 32 hex), a
/// `resume_with_input` timeout due between one day and one year after `now`.
fn far_suspension(i: u64, now: DateTime<Utc>) -> Suspension {
    let (a, b, c) = (mix(4 * i), mix(4 * i + 1), mix(4 * i + 2));
    let minutes_a_day = 1_440.0;
    let spread = (c % (525_600 - 1_440)) as f64;
    Suspension {
        handle: format!("susp_{:016x}{:016x}", b, mix(4 * i + 3)),
        session_id: SessionId::from(format!("sess_{a:016x}{b:016x}")),
        reason: Some("bench-sched".into()),
        initiator: Initiator::Client,
        actor: "connection-1".into(),
        mode: SuspendMode::FinishStep,
        resume_when: Some(ResumeConditions {
            on_event: None,
            trigger: None,
            timeout: Some(ResumeTimeout {
                duration_minutes: minutes_a_day + spread,
                on_timeout: OnTimeout::ResumeWithInput,
                input: Some(json!(format!("{WAKE_MATCH} session {i}"))),
            }),
        }),
        summary: Some("parked while idle".into()),
        suspended_at: now,
        frame: None,
        turn_id: None,
        parent_session_id: None,
        span_links: Vec::new(),
    }
}

async fn scale_bench(args: &Args, bin: Option<&Path>) -> anyhow::Result<ScaleReport> {
    let m = args.timers;
    let dir = tempfile::Builder::new()
        .prefix("berth-bench-sched-scale-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data)?;
    let path = data.join("journal.redb");
    let mut mem = vec![("start", MemPoint::now())];

    // Write.
    let journal = Journal::open(&path, JournalOptions::default())?;
    let now = Utc::now();
    let started = Instant::now();
    let mut i = 0;
    while i < m {
        let end = (i + args.batch).min(m);
        let batch = (i..end).fold(Batch::new(), |b, i| {
            b.put_suspension(&far_suspension(i as u64, now))
        });
        journal.commit(batch).await.context("writing suspensions")?;
        i = end;
    }
    let write = started.elapsed();
    drop(journal);
    mem.push(("written, journal closed", MemPoint::now()));
    let file_bytes = std::fs::metadata(&path)?.len();

    // Start-up, as Node::start does it: the rows are streamed and only each
    // wake-up's compact scheduler entry is kept.
    let started = Instant::now();
    let journal = Journal::open(&path, JournalOptions::default())?;
    let open = started.elapsed();
    mem.push(("before loading", MemPoint::now()));
    let (scheduler, mut fired) = Scheduler::start(Arc::new(SystemClock));
    let started = Instant::now();
    let mut entries = Vec::with_capacity(ARM_CHUNK);
    let loaded = journal.for_each_wakeup(|wakeup| {
        entries.push(Entry::of(&wakeup));
        if entries.len() == ARM_CHUNK {
            scheduler.arm_all(std::mem::replace(
                &mut entries,
                Vec::with_capacity(ARM_CHUNK),
            ));
        }
    })?;
    scheduler.arm_all(entries);
    let load = started.elapsed();
    if loaded != m as u64 {
        bail!("for_each_wakeup() read {loaded} rows, {m} were written");
    }
    let armed = scheduler.armed().await;
    let arm = started.elapsed();
    mem.push(("armed (journal open)", MemPoint::now()));
    if armed != m {
        bail!("the scheduler armed {armed} of {m} wake-ups");
    }
    if let Ok(firing) = fired.try_recv() {
        bail!("a far-future wake-up fired: {firing:?}");
    }
    // Closed (untimed) so that what is live is the scheduler's alone: the
    // scan filled redb's page cache.
    drop(journal);
    mem.push(("armed, journal closed", MemPoint::now()));
    drop(scheduler);
    drop(fired);
    // The scheduler task frees its state once it sees its channel closed:
    // wait until the live heap stops shrinking (at most 10 s).
    let mut heap = live_heap();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = live_heap();
        if now >= heap {
            break;
        }
        heap = now;
    }
    mem.push(("scheduler dropped", MemPoint::now()));

    let restart = match bin {
        Some(bin) => Some(
            restart(bin, dir.path(), &data)
                .await
                .map_err(|e| format!("{e:#}")),
        ),
        None => None,
    };
    Ok(ScaleReport {
        timers: m,
        batch: args.batch,
        write,
        file_bytes,
        open,
        load,
        arm,
        armed,
        mem,
        restart,
    })
}

/// Waits until process `pid` goes quiet — under 10 ms of CPU over a 500 ms
/// window, sampled every 20 ms — or until `limit` after `since` has passed.
/// Returns the first instant of the quiet window and the process's CPU time
/// (ns) then; `None` when it never went quiet.
async fn wait_quiet(
    pid: u32,
    since: Instant,
    limit: Duration,
) -> anyhow::Result<Option<(Instant, u64)>> {
    let window = 25;
    let mut samples: std::collections::VecDeque<(Instant, u64)> = Default::default();
    while since.elapsed() < limit {
        let cpu = cpu_ns(pid).context("cannot read berth's CPU time")?;
        samples.push_back((Instant::now(), cpu));
        if samples.len() > window {
            samples.pop_front();
        }
        if let (true, Some(first), Some(last)) =
            (samples.len() == window, samples.front(), samples.back())
        {
            if last.1.saturating_sub(first.1) < 10_000_000 {
                return Ok(Some(*first));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(None)
}

/// Starts `berth serve` on `data` (holding the pending timers), times the
/// `initialize` answer, then polls its CPU time and memory until it is quiet.
async fn restart(bin: &Path, dir: &Path, data: &Path) -> anyhow::Result<Restart> {
    let script = dir.join("wake.toml");
    std::fs::write(&script, wake_script())?;
    let spawned = Instant::now();
    let mut acp = AcpPipe::spawn(bin, data, &script, &dir.join("restart.stderr"), &[])?;
    acp.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
    .await
    .context("initialize after the restart")?;
    let to_initialize = spawned.elapsed();
    let pid = acp.pid().context("berth exited")?;
    let status = format!("/proc/{pid}/status");
    let quiet = wait_quiet(pid, spawned, Duration::from_secs(60)).await?;
    let mem = mem_of(&status);
    acp.shutdown().await?;
    Ok(Restart {
        to_initialize,
        to_quiet: quiet.map(|(at, _)| at - spawned),
        mem,
        cpu_ms: quiet.map(|(_, cpu)| cpu as f64 / 1e6),
    })
}

// ---------------------------------------------------------------------------
// 3. Parked density over the wire
// ---------------------------------------------------------------------------

/// Section 3's figures.
#[derive(Debug)]
struct DensityReport {
    parked: usize,
    probes: usize,
    window: usize,
    created_in: Duration,
    parked_in: Duration,
    /// berth after `initialize`, before any session.
    mem_empty: Mem,
    /// berth with every session parked, once its CPU went quiet.
    mem_parked: Mem,
    /// After `--park-settle-secs` (the sessions passivated), if sampled.
    mem_passivated: Option<Mem>,
    /// stdin closed → berth exited, with every session parked.
    stopped_in: Duration,
    /// Whether it exited by itself (else it was killed after 300 s).
    clean_stop: bool,
    /// Apparent size of the data directory right after `initialize` (empty).
    disk_empty_bytes: u64,
    /// Apparent size and allocated bytes of the data directory after a clean stop.
    disk_bytes: u64,
    disk_alloc_bytes: u64,
    /// Restart: spawn → `initialize` answered.
    to_initialize: Duration,
    /// Restart: spawn → every probe's `resumed` seen (an upper bound on when
    /// the overdue wake-ups fired).
    to_probes_fired: Duration,
    /// Restart: spawn → CPU quiet.
    to_quiet: Option<Duration>,
    mem_restarted: Mem,
}

impl DensityReport {
    fn per_unit(&self, bytes: u64) -> f64 {
        bytes as f64 / (self.parked + self.probes) as f64
    }

    fn print(&self) {
        let units = self.parked + self.probes;
        println!("== parked density over stdio (real binary) ==");
        println!(
            "parked            {} sessions with a one-day timeout + {} probes with a short one, {} requests in flight",
            self.parked, self.probes, self.window
        );
        println!(
            "created           {:.2} s ({:.0} session/new per s); parked in {:.2} s ({:.0} suspends/s)",
            self.created_in.as_secs_f64(),
            units as f64 / self.created_in.as_secs_f64(),
            self.parked_in.as_secs_f64(),
            units as f64 / self.parked_in.as_secs_f64()
        );
        let rss_delta = self.mem_parked.rss.saturating_sub(self.mem_empty.rss);
        println!(
            "RSS               {:.1} MiB empty, {:.1} MiB with all parked (VmHWM {:.1} MiB): {:.0} B per parked session",
            mib(self.mem_empty.rss),
            mib(self.mem_parked.rss),
            mib(self.mem_parked.hwm),
            self.per_unit(rss_delta)
        );
        if let Some(mem) = &self.mem_passivated {
            println!(
                "passivated        RSS {:.1} MiB once the parked sessions passivated: {:.0} B per parked session",
                mib(mem.rss),
                self.per_unit(mem.rss.saturating_sub(self.mem_empty.rss))
            );
        }
        println!(
            "stop              {:.2} s from stdin closed to exit{}",
            self.stopped_in.as_secs_f64(),
            if self.clean_stop {
                ""
            } else {
                " (killed: it did not exit by itself)"
            }
        );
        println!(
            "disk              {:.1} MiB data dir ({:.1} MiB allocated): {:.0} B per parked session",
            mib(self.disk_bytes),
            mib(self.disk_alloc_bytes),
            self.per_unit(self.disk_bytes)
        );
        println!(
            "restart           initialize answered {:.1} ms after spawn; all {} overdue probes fired within {:.1} ms; CPU quiet {}",
            self.to_initialize.as_secs_f64() * 1e3,
            self.probes,
            self.to_probes_fired.as_secs_f64() * 1e3,
            self.to_quiet
                .map_or_else(|| "not within 120 s".into(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3))
        );
        println!(
            "after restart     RSS {:.1} MiB ({:.0} B per parked session, nothing live but the wake-ups), VmHWM {:.1} MiB",
            mib(self.mem_restarted.rss),
            self.per_unit(self.mem_restarted.rss),
            mib(self.mem_restarted.hwm)
        );
        println!();
    }

    fn json(&self) -> Value {
        json!({
            "parked": self.parked,
            "probes": self.probes,
            "window": self.window,
            "created_s": self.created_in.as_secs_f64(),
            "parked_s": self.parked_in.as_secs_f64(),
            "rss_empty_bytes": self.mem_empty.rss,
            "rss_parked_bytes": self.mem_parked.rss,
            "hwm_parked_bytes": self.mem_parked.hwm,
            "rss_per_parked_bytes": self.per_unit(self.mem_parked.rss.saturating_sub(self.mem_empty.rss)).round(),
            "rss_passivated_bytes": self.mem_passivated.as_ref().map(|m| m.rss),
            "stop_s": self.stopped_in.as_secs_f64(),
            "clean_stop": self.clean_stop,
            "disk_empty_bytes": self.disk_empty_bytes,
            "disk_bytes": self.disk_bytes,
            "disk_alloc_bytes": self.disk_alloc_bytes,
            "disk_per_parked_bytes": self.per_unit(self.disk_bytes).round(),
            "restart_to_initialize_ms": self.to_initialize.as_secs_f64() * 1e3,
            "restart_to_probes_fired_ms": self.to_probes_fired.as_secs_f64() * 1e3,
            "restart_to_quiet_ms": self.to_quiet.map(|d| d.as_secs_f64() * 1e3),
            "rss_restarted_bytes": self.mem_restarted.rss,
            "hwm_restarted_bytes": self.mem_restarted.hwm,
        })
    }
}

/// Sends `n` requests `method` (params from `params(i)`), keeping at most
/// `window` in flight; returns the results in request order. Notifications
/// in between are dropped.
async fn pipelined(
    acp: &mut AcpPipe,
    n: usize,
    window: usize,
    method: &str,
    mut params: impl FnMut(usize) -> Value,
) -> anyhow::Result<Vec<Value>> {
    let mut results = vec![Value::Null; n];
    let mut pending: HashMap<u64, usize> = HashMap::with_capacity(window);
    let (mut next, mut done) = (0, 0);
    while done < n {
        while next < n && pending.len() < window.max(1) {
            let (id, line) = acp.request_line(method, params(next));
            acp.write(&line).await?;
            pending.insert(id, next);
            next += 1;
        }
        let (_, _, frame) = acp.recv().await?;
        if let Frame::Response(id, result) = classify_frame(&frame)? {
            let i = pending
                .remove(&id)
                .with_context(|| format!("unexpected response: {frame}"))?;
            results[i] = result.map_err(|e| anyhow!("{method} failed: {e}"))?.clone();
            done += 1;
        }
    }
    Ok(results)
}

/// Apparent and allocated bytes of every file under `dir`.
fn dir_size(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut total = (0, 0);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return total;
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            let (a, b) = dir_size(&entry.path());
            total = (total.0 + a, total.1 + b);
        } else {
            total = (total.0 + meta.len(), total.1 + meta.blocks() * 512);
        }
    }
    total
}

/// Parks `--park` sessions (one-day timeouts) and `--park-probes` sessions
/// (timeouts of `--timeout-secs`) over the wire, measures berth's memory and
/// the data directory, stops berth, waits until every probe is overdue,
/// restarts it and times `initialize`, the probes' firing and the CPU going
/// quiet.
async fn density_bench(args: &Args, bin: &Path) -> anyhow::Result<DensityReport> {
    let (parked, probes, window) = (args.park, args.park_probes, args.park_window.max(1));
    let units = parked + probes;
    let dir = tempfile::Builder::new()
        .prefix("berth-bench-density-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd)?;
    let data = dir.path().join("data");
    let script = dir.path().join("wake.toml");
    std::fs::write(&script, wake_script())?;
    let max_in_flight = (2 * window + 64).to_string();
    let extra: [&std::ffi::OsStr; 2] = ["--max-in-flight".as_ref(), max_in_flight.as_ref()];
    let mut acp = AcpPipe::spawn(
        bin,
        &data,
        &script,
        &dir.path().join("berth.stderr"),
        &extra,
    )?;
    acp.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
    .await
    .context("initialize")?;
    let pid = acp.pid().context("berth exited")?;
    let status = format!("/proc/{pid}/status");
    let mem_empty = mem_of(&status);
    let disk_empty_bytes = dir_size(&data).0;

    let started = Instant::now();
    let created = pipelined(
        &mut acp,
        units,
        window,
        "session/new",
        |_| json!({"cwd": cwd, "mcpServers": []}),
    )
    .await
    .context("creating the sessions")?;
    let created_in = started.elapsed();
    let ids: Vec<String> = created
        .iter()
        .map(|r| {
            r["sessionId"]
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("session/new answered without a sessionId: {r}"))
        })
        .collect::<anyhow::Result<_>>()?;
    let far_minutes = 24.0 * 60.0;
    let probe_minutes = args.timeout_secs / 60.0;
    let started = Instant::now();
    let answers = pipelined(&mut acp, units, window, "session/suspend", |i| {
        let (minutes, input) = if i < parked {
            (far_minutes, format!("{WAKE_MATCH} parked {i}"))
        } else {
            (probe_minutes, format!("{WAKE_MATCH} probe {i}"))
        };
        json!({
            "sessionId": ids[i],
            "reason": "bench-sched density",
            "resumeWhen": {"timeout": {
                "durationMinutes": minutes,
                "onTimeout": "resume_with_input",
                "input": input,
            }},
        })
    })
    .await
    .context("parking the sessions")?;
    let parked_in = started.elapsed();
    let probe_timeout = chrono::Duration::milliseconds(timeout_ms(probe_minutes));
    let mut last_due: Option<DateTime<Utc>> = None;
    for answer in &answers[parked..] {
        let at: DateTime<Utc> = serde_json::from_value(answer["suspendedAt"].clone())
            .with_context(|| format!("suspend answered without a valid suspendedAt: {answer}"))?;
        last_due = last_due.max(Some(at + probe_timeout));
    }
    if let Some(bad) = answers.iter().find(|a| {
        !a["summary"]
            .as_str()
            .is_some_and(|s| s.starts_with("parked while idle"))
    }) {
        bail!("a session did not park while idle: {bad}");
    }
    wait_quiet(pid, Instant::now(), Duration::from_secs(120)).await?;
    let mem_parked = mem_of(&status);
    // The steady state: parked sessions passivated (no actor, only rows and
    // a timer), what a long-lived node holds.
    let mem_passivated = if args.park_settle_secs > 0 {
        tokio::time::sleep(Duration::from_secs(args.park_settle_secs)).await;
        wait_quiet(pid, Instant::now(), Duration::from_secs(120)).await?;
        Some(mem_of(&status))
    } else {
        None
    };
    let (stopped_in, clean_stop) = acp.shutdown_within(Duration::from_secs(300)).await?;
    let (disk_bytes, disk_alloc_bytes) = dir_size(&data);

    // Every probe must be overdue before berth comes back.
    if let Some(due) = last_due {
        let wait = (due - Utc::now()).num_milliseconds() + 100;
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
    }
    let spawned = Instant::now();
    let mut acp = AcpPipe::spawn(
        bin,
        &data,
        &script,
        &dir.path().join("restart.stderr"),
        &extra,
    )?;
    acp.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
    .await
    .context("initialize after the restart")?;
    let to_initialize = spawned.elapsed();
    let pid = acp.pid().context("berth exited")?;
    let status = format!("/proc/{pid}/status");
    // Attach to every probe (replaying its events): a `resumed` event,
    // replayed or live, means its overdue wake-up fired.
    let probe_index: HashMap<&str, usize> = ids[parked..]
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str(), i))
        .collect();
    let mut fired = vec![false; probes];
    let mut fired_count = 0;
    let mut last_fired = spawned;
    let mut pending: HashMap<u64, usize> = HashMap::new();
    let mut next = 0;
    while fired_count < probes || !pending.is_empty() {
        while next < probes && pending.len() < window {
            let (id, line) =
                acp.request_line("session/load", json!({"sessionId": ids[parked + next]}));
            acp.write(&line).await?;
            pending.insert(id, next);
            next += 1;
        }
        let (at, _, frame) = acp.recv().await?;
        match classify_frame(&frame)? {
            Frame::Response(id, result) => {
                pending
                    .remove(&id)
                    .with_context(|| format!("unexpected response: {frame}"))?;
                result.map_err(|e| anyhow!("session/load failed: {e}"))?;
            }
            Frame::Note(session, "resumed") => {
                if let Some(&i) = probe_index.get(session) {
                    if !fired[i] {
                        fired[i] = true;
                        fired_count += 1;
                        last_fired = at;
                    }
                }
            }
            Frame::Note(..) => {}
        }
    }
    let to_probes_fired = last_fired - spawned;
    let quiet = wait_quiet(pid, spawned, Duration::from_secs(120)).await?;
    let mem_restarted = mem_of(&status);
    acp.shutdown().await?;
    Ok(DensityReport {
        parked,
        probes,
        window,
        created_in,
        parked_in,
        mem_empty,
        mem_parked,
        mem_passivated,
        stopped_in,
        clean_stop,
        disk_empty_bytes,
        disk_bytes,
        disk_alloc_bytes,
        to_initialize,
        to_probes_fired,
        to_quiet: quiet.map(|(at, _)| at - spawned),
        mem_restarted,
    })
}
