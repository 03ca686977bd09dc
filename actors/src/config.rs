//! What a node runs with.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use berth_runtime::budget::{BudgetPolicy, Price};
use berth_runtime::clock::{Clock, SystemClock};
use berth_runtime::directives::CompletionJudge;
use berth_runtime::ids::{IdSource, RandomIds};
use berth_runtime::model::ModelProvider;
use berth_runtime::tools::ToolSet;
use berth_storage::Keyring;

/// Default [`NodeConfig::max_live_sessions`].
pub const DEFAULT_MAX_LIVE_SESSIONS: usize = 10_000;

/// Node configuration.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Data directory; the journal is `<data_dir>/journal.redb` with its
    /// commit log `<data_dir>/journal.log`.
    pub data_dir: PathBuf,
    /// The model every session uses.
    pub model: Arc<dyn ModelProvider>,
    /// The tools every session offers.
    pub tools: ToolSet,
    /// Model calls per turn before it ends with `max_turn_requests` (default 50).
    pub max_model_calls: u32,
    /// redb quick-repair (see `berth_storage::JournalOptions`).
    pub quick_repair: bool,
    /// redb page cache in bytes (see `berth_storage::JournalOptions`;
    /// default 64 MiB).
    pub journal_cache_bytes: usize,
    /// Stop the actor of a session once it is parked with nothing in flight
    /// (default `true`; DESIGN.md "Scale"): a parked session costs only its
    /// rows and its timer until a wake-up, event or client rehydrates it.
    pub passivate_parked: bool,
    /// How long a session stays parked with its actor before it is
    /// passivated (ms; default 10,000): short waits (a 1 s timer, an event
    /// that comes soon) resume without rehydrating; long ones cost only rows
    /// and a timer. `0`: at once.
    pub passivate_after_ms: u64,
    /// Soft cap on sessions holding a live actor (default 10,000; like a
    /// Temporal worker's workflow cache). Past it, a session that is parked
    /// *or idle* gives up its actor as soon as it has nothing in flight,
    /// without waiting `passivate_after_ms`; running turns are never
    /// stopped, so the count may exceed it while they run. A live actor
    /// costs about 11 KiB plus its transcript; a passivated session only
    /// its rows (and its timer). Ignored when `passivate_parked` is off.
    pub max_live_sessions: usize,
    /// Whether the scheduler and claimer threads ask for real-time priority
    /// (`SCHED_FIFO` 1; default on), so that a due wake-up is not handed out
    /// late behind a burst of busy turns (see `berth_scheduler::realtime`).
    /// Without the privilege (`CAP_SYS_NICE` or `RLIMIT_RTPRIO` ≥ 1) they
    /// run at normal priority and the start-up log says so.
    pub realtime_timers: bool,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// Id source.
    pub ids: Arc<dyn IdSource>,
    /// The completion judge every turn runs at the model's end of turn, if any
    /// (off by default; `completion_judge = true` in the config file).
    pub completion_judge: Option<Arc<dyn CompletionJudge>>,
    /// Tools whose calls wait for a client's approval
    /// (`session/request_permission`); empty by default.
    pub needs_approval: Vec<String>,
    /// Budget policies (`[[budgets]]` in the config file); none by default.
    pub budgets: Vec<BudgetPolicy>,
    /// Model prices by model name (`[prices."NAME"]`), for cost budgets.
    pub prices: HashMap<String, Price>,
    /// The receipt keyring (`BERTH_RECEIPT_KEYS`, parsed by the binary).
    /// `None`: the key file `<data_dir>/receipt-keys.json`, created 0600 on
    /// first start (see `berth_storage::keyring`).
    pub receipt_keys: Option<Keyring>,
}

impl NodeConfig {
    /// Defaults: built-in tools, 50 model calls per turn, system clock, random
    /// ids, no completion judge.
    pub fn new(data_dir: impl Into<PathBuf>, model: Arc<dyn ModelProvider>) -> Self {
        Self {
            data_dir: data_dir.into(),
            model,
            tools: ToolSet::builtin(),
            max_model_calls: 50,
            quick_repair: false,
            journal_cache_bytes: berth_storage::DEFAULT_CACHE_BYTES,
            passivate_parked: true,
            passivate_after_ms: 10_000,
            max_live_sessions: DEFAULT_MAX_LIVE_SESSIONS,
            realtime_timers: true,
            clock: Arc::new(SystemClock),
            ids: Arc::new(RandomIds),
            completion_judge: None,
            needs_approval: Vec::new(),
            budgets: Vec::new(),
            prices: HashMap::new(),
            receipt_keys: None,
        }
    }
}
