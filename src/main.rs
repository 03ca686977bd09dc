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
            rt.block_on(async {
                match cli.command {
                    Command::Serve(args) => serve(args).await,
                }
            })
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
    let served = berth_acp::transport::stdio::serve_stdio(node.clone(), settings.acp).await;
    node.shutdown().await;
    served.context("stdio transport failed")
}
