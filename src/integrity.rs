//! `berth verify`, `berth replay` and `berth keys …`: the receipt keyring,
//! the journal's integrity check and deterministic replay, from the command
//! line (see `berth_storage::keyring`, `berth_storage::verify` and
//! `berth_actors::replay`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use berth_actors::replay::{replay_session, CutCause, ReplayError, ReplayOptions};
use berth_runtime::ids::SessionId;
use berth_storage::verify::{verify_journal, Verdict};
use berth_storage::{KeyOrigin, Keyring};

/// The environment variable that gives the receipt keys instead of the key
/// file: `KEY_ID:HEX_SECRET[,KEY_ID:HEX_SECRET…]`, the last one signing.
pub const KEYS_ENV: &str = "BERTH_RECEIPT_KEYS";

/// Exit status of `berth verify` (and `berth replay --verify`) when a
/// session is tampered (1 is any other failure).
const EXIT_TAMPERED: u8 = 2;

/// Exit status of `berth replay` when the replay diverges from the journal.
const EXIT_NONDETERMINISM: u8 = 3;

/// The keyring `BERTH_RECEIPT_KEYS` gives, if it is set (and not empty).
///
/// # Errors
/// The variable does not parse (the message names the bad entry).
pub fn keys_from_env() -> anyhow::Result<Option<Keyring>> {
    match std::env::var(KEYS_ENV) {
        Ok(value) if !value.trim().is_empty() => Ok(Some(Keyring::parse(&value)?)),
        _ => Ok(None),
    }
}

fn data_dir(dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    crate::absolute_data_dir(dir)
}

/// Refuses a data dir that does not exist, before anything is looked for
/// in it (so the error names the dir, not a key file inside it).
fn existing(dir: &Path) -> anyhow::Result<()> {
    if !dir.is_dir() {
        anyhow::bail!(
            "no data dir at {}: pass the --data-dir a berth served",
            dir.display()
        );
    }
    Ok(())
}

/// The keyring for `dir`: `BERTH_RECEIPT_KEYS` if set, else the key file.
fn keyring_for(dir: &Path) -> anyhow::Result<Keyring> {
    match keys_from_env()? {
        Some(keyring) => Ok(keyring),
        None => Keyring::load(dir).with_context(|| {
            format!(
                "cannot load the receipt keys of {} (set {KEYS_ENV} if the server got its keys from it)",
                dir.display()
            )
        }),
    }
}

/// `berth replay SESSION`: re-runs the session's turns from the journal
/// (`berth_actors::replay`), read-only. Prints a summary (or the report as
/// JSON with `json`); on a divergence prints the first differing event and
/// exits 3; with `verify`, a tampered log exits 2.
///
/// # Errors
/// No journal, a running server holds it, another format, no keys, an
/// unknown session, a log that cannot be replayed (printed, exit 1).
pub fn replay(
    dir: Option<PathBuf>,
    session: &str,
    verify: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let dir = data_dir(dir)?;
    existing(&dir)?;
    let keyring = keyring_for(&dir)?;
    let options = ReplayOptions {
        verify,
        ..ReplayOptions::default()
    };
    let session_id = SessionId::from(session);
    match replay_session(&journal_path(&dir), &keyring, &session_id, &options) {
        Ok(report) => {
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                if let Some(v) = report.verified {
                    println!(
                        "verified  {session}  {} events, {} signed receipts",
                        v.events, v.receipts
                    );
                }
                for run in &report.runs {
                    println!(
                        "run       {} ({}, events {}..{}): {} model call(s), {} tool execution(s), {}",
                        run.turn_id,
                        run.kind,
                        run.first_seq,
                        run.last_seq,
                        run.model_calls,
                        run.tool_calls,
                        run.exit
                    );
                }
                match &report.cut_short {
                    Some(cut) if cut.cause == CutCause::LogEnds => println!(
                        "stopped   at the end of the log (turn {}, events from {}): berth stopped while this turn ran and has not been started on this journal since; everything journaled replayed",
                        cut.turn_id, cut.seq
                    ),
                    Some(cut) => println!(
                        "stopped   at event {} (turn {}): berth restarted under this turn and sealed or parked it from a checkpoint the journal does not keep; everything before it replayed",
                        cut.seq, cut.turn_id
                    ),
                    None => {}
                }
                println!(
                    "replayed  {session}  {} events: {} reproduced byte for byte ({} signed receipts re-signed identically), {} recorded inputs",
                    report.events, report.reproduced, report.receipts, report.inputs
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            let code = match &error {
                ReplayError::Nondeterminism(_) => ExitCode::from(EXIT_NONDETERMINISM),
                ReplayError::Tampered { .. } => ExitCode::from(EXIT_TAMPERED),
                _ => ExitCode::FAILURE,
            };
            if json {
                let divergence = match &error {
                    ReplayError::Nondeterminism(d) => serde_json::to_value(d)?,
                    _ => serde_json::Value::Null,
                };
                let out = serde_json::json!({
                    "sessionId": session,
                    "error": {
                        "kind": error.kind(),
                        "message": error.to_string(),
                        "divergence": divergence,
                    },
                });
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                eprintln!("berth replay: {error}");
            }
            Ok(code)
        }
    }
}

/// `berth verify`: checks every session's chain and receipts, read-only.
/// Prints a line per session (or the report as JSON with `json`); exits 2 when
/// any session is tampered.
///
/// # Errors
/// No journal, a running server holds it, another format, no keys.
pub fn verify(dir: Option<PathBuf>, json: bool) -> anyhow::Result<ExitCode> {
    let dir = data_dir(dir)?;
    existing(&dir)?;
    let keyring = keyring_for(&dir)?;
    let report = match verify_journal(&journal_path(&dir), &keyring) {
        Ok(report) => report,
        // Damage below the chain is tampering too, only not attributable
        // to one event: reported as such, with the tampered exit code.
        Err(e @ berth_storage::StorageError::Corrupt { table, .. }) => {
            // The journal is two files: name the one that is damaged.
            let file = if table == "commit_log" {
                dir.join("journal.log")
            } else {
                journal_path(&dir)
            };
            if json {
                println!(
                    "{}",
                    serde_json::json!({"journal": journal_path(&dir).display().to_string(), "file": file.display().to_string(), "damaged": e.to_string()})
                );
            } else {
                println!("damaged   {}: {e}", file.display());
            }
            return Ok(ExitCode::from(EXIT_TAMPERED));
        }
        Err(e) => return Err(e.into()),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "journal {} (format {}, keys {}){}",
            report.journal,
            report.format,
            report.keys.join(","),
            if report.repaired_copy {
                "; crash-repaired in a temporary copy"
            } else {
                ""
            }
        );
        if !report.rows_covered {
            println!(
                "note      format {} predates sealed rows: transcripts, checkpoints, frames, \
                 suspensions and open turns are not covered (a berth opening the data dir \
                 seals them as they are then)",
                report.format
            );
        }
        for session in &report.sessions {
            match (&session.status, &session.first_bad) {
                (Verdict::Tampered, Some(bad)) => println!(
                    "tampered  {}  at {} ({:?}): {}",
                    session.session_id,
                    bad.location(),
                    bad.check,
                    bad.message
                ),
                _ => println!(
                    "ok        {}  {} events, {} signed receipts",
                    session.session_id, session.events, session.receipts
                ),
            }
        }
        println!(
            "{} session(s): {} ok, {} tampered",
            report.sessions.len(),
            report.ok,
            report.tampered
        );
    }
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_TAMPERED)
    })
}

fn journal_path(dir: &Path) -> PathBuf {
    dir.join("journal.redb")
}

/// `berth keys rotate`: a new signing key in the data dir's key file (created
/// if missing); old keys stay for verification. Prints the key list as JSON.
///
/// # Errors
/// The key file cannot be read or written.
pub fn rotate(dir: Option<PathBuf>) -> anyhow::Result<()> {
    let dir = data_dir(dir)?;
    if keys_from_env()?.is_some() {
        tracing::warn!("{KEYS_ENV} is set: a server started with it signs with its keys, not the key file; rotate by appending an entry to {KEYS_ENV}");
    }
    let keyring = Keyring::rotate(&dir, chrono::Utc::now())?;
    print_keys(&keyring)
}

/// `berth keys list`: the key ids (never the secrets), which one signs, and
/// where they come from, as JSON.
///
/// # Errors
/// No keys, or they do not load.
pub fn list(dir: Option<PathBuf>) -> anyhow::Result<()> {
    let dir = data_dir(dir)?;
    let keyring = match keys_from_env()? {
        Some(keyring) => keyring,
        None => {
            existing(&dir)?;
            Keyring::load(&dir)?
        }
    };
    print_keys(&keyring)
}

fn print_keys(keyring: &Keyring) -> anyhow::Result<()> {
    let source = match keyring.origin() {
        KeyOrigin::File(path) => path.display().to_string(),
        KeyOrigin::Environment => KEYS_ENV.to_owned(),
        KeyOrigin::Given => "given".to_owned(),
    };
    let out = serde_json::json!({
        "source": source,
        "active": keyring.active_key_id(),
        "keys": keyring.keys(),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
