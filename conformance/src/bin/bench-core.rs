//! `bench-core`: measures berth's two core costs and prints figures.
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
//! The last line of output is a one-line JSON summary of everything printed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use berth_conformance::stats::LatencySummary;
use berth_runtime::clock::{Clock, SystemClock};
use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::ids::SessionId;
use berth_storage::{Batch, Journal, JournalOptions};
use clap::{Parser, ValueEnum};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How long to wait for any single frame from the child before giving up.
const FRAME_TIMEOUT: Duration = Duration::from_secs(30);

/// The small file the `read_file` step reads.
const SMALL_FILE: &str = "small.txt";

/// Measures berth's prompt round trip over stdio and its durable append rate.
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

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The 1-, 5- and 15-minute load averages, when the OS reports them.
fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

async fn run(args: &Args) -> anyhow::Result<()> {
    let bin = if args.skip_stdio {
        None
    } else {
        Some(berth_binary()?)
    };
    let load_before = load_average();
    if let Some(load) = &load_before {
        println!("load average      {load} (before; {} CPUs)\n", cpus());
    }
    if !(args.duration_secs > 0.0 && args.duration_secs.is_finite()) {
        bail!("--duration-secs must be a positive number of seconds");
    }
    if args.prompts == 0 && !args.skip_stdio {
        bail!("--prompts must be at least 1 (or pass --skip-stdio)");
    }
    let stdio = match bin {
        None => None,
        Some(bin) => {
            let report = stdio_bench(args, bin).await?;
            report.print();
            Some(report)
        }
    };
    let inject = match (&args.skip_stdio, args.injects) {
        (true, _) | (_, 0) => None,
        _ => {
            let summary = inject_bench(args, berth_binary()?).await?;
            println!(
                "== inject -> delivery over stdio ==\nsteers            {} (mode steer, a turn running zero-latency read_file calls)\n   p50 µs    p90 µs    p99 µs    max µs\n{:>9} {:>9} {:>9} {:>9}\n",
                args.injects, summary.p50_us, summary.p90_us, summary.p99_us, summary.max_us
            );
            Some(summary)
        }
    };
    let journal = if args.skip_journal {
        Vec::new()
    } else {
        journal_bench(args).await?
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
        "journal": journal.iter().map(JournalRow::to_json).collect::<Vec<_>>(),
    });
    println!("{summary}");
    Ok(())
}

// ---------------------------------------------------------------------------
// 1. Prompt round trip over stdio
// ---------------------------------------------------------------------------

/// Where the `berth` binary is: `$BERTH_BIN`, else the workspace's release build.
fn berth_binary() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("BERTH_BIN") {
        let path = PathBuf::from(bin);
        if !path.is_file() {
            bail!(
                "BERTH_BIN points at {}, which is not a file: unset it to use the \
                 workspace build, or point it at a built `berth` binary",
                path.display()
            );
        }
        return Ok(path);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the conformance crate has no parent directory")?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let path = target.join("release").join("berth");
    if !path.is_file() {
        bail!(
            "the berth binary is missing at {}: build it first with \
             `cargo build --release --bin berth` (or set BERTH_BIN to a built binary, \
             or pass --skip-stdio)",
            path.display()
        );
    }
    Ok(path)
}

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
        let stderr = std::fs::File::create(stderr_path)
            .with_context(|| format!("cannot create {}", stderr_path.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--model")
            .arg(format!("scripted:{}", script.display()))
            .args(extra_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true);
        if std::env::var_os("BERTH_LOG").is_none() {
            cmd.env("BERTH_LOG", "warn");
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {} serve", bin.display()))?;
        let stdin = child.stdin.take().context("child stdin was not piped")?;
        let stdout = child.stdout.take().context("child stdout was not piped")?;
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
        let text = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        if tail.is_empty() {
            "(berth wrote nothing to stderr)".into()
        } else {
            format!("berth stderr (last lines):\n{tail}")
        }
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

/// CPU time (ns) the live threads of process `pid` have run, summed from
/// `/proc/<pid>/task/*/schedstat`; `None` where /proc does not report it.
/// Threads that already exited are not counted.
fn cpu_ns(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let text = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
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
    let journal = Journal::open(&path, JournalOptions { quick_repair })
        .with_context(|| format!("cannot open a journal at {}", path.display()))?;
    let record = Arc::new(EventRecord {
        at: SystemClock.now(),
        event: SessionEvent::AgentMessageChunk {
            text: "a small benchmark event: forty-odd bytes of text".into(),
        },
    });
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
