//! Flags and the TOML config file of `berth serve`. Flags win over the file;
//! the file wins over defaults.
//!
//! ```toml
//! data_dir = "berth-data"          # journal lives in <data_dir>/journal.redb
//! model = "scripted"               # scripted | scripted:PATH | openai:MODEL
//! max_model_calls = 50             # per turn
//! quick_repair = false             # redb quick-repair (faster crash recovery, slower commits)
//! journal_cache_mib = 256          # redb page cache (MiB); counts towards RSS
//!
//! [[budgets]]                      # budget policies; a breach suspends the session
//! label = "fleet"                  # only sessions with this label (omit: all)
//! max_tokens = 200000              # input + output tokens over the session's turns
//! max_cost_usd = 2.5               # needs a price for the model below
//! max_tool_calls = 500
//! max_wall_ms = 3600000            # time spent running turns
//!
//! [prices."openai:gpt-4o-mini"]   # per model name (`initialize` shows it)
//! input_per_mtok_usd = 0.15
//! output_per_mtok_usd = 0.6
//! completion_judge = false         # restate an unmet request as a corrective directive at end of turn
//! require_approval = ["shell"]     # tools whose calls wait for session/request_permission
//!
//! [acp]
//! max_frame_bytes = 8388608        # longest accepted line (bytes)
//! max_in_flight = 64               # concurrent requests per connection
//!
//! [a2a]                            # the A2A 1.0 endpoint (served with --listen or `listen`)
//! listen = "127.0.0.1:9999"        # HTTP address (loopback by default; no auth of its own)
//! public_url = "http://127.0.0.1:9999/"   # JSON-RPC URL on the agent card [default: http://<Host>/]
//! name = "berth"                   # agent card name / description
//! message_ids_in_prompt = false    # prefix prompts with [a2a messageId: …] (the TCK profile needs it)
//! [[a2a.skills]]                   # agent card skills (default: one "session" skill)
//! id = "review"
//! name = "Code review"
//! description = "Reviews a change"
//! tags = ["code"]
//!
//! [openai]                         # used when model = "openai:MODEL"
//! base_url = "http://127.0.0.1:8000/v1"   # default: $OPENAI_BASE_URL or https://api.openai.com/v1
//! api_key_env = "OPENAI_API_KEY"   # env var holding the key (never the key itself)
//! request_timeout_ms = 600000
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use berth_acp::ServeOptions;
use berth_runtime::budget::{BudgetPolicy, Price};
use berth_runtime::model::openai::{OpenAiConfig, OpenAiModel};
use berth_runtime::model::{self, ModelProvider};
use clap::Args;
use serde::Deserialize;

/// Flags of `berth serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Data directory (created if missing) [default: ./berth-data].
    #[arg(long, env = "BERTH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Model: `scripted` (built-in demo script), `scripted:PATH` or `openai:MODEL`
    /// [default: scripted].
    #[arg(long, env = "BERTH_MODEL")]
    pub model: Option<String>,
    /// TOML config file (see the README).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Longest accepted ACP frame in bytes [default: 8388608].
    #[arg(long)]
    pub max_frame_bytes: Option<usize>,
    /// Concurrent requests per connection [default: 64].
    #[arg(long)]
    pub max_in_flight: Option<usize>,
    /// A tool whose calls wait for the client's approval
    /// (`session/request_permission`); repeatable, e.g. `--require-approval shell`.
    #[arg(long = "require-approval", value_name = "TOOL")]
    pub require_approval: Vec<String>,
    /// Serve A2A 1.0 (JSON-RPC + SSE, agent card) over HTTP on this address,
    /// e.g. `127.0.0.1:9999`; stdin closing then no longer stops the server.
    #[arg(long, env = "BERTH_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// Put `[a2a messageId: …]` in front of each A2A prompt the model reads
    /// (for the A2A TCK profile script).
    #[arg(long)]
    pub a2a_message_ids_in_prompt: bool,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct A2aSection {
    listen: Option<String>,
    public_url: Option<String>,
    name: Option<String>,
    description: Option<String>,
    message_ids_in_prompt: Option<bool>,
    #[serde(default)]
    skills: Vec<berth_a2a::AgentSkill>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct AcpSection {
    max_frame_bytes: Option<usize>,
    max_in_flight: Option<usize>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct OpenAiSection {
    base_url: Option<String>,
    api_key_env: Option<String>,
    request_timeout_ms: Option<u64>,
}

/// The config file.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    data_dir: Option<PathBuf>,
    model: Option<String>,
    max_model_calls: Option<u32>,
    quick_repair: Option<bool>,
    journal_cache_mib: Option<u32>,
    completion_judge: Option<bool>,
    require_approval: Option<Vec<String>>,
    #[serde(default)]
    acp: AcpSection,
    #[serde(default)]
    a2a: A2aSection,
    #[serde(default)]
    openai: OpenAiSection,
    /// `[[budgets]]`: budget policies (limits for all sessions or a label).
    #[serde(default)]
    budgets: Vec<BudgetPolicy>,
    /// `[prices."MODEL NAME"]`: USD per million input/output tokens.
    #[serde(default)]
    prices: HashMap<String, Price>,
}

/// Everything `serve` needs, resolved.
pub struct Settings {
    pub data_dir: PathBuf,
    pub model: Arc<dyn ModelProvider>,
    pub max_model_calls: u32,
    pub quick_repair: bool,
    pub journal_cache_bytes: usize,
    pub completion_judge: bool,
    pub require_approval: Vec<String>,
    pub acp: ServeOptions,
    /// The A2A listener address and adapter options (`None`: no A2A).
    pub a2a: Option<(String, berth_a2a::A2aOptions)>,
    pub budgets: Vec<BudgetPolicy>,
    pub prices: HashMap<String, Price>,
}

impl FileConfig {
    /// Reads and parses a config file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("config {} is invalid", path.display()))
    }

    /// Resolves flags over file over defaults.
    pub fn merge(self, args: &ServeArgs) -> anyhow::Result<Settings> {
        let spec = args
            .model
            .clone()
            .or(self.model)
            .unwrap_or_else(|| "scripted".into());
        let model: Arc<dyn ModelProvider> = match spec.strip_prefix("openai:") {
            Some(name) => {
                let mut config = OpenAiConfig::from_env(name);
                if let Some(url) = self.openai.base_url {
                    config.base_url = url;
                }
                if let Some(var) = self.openai.api_key_env {
                    config.api_key = std::env::var(&var).ok().filter(|k| !k.is_empty());
                }
                if let Some(ms) = self.openai.request_timeout_ms {
                    config.request_timeout_ms = ms;
                }
                Arc::new(OpenAiModel::new(config)?)
            }
            None => model::from_spec(&spec)?,
        };
        let defaults = ServeOptions::default();
        let acp = ServeOptions {
            max_frame_bytes: args
                .max_frame_bytes
                .or(self.acp.max_frame_bytes)
                .unwrap_or(defaults.max_frame_bytes),
            max_in_flight: args
                .max_in_flight
                .or(self.acp.max_in_flight)
                .unwrap_or(defaults.max_in_flight),
        };
        if acp.max_in_flight == 0 || acp.max_frame_bytes == 0 {
            anyhow::bail!("max_in_flight and max_frame_bytes must be at least 1");
        }
        let data_dir = args
            .data_dir
            .clone()
            .or(self.data_dir)
            .unwrap_or_else(|| PathBuf::from("berth-data"));
        let a2a = args.listen.clone().or(self.a2a.listen).map(|addr| {
            let mut options = berth_a2a::A2aOptions::new(data_dir.join("a2a-contexts"));
            options.public_url = self.a2a.public_url;
            if let Some(name) = self.a2a.name {
                options.name = name;
            }
            if let Some(description) = self.a2a.description {
                options.description = description;
            }
            if !self.a2a.skills.is_empty() {
                options.skills = self.a2a.skills;
            }
            options.message_ids_in_prompt =
                args.a2a_message_ids_in_prompt || self.a2a.message_ids_in_prompt.unwrap_or(false);
            (addr, options)
        });
        Ok(Settings {
            data_dir,
            model,
            max_model_calls: self.max_model_calls.unwrap_or(50).max(1),
            quick_repair: self.quick_repair.unwrap_or(false),
            journal_cache_bytes: self
                .journal_cache_mib
                .map_or(berth_storage::DEFAULT_CACHE_BYTES, |mib| {
                    (mib.max(1) as usize) << 20
                }),
            completion_judge: self.completion_judge.unwrap_or(false),
            require_approval: if args.require_approval.is_empty() {
                self.require_approval.unwrap_or_default()
            } else {
                args.require_approval.clone()
            },
            acp,
            a2a,
            budgets: self.budgets,
            prices: self.prices,
        })
    }
}
