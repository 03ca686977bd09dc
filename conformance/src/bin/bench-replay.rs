//! `bench-replay`: how fast `berth replay` re-runs a session, in events per
//! second. A measurement tool, not a test: it prints figures and asserts on
//! none.
//!
//! ```text
//! cargo run --release -p berth-conformance --bin bench-replay -- --help
//! ```
//!
//! 1. **Record.** An in-process node (`berth_actors::Node`: the real journal
//!    with group commit and the replay tape, system clock, random ids, the
//!    `scripted` model, the built-in tools) runs one session until its log
//!    holds at least `--events` events (default 10,000): prompts whose
//!    script streams a thought and `--chunks` text deltas, then a parallel
//!    batch of two `read_file` calls, a `write_file`, then a closing text;
//!    every `--park-every`th turn is followed by an idle `session/suspend`
//!    and a `session/resume` with input, which starts a fresh turn
//!    (suspension and resumption receipts).
//!    Recording time is printed, not part of the figure.
//! 2. **Replay.** The node's runtime is dropped (the journal released), then
//!    `berth_actors::replay::replay_session` runs `--repeat` times over the
//!    session — read the log, re-run every turn through the engine with the
//!    tape's stand-ins, re-derive every exit and receipt, compare every
//!    event byte for byte — and, separately, with `--verify` semantics (the
//!    session's hash chain and signatures checked first). Each run prints
//!    its wall time and events/s (events in the log ÷ wall time), plus how
//!    many were re-derived and how many receipts were re-signed.
//!
//! The session directory is removed before replaying: replay runs no tool.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use berth_actors::node::{NewSession, ResumeParams, SuspendParams};
use berth_actors::replay::{replay_session, ReplayOptions, ReplayReport};
use berth_actors::{Node, NodeConfig};
use berth_runtime::content::Prompt;
use berth_runtime::ids::SessionId;
use berth_runtime::model::scripted::ScriptedModel;
use berth_runtime::model::ModelProvider;
use berth_runtime::suspension::{Initiator, ResumeCause, SuspendMode};
use berth_storage::Keyring;
use clap::Parser;
use serde_json::json;

/// Measures `berth replay`'s speed on a long session.
#[derive(Parser, Debug)]
#[command(name = "bench-replay")]
struct Args {
    /// Events the recorded session holds at least.
    #[arg(long, default_value_t = 10_000)]
    events: u64,
    /// Text deltas each model answer streams before its tool batch.
    #[arg(long, default_value_t = 6)]
    chunks: usize,
    /// Every N-th turn is followed by an idle suspend and a resume with
    /// input (0: never).
    #[arg(long, default_value_t = 25)]
    park_every: usize,
    /// Replays timed (each over the whole session).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Record into this data directory (kept) instead of a temporary one.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

fn script(chunks: usize) -> String {
    let deltas: Vec<String> = (0..chunks)
        .map(|i| format!(r#"{{ text = "part {i} of the answer to {{input}}. " }}"#))
        .collect();
    format!(
        r#"
fallback = "noted: {{input}}"

[[rules]]
match = "task"
steps = [
  {{ thought = "Reading both files, then writing the result." }},
  {},
  {{ tool_calls = [
      {{ name = "read_file", arguments = {{ path = "{{cwd}}/a.txt" }} }},
      {{ name = "read_file", arguments = {{ path = "{{cwd}}/b.txt" }} }},
  ] }},
  {{ tool_call = {{ name = "write_file", arguments = {{ path = "{{cwd}}/out.txt", content = "{{last_tool_result}}" }} }} }},
  {{ text = "Done with {{input}}." }},
]
"#,
        deltas.join(",\n  ")
    )
}

/// Records the session; returns its id and the events it holds.
async fn record(
    data: &Path,
    cwd: &Path,
    keys: &Keyring,
    args: &Args,
) -> anyhow::Result<(SessionId, u64)> {
    let model = ScriptedModel::parse(&script(args.chunks), "toml", "scripted:bench-replay")
        .map_err(|e| anyhow::anyhow!(e))?;
    let mut config = NodeConfig::new(data, Arc::new(model) as Arc<dyn ModelProvider>);
    config.receipt_keys = Some(keys.clone());
    let node = Node::start(config).await?;
    let session = node
        .new_session(NewSession::in_dir(cwd.to_path_buf()))
        .await?
        .session_id;
    let mut turns = 0usize;
    loop {
        let events = node.journal().last_event_id(&session)?;
        if events >= args.events {
            node.shutdown().await;
            return Ok((session, events));
        }
        turns += 1;
        node.prompt(&session, Prompt::text(format!("task {turns}")))
            .await?;
        if args.park_every > 0 && turns.is_multiple_of(args.park_every) {
            node.suspend(
                &session,
                SuspendParams {
                    mode: SuspendMode::FinishStep,
                    reason: Some("bench".into()),
                    resume_when: None,
                    actor: "bench".into(),
                    initiator: Initiator::Client,
                    require_running: false,
                },
            )
            .await?;
            // A resume with input starts a fresh turn; wait for it to end.
            let before = node.journal().last_event_id(&session)?;
            node.resume(
                &session,
                ResumeParams {
                    handle: None,
                    input: Some(json!({"task": turns, "note": "carry on"})),
                    continue_transcript: true,
                    cause: ResumeCause::ExplicitResume,
                    actor: "bench".into(),
                    lateness_ms: None,
                    message_id: None,
                    trigger: None,
                },
            )
            .await?;
            wait_turn_end(&node, &session, before).await?;
        }
    }
}

/// Waits (polling the journal; this is the recording phase, not measured)
/// until a `turn_ended` after event `after` is journaled.
async fn wait_turn_end(node: &Node, session: &SessionId, after: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ended = node
            .journal()
            .events(session, after)?
            .iter()
            .any(|(_, r)| r.event.type_name() == "turn_ended");
        if ended {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the resumed turn did not end within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn replay(
    journal: &Path,
    keys: &Keyring,
    session: &SessionId,
    verify: bool,
) -> anyhow::Result<(Duration, ReplayReport)> {
    let options = ReplayOptions {
        verify,
        ..ReplayOptions::default()
    };
    let started = Instant::now();
    let report = replay_session(journal, keys, session, &options)?;
    Ok((started.elapsed(), report))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let temp = tempfile::tempdir()?;
    let data = args
        .data_dir
        .clone()
        .unwrap_or_else(|| temp.path().join("data"));
    let cwd = temp.path().join("work");
    std::fs::create_dir_all(&cwd)?;
    let cwd = cwd.canonicalize()?;
    std::fs::write(cwd.join("a.txt"), "alpha")?;
    std::fs::write(cwd.join("b.txt"), "beta")?;
    let keys = Keyring::from_keys(vec![("bench".into(), vec![42; 32])])?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let started = Instant::now();
    let (session, events) = rt.block_on(record(&data, &cwd, &keys, &args))?;
    let recorded = started.elapsed();
    // Every task of the node goes with its runtime: the journal is released.
    drop(rt);
    std::fs::remove_dir_all(&cwd).context("removing the session directory")?;
    let journal = data.join("journal.redb");
    let size = std::fs::metadata(&journal).map(|m| m.len()).unwrap_or(0);
    println!("== berth replay speed ==");
    println!(
        "recorded   session {session}: {events} events in {:.1} s (journal {:.1} MiB; not measured)",
        recorded.as_secs_f64(),
        size as f64 / (1024.0 * 1024.0)
    );
    for (label, verify) in [("replay", false), ("replay --verify", true)] {
        for run in 1..=args.repeat {
            let (took, report) = replay(&journal, &keys, &session, verify)?;
            println!(
                "{label:<16} run {run}: {:>8.1} ms  {:>9.0} events/s  ({} events, {} turn runs, {} reproduced byte for byte, {} receipts re-signed, {} inputs)",
                took.as_secs_f64() * 1e3,
                report.events as f64 / took.as_secs_f64(),
                report.events,
                report.runs.len(),
                report.reproduced,
                report.receipts,
                report.inputs
            );
        }
    }
    Ok(())
}
