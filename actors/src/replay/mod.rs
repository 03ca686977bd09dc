//! `berth replay`: deterministic replay of a session from its journal
//! (DESIGN.md, "Deterministic replay"; issue 6).
//!
//! The journal holds what a session's turns produced (their events and
//! receipts) and, on each run's replay tape (`berth_runtime::tape`), every
//! non-deterministic input they consumed: model responses, tool outcomes,
//! permission answers, the engine's clock readings, the run's configuration.
//! Controls (`session/inject`, `session/cancel`, `session/suspend`,
//! `session/resume` …) are journaled as they were accepted, and what the turn
//! did with them — the seam an injection was delivered at, where a suspension
//! parked, which call a cancel stopped — is in the events.
//!
//! [`replay_session`] walks a session's log in order and re-runs every run of
//! every turn through the real engine (`berth_runtime::engine::run_turn` /
//! `resume_turn`) with stand-ins that play the tape — it never calls a model
//! and never runs a tool — feeding each recorded control at the point it took
//! effect (see `sequencer`). Every event the engine emits, and every event
//! and receipt the session actor's own code derives from how the run left
//! the engine (`turn_ended`, the park with its `SuspensionReceipt` over the
//! frame's hash, drain receipts), is compared byte for byte with the stored
//! row; receipts are re-signed with the key their recorded counterpart
//! names. Between runs the session-level decisions are re-derived the same
//! way: an idle park, the seal of a parked turn (cancel, close, a `fail`
//! timeout, a fresh-transcript resume), and each `ResumptionReceipt` — whose
//! `input_sha256` is checked against the journaled resume input first.
//!
//! The first difference is a [`ReplayError::Nondeterminism`] naming the
//! recorded event (seq, type, expected vs got) — Temporal's model. Clock
//! readings and ids the actor consumed (`at`, `decided_at`, `suspended_at`,
//! handles, control ids, a suspension's OpenTelemetry span id) are taken
//! from the recorded events, as inputs. Replay opens no session spans of
//! its own and `berth replay` exports none.
//!
//! Not re-derived (recorded as inputs and only signature-checked with
//! `--verify`): the receipts of controls themselves (`control_outcome` of an
//! inject, a cancel, a refused request), `session_closed`, rollback/redo
//! (their effect on the transcript is replayed). A run berth had to seal or
//! park at start-up after a crash is replayed up to the crash; the replay
//! stops there and says so ([`ReplayReport::cut_short`]).

mod inputs;
mod run;
mod sequencer;

use std::path::Path;
use std::sync::Arc;

use berth_runtime::event::{EventRecord, SessionEvent};
use berth_runtime::history::{Message, Transcript};
use berth_runtime::ids::{SessionId, TurnId};
use berth_runtime::receipt::{sha256_of_json, ResumptionReceipt};
use berth_runtime::suspension::{SpanLink, SuspendRequest, Suspension};
use berth_runtime::tape::TapedRecord;
use berth_runtime::tools::ToolSet;
use berth_storage::readonly::read_session;
use berth_storage::verify::{verify_session, Finding, Verdict};
use berth_storage::{Keyring, SessionRecord, StorageError};
use serde::Serialize;
use serde_json::Value;

use self::inputs::{FixedClock, ReplayEnv, ReplayIds};
use self::sequencer::{is_input, Row, SeqState};
use crate::session::lifecycle::{resume, suspend};
use crate::session::receipt::stamp;
use crate::session::seal::seal_parked;

/// The span links of suspension `handle` as its journaled
/// `SuspensionReceipt` (the first one in `rows`) names them: the suspend
/// span's id, or nothing when the park was recorded without OpenTelemetry
/// export. A span id is a generated id, so replay feeds it back as an input
/// (like a handle) instead of opening a span of its own: the re-derived
/// `SuspensionReceipt` and the `ResumptionReceipt`'s `suspension_span_id`
/// are then byte-identical to the recorded ones whether export was on or
/// off. Only the span id is journaled outside the envelope (which is
/// deleted on resume), so the link's trace id is left empty and the turn's
/// link is not restored: replay uses the links for nothing but receipts.
fn recorded_span_links(rows: &[Row], handle: &str) -> Vec<SpanLink> {
    rows.iter()
        .find_map(|r| match &r.rec.event {
            SessionEvent::SuspensionReceipt(s) if s.receipt.handle == handle => {
                Some(s.receipt.span_id.clone())
            }
            _ => None,
        })
        .flatten()
        .map(|span_id| SpanLink {
            trace_id: String::new(),
            span_id,
        })
        .into_iter()
        .collect()
}

/// How to replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// The tools whose presentation code (spec, kind, title, concurrency)
    /// the replayed runs use, by name — never their execution. Default: the
    /// built-in set ([`ToolSet::builtin`]); a session recorded with other
    /// tools needs them here.
    pub tools: ToolSet,
    /// Check the session's hash chain and every receipt signature first
    /// (as `berth verify` does for that session); a tampered log is
    /// [`ReplayError::Tampered`] instead of a replay.
    pub verify: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            tools: ToolSet::builtin(),
            verify: false,
        }
    }
}

/// The first difference between a replay and the journal.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Divergence {
    /// The recorded event (seq) the replay could not reproduce; for an event
    /// the replay produced past the end of the log, the seq it would have.
    pub seq: u64,
    /// That event's type (`tool_call`, `suspension_receipt`, …), or what
    /// differed when it is not an event (`model_request`).
    pub event_type: String,
    /// The turn being replayed, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<TurnId>,
    /// What the journal holds (the event's JSON).
    pub expected: Option<Value>,
    /// What the replay produced instead (`None`: nothing — it stopped, or
    /// waits for an input the journal does not hold).
    pub got: Option<Value>,
    /// What happened, in words.
    pub detail: String,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Option<Value>| {
            v.as_ref()
                .map_or_else(|| "(nothing)".to_owned(), Value::to_string)
        };
        write!(
            f,
            "non-determinism at event {} ({}){}: {}\n  expected: {}\n  got:      {}",
            self.seq,
            self.event_type,
            self.turn_id
                .as_ref()
                .map(|t| format!(" of turn {t}"))
                .unwrap_or_default(),
            self.detail,
            show(&self.expected),
            show(&self.got)
        )
    }
}

/// Why a session could not be replayed to the end.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The journal could not be read (no journal, a running server holds it,
    /// another format, I/O).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// No such session in the journal.
    #[error("session {session_id} is not in the journal (list sessions with `session/list`)")]
    UnknownSession {
        /// The id asked for.
        session_id: String,
    },
    /// `--verify`: the session's log fails its integrity check.
    #[error("session {session_id} is tampered at {} ({:?}): {}; replay refused", finding.location(), finding.check, finding.message)]
    Tampered {
        /// The session.
        session_id: String,
        /// The first bad event.
        finding: Finding,
    },
    /// The replay does not reproduce the journal.
    #[error("{0}")]
    Nondeterminism(Box<Divergence>),
    /// The log cannot be replayed from this event on: it carries no replay
    /// tape (journaled before berth recorded replay inputs), it was
    /// configured with something this build cannot re-create (a tool or a
    /// completion judge it does not have), or it is not shaped as berth
    /// writes logs.
    #[error("event {seq} cannot be replayed: {message}")]
    NotReplayable {
        /// The event.
        seq: u64,
        /// Why, and what to do.
        message: String,
    },
}

impl ReplayError {
    /// A stable machine-readable kind (`--json`'s `error.kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Storage(_) => "storage",
            Self::UnknownSession { .. } => "unknown_session",
            Self::Tampered { .. } => "tampered",
            Self::Nondeterminism(_) => "nondeterminism",
            Self::NotReplayable { .. } => "not_replayable",
        }
    }

    fn diverged(d: Divergence) -> Self {
        Self::Nondeterminism(Box::new(d))
    }
}

/// One run of a turn, replayed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunReport {
    /// The turn.
    pub turn_id: TurnId,
    /// `fresh` (a prompt, or a fresh turn a resume started) or `resumed`
    /// (a parked turn continued).
    pub kind: &'static str,
    /// Its first and last events (seq).
    pub first_seq: u64,
    /// Its exit's last event.
    pub last_seq: u64,
    /// Model calls it made (played from the tape).
    pub model_calls: usize,
    /// Tool executions it made (played from the tape).
    pub tool_calls: usize,
    /// How it left the engine: `ended: <terminal kind>` or `suspended at <seam>`.
    pub exit: String,
}

/// Where a replay stopped early because a crash cut a run: the log either
/// continues with the crash recovery (a turn sealed or parked at start-up
/// from its last checkpoint, which is not journaled), or ends inside the
/// run (berth stopped while it ran and was not started on this journal
/// since).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CutShort {
    /// The turn.
    pub turn_id: TurnId,
    /// The first event not replayed; for [`CutCause::LogEnds`] past the
    /// last event, one more than its seq.
    pub seq: u64,
    /// Which of the two cut it.
    pub cause: CutCause,
}

/// Why a run was cut short ([`CutShort`]); serialized in snake case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CutCause {
    /// berth restarted under the turn and sealed or parked it.
    Recovered,
    /// The log ends inside the turn.
    LogEnds,
}

/// What `--verify` checked before the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verified {
    /// Events whose hash chain was checked.
    pub events: u64,
    /// Signed receipts whose signature was checked.
    pub receipts: u64,
}

/// A successful replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayReport {
    /// The session.
    pub session_id: String,
    /// The journal file read.
    pub journal: String,
    /// Whether the journal needed crash repair (read in a temporary copy).
    pub repaired_copy: bool,
    /// `--verify`: the session's chain and signatures, checked first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified: Option<Verified>,
    /// Events in the log.
    pub events: u64,
    /// Events the replay re-derived and found byte-identical.
    pub reproduced: u64,
    /// Of those, signed receipts (re-signed identically).
    pub receipts: u64,
    /// Events that are recorded inputs (controls), fed rather than compared.
    pub inputs: u64,
    /// The runs replayed, in order.
    pub runs: Vec<RunReport>,
    /// Set when a crash cut a run: the log continues past a crash recovery
    /// the replay does not re-derive, or ends inside the run (everything
    /// before the cut was replayed; see [`CutShort`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut_short: Option<CutShort>,
}

/// Replays session `session_id` of the journal at `journal` (read-only; the
/// server must be stopped, as for `berth verify`) with `keyring` (to re-sign
/// receipts) — see the module docs.
///
/// # Errors
/// [`ReplayError`]: the first divergence, or why the log cannot be read or
/// replayed.
pub fn replay_session(
    journal: &Path,
    keyring: &Keyring,
    session_id: &SessionId,
    options: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    let verified = if options.verify {
        let report = verify_session(journal, keyring, session_id.as_str())?;
        if report.status == Verdict::Tampered {
            if let Some(finding) = report.first_bad {
                return Err(ReplayError::Tampered {
                    session_id: session_id.0.clone(),
                    finding,
                });
            }
        }
        Some(Verified {
            events: report.events,
            receipts: report.receipts,
        })
    } else {
        None
    };
    let log = read_session(journal, session_id)?;
    let Some(record) = log.record else {
        return Err(ReplayError::UnknownSession {
            session_id: session_id.0.clone(),
        });
    };
    let mut rows = Vec::with_capacity(log.events.len());
    for stored in log.events {
        let rec: TapedRecord =
            serde_json::from_slice(&stored.json).map_err(|e| ReplayError::NotReplayable {
                seq: stored.seq,
                message: format!("the event does not decode: {e}"),
            })?;
        rows.push(Row {
            seq: stored.seq,
            json: stored.json,
            rec,
        });
    }
    let mut walk = Walk {
        rows: Arc::new(rows),
        env: Arc::new(ReplayEnv {
            clock: FixedClock::default(),
            ids: ReplayIds::default(),
            keyring: keyring.clone(),
        }),
        tools: &options.tools,
        record: SessionRecord {
            checkpoint_head: 0,
            context_from: 0,
            suspend_request: None,
            closed_at: None,
            ..record
        },
        transcript: Transcript::default(),
        checkpoints: Vec::new(),
        head: 0,
        suspension: None,
        parked_sealed: false,
        report: ReplayReport {
            session_id: session_id.0.clone(),
            journal: journal.display().to_string(),
            repaired_copy: log.repaired_copy,
            verified,
            events: 0,
            reproduced: 0,
            receipts: 0,
            inputs: 0,
            runs: Vec::new(),
            cut_short: None,
        },
    };
    walk.report.events = walk.rows.len() as u64;
    walk.walk()?;
    Ok(walk.report)
}

/// A turn checkpoint, as the replay keeps them (rollback/redo).
#[derive(Debug, Clone)]
struct Checkpoint {
    turn_id: String,
    before: usize,
    messages: Vec<Message>,
}

/// The replay of one session: its log and the state the session's actor
/// had at each point (re-derived, not read).
struct Walk<'a> {
    rows: Arc<Vec<Row>>,
    env: Arc<ReplayEnv>,
    tools: &'a ToolSet,
    /// The session record as the replay evolves it (the request pending,
    /// the context start).
    record: SessionRecord,
    transcript: Transcript,
    checkpoints: Vec<Checkpoint>,
    head: usize,
    /// The suspension in force, re-derived (with the parked frame).
    suspension: Option<Suspension>,
    /// Its parked turn was sealed already (a fresh-transcript resume's
    /// prelude).
    parked_sealed: bool,
    report: ReplayReport,
}

impl Walk<'_> {
    fn session_id(&self) -> SessionId {
        self.record.session_id.clone()
    }

    fn not_replayable(&self, i: usize, message: impl Into<String>) -> ReplayError {
        ReplayError::NotReplayable {
            seq: self.rows.get(i).map_or(0, |r| r.seq),
            message: message.into(),
        }
    }

    /// A sequencer over the log from row `from`, for comparing re-derived
    /// session-level events.
    fn sequencer(&self, from: usize, turn_id: Option<TurnId>) -> SeqState {
        SeqState::new(
            Arc::clone(&self.rows),
            from,
            self.rows.len(),
            self.session_id(),
            turn_id.unwrap_or_else(|| TurnId(String::new())),
        )
    }

    /// Compares `records` with the outputs from row `from` on; returns the
    /// row after the last one matched.
    fn expect(&mut self, from: usize, records: &[EventRecord]) -> Result<usize, ReplayError> {
        let mut seq = self.sequencer(from, None);
        seq.expect(&self.env, records).map_err(|mut d| {
            d.turn_id = None;
            ReplayError::Nondeterminism(d)
        })?;
        self.report.reproduced += seq.compared;
        self.report.receipts += seq.receipts;
        Ok(seq.cursor)
    }

    fn walk(&mut self) -> Result<(), ReplayError> {
        let mut i = 0;
        while i < self.rows.len() {
            if self.report.cut_short.is_some() {
                return Ok(());
            }
            let rows = Arc::clone(&self.rows);
            let event = &rows[i].rec.event;
            i = match event {
                SessionEvent::TurnStarted { turn_id, prompt } => {
                    self.run(i, turn_id.clone(), run::RunKind::Fresh(prompt.clone()))?
                }
                SessionEvent::Resumed { .. } => self.resumed(i)?,
                SessionEvent::Suspended { turn_id: None, .. } => self.idle_park(i)?,
                SessionEvent::SuspensionCancelled { .. } => self.suspension_cancelled(i)?,
                SessionEvent::ToolCallUpdate { .. } | SessionEvent::TurnEnded { .. }
                    if self.parked_frame_open() =>
                {
                    self.seal_parked_at(i, resume::FRESH_TRANSCRIPT_WHY.to_owned(), i)?
                }
                SessionEvent::TurnRolledBack { checkpoint_id } => {
                    self.rollback(i, checkpoint_id)?;
                    i + 1
                }
                SessionEvent::TurnRedone { checkpoint_id } => {
                    self.redo(i, checkpoint_id)?;
                    i + 1
                }
                event if is_input(event) || matches!(event, SessionEvent::SessionClosed {}) => {
                    self.report.inputs += 1;
                    i + 1
                }
                other => {
                    return Err(self.not_replayable(
                        i,
                        format!(
                            "a `{}` event outside any turn the replay is following",
                            other.type_name()
                        ),
                    ))
                }
            };
        }
        Ok(())
    }

    fn parked_frame_open(&self) -> bool {
        !self.parked_sealed && self.suspension.as_ref().is_some_and(|s| s.frame.is_some())
    }

    /// An idle session parked (`session/suspend` with no turn running):
    /// `suspended`, its receipt and `SuspensionReceipt`, re-derived.
    fn idle_park(&mut self, i: usize) -> Result<usize, ReplayError> {
        let rows = Arc::clone(&self.rows);
        let SessionEvent::Suspended {
            handle,
            reason,
            initiator,
            suspended_at,
            resume_when,
            mode,
            ..
        } = &rows[i].rec.event
        else {
            return Err(self.not_replayable(i, "expected a `suspended` event"));
        };
        let outcome = rows[i + 1..].iter().find_map(|r| match &r.rec.event {
            SessionEvent::ControlOutcome(o) if o.receipt.outcome == "suspended" => {
                Some(o.receipt.clone())
            }
            _ => None,
        });
        let Some(outcome) = outcome else {
            return Err(self.not_replayable(i, "a park without its control receipt"));
        };
        let request = SuspendRequest {
            handle: handle.clone(),
            mode: *mode,
            initiator: *initiator,
            actor: outcome.actor.clone(),
            reason: reason.clone(),
            resume_when: resume_when.clone(),
            requested_at: *suspended_at,
        };
        self.env.ids.clear();
        self.env.ids.load(&outcome.control_id);
        let mut suspension = suspend::envelope(&self.record, &request, None, None, *suspended_at);
        suspension.span_links = recorded_span_links(&rows[i..], handle);
        let events = suspend::parked_events(self.env.as_ref(), &suspension, &outcome.method, None);
        let records = stamp(
            self.env.as_ref(),
            &self.record.session_id,
            None,
            rows[i].rec.at,
            events,
        );
        let next = self.expect(i, &records)?;
        self.suspension = Some(suspension);
        self.parked_sealed = false;
        Ok(next)
    }

    /// A suspension cancelled (`session/cancel` or `session/close` while
    /// suspended, or a `fail` timeout): `suspension_cancelled` and, for a
    /// parked turn, its seal — re-derived.
    fn suspension_cancelled(&mut self, i: usize) -> Result<usize, ReplayError> {
        let rows = Arc::clone(&self.rows);
        let SessionEvent::SuspensionCancelled { reason, .. } = &rows[i].rec.event else {
            return Err(self.not_replayable(i, "expected `suspension_cancelled`"));
        };
        let Some(suspension) = self.suspension.clone() else {
            return Err(
                self.not_replayable(i, "a suspension is cancelled that the replay does not know")
            );
        };
        let cancelled = SessionEvent::SuspensionCancelled {
            handle: suspension.handle.clone(),
            reason: reason.clone(),
        };
        let record = EventRecord::new(rows[i].rec.at, cancelled);
        let mut next = self.expect(i, std::slice::from_ref(&record))?;
        if self.parked_frame_open() {
            next = self.seal_parked_at(next, format!("not run: {reason}"), i)?;
        }
        self.suspension = None;
        self.parked_sealed = false;
        Ok(next)
    }

    /// Seals the parked turn (its never-run calls failed, `turn_ended` with
    /// the terminal the journal names), comparing from row `i`; `at_row`
    /// is the row whose time the batch carries.
    fn seal_parked_at(
        &mut self,
        i: usize,
        why: String,
        at_row: usize,
    ) -> Result<usize, ReplayError> {
        let Some(frame) = self.suspension.as_ref().and_then(|s| s.frame.clone()) else {
            return Err(self.not_replayable(i, "no parked turn to seal"));
        };
        let terminal = self.rows[i..].iter().find_map(|r| match &r.rec.event {
            SessionEvent::TurnEnded {
                turn_id, terminal, ..
            } if *turn_id == frame.turn_id => Some(terminal.clone()),
            _ => None,
        });
        let Some(terminal) = terminal else {
            return Err(self.not_replayable(
                i,
                format!(
                    "the parked turn {} is sealed without a `turn_ended`",
                    frame.turn_id
                ),
            ));
        };
        let (_, events, messages) = seal_parked(
            &mut self.record,
            self.transcript.len() as u64,
            &frame,
            terminal,
            &why,
        );
        let records = stamp(
            self.env.as_ref(),
            &self.record.session_id,
            None,
            self.rows[at_row].rec.at,
            events,
        );
        let next = self.expect(i, &records)?;
        self.checkpoint(frame.turn_id.0.clone(), messages);
        self.parked_sealed = true;
        Ok(next)
    }

    /// A turn's messages join the transcript as a new checkpoint (what was
    /// rolled back and not redone is discarded).
    fn checkpoint(&mut self, turn_id: String, messages: Vec<Message>) {
        self.checkpoints.truncate(self.head);
        self.checkpoints.push(Checkpoint {
            turn_id,
            before: self.transcript.len(),
            messages: messages.clone(),
        });
        self.head += 1;
        self.transcript.extend(messages);
    }

    /// Cuts the transcript back to its first `len` messages.
    fn truncate(&mut self, len: usize) {
        let mut messages = self.transcript.messages().as_ref().clone();
        messages.truncate(len);
        self.transcript = Transcript::from_messages(messages);
    }

    fn rollback(&mut self, i: usize, checkpoint_id: &str) -> Result<(), ReplayError> {
        let cp = self
            .head
            .checked_sub(1)
            .and_then(|h| self.checkpoints.get(h));
        match cp {
            Some(cp) if cp.turn_id == checkpoint_id => {
                self.truncate(cp.before);
                self.head -= 1;
                self.report.inputs += 1;
                Ok(())
            }
            _ => Err(ReplayError::diverged(Divergence {
                seq: self.rows[i].seq,
                event_type: "turn_rolled_back".into(),
                turn_id: None,
                expected: serde_json::to_value(&self.rows[i].rec.event).ok(),
                got: cp.map(|cp| Value::String(cp.turn_id.clone())),
                detail: "the rollback pops another turn than the replay's last one".into(),
            })),
        }
    }

    fn redo(&mut self, i: usize, checkpoint_id: &str) -> Result<(), ReplayError> {
        match self.checkpoints.get(self.head) {
            Some(cp) if cp.turn_id == checkpoint_id => {
                let cp = cp.clone();
                self.truncate(cp.before);
                self.transcript.extend(cp.messages);
                self.head += 1;
                self.report.inputs += 1;
                Ok(())
            }
            cp => Err(ReplayError::diverged(Divergence {
                seq: self.rows[i].seq,
                event_type: "turn_redone".into(),
                turn_id: None,
                expected: serde_json::to_value(&self.rows[i].rec.event).ok(),
                got: cp.map(|cp| Value::String(cp.turn_id.clone())),
                detail: "the redo pushes another turn than the replay's rolled-back one".into(),
            })),
        }
    }

    /// A resume claim: the input's hash checked against the signed
    /// `ResumptionReceipt`, the receipt re-derived; then the parked turn
    /// continues (a run), or a fresh turn follows, or the idle session
    /// just wakes.
    fn resumed(&mut self, i: usize) -> Result<usize, ReplayError> {
        let rows = Arc::clone(&self.rows);
        let SessionEvent::Resumed {
            handle,
            cause,
            had_resume_input,
            continue_transcript,
            resumed_at,
            turn_id,
            lateness_ms,
            input,
            ..
        } = &rows[i].rec.event
        else {
            return Err(self.not_replayable(i, "expected `resumed`"));
        };
        let Some(suspension) = self.suspension.clone() else {
            return Err(self.not_replayable(i, "a resume of a suspension the replay does not know"));
        };
        if *handle != suspension.handle {
            return Err(ReplayError::diverged(Divergence {
                seq: rows[i].seq,
                event_type: "resumed".into(),
                turn_id: turn_id.clone(),
                expected: Some(Value::String(handle.clone())),
                got: Some(Value::String(suspension.handle.clone())),
                detail: "the resume claims another handle than the suspension the replay parked"
                    .into(),
            }));
        }
        if *had_resume_input && input.is_none() {
            return Err(self.not_replayable(
                i,
                "the resume had an input the journal does not hold (journaled before berth recorded resume inputs)",
            ));
        }
        let Some(ri) = (i + 1..rows.len())
            .take_while(|&j| {
                matches!(
                    rows[j].rec.event,
                    SessionEvent::ControlOutcome(_) | SessionEvent::ResumptionReceipt(_)
                )
            })
            .find(|&j| matches!(rows[j].rec.event, SessionEvent::ResumptionReceipt(_)))
        else {
            return Err(self.not_replayable(i, "a resume without its ResumptionReceipt"));
        };
        let SessionEvent::ResumptionReceipt(recorded) = &rows[ri].rec.event else {
            return Err(self.not_replayable(ri, "expected a ResumptionReceipt"));
        };
        // The input fed to the waitpoint is the one the receipt signed.
        let input_sha256 = input.as_ref().map(sha256_of_json);
        if input_sha256 != recorded.receipt.input_sha256 {
            return Err(ReplayError::diverged(Divergence {
                seq: rows[ri].seq,
                event_type: "resumption_receipt".into(),
                turn_id: turn_id.clone(),
                expected: Some(serde_json::to_value(&recorded.receipt.input_sha256).unwrap_or_default()),
                got: Some(serde_json::to_value(&input_sha256).unwrap_or_default()),
                detail: format!(
                    "input hash check failed: the resume input journaled with event {} does not hash (SHA-256 of its canonical JSON) to the input_sha256 the ResumptionReceipt signed",
                    rows[i].seq
                ),
            }));
        }
        let receipt = ResumptionReceipt {
            handle: suspension.handle.clone(),
            session_id: self.session_id(),
            cause: *cause,
            actor: recorded.receipt.actor.clone(),
            input_sha256,
            continue_transcript: *continue_transcript,
            suspension_span_id: suspension.span_links.first().map(|l| l.span_id.clone()),
            suspended_at: suspension.suspended_at,
            trigger: recorded.receipt.trigger.clone(),
            lateness_ms: *lateness_ms,
            turn_id: turn_id.clone(),
            resumed_at: *resumed_at,
        };
        let produced = EventRecord::new(
            rows[ri].rec.at,
            SessionEvent::ResumptionReceipt(self.env.keyring.sign(receipt)),
        );
        let mut seq = self.sequencer(ri, turn_id.clone());
        seq.expect_at(&self.env, ri, &produced)
            .map_err(ReplayError::Nondeterminism)?;
        self.report.reproduced += seq.compared;
        self.report.receipts += seq.receipts;
        self.suspension = None;
        match (suspension.frame, *continue_transcript) {
            (Some(frame), true) if turn_id.as_ref() == Some(&frame.turn_id) => {
                let input = berth_runtime::tools::ResumeInput {
                    input: berth_runtime::budget::model_input(input.as_ref()),
                    cause: *cause,
                };
                self.parked_sealed = false;
                self.run(
                    i,
                    frame.turn_id.clone(),
                    run::RunKind::Resume(Box::new(frame), input),
                )
            }
            (frame, continue_transcript) => {
                if frame.is_some() && !self.parked_sealed {
                    return Err(self.not_replayable(
                        i,
                        "a parked turn resumed with a fresh transcript was not sealed first",
                    ));
                }
                if !continue_transcript {
                    self.record.context_from = self.transcript.len() as u64;
                }
                // `resumed` and its control receipt (a continued run counts
                // them with its own).
                self.report.inputs +=
                    (i..ri).filter(|&j| is_input(&rows[j].rec.event)).count() as u64;
                self.parked_sealed = false;
                Ok(ri + 1)
            }
        }
    }
}
