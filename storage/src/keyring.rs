//! The receipt keyring: HMAC-SHA256 keys with ids, persisted across restarts,
//! so that a receipt signed by one berth process verifies in any later one
//! (DESIGN.md, "The journal"; the seed system's per-process key cannot do this).
//!
//! ## Where the keys come from
//!
//! 1. **`BERTH_RECEIPT_KEYS`** (read by the binary and handed to
//!    [`Keyring::parse`]): comma-separated `KEY_ID:HEX_SECRET` entries, e.g.
//!    `k1:6f1c…,k2:9a0b…`. Key ids are 1–64 characters of `A-Z a-z 0-9 . _ -`,
//!    unique; secrets are hex, at least 16 bytes (32 hex digits; 32 bytes
//!    recommended). The **last** entry signs new receipts; the others only
//!    verify. Nothing is written to disk in this mode.
//! 2. Otherwise the **key file** `<data dir>/receipt-keys.json`
//!    ([`KEY_FILE`]), created on first start with a fresh 32-byte random key
//!    `k1`, mode 0600 ([`Keyring::load_or_create`]). A key file readable by
//!    group or others is refused (like ssh refuses a private key), with the
//!    `chmod` that fixes it.
//!
//! ## Rotation
//!
//! [`Keyring::rotate`] (`berth keys rotate --data-dir D`) appends a new random
//! key `k<N+1>` to the key file and makes it the signing key; old keys stay
//! for verification, so old receipts keep verifying. A running server picks
//! the new key up at its next start. With `BERTH_RECEIPT_KEYS`, rotate by
//! appending an entry to the variable.
//!
//! ## What is signed
//!
//! [`Keyring::sign`] computes HMAC-SHA256 over a receipt's
//! [signing bytes](berth_runtime::receipt::Receipt::signing_bytes) under the
//! active key and returns it [`Signed`] with the key id beside the MAC;
//! [`Keyring::verify`] recomputes it under the key the signature names, in
//! constant time. The journal's chain heads are MACed the same way.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_runtime::hexstr;
use berth_runtime::receipt::{Receipt, ReceiptSignature, Signed, SIGNATURE_ALG};
use chrono::{DateTime, Utc};
use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The key file's name in the data directory.
pub const KEY_FILE: &str = "receipt-keys.json";

/// The key file's `format` tag.
const KEY_FILE_FORMAT: &str = "berth.receipt-keys.v1";

/// Bytes of a generated secret.
const SECRET_BYTES: usize = 32;

/// Fewest bytes a given secret may have.
pub const MIN_SECRET_BYTES: usize = 16;

/// Why a keyring could not be loaded, created or rotated. Nothing was changed
/// on disk when one of these is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyringError {
    /// Reading or writing the key file failed.
    #[error("receipt key file {path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        message: String,
    },
    /// The key file is readable or writable by group or others.
    #[error("receipt key file {path} has mode {mode:04o}, readable by others; run `chmod 600 {path}` (berth creates it 0600)")]
    Permissions {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The key file or `BERTH_RECEIPT_KEYS` does not parse.
    #[error("receipt keys from {source_name} are invalid: {message}")]
    Invalid {
        /// `BERTH_RECEIPT_KEYS` or the file path.
        source_name: String,
        /// What is wrong.
        message: String,
    },
    /// No key file exists where one was required (read-only use).
    #[error("no receipt key file at {path}: this data dir has never been served, or its keys come from BERTH_RECEIPT_KEYS (set it)")]
    Missing {
        /// Where it was looked for.
        path: String,
    },
}

/// Why a signature does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum SignatureError {
    /// The signature names a key this keyring does not hold.
    #[error("signed with key {key_id}, which this keyring does not hold")]
    UnknownKey {
        /// The key id named.
        key_id: String,
    },
    /// An algorithm other than HMAC-SHA256.
    #[error("unsupported signature algorithm {alg}")]
    UnsupportedAlg {
        /// The algorithm named.
        alg: String,
    },
    /// The MAC is not 64 hex digits.
    #[error("malformed MAC (expected 64 hex digits)")]
    Malformed,
    /// The MAC does not match the signed bytes: the receipt was changed after
    /// it was signed (or signed under another secret with the same key id).
    #[error("MAC mismatch under key {key_id}: the signed content was changed")]
    Mismatch {
        /// The key id named.
        key_id: String,
    },
}

/// Where a keyring's keys came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOrigin {
    /// The key file at this path.
    File(PathBuf),
    /// `BERTH_RECEIPT_KEYS`.
    Environment,
    /// Given in code ([`Keyring::from_keys`]).
    Given,
}

/// One key as listed (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyInfo {
    /// The key id.
    pub id: String,
    /// When it was generated (key-file keys only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// Whether it signs new receipts.
    pub active: bool,
}

#[derive(Clone)]
struct Key {
    id: String,
    secret: Vec<u8>,
    created_at: Option<DateTime<Utc>>,
    /// HMAC state with `secret` already absorbed (the inner and outer pads
    /// hashed), cloned per MAC instead of rekeyed: rekeying costs two
    /// SHA-256 compressions per signature.
    keyed: HmacSha256,
}

impl Key {
    fn new(id: String, secret: Vec<u8>, created_at: Option<DateTime<Utc>>) -> Self {
        // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
        let keyed = <HmacSha256 as KeyInit>::new_from_slice(&secret)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
        Self {
            id,
            secret,
            created_at,
            keyed,
        }
    }

    /// The MAC state over `bytes` under this key, not yet finalized.
    fn mac_of(&self, bytes: &[u8]) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(bytes);
        mac
    }
}

/// The keyring. Cheap to clone (shared). Its `Debug` shows key ids only.
#[derive(Clone)]
pub struct Keyring {
    keys: Arc<Vec<Key>>,
    origin: KeyOrigin,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("active", &self.active_key_id())
            .field(
                "keys",
                &self.keys.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(),
            )
            .field("origin", &self.origin)
            .finish()
    }
}

/// The key file's JSON shape.
#[derive(Serialize, Deserialize)]
struct KeyFile {
    format: String,
    active: String,
    keys: Vec<KeyFileEntry>,
}

#[derive(Serialize, Deserialize)]
struct KeyFileEntry {
    id: String,
    /// Hex.
    secret: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created_at: Option<DateTime<Utc>>,
}

fn valid_key_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn hex_secret(source: &str, id: &str, hex_text: &str) -> Result<Vec<u8>, KeyringError> {
    let invalid = |message: String| KeyringError::Invalid {
        source_name: source.to_owned(),
        message,
    };
    let secret = hex::decode(hex_text.trim())
        .map_err(|e| invalid(format!("key {id}: the secret is not hex ({e})")))?;
    if secret.len() < MIN_SECRET_BYTES {
        return Err(invalid(format!(
            "key {id}: the secret has {} bytes; at least {MIN_SECRET_BYTES} are required (32 recommended)",
            secret.len()
        )));
    }
    Ok(secret)
}

fn io_err(path: &Path, e: std::io::Error) -> KeyringError {
    KeyringError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

impl Keyring {
    /// A keyring of `keys` (`(id, secret)`), the last one active.
    ///
    /// # Errors
    /// [`KeyringError::Invalid`] when there are no keys, an id is malformed
    /// or repeated, or a secret is shorter than [`MIN_SECRET_BYTES`].
    pub fn from_keys(keys: Vec<(String, Vec<u8>)>) -> Result<Self, KeyringError> {
        let keys = keys
            .into_iter()
            .map(|(id, secret)| Key::new(id, secret, None))
            .collect();
        Self::build(keys, KeyOrigin::Given, "the given keys")
    }

    fn build(keys: Vec<Key>, origin: KeyOrigin, source: &str) -> Result<Self, KeyringError> {
        let invalid = |message: String| KeyringError::Invalid {
            source_name: source.to_owned(),
            message,
        };
        if keys.is_empty() {
            return Err(invalid("no keys".into()));
        }
        for (i, key) in keys.iter().enumerate() {
            if !valid_key_id(&key.id) {
                return Err(invalid(format!(
                    "key id {:?} must be 1 to 64 characters of A-Z a-z 0-9 . _ -",
                    key.id
                )));
            }
            if keys[..i].iter().any(|k| k.id == key.id) {
                return Err(invalid(format!("key id {} appears twice", key.id)));
            }
            if key.secret.len() < MIN_SECRET_BYTES {
                return Err(invalid(format!(
                    "key {}: the secret has {} bytes; at least {MIN_SECRET_BYTES} are required",
                    key.id,
                    key.secret.len()
                )));
            }
        }
        Ok(Self {
            keys: Arc::new(keys),
            origin,
        })
    }

    /// Parses `BERTH_RECEIPT_KEYS`: `KEY_ID:HEX_SECRET[,KEY_ID:HEX_SECRET…]`,
    /// the last entry active (see the module docs).
    ///
    /// # Errors
    /// [`KeyringError::Invalid`] naming the bad entry.
    pub fn parse(value: &str) -> Result<Self, KeyringError> {
        const SOURCE: &str = "BERTH_RECEIPT_KEYS";
        let mut keys = Vec::new();
        for (n, entry) in value.split(',').map(str::trim).enumerate() {
            if entry.is_empty() {
                continue;
            }
            let Some((id, secret)) = entry.split_once(':') else {
                return Err(KeyringError::Invalid {
                    source_name: SOURCE.into(),
                    message: format!("entry {} is not KEY_ID:HEX_SECRET", n + 1),
                });
            };
            let id = id.trim().to_owned();
            let secret = hex_secret(SOURCE, &id, secret)?;
            keys.push(Key::new(id, secret, None));
        }
        Self::build(keys, KeyOrigin::Environment, SOURCE)
    }

    /// The key file path of a data directory.
    pub fn key_file(data_dir: &Path) -> PathBuf {
        data_dir.join(KEY_FILE)
    }

    /// Loads the key file of `data_dir`.
    ///
    /// # Errors
    /// [`KeyringError::Missing`] when there is none; [`KeyringError::Permissions`]
    /// when group or others may read it; [`KeyringError::Invalid`] when it
    /// does not parse; [`KeyringError::Io`].
    pub fn load(data_dir: &Path) -> Result<Self, KeyringError> {
        let path = Self::key_file(data_dir);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(KeyringError::Missing {
                    path: path.display().to_string(),
                })
            }
            Err(e) => return Err(io_err(&path, e)),
        };
        let mode = meta.permissions().mode() & 0o777;
        // A symlink is refused by the read below, which does not follow it.
        if mode & 0o077 != 0 && !meta.file_type().is_symlink() {
            return Err(KeyringError::Permissions {
                path: path.display().to_string(),
                mode,
            });
        }
        let text = crate::private::read(&path)
            .map_err(|e| io_err(&path, e))
            .and_then(|bytes| {
                String::from_utf8(bytes).map_err(|_| KeyringError::Invalid {
                    source_name: path.display().to_string(),
                    message: "not UTF-8".into(),
                })
            })?;
        let source = path.display().to_string();
        let invalid = |message: String| KeyringError::Invalid {
            source_name: source.clone(),
            message,
        };
        let file: KeyFile = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        if file.format != KEY_FILE_FORMAT {
            return Err(invalid(format!(
                "format {:?}, expected {KEY_FILE_FORMAT:?}",
                file.format
            )));
        }
        let mut keys = Vec::with_capacity(file.keys.len());
        for entry in file.keys {
            let secret = hex_secret(&source, &entry.id, &entry.secret)?;
            keys.push(Key::new(entry.id, secret, entry.created_at));
        }
        // The active key goes last (the signing position).
        let Some(active) = keys.iter().position(|k| k.id == file.active) else {
            return Err(invalid(format!(
                "the active key {} is not among the keys",
                file.active
            )));
        };
        let active = keys.remove(active);
        keys.push(active);
        Self::build(keys, KeyOrigin::File(path.clone()), &source)
    }

    /// Loads the key file of `data_dir`, creating it (one fresh random key
    /// `k1`, generated `now`, mode 0600, written atomically and fsynced) when
    /// there is none.
    ///
    /// # Errors
    /// As [`Keyring::load`], except `Missing`; [`KeyringError::Io`] when the
    /// file cannot be created or no randomness is available.
    pub fn load_or_create(data_dir: &Path, now: DateTime<Utc>) -> Result<Self, KeyringError> {
        match Self::load(data_dir) {
            Err(KeyringError::Missing { .. }) => {
                let key = Key::new(
                    "k1".into(),
                    random_secret(&Self::key_file(data_dir))?,
                    Some(now),
                );
                let ring = Self::build(
                    vec![key],
                    KeyOrigin::File(Self::key_file(data_dir)),
                    "a new key",
                )?;
                ring.write(data_dir)?;
                Ok(ring)
            }
            other => other,
        }
    }

    /// Rotates the key file of `data_dir` (creating it first if there is
    /// none): appends a fresh random key `k<N+1>` (generated `now`) and makes
    /// it the signing key; every old key stays for verification. Durable on
    /// return (atomic replace, fsynced). Returns the new keyring.
    ///
    /// # Errors
    /// As [`Keyring::load_or_create`].
    pub fn rotate(data_dir: &Path, now: DateTime<Utc>) -> Result<Self, KeyringError> {
        let ring = Self::load_or_create(data_dir, now)?;
        let mut keys: Vec<Key> = ring.keys.as_ref().clone();
        let mut n = keys.len() + 1;
        while keys.iter().any(|k| k.id == format!("k{n}")) {
            n += 1;
        }
        keys.push(Key::new(
            format!("k{n}"),
            random_secret(&Self::key_file(data_dir))?,
            Some(now),
        ));
        let ring = Self::build(
            keys,
            KeyOrigin::File(Self::key_file(data_dir)),
            "the rotated keys",
        )?;
        ring.write(data_dir)?;
        Ok(ring)
    }

    /// Writes the key file: a temporary file created 0600, fsynced, renamed
    /// over the old one, and the directory fsynced.
    fn write(&self, data_dir: &Path) -> Result<(), KeyringError> {
        crate::private::ensure_dir(data_dir).map_err(|e| io_err(data_dir, e))?;
        let path = Self::key_file(data_dir);
        let tmp = data_dir.join(format!("{KEY_FILE}.tmp"));
        let file = KeyFile {
            format: KEY_FILE_FORMAT.into(),
            active: self.active_key_id().to_owned(),
            keys: self
                .keys
                .iter()
                .map(|k| KeyFileEntry {
                    id: k.id.clone(),
                    secret: hex::encode(&k.secret),
                    created_at: k.created_at,
                })
                .collect(),
        };
        let text = serde_json::to_string_pretty(&file).map_err(|e| KeyringError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let _ = std::fs::remove_file(&tmp);
        let mut out = crate::private::open(
            &tmp,
            std::fs::OpenOptions::new().write(true).create_new(true),
        )
        .map_err(|e| io_err(&tmp, e))?;
        // The umask can only remove bits; make sure of 0600 anyway.
        out.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io_err(&tmp, e))?;
        out.write_all(text.as_bytes())
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.sync_all())
            .map_err(|e| io_err(&tmp, e))?;
        drop(out);
        std::fs::rename(&tmp, &path).map_err(|e| io_err(&path, e))?;
        std::fs::File::open(data_dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| io_err(data_dir, e))
    }

    /// The id of the key that signs new receipts.
    pub fn active_key_id(&self) -> &str {
        // `build` refuses an empty keyring.
        self.keys.last().map_or("", |k| k.id.as_str())
    }

    /// Every key (ids, creation times, which is active), oldest first; never
    /// the secrets.
    pub fn keys(&self) -> Vec<KeyInfo> {
        let last = self.keys.len().saturating_sub(1);
        self.keys
            .iter()
            .enumerate()
            .map(|(i, k)| KeyInfo {
                id: k.id.clone(),
                created_at: k.created_at,
                active: i == last,
            })
            .collect()
    }

    /// Where the keys came from.
    pub fn origin(&self) -> &KeyOrigin {
        &self.origin
    }

    fn key(&self, id: &str) -> Option<&Key> {
        self.keys.iter().rev().find(|k| k.id == id)
    }

    /// HMAC-SHA256 of `bytes` under the active key.
    pub fn sign_bytes(&self, bytes: &[u8]) -> ReceiptSignature {
        let key = self
            .keys
            .last()
            .unwrap_or_else(|| unreachable!("a keyring has a key"));
        ReceiptSignature {
            key_id: key.id.clone(),
            alg: SIGNATURE_ALG.into(),
            mac: hexstr::lower(&key.mac_of(bytes).finalize().into_bytes()),
        }
    }

    /// Checks `signature` over `bytes` (constant-time comparison).
    ///
    /// # Errors
    /// [`SignatureError`] saying why it does not verify.
    pub fn verify_bytes(
        &self,
        bytes: &[u8],
        signature: &ReceiptSignature,
    ) -> Result<(), SignatureError> {
        if signature.alg != SIGNATURE_ALG {
            return Err(SignatureError::UnsupportedAlg {
                alg: signature.alg.clone(),
            });
        }
        let key = self
            .key(&signature.key_id)
            .ok_or_else(|| SignatureError::UnknownKey {
                key_id: signature.key_id.clone(),
            })?;
        let tag = hex::decode(&signature.mac).map_err(|_| SignatureError::Malformed)?;
        if tag.len() != 32 {
            return Err(SignatureError::Malformed);
        }
        key.mac_of(bytes)
            .verify_slice(&tag)
            .map_err(|_| SignatureError::Mismatch {
                key_id: signature.key_id.clone(),
            })
    }

    /// HMAC-SHA256 over the concatenation of `parts` under the active key:
    /// its id and the 32-byte tag (the sealed rows, `sealed.rs`).
    pub(crate) fn mac_parts(&self, parts: &[&[u8]]) -> (&str, [u8; 32]) {
        let key = self
            .keys
            .last()
            .unwrap_or_else(|| unreachable!("a keyring has a key"));
        let mut mac = key.keyed.clone();
        for part in parts {
            mac.update(part);
        }
        (key.id.as_str(), mac.finalize().into_bytes().into())
    }

    /// Checks `tag` over the concatenation of `parts` under key `key_id`
    /// (constant-time comparison).
    ///
    /// # Errors
    /// [`SignatureError::UnknownKey`] or [`SignatureError::Mismatch`].
    pub(crate) fn verify_parts(
        &self,
        key_id: &str,
        parts: &[&[u8]],
        tag: &[u8],
    ) -> Result<(), SignatureError> {
        let key = self.key(key_id).ok_or_else(|| SignatureError::UnknownKey {
            key_id: key_id.to_owned(),
        })?;
        let mut mac = key.keyed.clone();
        for part in parts {
            mac.update(part);
        }
        mac.verify_slice(tag).map_err(|_| SignatureError::Mismatch {
            key_id: key_id.to_owned(),
        })
    }

    /// Signs `receipt` under the active key.
    pub fn sign<T: Receipt>(&self, receipt: T) -> Signed<T> {
        let signature = self.sign_bytes(&receipt.signing_bytes());
        Signed::from_parts(receipt, signature)
    }

    /// Signs `receipt` under the key `key_id` (which need not be the active
    /// one): `berth replay` re-signs a replayed receipt with the key its
    /// recorded counterpart names, so the two compare byte for byte after a
    /// rotation too.
    ///
    /// # Errors
    /// [`SignatureError::UnknownKey`] when the keyring has no such key.
    pub fn sign_as<T: Receipt>(
        &self,
        key_id: &str,
        receipt: T,
    ) -> Result<Signed<T>, SignatureError> {
        let key = self.key(key_id).ok_or_else(|| SignatureError::UnknownKey {
            key_id: key_id.to_owned(),
        })?;
        let mac = key.mac_of(&receipt.signing_bytes()).finalize();
        let signature = ReceiptSignature {
            key_id: key.id.clone(),
            alg: SIGNATURE_ALG.into(),
            mac: hexstr::lower(&mac.into_bytes()),
        };
        Ok(Signed::from_parts(receipt, signature))
    }

    /// Verifies a signed receipt under the key its signature names.
    ///
    /// # Errors
    /// [`SignatureError`] saying why it does not verify.
    pub fn verify<T: Receipt>(&self, signed: &Signed<T>) -> Result<(), SignatureError> {
        self.verify_bytes(&signed.receipt.signing_bytes(), &signed.signature)
    }
}

fn random_secret(path: &Path) -> Result<Vec<u8>, KeyringError> {
    let mut secret = vec![0u8; SECRET_BYTES];
    getrandom::fill(&mut secret).map_err(|e| KeyringError::Io {
        path: path.display().to_string(),
        message: format!("no randomness for a new key: {e}"),
    })?;
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use berth_runtime::event::{ControlOutcome, ControlStatus};
    use serde_json::{json, Value};

    use super::*;

    fn outcome() -> ControlOutcome {
        ControlOutcome {
            session_id: "s".into(),
            control_id: "ctl_1".into(),
            method: "session/cancel".into(),
            outcome: "cancelled".into(),
            status: ControlStatus::Accepted,
            actor: "acp:stdio:1".into(),
            target: json!({"sessionId": "s"}),
            reason: None,
            metadata: Value::Null,
            decided_at: DateTime::from_timestamp_millis(1_000).unwrap(),
        }
    }

    #[test]
    fn a_signature_verifies_and_any_change_breaks_it() {
        let ring = Keyring::from_keys(vec![("k1".into(), vec![7; 32])]).unwrap();
        let signed = ring.sign(outcome());
        assert_eq!(signed.signature.key_id, "k1");
        assert_eq!(signed.signature.mac.len(), 64);
        ring.verify(&signed).unwrap();
        let mut later = signed.clone();
        later.receipt.decided_at += chrono::Duration::milliseconds(1);
        assert_eq!(
            ring.verify(&later),
            Err(SignatureError::Mismatch {
                key_id: "k1".into()
            })
        );
        let mut other = signed.clone();
        other.receipt.status = ControlStatus::Rejected;
        assert!(ring.verify(&other).is_err());
        let mut unknown = signed.clone();
        unknown.signature.key_id = "k9".into();
        assert_eq!(
            ring.verify(&unknown),
            Err(SignatureError::UnknownKey {
                key_id: "k9".into()
            })
        );
        let stranger = Keyring::from_keys(vec![("k1".into(), vec![8; 32])]).unwrap();
        assert!(stranger.verify(&signed).is_err());
    }

    #[test]
    fn a_mac_is_plain_hmac_sha256_every_time() {
        // RFC 4231, test case 1.
        let ring = Keyring::from_keys(vec![("k1".into(), vec![0x0b; 20])]).unwrap();
        let expected = "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7";
        for _ in 0..2 {
            let signature = ring.sign_bytes(b"Hi There");
            assert_eq!(signature.mac, expected);
            ring.verify_bytes(b"Hi There", &signature).unwrap();
        }
        let signed = ring.sign_as("k1", outcome()).unwrap();
        assert_eq!(signed.signature, ring.sign(outcome()).signature);
    }

    #[test]
    fn the_environment_format_parses_with_the_last_key_active() {
        let ring =
            Keyring::parse(&format!("old:{},new:{}", "ab".repeat(16), "cd".repeat(32))).unwrap();
        assert_eq!(ring.active_key_id(), "new");
        assert_eq!(ring.origin(), &KeyOrigin::Environment);
        let signed = ring.sign(outcome());
        assert_eq!(signed.signature.key_id, "new");
        for bad in [
            "",
            "k1",
            "k1:zz",
            &format!("k1:{}", "ab".repeat(8 - 1)),
            &format!("bad id:{}", "ab".repeat(16)),
            &format!("k1:{0},k1:{0}", "ab".repeat(16)),
        ] {
            assert!(
                matches!(Keyring::parse(bad), Err(KeyringError::Invalid { .. })),
                "{bad:?}"
            );
        }
    }
}
