//! `bench-core`: measures berth's core costs and prints figures.
//!
//! This is a measurement tool, not a test: nothing here asserts on timings.
//! Run it with
//!
//! ```text
//! cargo build --release --bin berth
//! cargo run --release -p berth-conformance --bin bench-core -- --help
//! ```
//!
//! # 1. Prompt round trip over stdio
//!
//! Spawns the real `berth serve` binary (`$BERTH_BIN`, default
//! `<workspace>/target/release/berth`) on a fresh data directory with the
//! `scripted` model and a script written for the occasion: every prompt plays
//! one rule whose steps are a single zero-latency tool call (by default
//! `read_file` of a 6-byte file in the session's cwd; `--tool shell` runs
//! `true` instead, `--tool none` skips the tool) followed by a text step.
//! The benchmark speaks ACP JSON-RPC over the child's stdin/stdout itself
//! (newline-delimited JSON): `initialize`, `session/new`, then — after
//! `--warmup` unmeasured prompts — `--prompts` sequential `session/prompt`
//! requests on one session. Each round trip is timed from writing the request
//! line to parsing its response line; the `session/update` and
//! `_berth/agentEvent` notifications in between are read and tallied (their
//! `_meta.berth.eventId`s), not timed separately. Every journaled event is one
//! durable commit before any client hears of it, so "events per turn" is the
//! number of fsync-bearing commits a turn pays at minimum (frame checkpoints
//! are durable commits too but produce no notification: a turn with one tool
//! call checkpoints twice). To count the fsyncs themselves, point `BERTH_BIN`
//! at a wrapper that runs `strace -f -c -e trace=fdatasync,fsync` on berth.
//!
//! All prompts go to one session, so the transcript grows by a few messages
//! per turn; the report shows the mean latency of each tenth of the measured
//! prompts, in order, to make any growth in per-turn cost visible.
//!
//! Alongside, the CPU time berth's threads used per turn (summed from
//! `/proc/<pid>/task/*/schedstat` of the spawned process — so of the wrapper,
//! if `BERTH_BIN` is a wrapper script such as `strace`/`perf`), by tenth too,
//! separates "berth does more work per turn" from "the machine is busy". After
//! the child exits, the session's final transcript is read from its journal
//! and its size printed.
//!
//! The machine's load average (`/proc/loadavg`) is printed before and after:
//! the figures are only as quiet as the machine they ran on.
//!
//! # 2. Durable appends with 1, 10 and 100 concurrent sessions
//!
//! In-process against [`berth_storage::Journal`]: for each concurrency level
//! `c` (`--sessions`, default `1,10,100`) a fresh journal file is opened and
//! `c` tokio tasks each append one small event to their own session at a time,
//! awaiting each [`Journal::commit`] (which returns only once the group commit
//! is fsynced) before sending the next. After a short warm-up, appends are
//! counted and timed for `--duration-secs`. With one session every append pays
//! a whole commit; with many, the writer folds all pending appends into one
//! transaction (one fsync), so appends/s should grow with `c` while
//! per-append latency grows only with the size of that transaction. Every level runs twice: with the
//! default options and with `quick_repair: true`. After each run the journal's
//! per-session tail is compared with the number of acknowledged appends (a
//! sanity check printed as a warning, never a failure).
//!
//! # 3. Inject → delivery over stdio
//!
//! `--injects` steers (`session/inject`, mode `steer`) sent one at a time into
//! a turn running zero-latency `read_file` calls, each timed from writing it to
//! reading its delivery echo (the `user_message_chunk` carrying its message
//! id). Runs with the stdio section (`--injects 0` skips it).
//!
//! # 4. Suspend → durable ack, resume → first model call
//!
//! Over stdio against the real binary, like section 1, but with requests
//! pipelined: a reader task stamps every line berth writes with the instant it
//! was read (before parsing), and every request is stamped just before its line
//! is written, so each request's latency is its own even with a thousand in
//! flight. For each count in `--suspend-sessions` (default `1,1000`) a fresh
//! `berth serve` is started with `--max-in-flight 3·N+64`, and all N sessions
//! are created first (pipelined `session/new`, one connection). Then each
//! round (`--suspend-warmup-rounds` unmeasured, then
//! max(`--suspend-rounds`, ⌈`--suspend-min-samples` / N⌉) measured):
//!
//! * **suspend → durable ack** (idle sessions): all N `session/suspend` are
//!   written back to back; each is timed to its answer, which berth sends only
//!   once the suspension (envelope, `suspended` event, receipt) is committed.
//!   Every answer's `summary` must say the session parked while idle.
//!   Suspends/s is N over first write → last answer, pooled over rounds.
//! * **resume → response** and **resume → first model call**: all N
//!   `session/resume {sessionId, handle, input}` are written back to back (the
//!   input matches a script rule whose only step is one text step); each is
//!   timed to its answer (sent once the claim and the fresh turn's start are
//!   committed in one transaction) and to the first `agent_message_chunk` of
//!   the session's resumed turn. That chunk is the first observable sign of
//!   the model call: the scripted model emits the text the moment it is
//!   called (no `delay_ms`), but berth journals the chunk before sending it.
//!   An answer that is already complete leaves its chunk for the turn's next
//!   write, here the seal, so the chunk arrives with `turn_ended`: one durable
//!   commit, group-committed with other sessions'. Between the claim's commit
//!   and the model call nothing touches the disk, and the answer is sent at
//!   about the time the model is called, so the model call itself lies
//!   roughly between the two figures: "first model call" is an upper bound by
//!   about one commit plus delivery. The round ends when every resumed turn's
//!   `turn_ended` has been read.
//!
//! With N requests written at once, each latency includes waiting behind the
//! others (berth's per-session actors run in parallel, but they share one
//! journal writer and the machine's CPUs), so at N = 1000 the percentiles are
//! mostly queueing: compare them with N / throughput.
//!
//! For each count in `--suspend-parked-sessions` (default `1`) the same is
//! done for turns parked mid-way: each session is prompted with a turn whose
//! first step is a `shell` tool reading a per-session FIFO; on that turn's
//! `tool_call` notification the benchmark writes `session/suspend` (mode
//! `finish_step`), and on its `suspend_requested` notification (the request
//! is durable; the turn is quiescing) it opens and closes the FIFO's write
//! end, so the tool ends, the turn parks before its next model call, the
//! suspension commits and the suspend is answered. The figures are
//! **suspend → requested** (written → `suspend_requested` read), **tool done
//! → suspend ack** (the completed `tool_call_update` read → the suspend's
//! answer: the tool result's commit is already behind, the frame checkpoints
//! and the park are in it), and — resuming each parked turn from its frame
//! with input — **resume → response** and **resume → first model call** as
//! above (the resumed turn must be the parked one; a session whose suspend
//! found its turn already ended would be counted as missed and left out).
//!
//! berth's CPU time over the suspend and the resume phases (as in section 1,
//! from `/proc`) is printed per session per round. `--only-suspend` runs this
//! section alone; `--skip-suspend` skips it.
//!
//! # 5. Receipt signing
//!
//! In-process, no I/O: the CPU cost of signing one receipt with the keyring
//! (HMAC-SHA256 over the receipt's canonical JSON, `berth_storage::Keyring::sign`)
//! for a `control_outcome`, a `SuspensionReceipt` with resume conditions and a
//! `ResumptionReceipt` with a trigger match; of verifying a `control_outcome`;
//! and of the resume input hash (SHA-256 over the canonical JSON of a ~1 KiB
//! input). Each figure is `--sign-receipts` operations (default 100 000) in
//! batches of 1 000, after one unmeasured batch; the report gives µs per
//! operation: the mean, and the p50/p99 of the per-batch means. `--only-sign`
//! runs this section alone; `--sign-receipts 0` skips it.
//!
//! # 6. Durable step throughput
//!
//! Over stdio against the real binary (pipelined, as section 4). For each
//! concurrency level `c` in `--steps-sessions` (default `1,10,100`) a fresh
//! `berth serve` plays a script whose turn makes `--steps-tools` (default 10)
//! zero-latency `read_file` calls one after another — each its own model
//! response, so each call's outcome is journaled (a durable commit) before
//! the next model call — and then one text step. `c` sessions are created and
//! each runs one unmeasured turn; then each session prompts in a closed loop
//! (the next `session/prompt` is written as soon as the previous one is
//! answered) for `--steps-secs` seconds, and the turns still running then are
//! awaited. Steps/s is turns × tools over first prompt written → last answer
//! read (turns started after the window are never sent). The turn round trip
//! (prompt written → answer read) is reported as p50/p99. This is the same
//! closed loop the peer suite (`conformance/bench/`) drives against Temporal
//! (10 local activities per workflow) and Restate (10 `ctx.run` per handler).
//! `--only-steps` runs this section alone; `--skip-steps` skips it.
//!
//! The last line of output is a one-line JSON summary of everything printed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use berth_conformance::host::{
    berth_binary, cpu_ns, cpus, load_average, next_from_berth, spawn_berth, stderr_tail,
};
use berth_conformance::stats::LatencySummary;
use berth_conformance::wire::{classify_frame, Frame};
use berth_runtime::clock::{Clock, SystemClock};
use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::ids::SessionId;
use berth_storage::{Batch, Journal, JournalOptions};
use clap::{Parser, ValueEnum};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::mpsc;

/// How long to wait for any single frame from the child before giving up.
const FRAME_TIMEOUT: Duration = Duration::from_secs(30);

/// The small file the `read_file` step reads.
const SMALL_FILE: &str = "small.txt";

/// Measures berth's prompt round trip, inject delivery and suspend/resume over
/// stdio, and its durable append rate.
#[derive(Parser, Debug)]
#[command(name = "bench-core")]
struct Args {
    /// Seconds each journal run is measured (after a warm-up of a fifth of
    /// this, at most one second).
    #[arg(long, default_value_t = 3.0)]
    duration_secs: f64,
    /// Measured prompt round trips over stdio.
    #[arg(long, default_value_t = 500)]
    prompts: usize,
    /// Unmeasured prompts sent first.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// The tool call each scripted turn makes.
    #[arg(long, value_enum, default_value_t = ToolChoice::ReadFile)]
    tool: ToolChoice,
    /// Concurrency levels (sessions appending at once) for the journal runs.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    sessions: Vec<usize>,
    /// Skip the stdio prompt round-trip benchmark.
    #[arg(long)]
    skip_stdio: bool,
    /// Skip the in-process journal benchmark.
    #[arg(long)]
    skip_journal: bool,
    /// Steers measured by the inject→delivery benchmark (0 skips it).
    #[arg(long, default_value_t = 200)]
    injects: usize,
    /// Session counts (all on one connection) for the suspend/resume runs
    /// of idle sessions; each count is a fresh `berth serve`.
    #[arg(long, value_delimiter = ',', default_value = "1,1000")]
    suspend_sessions: Vec<usize>,
    /// Session counts for the suspend/resume runs of turns parked mid-way
    /// (suspended while a shell tool runs; the tool ends once the suspend
    /// request is durable).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    suspend_parked_sessions: Vec<usize>,
    /// Measured rounds per suspend/resume run, at least (see
    /// --suspend-min-samples).
    #[arg(long, default_value_t = 3)]
    suspend_rounds: usize,
    /// More rounds are run when fewer than this many samples per figure
    /// would come out: a run does max(rounds, ceil(min-samples / sessions)).
    #[arg(long, default_value_t = 200)]
    suspend_min_samples: usize,
    /// Unmeasured rounds before each suspend/resume run's measured ones.
    #[arg(long, default_value_t = 1)]
    suspend_warmup_rounds: usize,
    /// Skip the suspend/resume benchmark.
    #[arg(long)]
    skip_suspend: bool,
    /// Run only the suspend/resume benchmark (as --skip-stdio --skip-journal).
    /// With --only-steps, both run.
    #[arg(long)]
    only_suspend: bool,
    /// Receipts signed per figure of the signing benchmark (0 skips it).
    #[arg(long, default_value_t = 100_000)]
    sign_receipts: usize,
    /// Run only the receipt signing benchmark.
    #[arg(long)]
    only_sign: bool,
    /// Concurrency levels (sessions prompting at once, each in a closed
    /// loop) for the durable-step throughput runs; each level is a fresh
    /// `berth serve`.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    steps_sessions: Vec<usize>,
    /// Zero-latency tool calls (durable steps) per scripted turn in the
    /// step throughput runs.
    #[arg(long, default_value_t = 10)]
    steps_tools: usize,
    /// Seconds each step throughput level keeps sending prompts (after one
    /// unmeasured turn per session).
    #[arg(long, default_value_t = 5.0)]
    steps_secs: f64,
    /// Skip the durable-step throughput benchmark.
    #[arg(long)]
    skip_steps: bool,
    /// Run only the durable-step throughput benchmark. With --only-suspend,
    /// both run.
    #[arg(long)]
    only_steps: bool,
}

impl Args {
    fn only(&self) -> bool {
        self.only_suspend || self.only_steps || self.only_sign
    }

    fn runs_stdio(&self) -> bool {
        !self.skip_stdio && !self.only()
    }

    fn runs_sign(&self) -> bool {
        self.sign_receipts > 0 && (!self.only() || self.only_sign)
    }

    fn runs_inject(&self) -> bool {
        self.runs_stdio() && self.injects > 0
    }

    fn runs_journal(&self) -> bool {
        !self.skip_journal && !self.only()
    }

    fn runs_steps(&self) -> bool {
        !self.skip_steps
            && (!self.only() || self.only_steps)
            && self.steps_sessions.iter().any(|&n| n > 0)
    }

    fn runs_suspend(&self) -> bool {
        !self.skip_suspend
            && (!self.only() || self.only_suspend)
            && (self.suspend_sessions.iter().any(|&n| n > 0)
                || self.suspend_parked_sessions.iter().any(|&n| n > 0))
    }
}

/// Which tool the scripted turn calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ToolChoice {
    /// `read_file` of a 6-byte file in the session's cwd.
    ReadFile,
    /// `shell` running `true` (spawns a process group).
    Shell,
    /// No tool call: the turn is a single text step.
    None,
}

impl ToolChoice {
    fn label(self) -> &'static str {
        match self {
            ToolChoice::ReadFile => "read_file",
            ToolChoice::Shell => "shell",
            ToolChoice::None => "none",
        }
    }

    /// The script's one rule.
    fn script(self) -> String {
        let tool_step = match self {
            ToolChoice::ReadFile => format!(
                "  {{ tool_call = {{ name = \"read_file\", arguments = {{ path = \"{{cwd}}/{SMALL_FILE}\" }} }} }},\n"
            ),
            ToolChoice::Shell => {
                "  { tool_call = { name = \"shell\", arguments = { command = \"true\" } } },\n".into()
            }
            ToolChoice::None => String::new(),
        };
        format!(
            "# Written by bench-core: one zero-latency tool call, then text.\n\
             [[rules]]\n\
             match = \"bench\"\n\
             steps = [\n{tool_step}  {{ text = \"done\" }},\n]\n"
        )
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-core: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<()> {
    let bin = if args.runs_stdio() || args.runs_suspend() || args.runs_steps() {
        Some(berth_binary("--skip-stdio --skip-suspend --skip-steps")?)
    } else {
        None
    };
    let load_before = load_average();
    if let Some(load) = &load_before {
        println!("load average      {load} (before; {} CPUs)\n", cpus());
    }
    if !(args.duration_secs > 0.0 && args.duration_secs.is_finite()) {
        bail!("--duration-secs must be a positive number of seconds");
    }
    if args.prompts == 0 && args.runs_stdio() {
        bail!("--prompts must be at least 1 (or pass --skip-stdio)");
    }
    let stdio = match (&bin, args.runs_stdio()) {
        (Some(bin), true) => {
            let report = stdio_bench(args, bin.clone()).await?;
            report.print();
            Some(report)
        }
        _ => None,
    };
    let inject = match (&bin, args.runs_inject()) {
        (Some(bin), true) => {
            let summary = inject_bench(args, bin.clone()).await?;
            println!(
                "== inject -> delivery over stdio ==\nsteers            {} (mode steer, a turn running zero-latency read_file calls)\n   p50 µs    p90 µs    p99 µs    max µs\n{:>9} {:>9} {:>9} {:>9}\n",
                args.injects, summary.p50_us, summary.p90_us, summary.p99_us, summary.max_us
            );
            Some(summary)
        }
        _ => None,
    };
    let suspend = match (&bin, args.runs_suspend()) {
        (Some(bin), true) => suspend_bench(args, bin).await?,
        _ => Vec::new(),
    };
    let steps = match (&bin, args.runs_steps()) {
        (Some(bin), true) => steps_bench(args, bin).await?,
        _ => Vec::new(),
    };
    let journal = if args.runs_journal() {
        journal_bench(args).await?
    } else {
        Vec::new()
    };
    let signing = if args.runs_sign() {
        sign_bench(args.sign_receipts)?
    } else {
        Vec::new()
    };
    let load_after = load_average();
    if let Some(load) = &load_after {
        println!("load average      {load} (after)");
    }
    let summary = json!({
        "bench": "bench-core",
        "cpus": cpus(),
        "load_before": load_before,
        "load_after": load_after,
        "stdio": stdio.as_ref().map(StdioReport::to_json),
        "inject_to_delivery_us": inject.as_ref().map(|s| json!({
            "p50": s.p50_us, "p90": s.p90_us, "p99": s.p99_us, "max": s.max_us, "samples": args.injects,
        })),
        "suspend": suspend.iter().map(SuspendReport::to_json).collect::<Vec<_>>(),
        "steps": steps.iter().map(StepsRow::to_json).collect::<Vec<_>>(),
        "journal": journal.iter().map(JournalRow::to_json).collect::<Vec<_>>(),
        "signing_us_per_op": signing.iter().map(SignRow::to_json).collect::<Vec<_>>(),
    });
    println!("{summary}");
    Ok(())
}

// ---------------------------------------------------------------------------
// 1. Prompt round trip over stdio
// ---------------------------------------------------------------------------

/// Notifications seen on the connection, tallied by journaled event.
#[derive(Debug, Default)]
struct EventTally {
    /// Highest `_meta.berth.eventId` seen.
    max_event_id: u64,
    /// Notification frames that carried an event id.
    frames: u64,
    /// Frames by type (`sessionUpdate` value, or the agent event's `type`).
    by_type: BTreeMap<String, u64>,
    /// The turn id of the latest `turn_ended` seen.
    last_turn_ended: Option<String>,
}

impl EventTally {
    fn observe(&mut self, frame: &Value) {
        let params = &frame["params"];
        let Some(event_id) = params["_meta"]["berth"]["eventId"].as_u64() else {
            return;
        };
        self.frames += 1;
        self.max_event_id = self.max_event_id.max(event_id);
        let kind = match frame["method"].as_str() {
            Some("session/update") => params["update"]["sessionUpdate"].as_str(),
            _ => params["type"].as_str(),
        }
        .unwrap_or("?")
        .to_owned();
        if kind == "turn_ended" {
            self.last_turn_ended = params["event"]["turn_id"].as_str().map(str::to_owned);
        }
        *self.by_type.entry(kind).or_default() += 1;
    }
}

/// A `berth serve` child spoken to over ACP on its stdio.
struct AcpChild {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr_path: PathBuf,
    next_id: u64,
    tally: EventTally,
}

impl AcpChild {
    fn spawn(
        bin: &Path,
        data_dir: &Path,
        script: &Path,
        stderr_path: &Path,
        extra_args: &[&std::ffi::OsStr],
    ) -> anyhow::Result<Self> {
        let (child, stdin, stdout) = spawn_berth(bin, data_dir, script, stderr_path, extra_args)?;
        Ok(Self {
            child,
            stdin: Some(stdin),
            stdout: BufReader::with_capacity(1 << 16, stdout).lines(),
            stderr_path: stderr_path.to_owned(),
            next_id: 1,
            tally: EventTally::default(),
        })
    }

    /// The last lines the child wrote to stderr, for error messages.
    fn stderr_tail(&self) -> String {
        stderr_tail(&self.stderr_path)
    }

    /// The next frame from the child.
    async fn recv(&mut self, timeout: Duration) -> anyhow::Result<Value> {
        let line = match tokio::time::timeout(timeout, self.stdout.next_line()).await {
            Err(_) => bail!(
                "berth sent nothing for {} s\n{}",
                timeout.as_secs(),
                self.stderr_tail()
            ),
            Ok(Err(e)) => bail!("cannot read berth's stdout: {e}\n{}", self.stderr_tail()),
            Ok(Ok(None)) => bail!("berth closed its stdout (exited?)\n{}", self.stderr_tail()),
            Ok(Ok(Some(line))) => line,
        };
        serde_json::from_str(&line).with_context(|| format!("berth sent a non-JSON line: {line}"))
    }

    /// Sends a request and reads frames until its response, tallying the
    /// notifications in between. Returns the `result`.
    async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        line.push('\n');
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        let written = match stdin.write_all(line.as_bytes()).await {
            Ok(()) => stdin.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            bail!("cannot write to berth's stdin: {e}\n{}", self.stderr_tail());
        }
        loop {
            let frame = self.recv(FRAME_TIMEOUT).await?;
            if frame.get("method").is_some() {
                if frame.get("id").is_some() {
                    bail!("berth sent a request the benchmark cannot answer: {frame}");
                }
                self.tally.observe(&frame);
                continue;
            }
            if frame["id"].as_u64() != Some(id) {
                bail!("unexpected response (waiting for id {id}): {frame}");
            }
            if let Some(error) = frame.get("error") {
                bail!("{method} failed: {error}");
            }
            return Ok(frame.get("result").cloned().unwrap_or(Value::Null));
        }
    }

    /// Sends a request without waiting for its answer; returns its id.
    async fn send(&mut self, method: &str, params: Value) -> anyhow::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        line.push('\n');
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        stdin.write_all(line.as_bytes()).await?;
        stdin.flush().await?;
        Ok(id)
    }

    /// Reads notifications until the `turn_ended` of `turn_id` has been seen
    /// (it may trail the prompt's response).
    async fn drain_until_turn_ended(&mut self, turn_id: &str) -> anyhow::Result<()> {
        while self.tally.last_turn_ended.as_deref() != Some(turn_id) {
            let frame = self
                .recv(Duration::from_secs(5))
                .await
                .with_context(|| format!("waiting for turn_ended of {turn_id}"))?;
            if frame.get("method").is_some() {
                self.tally.observe(&frame);
            }
        }
        Ok(())
    }

    /// Closes stdin and waits for the child to exit (kills it after 10 s).
    async fn shutdown(mut self) -> anyhow::Result<()> {
        drop(self.stdin.take());
        match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    eprintln!("note: berth exited with {status}\n{}", self.stderr_tail());
                }
            }
            Err(_) => {
                eprintln!("note: berth did not exit 10 s after stdin closed; killing it");
                self.child.kill().await?;
            }
        }
        Ok(())
    }
}

/// The stdio benchmark's figures.
#[derive(Debug)]
struct StdioReport {
    binary: PathBuf,
    tool: ToolChoice,
    warmup: usize,
    startup_us: u64,
    session_new_us: u64,
    latency: LatencySummary,
    prompts_per_sec: f64,
    tenth_means_us: Vec<f64>,
    tenth_cpu_us: Option<Vec<f64>>,
    cpu_per_turn_us: Option<f64>,
    events_per_turn: f64,
    frames_per_turn: f64,
    types_per_turn: BTreeMap<String, f64>,
    /// Messages and JSON bytes of the session's transcript after the run.
    transcript: Option<(usize, usize)>,
}

fn mean_us(samples: &[Duration]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.iter().sum::<Duration>().as_secs_f64() * 1e6 / samples.len() as f64
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

async fn stdio_bench(args: &Args, bin: PathBuf) -> anyhow::Result<StdioReport> {
    let dir = tempfile::Builder::new()
        .prefix("berth-bench-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let data_dir = dir.path().join("data");
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd)?;
    std::fs::write(cwd.join(SMALL_FILE), "hello\n")?;
    let script = dir.path().join("bench-script.toml");
    std::fs::write(&script, args.tool.script())?;

    let started = Instant::now();
    let mut acp = AcpChild::spawn(
        &bin,
        &data_dir,
        &script,
        &dir.path().join("berth.stderr"),
        &[],
    )?;
    acp.request(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
    .await
    .context("initialize")?;
    let startup = started.elapsed();
    let t0 = Instant::now();
    let new = acp
        .request("session/new", json!({"cwd": cwd, "mcpServers": []}))
        .await
        .context("session/new")?;
    let session_new = t0.elapsed();
    let session_id = new["sessionId"]
        .as_str()
        .ok_or_else(|| anyhow!("session/new answered without a sessionId: {new}"))?
        .to_owned();
    let prompt = json!({
        "sessionId": session_id,
        "prompt": [{"type": "text", "text": "bench: read the small file"}],
    });

    let mut last_turn = String::new();
    for _ in 0..args.warmup {
        last_turn = prompt_once(&mut acp, &prompt)
            .await
            .context("warm-up prompt")?
            .1;
    }
    if args.warmup > 0 {
        acp.drain_until_turn_ended(&last_turn).await?;
    }
    let before_events = acp.tally.max_event_id;
    let before_frames = acp.tally.frames;
    let before_types = acp.tally.by_type.clone();

    let mut samples = Vec::with_capacity(args.prompts);
    let chunk = args.prompts.div_ceil(10);
    let pid = acp.child.id();
    let mut cpu_marks = vec![pid.and_then(cpu_ns)];
    let measured = Instant::now();
    for i in 0..args.prompts {
        let (elapsed, turn) = prompt_once(&mut acp, &prompt)
            .await
            .context("measured prompt")?;
        samples.push(elapsed);
        last_turn = turn;
        if (i + 1) % chunk == 0 || i + 1 == args.prompts {
            cpu_marks.push(pid.and_then(cpu_ns));
        }
    }
    let wall = measured.elapsed();
    acp.drain_until_turn_ended(&last_turn).await?;

    let n = samples.len();
    let nf = n as f64;
    let tally = &acp.tally;
    let types_per_turn = tally
        .by_type
        .iter()
        .map(|(k, &v)| {
            let before = before_types.get(k).copied().unwrap_or(0);
            (k.clone(), (v - before) as f64 / nf)
        })
        .collect();
    let events_per_turn = (tally.max_event_id - before_events) as f64 / nf;
    let frames_per_turn = (tally.frames - before_frames) as f64 / nf;
    let tenth_means_us = samples.chunks(chunk).map(mean_us).collect();
    // berth's CPU time per turn, by tenth (µs), when /proc reports it.
    let tenth_cpu_us: Option<Vec<f64>> = cpu_marks
        .windows(2)
        .zip(samples.chunks(chunk))
        .map(|(w, c)| Some((w[1]? - w[0]?) as f64 / 1e3 / c.len() as f64))
        .collect();
    let cpu_per_turn_us = match (cpu_marks.first(), cpu_marks.last()) {
        (Some(Some(a)), Some(Some(b))) => Some((b - a) as f64 / 1e3 / nf),
        _ => None,
    };
    let latency = LatencySummary::from_samples(&mut samples)
        .ok_or_else(|| anyhow!("no prompt was measured"))?;
    acp.shutdown().await?;
    // The child is gone: read the session's final transcript from its journal.
    let transcript = tokio::task::spawn_blocking(move || transcript_size(&data_dir, &session_id))
        .await
        .ok()
        .flatten();
    Ok(StdioReport {
        binary: bin,
        tool: args.tool,
        warmup: args.warmup,
        startup_us: us(startup),
        session_new_us: us(session_new),
        latency,
        prompts_per_sec: nf / wall.as_secs_f64(),
        tenth_means_us,
        tenth_cpu_us,
        cpu_per_turn_us,
        events_per_turn,
        frames_per_turn,
        types_per_turn,
        transcript,
    })
}

/// The session's transcript in the journal under `data_dir` (messages, JSON
/// bytes); `None` when it cannot be read (the journal is still locked, say).
fn transcript_size(data_dir: &Path, session_id: &str) -> Option<(usize, usize)> {
    let journal = Journal::open(&data_dir.join("journal.redb"), JournalOptions::default()).ok()?;
    let messages = journal.transcript(&SessionId(session_id.to_owned())).ok()?;
    let bytes = serde_json::to_vec(&messages).ok()?.len();
    Some((messages.len(), bytes))
}

/// One timed `session/prompt` round trip; returns its latency and turn id.
async fn prompt_once(acp: &mut AcpChild, prompt: &Value) -> anyhow::Result<(Duration, String)> {
    let t0 = Instant::now();
    let result = acp.request("session/prompt", prompt.clone()).await?;
    let elapsed = t0.elapsed();
    if result["stopReason"] != "end_turn" {
        bail!("a benchmark turn did not end with end_turn: {result}");
    }
    let turn = result["_meta"]["berth"]["turnId"]
        .as_str()
        .ok_or_else(|| anyhow!("prompt answer has no _meta.berth.turnId: {result}"))?;
    Ok((elapsed, turn.to_owned()))
}

impl StdioReport {
    fn print(&self) {
        let l = &self.latency;
        println!("== prompt round trip over stdio ==");
        println!("binary            {}", self.binary.display());
        println!(
            "turn              tool call: {} + one text step (scripted model), one session",
            self.tool.label()
        );
        println!(
            "prompts           {} measured after {} warm-up",
            l.count, self.warmup
        );
        println!(
            "startup           {} µs to initialize answer, session/new {} µs",
            self.startup_us, self.session_new_us
        );
        println!();
        println!(
            "{:>9} {:>9} {:>9} {:>9} {:>9} {:>11}",
            "p50 µs", "p90 µs", "p99 µs", "max µs", "mean µs", "prompts/s"
        );
        println!(
            "{:>9} {:>9} {:>9} {:>9} {:>9.0} {:>11.1}",
            l.p50_us, l.p90_us, l.p99_us, l.max_us, l.mean_us, self.prompts_per_sec
        );
        println!();
        let tenths: Vec<String> = self
            .tenth_means_us
            .iter()
            .map(|m| format!("{m:.0}"))
            .collect();
        println!("mean µs by tenth  {}", tenths.join(" "));
        if let (Some(total), Some(tenths)) = (self.cpu_per_turn_us, &self.tenth_cpu_us) {
            let tenths: Vec<String> = tenths.iter().map(|m| format!("{m:.0}")).collect();
            println!(
                "berth CPU µs/turn {total:.0} (all threads; by tenth: {})",
                tenths.join(" ")
            );
        }
        let breakdown: Vec<String> = self
            .types_per_turn
            .iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect();
        println!(
            "journal events    {:.2} per turn (each a durable commit), {:.2} notification frames",
            self.events_per_turn, self.frames_per_turn
        );
        println!("  by type         {}", breakdown.join(", "));
        if let Some((messages, bytes)) = self.transcript {
            println!(
                "transcript        {messages} messages, {} KiB of JSON at the end of the run",
                bytes / 1024
            );
        }
        println!();
    }

    fn to_json(&self) -> Value {
        let l = &self.latency;
        json!({
            "tool": self.tool.label(),
            "prompts": l.count,
            "warmup": self.warmup,
            "p50_us": l.p50_us,
            "p90_us": l.p90_us,
            "p99_us": l.p99_us,
            "max_us": l.max_us,
            "mean_us": round1(l.mean_us),
            "prompts_per_sec": round1(self.prompts_per_sec),
            "berth_cpu_us_per_turn": self.cpu_per_turn_us.map(round1),
            "tenth_cpu_us": self.tenth_cpu_us.as_ref().map(|v| v.iter().map(|&m| m.round()).collect::<Vec<_>>()),
            "transcript_messages": self.transcript.map(|t| t.0),
            "transcript_bytes": self.transcript.map(|t| t.1),
            "tenth_means_us": self.tenth_means_us.iter().map(|&m| m.round()).collect::<Vec<_>>(),
            "events_per_turn": round2(self.events_per_turn),
            "frames_per_turn": round2(self.frames_per_turn),
            "startup_us": self.startup_us,
            "session_new_us": self.session_new_us,
        })
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

// ---------------------------------------------------------------------------
// 2. Durable appends with concurrent sessions
// ---------------------------------------------------------------------------

/// One journal run's figures.
#[derive(Debug)]
struct JournalRow {
    quick_repair: bool,
    sessions: usize,
    appends: usize,
    appends_per_sec: f64,
    latency: LatencySummary,
    file_bytes: u64,
    tail_mismatches: usize,
}

impl JournalRow {
    fn to_json(&self) -> Value {
        let l = &self.latency;
        json!({
            "quick_repair": self.quick_repair,
            "sessions": self.sessions,
            "appends": self.appends,
            "appends_per_sec": round1(self.appends_per_sec),
            "p50_us": l.p50_us,
            "p90_us": l.p90_us,
            "p99_us": l.p99_us,
            "max_us": l.max_us,
            "mean_us": round1(l.mean_us),
            "file_bytes": self.file_bytes,
        })
    }
}

/// What one appending task reports.
struct TaskResult {
    session: SessionId,
    /// Appends acknowledged in total (warm-up included).
    acknowledged: u64,
    /// Latencies of the appends started inside the measured window.
    samples: Vec<Duration>,
    /// When the task's last measured append was acknowledged.
    last_done: Option<Instant>,
}

async fn journal_bench(args: &Args) -> anyhow::Result<Vec<JournalRow>> {
    let measure = Duration::from_secs_f64(args.duration_secs);
    let warmup = (measure / 5).min(Duration::from_secs(1));
    let dir = tempfile::Builder::new()
        .prefix("berth-bench-journal-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    println!("== durable appends (group commit), in-process berth_storage::Journal ==");
    println!("each session appends one ~120-byte event at a time and awaits its durable commit;");
    println!(
        "{:.1} s measured after {:.1} s warm-up per row, fresh journal file per row, dir {}",
        measure.as_secs_f64(),
        warmup.as_secs_f64(),
        dir.path().display()
    );
    println!();
    println!(
        "{:>12} {:>8} {:>9} {:>11} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "quick_repair",
        "sessions",
        "appends",
        "appends/s",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "max µs",
        "file KiB"
    );
    let mut rows = Vec::new();
    for quick_repair in [false, true] {
        for &sessions in &args.sessions {
            if sessions == 0 {
                continue;
            }
            let row = journal_run(dir.path(), quick_repair, sessions, warmup, measure).await?;
            let l = &row.latency;
            println!(
                "{:>12} {:>8} {:>9} {:>11.0} {:>8} {:>8} {:>8} {:>8} {:>8}",
                if quick_repair { "on" } else { "off" },
                row.sessions,
                row.appends,
                row.appends_per_sec,
                l.p50_us,
                l.p90_us,
                l.p99_us,
                l.max_us,
                row.file_bytes / 1024
            );
            if row.tail_mismatches > 0 {
                println!(
                    "  warning: {} session(s) whose journal tail differs from the appends acknowledged",
                    row.tail_mismatches
                );
            }
            rows.push(row);
        }
    }
    println!();
    Ok(rows)
}

async fn journal_run(
    dir: &Path,
    quick_repair: bool,
    sessions: usize,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<JournalRow> {
    let path = dir.join(format!(
        "journal-qr{}-s{sessions}.redb",
        if quick_repair { "on" } else { "off" }
    ));
    let journal = Journal::open(
        &path,
        JournalOptions {
            quick_repair,
            ..JournalOptions::default()
        },
    )
    .with_context(|| format!("cannot open a journal at {}", path.display()))?;
    let record = Arc::new(EventRecord::new(
        SystemClock.now(),
        SessionEvent::AgentMessageChunk {
            text: "a small benchmark event: forty-odd bytes of text".into(),
        },
    ));
    let measure_start = Instant::now() + warmup;
    let deadline = measure_start + measure;
    let mut tasks = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let journal = journal.clone();
        let record = Arc::clone(&record);
        let session = SessionId(format!("sess_bench_{i:04}"));
        tasks.push(tokio::spawn(async move {
            let mut result = TaskResult {
                session,
                acknowledged: 0,
                samples: Vec::new(),
                last_done: None,
            };
            loop {
                let t0 = Instant::now();
                if t0 >= deadline {
                    break;
                }
                journal
                    .commit(Batch::new().append(&result.session, &record))
                    .await?;
                let t1 = Instant::now();
                result.acknowledged += 1;
                if t0 >= measure_start {
                    result.samples.push(t1 - t0);
                    result.last_done = Some(t1);
                }
            }
            Ok::<_, berth_storage::StorageError>(result)
        }));
    }
    let mut samples = Vec::new();
    let mut window_end = measure_start;
    let mut tail_mismatches = 0;
    for task in tasks {
        let result = task.await.context("an appending task panicked")??;
        if journal.last_event_id(&result.session)? != result.acknowledged {
            tail_mismatches += 1;
        }
        if let Some(done) = result.last_done {
            window_end = window_end.max(done);
        }
        samples.extend(result.samples);
    }
    let appends = samples.len();
    let window = window_end.saturating_duration_since(measure_start);
    let latency = LatencySummary::from_samples(&mut samples)
        .ok_or_else(|| anyhow!("no append completed in the measured window"))?;
    // Dropping the last clone joins the writer thread: do it off the runtime.
    tokio::task::spawn_blocking(move || drop(journal)).await?;
    let file_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    Ok(JournalRow {
        quick_repair,
        sessions,
        appends,
        appends_per_sec: appends as f64 / window.as_secs_f64(),
        latency,
        file_bytes,
        tail_mismatches,
    })
}

// ---------------------------------------------------------------------------
// 3. Inject -> delivery latency
// ---------------------------------------------------------------------------

/// Time from sending `session/inject` (mode `steer`) to receiving its delivery
/// echo (the `user_message_chunk` with its `messageId`): how long a steer waits
/// for the next seam. The running turn makes zero-latency `read_file` calls,
/// so a seam comes after each one; each steer matches the same script rule,
/// so the turn keeps going.
async fn inject_bench(args: &Args, bin: PathBuf) -> anyhow::Result<LatencySummary> {
    let dir = tempfile::tempdir()?;
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work)?;
    std::fs::write(work.join("data.txt"), "hello\n")?;
    let calls =
        r#"{ tool_call = { name = "read_file", arguments = { path = "{cwd}/data.txt" } } },"#
            .repeat(500);
    let script = dir.path().join("inject.toml");
    std::fs::write(
        &script,
        format!("[[rules]]\nmatch = \"keep reading\"\nsteps = [ {calls} {{ text = \"done\" }} ]\n"),
    )?;
    let config = dir.path().join("berth.toml");
    std::fs::write(&config, "max_model_calls = 1000000\n")?;
    let data_dir = dir.path().join("data");
    let mut acp = AcpChild::spawn(
        &bin,
        &data_dir,
        &script,
        &dir.path().join("berth.stderr"),
        &["--config".as_ref(), config.as_os_str()],
    )?;
    acp.request("initialize", json!({"protocolVersion": 1}))
        .await?;
    let new = acp
        .request("session/new", json!({"cwd": work, "mcpServers": []}))
        .await?;
    let session_id = new["sessionId"]
        .as_str()
        .context("session/new gave no sessionId")?
        .to_owned();
    // The prompt's answer comes only after the cancel at the end; frames are
    // read by hand from here on.
    let prompt_id = acp
        .send(
            "session/prompt",
            json!({"sessionId": session_id, "prompt": [{"type": "text", "text": "keep reading"}]}),
        )
        .await?;
    // Injects need a running turn: wait for its first tool call.
    while acp.recv(FRAME_TIMEOUT).await?["params"]["update"]["sessionUpdate"] != "tool_call" {}
    let mut samples = Vec::with_capacity(args.injects);
    for k in 0..args.injects {
        let started = Instant::now();
        let inject_id = acp
            .send("session/inject", json!({"sessionId": session_id, "mode": "steer", "content": format!("keep reading ({k})")}))
            .await?;
        let mut message_id = None;
        loop {
            let frame = acp.recv(FRAME_TIMEOUT).await?;
            if frame["id"].as_u64() == Some(inject_id) {
                message_id = Some(
                    frame["result"]["messageId"]
                        .as_str()
                        .with_context(|| format!("inject failed: {frame}"))?
                        .to_owned(),
                );
                continue;
            }
            let update = &frame["params"]["update"];
            if message_id.is_some()
                && update["sessionUpdate"] == "user_message_chunk"
                && update["messageId"].as_str() == message_id.as_deref()
            {
                samples.push(started.elapsed());
                break;
            }
        }
    }
    let cancel_id = acp
        .send("session/cancel", json!({"sessionId": session_id}))
        .await?;
    let mut answered = 0;
    while answered < 2 {
        let frame = acp.recv(FRAME_TIMEOUT).await?;
        if frame["id"].as_u64() == Some(cancel_id) || frame["id"].as_u64() == Some(prompt_id) {
            answered += 1;
        }
    }
    acp.shutdown().await?;
    LatencySummary::from_samples(&mut samples).context("no steer was measured")
}

// ---------------------------------------------------------------------------
// 4. Suspend -> durable ack, resume -> first model call
// ---------------------------------------------------------------------------

/// What the resume input contains: the scripted rule answering it is one
/// zero-latency text step.
const RESUME_MATCH: &str = "bench-resume";
/// What a parked-turn round's prompt contains: a shell tool, then text.
const PARK_MATCH: &str = "bench-park";

/// The suspension section's script: resumed turns answer with one text step
/// (the model's first and only output); a parked-turn prompt (`bench-park-…`,
/// file-name safe) first runs a shell tool that reads the FIFO named after
/// the prompt until the benchmark opens and closes its write end.
fn suspend_script() -> String {
    format!(
        "# Written by bench-core (suspend/resume).\n\
         [[rules]]\n\
         match = \"{RESUME_MATCH}\"\n\
         steps = [ {{ text = \"resumed\" }} ]\n\n\
         [[rules]]\n\
         match = \"{PARK_MATCH}\"\n\
         steps = [\n  {{ tool_call = {{ name = \"shell\", arguments = {{ command = \"cat '{{cwd}}/{{input}}.fifo' > /dev/null\", timeout_ms = 60000 }} }} }},\n  {{ text = \"done\" }},\n]\n"
    )
}

/// A `berth serve` child whose stdout is read by its own task, which stamps
/// each line with the instant it was read (before parsing), so requests can
/// be pipelined and every response and notification timed on arrival.
struct AcpPipe {
    child: Child,
    stdin: Option<ChildStdin>,
    frames: mpsc::UnboundedReceiver<(Instant, String)>,
    stderr_path: PathBuf,
    next_id: u64,
}

impl AcpPipe {
    fn spawn(
        bin: &Path,
        data_dir: &Path,
        script: &Path,
        stderr_path: &Path,
        extra_args: &[&std::ffi::OsStr],
    ) -> anyhow::Result<Self> {
        let (child, stdin, stdout) = spawn_berth(bin, data_dir, script, stderr_path, extra_args)?;
        let (tx, frames) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::with_capacity(1 << 16, stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            stdin: Some(stdin),
            frames,
            stderr_path: stderr_path.to_owned(),
            next_id: 1,
        })
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

    /// Writes one line; returns the instant just before the write.
    async fn write(&mut self, line: &str) -> anyhow::Result<Instant> {
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        let at = Instant::now();
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

    /// The next frame and when it was read.
    async fn recv(&mut self) -> anyhow::Result<(Instant, Value)> {
        let (at, line) =
            next_from_berth(&mut self.frames, FRAME_TIMEOUT, &self.stderr_path).await?;
        let frame = serde_json::from_str(&line)
            .with_context(|| format!("berth sent a non-JSON line: {line}"))?;
        Ok((at, frame))
    }

    /// One request, answered before anything else is sent; notifications in
    /// between are dropped.
    async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let (id, line) = self.request_line(method, params);
        self.write(&line).await?;
        loop {
            let (_, frame) = self.recv().await?;
            if let Frame::Response(got, result) = classify_frame(&frame)? {
                if got != id {
                    bail!("unexpected response (waiting for id {id}): {frame}");
                }
                return result.cloned().map_err(|e| anyhow!("{method} failed: {e}"));
            }
        }
    }

    /// Closes stdin and waits for the child to exit (kills it after 10 s).
    async fn shutdown(mut self) -> anyhow::Result<()> {
        drop(self.stdin.take());
        match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    eprintln!(
                        "note: berth exited with {status}\n{}",
                        stderr_tail(&self.stderr_path)
                    );
                }
            }
            Err(_) => {
                eprintln!("note: berth did not exit 10 s after stdin closed; killing it");
                self.child.kill().await?;
            }
        }
        Ok(())
    }
}

/// Whether a suspend/resume run parks idle sessions or turns mid-way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ParkKind {
    /// Sessions with no turn running: suspended at once.
    Idle,
    /// A turn suspended (`finish_step`) while its shell tool runs.
    MidTurn,
}

impl ParkKind {
    fn label(self) -> &'static str {
        match self {
            ParkKind::Idle => "idle",
            ParkKind::MidTurn => "mid_turn",
        }
    }
}

/// Samples pooled over a run's measured rounds.
#[derive(Debug, Default)]
struct SuspendSamples {
    /// Idle: `session/suspend` written → its answer (the suspension is
    /// durable). Mid-turn: `session/suspend` written → the
    /// `suspend_requested` notification (the request is durable; the turn
    /// is quiescing).
    suspend_ack: Vec<Duration>,
    /// Mid-turn only: the tool's completed `tool_call_update` read → the
    /// suspend's answer (the turn parked and the suspension durable).
    tool_done_to_ack: Vec<Duration>,
    /// `session/resume` written → its answer.
    resume_response: Vec<Duration>,
    /// `session/resume` written → the resumed turn's first
    /// `agent_message_chunk`.
    resume_first_call: Vec<Duration>,
    /// `session/resume` written → the session's `resumed` notification (the
    /// claim and the fresh turn's start are durable; the unit is running).
    resume_resumed: Vec<Duration>,
    /// `session/resume` written → the resumed turn's `turn_ended` (its one
    /// text step journaled: the result is durable).
    resume_ended: Vec<Duration>,
    /// Per round: first suspend written → last suspend answered.
    suspend_walls: Vec<Duration>,
    /// Per round: first resume written → last resume answered.
    resume_walls: Vec<Duration>,
    /// berth's CPU time (all threads, ns) spent in the suspend phases and in
    /// the resume phases (the resumed turns included), summed over rounds;
    /// `None` where /proc does not report it.
    suspend_cpu_ns: Option<u64>,
    resume_cpu_ns: Option<u64>,
    /// Mid-turn sessions whose suspend did not catch the turn (it had ended:
    /// the suspension was idle); their samples are left out.
    missed: usize,
}

/// One suspend/resume run's figures.
#[derive(Debug)]
struct SuspendReport {
    kind: ParkKind,
    sessions: usize,
    rounds: usize,
    warmup_rounds: usize,
    max_in_flight: usize,
    /// All `session/new` pipelined at once: first written → last answered.
    sessions_created_in: Duration,
    suspend_ack: LatencySummary,
    tool_done_to_ack: Option<LatencySummary>,
    resume_response: LatencySummary,
    resume_first_call: LatencySummary,
    resume_resumed: LatencySummary,
    resume_ended: LatencySummary,
    suspends_per_sec: f64,
    resumes_per_sec: f64,
    /// berth CPU µs per session per round: suspend phase, resume phase.
    cpu_us: Option<(f64, f64)>,
    missed: usize,
}

impl SuspendReport {
    fn to_json(&self) -> Value {
        let figures = |l: &LatencySummary| {
            json!({
                "samples": l.count, "p50_us": l.p50_us, "p90_us": l.p90_us,
                "p99_us": l.p99_us, "max_us": l.max_us, "mean_us": round1(l.mean_us),
            })
        };
        json!({
            "kind": self.kind.label(),
            "sessions": self.sessions,
            "rounds": self.rounds,
            "warmup_rounds": self.warmup_rounds,
            "max_in_flight": self.max_in_flight,
            "sessions_created_ms": round1(self.sessions_created_in.as_secs_f64() * 1e3),
            // Idle: to the suspend's answer; mid-turn: to `suspend_requested`.
            "suspend_to_durable": figures(&self.suspend_ack),
            "tool_done_to_ack": self.tool_done_to_ack.as_ref().map(figures),
            "resume_to_response": figures(&self.resume_response),
            "resume_to_first_model_call": figures(&self.resume_first_call),
            "resume_to_resumed_notification": figures(&self.resume_resumed),
            "resume_to_turn_ended": figures(&self.resume_ended),
            // Mid-turn, the suspends' span is set by when the turns reach
            // their tool call: no rate.
            "suspends_per_sec": (self.kind == ParkKind::Idle).then(|| round1(self.suspends_per_sec)),
            "resumes_per_sec": round1(self.resumes_per_sec),
            "berth_cpu_us_per_suspend": self.cpu_us.map(|c| round1(c.0)),
            "berth_cpu_us_per_resume": self.cpu_us.map(|c| round1(c.1)),
            "missed": self.missed,
        })
    }

    fn print(&self) {
        match self.kind {
            ParkKind::Idle => println!(
                "-- {} idle session(s): all suspended at once, then all resumed at once with input --",
                self.sessions
            ),
            ParkKind::MidTurn => println!(
                "-- {} turn(s) parked mid-way: suspend (finish_step) sent on each turn's tool_call; the tool ends when the request is durable --",
                self.sessions
            ),
        }
        println!(
            "rounds            {} measured after {} warm-up; --max-in-flight {}; {} session/new (pipelined) in {:.1} ms",
            self.rounds,
            self.warmup_rounds,
            self.max_in_flight,
            self.sessions,
            self.sessions_created_in.as_secs_f64() * 1e3
        );
        println!(
            "{:<34} {:>8} {:>9} {:>9} {:>9} {:>9}",
            "", "samples", "p50 µs", "p90 µs", "p99 µs", "max µs"
        );
        let row = |label: &str, l: &LatencySummary| {
            println!(
                "{label:<34} {:>8} {:>9} {:>9} {:>9} {:>9}",
                l.count, l.p50_us, l.p90_us, l.p99_us, l.max_us
            );
        };
        match self.kind {
            ParkKind::Idle => row("suspend -> durable ack", &self.suspend_ack),
            ParkKind::MidTurn => {
                row("suspend -> requested (durable)", &self.suspend_ack);
                if let Some(l) = &self.tool_done_to_ack {
                    row("tool done -> suspend ack", l);
                }
            }
        }
        row("resume -> response", &self.resume_response);
        row("resume -> resumed (running)", &self.resume_resumed);
        row("resume -> first model call", &self.resume_first_call);
        row("resume -> turn ended", &self.resume_ended);
        match self.kind {
            ParkKind::Idle => println!(
                "throughput        {:.0} suspends/s to durable ack, {:.0} resumes/s to response (per round: first write -> last answer)",
                self.suspends_per_sec, self.resumes_per_sec
            ),
            ParkKind::MidTurn => println!(
                "throughput        {:.0} resumes/s to response (per round: first write -> last answer)",
                self.resumes_per_sec
            ),
        }
        if let Some((suspend, resume)) = self.cpu_us {
            let what = match self.kind {
                ParkKind::Idle => "suspend",
                ParkKind::MidTurn => "prompt+suspend (the turn up to its park)",
            };
            println!(
                "berth CPU         {suspend:.0} µs per {what}, {resume:.0} µs per resume (the resumed turn included); all threads"
            );
        }
        if self.missed > 0 {
            println!(
                "  warning: {} session-round(s) where the suspend found the turn already ended (left out)",
                self.missed
            );
        }
        println!();
    }
}

async fn suspend_bench(args: &Args, bin: &Path) -> anyhow::Result<Vec<SuspendReport>> {
    println!("== suspend -> durable ack, resume -> first model call, over stdio ==");
    println!("binary            {}", bin.display());
    println!(
        "first model call  = the resumed turn's first agent_message_chunk (scripted text step, emitted\n                  \
         when the model is called; berth journals it durably, with the turn's seal, before sending it)"
    );
    println!();
    let mut reports = Vec::new();
    let levels = args
        .suspend_sessions
        .iter()
        .map(|&n| (ParkKind::Idle, n))
        .chain(
            args.suspend_parked_sessions
                .iter()
                .map(|&n| (ParkKind::MidTurn, n)),
        )
        .filter(|&(_, n)| n > 0);
    for (kind, sessions) in levels {
        let report = suspend_run(args, bin, kind, sessions).await?;
        report.print();
        reports.push(report);
    }
    Ok(reports)
}

/// One run: a fresh `berth serve`, `sessions` sessions created first, then
/// warm-up and measured rounds.
async fn suspend_run(
    args: &Args,
    bin: &Path,
    kind: ParkKind,
    sessions: usize,
) -> anyhow::Result<SuspendReport> {
    let dir = tempfile::Builder::new()
        .prefix("berth-bench-suspend-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd)?;
    let script = dir.path().join("suspend.toml");
    std::fs::write(&script, suspend_script())?;
    // Every session may have a prompt, a suspend and a resume in flight.
    let max_in_flight = 3 * sessions + 64;
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
    let mut ids = HashMap::with_capacity(sessions);
    let mut lines = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let (id, line) = acp.request_line("session/new", json!({"cwd": cwd, "mcpServers": []}));
        ids.insert(id, i);
        lines.push(line);
    }
    let mut first_write = None;
    for line in &lines {
        let at = acp.write(line).await?;
        first_write.get_or_insert(at);
    }
    let mut session_ids = vec![String::new(); sessions];
    let mut last = Instant::now();
    let mut created = 0;
    while created < sessions {
        let (at, frame) = acp.recv().await?;
        if let Frame::Response(id, result) = classify_frame(&frame)? {
            let i = *ids
                .get(&id)
                .with_context(|| format!("unexpected response: {frame}"))?;
            let result = result.map_err(|e| anyhow!("session/new failed: {e}"))?;
            session_ids[i] = result["sessionId"]
                .as_str()
                .with_context(|| format!("session/new answered without a sessionId: {result}"))?
                .to_owned();
            created += 1;
            last = at;
        }
    }
    let sessions_created_in = last - first_write.unwrap_or(last);
    let index: HashMap<String, usize> = session_ids
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), i))
        .collect();

    let rounds = args
        .suspend_rounds
        .max(args.suspend_min_samples.div_ceil(sessions))
        .max(1);
    let mut warmup = SuspendSamples::default();
    let mut samples = SuspendSamples::default();
    for round in 0..args.suspend_warmup_rounds + rounds {
        let out = if round < args.suspend_warmup_rounds {
            &mut warmup
        } else {
            &mut samples
        };
        suspend_round(&mut acp, &cwd, &session_ids, &index, kind, round, out)
            .await
            .with_context(|| {
                format!("{} round {round} with {sessions} session(s)", kind.label())
            })?;
    }
    acp.shutdown().await?;

    let per_sec = |walls: &[Duration]| {
        let total: Duration = walls.iter().sum();
        (walls.len() * sessions) as f64 / total.as_secs_f64()
    };
    let suspends_per_sec = per_sec(&samples.suspend_walls);
    let session_rounds = (rounds * sessions) as f64;
    let cpu_us = match (samples.suspend_cpu_ns, samples.resume_cpu_ns) {
        (Some(s), Some(r)) => Some((
            s as f64 / 1e3 / session_rounds,
            r as f64 / 1e3 / session_rounds,
        )),
        _ => None,
    };
    let resumes_per_sec = per_sec(&samples.resume_walls);
    let summary = |v: &mut Vec<Duration>, what: &str| {
        LatencySummary::from_samples(v).with_context(|| format!("no {what} was measured"))
    };
    Ok(SuspendReport {
        kind,
        sessions,
        rounds,
        warmup_rounds: args.suspend_warmup_rounds,
        max_in_flight,
        sessions_created_in,
        suspend_ack: summary(&mut samples.suspend_ack, "suspend")?,
        tool_done_to_ack: LatencySummary::from_samples(&mut samples.tool_done_to_ack),
        resume_response: summary(&mut samples.resume_response, "resume")?,
        resume_first_call: summary(&mut samples.resume_first_call, "resumed model call")?,
        resume_resumed: summary(&mut samples.resume_resumed, "resumed notification")?,
        resume_ended: summary(&mut samples.resume_ended, "resumed turn end")?,
        suspends_per_sec,
        resumes_per_sec,
        cpu_us,
        missed: samples.missed,
    })
}

/// Per-session marks of one round.
#[derive(Debug, Clone, Default)]
struct Marks {
    /// The parked turn (mid-turn: the prompt's answer).
    turn_id: Option<String>,
    prompt_answered: bool,
    suspend_sent: Option<Instant>,
    /// Mid-turn: the `suspend_requested` notification read.
    requested: Option<Instant>,
    tool_done: Option<Instant>,
    suspend_ack: Option<Instant>,
    handle: Option<String>,
    /// The suspend's `summary` said the session was idle.
    parked_idle: bool,
    resume_sent: Option<Instant>,
    resume_answer: Option<Instant>,
    resumed_turn: Option<String>,
    /// The `resumed` notification read.
    resumed_note: Option<Instant>,
    first_chunk: Option<Instant>,
    ended: bool,
    ended_at: Option<Instant>,
}

/// The FIFO the parked-turn tool of session `i` reads in `round`; its name
/// (without `.fifo`) is that session's prompt.
fn park_fifo(cwd: &Path, round: usize, i: usize) -> PathBuf {
    cwd.join(format!("{PARK_MATCH}-r{round}-s{i}.fifo"))
}

/// Makes the round's FIFOs (one `mkfifo` for all).
fn make_fifos(paths: &[PathBuf]) -> anyhow::Result<()> {
    for chunk in paths.chunks(256) {
        let status = std::process::Command::new("mkfifo")
            .args(chunk)
            .status()
            .context("cannot run mkfifo (the mid-turn runs need it)")?;
        if !status.success() {
            bail!("mkfifo failed: {status}");
        }
    }
    Ok(())
}

/// One round: every session suspended (idle: all at once; mid-turn: each as
/// soon as its turn's tool call is announced, the tool being released once
/// the request is durable), then every one resumed at once with input, then
/// every resumed turn awaited to its `turn_ended`.
async fn suspend_round(
    acp: &mut AcpPipe,
    cwd: &Path,
    sessions: &[String],
    index: &HashMap<String, usize>,
    kind: ParkKind,
    round: usize,
    out: &mut SuspendSamples,
) -> anyhow::Result<()> {
    let n = sessions.len();
    let pid = acp.child.id();
    let cpu_start = pid.and_then(cpu_ns);
    let mut marks = vec![Marks::default(); n];
    // Request id -> (session, method).
    let mut pending: HashMap<u64, (usize, &'static str)> = HashMap::with_capacity(2 * n);

    // Suspend.
    let suspend_params = |s: &str| match kind {
        ParkKind::Idle => json!({"sessionId": s, "reason": "bench-core"}),
        ParkKind::MidTurn => json!({"sessionId": s, "reason": "bench-core", "mode": "finish_step"}),
    };
    let mut first_write = None;
    let mut fifos = Vec::new();
    let mut releases = Vec::new();
    match kind {
        ParkKind::Idle => {
            let lines: Vec<(u64, String)> = sessions
                .iter()
                .map(|s| acp.request_line("session/suspend", suspend_params(s)))
                .collect();
            for (i, (id, line)) in lines.iter().enumerate() {
                pending.insert(*id, (i, "session/suspend"));
                let at = acp.write(line).await?;
                first_write.get_or_insert(at);
                marks[i].suspend_sent = Some(at);
                marks[i].prompt_answered = true;
            }
        }
        ParkKind::MidTurn => {
            fifos = (0..n).map(|i| park_fifo(cwd, round, i)).collect();
            make_fifos(&fifos)?;
            let lines: Vec<(u64, String)> = sessions
                .iter()
                .zip(&fifos)
                .map(|(s, fifo)| {
                    let prompt = fifo.file_stem().unwrap_or_default().to_string_lossy();
                    acp.request_line(
                        "session/prompt",
                        json!({"sessionId": s, "prompt": [{"type": "text", "text": prompt}]}),
                    )
                })
                .collect();
            for (i, (id, line)) in lines.iter().enumerate() {
                pending.insert(*id, (i, "session/prompt"));
                acp.write(line).await?;
            }
        }
    }
    let mut last_ack = Instant::now();
    let done = |m: &[Marks]| {
        m.iter()
            .all(|m| m.suspend_ack.is_some() && m.prompt_answered)
    };
    while !done(&marks) {
        let (at, frame) = acp.recv().await?;
        match classify_frame(&frame)? {
            Frame::Note(session, note) => {
                let Some(&i) = index.get(session) else {
                    continue;
                };
                if kind != ParkKind::MidTurn {
                    continue;
                }
                match note {
                    "tool_call" if marks[i].suspend_sent.is_none() => {
                        let (id, line) =
                            acp.request_line("session/suspend", suspend_params(&sessions[i]));
                        pending.insert(id, (i, "session/suspend"));
                        let sent = acp.write(&line).await?;
                        first_write.get_or_insert(sent);
                        marks[i].suspend_sent = Some(sent);
                    }
                    "suspend_requested" if marks[i].requested.is_none() => {
                        marks[i].requested = Some(at);
                        // Let the tool end: open the FIFO's write end (this
                        // waits for the tool to have opened it) and close it.
                        let fifo = fifos[i].clone();
                        releases.push(tokio::task::spawn_blocking(move || {
                            std::fs::OpenOptions::new()
                                .write(true)
                                .open(&fifo)
                                .map(drop)
                        }));
                    }
                    "tool_call_update" if marks[i].tool_done.is_none() => {
                        match frame["params"]["update"]["status"].as_str() {
                            Some("completed") => marks[i].tool_done = Some(at),
                            Some("failed") => bail!("the parked turn's tool failed: {frame}"),
                            _ => {}
                        }
                    }
                    _ => {}
                }
            }
            Frame::Response(id, result) => {
                let (i, method) = pending
                    .remove(&id)
                    .with_context(|| format!("unexpected response: {frame}"))?;
                let result = result.map_err(|e| anyhow!("{method} failed: {e}"))?;
                let m = &mut marks[i];
                if method == "session/prompt" {
                    m.prompt_answered = true;
                    m.turn_id = result["_meta"]["berth"]["turnId"]
                        .as_str()
                        .map(str::to_owned);
                    continue;
                }
                m.suspend_ack = Some(at);
                last_ack = at;
                m.handle = Some(
                    result["handle"]
                        .as_str()
                        .with_context(|| format!("suspend answered without a handle: {result}"))?
                        .to_owned(),
                );
                m.parked_idle = result["summary"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("parked while idle"));
            }
        }
    }
    for release in releases {
        release
            .await?
            .context("cannot open a parked-turn tool's FIFO")?;
    }
    for fifo in &fifos {
        let _ = std::fs::remove_file(fifo);
    }
    let suspend_wall = last_ack - first_write.unwrap_or(last_ack);

    let cpu_between = pid.and_then(cpu_ns);

    // Resume, all at once.
    let lines: Vec<(u64, String)> = sessions
        .iter()
        .zip(&marks)
        .enumerate()
        .map(|(i, (s, m))| {
            acp.request_line(
                "session/resume",
                json!({
                    "sessionId": s,
                    "handle": m.handle,
                    "input": format!("{RESUME_MATCH} round {round} session {i}"),
                }),
            )
        })
        .collect();
    let mut first_resume = None;
    for (i, (id, line)) in lines.iter().enumerate() {
        pending.insert(*id, (i, "session/resume"));
        let at = acp.write(line).await?;
        first_resume.get_or_insert(at);
        marks[i].resume_sent = Some(at);
    }
    let mut last_answer = Instant::now();
    while !marks.iter().all(|m| m.resume_answer.is_some() && m.ended) {
        let (at, frame) = acp.recv().await?;
        match classify_frame(&frame)? {
            Frame::Note(session, note) => {
                let Some(&i) = index.get(session) else {
                    continue;
                };
                let m = &mut marks[i];
                match note {
                    "agent_message_chunk" if m.first_chunk.is_none() => m.first_chunk = Some(at),
                    "resumed" if m.resumed_note.is_none() => m.resumed_note = Some(at),
                    "turn_ended" => {
                        m.ended = true;
                        m.ended_at = Some(at);
                    }
                    _ => {}
                }
            }
            Frame::Response(id, result) => {
                let (i, method) = pending
                    .remove(&id)
                    .with_context(|| format!("unexpected response: {frame}"))?;
                let result = result.map_err(|e| anyhow!("{method} failed: {e}"))?;
                let m = &mut marks[i];
                m.resume_answer = Some(at);
                last_answer = at;
                m.resumed_turn = result["_meta"]["berth"]["resumed"]["turnId"]
                    .as_str()
                    .map(str::to_owned);
                if m.resumed_turn.is_none() {
                    bail!("the resume started no turn: {result}");
                }
            }
        }
    }
    let resume_wall = last_answer - first_resume.unwrap_or(last_answer);
    let cpu_end = pid.and_then(cpu_ns);
    let add = |sum: Option<u64>, a: Option<u64>, b: Option<u64>| Some(sum? + b?.checked_sub(a?)?);
    // The first round starts the sums.
    if out.suspend_walls.is_empty() {
        out.suspend_cpu_ns = Some(0);
        out.resume_cpu_ns = Some(0);
    }
    out.suspend_cpu_ns = add(out.suspend_cpu_ns, cpu_start, cpu_between);
    out.resume_cpu_ns = add(out.resume_cpu_ns, cpu_between, cpu_end);

    for m in &marks {
        let caught = match kind {
            ParkKind::Idle => m.parked_idle,
            // The parked turn itself must be the one resumed.
            ParkKind::MidTurn => {
                !m.parked_idle && m.turn_id.is_some() && m.turn_id == m.resumed_turn
            }
        };
        if !caught {
            if kind == ParkKind::Idle {
                bail!("an idle session's suspension was not idle (summary did not say so)");
            }
            out.missed += 1;
            continue;
        }
        let durable = match kind {
            ParkKind::Idle => m.suspend_ack,
            ParkKind::MidTurn => m.requested,
        };
        let (
            Some(sent),
            Some(durable),
            Some(ack),
            Some(resumed),
            Some(answer),
            Some(chunk),
            Some(note),
            Some(ended),
        ) = (
            m.suspend_sent,
            durable,
            m.suspend_ack,
            m.resume_sent,
            m.resume_answer,
            m.first_chunk,
            m.resumed_note,
            m.ended_at,
        )
        else {
            bail!("a session's round left a mark unset: {m:?}");
        };
        out.suspend_ack.push(durable - sent);
        if let Some(tool_done) = m.tool_done {
            out.tool_done_to_ack
                .push(ack.saturating_duration_since(tool_done));
        }
        out.resume_response.push(answer - resumed);
        out.resume_first_call.push(chunk - resumed);
        out.resume_resumed.push(note - resumed);
        out.resume_ended.push(ended - resumed);
    }
    out.suspend_walls.push(suspend_wall);
    out.resume_walls.push(resume_wall);
    Ok(())
}

// ---------------------------------------------------------------------------
// 5. Receipt signing
// ---------------------------------------------------------------------------

/// One signing figure: µs per operation.
struct SignRow {
    what: &'static str,
    bytes: usize,
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
}

impl SignRow {
    fn to_json(&self) -> Value {
        json!({"what": self.what, "signed_bytes": self.bytes, "mean": self.mean_us,
               "p50": self.p50_us, "p99": self.p99_us})
    }
}

/// Times `op` `total` times in batches of 1 000 (one unmeasured batch first).
fn time_op(what: &'static str, bytes: usize, total: usize, mut op: impl FnMut()) -> SignRow {
    const BATCH: usize = 1_000;
    for _ in 0..BATCH {
        op();
    }
    let batches = total.div_ceil(BATCH).max(1);
    let mut per_op: Vec<f64> = Vec::with_capacity(batches);
    let started = Instant::now();
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..BATCH {
            op();
        }
        per_op.push(t.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
    }
    let mean_us = started.elapsed().as_secs_f64() * 1e6 / (batches * BATCH) as f64;
    per_op.sort_by(f64::total_cmp);
    let at = |p: usize| per_op[((per_op.len() - 1) * p) / 100];
    SignRow {
        what,
        bytes,
        mean_us,
        p50_us: at(50),
        p99_us: at(99),
    }
}

fn sign_bench(total: usize) -> anyhow::Result<Vec<SignRow>> {
    use berth_runtime::event::{ControlOutcome, ControlStatus};
    use berth_runtime::receipt::{
        sha256_of_json, Receipt, ResumptionReceipt, SuspensionReceipt, TriggerMatch,
    };
    use berth_runtime::suspension::{Initiator, ResumeCause, ResumeConditions, SuspendMode};
    use berth_storage::Keyring;

    let keyring = Keyring::from_keys(vec![("k1".into(), vec![0x5a; 32])])?;
    let now = SystemClock.now();
    let outcome = ControlOutcome {
        session_id: "sess_6f1c2b7e0a9d4c3b8e1f2a3b4c5d6e7f".into(),
        control_id: "ctl_0123456789abcdef0123456789abcdef".into(),
        method: "session/inject".into(),
        outcome: "accepted".into(),
        status: ControlStatus::Accepted,
        actor: "acp:stdio:1".into(),
        target: json!({"sessionId": "sess_6f1c2b7e0a9d4c3b8e1f2a3b4c5d6e7f", "messageId": "msg_0123456789abcdef"}),
        reason: None,
        metadata: Value::Null,
        decided_at: now,
    };
    let conditions = ResumeConditions::parse(
        &json!({
            "onEvent": "ci.passed",
            "timeout": {"durationMinutes": 30, "onTimeout": "resume_with_summary"}
        }),
        "resumeWhen",
    )
    .map_err(|e| anyhow!("{e}"))?;
    let suspension = SuspensionReceipt {
        handle: "susp_0123456789abcdef0123456789abcdef".into(),
        session_id: SessionId::from("sess_6f1c2b7e0a9d4c3b8e1f2a3b4c5d6e7f"),
        initiator: Initiator::Client,
        actor: "acp:stdio:1".into(),
        mode: SuspendMode::FinishStep,
        reason: Some("waiting for CI".into()),
        conditions: Some(conditions),
        suspended_at: now,
        turn_id: Some("turn_0123456789abcdef0123456789abcdef".into()),
        frame_sha256: Some(sha256_of_json(&json!({"frame": "x"}))),
        span_id: None,
    };
    let input: Value = json!({
        "note": "CI passed on main; continue with the release notes",
        "build": {"sha": "abc123".repeat(6), "checks": (0..20).map(|i| json!({"name": format!("check-{i}"), "ok": true})).collect::<Vec<_>>()},
    });
    let resumption = ResumptionReceipt {
        handle: suspension.handle.clone(),
        session_id: suspension.session_id.clone(),
        cause: ResumeCause::ExternalEvent,
        actor: "event:ci.passed".into(),
        input_sha256: Some(sha256_of_json(&input)),
        continue_transcript: true,
        suspension_span_id: None,
        suspended_at: now,
        trigger: Some(TriggerMatch::Event {
            name: "ci.passed".into(),
            seq: 42,
            received_at: now,
        }),
        lateness_ms: None,
        turn_id: suspension.turn_id.clone(),
        resumed_at: now,
    };
    let signed = keyring.sign(outcome.clone());
    let input_bytes = serde_json::to_vec(&input)?.len();
    let rows = vec![
        time_op(
            "sign control_outcome",
            outcome.signing_bytes().len(),
            total,
            || {
                std::hint::black_box(keyring.sign(std::hint::black_box(outcome.clone())));
            },
        ),
        time_op(
            "sign SuspensionReceipt",
            suspension.signing_bytes().len(),
            total,
            || {
                std::hint::black_box(keyring.sign(std::hint::black_box(suspension.clone())));
            },
        ),
        time_op(
            "sign ResumptionReceipt",
            resumption.signing_bytes().len(),
            total,
            || {
                std::hint::black_box(keyring.sign(std::hint::black_box(resumption.clone())));
            },
        ),
        time_op(
            "verify control_outcome",
            outcome.signing_bytes().len(),
            total,
            || {
                let _ = std::hint::black_box(keyring.verify(std::hint::black_box(&signed)));
            },
        ),
        time_op("resume input hash", input_bytes, total, || {
            std::hint::black_box(sha256_of_json(std::hint::black_box(&input)));
        }),
    ];
    println!(
        "== receipt signing (in-process, HMAC-SHA256 over canonical JSON) ==\n\
         {total} operations per figure in batches of 1000; µs per operation\n\
         what                        bytes    mean µs   p50 µs   p99 µs"
    );
    for row in &rows {
        println!(
            "{:<26} {:>7} {:>10.2} {:>8.2} {:>8.2}",
            row.what, row.bytes, row.mean_us, row.p50_us, row.p99_us
        );
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------
// 6. Durable step throughput
// ---------------------------------------------------------------------------

/// What a step-throughput prompt contains.
const STEPS_MATCH: &str = "bench-steps";

/// The step section's script: `tools` zero-latency `read_file` calls, each
/// its own model response, then one text step.
fn steps_script(tools: usize) -> String {
    let call = format!(
        "  {{ tool_call = {{ name = \"read_file\", arguments = {{ path = \"{{cwd}}/{SMALL_FILE}\" }} }} }},\n"
    );
    format!(
        "# Written by bench-core (durable step throughput).\n\
         [[rules]]\n\
         match = \"{STEPS_MATCH}\"\n\
         steps = [\n{}  {{ text = \"done\" }},\n]\n",
        call.repeat(tools)
    )
}

/// One concurrency level's figures.
#[derive(Debug)]
struct StepsRow {
    sessions: usize,
    tools: usize,
    turns: usize,
    window: Duration,
    turn: LatencySummary,
    cpu_us_per_step: Option<f64>,
}

impl StepsRow {
    fn steps_per_sec(&self) -> f64 {
        (self.turns * self.tools) as f64 / self.window.as_secs_f64()
    }

    fn to_json(&self) -> Value {
        let l = &self.turn;
        json!({
            "sessions": self.sessions,
            "tools_per_turn": self.tools,
            "turns": self.turns,
            "steps": self.turns * self.tools,
            "window_s": self.window.as_secs_f64(),
            "steps_per_sec": round1(self.steps_per_sec()),
            "turns_per_sec": round1(self.turns as f64 / self.window.as_secs_f64()),
            "turn_p50_us": l.p50_us,
            "turn_p90_us": l.p90_us,
            "turn_p99_us": l.p99_us,
            "turn_max_us": l.max_us,
            "berth_cpu_us_per_step": self.cpu_us_per_step.map(round1),
        })
    }
}

async fn steps_bench(args: &Args, bin: &Path) -> anyhow::Result<Vec<StepsRow>> {
    if !(args.steps_secs > 0.0 && args.steps_secs.is_finite()) {
        bail!("--steps-secs must be a positive number of seconds");
    }
    if args.steps_tools == 0 {
        bail!("--steps-tools must be at least 1");
    }
    println!(
        "== durable step throughput over stdio: {} zero-latency read_file calls per turn, closed loop per session, {:.1} s per level ==",
        args.steps_tools, args.steps_secs
    );
    println!(
        "{:>8} {:>8} {:>10} {:>10} {:>12} {:>12} {:>12}",
        "sessions", "turns", "steps/s", "turns/s", "turn p50 µs", "turn p99 µs", "CPU µs/step"
    );
    let mut rows = Vec::new();
    for &sessions in &args.steps_sessions {
        if sessions == 0 {
            continue;
        }
        let row = steps_run(args, bin, sessions)
            .await
            .with_context(|| format!("step throughput with {sessions} session(s)"))?;
        println!(
            "{:>8} {:>8} {:>10.0} {:>10.1} {:>12} {:>12} {:>12}",
            row.sessions,
            row.turns,
            row.steps_per_sec(),
            row.turns as f64 / row.window.as_secs_f64(),
            row.turn.p50_us,
            row.turn.p99_us,
            row.cpu_us_per_step
                .map_or_else(|| "-".into(), |c| format!("{c:.0}"))
        );
        rows.push(row);
    }
    println!();
    Ok(rows)
}

async fn steps_run(args: &Args, bin: &Path, sessions: usize) -> anyhow::Result<StepsRow> {
    let dir = tempfile::Builder::new()
        .prefix("berth-bench-steps-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd)?;
    std::fs::write(cwd.join(SMALL_FILE), "hello\n")?;
    let script = dir.path().join("steps.toml");
    std::fs::write(&script, steps_script(args.steps_tools))?;
    let config = dir.path().join("berth.toml");
    std::fs::write(
        &config,
        format!("max_model_calls = {}\n", args.steps_tools + 2),
    )?;
    let max_in_flight = (2 * sessions + 64).to_string();
    let mut acp = AcpPipe::spawn(
        bin,
        &dir.path().join("data"),
        &script,
        &dir.path().join("berth.stderr"),
        &[
            "--config".as_ref(),
            config.as_os_str(),
            "--max-in-flight".as_ref(),
            max_in_flight.as_ref(),
        ],
    )?;
    acp.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
    .await
    .context("initialize")?;
    let mut ids = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        let new = acp
            .call("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await
            .context("session/new")?;
        ids.push(
            new["sessionId"]
                .as_str()
                .with_context(|| format!("session/new answered without a sessionId: {new}"))?
                .to_owned(),
        );
    }
    let prompt_line = |acp: &mut AcpPipe, i: usize| {
        acp.request_line(
            "session/prompt",
            json!({"sessionId": ids[i], "prompt": [{"type": "text", "text": STEPS_MATCH}]}),
        )
    };
    // One unmeasured turn per session, all at once.
    let mut pending: HashMap<u64, (usize, Instant)> = HashMap::with_capacity(sessions);
    for i in 0..sessions {
        let (id, line) = prompt_line(&mut acp, i);
        let at = acp.write(&line).await?;
        pending.insert(id, (i, at));
    }
    while !pending.is_empty() {
        let (_, frame) = acp.recv().await?;
        if let Frame::Response(id, result) = classify_frame(&frame)? {
            pending
                .remove(&id)
                .with_context(|| format!("unexpected response: {frame}"))?;
            check_end_turn(result)?;
        }
    }
    // The closed loop.
    let pid = acp.child.id();
    let cpu_start = pid.and_then(cpu_ns);
    let window = Duration::from_secs_f64(args.steps_secs);
    let start = Instant::now();
    let deadline = start + window;
    for i in 0..sessions {
        let (id, line) = prompt_line(&mut acp, i);
        let at = acp.write(&line).await?;
        pending.insert(id, (i, at));
    }
    let mut samples = Vec::new();
    let mut last = start;
    while !pending.is_empty() {
        let (at, frame) = acp.recv().await?;
        if let Frame::Response(id, result) = classify_frame(&frame)? {
            let (i, sent) = pending
                .remove(&id)
                .with_context(|| format!("unexpected response: {frame}"))?;
            check_end_turn(result)?;
            samples.push(at - sent);
            last = at;
            if Instant::now() < deadline {
                let (id, line) = prompt_line(&mut acp, i);
                let at = acp.write(&line).await?;
                pending.insert(id, (i, at));
            }
        }
    }
    let cpu_end = pid.and_then(cpu_ns);
    acp.shutdown().await?;
    let turns = samples.len();
    let cpu_us_per_step = match (cpu_start, cpu_end) {
        (Some(a), Some(b)) => {
            Some(b.saturating_sub(a) as f64 / 1e3 / (turns * args.steps_tools) as f64)
        }
        _ => None,
    };
    Ok(StepsRow {
        sessions,
        tools: args.steps_tools,
        turns,
        window: last - start,
        turn: LatencySummary::from_samples(&mut samples).context("no turn was measured")?,
        cpu_us_per_step,
    })
}

/// A step-throughput turn must end normally (`end_turn`), having run every call.
fn check_end_turn(result: Result<&Value, &Value>) -> anyhow::Result<()> {
    let result = result.map_err(|e| anyhow!("session/prompt failed: {e}"))?;
    if result["stopReason"] != "end_turn" {
        bail!("a step-throughput turn did not end with end_turn: {result}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_runtime::model::scripted::ScriptedModel;

    #[test]
    fn the_steps_script_parses_and_makes_one_model_response_per_tool_call() {
        let script = steps_script(10);
        ScriptedModel::parse(&script, "toml", "steps").expect("the steps script parses");
        assert_eq!(script.matches("tool_call = ").count(), 10);
        assert_eq!(script.matches("tool_calls").count(), 0, "no parallel batch");
    }

    #[test]
    fn the_suspend_and_tool_scripts_parse() {
        ScriptedModel::parse(&suspend_script(), "toml", "suspend").expect("suspend script");
        for tool in [ToolChoice::ReadFile, ToolChoice::Shell, ToolChoice::None] {
            ScriptedModel::parse(&tool.script(), "toml", tool.label()).expect("tool script");
        }
    }
}
