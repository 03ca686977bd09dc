//! `bench-http-flood`: `/healthz` latency while the HTTP listener is
//! flooded with slowloris connections.
//!
//! Loopback only: it starts its own `berth serve --listen 127.0.0.1:0` (the
//! release build, or `$BERTH_BIN`) on a fresh data dir with the listener's
//! default bounds (1,024 connections, 10 s header-read timeout, 30 s idle
//! timeout), then
//!
//! 1. measures `/healthz` with no flood (`--probes` requests, each on a
//!    fresh connection, one every `--probe-interval-ms`);
//! 2. opens `--connections` slowloris connections (default 2,000: each sends
//!    a request line, then one header line every `--trickle-ms`, never the
//!    end of the head) and keeps that many open for the rest of the run,
//!    reconnecting each one the server closes, as an attacker would;
//! 3. once they are all open, measures `/healthz` the same way again.
//!
//! It prints the p50/p99/max latency of both phases, how many probes got no
//! answer within `--probe-timeout-ms` (each counts as a failure: exit 1),
//! and how many times the server closed a slowloris connection.
//!
//! ```sh
//! cargo build --release --bin berth
//! cargo run --release -p berth-conformance --bin bench-http-flood -- --connections 2000
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use berth_conformance::host;
use berth_conformance::stats::LatencySummary;
use clap::Parser;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "bench-http-flood-token-0123456789";

#[derive(Parser, Debug)]
#[command(about = "/healthz latency under a slowloris connection flood")]
struct Args {
    /// Slowloris connections held open.
    #[arg(long, default_value_t = 2000)]
    connections: usize,
    /// Pause between two header lines of a slowloris connection (ms).
    #[arg(long, default_value_t = 5000)]
    trickle_ms: u64,
    /// `/healthz` probes per phase.
    #[arg(long, default_value_t = 200)]
    probes: usize,
    /// Pause between two probes (ms).
    #[arg(long, default_value_t = 50)]
    probe_interval_ms: u64,
    /// A probe not answered within this counts as a failure (ms).
    #[arg(long, default_value_t = 5000)]
    probe_timeout_ms: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("bench-http-flood: {e:#}");
            ExitCode::from(2)
        }
    }
}

struct Berth {
    child: tokio::process::Child,
    addr: String,
}

async fn start_berth(dir: &Path) -> anyhow::Result<Berth> {
    let bin: PathBuf = host::berth_binary("BERTH_BIN=…")?;
    let config = dir.join("berth.toml");
    std::fs::write(&config, "[http]\nlisten = \"127.0.0.1:0\"\n")?;
    let mut child = tokio::process::Command::new(&bin)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--model")
        .arg("scripted")
        .env("BERTH_API_KEYS", format!("{TOKEN}=bench:observer"))
        .env("BERTH_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let stderr = child.stderr.take().context("no stderr")?;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.strip_prefix("berth: listening on http://") {
                return Some(rest.trim().to_owned());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .context("berth did not announce its listener within 30 s")?;
    // Keep draining its log so berth never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Berth { child, addr })
}

/// One `/healthz` on a fresh connection: the time to the end of the answer.
async fn probe(addr: &str, timeout: Duration) -> Option<Duration> {
    let started = Instant::now();
    let answered = tokio::time::timeout(timeout, async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: berth\r\nconnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        answer.starts_with(b"HTTP/1.1 200").then_some(())
    })
    .await;
    matches!(answered, Ok(Some(()))).then(|| started.elapsed())
}

async fn phase(args: &Args, addr: &str, name: &str) -> usize {
    let mut samples = Vec::with_capacity(args.probes);
    let mut failures = 0;
    for _ in 0..args.probes {
        match probe(addr, Duration::from_millis(args.probe_timeout_ms)).await {
            Some(latency) => samples.push(latency),
            None => failures += 1,
        }
        tokio::time::sleep(Duration::from_millis(args.probe_interval_ms)).await;
    }
    match LatencySummary::from_samples(&mut samples) {
        Some(s) => println!(
            "{name}: /healthz p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} answered, {failures} unanswered within {} ms)",
            s.p50_us as f64 / 1000.0,
            s.p99_us as f64 / 1000.0,
            s.max_us as f64 / 1000.0,
            s.count,
            args.probe_timeout_ms
        ),
        None => println!("{name}: no /healthz probe answered ({failures} unanswered)"),
    }
    failures
}

/// One slowloris connection, reopened whenever the server closes it.
async fn slowloris(addr: String, trickle: Duration, open: Arc<AtomicU64>, closed: Arc<AtomicU64>) {
    let mut counted = false;
    loop {
        let Ok(mut stream) = TcpStream::connect(&addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if !counted {
            open.fetch_add(1, Ordering::Relaxed);
            counted = true;
        }
        if stream.write_all(b"GET /healthz HTTP/1.1\r\n").await.is_ok() {
            let mut buf = [0u8; 256];
            for i in 0u64.. {
                // Wait one trickle interval, or until the server closes us.
                if let Ok(Ok(0) | Err(_)) =
                    tokio::time::timeout(trickle, stream.read(&mut buf)).await
                {
                    break;
                }
                let line = format!("x-slow-{i}: 1\r\n");
                if stream.write_all(line.as_bytes()).await.is_err() {
                    break;
                }
            }
        }
        closed.fetch_add(1, Ordering::Relaxed);
    }
}

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
    raise_fd_limit(args.connections as u64 + 256)?;
    let dir = tempfile::tempdir()?;
    let mut berth = start_berth(dir.path()).await?;
    let addr = berth.addr.clone();
    println!(
        "berth listening on {addr}; {} slowloris connections, a header line every {} ms",
        args.connections, args.trickle_ms
    );
    let mut failures = phase(args, &addr, "baseline").await;
    let open = Arc::new(AtomicU64::new(0));
    let closed = Arc::new(AtomicU64::new(0));
    let mut flood = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        flood.push(tokio::spawn(slowloris(
            addr.clone(),
            Duration::from_millis(args.trickle_ms),
            Arc::clone(&open),
            Arc::clone(&closed),
        )));
    }
    let started = Instant::now();
    while open.load(Ordering::Relaxed) < args.connections as u64 {
        if started.elapsed() > Duration::from_secs(60) {
            bail!(
                "only {} of {} slowloris connections opened in 60 s",
                open.load(Ordering::Relaxed),
                args.connections
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    failures += phase(args, &addr, "flooded").await;
    println!(
        "slowloris connections the server closed during the run: {}",
        closed.load(Ordering::Relaxed)
    );
    for task in flood {
        task.abort();
    }
    let _ = berth.child.kill().await;
    Ok(failures == 0)
}
