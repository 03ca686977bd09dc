//! The commit log: what makes a group commit durable. DESIGN.md ("The
//! journal") has the journal as one redb file; this log beside it is the one
//! departure, for the reason below.
//!
//! A durable redb commit writes every B-tree page the transaction dirtied,
//! wherever it lies in the file, then fsyncs: in a wake-up burst that is
//! about three scattered 4 KiB pages per woken session, and the kernel's
//! cost per page (copy, writeback, one virtio request each) was most of the
//! writer thread's time. So a group is made durable the way databases with
//! a write-ahead log do it:
//!
//! 1. its batches, encoded ([`codec`]), are appended to `journal.log` as one
//!    record and the file is `fdatasync`ed — one sequential write;
//! 2. they are applied to redb in a transaction committed with
//!    `Durability::None` (no I/O: redb keeps the pages in its write buffer),
//!    which also records the record's sequence number (table `meta`, key
//!    [`LOG_SEQ_KEY`]);
//! 3. only then is each batch answered. Readers see a group only after step 2,
//!    so nothing a crash can lose is ever visible.
//!
//! Every so often (the log has grown past [`CHECKPOINT_BYTES`], or the
//! writer has had nothing to do for [`IDLE_CHECKPOINT`], or the journal
//! closes) a redb commit is made with `Durability::Immediate`: it writes the
//! pages of every group since the last one (a page changed by many groups is
//! written once) and then the log is emptied. After a crash, opening the
//! journal replays the log's records whose sequence number is above the one
//! redb has durably (`writer::replay`), through the same code that applied them
//! first: applying a batch depends only on the journal's state before it, so
//! the replay leaves exactly what the acknowledged groups left.
//!
//! Each open of the journal numbers its records from [`LINEAGE_GAP`] past
//! the last one redb holds, so a log of an earlier open can never pass for
//! this one's. And redb records whether the log may hold acknowledged
//! groups it does not ([`LOG_IN_USE_KEY`]): a log missing after a crash is
//! refused ([`check_present`]), not read as empty.
//!
//! A record is `[payload length: u32 LE][CRC-32 of seq and payload: u32 LE]
//! [seq: u64 LE][payload]`. A torn last record (the process died while
//! writing it, so it was never acknowledged) fails its length or checksum
//! and ends the log, as does a record whose seq does not follow the one
//! before it. A damaged record with a whole record after it that redb does
//! not hold is refused instead (see [`parse_checked`]): acknowledged groups
//! would be lost past it.
//!
//! The file is reused, not truncated: emptying the log moves the write
//! position back to 0 (and zeroes the first header), and the file is kept
//! at least [`PREALLOCATED_BYTES`] long (zeros written at open; a stopping
//! journal gives the blocks back). An append then overwrites blocks the file
//! already has, so its `fdatasync` has no file size or block allocation to
//! commit — on this kind of disk that is 120 µs against 190 µs for an append
//! that grows the file (issue 9's floor). What follows the last record is
//! zeros, a torn record, or records of before the last emptying: all of
//! those end the log (bad checksum, or a seq that does not follow), and the
//! old records a reader does meet first have seqs redb already holds, which
//! replay skips.

pub(crate) mod codec;

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `meta` key holding the sequence number of the last log record applied
/// to redb (0: none yet).
pub(crate) const LOG_SEQ_KEY: &str = "commit_log_seq";

/// The `meta` key that says whether the log may hold acknowledged groups
/// redb does not hold durably: 1 from the journal's open (and again before
/// the first group after a [`Journal::flush_log`](crate::Journal::flush_log))
/// until a stop has made redb durable and emptied the log, then 0; absent
/// means 0. It tells a log that was deleted after a crash, which loses
/// acknowledged groups, from one deleted after a clean stop, which loses
/// nothing (see [`check_present`]).
pub(crate) const LOG_IN_USE_KEY: &str = "commit_log_in_use";

/// How far each open of the journal moves the sequence numbering on
/// (`writer::start_lineage`): the records one open writes can never be read
/// as another's. Without it, a log from before a crash that was given up on
/// (deleted, `journal.log` created empty, and later put back) would hold
/// the very numbers the journal went on to use, and pass for the next
/// records. A log holds far fewer records than this (64 MiB of records of
/// at least 16 bytes).
pub(crate) const LINEAGE_GAP: u64 = 1 << 32;

/// Past this many bytes of log, the next group commits durably to redb and
/// the log is emptied (64 MiB: about 10,000 woken sessions of the
/// `bench-sched` burst; redb's write buffer holds their pages meanwhile).
pub(crate) const CHECKPOINT_BYTES: u64 = 64 * 1024 * 1024;

/// After this long without a request, the writer commits durably to redb
/// and empties the log, so that a journal at rest is whole in its redb file.
/// Short, so that the pages of a burst of work are written while the node
/// waits for what the burst set up (a burst of suspends is folded in before
/// their timers come due, not while they fire): such a durable commit holds
/// the writer, and readers of pages it is writing, while it lasts.
pub(crate) const IDLE_CHECKPOINT: Duration = Duration::from_millis(100);

/// Bytes before a record's payload.
const HEADER: usize = 16;

/// The log file is kept at least this long (zeros), so that appends
/// overwrite allocated blocks (8 MiB: the groups of about a thousand woken
/// sessions; the log is emptied after 100 ms idle).
pub(crate) const PREALLOCATED_BYTES: u64 = 8 * 1024 * 1024;

/// The commit log beside the journal file `journal` (`journal.log` for
/// `journal.redb`).
pub(crate) fn path_beside(journal: &Path) -> PathBuf {
    journal.with_extension("log")
}

/// Empties `buffer` and leaves room for a record's header: write the
/// payload after it, then hand the buffer to [`CommitLog::append`].
pub(crate) fn new_record(buffer: &mut Vec<u8>) {
    buffer.clear();
    buffer.resize(HEADER, 0);
}

/// One record read back: its sequence number and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The record's sequence number (from 1, one more than the record
    /// before it).
    pub seq: u64,
    /// The encoded group ([`codec::decode_group`]).
    pub payload: Vec<u8>,
}

/// The open commit log.
#[derive(Debug)]
pub(crate) struct CommitLog {
    file: File,
    /// Bytes of live records at the start of the file (where the next one
    /// goes).
    len: u64,
    /// The file's length (at least `len`).
    size: u64,
}

fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&seq.to_le_bytes());
    crc.update(payload);
    crc.finalize()
}

/// Splits `bytes` into whole records; returns them and the length of the
/// whole-record prefix (a torn or garbled tail, and any record after a gap
/// in the sequence, end the log there).
fn parse(bytes: &[u8]) -> (Vec<Record>, u64) {
    let mut records: Vec<Record> = Vec::new();
    let mut at = 0usize;
    while bytes.len() - at >= HEADER {
        let field = |from: usize, n: usize| &bytes[at + from..at + from + n];
        let len = u32::from_le_bytes(field(0, 4).try_into().unwrap_or_default()) as usize;
        let crc = u32::from_le_bytes(field(4, 4).try_into().unwrap_or_default());
        let seq = u64::from_le_bytes(field(8, 8).try_into().unwrap_or_default());
        if bytes.len() - at - HEADER < len {
            break;
        }
        let payload = &bytes[at + HEADER..at + HEADER + len];
        if checksum(seq, payload) != crc {
            break;
        }
        if records.last().is_some_and(|last| seq != last.seq + 1) {
            break;
        }
        records.push(Record {
            seq,
            payload: payload.to_vec(),
        });
        at += HEADER + len;
    }
    (records, at as u64)
}

/// A whole record at or after byte `from` whose seq is above `above`: its
/// offset and seq. Only the middle of a damaged log holds one: after the
/// last live record come zeros, a torn record (whose append was never
/// answered, so no record was written after it) or records from before the
/// last emptying, whose seqs redb holds (at most `above`).
fn record_beyond(bytes: &[u8], from: usize, above: u64) -> Option<(usize, u64)> {
    let word = |at: usize, n: usize| {
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(&bytes[at..at + n]);
        u64::from_le_bytes(v)
    };
    let mut at = from;
    while at + HEADER <= bytes.len() {
        if bytes[at] == 0 {
            // Skip zeros quickly; a header's length field (never 0: a group
            // holds at least its batch count) has at most 3 zero bytes first.
            match bytes[at..].iter().position(|&b| b != 0) {
                Some(n) if n > 3 => {
                    at += n - 3;
                    continue;
                }
                Some(_) => {}
                None => return None,
            }
        }
        let seq = word(at + 8, 8);
        if seq > above && seq - above <= u64::from(u32::MAX) {
            let len = word(at, 4) as usize;
            let crc = word(at + 4, 4) as u32;
            let end = at + HEADER + len;
            if end <= bytes.len() && checksum(seq, &bytes[at + HEADER..end]) == crc {
                return Some((at, seq));
            }
        }
        at += 1;
    }
    None
}

/// The whole records of `bytes` (see [`parse`]), or an
/// [`std::io::ErrorKind::InvalidData`] error when a whole record with a seq
/// above `applied` (redb's) and above the last record read lies after the
/// point where reading stopped: the log is damaged in the middle, and
/// acknowledged groups after the damage would be lost.
fn parse_checked(bytes: &[u8], applied: u64) -> std::io::Result<(Vec<Record>, u64)> {
    let (records, end) = parse(bytes);
    let above = records.last().map_or(applied, |r| r.seq.max(applied));
    if let Some((at, seq)) = record_beyond(bytes, end as usize, above) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "the record at byte {end} is damaged, and an acknowledged record ({seq}, at \
                 byte {at}) follows it: the groups after the damage cannot be replayed; restore \
                 journal.log from a copy, or move it aside to start without them (they are lost)"
            ),
        ));
    }
    Ok((records, end))
}

/// Refuses to open a journal without its log at `path` when the log may
/// hold acknowledged groups (`in_use`: [`LOG_IN_USE_KEY`] is 1, so the last
/// berth on this journal did not stop cleanly). A log that is only missing
/// after a clean stop held nothing: it is created again.
///
/// # Errors
/// [`std::io::ErrorKind::InvalidData`] (the journal is reported corrupt,
/// table `commit_log`) for a missing log that was in use; other I/O errors
/// looking for the file.
pub(crate) fn check_present(path: &Path, in_use: bool) -> std::io::Result<()> {
    if !in_use {
        return Ok(());
    }
    // Follows a symlink: a link to nothing is a missing log.
    match std::fs::metadata(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the commit log is missing, and the last berth on this journal did not stop \
             cleanly: the groups it acknowledged after its last checkpoint (the last \
             100 ms idle pause, or up to 64 MiB of log) were only in that file. Restore journal.log from \
             a copy, or create it empty to open the journal without them (they are lost)",
        )),
        Err(e) => Err(e),
    }
}

/// Reads the log at `path` without changing it: its whole records in order
/// (none when there is no file). `applied` is the last seq redb holds.
///
/// # Errors
/// I/O errors reading the file; [`std::io::ErrorKind::InvalidData`] for a
/// log damaged in the middle (see [`parse_checked`]).
pub(crate) fn read(path: &Path, applied: u64) -> std::io::Result<Vec<Record>> {
    let mut bytes = Vec::new();
    match crate::private::open_read_only(path) {
        Ok(mut file) => {
            file.read_to_end(&mut bytes)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    }
    Ok(parse_checked(&bytes, applied)?.0)
}

impl CommitLog {
    /// Opens (or creates) the log at `path`; returns it with its whole
    /// records, and extends the file with zeros to [`PREALLOCATED_BYTES`].
    /// The next record goes after the last whole one. `applied` is the last
    /// seq redb holds.
    ///
    /// # Errors
    /// I/O errors opening, reading or extending the file;
    /// [`std::io::ErrorKind::InvalidData`] for a log damaged in the middle
    /// (see [`parse_checked`]): nothing is written then.
    pub(crate) fn open(path: &Path, applied: u64) -> std::io::Result<(Self, Vec<Record>)> {
        let mut file = crate::private::open(
            path,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
        )?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (records, len) = parse_checked(&bytes, applied)?;
        if (len as usize) < bytes.len() && bytes[len as usize] != 0 {
            tracing::debug!(
                path = %path.display(),
                at = len,
                "the journal's commit log ends in a torn record (its append was never \
                 answered) or in records it already holds; they are written over"
            );
        }
        let mut log = Self {
            file,
            len,
            size: bytes.len() as u64,
        };
        log.preallocate()?;
        Ok((log, records))
    }

    /// Writes zeros up to [`PREALLOCATED_BYTES`] (durably), so that appends
    /// overwrite allocated blocks.
    fn preallocate(&mut self) -> std::io::Result<()> {
        if self.size >= PREALLOCATED_BYTES {
            return Ok(());
        }
        let chunk = vec![0u8; 1024 * 1024];
        while self.size < PREALLOCATED_BYTES {
            let n = chunk.len().min((PREALLOCATED_BYTES - self.size) as usize);
            self.file.write_all_at(&chunk[..n], self.size)?;
            self.size += n as u64;
        }
        self.file.sync_all()
    }

    /// Bytes of records in the log.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Appends record `seq` and waits until it is on disk (`fdatasync`).
    /// `record` is [`new_record`]'s buffer with the payload written after
    /// the room it left; the header is filled in place (the payload is not
    /// copied again). On failure the record's header is overwritten with
    /// zeros, so nothing of it can be replayed.
    ///
    /// # Errors
    /// The I/O error; if removing the record failed too, that error (the
    /// log can no longer be appended to: the caller stops committing).
    pub(crate) fn append(&mut self, seq: u64, record: &mut [u8]) -> Result<(), AppendError> {
        let payload_len = record.len().saturating_sub(HEADER);
        let len = u32::try_from(payload_len).map_err(|_| {
            AppendError::Failed(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a group of more than 4 GiB",
            ))
        })?;
        let crc = checksum(seq, &record[HEADER..]);
        record[0..4].copy_from_slice(&len.to_le_bytes());
        record[4..8].copy_from_slice(&crc.to_le_bytes());
        record[8..16].copy_from_slice(&seq.to_le_bytes());
        let written = self
            .file
            .write_all_at(record, self.len)
            .and_then(|()| self.file.sync_data());
        let end = self.len + record.len() as u64;
        self.size = self.size.max(end);
        match written {
            Ok(()) => {
                self.len = end;
                Ok(())
            }
            Err(e) => match self.invalidate(self.len) {
                Ok(()) => Err(AppendError::Failed(e)),
                Err(cut) => Err(AppendError::Broken(cut)),
            },
        }
    }

    /// Removes the last record (appended at `before` bytes): the group it
    /// holds was not applied after all, so it must not be replayed.
    ///
    /// # Errors
    /// The I/O error (the caller stops committing).
    pub(crate) fn undo_last(&mut self, before: u64) -> std::io::Result<()> {
        self.invalidate(before)
    }

    /// Empties the log once redb holds every record durably: the next record
    /// goes at the start again, and the first header is zeroed so that a
    /// reader finds no record. That write is not synced: should a crash lose
    /// it, the old records are found, and they are at or below redb's
    /// sequence number, which replay skips. A file grown past twice
    /// [`CHECKPOINT_BYTES`] (one huge group) is cut back to
    /// [`PREALLOCATED_BYTES`].
    ///
    /// # Errors
    /// The I/O error (harmless: the old records stay readable and skipped).
    pub(crate) fn clear(&mut self) -> std::io::Result<()> {
        self.len = 0;
        self.file.write_all_at(&[0; HEADER], 0)?;
        if self.size > 2 * CHECKPOINT_BYTES {
            self.file.set_len(PREALLOCATED_BYTES)?;
            self.size = PREALLOCATED_BYTES;
        }
        Ok(())
    }

    /// Empties the log and gives its file's blocks back (length 0), when
    /// the journal stops: the next open then finds nothing to read past the
    /// records (a reused file is scanned to its end for damage, see
    /// [`parse_checked`]) and writes its zeros again. Call only once redb
    /// holds every record durably.
    ///
    /// # Errors
    /// The I/O error (harmless: the old records stay, and are skipped).
    pub(crate) fn release(&mut self) -> std::io::Result<()> {
        self.len = 0;
        self.file.set_len(0)?;
        self.size = 0;
        Ok(())
    }

    /// Overwrites the header of the record at `at` with zeros (durably), so
    /// the log ends there, and writes from there on.
    fn invalidate(&mut self, at: u64) -> std::io::Result<()> {
        self.file.write_all_at(&[0; HEADER], at)?;
        self.file.sync_data()?;
        self.len = at;
        Ok(())
    }
}

/// Why [`CommitLog::append`] failed.
#[derive(Debug)]
pub(crate) enum AppendError {
    /// Nothing was appended (the log is as it was).
    Failed(std::io::Error),
    /// A partial record may be left and could not be removed.
    Broken(std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(log: &mut CommitLog, seq: u64, payload: &[u8]) {
        let mut record = Vec::new();
        new_record(&mut record);
        record.extend_from_slice(payload);
        log.append(seq, &mut record).unwrap();
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let (mut log, records) = CommitLog::open(&path, 0).unwrap();
        assert!(records.is_empty());
        append(&mut log, 1, b"one");
        append(&mut log, 2, b"");
        append(&mut log, 3, b"three");
        let whole = log.len();
        drop(log);
        let expect = |seqs: &[u64]| {
            let records = read(&path, 0).unwrap();
            assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), seqs);
        };
        expect(&[1, 2, 3]);
        assert_eq!(read(&path, 0).unwrap()[2].payload, b"three");

        // The file is preallocated with zeros, which end the log.
        assert_eq!(std::fs::metadata(&path).unwrap().len(), PREALLOCATED_BYTES);

        // A record cut short, then one with a bad checksum: both end the log.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(whole - 2).unwrap();
        expect(&[1, 2]);
        let (mut log, records) = CommitLog::open(&path, 0).unwrap();
        assert_eq!(records.len(), 2);
        // The next record overwrites the torn one.
        append(&mut log, 3, b"3");
        drop(log);
        expect(&[1, 2, 3]);
        // Records 1 and 2 take 19 and 16 bytes; the new record 3's payload
        // is byte 51. Damaged, it ends the log.
        assert_eq!(whole, 56);
        let mut bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes[51], b'3');
        bytes[51] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        expect(&[1, 2]);
    }

    /// A record whose seq does not follow ends the log; one redb does not
    /// hold yet is then refused as damage (a record between went missing).
    #[test]
    fn a_gap_in_the_sequence_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let (mut log, _) = CommitLog::open(&path, 0).unwrap();
        append(&mut log, 7, b"a");
        append(&mut log, 9, b"b");
        assert_eq!(read(&path, 9).unwrap().len(), 1);
        let err = read(&path, 7).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
        assert!(read(&dir.path().join("missing.log"), 0).unwrap().is_empty());
    }

    /// A record damaged in the middle of the log, with acknowledged records
    /// after it, is an error, not the end of the log; damage to the last
    /// record (a torn append) is not.
    #[test]
    fn damage_before_later_records_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let (mut log, _) = CommitLog::open(&path, 0).unwrap();
        for seq in 1..=4 {
            append(&mut log, seq, format!("group {seq}").as_bytes());
        }
        drop(log);
        let whole = std::fs::read(&path).unwrap();
        // Each record is 16 + 7 bytes: flip a payload byte of record 2, then
        // a length byte of record 2 (its header no longer leads to record 3).
        for at in [23 + 20, 23] {
            let mut bytes = whole.clone();
            bytes[at] ^= 0x40;
            std::fs::write(&path, &bytes).unwrap();
            let err = read(&path, 0).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
            assert!(err.to_string().contains("(3, at byte 46)"), "{err}");
            assert!(CommitLog::open(&path, 0).is_err());
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing written");
            // Records redb already holds past the damage are no loss.
            assert_eq!(read(&path, 4).unwrap().len(), 1);
        }
        // The last record damaged: the log ends before it.
        let mut bytes = whole.clone();
        bytes[3 * 23 + 20] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(read(&path, 0).unwrap().len(), 3);
    }

    /// After `clear`, records go at the start again, over the old ones; what
    /// is left of those after the new records never reads as their
    /// continuation.
    #[test]
    fn a_cleared_log_is_overwritten_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let (mut log, _) = CommitLog::open(&path, 0).unwrap();
        for seq in 1..=5 {
            append(&mut log, seq, b"an old record");
        }
        // Cleared once redb holds 1..=5: what is left of those is skipped.
        log.clear().unwrap();
        assert!(read(&path, 5).unwrap().is_empty());
        append(&mut log, 6, b"new");
        append(&mut log, 7, b"an old record");
        let seqs: Vec<u64> = read(&path, 5).unwrap().iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [6, 7]);
        let (_, records) = CommitLog::open(&path, 5).unwrap();
        assert_eq!(records.len(), 2);
    }

    /// An undone record (its group was not applied) is gone for readers,
    /// and the next record takes its place.
    #[test]
    fn an_undone_record_is_not_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.log");
        let (mut log, _) = CommitLog::open(&path, 0).unwrap();
        append(&mut log, 1, b"kept");
        let before = log.len();
        append(&mut log, 2, b"undone");
        log.undo_last(before).unwrap();
        assert_eq!(read(&path, 0).unwrap().len(), 1);
        append(&mut log, 2, b"again");
        let records = read(&path, 0).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[1].payload, b"again");
    }
}
