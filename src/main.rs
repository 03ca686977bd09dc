//! `berth`: the one binary. Thin by design: parse flags and config, build a
//! node, hand it to a transport.

mod config;
mod ctl;
mod heap;
mod integrity;
mod telemetry;

use std::process::ExitCode;

use anyhow::Context;
use berth_actors::{Node, NodeConfig};
use clap::{Parser, Subcommand};

use crate::config::{FileConfig, ServeArgs};

/// mimalloc instead of the system allocator: berth allocates many small,
/// short-lived objects across threads (JSON frames, events, actor messages),
/// where glibc's malloc spent about a quarter of the CPU in profiles of the
/// wake-up benchmark and held freed memory in per-thread arenas.
///
/// Built with `--features system-allocator`, berth keeps the system
/// allocator instead, so that heap profilers which intercept `malloc`
/// (heaptrack, valgrind's massif) see its allocations (README, "bench-ws").
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Opts the process out of transparent huge pages. mimalloc asks for them
/// (`MADV_HUGEPAGE`) on its arenas, and then each fresh 64 KiB allocator page
/// faults in, and zeroes, a whole 2 MiB page: in a `perf` profile of the
/// wake-up benchmark the kernel's page clearing was 15 % of berth's CPU, and
/// opting out cut CPU per session by about 8 %. A failure (an old kernel)
/// only costs that speed.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("berth: cannot opt out of transparent huge pages ({e}); continuing");
    }
}

/// Lets a one-shot command whose stdout is closed early (`berth verify |
/// head -1`) end quietly like any Unix tool, instead of panicking in
/// `println!`. Not for `serve`, whose stdout is a protocol stream: there a
/// closed pipe is an I/O error that ends the connection.
fn quiet_broken_pipe() {
    #[cfg(unix)]
    {
        use nix::sys::signal::{signal, SigHandler, Signal};
        // SAFETY: restoring the default disposition installs no handler
        // code; it runs before any other thread exists.
        if let Err(e) = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) } {
            eprintln!("berth: cannot restore SIGPIPE ({e}); continuing");
        }
    }
}

/// A durable, actor-based runtime for AI agent sessions.
#[derive(Parser)]
#[command(name = "berth", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve ACP (JSON-RPC 2.0, one message per line) on stdin/stdout, and on
    /// the control socket `<data dir>/berth.sock` for local tools.
    Serve(ServeArgs),
    /// External events that wake parked sessions.
    Event {
        #[command(subcommand)]
        command: EventCommand,
    },
    /// Standing schedules: a cron that prompts a session (Temporal Schedules).
    Schedule {
        #[command(subcommand)]
        command: ScheduleCommand,
    },
    /// The operator CLI: list, inspect, follow and drive the sessions of a
    /// running server, over its WebSocket (`--server`, `--token`) or the
    /// local control socket of its data dir.
    Ctl(ctl::CtlArgs),
    /// Checks every session's hash chain and signed receipts in a data dir
    /// (read-only; stop the server first). Prints `ok` or `tampered` (with the
    /// first bad event's id and what failed) per session; exits 2 when any
    /// session is tampered, 1 on any other failure. Keys: `BERTH_RECEIPT_KEYS`
    /// if set, else `<data dir>/receipt-keys.json`.
    Verify {
        /// The data directory [default: ./berth-data].
        #[arg(long, env = "BERTH_DATA_DIR")]
        data_dir: Option<std::path::PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Re-runs every turn of a session from the journal — recorded model
    /// responses, tool outcomes, clock readings and controls; no model is
    /// called, no tool runs — and checks that the engine makes the same
    /// decisions and produces byte-identical events and receipts (read-only;
    /// stop the server first). Exits 3 with the first differing event (seq,
    /// expected vs got) on non-determinism, 2 when `--verify` finds the log
    /// tampered, 1 on any other failure. Keys as for `verify`.
    Replay {
        /// The session id.
        session: String,
        /// The data directory [default: ./berth-data].
        #[arg(long, env = "BERTH_DATA_DIR")]
        data_dir: Option<std::path::PathBuf>,
        /// Check the session's hash chain and receipt signatures first.
        #[arg(long)]
        verify: bool,
        /// Print the report (or the error) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The receipt keyring (`<data dir>/receipt-keys.json`, mode 0600).
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Configuration files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Adds a new signing key; old keys keep verifying old receipts. A
    /// running server signs with the new key from its next start.
    Rotate {
        /// The data directory [default: ./berth-data].
        #[arg(long, env = "BERTH_DATA_DIR")]
        data_dir: Option<std::path::PathBuf>,
    },
    /// Lists the key ids (never the secrets) and which one signs, as JSON.
    List {
        /// The data directory [default: ./berth-data].
        #[arg(long, env = "BERTH_DATA_DIR")]
        data_dir: Option<std::path::PathBuf>,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validates a TOML config file: prints every problem as `FILE: key
    /// `KEY`: what is wrong` and exits 1, or prints a summary and exits 0.
    /// BERTH_* variables and flags are not applied (they are at `serve`).
    Check {
        /// The file.
        file: std::path::PathBuf,
    },
}

#[derive(Subcommand)]
enum ScheduleCommand {
    /// Creates a schedule; prints it as JSON.
    Create {
        /// The session each run prompts.
        #[arg(long)]
        session: String,
        /// Cron expression (`"0 9 * * 1-5"`).
        #[arg(long)]
        cron: String,
        /// IANA timezone [default: UTC].
        #[arg(long)]
        timezone: Option<String>,
        /// The prompt text each run sends.
        #[arg(long)]
        prompt: String,
        /// skip | buffer_one | allow_all [default: skip].
        #[arg(long)]
        overlap: Option<String>,
        /// Runs missed while berth was down fire at start-up if at most this
        /// late (ms).
        #[arg(long)]
        catchup_window_ms: Option<u64>,
        #[command(flatten)]
        server: ctl::Endpoint,
    },
    /// Lists schedules as JSON.
    List {
        #[command(flatten)]
        server: ctl::Endpoint,
    },
    /// Pauses a schedule.
    Pause {
        /// The schedule id.
        id: String,
        #[command(flatten)]
        server: ctl::Endpoint,
    },
    /// Unpauses a schedule (its next run is after now).
    Unpause {
        /// The schedule id.
        id: String,
        #[command(flatten)]
        server: ctl::Endpoint,
    },
    /// Deletes a schedule.
    Delete {
        /// The schedule id.
        id: String,
        #[command(flatten)]
        server: ctl::Endpoint,
    },
}

#[derive(Subcommand)]
enum EventCommand {
    /// Sends an event to a running `berth serve` (over `--server` with a
    /// token, else the control socket of its data dir); prints `{seq,
    /// receivedAt, woke}` as JSON.
    Emit(EmitArgs),
}

/// `berth event emit NAME [--data JSON]`.
#[derive(clap::Args)]
struct EmitArgs {
    /// The event name (`ci.passed`, `file.changed:src/lib.rs`).
    name: String,
    /// The payload, as JSON (the resume input of what it wakes).
    #[arg(long)]
    data: Option<String>,
    #[command(flatten)]
    server: ctl::Endpoint,
}

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_)) {
        heap::retain_freed_memory();
    } else {
        quiet_broken_pipe();
    }
    // Trace export is for the server; the other commands only log.
    let otlp = match &cli.command {
        Command::Serve(_) => telemetry::OtlpSettings::from_env()
            .and_then(|settings| settings.as_ref().map(telemetry::Otlp::start).transpose()),
        _ => Ok(None),
    };
    let otlp = match otlp {
        Ok(otlp) => otlp,
        Err(e) => {
            eprintln!("berth: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    telemetry::install(otlp.as_ref());
    let result = tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")
        .and_then(|rt| {
            let result = rt.block_on(async {
                let done = ExitCode::SUCCESS;
                match cli.command {
                    Command::Serve(args) => serve(args).await.map(|()| done),
                    Command::Event {
                        command: EventCommand::Emit(args),
                    } => emit(args).await.map(|()| done),
                    Command::Schedule { command } => schedule(command).await.map(|()| done),
                    Command::Verify { data_dir, json } => integrity::verify(data_dir, json),
                    Command::Replay {
                        session,
                        data_dir,
                        verify,
                        json,
                    } => tokio::task::spawn_blocking(move || {
                        integrity::replay(data_dir, &session, verify, json)
                    })
                    .await
                    .context("the replay thread failed")?,
                    Command::Keys {
                        command: KeysCommand::Rotate { data_dir },
                    } => integrity::rotate(data_dir).map(|()| done),
                    Command::Keys {
                        command: KeysCommand::List { data_dir },
                    } => integrity::list(data_dir).map(|()| done),
                    Command::Config {
                        command: ConfigCommand::Check { file },
                    } => match config::check_file(&file)? {
                        Ok(summary) => {
                            println!("{}: {summary}", file.display());
                            Ok(done)
                        }
                        Err(problems) => {
                            for p in &problems {
                                println!("{}: {p}", file.display());
                            }
                            anyhow::bail!("{} has {} problem(s)", file.display(), problems.len())
                        }
                    },
                    Command::Ctl(args) => Ok(ctl::run(args).await),
                }
            });
            // A stdin read may still be parked on a blocking thread after a
            // signal; do not wait for it.
            rt.shutdown_timeout(std::time::Duration::from_millis(100));
            result
        });
    // Spans still queued are exported before the process ends.
    if let Some(otlp) = otlp {
        otlp.shutdown();
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("berth: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Not dumpable: processes of berth's own user (every tool process runs
    // as it) cannot read /proc/<berth>/environ or mem, nor ptrace berth or a
    // supervisor forked from it; no core dump carries berth's secrets. A
    // child that execs is dumpable again, so tools are unaffected.
    nix::sys::prctl::set_dumpable(false)
        .context("cannot make berth undumpable (prctl PR_SET_DUMPABLE)")?;
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let api_keys = std::env::var("BERTH_API_KEYS").ok();
    let settings = file.merge(&args, api_keys.as_deref())?;
    // Stopped when dropped, as `serve` returns.
    let _pretouch = heap::Pretouch::start(settings.heap_pretouch_mib)
        .inspect_err(|e| {
            tracing::warn!(error = %e, "cannot start the heap pre-touch thread; the heap faults in as it grows");
        })
        .ok();
    let mut node_config = NodeConfig::new(&settings.data_dir, settings.model);
    node_config.max_model_calls = settings.max_model_calls;
    node_config.quick_repair = settings.quick_repair;
    node_config.journal_cache_bytes = settings.journal_cache_bytes;
    if let Some(ms) = settings.passivate_after_ms {
        node_config.passivate_after_ms = ms;
    }
    node_config.max_live_sessions = settings.max_live_sessions;
    node_config.realtime_timers = settings.realtime_timers;
    node_config.needs_approval = settings.require_approval;
    node_config.budgets = settings.budgets;
    node_config.prices = settings.prices;
    node_config.receipt_keys = integrity::keys_from_env()?;
    node_config.tools =
        berth_runtime::tools::ToolSet::builtin_with(std::sync::Arc::new(settings.tool_env));
    if settings.completion_judge {
        node_config.completion_judge = Some(std::sync::Arc::new(
            berth_runtime::directives::ObjectiveJudge,
        ));
    }
    // Tool processes run as berth's user: Landlock keeps them out of the
    // data dir (journal, receipt keys, control socket file) where the kernel
    // has it.
    if !berth_runtime::tools::supervisor::confine_from(std::slice::from_ref(&settings.data_dir)) {
        tracing::warn!(
            data_dir = %settings.data_dir.display(),
            "this kernel has no Landlock: tool processes are not confined from the data dir"
        );
    }
    let node = Node::start(node_config).await.with_context(|| {
        format!(
            "cannot start berth on data dir {}",
            settings.data_dir.display()
        )
    })?;
    // The control socket is a convenience for local tools: berth serves
    // stdio without it (e.g. when the path is over the OS limit).
    let socket_path = settings.data_dir.join(CONTROL_SOCKET);
    let mut socket = match berth_acp::transport::local::LocalSocket::bind(&socket_path) {
        Ok(socket) => Some(socket),
        Err(e) => {
            tracing::warn!(path = %socket_path.display(), error = %e, "no control socket");
            None
        }
    };
    tracing::info!(
        data_dir = %settings.data_dir.display(),
        model = node.config().model.name(),
        control_socket = ?socket.as_ref().map(|s| s.path().display().to_string()),
        "berth serving ACP on stdio"
    );
    let local = async {
        match socket.as_mut() {
            Some(socket) => socket.serve(node.clone(), settings.acp).await,
            None => std::future::pending().await,
        }
    };
    let ws_shutdown = tokio_util::sync::CancellationToken::new();
    let http = match settings.http {
        Some(http) => Some(
            bind_http(
                &node,
                http,
                settings.acp,
                settings.a2a.map(|a2a| (a2a, settings.a2a_anonymous_role)),
                ws_shutdown.clone(),
            )
            .await?,
        ),
        None => None,
    };
    // With a network listener berth is a server: stdin ending (a daemon's
    // /dev/null) ends only the stdio client, not the node.
    let network = http.is_some();
    let stdio_stop = tokio_util::sync::CancellationToken::new();
    let stdio = async {
        let served = berth_acp::transport::stdio::serve_stdio(
            node.clone(),
            settings.acp,
            stdio_stop.clone(),
        )
        .await;
        if network && served.is_ok() && !stdio_stop.is_cancelled() {
            tracing::info!("stdin closed; serving the HTTP listener until SIGTERM or SIGINT");
            stdio_stop.cancelled().await;
        }
        served
    };
    tokio::pin!(stdio);
    let mut stdio_done = false;
    let http_shutdown = tokio_util::sync::CancellationToken::new();
    let http_served = {
        let stop = http_shutdown.clone();
        async move {
            match http {
                Some(server) => server.serve(async move { stop.cancelled().await }).await,
                None => std::future::pending().await,
            }
        }
    };
    let served = tokio::select! {
        served = http_served => served.context("HTTP listener failed"),
        served = local => served.context("control socket failed"),
        served = &mut stdio => {
            stdio_done = true;
            served.context("stdio transport failed")
        }
        signal = shutdown_signal() => {
            tracing::info!(signal = %signal?, "shutting down: running turns are sealed at the next start");
            Ok(())
        }
    };
    if !stdio_done {
        // The stdio client gets the frames already decided for it, whole,
        // if it reads them in time; then berth goes on stopping.
        stdio_stop.cancel();
        if tokio::time::timeout(STDOUT_DRAIN_GRACE, &mut stdio)
            .await
            .is_err()
        {
            tracing::warn!(
                grace_ms = STDOUT_DRAIN_GRACE.as_millis() as u64,
                "the stdio client did not read its last frames in time; stdout may end mid-frame"
            );
        }
    }
    // WebSocket clients are told (close 1001) before the node stops.
    ws_shutdown.cancel();
    http_shutdown.cancel();
    // Stops every session actor: their processes are killed; a turn still
    // running stays open in the journal and is sealed at the next start.
    node.shutdown().await;
    served
}

/// Composes and binds the HTTP listener: the ops routes, ACP over WebSocket
/// at `/acp` and A2A 1.0 (JSON-RPC at `/`, behind the tokens; the agent card
/// at `/.well-known/agent-card.json`, public).
async fn bind_http(
    node: &Node,
    http: config::HttpSettings,
    acp: berth_acp::ServeOptions,
    a2a: Option<(berth_a2a::A2aOptions, Option<berth_actors::Role>)>,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<berth_http::BoundServer> {
    let ws = berth_acp::transport::websocket::WsOptions {
        acp,
        max_connections: http.ws_max_connections,
        max_outbound_bytes: http.ws_max_outbound_bytes,
        ping_interval: http.ws_ping_interval,
        send_timeout: http.ws_send_timeout,
        stats: Default::default(),
        shutdown,
    };
    let tokens = http.config.tokens.len();
    let mut builder = berth_http::HttpServer::builder(node.clone(), http.config)
        .mount(berth_acp::transport::websocket::router(node.clone(), ws));
    if let Some((options, anonymous)) = a2a {
        let (card, rpc) = berth_a2a::routers(node.clone(), options);
        builder = builder.mount_public(card);
        // Tokenless callers (when configured) act as one fixed principal,
        // confined to the contexts they created; a presented token decides.
        let anonymous =
            anonymous.map(|role| berth_actors::Principal::new(berth_a2a::ANONYMOUS_ACTOR, role));
        builder = builder.mount_jsonrpc(rpc, anonymous);
    }
    let server = builder.build()?.bind().await?;
    // One parseable line for scripts and tests (the port when 0 was asked).
    tracing::info!(
        listen = %server.local_addr(),
        tls = server.is_tls(),
        tokens,
        "berth HTTP listener ready"
    );
    eprintln!(
        "berth: listening on {}://{}",
        if server.is_tls() { "https" } else { "http" },
        server.local_addr()
    );
    if !server.is_tls() && !server.local_addr().ip().is_loopback() {
        // Bearer tokens would cross the network in clear text.
        eprintln!(
            "berth: warning: {} is reachable from other hosts without TLS; tokens travel in clear text (set tls_cert/tls_key, or listen on 127.0.0.1 behind a TLS proxy)",
            server.local_addr()
        );
    }
    Ok(server)
}

/// The data dir a command works on: `dir` (flag, `BERTH_DATA_DIR` or the
/// config file), else `./berth-data`, made absolute against the current
/// directory once, at start (lexically: it may not exist yet), so that
/// every path derived from it (session roots, the socket, the journal) is
/// absolute too.
///
/// # Errors
/// When the current directory cannot be read.
pub(crate) fn absolute_data_dir(
    dir: Option<std::path::PathBuf>,
) -> anyhow::Result<std::path::PathBuf> {
    let dir = dir.unwrap_or_else(|| std::path::PathBuf::from("berth-data"));
    std::path::absolute(&dir)
        .with_context(|| format!("cannot make the data dir {} absolute", dir.display()))
}

/// The control socket's file name in the data dir.
pub(crate) const CONTROL_SOCKET: &str = "berth.sock";

/// `berth event emit`: one `_berth/event.emit` request (over `--server` or
/// the control socket); the answer is printed as JSON, an error is the exit
/// status.
async fn emit(args: EmitArgs) -> anyhow::Result<()> {
    ctl::check_endpoint(&args.server)?;
    let data: serde_json::Value = match &args.data {
        Some(text) => serde_json::from_str(text).context("--data is not JSON")?,
        None => serde_json::Value::Null,
    };
    let params = serde_json::json!({"name": args.name, "data": data});
    let answer = ctl::call(&args.server, "_berth/event.emit", params).await?;
    println!("{answer}");
    Ok(())
}

/// `berth schedule …`: `_berth/schedule.*` (over `--server` or the control
/// socket).
async fn schedule(command: ScheduleCommand) -> anyhow::Result<()> {
    use serde_json::json;
    let (server, method, params) = match command {
        ScheduleCommand::Create {
            session,
            cron,
            timezone,
            prompt,
            overlap,
            catchup_window_ms,
            server,
        } => (
            server,
            "create",
            json!({"sessionId": session, "cron": cron, "timezone": timezone, "prompt": prompt,
                   "overlap": overlap, "catchupWindowMs": catchup_window_ms}),
        ),
        ScheduleCommand::List { server } => (server, "list", json!({})),
        ScheduleCommand::Pause { id, server } => (server, "pause", json!({"scheduleId": id})),
        ScheduleCommand::Unpause { id, server } => (server, "unpause", json!({"scheduleId": id})),
        ScheduleCommand::Delete { id, server } => (server, "delete", json!({"scheduleId": id})),
    };
    ctl::check_endpoint(&server)?;
    let method = format!("_berth/schedule.{method}");
    let answer = ctl::call(&server, &method, params).await?;
    println!("{answer}");
    Ok(())
}

/// How long a stopping `berth serve` waits for its stdio client to read the
/// frames already queued for it (a client that has stopped reading would
/// hold it forever).
const STDOUT_DRAIN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Resolves with the name of the first SIGTERM or SIGINT.
async fn shutdown_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
