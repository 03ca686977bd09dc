//! The per-session hash chain over the event log.
//!
//! Every row of table `events` is stored as
//!
//! ```text
//! [0x01 row version] [prev: 32 bytes] [hash: 32 bytes] [EventRecord JSON]
//! hash = SHA-256("berth.event.v1" 0x00 || u64be(len session) || session || u64be(seq) || prev || JSON)
//! ```
//!
//! where `prev` is the `hash` of the session's previous event (32 zero bytes
//! for event 1). An edited row fails its own hash; a row moved to another
//! position fails it too (the seq is hashed); a row replaced by a
//! self-consistent forgery breaks the next row's `prev`; a dropped row leaves
//! a gap. The tail is anchored by the session's **chain head** (table
//! `chain_heads`): its last seq and hash, MACed with the receipt keyring, so
//! dropping the last events or re-hashing the whole log without the key is
//! detected too. The writer extends the chain from the head (never from
//! whatever row happens to be last), so a tampered log stays detectably
//! broken after later appends.

use berth_runtime::receipt::ReceiptSignature;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::keyring::{Keyring, SignatureError};

/// Row format version (the first byte of every event row).
pub(crate) const ROW_VERSION: u8 = 1;
/// Bytes before the JSON: version, prev, hash.
pub(crate) const ROW_HEADER: usize = 1 + 32 + 32;
/// The `prev` of a session's first event.
pub(crate) const GENESIS: [u8; 32] = [0; 32];

/// The hash of event `seq` of `session` with `prev` and `json`.
pub(crate) fn event_hash(session: &str, seq: u64, prev: &[u8; 32], json: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"berth.event.v1\0");
    h.update((session.len() as u64).to_be_bytes());
    h.update(session.as_bytes());
    h.update(seq.to_be_bytes());
    h.update(prev);
    h.update(json);
    h.finalize().into()
}

/// Builds the stored row of event `seq` and returns it with its hash.
pub(crate) fn seal_row(
    session: &str,
    seq: u64,
    prev: &[u8; 32],
    json: &[u8],
) -> (Vec<u8>, [u8; 32]) {
    let hash = event_hash(session, seq, prev, json);
    let mut row = Vec::with_capacity(ROW_HEADER + json.len());
    row.push(ROW_VERSION);
    row.extend_from_slice(prev);
    row.extend_from_slice(&hash);
    row.extend_from_slice(json);
    (row, hash)
}

/// A stored row, split.
pub(crate) struct Row<'a> {
    pub prev: [u8; 32],
    pub hash: [u8; 32],
    pub json: &'a [u8],
}

/// Splits a stored row.
///
/// # Errors
/// A message when the row is too short or of an unknown version.
pub(crate) fn split_row(row: &[u8]) -> Result<Row<'_>, String> {
    if row.len() < ROW_HEADER {
        return Err(format!(
            "the row has {} bytes, fewer than its {ROW_HEADER}-byte chain header",
            row.len()
        ));
    }
    if row[0] != ROW_VERSION {
        return Err(format!(
            "row version {} (this berth writes and reads version {ROW_VERSION})",
            row[0]
        ));
    }
    let mut prev = [0; 32];
    prev.copy_from_slice(&row[1..33]);
    let mut hash = [0; 32];
    hash.copy_from_slice(&row[33..65]);
    Ok(Row {
        prev,
        hash,
        json: &row[ROW_HEADER..],
    })
}

/// A session's chain head (table `chain_heads`, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChainHead {
    /// The last event's seq.
    pub seq: u64,
    /// Its hash, hex.
    pub hash: String,
    /// MAC over [`ChainHead::signing_bytes`].
    pub signature: ReceiptSignature,
}

impl ChainHead {
    fn signing_bytes(session: &str, seq: u64, hash_hex: &str) -> Vec<u8> {
        format!("berth.chain_head.v1\n{session}\n{seq}\n{hash_hex}").into_bytes()
    }

    /// The signed head of `session` at `seq` / `hash`.
    pub fn signed(keyring: &Keyring, session: &str, seq: u64, hash: &[u8; 32]) -> Self {
        let hash = berth_runtime::hexstr::lower(hash);
        let signature = keyring.sign_bytes(&Self::signing_bytes(session, seq, &hash));
        Self {
            seq,
            hash,
            signature,
        }
    }

    /// Checks the head's MAC.
    ///
    /// # Errors
    /// [`SignatureError`] when it does not verify.
    pub fn verify(&self, keyring: &Keyring, session: &str) -> Result<(), SignatureError> {
        keyring.verify_bytes(
            &Self::signing_bytes(session, self.seq, &self.hash),
            &self.signature,
        )
    }

    /// The hash as bytes (`None` when it is not 64 hex digits).
    pub fn hash_bytes(&self) -> Option<[u8; 32]> {
        let bytes = hex::decode(&self.hash).ok()?;
        bytes.try_into().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_hash_their_position() {
        let (row, hash) = seal_row("s", 3, &GENESIS, b"{\"a\":1}");
        let split = split_row(&row).unwrap();
        assert_eq!(split.prev, GENESIS);
        assert_eq!(split.hash, hash);
        assert_eq!(split.json, b"{\"a\":1}");
        assert_eq!(hash, event_hash("s", 3, &GENESIS, b"{\"a\":1}"));
        assert_ne!(hash, event_hash("s", 4, &GENESIS, b"{\"a\":1}"));
        assert_ne!(hash, event_hash("t", 3, &GENESIS, b"{\"a\":1}"));
        assert!(split_row(&row[..10]).is_err());
        let mut old = row.clone();
        old[0] = b'{';
        assert!(split_row(&old).is_err());
    }

    #[test]
    fn a_head_verifies_only_unchanged() {
        let ring = Keyring::from_keys(vec![("k1".into(), vec![1; 32])]).unwrap();
        let head = ChainHead::signed(&ring, "s", 5, &[9; 32]);
        head.verify(&ring, "s").unwrap();
        assert!(head.verify(&ring, "t").is_err());
        let shorter = ChainHead {
            seq: 4,
            ..head.clone()
        };
        assert!(shorter.verify(&ring, "s").is_err());
        assert_eq!(head.hash_bytes(), Some([9; 32]));
    }
}
