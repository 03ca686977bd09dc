//! `bench-ws`: a bounded load test of ACP over WebSocket (issue 8, "How it is
//! checked": "1,000 concurrent WebSocket clients across 100 sessions with a
//! steer/cancel storm for 60 s: no lost acknowledged control, no error other
//! than the intended ones, memory stays bounded").
//!
//! Loopback only: it starts its own `berth serve --listen 127.0.0.1:0` (the
//! release build, or `$BERTH_BIN`) on a fresh data dir with a scripted model
//! whose turns are slow (delays and tool calls, so steers land mid-turn),
//! then
//!
//! 1. opens `--clients` WebSocket connections (bearer token, role
//!    controller) spread evenly over `--sessions` sessions; the first client
//!    of each session is its **driver**, which prompts again whenever a turn
//!    ends; every other client **storms**: a `session/inject` steer, or one
//!    time in `--cancel-every` a `session/cancel`, then a pause of about
//!    `--pause-ms` (jittered ±50 %), until `--duration-secs` have passed.
//!    Every client reads every frame of its session (each is a watcher).
//! 2. samples berth's resident memory (`VmRSS` of `/proc/PID/status`) every
//!    second;
//! 3. stops the storm, cancels every running turn, and reads each session's
//!    journal back over the wire (`session/load` replays every event) to
//!    check that **every acknowledged steer** (its `messageId`) has its
//!    `injection_accepted` event and that the number of **acknowledged
//!    cancels** equals the session's `session/cancel` `control_outcome`
//!    receipts.
//!
//! The one intended error is `-32004` `no_active_prompt` (a steer that
//! arrives between two turns: steering needs a running turn). Anything else —
//! another error code, a timeout, a closed connection — is counted and makes
//! the run fail (exit 1), as does a lost control.
//!
//! ```sh
//! cargo build --release --bin berth
//! cargo run --release -p berth-conformance --bin bench-ws -- \
//!     --clients 1000 --sessions 100 --duration-secs 60
//! ```

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use berth_conformance::host;
use berth_conformance::stats::LatencySummary;
use clap::Parser;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::Message;

/// The scripted model: every user message (a prompt, or a steer delivered
/// mid-turn) containing "work" plays a turn of about 1.5 s with two tool
/// batches, so there are seams for steers to land at and time for cancels
/// to find a running turn.
const SCRIPT: &str = r#"
[[rules]]
match = "work"
steps = [
  { text = "step one" }, { delay_ms = 300 },
  { tool_call = { name = "read_file", arguments = { path = "{cwd}/absent.txt" } } },
  { delay_ms = 400 }, { text = "step two" },
  { tool_call = { name = "read_file", arguments = { path = "{cwd}/absent.txt" } } },
  { delay_ms = 400 }, { text = "done" },
  { usage = { input_tokens = 200, output_tokens = 50 } },
]
"#;

const TOKEN: &str = "bench-ws-controller-token";

#[derive(Parser, Debug)]
#[command(
    name = "bench-ws",
    about = "ACP over WebSocket under a steer/cancel storm (loopback only)"
)]
struct Args {
    /// WebSocket clients (connections), spread over the sessions.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Sessions.
    #[arg(long, default_value_t = 100)]
    sessions: usize,
    /// How long the storm lasts (s).
    #[arg(long, default_value_t = 60)]
    duration_secs: u64,
    /// Mean pause between two controls of one storm client (ms).
    #[arg(long, default_value_t = 1000)]
    pause_ms: u64,
    /// One control in this many is a cancel (the rest are steers).
    #[arg(long, default_value_t = 10)]
    cancel_every: u64,
    /// How long one request may wait for its answer before it counts as an
    /// error (s).
    #[arg(long, default_value_t = 30)]
    request_timeout_secs: u64,
    /// berth's redb page cache (MiB; `journal_cache_mib`, default 64). It
    /// fills as the journal grows and counts towards RSS: a smaller one
    /// shows what the rest of the process holds.
    #[arg(long, default_value_t = 64)]
    journal_cache_mib: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("bench-ws: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One WebSocket connection: requests answered by id; notifications are
/// read (and counted) by the reader task so the server never sees a slow
/// consumer.
struct Conn {
    out: mpsc::UnboundedSender<Message>,
    waiting: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>,
    next_id: AtomicU64,
    closed: Arc<AtomicBool>,
    timeout: Duration,
}

/// What a request came back with.
enum Reply {
    Result(Value),
    Error(Value),
}

impl Conn {
    async fn open(url: &str, counters: &Arc<Counters>, timeout: Duration) -> anyhow::Result<Self> {
        let mut request = url.into_client_request()?;
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {TOKEN}").parse()?);
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .with_context(|| format!("cannot open a WebSocket to {url}"))?;
        let (mut sink, mut stream) = socket.split();
        let (out, mut rx) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(message) = rx.recv().await {
                if sink.send(message).await.is_err() {
                    return;
                }
            }
            let _ = sink.close().await;
        });
        let waiting: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>> = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        {
            let waiting = Arc::clone(&waiting);
            let closed = Arc::clone(&closed);
            let counters = Arc::clone(counters);
            tokio::spawn(async move {
                while let Some(message) = stream.next().await {
                    let text = match message {
                        Ok(Message::Text(text)) => text,
                        Ok(Message::Close(frame)) => {
                            // berth closes every connection on SIGTERM (1001)
                            // once the run is over; before that a close is an
                            // error (1008 slow reader, 1001 silent, …).
                            if let Some(frame) =
                                frame.filter(|_| !counters.finished.load(Ordering::Acquire))
                            {
                                counters.note_error(format!(
                                    "closed by berth: {} {}",
                                    u16::from(frame.code),
                                    frame.reason
                                ));
                            }
                            break;
                        }
                        Ok(_) => continue,
                        Err(e) => {
                            counters.note_error(format!("read failed: {e}"));
                            break;
                        }
                    };
                    counters.frames.fetch_add(1, Ordering::Relaxed);
                    let Ok(frame) = serde_json::from_str::<Value>(text.as_str()) else {
                        counters.note_error("a frame that is not JSON".into());
                        continue;
                    };
                    if frame.get("method").is_some() {
                        if frame.get("id").is_some() {
                            counters
                                .note_error(format!("berth sent a request: {}", frame["method"]));
                        }
                        continue;
                    }
                    if let Some(id) = frame.get("id").and_then(Value::as_u64) {
                        let sender = waiting
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&id);
                        if let Some(sender) = sender {
                            let _ = sender.send(frame);
                        }
                    } else {
                        counters.note_error(format!("an answer without id: {frame}"));
                    }
                }
                closed.store(true, Ordering::Release);
                waiting.lock().unwrap_or_else(|e| e.into_inner()).clear();
            });
        }
        Ok(Self {
            out,
            waiting,
            next_id: AtomicU64::new(0),
            closed,
            timeout,
        })
    }

    async fn call(&self, method: &str, params: Value) -> anyhow::Result<Reply> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if self
            .out
            .send(Message::Text(frame.to_string().into()))
            .is_err()
        {
            bail!("{method}: the connection is closed");
        }
        let frame = match tokio::time::timeout(self.timeout, rx).await {
            Err(_) => bail!("{method}: no answer within {:?}", self.timeout),
            Ok(Err(_)) => bail!("{method}: the connection closed before the answer"),
            Ok(Ok(frame)) => frame,
        };
        Ok(match frame.get("error") {
            Some(error) => Reply::Error(error.clone()),
            None => Reply::Result(frame["result"].clone()),
        })
    }

    async fn ok(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        match self.call(method, params).await? {
            Reply::Result(v) => Ok(v),
            Reply::Error(e) => bail!("{method} failed: {e}"),
        }
    }

    fn close(&self) {
        let _ = self.out.send(Message::Close(None));
    }
}

/// Run-wide counters.
#[derive(Default)]
struct Counters {
    /// Set before berth is stopped: closes after it are expected.
    finished: AtomicBool,
    frames: AtomicU64,
    steers_acked: AtomicU64,
    steers_idle: AtomicU64,
    cancels_acked: AtomicU64,
    cancels_first: AtomicU64,
    prompts: AtomicU64,
    errors: Mutex<Vec<String>>,
    error_count: AtomicU64,
    steer_latency: Mutex<Vec<Duration>>,
    cancel_latency: Mutex<Vec<Duration>>,
}

impl Counters {
    fn note_error(&self, what: String) {
        self.error_count.fetch_add(1, Ordering::Relaxed);
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if errors.len() < 20 {
            errors.push(what);
        }
    }
}

/// What one session's clients had acknowledged.
#[derive(Default)]
struct Acked {
    steers: Mutex<HashSet<String>>,
    cancels: AtomicU64,
}

/// A small xorshift generator (no external randomness needed; seeded per
/// client so runs are repeatable in shape).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `berth serve` under test.
struct Berth {
    child: tokio::process::Child,
    pid: u32,
    addr: String,
    stderr_path: PathBuf,
}

async fn start_berth(dir: &Path, journal_cache_mib: u64) -> anyhow::Result<Berth> {
    let bin = host::berth_binary("BERTH_BIN=…")?;
    let script = dir.join("script.toml");
    std::fs::write(&script, SCRIPT)?;
    let config = dir.join("berth.toml");
    std::fs::write(
        &config,
        format!(
            "journal_cache_mib = {journal_cache_mib}\n\n\
             [http]\nlisten = \"127.0.0.1:0\"\nmax_connections = 4096\n\n\
             [http.websocket]\nmax_connections = 4096\n"
        ),
    )?;
    let stderr_path = dir.join("berth.stderr");
    let mut child = tokio::process::Command::new(&bin)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--model")
        .arg(format!("scripted:{}", script.display()))
        .env("BERTH_API_KEYS", format!("{TOKEN}=bench:controller"))
        .env("BERTH_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let pid = child.id().context("berth exited at once")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let (tx, rx) = oneshot::channel();
    let log = stderr_path.clone();
    tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let mut file = std::fs::File::create(&log).ok();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.strip_prefix("berth: listening on http://") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(rest.trim().to_owned());
                }
            }
            if let Some(f) = file.as_mut() {
                use std::io::Write;
                let _ = writeln!(f, "{line}");
            }
        }
    });
    let addr = tokio::time::timeout(Duration::from_secs(30), rx)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "berth did not announce its listener within 30 s\n{}",
                host::stderr_tail(&stderr_path)
            )
        })?
        .map_err(|_| {
            anyhow::anyhow!(
                "berth exited before listening\n{}",
                host::stderr_tail(&stderr_path)
            )
        })?;
    Ok(Berth {
        child,
        pid,
        addr,
        stderr_path,
    })
}

/// Resident memory of `pid` (KiB).
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Open file descriptors the run needs: one per client here and one per
/// client in berth. Raises the soft limit to the hard one when it is lower.
fn raise_fd_limit(needed: u64) -> anyhow::Result<()> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < needed {
        if hard < needed {
            bail!("{needed} file descriptors are needed but the hard limit is {hard} (ulimit -Hn)");
        }
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(())
}

async fn run(args: &Args) -> anyhow::Result<bool> {
    if args.sessions == 0 || args.clients < args.sessions * 2 {
        bail!("--clients must be at least twice --sessions (a driver and a stormer per session)");
    }
    raise_fd_limit(args.clients as u64 + 512)?;
    println!(
        "bench-ws: {} clients over {} sessions, {} s storm (pause ~{} ms, 1 cancel in {}), journal cache {} MiB, {} CPUs, load {}",
        args.clients,
        args.sessions,
        args.duration_secs,
        args.pause_ms,
        args.cancel_every,
        args.journal_cache_mib,
        host::cpus(),
        host::load_average().unwrap_or_else(|| "?".into())
    );
    let dir = tempfile::tempdir()?;
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work)?;
    let mut berth = start_berth(dir.path(), args.journal_cache_mib).await?;
    let url = format!("ws://{}/acp", berth.addr);
    let counters = Arc::new(Counters::default());
    let timeout = Duration::from_secs(args.request_timeout_secs);

    // Memory, sampled every second from here on.
    let samples: Arc<Mutex<Vec<(f64, u64)>>> = Arc::default();
    let started = Instant::now();
    let sampler = {
        let samples = Arc::clone(&samples);
        let pid = berth.pid;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                match rss_kib(pid) {
                    Some(kib) => samples
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((started.elapsed().as_secs_f64(), kib)),
                    None => return,
                }
            }
        })
    };
    let rss_idle = rss_kib(berth.pid).unwrap_or(0);

    // Sessions.
    let setup = Conn::open(&url, &counters, timeout).await?;
    setup
        .ok("initialize", json!({"protocolVersion": 1}))
        .await?;
    let mut session_ids = Vec::with_capacity(args.sessions);
    for _ in 0..args.sessions {
        let created = setup
            .ok("session/new", json!({"cwd": work, "mcpServers": []}))
            .await?;
        session_ids.push(
            created["sessionId"]
                .as_str()
                .context("session/new answered no sessionId")?
                .to_owned(),
        );
    }
    setup.close();

    // Connections, opened 50 at a time.
    let connect_started = Instant::now();
    let mut conns = Vec::with_capacity(args.clients);
    for chunk in (0..args.clients).collect::<Vec<_>>().chunks(50) {
        let opened = futures::future::join_all(chunk.iter().map(|_| async {
            let conn = Conn::open(&url, &counters, timeout).await?;
            conn.ok("initialize", json!({"protocolVersion": 1})).await?;
            anyhow::Ok(conn)
        }))
        .await;
        for conn in opened {
            conns.push(Arc::new(conn?));
        }
    }
    let connect_secs = connect_started.elapsed().as_secs_f64();
    let rss_connected = rss_kib(berth.pid).unwrap_or(0);
    println!(
        "connected {} clients in {:.1} s; berth RSS {} MiB idle, {} MiB with every client connected",
        conns.len(),
        connect_secs,
        rss_idle / 1024,
        rss_connected / 1024
    );

    // Every client watches its session (session/load with the cursor at the
    // end: nothing replayed, every event from now on).
    for chunk in conns.chunks(100).enumerate() {
        let (c, chunk) = chunk;
        let loads = chunk.iter().enumerate().map(|(i, conn)| {
            let sid = session_ids[(c * 100 + i) % args.sessions].clone();
            async move { conn.ok("session/resume", json!({"sessionId": sid})).await }
        });
        for loaded in futures::future::join_all(loads).await {
            loaded?;
        }
    }

    let acked: Arc<Vec<Acked>> = Arc::new((0..args.sessions).map(|_| Acked::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(args.duration_secs);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, conn) in conns.iter().enumerate() {
        let s = i % args.sessions;
        let sid = session_ids[s].clone();
        let conn = Arc::clone(conn);
        let counters = Arc::clone(&counters);
        let acked = Arc::clone(&acked);
        let stop = Arc::clone(&stop);
        let driver = i < args.sessions;
        let pause = args.pause_ms.max(1);
        let cancel_every = args.cancel_every.max(1);
        tasks.spawn(async move {
            if driver {
                // Prompt again whenever a turn ends, until the storm stops.
                while !stop.load(Ordering::Acquire) && !conn.closed.load(Ordering::Acquire) {
                    let prompt = json!({"sessionId": sid,
                        "prompt": [{"type": "text", "text": "work on it"}]});
                    match conn.call("session/prompt", prompt).await {
                        Ok(Reply::Result(_)) => {
                            counters.prompts.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Reply::Error(e)) => {
                            counters.note_error(format!("session/prompt: {e}"));
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => {
                            counters.note_error(format!("{e:#}"));
                            return;
                        }
                    }
                }
                return;
            }
            let mut rng =
                Rng(0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
            // Start spread over one pause so the storm is not in lock-step.
            tokio::time::sleep(Duration::from_millis(rng.next() % pause)).await;
            let mut n = 0u64;
            while Instant::now() < deadline && !conn.closed.load(Ordering::Acquire) {
                n += 1;
                let cancel = rng.next().is_multiple_of(cancel_every);
                let at = Instant::now();
                if cancel {
                    match conn.call("session/cancel", json!({"sessionId": sid})).await {
                        Ok(Reply::Result(r)) => {
                            acked[s].cancels.fetch_add(1, Ordering::Relaxed);
                            counters.cancels_acked.fetch_add(1, Ordering::Relaxed);
                            if r["status"] == "cancelled" {
                                counters.cancels_first.fetch_add(1, Ordering::Relaxed);
                            }
                            counters
                                .cancel_latency
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(at.elapsed());
                        }
                        Ok(Reply::Error(e)) => counters.note_error(format!("session/cancel: {e}")),
                        Err(e) => counters.note_error(format!("{e:#}")),
                    }
                } else {
                    let steer = json!({"sessionId": sid, "mode": "steer",
                        "content": [{"type": "text", "text": format!("work: steer {i}.{n}")}]});
                    match conn.call("session/inject", steer).await {
                        Ok(Reply::Result(r)) => {
                            let Some(id) = r["messageId"].as_str() else {
                                counters
                                    .note_error(format!("an inject answer without messageId: {r}"));
                                continue;
                            };
                            acked[s]
                                .steers
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .insert(id.to_owned());
                            counters.steers_acked.fetch_add(1, Ordering::Relaxed);
                            counters
                                .steer_latency
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(at.elapsed());
                        }
                        // The intended refusal: no turn is running.
                        Ok(Reply::Error(e))
                            if e["code"] == -32004 && e["data"]["reason"] == "no_active_prompt" =>
                        {
                            counters.steers_idle.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Reply::Error(e)) => counters.note_error(format!("session/inject: {e}")),
                        Err(e) => counters.note_error(format!("{e:#}")),
                    }
                }
                let jitter = pause / 2 + rng.next() % pause;
                tokio::time::sleep(Duration::from_millis(jitter)).await;
            }
        });
    }

    // Progress every 10 s.
    let storm_started = Instant::now();
    let mut last_print = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if last_print.elapsed() >= Duration::from_secs(10) {
            last_print = Instant::now();
            println!(
                "  t={:>3.0}s  steers acked {:>7}  idle-refused {:>6}  cancels acked {:>6}  turns {:>5}  errors {}  RSS {} MiB",
                storm_started.elapsed().as_secs_f64(),
                counters.steers_acked.load(Ordering::Relaxed),
                counters.steers_idle.load(Ordering::Relaxed),
                counters.cancels_acked.load(Ordering::Relaxed),
                counters.prompts.load(Ordering::Relaxed),
                counters.error_count.load(Ordering::Relaxed),
                rss_kib(berth.pid).unwrap_or(0) / 1024,
            );
        }
    }
    // Storm clients stop at the deadline; drivers stop once their turn ends
    // (cancelled below, acknowledged and counted like any other cancel).
    stop.store(true, Ordering::Release);
    let storm_secs = storm_started.elapsed().as_secs_f64();
    let closer = Conn::open(&url, &counters, timeout).await?;
    closer
        .ok("initialize", json!({"protocolVersion": 1}))
        .await?;
    for (s, sid) in session_ids.iter().enumerate() {
        closer
            .ok("session/cancel", json!({"sessionId": sid}))
            .await?;
        acked[s].cancels.fetch_add(1, Ordering::Relaxed);
    }
    let drained = tokio::time::timeout(Duration::from_secs(60), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        counters.note_error("clients still busy 60 s after the storm".into());
        tasks.abort_all();
    }
    let rss_after_storm = rss_kib(berth.pid).unwrap_or(0);
    for conn in &conns {
        conn.close();
    }
    drop(conns);

    // Read every session's journal back and account for every acknowledged
    // control.
    let verify_started = Instant::now();
    let (mut lost_steers, mut lost_cancels, mut extra_cancels) = (0u64, 0u64, 0u64);
    let (mut delivered, mut dropped, mut events) = (0u64, 0u64, 0u64);
    for (s, sid) in session_ids.iter().enumerate() {
        let journal = replay(&url, sid, timeout).await?;
        events += journal.events;
        delivered += journal.delivered;
        dropped += journal.dropped;
        let steers = acked[s].steers.lock().unwrap_or_else(|e| e.into_inner());
        let missing: Vec<&String> = steers.difference(&journal.accepted).collect();
        if let Some(first) = missing.first() {
            println!(
                "LOST: session {sid}: {} acknowledged steer(s) have no injection_accepted event (first: {first})",
                missing.len()
            );
        }
        lost_steers += missing.len() as u64;
        let cancels = acked[s].cancels.load(Ordering::Relaxed);
        if journal.cancel_receipts < cancels {
            println!(
                "LOST: session {sid}: {cancels} acknowledged cancels, {} receipts",
                journal.cancel_receipts
            );
            lost_cancels += cancels - journal.cancel_receipts;
        } else if journal.cancel_receipts > cancels {
            // A cancel journaled whose answer never reached us (a timed-out
            // request): not lost, but unaccounted; reported.
            extra_cancels += journal.cancel_receipts - cancels;
        }
    }
    let verify_secs = verify_started.elapsed().as_secs_f64();

    sampler.abort();
    closer.close();
    counters.finished.store(true, Ordering::Release);
    // SIGTERM and wait: a clean stop.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(berth.pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .ok();
    let exit = tokio::time::timeout(Duration::from_secs(30), berth.child.wait()).await;
    let stopped_cleanly = matches!(exit, Ok(Ok(status)) if status.success());

    // Figures.
    let steers = counters.steers_acked.load(Ordering::Relaxed);
    let cancels = counters.cancels_acked.load(Ordering::Relaxed);
    let idle = counters.steers_idle.load(Ordering::Relaxed);
    println!();
    println!("storm: {storm_secs:.1} s");
    println!(
        "  acknowledged steers   {steers:>8}  ({:.0}/s)",
        steers as f64 / storm_secs
    );
    println!(
        "  acknowledged cancels  {cancels:>8}  ({} ended a turn, the rest already_cancelled)",
        counters.cancels_first.load(Ordering::Relaxed)
    );
    println!("  steers refused -32004 no_active_prompt (intended) {idle}");
    println!(
        "  prompt turns completed {}",
        counters.prompts.load(Ordering::Relaxed)
    );
    println!(
        "  frames received by the clients {}",
        counters.frames.load(Ordering::Relaxed)
    );
    let mut lat = counters
        .steer_latency
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(l) = LatencySummary::from_samples(&mut lat) {
        println!(
            "  steer ack latency (durable): p50 {} µs, p90 {} µs, p99 {} µs, max {} µs",
            l.p50_us, l.p90_us, l.p99_us, l.max_us
        );
    }
    let mut lat = counters
        .cancel_latency
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(l) = LatencySummary::from_samples(&mut lat) {
        println!(
            "  cancel ack latency (durable): p50 {} µs, p90 {} µs, p99 {} µs, max {} µs",
            l.p50_us, l.p90_us, l.p99_us, l.max_us
        );
    }
    println!(
        "journal read back in {verify_secs:.1} s: {events} events; steers delivered {delivered}, dropped at turn end {dropped}"
    );
    println!(
        "  lost acknowledged steers {lost_steers}, lost acknowledged cancels {lost_cancels} (cancel receipts without an answer seen: {extra_cancels})"
    );
    let samples = samples.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let series: Vec<String> = samples
        .iter()
        .filter(|(t, _)| (*t as u64).is_multiple_of(10))
        .map(|(t, kib)| format!("{:.0}s:{}", t, kib / 1024))
        .collect();
    println!(
        "berth RSS (MiB): idle {}, connected {}, peak {}, after the storm {}; every 10 s: {}",
        rss_idle / 1024,
        rss_connected / 1024,
        peak / 1024,
        rss_after_storm / 1024,
        series.join(" ")
    );
    let errors = counters.error_count.load(Ordering::Relaxed);
    println!("unexpected errors {errors}");
    for e in counters
        .errors
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        println!("  {e}");
    }
    println!(
        "berth stopped on SIGTERM {}",
        if stopped_cleanly {
            "cleanly"
        } else {
            "NOT cleanly"
        }
    );
    if !stopped_cleanly {
        println!("{}", host::stderr_tail(&berth.stderr_path));
    }
    let journal_bytes: u64 = std::fs::read_dir(dir.path().join("data"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    println!(
        "data dir after the run: {} MiB",
        journal_bytes / (1024 * 1024)
    );
    let ok = lost_steers == 0 && lost_cancels == 0 && errors == 0 && stopped_cleanly;
    println!("{}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}

/// What one session's journal holds, read over the wire.
struct Journal {
    events: u64,
    accepted: HashSet<String>,
    delivered: u64,
    dropped: u64,
    cancel_receipts: u64,
}

/// `session/load` from the start on a fresh connection: every journaled
/// event is replayed (as notifications) before the answer.
async fn replay(url: &str, sid: &str, timeout: Duration) -> anyhow::Result<Journal> {
    let mut request = url.into_client_request()?;
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse()?);
    let (socket, _) = tokio_tungstenite::connect_async(request).await?;
    let (mut sink, mut stream) = socket.split();
    let send = |id: u64, method: &str, params: Value| {
        Message::Text(
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
                .to_string()
                .into(),
        )
    };
    sink.send(send(1, "initialize", json!({"protocolVersion": 1})))
        .await?;
    sink.send(send(2, "session/load", json!({"sessionId": sid})))
        .await?;
    let mut journal = Journal {
        events: 0,
        accepted: HashSet::new(),
        delivered: 0,
        dropped: 0,
        cancel_receipts: 0,
    };
    loop {
        let message = tokio::time::timeout(timeout, stream.next())
            .await
            .map_err(|_| anyhow::anyhow!("replay of {sid} stalled"))?
            .context("the replay connection closed")??;
        let Message::Text(text) = message else {
            continue;
        };
        let frame: Value = serde_json::from_str(text.as_str())?;
        if frame["id"] == json!(2) {
            if let Some(error) = frame.get("error") {
                bail!("session/load {sid}: {error}");
            }
            break;
        }
        let params = &frame["params"];
        if params.pointer("/_meta/berth/replayed") != Some(&json!(true)) {
            continue;
        }
        journal.events += 1;
        if frame["method"] == "session/update" {
            if params
                .pointer("/update/messageId")
                .and_then(Value::as_str)
                .is_some()
            {
                journal.delivered += 1;
            }
            continue;
        }
        let event = &params["event"];
        match params["type"].as_str() {
            Some("injection_accepted") => {
                if let Some(id) = event
                    .pointer("/injection/message_id")
                    .and_then(Value::as_str)
                {
                    journal.accepted.insert(id.to_owned());
                }
            }
            Some("injection_dropped") => journal.dropped += 1,
            Some("control_outcome") if event["method"] == "session/cancel" => {
                journal.cancel_receipts += 1;
            }
            _ => {}
        }
    }
    let _ = sink.send(Message::Close(None)).await;
    Ok(journal)
}
