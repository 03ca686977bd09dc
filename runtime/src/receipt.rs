//! Signed receipts: the verifiable record of every arbitrated control and
//! every suspension, resumption and drain decision (DESIGN.md, "The journal";
//! `seeds/acp-session-suspend-rfc.md`, "Lifecycle replay determinism
//! receipts"; `seeds/remote-session-control.md`, "Receipts").
//!
//! A receipt is a plain struct (this module: [`SuspensionReceipt`],
//! [`ResumptionReceipt`], [`DrainDecisionReceipt`], and the existing
//! [`ControlOutcome`](crate::event::ControlOutcome)) wrapped in [`Signed`],
//! which adds a [`ReceiptSignature`]: HMAC-SHA256 under a key of the node's
//! keyring (the key id travels beside the MAC). The keyring and the signing
//! itself live in `berth-storage` (DESIGN.md: storage owns the keyring); this
//! module fixes *what* is signed, so that every process computes the same bytes:
//!
//! ```text
//! signing bytes = "berth.receipt.v1" LF <kind> LF <canonical JSON of the receipt>
//! ```
//!
//! where `<kind>` is [`Receipt::KIND`] (`suspension`, `resumption`,
//! `drain_decision`, `control_outcome`) and the canonical JSON is
//! [`canonical_json`] of the receipt's serde form (signature excluded). Every
//! field is covered, so every timestamp in a receipt (`suspended_at`,
//! `resumed_at`, `decided_at`, …) is signed. A change to this encoding must
//! bump [`RECEIPT_ENCODING`].

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub use crate::canonical::canonical_json;

use crate::ids::{SessionId, TurnId};
use crate::steering::{InjectMode, Seam};
use crate::suspension::{Initiator, OnTimeout, ResumeCause, ResumeConditions, SuspendMode};

/// The version tag that starts every receipt's signing bytes.
pub const RECEIPT_ENCODING: &str = "berth.receipt.v1";

/// The one signature algorithm receipts use (`ReceiptSignature::alg`).
pub const SIGNATURE_ALG: &str = "HMAC-SHA256";

/// A receipt type: something the journal signs.
pub trait Receipt: Serialize + DeserializeOwned + Clone {
    /// The kind named in the signing bytes (so that one kind's bytes can never
    /// verify as another's).
    const KIND: &'static str;

    /// The bytes the MAC covers: `berth.receipt.v1 LF KIND LF canonical-json`.
    /// Receipt types serialize to JSON without fail (no non-string map keys);
    /// were one ever to fail, the bytes would cover `null` and verification
    /// would compute the same bytes, so nothing would verify by accident that
    /// was not signed.
    fn signing_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(RECEIPT_ENCODING.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(Self::KIND.as_bytes());
        out.push(b'\n');
        let body = out.len();
        if crate::canonical::write_serialized(self, &mut out).is_err() {
            out.truncate(body);
            out.extend_from_slice(b"null");
        }
        out
    }
}

/// A MAC over a receipt's [signing bytes](Receipt::signing_bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptSignature {
    /// The keyring key that made it (`k1`, `k2`, … or an id given in
    /// `BERTH_RECEIPT_KEYS`).
    pub key_id: String,
    /// Always [`SIGNATURE_ALG`] (`HMAC-SHA256`).
    pub alg: String,
    /// The MAC, 32 bytes as 64 lowercase hex digits.
    pub mac: String,
}

/// A receipt with its signature. Serialized flat: the receipt's own fields
/// plus `signature`. Build one with the keyring (`berth_storage::Keyring::sign`);
/// [`Signed::from_parts`] exists for the keyring and for decoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signed<T> {
    /// The receipt.
    #[serde(flatten)]
    pub receipt: T,
    /// Its signature.
    pub signature: ReceiptSignature,
}

impl<T> Signed<T> {
    /// Pairs a receipt with a signature computed over it (no check here; the
    /// keyring's `verify` checks).
    pub fn from_parts(receipt: T, signature: ReceiptSignature) -> Self {
        Self { receipt, signature }
    }
}

impl Receipt for crate::event::ControlOutcome {
    const KIND: &'static str = "control_outcome";
}

/// The receipt of a committed suspension (RFC `WorkerSuspension` envelope
/// fields; journaled in the same batch as the envelope). Field names follow
/// the journal's snake_case (`suspended_at` is the RFC's `suspendedAt`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuspensionReceipt {
    /// The suspension handle (`susp_…`).
    pub handle: String,
    /// The parked session.
    pub session_id: SessionId,
    /// Who parked it.
    pub initiator: Initiator,
    /// The authenticated actor behind it (a connection, `agent`, `policy`).
    pub actor: String,
    /// The mode it was requested with.
    pub mode: SuspendMode,
    /// Why, as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The resume conditions (`resumeWhen`), when any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<ResumeConditions>,
    /// When the suspension was committed.
    #[serde(with = "crate::clock::rfc3339")]
    pub suspended_at: DateTime<Utc>,
    /// The parked turn (`None`: the session was idle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    /// `sha256:<hex>` of the canonical JSON of the parked frame, binding the
    /// receipt to the exact state a resume continues from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame_sha256: Option<String>,
    /// The OpenTelemetry span id of the suspension (the first span link of the
    /// envelope); `None` until the telemetry layer records spans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
}

impl Receipt for SuspensionReceipt {
    const KIND: &'static str = "suspension";
}

/// What fired a scheduled or event-driven resume (the ResumptionReceipt's
/// "trigger match").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TriggerMatch {
    /// `resumeWhen.timeout` elapsed.
    Timeout {
        /// When it was due.
        #[serde(with = "crate::clock::rfc3339")]
        due_at: DateTime<Utc>,
        /// Its action.
        on_timeout: OnTimeout,
    },
    /// A time trigger (`{at}` or `{cron}`) came due.
    Time {
        /// When it was due.
        #[serde(with = "crate::clock::rfc3339")]
        due_at: DateTime<Utc>,
    },
    /// An external event matched `onEvent` or an event trigger.
    Event {
        /// The event's name.
        name: String,
        /// Its sequence number in the journal's external-event log.
        seq: u64,
        /// When berth received it.
        #[serde(with = "crate::clock::rfc3339")]
        received_at: DateTime<Utc>,
    },
}

/// The receipt of a won resume claim (RFC `SessionUpdate_Resumed` plus what
/// replay checks; journaled in the same batch as the claim).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResumptionReceipt {
    /// The handle claimed.
    pub handle: String,
    /// The session.
    pub session_id: SessionId,
    /// Why it woke.
    pub cause: ResumeCause,
    /// Who resumed it (a connection, `scheduler`, `event:NAME`).
    pub actor: String,
    /// `sha256:<hex>` of [`canonical_json`] of the resume input (keys sorted);
    /// `None` when no input was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_sha256: Option<String>,
    /// Whether the parked turn's transcript continues (RFC `continueTranscript`).
    pub continue_transcript: bool,
    /// The span id of the suspension this resume links to (when recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspension_span_id: Option<String>,
    /// When the suspension it ends was committed.
    #[serde(with = "crate::clock::rfc3339")]
    pub suspended_at: DateTime<Utc>,
    /// The condition that fired it (`None` for an explicit resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<TriggerMatch>,
    /// How late a scheduled wake-up fired (ms after due).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lateness_ms: Option<u64>,
    /// The turn that runs now (the parked one continued, or a fresh one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    /// When the claim was committed.
    #[serde(with = "crate::clock::rfc3339")]
    pub resumed_at: DateTime<Utc>,
}

impl Receipt for ResumptionReceipt {
    const KIND: &'static str = "resumption";
}

/// What a drain took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DrainedItem {
    /// An injected message (`session/inject`).
    Injection {
        /// Its id (`msg_…`).
        message_id: String,
        /// Its mode.
        mode: Option<InjectMode>,
    },
    /// A pending `session/suspend` (or a budget policy's suspension).
    SuspendRequest {
        /// The handle the suspension got.
        handle: String,
        /// The mode in force when it was drained.
        mode: SuspendMode,
    },
}

/// What became of a drained item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainAction {
    /// The message reached the turn (the model reads it, or it was recorded
    /// as a queued audit entry at `loop_exit`).
    Delivered,
    /// The message never reached the turn (it ended or parked first).
    Dropped,
    /// The turn parked for the suspend request.
    Parked,
}

/// The receipt of one drain decision: which queued control or pending item
/// was taken at which seam, with what action (`seeds/remote-session-control.md`,
/// "Steer"/"Queue"/"Interrupt" for the seams). Journaled in the same batch as
/// the event it decides (`injection_delivered`, `injection_dropped`,
/// `suspended`). The seam is what deterministic replay needs to drain at the
/// same point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainDecisionReceipt {
    /// The session.
    pub session_id: SessionId,
    /// The turn that drained it, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    /// What was drained.
    pub item: DrainedItem,
    /// Where the turn loop drained it; `None` when it was decided outside the
    /// loop (dropped by a park or a seal, a park completed at start-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seam: Option<Seam>,
    /// What was done with it.
    pub action: DrainAction,
    /// Why, for a drop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the decision was journaled.
    #[serde(with = "crate::clock::rfc3339")]
    pub decided_at: DateTime<Utc>,
}

impl Receipt for DrainDecisionReceipt {
    const KIND: &'static str = "drain_decision";
}

/// `sha256:<64 hex>` of the [`canonical_json`] of `value`: the resume input
/// hash of a [`ResumptionReceipt`] (and the frame hash of a
/// [`SuspensionReceipt`]).
pub fn sha256_of_json(value: &Value) -> String {
    let mut canonical = Vec::new();
    crate::canonical::write_value(value, &mut canonical);
    crate::hexstr::sha256_tagged(&Sha256::digest(&canonical))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The encoding as first written (through `Display`, cloning each
    /// string): the bytes every receipt in an existing journal was signed
    /// over, which the faster writer must reproduce exactly.
    fn canonical_as_first_written(value: &Value, out: &mut String) {
        use std::fmt::Write as _;
        match value {
            Value::Null | Value::Bool(_) | Value::Number(_) => {
                let _ = write!(out, "{value}");
            }
            Value::String(s) => {
                let _ = write!(out, "{}", Value::String(s.clone()));
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    canonical_as_first_written(item, out);
                }
                out.push(']');
            }
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{}", Value::String(key.clone()));
                    out.push(':');
                    canonical_as_first_written(&map[key], out);
                }
                out.push('}');
            }
        }
    }

    #[test]
    fn canonical_json_is_byte_for_byte_the_first_encoding() {
        let values = [
            json!(null),
            json!(true),
            json!(-0.0),
            json!(1.5e300),
            json!(0.1),
            json!(u64::MAX),
            json!(i64::MIN),
            json!("plain"),
            json!("quote \" backslash \\ tab \t nl \n cr \r nul \u{0} bell \u{7} del \u{7f}"),
            json!("é ü 字 😀 \u{2028} \u{2029}"),
            json!({"b": 1, "a": {"z": [3, {"y": 1, "x": "é\n"}], "c": null}, "é": [], "E": {}, "": ""}),
            json!([[], {}, [{"k\"ey": "v"}], 1e-7, -12]),
        ];
        for value in values {
            let mut first = String::new();
            canonical_as_first_written(&value, &mut first);
            assert_eq!(canonical_json(&value), first, "{value}");
        }
        // And a real receipt's signing bytes.
        let at = DateTime::from_timestamp_nanos(1_764_587_000_123_456_789);
        let receipt = DrainDecisionReceipt {
            session_id: SessionId::from("sess_\"x\""),
            turn_id: Some(TurnId("turn_1".into())),
            item: DrainedItem::Injection {
                message_id: "msg_é".into(),
                mode: Some(InjectMode::Steer),
            },
            seam: Some(Seam::TurnStart),
            action: DrainAction::Delivered,
            reason: Some("line\nbreak".into()),
            decided_at: at,
        };
        let mut first = format!("{RECEIPT_ENCODING}\n{}\n", DrainDecisionReceipt::KIND);
        canonical_as_first_written(&serde_json::to_value(&receipt).unwrap(), &mut first);
        assert_eq!(receipt.signing_bytes(), first.into_bytes());
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let a = json!({"b": 1, "a": {"z": [3, {"y": 1, "x": "é\n"}], "c": null}});
        let b: Value =
            serde_json::from_str(r#"{"a":{"c":null,"z":[3,{"x":"é\n","y":1}]},"b":1}"#).unwrap();
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"c":null,"z":[3,{"x":"é\n","y":1}]},"b":1}"#
        );
        assert_eq!(sha256_of_json(&a), sha256_of_json(&b));
        assert_ne!(sha256_of_json(&a), sha256_of_json(&json!({"b": 2})));
        assert!(sha256_of_json(&a).starts_with("sha256:") && sha256_of_json(&a).len() == 71);
    }

    /// The signing bytes as every stored receipt was signed: the receipt's
    /// `Value` first, then written canonically.
    fn signing_bytes_through_value<R: Receipt>(receipt: &R) -> Vec<u8> {
        let mut out = format!("{RECEIPT_ENCODING}\n{}\n", R::KIND).into_bytes();
        let value = serde_json::to_value(receipt).unwrap_or(Value::Null);
        crate::canonical::write_value(&value, &mut out);
        out
    }

    #[test]
    fn signing_bytes_are_those_every_stored_receipt_was_signed_over() {
        use crate::suspension::{ResumeTimeout, TriggerSpec};
        let at = DateTime::from_timestamp_millis(1_700_000_000_123).unwrap();
        let leap = DateTime::from_timestamp(1_483_228_799, 1_500_000_000).unwrap();
        let suspension = SuspensionReceipt {
            handle: "susp_1".into(),
            session_id: SessionId::from("sess_1"),
            initiator: Initiator::Client,
            actor: "acp:1".into(),
            mode: SuspendMode::FinishStep,
            reason: Some("waits \"for\" CI — é".into()),
            conditions: Some(ResumeConditions {
                on_event: Some("ci.*".into()),
                trigger: Some(TriggerSpec::Cron {
                    cron: "0 9 * * 1-5".into(),
                    timezone: Some("Europe/Berlin".into()),
                }),
                timeout: Some(ResumeTimeout {
                    duration_minutes: 1.0 / 60.0,
                    on_timeout: OnTimeout::ResumeWithInput,
                    input: Some(json!({"z": [1, 2.5, null], "a": {"y": "x", "b": true}})),
                }),
            }),
            suspended_at: leap,
            turn_id: Some(TurnId::from("turn_1")),
            frame_sha256: Some("sha256:00".into()),
            span_id: None,
        };
        assert_eq!(
            suspension.signing_bytes(),
            signing_bytes_through_value(&suspension)
        );
        for trigger in [
            None,
            Some(TriggerMatch::Timeout {
                due_at: at,
                on_timeout: OnTimeout::Fail,
            }),
            Some(TriggerMatch::Time { due_at: leap }),
            Some(TriggerMatch::Event {
                name: "ci.passed".into(),
                seq: 7,
                received_at: at,
            }),
        ] {
            let resumption = ResumptionReceipt {
                handle: "susp_1".into(),
                session_id: SessionId::from("sess_1"),
                cause: ResumeCause::Timeout,
                actor: "scheduler".into(),
                input_sha256: Some("sha256:ab".into()),
                continue_transcript: true,
                suspension_span_id: Some("00f067aa0ba902b7".into()),
                suspended_at: at,
                trigger,
                lateness_ms: Some(3),
                turn_id: None,
                resumed_at: at,
            };
            assert_eq!(
                resumption.signing_bytes(),
                signing_bytes_through_value(&resumption)
            );
        }
        let outcome = crate::event::ControlOutcome {
            session_id: "sess_1".into(),
            control_id: "ctl_1".into(),
            method: "session/inject".into(),
            outcome: "accepted".into(),
            status: crate::event::ControlStatus::Accepted,
            actor: "acp:1".into(),
            target: json!({"sessionId": "sess_1", "messageId": "msg_1"}),
            reason: None,
            metadata: json!({"role": "controller", "needed": ["a", {"d": 1, "c": 0}]}),
            decided_at: at,
        };
        assert_eq!(
            outcome.signing_bytes(),
            signing_bytes_through_value(&outcome)
        );
    }

    #[test]
    fn signing_bytes_name_the_version_and_kind_and_cover_timestamps() {
        let at = DateTime::from_timestamp_millis(1_700_000_000_000).unwrap();
        let receipt = DrainDecisionReceipt {
            session_id: SessionId::from("s"),
            turn_id: None,
            item: DrainedItem::Injection {
                message_id: "msg_1".into(),
                mode: Some(InjectMode::Steer),
            },
            seam: Some(Seam::TurnStart),
            action: DrainAction::Delivered,
            reason: None,
            decided_at: at,
        };
        let bytes = String::from_utf8(receipt.signing_bytes()).unwrap();
        assert!(bytes.starts_with("berth.receipt.v1\ndrain_decision\n{"));
        assert!(bytes.contains("\"decided_at\":\"2023-11-14T22:13:20Z\""));
        let later = DrainDecisionReceipt {
            decided_at: at + chrono::Duration::milliseconds(1),
            ..receipt.clone()
        };
        assert_ne!(receipt.signing_bytes(), later.signing_bytes());
    }

    #[test]
    fn signed_receipts_serialize_flat_and_round_trip() {
        let signed = Signed::from_parts(
            DrainDecisionReceipt {
                session_id: SessionId::from("s"),
                turn_id: Some(TurnId::from("turn_1")),
                item: DrainedItem::SuspendRequest {
                    handle: "susp_1".into(),
                    mode: SuspendMode::FinishStep,
                },
                seam: None,
                action: DrainAction::Parked,
                reason: None,
                decided_at: DateTime::from_timestamp_millis(0).unwrap(),
            },
            ReceiptSignature {
                key_id: "k1".into(),
                alg: SIGNATURE_ALG.into(),
                mac: "00".repeat(32),
            },
        );
        let value = serde_json::to_value(&signed).unwrap();
        assert_eq!(value["session_id"], "s");
        assert_eq!(value["signature"]["key_id"], "k1");
        let back: Signed<DrainDecisionReceipt> = serde_json::from_value(value).unwrap();
        assert_eq!(back, signed);
    }
}
