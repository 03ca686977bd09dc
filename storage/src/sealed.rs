//! Sealed rows: what a session reloads into a model's context.
//!
//! The rows of tables `transcript_messages`, `checkpoints`, `frames`,
//! `suspensions` (a parked turn's frame) and `open_turns` (a running turn's
//! prompt) are not events, so the hash chain does not cover them. Each is
//! stored sealed with an HMAC-SHA256 under the receipt keyring:
//!
//! ```text
//! [0x02 seal version] [key id length: 1 byte] [key id] [tag: 32 bytes] [value JSON]
//! tag = HMAC(key, "berth.row.v1" 0x00 || u64be(len table) || table
//!                 || u64be(len session) || session || u64be(index) || value)
//! ```
//!
//! where `index` is the transcript index or checkpoint seq (`u64::MAX` for
//! the tables keyed by session alone). An edited byte fails the tag; a row
//! moved to another session, index or table fails it too. The writer seals
//! each row it writes (one MAC per row, no extra read); every read through
//! [`Journal`](crate::Journal) checks the tag and refuses a row that fails
//! it, and `berth verify` reports it as `tampered`. Not detected: a whole
//! row deleted, or an earlier sealed value of the same row put back.

use crate::error::StorageError;
use crate::keyring::Keyring;

/// The first byte of a sealed row (a row JSON starts with `{`).
pub(crate) const SEAL_VERSION: u8 = 0x02;

/// The index of a row keyed by session alone.
pub(crate) const NO_INDEX: u64 = u64::MAX;

fn parts<'a>(
    table: &'a str,
    session: &'a str,
    index: &'a [u8; 8],
    lens: &'a [[u8; 8]; 2],
    value: &'a [u8],
) -> [&'a [u8]; 7] {
    [
        b"berth.row.v1\0",
        &lens[0],
        table.as_bytes(),
        &lens[1],
        session.as_bytes(),
        index,
        value,
    ]
}

fn lens(table: &str, session: &str) -> [[u8; 8]; 2] {
    [
        (table.len() as u64).to_be_bytes(),
        (session.len() as u64).to_be_bytes(),
    ]
}

/// The stored row of `value` at (`table`, `session`, `index`).
pub(crate) fn seal(
    keyring: &Keyring,
    table: &str,
    session: &str,
    index: u64,
    value: &[u8],
) -> Vec<u8> {
    let mut row = Vec::new();
    seal_into(&mut row, keyring, table, session, index, value);
    row
}

/// [`seal`] into `row` (cleared first), so the writer reuses one buffer.
pub(crate) fn seal_into(
    row: &mut Vec<u8>,
    keyring: &Keyring,
    table: &str,
    session: &str,
    index: u64,
    value: &[u8],
) {
    let lens = lens(table, session);
    let index = index.to_be_bytes();
    let (key_id, tag) = keyring.mac_parts(&parts(table, session, &index, &lens, value));
    row.clear();
    row.reserve(2 + key_id.len() + 32 + value.len());
    row.push(SEAL_VERSION);
    // Key ids are 1 to 64 characters (`keyring::valid_key_id`).
    row.push(u8::try_from(key_id.len()).unwrap_or(u8::MAX));
    row.extend_from_slice(key_id.as_bytes());
    row.extend_from_slice(&tag);
    row.extend_from_slice(value);
}

/// A sealed row, split.
struct Split<'a> {
    key_id: &'a str,
    tag: &'a [u8],
    value: &'a [u8],
}

fn split(row: &[u8]) -> Result<Split<'_>, String> {
    if row.first() != Some(&SEAL_VERSION) {
        return Err("the row has no seal (it was written outside berth)".into());
    }
    let id_len = usize::from(*row.get(1).ok_or("the row's seal is cut short")?);
    let id_end = 2 + id_len;
    if row.len() < id_end + 32 {
        return Err("the row's seal is cut short".into());
    }
    let key_id =
        std::str::from_utf8(&row[2..id_end]).map_err(|_| "the row's seal names no key id")?;
    Ok(Split {
        key_id,
        tag: &row[id_end..id_end + 32],
        value: &row[id_end + 32..],
    })
}

/// The value of a sealed row, its tag checked.
///
/// # Errors
/// What failed: no seal, a cut seal, an unknown key, a tag mismatch.
pub(crate) fn open<'a>(
    keyring: &Keyring,
    table: &str,
    session: &str,
    index: u64,
    row: &'a [u8],
) -> Result<&'a [u8], String> {
    let row = split(row)?;
    let lens = lens(table, session);
    let index_bytes = index.to_be_bytes();
    keyring
        .verify_parts(
            row.key_id,
            &parts(table, session, &index_bytes, &lens, row.value),
            row.tag,
        )
        .map_err(|e| {
            format!("the row does not match its seal: it was edited outside berth ({e})")
        })?;
    Ok(row.value)
}

/// The value of a sealed row without checking its tag (the writer's own
/// precondition reads, which decide nothing a model sees).
///
/// # Errors
/// No seal or a cut seal.
pub(crate) fn strip(row: &[u8]) -> Result<&[u8], String> {
    split(row).map(|r| r.value)
}

/// [`open`] with a failure as [`StorageError::Corrupt`] naming the row.
///
/// # Errors
/// [`StorageError::Corrupt`].
pub(crate) fn open_row<'a>(
    keyring: &Keyring,
    table: &'static str,
    session: &str,
    index: u64,
    row: &'a [u8],
) -> Result<&'a [u8], StorageError> {
    open(keyring, table, session, index, row).map_err(|message| StorageError::Corrupt {
        table,
        key: row_key(session, index),
        message,
    })
}

/// How a row is named to the operator: `session` or `session/index`.
pub(crate) fn row_key(session: &str, index: u64) -> String {
    if index == NO_INDEX {
        session.to_owned()
    } else {
        format!("{session}/{index}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_row_opens_only_unchanged_and_in_place() {
        let ring = Keyring::from_keys(vec![("k1".into(), vec![1; 32])]).unwrap();
        let row = seal(&ring, "checkpoints", "s", 3, b"{\"a\":1}");
        assert_eq!(
            open(&ring, "checkpoints", "s", 3, &row).unwrap(),
            b"{\"a\":1}"
        );
        assert_eq!(strip(&row).unwrap(), b"{\"a\":1}");
        assert!(open(&ring, "checkpoints", "s", 4, &row).is_err());
        assert!(open(&ring, "checkpoints", "t", 3, &row).is_err());
        assert!(open(&ring, "frames", "s", 3, &row).is_err());
        let mut edited = row.clone();
        *edited.last_mut().unwrap() = b']';
        assert!(open(&ring, "checkpoints", "s", 3, &edited).is_err());
        assert!(open(&ring, "checkpoints", "s", 3, b"{\"a\":1}").is_err());
        assert!(open(&ring, "checkpoints", "s", 3, &row[..10]).is_err());
        let other = Keyring::from_keys(vec![("k1".into(), vec![2; 32])]).unwrap();
        assert!(open(&other, "checkpoints", "s", 3, &row).is_err());
    }
}
