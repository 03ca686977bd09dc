//! The node: the journal, the registry and the supervisor wired together, and
//! the control API the adapters call.
//!
//! Every method routes to the session's actor (rehydrating it if needed) and
//! returns only once the decision is durable.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::session::lifecycle::scheduled::ScheduledStart;
use berth_runtime::content::Prompt;
use berth_runtime::engine::CallCancel;
use berth_runtime::event::{ControlStatus, SessionEvent};
use berth_runtime::ids::{EventId, SessionId, TurnId};
use berth_runtime::model::Usage;
use berth_runtime::receipt::TriggerMatch;
use berth_runtime::steering::Injection;
use berth_runtime::suspension::{
    ExternalEvent, Initiator, OverlapPolicy, ResumeCause, ResumeClaim, ResumeConditions, Schedule,
    SuspendMode, Suspension,
};
use berth_runtime::terminal::{StopReason, Terminal, TerminalKind};
use berth_runtime::tools::ProcessLedger;
use berth_scheduler::{Entry, Firing, Scheduler};
use berth_storage::{Batch, Journal, JournalOptions, SessionRecord};
use chrono::{DateTime, Utc};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef, RpcReplyPort};
use serde::Serialize;
use serde_json::Value;

use crate::claimer::Job;
use crate::config::NodeConfig;
use crate::error::ControlError;
use crate::registry::Registry;
use crate::session::{settle_open_turn, AttachOutcome, Replay, SessionEnv, SessionMsg};
use crate::supervisor::Supervisor;
use crate::watch::Watcher;

/// Largest event payload accepted (bytes of its JSON).
pub const MAX_EVENT_BYTES: usize = 64 * 1024;
/// Wake-ups handed to the scheduler per command at start-up.
const ARM_CHUNK: usize = 4096;
/// `meta` counter: the last external event whose matches were resumed.
const EVENTS_MATCHED: &str = "events_matched";

/// What `emit_event` did.
#[derive(Debug, Clone, PartialEq)]
pub struct EmitOutcome {
    /// The event's sequence number in the journal.
    pub seq: u64,
    /// When berth accepted it.
    pub received_at: DateTime<Utc>,
    /// The parked sessions it woke.
    pub woke: Vec<EventWake>,
}

/// What `_berth/schedule.create` asks for.
#[derive(Debug, Clone)]
pub struct ScheduleSpec {
    /// The session each run prompts.
    pub session_id: SessionId,
    /// Cron expression.
    pub cron: String,
    /// IANA timezone (default UTC).
    pub timezone: Option<String>,
    /// The prompt text.
    pub prompt: String,
    /// Overlap policy (default `skip`).
    pub overlap: OverlapPolicy,
    /// Catch-up window for runs missed while berth was down (ms; default 0).
    pub catchup_window_ms: u64,
}

/// One parked session an event matched.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventWake {
    /// The session.
    pub session_id: SessionId,
    /// Its suspension's handle.
    pub handle: String,
    /// Whether this event's resume won the claim.
    pub resumed: bool,
}

fn log_firing(firing: &Firing, result: Result<(), ControlError>) {
    let session_id = &firing.wakeup.session_id;
    match result {
        Ok(()) => {
            tracing::info!(%session_id, handle = %firing.wakeup.handle, lateness_ms = firing.lateness_ms, kind = ?firing.kind, "wake-up fired")
        }
        Err(e) => {
            tracing::info!(%session_id, handle = %firing.wakeup.handle, error = %e, "wake-up fired; no resumption came of it")
        }
    }
}

/// Serializes the creation of sessions with client-chosen ids.
static CLIENT_ID_CREATION: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Longest client-chosen session id (characters).
pub const MAX_CLIENT_SESSION_ID: usize = 128;

/// Checks a client-chosen session id: 1 to [`MAX_CLIENT_SESSION_ID`]
/// characters of `A-Za-z0-9._:-`, and not `.` or `..` (ids name directories).
///
/// # Errors
/// [`ControlError::InvalidParams`] naming `sessionId`.
pub fn validate_session_id(id: &SessionId) -> Result<(), ControlError> {
    let s = id.0.as_str();
    if s.is_empty()
        || s.len() > MAX_CLIENT_SESSION_ID
        || s == "."
        || s == ".."
        || !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c))
    {
        return Err(ControlError::invalid(
            "sessionId",
            &format!("must be 1 to {MAX_CLIENT_SESSION_ID} characters of A-Z a-z 0-9 . _ : - (and not . or ..)"),
        ));
    }
    Ok(())
}

/// The default (and only) session mode id.
pub const DEFAULT_MODE_ID: &str = "default";

/// Parameters of `session/new`.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// Working directory; must be absolute and an existing directory.
    pub cwd: PathBuf,
    /// Extra directories for the file tools; each must be absolute.
    pub additional_directories: Vec<PathBuf>,
    /// MCP server configs as received (stored with the session).
    pub mcp_servers: Vec<Value>,
    /// The parent of a nested session (must exist).
    pub parent_session_id: Option<SessionId>,
    /// Labels (each 1–64 of `A-Za-z0-9._:-`, at most 32).
    pub labels: Vec<String>,
    /// A client-chosen id (an A2A `contextId`): 1–128 of `A-Za-z0-9._:-`,
    /// not `.`/`..`, and not the id of an existing session. `None`: berth
    /// generates `sess_<uuid>`.
    pub session_id: Option<SessionId>,
}

impl NewSession {
    /// A session in `cwd` (absolute, an existing directory) with nothing
    /// else: no additional directories, MCP servers, parent or labels, and a
    /// generated id.
    pub fn in_dir(cwd: impl Into<PathBuf>) -> Self {
        Self {
            cwd: cwd.into(),
            additional_directories: Vec::new(),
            mcp_servers: Vec::new(),
            parent_session_id: None,
            labels: Vec::new(),
            session_id: None,
        }
    }
}

/// How a prompt turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptOutcome {
    /// The turn.
    pub turn_id: TurnId,
    /// Typed terminal.
    pub terminal: Terminal,
    /// ACP stop reason (`None` for an error terminal).
    pub stop_reason: Option<StopReason>,
    /// Tokens the turn used.
    pub usage: Usage,
    /// The suspension's handle when the turn parked (terminal `suspended`).
    pub suspension_handle: Option<String>,
}

/// Parameters of `session/suspend` (RFC `SessionSuspendRequest`).
#[derive(Debug, Clone)]
pub struct SuspendParams {
    /// When it takes effect.
    pub mode: SuspendMode,
    /// Free-form reason.
    pub reason: Option<String>,
    /// Validated resume conditions.
    pub resume_when: Option<ResumeConditions>,
    /// Who asks (the authenticated actor).
    pub actor: String,
    /// `client` for `session/suspend`; `policy`/`scheduler` for berth's own.
    pub initiator: Initiator,
    /// Only a running session: an idle one answers `NoActivePrompt` instead
    /// of parking (the broadcast suspend).
    pub require_running: bool,
}

impl SuspendParams {
    /// A client's plain `session/suspend` by `actor`: `finish_step`, no
    /// reason, no resume conditions (only an explicit resume wakes it), an
    /// idle session parks too.
    pub fn by_client(actor: impl Into<String>) -> Self {
        Self {
            mode: SuspendMode::FinishStep,
            reason: None,
            resume_when: None,
            actor: actor.into(),
            initiator: Initiator::Client,
            require_running: false,
        }
    }
}

/// Which sessions `_berth/suspend_many` addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionSelector {
    /// Every session.
    All,
    /// Sessions carrying this label.
    Label(String),
    /// These sessions.
    Ids(Vec<SessionId>),
}

/// One session's outcome in a broadcast suspend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum BroadcastOutcome {
    /// It was running and is now suspended.
    Suspended {
        /// The new suspension's handle.
        handle: String,
    },
    /// It was suspended before.
    AlreadySuspended {
        /// The existing handle.
        handle: String,
    },
    /// Nothing ran on it (idle or closed).
    NotRunning,
    /// The server holds no such session.
    Unknown,
    /// Suspending it failed (journal, actor).
    Failed {
        /// Why.
        reason: String,
    },
}

/// Answer to `session/suspend` (RFC `SessionSuspendResponse`).
#[derive(Debug, Clone, PartialEq)]
pub struct SuspendOutcome {
    /// The handle to echo on `session/resume`.
    pub handle: String,
    /// Why it is parked.
    pub reason: Option<String>,
    /// Who parked it.
    pub initiator: Initiator,
    /// When the suspension was committed.
    pub suspended_at: DateTime<Utc>,
    /// The conditions it will honour.
    pub resume_when: Option<ResumeConditions>,
    /// A digest to show.
    pub summary: Option<String>,
    /// It was already suspended: this is the existing handle (idempotent).
    pub already_suspended: bool,
}

/// Parameters of a resume claim (RFC `SessionResumeRequest` + berth's `handle`).
#[derive(Debug, Clone)]
pub struct ResumeParams {
    /// The handle to claim; `None` claims the session's current suspension.
    pub handle: Option<String>,
    /// Fed to the resume waitpoint.
    pub input: Option<Value>,
    /// `false`: a fresh turn with a digest (RFC default `true`).
    pub continue_transcript: bool,
    /// Why it wakes (`explicit_resume` for a client).
    pub cause: ResumeCause,
    /// Who resumes.
    pub actor: String,
    /// For a scheduled wake-up: how late it fired (ms after due).
    pub lateness_ms: Option<u64>,
    /// The id of the client message carrying `input` (an A2A `messageId`);
    /// journaled with the `resumed` event.
    pub message_id: Option<String>,
    /// The condition that fired it (`None` for an explicit resume); signed
    /// into the `ResumptionReceipt`.
    pub trigger: Option<TriggerMatch>,
}

/// Answer to a resume claim.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumeOutcome {
    /// The handle claimed.
    pub handle: String,
    /// Why it woke.
    pub cause: ResumeCause,
    /// When the claim was committed.
    pub resumed_at: DateTime<Utc>,
    /// Whether input was given.
    pub had_resume_input: bool,
    /// Whether the parked turn's transcript continues.
    pub continue_transcript: bool,
    /// The turn now running, if the resume started or continued one.
    pub turn_id: Option<TurnId>,
}

/// Answer to `session/cancel` (`remote-session-control.md`, "Stop").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelStatus {
    /// This cancel stopped the running turn.
    Cancelled,
    /// The turn was already stopping or stopped, or nothing was running.
    AlreadyCancelled,
}

/// A session's status, as `session/list` reports it.
#[derive(Debug, Clone)]
pub struct SessionStatus {
    /// The durable record.
    pub record: SessionRecord,
    /// Held in memory (`liveState: live`) or only on disk (`persisted`).
    pub live: bool,
    /// A turn is running.
    pub active_prompt: bool,
    /// Last event id (0: no events yet).
    pub last_event_id: EventId,
    /// The handle of the session's suspension, while it is parked.
    pub suspension_handle: Option<String>,
    /// A suspend is pending and the running turn reached the seam where it
    /// parks (RFC state `quiescing`; before that the request is
    /// `requested`). See [`berth_runtime::engine::TurnControl::begin_quiescing`].
    pub quiescing: bool,
    /// The claim that last used up one of this session's suspensions
    /// (resumed by a client or a wake-up, cancelled, failed), while no newer
    /// suspension exists; kept in memory by the live actor only (`None` for a
    /// session read from disk).
    pub last_claim: Option<berth_runtime::suspension::ResumeClaim>,
}

/// Sessions by state (see [`Node::session_counts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SessionCounts {
    /// A turn is running.
    pub running: u64,
    /// Parked with a suspension.
    pub suspended: u64,
    /// Neither (closed sessions included).
    pub idle: u64,
    /// Held in memory by an actor.
    pub live: u64,
}

/// What `GET /readyz` checks (see [`Node::readiness`]).
#[derive(Debug, Clone)]
pub struct Readiness {
    /// The journal's counts, or why it could not be read.
    pub journal: Result<berth_storage::JournalCounts, String>,
    /// The scheduler task is running.
    pub scheduler: bool,
    /// Wake-ups it holds armed.
    pub armed_wakeups: usize,
}

impl Readiness {
    /// Both checks pass.
    pub fn ready(&self) -> bool {
        self.journal.is_ok() && self.scheduler
    }
}

/// Errors starting a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The data directory cannot be created, or is not private to berth's
    /// user (see `berth_storage::private`; the message says what to do).
    #[error("cannot use data dir {path}: {message}")]
    DataDir {
        /// The directory.
        path: String,
        /// OS error.
        message: String,
    },
    /// The journal cannot be opened or recovered.
    #[error(transparent)]
    Storage(#[from] berth_storage::StorageError),
    /// The supervisor did not start.
    #[error("cannot start the supervisor: {0}")]
    Supervisor(String),
}

/// A running berth node.
#[derive(Debug, Clone)]
pub struct Node {
    pub(crate) env: Arc<SessionEnv>,
    pub(crate) registry: Arc<Registry>,
    supervisor: ActorRef<()>,
}

impl Node {
    /// Opens the journal in `config.data_dir`, kills the process groups the
    /// previous berth process left behind, seals every turn that was running
    /// when it died (terminal `process_restarted`, owner `harness`; never
    /// re-run), and starts the supervisor.
    ///
    /// # Errors
    /// [`NodeError`] when the data dir or journal is unusable.
    pub async fn start(config: NodeConfig) -> Result<Self, NodeError> {
        berth_storage::private::ensure_dir(&config.data_dir).map_err(|e| NodeError::DataDir {
            path: config.data_dir.display().to_string(),
            message: e.to_string(),
        })?;
        let journal = Journal::open(
            &config.data_dir.join("journal.redb"),
            JournalOptions {
                quick_repair: config.quick_repair,
                cache_bytes: config.journal_cache_bytes,
                keyring: config.receipt_keys.clone(),
            },
        )?;
        let processes = ProcessLedger::open(&config.data_dir.join("processes")).map_err(|e| {
            NodeError::DataDir {
                path: config.data_dir.join("processes").display().to_string(),
                message: e.to_string(),
            }
        })?;
        for session in processes.reap() {
            tracing::warn!(session_id = %session, "killed a process group left by a previous berth process");
        }
        let (scheduler, firings, raised) =
            Scheduler::start_with(Arc::clone(&config.clock), config.realtime_timers);
        crate::claimer::log_timer_priority("scheduler", &raised);
        let env = Arc::new(SessionEnv {
            journal,
            config,
            processes: Arc::new(processes),
            scheduler,
            passivated: Default::default(),
            schedule_rows: tokio::sync::Mutex::new(()),
        });
        for open in env.journal.open_turns()? {
            settle_open_turn(
                &env,
                &open.session_id,
                Terminal::new(
                    TerminalKind::ProcessRestarted,
                    "berth restarted while this turn was running; it was sealed, not re-run",
                ),
            )
            .await?;
        }
        let registry = Arc::new(Registry::new(Arc::clone(&env)));
        let (supervisor, _) = Actor::spawn(None, Supervisor, Arc::clone(&registry))
            .await
            .map_err(|e| NodeError::Supervisor(e.to_string()))?;
        registry.set_supervisor(supervisor.get_cell());
        let node = Self {
            env,
            registry,
            supervisor,
        };
        // Every parked session's wake-up (including those just completed
        // from a crash); overdue ones fire at once, late.
        // They are streamed: only each one's compact entry is kept.
        let mut entries = Vec::with_capacity(ARM_CHUNK);
        let count = node.env.journal.for_each_wakeup(|wakeup| {
            entries.push(Entry::of(&wakeup));
            if entries.len() == ARM_CHUNK {
                let chunk = std::mem::replace(&mut entries, Vec::with_capacity(ARM_CHUNK));
                node.env.scheduler.arm_all(chunk);
            }
        })?;
        node.env.scheduler.arm_all(entries);
        tracing::info!(count, "armed the wake-ups of parked sessions");
        node.arm_schedules().await?;
        let jobs = crate::claimer::start(&node.env, firings);
        node.spawn_jobs(jobs);
        node.match_unmatched_events().await?;
        Ok(node)
    }

    /// At start-up: arms every running schedule. A run missed while berth was
    /// down fires now if it is within the schedule's catch-up window;
    /// otherwise it is skipped (counted) and the next future run is armed.
    async fn arm_schedules(&self) -> Result<(), NodeError> {
        let now = self.env.config.clock.now();
        for schedule in self.env.journal.schedules()? {
            self.redeliver_buffered(&schedule).await;
            let Some(next) = schedule.next_fire_at.filter(|_| !schedule.paused) else {
                continue;
            };
            let missed_by = (now - next).num_milliseconds();
            let mut next = Some(next);
            if missed_by > 0 && u64::try_from(missed_by).unwrap_or(0) > schedule.catchup_window_ms {
                next = self
                    .env
                    .update_schedule(&schedule.schedule_id, |schedule| {
                        schedule.skipped += 1;
                        schedule.next_fire_at = schedule.next_after(now);
                    })
                    .await?
                    .and_then(|s| s.next_fire_at);
            }
            if let Some(next) = next {
                self.env.scheduler.arm_schedule(&schedule.schedule_id, next);
            }
        }
        Ok(())
    }

    /// `_berth/schedule.create`: a standing schedule that prompts `session_id`
    /// with `prompt` on `cron` (in `timezone`), durable on return and armed.
    ///
    /// # Errors
    /// `InvalidParams` naming `cron`, `timezone` or `prompt`; `UnknownSession`;
    /// `SessionClosed`; `Storage`.
    pub async fn schedule_create(&self, spec: ScheduleSpec) -> Result<Schedule, ControlError> {
        Schedule::validate(&spec.cron, spec.timezone.as_deref())
            .map_err(|e| ControlError::invalid(&e.field, &e.reason))?;
        if spec.prompt.trim().is_empty() {
            return Err(ControlError::invalid(
                "prompt",
                "must be a non-empty string",
            ));
        }
        match self.env.journal.session(&spec.session_id)? {
            None => {
                return Err(ControlError::UnknownSession {
                    session_id: spec.session_id,
                })
            }
            Some(r) if r.closed_at.is_some() => {
                return Err(ControlError::SessionClosed {
                    session_id: spec.session_id,
                })
            }
            Some(_) => {}
        }
        let now = self.env.config.clock.now();
        let mut schedule = Schedule {
            schedule_id: self.env.config.ids.new_id("sched"),
            session_id: spec.session_id,
            cron: spec.cron.trim().to_owned(),
            timezone: spec.timezone,
            prompt: spec.prompt,
            overlap: spec.overlap,
            catchup_window_ms: spec.catchup_window_ms,
            paused: false,
            next_fire_at: None,
            last_fired_at: None,
            fired: 0,
            skipped: 0,
            buffered: 0,
            created_at: now,
        };
        schedule.next_fire_at = schedule.next_after(now);
        self.env
            .journal
            .commit(Batch::new().put_schedule(&schedule))
            .await?;
        if let Some(next) = schedule.next_fire_at {
            self.env.scheduler.arm_schedule(&schedule.schedule_id, next);
        }
        Ok(schedule)
    }

    /// Every standing schedule.
    ///
    /// # Errors
    /// `Storage`.
    pub fn schedule_list(&self) -> Result<Vec<Schedule>, ControlError> {
        Ok(self.env.journal.schedules()?)
    }

    /// Pauses (`paused: true`) or unpauses a schedule; unpausing arms the next
    /// run after now (runs missed while paused are not caught up).
    ///
    /// # Errors
    /// `InvalidParams` (`scheduleId` unknown); `Storage`.
    pub async fn schedule_pause(&self, id: &str, paused: bool) -> Result<Schedule, ControlError> {
        let now = self.env.config.clock.now();
        let schedule = self
            .env
            .update_schedule(id, |schedule| {
                schedule.paused = paused;
                if !paused {
                    schedule.next_fire_at = schedule.next_after(now);
                }
            })
            .await?
            .ok_or_else(|| ControlError::invalid("scheduleId", "no such schedule"))?;
        match (paused, schedule.next_fire_at) {
            (false, Some(next)) => self.env.scheduler.arm_schedule(id, next),
            _ => self.env.scheduler.disarm_schedule(id),
        }
        Ok(schedule)
    }

    /// Deletes a schedule (a buffered run already waiting on its session
    /// still runs).
    ///
    /// # Errors
    /// `InvalidParams` (`scheduleId` unknown); `Storage`.
    pub async fn schedule_delete(&self, id: &str) -> Result<(), ControlError> {
        let _guard = self.env.schedule_rows.lock().await;
        if self.env.journal.schedule(id)?.is_none() {
            return Err(ControlError::invalid("scheduleId", "no such schedule"));
        }
        self.env
            .journal
            .commit(Batch::new().delete_schedule(id))
            .await?;
        self.env.scheduler.disarm_schedule(id);
        Ok(())
    }

    /// One run of a schedule: the session is prompted under the overlap
    /// policy, then the run's counters and the next run are recorded (one
    /// serialized update of the schedule row, which a concurrent pause or a
    /// buffered run's count change never loses) and the next run is armed.
    async fn run_schedule(&self, id: &str, due: DateTime<Utc>, lateness_ms: u64) {
        crate::metrics::record_lateness("schedule", lateness_ms);
        let Ok(Some(schedule)) = self.env.journal.schedule(id) else {
            return;
        };
        if schedule.paused || schedule.next_fire_at != Some(due) {
            return;
        }
        let now = self.env.config.clock.now();
        let started = self
            .call(&schedule.session_id, |reply| SessionMsg::ScheduledPrompt {
                schedule_id: schedule.schedule_id.clone(),
                text: schedule.prompt.clone(),
                overlap: schedule.overlap,
                redelivered: false,
                reply,
            })
            .await;
        tracing::info!(schedule_id = %id, lateness_ms, outcome = ?started, "schedule run");
        let ran = matches!(
            &started,
            Ok(ScheduledStart::Started | ScheduledStart::Buffered)
        );
        let updated = self
            .env
            .update_schedule(id, |schedule| {
                if ran {
                    schedule.fired += 1;
                } else {
                    schedule.skipped += 1;
                }
                schedule.last_fired_at = Some(now);
                // A pause or another run since this one was due decides.
                if schedule.next_fire_at == Some(due) {
                    schedule.next_fire_at = schedule.next_after(now.max(due));
                }
            })
            .await;
        match updated {
            Ok(Some(schedule)) if !schedule.paused => {
                if let Some(next) = schedule.next_fire_at {
                    self.env.scheduler.arm_schedule(id, next);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(schedule_id = %id, error = %e, "could not record a schedule run");
            }
        }
    }

    /// At start-up: runs that were waiting behind a turn when berth stopped
    /// (counted in the schedule's `buffered`) are delivered again, each
    /// under the schedule's overlap policy.
    async fn redeliver_buffered(&self, schedule: &Schedule) {
        for _ in 0..schedule.buffered {
            let started = self
                .call(&schedule.session_id, |reply| SessionMsg::ScheduledPrompt {
                    schedule_id: schedule.schedule_id.clone(),
                    text: schedule.prompt.clone(),
                    overlap: schedule.overlap,
                    redelivered: true,
                    reply,
                })
                .await;
            tracing::info!(schedule_id = %schedule.schedule_id, outcome = ?started, "buffered schedule run delivered again");
        }
    }

    /// Runs what the claimer hands over (see [`crate::claimer`]), each in its
    /// own task: completes durable claims, fails `fail` timeouts, runs
    /// schedules. Holds the node weakly: it ends with the node.
    fn spawn_jobs(&self, mut jobs: tokio::sync::mpsc::UnboundedReceiver<Job>) {
        let env = Arc::downgrade(&self.env);
        let registry = Arc::downgrade(&self.registry);
        let supervisor = self.supervisor.clone();
        tokio::spawn(async move {
            while let Some(job) = jobs.recv().await {
                let (Some(env), Some(registry)) = (env.upgrade(), registry.upgrade()) else {
                    return;
                };
                let node = Node {
                    env,
                    registry,
                    supervisor: supervisor.clone(),
                };
                tokio::spawn(async move {
                    match job {
                        Job::Claimed { firing, claim, ack } => {
                            node.complete_claim(firing, claim, ack).await;
                        }
                        Job::Fail(firing) => node.fail_due(firing).await,
                        Job::Schedule {
                            schedule_id,
                            due,
                            lateness_ms,
                        } => node.run_schedule(&schedule_id, due, lateness_ms).await,
                    }
                });
            }
        });
    }

    /// Phase 2 of a wake-up's resume (see [`crate::claimer`]): once its
    /// claim is durable, the session actor completes the resume. A claim
    /// refused as taken is handed to the actor too: if the scheduler took it
    /// earlier (a wake-up re-armed after a crash between the phases) the
    /// actor completes it; if a client's resume won, there is nothing left.
    async fn complete_claim(
        &self,
        firing: Firing,
        claim: ResumeClaim,
        ack: tokio::sync::oneshot::Receiver<Result<Vec<EventId>, berth_storage::StorageError>>,
    ) {
        let session_id = &claim.session_id;
        let committed = match ack.await {
            Ok(Ok(_)) => Some(Box::new(claim.clone())),
            Ok(Err(berth_storage::StorageError::AlreadyClaimed { .. })) => None,
            Ok(Err(e)) => {
                tracing::error!(%session_id, error = %e, "a wake-up's claim was not committed; it fires at the next start");
                return;
            }
            Err(_) => return,
        };
        let result = self
            .call(session_id, |reply| SessionMsg::Claimed {
                committed: committed.clone(),
                reply,
            })
            .await
            .and_then(|r| r);
        match result {
            Ok(Some(_)) => log_firing(&firing, Ok(())),
            // Our claim stood, and a control that lost to it completed the
            // resume first (as `settle_claimed` lets it); or a client's
            // resume took the handle before our claim could.
            Ok(None) if committed.is_some() => {
                tracing::info!(%session_id, handle = %claim.handle, "wake-up fired; its resume was completed by a control that raced it")
            }
            Ok(None) => {
                tracing::info!(%session_id, handle = %claim.handle, "wake-up fired; a client's resume had won the claim")
            }
            Err(e) => log_firing(&firing, Err(e)),
        }
    }

    /// An `onTimeout: fail` wake-up: the session actor fails the suspension
    /// (its handle is used up; a later resume gets `already_resumed`).
    async fn fail_due(&self, firing: Firing) {
        let wakeup = &firing.wakeup;
        let minutes = wakeup.timeout.as_ref().map_or(0.0, |t| t.duration_minutes);
        let reason = format!("the suspension timed out after {minutes} minute(s)");
        let handle = wakeup.handle.clone();
        let result = self
            .call(&wakeup.session_id, |reply| SessionMsg::FailSuspension {
                handle: handle.clone(),
                reason: reason.clone(),
                reply,
            })
            .await;
        log_firing(&firing, result.and_then(|r| r));
    }

    /// A resume a condition fired. When the parked turn cannot continue under
    /// today's configuration (`ResumeRefused`), the condition still wakes the
    /// session: with `continueTranscript: false` (the parked turn is sealed
    /// and a fresh turn starts from a digest), rather than dropping the
    /// wake-up with the session parked forever.
    async fn resume_condition(
        &self,
        session_id: &SessionId,
        params: ResumeParams,
    ) -> Result<ResumeOutcome, ControlError> {
        match self.resume(session_id, params.clone()).await {
            Err(ControlError::ResumeRefused { refusal, .. }) => {
                tracing::warn!(%session_id, %refusal, "a woken parked turn cannot continue; resuming with a fresh transcript");
                self.resume(
                    session_id,
                    ResumeParams {
                        continue_transcript: false,
                        ..params
                    },
                )
                .await
            }
            other => other,
        }
    }

    /// `_berth/event.emit`: journals the event (durable before the answer),
    /// then resumes every parked session it matches (cause `external_event`,
    /// the payload as input; no input when it has none), each through its
    /// one-time claim.
    ///
    /// # Errors
    /// [`ControlError::InvalidParams`] for a bad name (empty, over 256
    /// characters, whitespace, control characters or `*`) or a payload over
    /// 64 KiB; [`ControlError::Storage`].
    pub async fn emit_event(
        &self,
        name: &str,
        data: Value,
        source: &str,
    ) -> Result<EmitOutcome, ControlError> {
        if name.is_empty()
            || name.chars().count() > 256
            || name
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '*')
        {
            return Err(ControlError::invalid(
                "name",
                "must be 1 to 256 characters without whitespace, control characters or `*`",
            ));
        }
        if serde_json::to_vec(&data).map_or(0, |b| b.len()) > MAX_EVENT_BYTES {
            return Err(ControlError::invalid(
                "data",
                &format!("is over {MAX_EVENT_BYTES} bytes"),
            ));
        }
        let event = ExternalEvent {
            name: name.to_owned(),
            data,
            received_at: self.env.config.clock.now(),
            source: source.to_owned(),
        };
        let ids = self
            .env
            .journal
            .commit(Batch::new().append_external_event(&event))
            .await?;
        let seq = ids.first().copied().unwrap_or_default();
        let woke = self.wake_on_event(seq, &event).await?;
        Ok(EmitOutcome {
            seq,
            received_at: event.received_at,
            woke,
        })
    }

    /// Resumes what `event` matches, then records that events up to `seq`
    /// were matched (so a restart re-matches only later ones).
    async fn wake_on_event(
        &self,
        seq: u64,
        event: &ExternalEvent,
    ) -> Result<Vec<EventWake>, ControlError> {
        let mut woke = Vec::new();
        for session_id in self.env.scheduler.candidates(&event.name).await {
            let wakeup = match self.env.journal.wakeup(&session_id) {
                Ok(Some(w)) if w.matches_event(&event.name, &event.data, event.received_at) => w,
                Ok(_) => continue,
                Err(e) => {
                    tracing::error!(%session_id, error = %e, "could not read a wake-up an event may match");
                    continue;
                }
            };
            let result = self
                .resume_condition(
                    &session_id,
                    ResumeParams {
                        handle: Some(wakeup.handle.clone()),
                        // An event without data resumes without input.
                        input: (!event.data.is_null()).then(|| event.data.clone()),
                        continue_transcript: true,
                        cause: ResumeCause::ExternalEvent,
                        actor: format!("event:{}", event.name),
                        lateness_ms: None,
                        message_id: None,
                        trigger: Some(TriggerMatch::Event {
                            name: event.name.clone(),
                            seq,
                            received_at: event.received_at,
                        }),
                    },
                )
                .await;
            // Another event, a timer or a client resumed it first.
            if matches!(result, Err(ControlError::ResumeConflict { .. })) {
                continue;
            }
            woke.push(EventWake {
                session_id,
                handle: wakeup.handle,
                resumed: result.is_ok(),
            });
        }
        self.env
            .journal
            .commit(Batch::new().put_meta(EVENTS_MATCHED, seq))
            .await?;
        Ok(woke)
    }

    /// At start-up: events acknowledged but not yet matched when berth
    /// stopped are matched now (never lost once acknowledged).
    async fn match_unmatched_events(&self) -> Result<(), NodeError> {
        let done = self.env.journal.meta(EVENTS_MATCHED)?;
        for (seq, event) in self.env.journal.external_events_after(done)? {
            if let Err(e) = self.wake_on_event(seq, &event).await {
                tracing::warn!(seq, error = %e, "could not match an event at start-up");
            }
        }
        Ok(())
    }

    /// Sessions by state, for the `berth_sessions` gauge: `running` (a turn
    /// is open), `suspended` (parked), `idle` (every other session, closed
    /// ones included), and `live` (held in memory). Cheap: O(1) journal
    /// counts plus the registry's size.
    ///
    /// # Errors
    /// [`ControlError::Storage`].
    pub async fn session_counts(&self) -> Result<SessionCounts, ControlError> {
        let counts = self.env.journal.counts()?;
        let busy = counts.open_turns + counts.suspended;
        Ok(SessionCounts {
            running: counts.open_turns,
            suspended: counts.suspended,
            idle: counts.sessions.saturating_sub(busy),
            live: self.registry.live_ids().await.len() as u64,
        })
    }

    /// How many wake-ups the scheduler holds, by kind (the
    /// `berth_pending_wakeups` gauge): reflects every suspend, resume and
    /// schedule change made before the call.
    pub async fn pending_wakeups(&self) -> berth_scheduler::Pending {
        self.env.scheduler.pending().await
    }

    /// Whether the node is ready to serve (`GET /readyz`): the journal
    /// answers a read and the scheduler task is running (it is loaded with
    /// every wake-up before [`Node::start`] returns); also how many wake-ups
    /// it holds.
    pub async fn readiness(&self) -> Readiness {
        let scheduler = self.env.scheduler.is_running();
        Readiness {
            journal: self.env.journal.counts().map_err(|e| e.to_string()),
            scheduler,
            armed_wakeups: if scheduler {
                self.env.scheduler.armed().await
            } else {
                0
            },
        }
    }

    /// The journal (read access for tools such as benchmarks and replay).
    pub fn journal(&self) -> &Journal {
        &self.env.journal
    }

    /// A signed `control_outcome` for a control whose receipt is not
    /// journaled (it named an unknown session, or no session at all), decided
    /// now, with `metadata`. Sent to the requesting connection only; the
    /// signature lets it be verified later like a journaled one.
    #[allow(clippy::too_many_arguments)]
    pub fn unjournaled_receipt(
        &self,
        session_id: &SessionId,
        method: &str,
        actor: &str,
        status: ControlStatus,
        outcome: &str,
        target: Value,
        reason: Option<&str>,
        metadata: Value,
    ) -> SessionEvent {
        let mut receipt = crate::session::control_outcome(
            &self.env, session_id, method, actor, status, outcome, target, reason,
        );
        // Set before signing: the signature covers the metadata too.
        receipt.metadata = metadata;
        crate::session::signed_outcome(&self.env, receipt)
    }

    /// The node configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.env.config
    }

    /// Sends a message built by `make` to the session's actor and awaits the
    /// reply, retrying once if the actor stopped between lookup and send.
    async fn call<T: Send + 'static>(
        &self,
        id: &SessionId,
        make: impl Fn(RpcReplyPort<T>) -> SessionMsg,
    ) -> Result<T, ControlError> {
        let mut retried = false;
        let mut passivations = 0;
        loop {
            let actor = self.registry.get_or_spawn(id).await?;
            match actor.call(&make, None).await {
                Ok(CallResult::Success(value)) => return Ok(value),
                Ok(CallResult::Timeout) => {
                    return Err(ControlError::ActorFailed("timed out".into()))
                }
                // Stopped for passivation with this message queued behind:
                // it was never handled; the next actor handles it.
                Ok(CallResult::SenderError)
                    if passivations < 8 && self.env.passivated.was_passivated(actor.get_id()) =>
                {
                    passivations += 1;
                    self.registry.forget(actor.get_id()).await;
                }
                Ok(CallResult::SenderError) => return Err(ControlError::ActorFailed(
                    "the session actor stopped before answering; it is restarted from the journal"
                        .into(),
                )),
                Err(_)
                    if passivations < 8 && self.env.passivated.was_passivated(actor.get_id()) =>
                {
                    // It stopped for passivation before this message reached it.
                    passivations += 1;
                    self.registry.forget(actor.get_id()).await;
                }
                Err(_) if !retried => {
                    // A stale reference to an actor that just stopped.
                    self.registry.forget(actor.get_id()).await;
                    retried = true;
                }
                Err(e) => return Err(ControlError::ActorFailed(e.to_string())),
            }
        }
    }

    /// Creates a session (durable on return) and makes it live, with no
    /// recorded creator (a local client's session).
    ///
    /// # Errors
    /// As [`Node::new_session_by`].
    pub async fn new_session(&self, params: NewSession) -> Result<SessionRecord, ControlError> {
        self.new_session_by(params, None).await
    }

    /// Creates a session (durable on return) and makes it live, recording
    /// `created_by` (the authenticated actor of a networked client) as its
    /// creator: besides the host owner, only the creator may close it or
    /// revoke others' injections on it.
    ///
    /// # Errors
    /// [`ControlError::InvalidParams`] for a relative or missing `cwd`, a
    /// relative additional directory, or a root (`cwd` or an additional
    /// directory) that is, contains or lies inside the data dir or contains
    /// the receipt key file (compared after resolving symlinks and `..`; see
    /// [`PrivatePaths`]), or that is `/` or on a kernel pseudo filesystem
    /// (`/proc`, `/sys`, `/dev`, or by `statfs` type); [`ControlError::Storage`].
    pub async fn new_session_by(
        &self,
        params: NewSession,
        created_by: Option<&str>,
    ) -> Result<SessionRecord, ControlError> {
        if !params.cwd.is_absolute() {
            return Err(ControlError::invalid("cwd", "must be an absolute path"));
        }
        if !params.cwd.is_dir() {
            return Err(ControlError::invalid("cwd", "is not an existing directory"));
        }
        if let Some(bad) = params
            .additional_directories
            .iter()
            .find(|d| !d.is_absolute())
        {
            return Err(ControlError::invalid(
                "additionalDirectories",
                &format!("{} is not an absolute path", bad.display()),
            ));
        }
        let private = PrivatePaths::of(&self.env.config);
        private.check("cwd", &params.cwd)?;
        for dir in &params.additional_directories {
            private.check("additionalDirectories", dir)?;
        }
        if params.labels.len() > 32
            || params.labels.iter().any(|l| {
                l.is_empty()
                    || l.len() > 64
                    || !l
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c))
            })
        {
            return Err(ControlError::invalid(
                "_meta.berth.labels",
                "at most 32 labels, each 1 to 64 characters of A-Z a-z 0-9 . _ : -",
            ));
        }
        if let Some(parent) = &params.parent_session_id {
            if self.env.journal.session(parent)?.is_none() {
                return Err(ControlError::invalid(
                    "_meta.berth.parentSessionId",
                    &format!("no session {parent}"),
                ));
            }
        }
        // A client-chosen id is checked and taken under one lock, so two
        // racing creations of the same id cannot both write a record.
        let _creating = match &params.session_id {
            Some(id) => {
                validate_session_id(id)?;
                let guard = CLIENT_ID_CREATION.lock().await;
                if self.registry.get_live(id).await.is_some()
                    || self.env.journal.session(id)?.is_some()
                {
                    return Err(ControlError::invalid(
                        "sessionId",
                        &format!("a session {id} already exists"),
                    ));
                }
                Some(guard)
            }
            None => None,
        };
        let now = self.env.config.clock.now();
        let record = SessionRecord {
            session_id: params
                .session_id
                .clone()
                .unwrap_or_else(|| SessionId(self.env.config.ids.new_id("sess"))),
            cwd: params.cwd,
            additional_directories: params.additional_directories,
            mcp_servers: params.mcp_servers,
            mode_id: DEFAULT_MODE_ID.into(),
            title: None,
            created_at: now,
            updated_at: now,
            closed_at: None,
            checkpoint_head: 0,
            parent_session_id: params.parent_session_id,
            labels: params.labels,
            spend: Default::default(),
            budget_grant: Default::default(),
            context_from: 0,
            suspend_request: None,
            created_by: created_by.map(str::to_owned),
        };
        self.env
            .journal
            .commit(Batch::new().put_session(&record))
            .await?;
        self.registry.get_or_spawn(&record.session_id).await?;
        Ok(record)
    }

    /// Checks that the server holds the session.
    ///
    /// # Errors
    /// [`ControlError::UnknownSession`]; [`ControlError::Storage`].
    pub async fn ensure_exists(&self, id: &SessionId) -> Result<(), ControlError> {
        if self.registry.get_live(id).await.is_some() || self.env.journal.session(id)?.is_some() {
            Ok(())
        } else {
            Err(ControlError::UnknownSession {
                session_id: id.clone(),
            })
        }
    }

    /// Runs a prompt turn; resolves when the turn is sealed (durable).
    ///
    /// # Errors
    /// `UnknownSession`, `SessionClosed`, `PromptActive`, `Storage`, `ActorFailed`.
    pub async fn prompt(
        &self,
        id: &SessionId,
        prompt: Prompt,
    ) -> Result<PromptOutcome, ControlError> {
        self.prompt_from(id, prompt, None).await
    }

    /// [`Node::prompt`] sent by watcher `origin` (a client connection): the
    /// live `turn_started` notice carries it
    /// ([`SessionNotice::origin`](crate::watch::SessionNotice::origin)), so
    /// that client is not shown its own prompt back.
    ///
    /// # Errors
    /// As [`Node::prompt`].
    pub async fn prompt_from(
        &self,
        id: &SessionId,
        prompt: Prompt,
        origin: Option<u64>,
    ) -> Result<PromptOutcome, ControlError> {
        let trace = tracing::Span::current();
        self.call(id, |reply| SessionMsg::Prompt {
            prompt: prompt.clone(),
            origin,
            reply,
            trace: trace.clone(),
        })
        .await?
    }

    /// `session/suspend`: parks the session; resolves once the suspension is
    /// committed (at once when idle; when the running turn reaches the seam
    /// `mode` names otherwise).
    ///
    /// # Errors
    /// `UnknownSession`, `SessionClosed`, `Storage`, `ActorFailed`.
    pub async fn suspend(
        &self,
        id: &SessionId,
        params: SuspendParams,
    ) -> Result<SuspendOutcome, ControlError> {
        let trace = tracing::Span::current();
        self.call(id, |reply| SessionMsg::Suspend {
            params: params.clone(),
            reply,
            trace: trace.clone(),
        })
        .await?
    }

    /// Every session that is not closed, in id order (live or not: a
    /// passivated parked session has no actor but is still addressed).
    fn open_session_ids(&self) -> Result<Vec<SessionId>, ControlError> {
        let mut ids = Vec::new();
        let mut after = None;
        loop {
            let page = self.env.journal.sessions(after.as_ref(), 1024)?;
            let Some(last) = page.last() else {
                return Ok(ids);
            };
            after = Some(last.session_id.clone());
            ids.extend(
                page.into_iter()
                    .filter(|r| r.closed_at.is_none())
                    .map(|r| r.session_id),
            );
        }
    }

    /// Interrupt-and-suspend broadcast (`_berth/suspend_many`): suspends every
    /// selected *running* session with `mode` (all at once; each answer waits
    /// for its turn to park) and reports per session. `All` and `Label`
    /// address every session that is not closed; one with no actor is not
    /// running (a running session always has one) and is answered from the
    /// journal without rehydrating it.
    ///
    /// # Errors
    /// [`ControlError::Storage`] reading the selection.
    pub async fn suspend_many(
        &self,
        selector: SessionSelector,
        mode: SuspendMode,
        reason: Option<String>,
        actor: &str,
    ) -> Result<Vec<(SessionId, BroadcastOutcome)>, ControlError> {
        let ids = match &selector {
            SessionSelector::Ids(ids) => ids.clone(),
            SessionSelector::All | SessionSelector::Label(_) => self.open_session_ids()?,
        };
        let tasks = ids.into_iter().map(|id| {
            let selector = &selector;
            let reason = reason.clone();
            async move {
                let record = match self.env.journal.session(&id) {
                    Ok(Some(record)) => record,
                    Ok(None) => return Some((id, BroadcastOutcome::Unknown)),
                    Err(e) => {
                        return Some((
                            id,
                            BroadcastOutcome::Failed {
                                reason: e.to_string(),
                            },
                        ))
                    }
                };
                if let SessionSelector::Label(label) = selector {
                    if !record.labels.contains(label) {
                        return None;
                    }
                }
                if self.registry.get_live(&id).await.is_none() {
                    let outcome = match self.env.journal.suspension(&id) {
                        Ok(Some(parked)) => BroadcastOutcome::AlreadySuspended {
                            handle: parked.handle,
                        },
                        Ok(None) => BroadcastOutcome::NotRunning,
                        Err(e) => BroadcastOutcome::Failed {
                            reason: e.to_string(),
                        },
                    };
                    return Some((id, outcome));
                }
                let params = SuspendParams {
                    mode,
                    reason,
                    resume_when: None,
                    actor: actor.to_owned(),
                    initiator: Initiator::Client,
                    require_running: true,
                };
                let outcome = match self.suspend(&id, params).await {
                    Ok(o) if o.already_suspended => {
                        BroadcastOutcome::AlreadySuspended { handle: o.handle }
                    }
                    Ok(o) => BroadcastOutcome::Suspended { handle: o.handle },
                    Err(
                        ControlError::NoActivePrompt { .. } | ControlError::SessionClosed { .. },
                    ) => BroadcastOutcome::NotRunning,
                    Err(ControlError::UnknownSession { .. }) => BroadcastOutcome::Unknown,
                    Err(e) => BroadcastOutcome::Failed {
                        reason: e.to_string(),
                    },
                };
                Some((id, outcome))
            }
        });
        Ok(futures::future::join_all(tasks)
            .await
            .into_iter()
            .flatten()
            .collect())
    }

    /// Claims the session's suspension and wakes it (see
    /// `session::lifecycle::resume`).
    ///
    /// # Errors
    /// `UnknownSession`, `SessionClosed`, `ResumeConflict`, `ResumeRefused`,
    /// `Storage`, `ActorFailed`.
    pub async fn resume(
        &self,
        id: &SessionId,
        params: ResumeParams,
    ) -> Result<ResumeOutcome, ControlError> {
        let trace = tracing::Span::current();
        self.call(id, |reply| SessionMsg::Resume {
            params: params.clone(),
            reply,
            trace: trace.clone(),
        })
        .await?
    }

    /// The session's current suspension, if it is parked.
    ///
    /// # Errors
    /// [`ControlError::Storage`].
    pub fn suspension(&self, id: &SessionId) -> Result<Option<Suspension>, ControlError> {
        Ok(self.env.journal.suspension(id)?)
    }

    /// Cancels the running turn (idempotent).
    ///
    /// # Errors
    /// [`ControlError::UnknownSession`] when the server holds no such session.
    pub async fn cancel(&self, id: &SessionId, actor: &str) -> Result<CancelStatus, ControlError> {
        self.call(id, |reply| SessionMsg::Cancel {
            actor: actor.to_owned(),
            reply,
        })
        .await?
    }

    /// `session/inject`: queues a message for the running turn; returns its
    /// message id once the acceptance (and its receipt) is durable.
    ///
    /// # Errors
    /// `UnknownSession`, `NoActivePrompt` (checked before the mode),
    /// `InvalidParams` (`invalid_mode`, `invalid_content`), `Storage`.
    pub async fn inject(
        &self,
        id: &SessionId,
        mode: &str,
        content: &Value,
        actor: &str,
    ) -> Result<String, ControlError> {
        self.call(id, |reply| SessionMsg::Inject {
            mode: mode.to_owned(),
            content: content.clone(),
            actor: actor.to_owned(),
            reply,
        })
        .await?
    }

    /// `session/revoke_inject` (`content: None`) or `session/replace_inject`
    /// by the client that injected the message.
    ///
    /// # Errors
    /// `UnknownSession`, `Injection` (already delivered/revoked, unknown id,
    /// not `actor`'s), `InvalidParams` (`invalid_content`), `Storage`.
    pub async fn retract_injection(
        &self,
        id: &SessionId,
        message_id: &str,
        content: Option<&Value>,
        actor: &str,
    ) -> Result<(), ControlError> {
        self.retract_injection_as(id, message_id, content, actor, false)
            .await
    }

    /// [`Node::retract_injection`]; with `owner_override` (the caller checked
    /// that `actor` owns the session: host owner or creator) a revoke may
    /// pull back another client's message. A replace is always the injecting
    /// client's alone.
    ///
    /// # Errors
    /// As [`Node::retract_injection`].
    pub async fn retract_injection_as(
        &self,
        id: &SessionId,
        message_id: &str,
        content: Option<&Value>,
        actor: &str,
        owner_override: bool,
    ) -> Result<(), ControlError> {
        self.call(id, |reply| SessionMsg::Retract {
            message_id: message_id.to_owned(),
            content: content.cloned(),
            actor: actor.to_owned(),
            owner_override,
            reply,
        })
        .await?
    }

    /// Records that a control was refused before it reached its handler (the
    /// sender's role does not allow `method`): a durable rejected
    /// `control_outcome` receipt with `reason` and `metadata`, delivered to
    /// the session's watchers like every receipt. Returns once it is durable.
    ///
    /// # Errors
    /// `UnknownSession` (no log to journal it in), `Storage`, `ActorFailed`.
    pub async fn refuse_control(
        &self,
        id: &SessionId,
        method: &str,
        actor: &str,
        reason: &str,
        metadata: Value,
    ) -> Result<(), ControlError> {
        self.call(id, |reply| SessionMsg::Refuse {
            method: method.to_owned(),
            actor: actor.to_owned(),
            reason: reason.to_owned(),
            metadata: metadata.clone(),
            reply,
        })
        .await?
    }

    /// `session/cancel_tool_call`: stops one tool call of the running turn.
    ///
    /// # Errors
    /// `UnknownSession`, `Storage`.
    pub async fn cancel_tool_call(
        &self,
        id: &SessionId,
        tool_call_id: &str,
        reason: Option<&str>,
        actor: &str,
    ) -> Result<CallCancel, ControlError> {
        self.call(id, |reply| SessionMsg::CancelToolCall {
            tool_call_id: tool_call_id.to_owned(),
            reason: reason.map(str::to_owned),
            actor: actor.to_owned(),
            reply,
        })
        .await?
    }

    /// `session/rollback` (`redo: false`) or `session/redo`: pops or pushes
    /// back the last completed turn. Returns the wire result object.
    ///
    /// # Errors
    /// `UnknownSession`, `Storage`, `ActorFailed` (a file could not be restored).
    pub async fn rollback(
        &self,
        id: &SessionId,
        redo: bool,
        actor: &str,
    ) -> Result<Value, ControlError> {
        self.call(id, |reply| SessionMsg::Rollback {
            redo,
            actor: actor.to_owned(),
            reply,
        })
        .await?
    }

    /// `berth.session_view.query`: the session's `berth.session_view.v1`
    /// projection with its `projection_hash` and `prefix_hash`.
    ///
    /// # Errors
    /// `UnknownSession`.
    pub async fn session_view(&self, id: &SessionId) -> Result<Value, ControlError> {
        self.call(id, |reply| SessionMsg::View { reply }).await
    }

    /// `session/pending_injections`: the running turn's undelivered messages, FIFO.
    ///
    /// # Errors
    /// `UnknownSession`.
    pub async fn pending_injections(&self, id: &SessionId) -> Result<Vec<Injection>, ControlError> {
        self.call(id, |reply| SessionMsg::PendingInjections { reply })
            .await
    }

    /// Closes the session: cancels a running turn, records the close durably and
    /// drops the session from memory. It stays readable by `session/load`.
    ///
    /// # Errors
    /// `UnknownSession`, `Storage`, `ActorFailed`.
    pub async fn close(&self, id: &SessionId, actor: &str) -> Result<(), ControlError> {
        self.call(id, |reply| SessionMsg::Close {
            actor: actor.to_owned(),
            reply,
        })
        .await?
    }

    /// Attaches `watcher` to the session; with `replay`, every persisted event is
    /// delivered to it before this returns.
    ///
    /// # Errors
    /// `UnknownSession`, `Storage`, `ActorFailed`.
    pub async fn attach(
        &self,
        id: &SessionId,
        watcher: Arc<dyn Watcher>,
        replay: bool,
    ) -> Result<AttachOutcome, ControlError> {
        let replay = if replay {
            Replay::After(0)
        } else {
            Replay::None
        };
        self.attach_with(id, watcher, replay).await
    }

    /// Attaches `watcher` to the session, replaying what `replay` names
    /// before this returns (a reconnecting client passes
    /// `Replay::After(last acknowledged event id)` and receives exactly the
    /// events it missed, then live ones, each once). The session's other
    /// watchers hear of a new watcher through [`Watcher::presence`].
    ///
    /// # Errors
    /// `UnknownSession`; `InvalidParams` (field `_meta.berth.lastEventId`)
    /// for an id past the session's last event; `Storage`, `ActorFailed`.
    pub async fn attach_with(
        &self,
        id: &SessionId,
        watcher: Arc<dyn Watcher>,
        replay: Replay,
    ) -> Result<AttachOutcome, ControlError> {
        self.call(id, |reply| SessionMsg::Attach {
            watcher: Arc::clone(&watcher),
            replay,
            reply,
        })
        .await?
    }

    /// Whether the session has an actor right now: `false` for a session
    /// that is passivated (parked, only rows and a timer), closed or unknown.
    pub async fn is_live(&self, id: &SessionId) -> bool {
        self.registry.get_live(id).await.is_some()
    }

    /// Detaches a watcher from a session (its connection closed). A session that
    /// is not live has no watchers.
    pub async fn detach(&self, id: &SessionId, watcher_id: u64) {
        match self.registry.get_live(id).await {
            Some(actor) => {
                let _ = actor.send_message(SessionMsg::Detach { watcher_id });
            }
            None => self.env.passivated.detach(id, watcher_id),
        }
    }

    /// Every durable event of a session with id above `after`, in order
    /// (read from the journal; a passivated session is not woken).
    ///
    /// # Errors
    /// `UnknownSession`; `Storage`.
    pub fn session_events(
        &self,
        id: &SessionId,
        after: EventId,
    ) -> Result<Vec<(EventId, berth_runtime::event::EventRecord)>, ControlError> {
        if self.env.journal.session(id)?.is_none() {
            return Err(ControlError::UnknownSession {
                session_id: id.clone(),
            });
        }
        Ok(self.env.journal.events(id, after)?)
    }

    /// One page of sessions in id order after `cursor`, optionally only those
    /// whose cwd is `cwd`. Returns the page and the cursor of the next page
    /// (`None` when this is the last).
    ///
    /// # Errors
    /// [`ControlError::Storage`].
    pub async fn list(
        &self,
        cwd: Option<&Path>,
        cursor: Option<&SessionId>,
        limit: usize,
    ) -> Result<(Vec<SessionStatus>, Option<SessionId>), ControlError> {
        let limit = limit.max(1);
        let mut out = Vec::new();
        let mut after = cursor.cloned();
        loop {
            let page = self.env.journal.sessions(after.as_ref(), limit)?;
            let exhausted = page.len() < limit;
            after = page.last().map(|r| r.session_id.clone());
            for record in page {
                if cwd.is_some_and(|c| c != record.cwd) {
                    continue;
                }
                out.push(self.status_of(record).await?);
                if out.len() == limit {
                    let more =
                        !exhausted || after.as_ref() != out.last().map(|s| &s.record.session_id);
                    let next = more.then(|| out[limit - 1].record.session_id.clone());
                    return Ok((out, next));
                }
            }
            if exhausted {
                return Ok((out, None));
            }
        }
    }

    /// One session's status, read-only: a session that is not live is read
    /// from the journal (no actor is spawned for it).
    ///
    /// # Errors
    /// `UnknownSession`, `Storage`.
    pub async fn session_status(&self, id: &SessionId) -> Result<SessionStatus, ControlError> {
        let record = self
            .env
            .journal
            .session(id)?
            .ok_or_else(|| ControlError::UnknownSession {
                session_id: id.clone(),
            })?;
        self.status_of(record).await
    }

    async fn status_of(&self, record: SessionRecord) -> Result<SessionStatus, ControlError> {
        if let Some(actor) = self.registry.get_live(&record.session_id).await {
            if let Ok(CallResult::Success(status)) =
                actor.call(|reply| SessionMsg::Status { reply }, None).await
            {
                return Ok(status);
            }
        }
        let last_event_id = self.env.journal.last_event_id(&record.session_id)?;
        let suspension_handle = self
            .env
            .journal
            .suspension(&record.session_id)?
            .map(|s| s.handle);
        Ok(SessionStatus {
            record,
            live: false,
            active_prompt: false,
            last_event_id,
            suspension_handle,
            quiescing: false,
            last_claim: None,
        })
    }

    /// Stops every session actor (their running turns stay open in the journal
    /// and are sealed at the next start; their processes are killed) and the
    /// supervisor, then has the journal fold its commit log into its file
    /// ([`berth_storage::Journal::flush_log`]), so that the next start has
    /// nothing to replay however the process then ends.
    pub async fn shutdown(&self) {
        for id in self.registry.live_ids().await {
            if let Some(actor) = self.registry.get_live(&id).await {
                let _ = actor
                    .stop_and_wait(
                        Some("node shutdown".into()),
                        Some(std::time::Duration::from_secs(5)),
                    )
                    .await;
            }
        }
        self.supervisor.stop(None);
        if let Err(e) = self.env.journal.flush_log().await {
            tracing::warn!(error = %e, "could not fold the journal's commit log into its file at shutdown; the next start replays it");
        }
    }
}

/// What no session root may reach: the data dir (journal, commit log, key
/// file, process ledger, control socket) and the receipt key file. Each is
/// held in its absolute lexical form and, when it exists, canonicalized.
struct PrivatePaths {
    data_dir: Vec<PathBuf>,
    key_file: Vec<PathBuf>,
}

impl PrivatePaths {
    fn of(config: &crate::config::NodeConfig) -> Self {
        let data_dir = resolved_forms(&config.data_dir);
        let key_file = if config.receipt_keys.is_none() {
            resolved_forms(&config.data_dir.join(berth_storage::KEY_FILE))
        } else {
            Vec::new()
        };
        Self { data_dir, key_file }
    }

    /// Refuses `root` (the value of `field`) when it is, contains or lies
    /// inside the data dir, or contains the key file.
    fn check(&self, field: &str, root: &Path) -> Result<(), ControlError> {
        let root = resolved_forms(root);
        if let Some(reason) = root.iter().find_map(|r| pseudo_root(r)) {
            return Err(ControlError::invalid(field, &reason));
        }
        let overlaps = root.iter().any(|r| {
            self.data_dir
                .iter()
                .any(|d| r.starts_with(d) || d.starts_with(r))
        });
        if overlaps {
            return Err(ControlError::invalid(
                field,
                "is, contains or lies inside berth's data dir (its journal and receipt keys); \
                 give the session a directory outside it",
            ));
        }
        if root
            .iter()
            .any(|r| self.key_file.iter().any(|k| k.starts_with(r)))
        {
            return Err(ControlError::invalid(
                field,
                "contains berth's receipt key file, beside its data dir; \
                 give the session a directory that does not",
            ));
        }
        Ok(())
    }
}

/// Why `root` (absolute, `..` folded) may not be a session root, if it may
/// not: it is `/` itself, or it is or lies inside `/proc`, `/sys` or `/dev`,
/// or it is on a kernel pseudo filesystem wherever mounted (procfs, sysfs,
/// devpts, cgroup, debugfs, tracefs, securityfs, bpf, configfs, efivarfs;
/// told by `statfs`'s filesystem type). These expose other processes'
/// environments and memory (`/proc/<pid>/environ`) and devices, which no
/// containment below a root can make safe.
fn pseudo_root(root: &Path) -> Option<String> {
    use nix::sys::statfs::{self, FsType};
    if root.parent().is_none() {
        return Some(
            "is the filesystem root /, which holds berth's data dir and every other user's files; \
             give the session a project directory"
                .into(),
        );
    }
    for top in ["/proc", "/sys", "/dev"] {
        if root.starts_with(top) {
            return Some(format!(
                "is or lies inside {top}, a kernel pseudo filesystem exposing processes, \
                 devices and secrets; give the session a project directory"
            ));
        }
    }
    const PSEUDO: &[(i64, &str)] = &[
        (0x9fa0, "procfs"),
        (0x6265_6572, "sysfs"),
        (0x1cd1, "devpts"),
        (0x0027_e0eb, "cgroup"),
        (0x6367_7270, "cgroup2"),
        (0x6462_6720, "debugfs"),
        (0x7472_6163, "tracefs"),
        (0x7363_6673, "securityfs"),
        (0xcafe_4a11, "bpf"),
        (0x6265_6570, "configfs"),
        (0xde5e_81e4, "efivarfs"),
    ];
    let kind = statfs::statfs(root).ok()?.filesystem_type();
    PSEUDO
        .iter()
        .find(|(magic, _)| kind == FsType(*magic as _))
        .map(|(_, name)| {
            format!(
                "is on a {name} kernel pseudo filesystem exposing processes, devices and \
                 secrets; give the session a project directory"
            )
        })
}

/// `path`'s absolute lexical form (`.` and `..` folded) and its real form:
/// canonicalized when it exists, else its nearest existing ancestor
/// canonicalized with the rest folded onto it (a component that does not
/// exist is no symlink).
fn resolved_forms(path: &Path) -> Vec<PathBuf> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let parts: Vec<_> = absolute.components().collect();
    let mut forms = vec![fold(PathBuf::new(), &parts)];
    for existing in (1..=parts.len()).rev() {
        let prefix: PathBuf = parts[..existing].iter().collect();
        if let Ok(real) = prefix.canonicalize() {
            let real = fold(real, &parts[existing..]);
            if real != forms[0] {
                forms.push(real);
            }
            break;
        }
    }
    forms
}

/// `base` with `parts` pushed onto it, `.` and `..` folded lexically.
fn fold(mut base: PathBuf, parts: &[std::path::Component<'_>]) -> PathBuf {
    use std::path::Component;
    for part in parts {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                base.pop();
            }
            other => base.push(other),
        }
    }
    base
}
