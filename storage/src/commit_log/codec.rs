//! A group of batches as a commit-log record payload, and back.
//!
//! Little-endian, length-prefixed: `[batches: u32]`, then per batch
//! `[preconditions: u8 bit set: 1 fence, 2 claim, 4 suspension]`, the
//! present preconditions (fence: session, turn; claim: handle, row;
//! suspension: session, handle), `[ops: u32]` and each op as its tag (see
//! [`tag`]) and its fields in declaration order. Strings and rows are
//! `[length: u32][bytes]`, numbers `u64`. Rows are stored as the batch holds
//! them (already encoded by the caller), so encoding is copying.

use crate::batch::{Batch, Op, PendingClaim, SessionRow};

const FENCE: u8 = 1;
const CLAIM: u8 = 2;
const SUSPENSION: u8 = 4;

/// The tag of an op in a record. Never renumber: records written by one
/// berth are replayed by the next.
fn tag(op: &Op) -> u8 {
    match op {
        Op::PutSession { .. } => 1,
        Op::AppendEvent { .. } => 2,
        Op::PutFrame { .. } => 3,
        Op::DeleteFrame { .. } => 4,
        Op::PutTranscriptMessage { .. } => 5,
        Op::OpenTurn { .. } => 6,
        Op::CloseTurn { .. } => 7,
        Op::PutCheckpoint { .. } => 8,
        Op::DeleteCheckpointsFrom { .. } => 9,
        Op::TruncateTranscript { .. } => 10,
        Op::PutWakeup { .. } => 11,
        Op::AppendExternalEvent { .. } => 12,
        Op::PutSchedule { .. } => 13,
        Op::DeleteSchedule { .. } => 14,
        Op::PutMeta { .. } => 15,
        Op::PutSuspension { .. } => 16,
        Op::DeleteSuspension { .. } => 17,
    }
}

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: usize) {
        // Lengths past 4 GiB cannot occur: frames are bounded far below.
        self.0
            .extend_from_slice(&u32::try_from(v).unwrap_or(u32::MAX).to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len());
        self.0.extend_from_slice(v);
    }
}

/// Appends the encoding of `batches` (in order) to `out`.
pub(crate) fn encode_group<'b>(
    batches: impl ExactSizeIterator<Item = &'b Batch>,
    out: &mut Vec<u8>,
) {
    let mut w = Writer(out);
    w.u32(batches.len());
    for batch in batches {
        let flags = if batch.fence.is_some() { FENCE } else { 0 }
            | if batch.claim.is_some() { CLAIM } else { 0 }
            | if batch.suspension.is_some() {
                SUSPENSION
            } else {
                0
            };
        w.u8(flags);
        if let Some((session, turn)) = &batch.fence {
            w.bytes(session.as_bytes());
            w.bytes(turn.as_bytes());
        }
        if let Some(PendingClaim { handle, value }) = &batch.claim {
            w.bytes(handle.as_bytes());
            w.bytes(value);
        }
        if let Some((session, handle)) = &batch.suspension {
            w.bytes(session.as_bytes());
            w.bytes(handle.as_bytes());
        }
        w.u32(batch.ops.len());
        for op in &batch.ops {
            w.u8(tag(op));
            match op {
                Op::PutSession { id, value } => {
                    w.bytes(id.as_bytes());
                    w.bytes(&value.bytes());
                }
                Op::AppendEvent { id, value }
                | Op::PutFrame { id, value }
                | Op::PutWakeup { id, value }
                | Op::PutSchedule { id, value }
                | Op::PutSuspension { id, value } => {
                    w.bytes(id.as_bytes());
                    w.bytes(value);
                }
                Op::DeleteFrame { id }
                | Op::CloseTurn { id }
                | Op::DeleteSchedule { id }
                | Op::DeleteSuspension { id } => w.bytes(id.as_bytes()),
                Op::PutTranscriptMessage { id, index, value } => {
                    w.bytes(id.as_bytes());
                    w.u64(*index);
                    w.bytes(value);
                }
                Op::OpenTurn { id, turn, value } => {
                    w.bytes(id.as_bytes());
                    w.bytes(turn.as_bytes());
                    w.bytes(value);
                }
                Op::PutCheckpoint { id, seq, value } => {
                    w.bytes(id.as_bytes());
                    w.u64(*seq);
                    w.bytes(value);
                }
                Op::DeleteCheckpointsFrom { id, seq } => {
                    w.bytes(id.as_bytes());
                    w.u64(*seq);
                }
                Op::TruncateTranscript { id, from } => {
                    w.bytes(id.as_bytes());
                    w.u64(*from);
                }
                Op::AppendExternalEvent { value } => w.bytes(value),
                Op::PutMeta { key, value } => {
                    w.bytes(key.as_bytes());
                    w.u64(*value);
                }
            }
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| format!("record ends inside a field at byte {}", self.at))?;
        let field = &self.bytes[self.at..end];
        self.at = end;
        Ok(field)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<usize, String> {
        let mut v = [0; 4];
        v.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(v) as usize)
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut v = [0; 8];
        v.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(v))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, String> {
        let n = self.u32()?;
        Ok(self.take(n)?.to_vec())
    }
    fn string(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?)
            .map_err(|_| format!("a key that is not UTF-8 before byte {}", self.at))
    }
}

/// Decodes a payload written by [`encode_group`].
///
/// # Errors
/// A message saying where the payload is malformed (a record whose checksum
/// matched but that this berth cannot read: written by a newer berth).
pub(crate) fn decode_group(payload: &[u8]) -> Result<Vec<Batch>, String> {
    let mut r = Reader {
        bytes: payload,
        at: 0,
    };
    let count = r.u32()?;
    // Each batch takes at least 5 bytes: bound the allocation by the payload.
    let mut batches = Vec::with_capacity(count.min(payload.len() / 5));
    for _ in 0..count {
        let flags = r.u8()?;
        if flags & !(FENCE | CLAIM | SUSPENSION) != 0 {
            return Err(format!("unknown batch flags {flags:#x}"));
        }
        let mut batch = Batch::new();
        if flags & FENCE != 0 {
            batch.fence = Some((r.string()?, r.string()?));
        }
        if flags & CLAIM != 0 {
            batch.claim = Some(PendingClaim {
                handle: r.string()?,
                value: r.bytes()?,
            });
        }
        if flags & SUSPENSION != 0 {
            batch.suspension = Some((r.string()?, r.string()?));
        }
        let ops = r.u32()?;
        batch.ops.reserve(ops.min(payload.len()));
        for _ in 0..ops {
            let op = match r.u8()? {
                1 => Op::PutSession {
                    id: r.string()?,
                    value: SessionRow::Encoded(r.bytes()?),
                },
                2 => Op::AppendEvent {
                    id: r.string()?,
                    value: r.bytes()?,
                },
                3 => Op::PutFrame {
                    id: r.string()?,
                    value: r.bytes()?,
                },
                4 => Op::DeleteFrame { id: r.string()? },
                5 => Op::PutTranscriptMessage {
                    id: r.string()?,
                    index: r.u64()?,
                    value: r.bytes()?,
                },
                6 => Op::OpenTurn {
                    id: r.string()?,
                    turn: r.string()?,
                    value: r.bytes()?,
                },
                7 => Op::CloseTurn { id: r.string()? },
                8 => Op::PutCheckpoint {
                    id: r.string()?,
                    seq: r.u64()?,
                    value: r.bytes()?,
                },
                9 => Op::DeleteCheckpointsFrom {
                    id: r.string()?,
                    seq: r.u64()?,
                },
                10 => Op::TruncateTranscript {
                    id: r.string()?,
                    from: r.u64()?,
                },
                11 => Op::PutWakeup {
                    id: r.string()?,
                    value: r.bytes()?,
                },
                12 => Op::AppendExternalEvent { value: r.bytes()? },
                13 => Op::PutSchedule {
                    id: r.string()?,
                    value: r.bytes()?,
                },
                14 => Op::DeleteSchedule { id: r.string()? },
                15 => Op::PutMeta {
                    key: r.string()?,
                    value: r.u64()?,
                },
                16 => Op::PutSuspension {
                    id: r.string()?,
                    value: r.bytes()?,
                },
                17 => Op::DeleteSuspension { id: r.string()? },
                other => return Err(format!("unknown op tag {other}")),
            };
            batch.ops.push(op);
        }
        batches.push(batch);
    }
    if r.at != payload.len() {
        return Err(format!(
            "{} bytes after the last batch",
            payload.len() - r.at
        ));
    }
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_op() -> Vec<Op> {
        let id = || "sess_1".to_owned();
        let value = || br#"{"k":"v \u00e9"}"#.to_vec();
        vec![
            Op::PutSession {
                id: id(),
                value: SessionRow::Encoded(value()),
            },
            Op::AppendEvent {
                id: id(),
                value: value(),
            },
            Op::PutFrame {
                id: id(),
                value: value(),
            },
            Op::DeleteFrame { id: id() },
            Op::PutTranscriptMessage {
                id: id(),
                index: 3,
                value: value(),
            },
            Op::OpenTurn {
                id: id(),
                turn: "turn_1".into(),
                value: value(),
            },
            Op::CloseTurn { id: id() },
            Op::PutCheckpoint {
                id: id(),
                seq: 4,
                value: value(),
            },
            Op::DeleteCheckpointsFrom { id: id(), seq: 5 },
            Op::TruncateTranscript { id: id(), from: 6 },
            Op::PutWakeup {
                id: id(),
                value: value(),
            },
            Op::AppendExternalEvent { value: value() },
            Op::PutSchedule {
                id: "sch_1".into(),
                value: value(),
            },
            Op::DeleteSchedule { id: "sch_1".into() },
            Op::PutMeta {
                key: "events_matched".into(),
                value: u64::MAX,
            },
            Op::PutSuspension {
                id: id(),
                value: value(),
            },
            Op::DeleteSuspension { id: id() },
        ]
    }

    #[test]
    fn every_op_and_precondition_round_trips() {
        let mut full = Batch::new();
        full.ops = every_op();
        full.fence = Some(("sess_1".into(), "turn_1".into()));
        full.claim = Some(PendingClaim {
            handle: "susp_1".into(),
            value: b"{}".to_vec(),
        });
        full.suspension = Some(("sess_1".into(), "susp_1".into()));
        let group = [full, Batch::new()];
        let mut payload = Vec::new();
        encode_group(group.iter(), &mut payload);
        let back = decode_group(&payload).unwrap();
        assert_eq!(format!("{back:?}"), format!("{group:?}"));
        assert_eq!(
            every_op().iter().map(tag).collect::<Vec<_>>(),
            (1..=17).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_malformed_payload_is_an_error_not_a_panic() {
        let mut batch = Batch::new();
        batch.ops = every_op();
        let mut payload = Vec::new();
        encode_group([batch].iter(), &mut payload);
        for cut in 0..payload.len() {
            assert!(decode_group(&payload[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = payload.clone();
        extra.push(0);
        assert!(decode_group(&extra).is_err());
        let mut bad_tag = payload.clone();
        // The first op's tag follows the batch count (4), the flags (1)
        // and the op count (4).
        assert_eq!(bad_tag[9], 1);
        bad_tag[9] = 99;
        assert_eq!(decode_group(&bad_tag).unwrap_err(), "unknown op tag 99");
        assert!(decode_group(&[255, 255, 255, 255]).is_err());
    }
}
