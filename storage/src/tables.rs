//! Table definitions. Values are JSON bytes of the record types; those of
//! `frames`, `transcript_messages`, `open_turns`, `checkpoints` and
//! `suspensions` are sealed (a MAC header before the JSON, see `sealed.rs`).

use redb::TableDefinition;

/// session id → [`SessionRecord`](crate::SessionRecord).
pub const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
/// (session id, event id) → a chained row: version byte, previous event's
/// hash, this event's hash, then the
/// [`EventRecord`](berth_runtime::event::EventRecord) JSON (see `chain.rs`).
pub const EVENTS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("events");
/// session id → latest [`Frame`](berth_runtime::frame::Frame) of its open turn.
pub const FRAMES: TableDefinition<&str, &[u8]> = TableDefinition::new("frames");
/// (session id, index) → one transcript [`Message`](berth_runtime::history::Message);
/// append-only, so sealing a turn writes only that turn's messages.
pub const TRANSCRIPTS: TableDefinition<(&str, u64), &[u8]> =
    TableDefinition::new("transcript_messages");
/// session id → [`OpenTurn`](crate::OpenTurn).
pub const OPEN_TURNS: TableDefinition<&str, &[u8]> = TableDefinition::new("open_turns");
/// (session id, seq) → [`TurnCheckpoint`](crate::TurnCheckpoint).
pub const CHECKPOINTS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("checkpoints");
/// session id → its [`Suspension`](berth_runtime::suspension::Suspension); at
/// most one per session, deleted when the suspension is used up.
pub const SUSPENSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("suspensions");
/// suspension handle → the one-time [`ResumeClaim`](berth_runtime::suspension::ResumeClaim)
/// on it; written only through [`Batch::claim`](crate::Batch::claim) and never
/// overwritten.
pub const RESUME_CLAIMS: TableDefinition<&str, &[u8]> = TableDefinition::new("resume_claims");
/// session id → the [`Wakeup`](berth_runtime::suspension::Wakeup) of its
/// suspension (what the scheduler arms); written and removed with the
/// suspension, in the same transaction.
pub const WAKEUPS: TableDefinition<&str, &[u8]> = TableDefinition::new("wakeups");
/// seq (from 1) → [`ExternalEvent`](berth_runtime::suspension::ExternalEvent):
/// every event acknowledged to an emitter.
pub const EXTERNAL_EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("external_events");
/// name → counter (`events_matched`: the last external event whose matches
/// were fired; `format_version`: the journal format, see
/// [`JOURNAL_FORMAT`](crate::JOURNAL_FORMAT)).
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// schedule id → [`Schedule`](berth_runtime::suspension::Schedule).
pub const SCHEDULES: TableDefinition<&str, &[u8]> = TableDefinition::new("schedules");
/// session id → its chain head (last event seq and hash, MACed with the
/// receipt keyring; JSON). Written by the writer in every transaction that
/// appends to the session.
pub const CHAIN_HEADS: TableDefinition<&str, &[u8]> = TableDefinition::new("chain_heads");
