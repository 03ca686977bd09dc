//! `berth verify` and `berth keys …`: the receipt keyring and the journal's
//! integrity check, from the command line (see `berth_storage::keyring` and
//! `berth_storage::verify`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use berth_storage::verify::{verify_journal, Verdict};
use berth_storage::{KeyOrigin, Keyring};

/// The environment variable that gives the receipt keys instead of the key
/// file: `KEY_ID:HEX_SECRET[,KEY_ID:HEX_SECRET…]`, the last one signing.
pub const KEYS_ENV: &str = "BERTH_RECEIPT_KEYS";

/// Exit status of `berth verify` when a session is tampered (1 is any other
/// failure).
const EXIT_TAMPERED: u8 = 2;

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

fn data_dir(dir: Option<PathBuf>) -> PathBuf {
    dir.unwrap_or_else(|| PathBuf::from("berth-data"))
}

/// `berth verify`: checks every session's chain and receipts, read-only.
/// Prints a line per session (or the report as JSON with `json`); exits 2 when
/// any session is tampered.
///
/// # Errors
/// No journal, a running server holds it, another format, no keys.
pub fn verify(dir: Option<PathBuf>, json: bool) -> anyhow::Result<ExitCode> {
    let dir = data_dir(dir);
    let keyring = match keys_from_env()? {
        Some(keyring) => keyring,
        None => Keyring::load(&dir).with_context(|| {
            format!(
                "cannot load the receipt keys of {} (set {KEYS_ENV} if the server got its keys from it)",
                dir.display()
            )
        })?,
    };
    let report = verify_journal(&journal_path(&dir), &keyring)?;
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
        for session in &report.sessions {
            match (&session.status, &session.first_bad) {
                (Verdict::Tampered, Some(bad)) => println!(
                    "tampered  {}  at event {} ({:?}): {}",
                    session.session_id, bad.seq, bad.check, bad.message
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
    let dir = data_dir(dir);
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
    let dir = data_dir(dir);
    let keyring = match keys_from_env()? {
        Some(keyring) => keyring,
        None => Keyring::load(&dir)?,
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
