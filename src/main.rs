//! `berth`: the one binary. Thin by design: parse flags and config, build a
//! node, hand it to a transport.

mod config;

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use berth_actors::{Node, NodeConfig};
use clap::{Parser, Subcommand};

use crate::config::{FileConfig, ServeArgs};

/// A durable, actor-based runtime for AI agent sessions.
#[derive(Parser)]
#[command(name = "berth", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve ACP (JSON-RPC 2.0, one message per line) on stdin/stdout.
    Serve(ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let result = tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")
        .and_then(|rt| {
            let result = rt.block_on(async {
                match cli.command {
                    Command::Serve(args) => serve(args).await,
                }
            });
            // A stdin read may still be parked on a blocking thread after a
            // signal; do not wait for it.
            rt.shutdown_timeout(std::time::Duration::from_millis(100));
            result
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("berth: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let settings = file.merge(&args)?;
    let mut node_config = NodeConfig::new(&settings.data_dir, settings.model);
    node_config.max_model_calls = settings.max_model_calls;
    node_config.quick_repair = settings.quick_repair;
    node_config.needs_approval = settings.require_approval;
    if settings.completion_judge {
        node_config.completion_judge = Some(std::sync::Arc::new(
            berth_runtime::directives::ObjectiveJudge,
        ));
    }
    let node = Node::start(node_config).await.with_context(|| {
        format!(
            "cannot start berth on data dir {}",
            settings.data_dir.display()
        )
    })?;
    tracing::info!(
        data_dir = %settings.data_dir.display(),
        model = node.config().model.name(),
        "berth serving ACP on stdio"
    );
    let served = tokio::select! {
        served = berth_acp::transport::stdio::serve_stdio(node.clone(), settings.acp) => {
            served.context("stdio transport failed")
        }
        signal = shutdown_signal() => {
            tracing::info!(signal = %signal?, "shutting down: running turns are sealed at the next start");
            Ok(())
        }
    };
    // Stops every session actor: their processes are killed; a turn still
    // running stays open in the journal and is sealed at the next start.
    node.shutdown().await;
    served
}

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
