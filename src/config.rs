//! Flags, `BERTH_*` environment variables and the TOML config file of
//! `berth serve`. Flags (and the environment variable each one reads) win
//! over the file; the file wins over defaults. `berth config check FILE`
//! validates a file alone with [`check_file`]. Every option is shown in
//! `deploy/berth.example.toml`.
//!
//! | file key | flag | environment |
//! |---|---|---|
//! | `data_dir` | `--data-dir` | `BERTH_DATA_DIR` |
//! | `model` | `--model` | `BERTH_MODEL` |
//! | — | `--config` | `BERTH_CONFIG` |
//! | `acp.max_frame_bytes` | `--max-frame-bytes` | `BERTH_MAX_FRAME_BYTES` |
//! | `acp.max_in_flight` | `--max-in-flight` | `BERTH_MAX_IN_FLIGHT` |
//! | `require_approval` | `--require-approval` (repeatable) | — |
//! | `http.listen` | `--listen` | `BERTH_LISTEN` |
//! | `http.tls_cert`, `http.tls_key` | `--tls-cert`, `--tls-key` | `BERTH_TLS_CERT`, `BERTH_TLS_KEY` |
//! | `http.allowed_origins` | `--allowed-origin` (repeatable) | `BERTH_ALLOWED_ORIGINS` (comma-separated) |
//! | `[[http.tokens]]` | — | `BERTH_API_KEYS` (`TOKEN=ACTOR:ROLE,…`, added to the file's) |
//!
//! The rest (`max_model_calls`, `quick_repair`, `completion_judge`,
//! `[[budgets]]`, `[prices]`, `[openai]`, `[a2a]`, `[tools]`, the other
//! `[http]` bounds) are file-only.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use berth_acp::ServeOptions;
use berth_actors::{Principal, Role};
use berth_http::{ApiToken, HttpConfig, TlsFiles};
use berth_runtime::budget::{BudgetPolicy, Price};
use berth_runtime::model::openai::{OpenAiConfig, OpenAiModel};
use berth_runtime::model::{self, ModelProvider};
use berth_runtime::tools::environment::{self, ToolEnvironment};
use clap::Args;
use serde::Deserialize;

/// Flags of `berth serve`.
#[derive(Args, Debug, Default)]
pub struct ServeArgs {
    /// Data directory (created if missing) [default: ./berth-data].
    #[arg(long, env = "BERTH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Model: `scripted` (built-in demo script), `scripted:PATH` or `openai:MODEL`
    /// [default: scripted].
    #[arg(long, env = "BERTH_MODEL")]
    pub model: Option<String>,
    /// TOML config file (every option: deploy/berth.example.toml).
    #[arg(long, env = "BERTH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Longest accepted ACP frame in bytes (stdio line, WebSocket message)
    /// [default: 8388608].
    #[arg(long, env = "BERTH_MAX_FRAME_BYTES")]
    pub max_frame_bytes: Option<usize>,
    /// Concurrent requests per connection [default: 64].
    #[arg(long, env = "BERTH_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// A tool whose calls wait for the client's approval
    /// (`session/request_permission`); repeatable, e.g. `--require-approval shell`.
    #[arg(long = "require-approval", value_name = "TOOL")]
    pub require_approval: Vec<String>,
    /// Serve HTTP (ACP over WebSocket at /acp, /healthz, /readyz, /metrics,
    /// /v1/events, /v1/sessions) on this IP:PORT, or PORT for loopback
    /// [default: off; the file's `[http] listen`]. Needs at least one token
    /// (BERTH_API_KEYS or `[[http.tokens]]`).
    #[arg(long, env = "BERTH_LISTEN", value_name = "IP:PORT")]
    pub listen: Option<String>,
    /// Serve TLS with this PEM certificate chain (with --tls-key).
    #[arg(long, env = "BERTH_TLS_CERT", value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "BERTH_TLS_KEY", value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// A browser origin allowed to connect (`https://console.example.com`,
    /// or `*`); repeatable. Requests without an Origin header always pass.
    #[arg(
        long = "allowed-origin",
        env = "BERTH_ALLOWED_ORIGINS",
        value_delimiter = ',',
        value_name = "ORIGIN"
    )]
    pub allowed_origins: Vec<String>,
    /// Put `[a2a messageId: …]` in front of each A2A prompt the model reads
    /// (for the A2A TCK profile script).
    #[arg(long)]
    pub a2a_message_ids_in_prompt: bool,
    /// Serve A2A JSON-RPC without a token, as actor `a2a-anonymous` with this
    /// role (`observer` or `controller`) — for clients that cannot send one,
    /// such as the A2A TCK. Off by default; every other route keeps its
    /// tokens.
    #[arg(long, value_name = "ROLE")]
    pub a2a_anonymous_role: Option<String>,
    /// Where the working directories of contexts created over A2A go
    /// (`DIR/<contextId>`, created 0700; a relative DIR is taken from the
    /// current directory). Default: `<data dir>-a2a-contexts` beside the
    /// data dir (a session's directories never lie inside the data dir).
    #[arg(long, value_name = "DIR")]
    pub a2a_contexts_dir: Option<PathBuf>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct A2aSection {
    public_url: Option<String>,
    name: Option<String>,
    description: Option<String>,
    message_ids_in_prompt: Option<bool>,
    anonymous_role: Option<String>,
    contexts_dir: Option<PathBuf>,
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

/// `[tools]`: what tool processes get besides the allow-list
/// (`berth_runtime::tools::environment`).
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct ToolsSection {
    /// Variables set for every tool process (`NAME = "value"`).
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    /// Variables passed from berth's environment by name (left out when unset).
    #[serde(default)]
    pass_env: Vec<String>,
}

/// `[http]`: the network listener.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct HttpSection {
    listen: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    allowed_origins: Option<Vec<String>>,
    max_body_bytes: Option<usize>,
    max_connections: Option<usize>,
    max_requests_in_flight: Option<usize>,
    handshake_timeout_ms: Option<u64>,
    header_read_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    #[serde(default)]
    websocket: WebSocketSection,
    #[serde(default)]
    tokens: Vec<TokenEntry>,
}

/// `[http.websocket]`: ACP over WebSocket.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct WebSocketSection {
    max_connections: Option<usize>,
    ping_interval_ms: Option<u64>,
    max_outbound_bytes: Option<u64>,
    send_timeout_ms: Option<u64>,
}

/// `[[http.tokens]]`: one bearer token.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    actor: String,
    role: String,
    /// The secret itself (prefer `token_env`).
    token: Option<String>,
    /// The environment variable holding the secret.
    token_env: Option<String>,
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
    heap_pretouch_mib: Option<u32>,
    passivate_after_ms: Option<u64>,
    max_live_sessions: Option<usize>,
    realtime_timers: Option<bool>,
    completion_judge: Option<bool>,
    require_approval: Option<Vec<String>>,
    #[serde(default)]
    acp: AcpSection,
    #[serde(default)]
    a2a: A2aSection,
    #[serde(default)]
    openai: OpenAiSection,
    #[serde(default)]
    http: HttpSection,
    #[serde(default)]
    tools: ToolsSection,
    /// `[[budgets]]`: budget policies (limits for all sessions or a label).
    #[serde(default)]
    budgets: Vec<BudgetPolicy>,
    /// `[prices."MODEL NAME"]`: USD per million input/output tokens.
    #[serde(default)]
    prices: HashMap<String, Price>,
}

/// The HTTP listener's settings, resolved.
pub struct HttpSettings {
    /// The listener.
    pub config: HttpConfig,
    /// WebSocket connections at once.
    pub ws_max_connections: usize,
    /// Ping interval.
    pub ws_ping_interval: Duration,
    /// Outbound bound per WebSocket connection (bytes).
    pub ws_max_outbound_bytes: u64,
    /// Deadline of one WebSocket send.
    pub ws_send_timeout: Duration,
}

/// Everything `serve` needs, resolved.
pub struct Settings {
    pub data_dir: PathBuf,
    pub model: Arc<dyn ModelProvider>,
    pub max_model_calls: u32,
    pub quick_repair: bool,
    pub journal_cache_bytes: usize,
    /// Heap touched at start (MiB; `src/heap.rs`).
    pub heap_pretouch_mib: u32,
    pub passivate_after_ms: Option<u64>,
    pub max_live_sessions: usize,
    pub realtime_timers: bool,
    pub completion_judge: bool,
    pub require_approval: Vec<String>,
    pub acp: ServeOptions,
    /// The A2A adapter's options, when the HTTP listener serves it.
    pub a2a: Option<berth_a2a::A2aOptions>,
    /// The role of tokenless A2A callers (`None`: A2A needs a token).
    pub a2a_anonymous_role: Option<berth_actors::Role>,
    pub budgets: Vec<BudgetPolicy>,
    pub prices: HashMap<String, Price>,
    /// `None`: no network listener.
    pub http: Option<HttpSettings>,
    /// The environment of every tool process (`[tools]` over the allow-list).
    pub tool_env: ToolEnvironment,
}

/// One problem with a configuration: the key (dotted path as in the file,
/// or the flag / variable that set it) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "key `{}`: {}", self.key, self.message)
    }
}

fn problem(key: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem {
        key: key.into(),
        message: message.into(),
    }
}

/// Parses TOML text, naming the key (and line) of a type or unknown-key
/// error.
///
/// # Errors
/// The problem.
pub fn parse(text: &str) -> Result<FileConfig, Problem> {
    let de = toml::de::Deserializer::parse(text).map_err(|e| problem("(syntax)", e.to_string()))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let key = if path == "." {
            "(top level)".into()
        } else {
            path
        };
        problem(key, e.into_inner().to_string().trim_end())
    })
}

impl FileConfig {
    /// Reads and parses a config file.
    ///
    /// # Errors
    /// The file is unreadable or invalid (with the key and what is wrong).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        parse(&text).map_err(|p| anyhow::anyhow!("config {}: {p}", path.display()))
    }

    /// Checks what can be checked without starting anything: every problem
    /// found (not just the first). Secrets named by `token_env` are not
    /// required to be set (they are at `serve`).
    pub fn problems(&self) -> Vec<Problem> {
        self.problems_with(false)
    }

    /// [`FileConfig::problems`]; `listen_elsewhere`: the listener's address
    /// comes from a flag or `BERTH_LISTEN`, so `[http]` settings without
    /// `listen` are fine.
    fn problems_with(&self, listen_elsewhere: bool) -> Vec<Problem> {
        let mut out = Vec::new();
        if let Some(spec) = &self.model {
            if let Err(e) = check_model_spec(spec) {
                out.push(problem("model", e));
            }
        }
        if self.max_model_calls == Some(0) {
            out.push(problem("max_model_calls", "must be at least 1"));
        }
        if self
            .heap_pretouch_mib
            .is_some_and(|mib| mib > crate::heap::MAX_PRETOUCH_MIB)
        {
            out.push(problem(
                "heap_pretouch_mib",
                format!(
                    "must be at most {} (MiB; it stays resident)",
                    crate::heap::MAX_PRETOUCH_MIB
                ),
            ));
        }
        let mut priced: Vec<(&String, &Price)> = self.prices.iter().collect();
        priced.sort_by_key(|(name, _)| *name);
        for (name, price) in priced {
            for (key, usd) in [
                ("input_per_mtok_usd", price.input_per_mtok_usd),
                ("output_per_mtok_usd", price.output_per_mtok_usd),
            ] {
                if !(usd.is_finite() && usd >= 0.0) {
                    out.push(problem(
                        format!("prices.{name:?}.{key}"),
                        "must be a finite number of USD, 0 or more",
                    ));
                }
            }
        }
        for (i, budget) in self.budgets.iter().enumerate() {
            if budget
                .limits
                .max_cost_usd
                .is_some_and(|usd| !(usd.is_finite() && usd >= 0.0))
            {
                out.push(problem(
                    format!("budgets[{i}].max_cost_usd"),
                    "must be a finite number of USD, 0 or more",
                ));
            }
        }
        if self
            .data_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            out.push(problem(
                "data_dir",
                "is empty: name a directory (or leave it out for ./berth-data)",
            ));
        }
        for (key, value) in [
            ("acp.max_frame_bytes", self.acp.max_frame_bytes),
            ("acp.max_in_flight", self.acp.max_in_flight),
            ("http.max_body_bytes", self.http.max_body_bytes),
            ("http.max_connections", self.http.max_connections),
            (
                "http.max_requests_in_flight",
                self.http.max_requests_in_flight,
            ),
            (
                "http.websocket.max_connections",
                self.http.websocket.max_connections,
            ),
        ] {
            if value == Some(0) {
                out.push(problem(key, "must be at least 1"));
            }
        }
        for (key, value) in [
            ("http.handshake_timeout_ms", self.http.handshake_timeout_ms),
            (
                "http.header_read_timeout_ms",
                self.http.header_read_timeout_ms,
            ),
            ("http.idle_timeout_ms", self.http.idle_timeout_ms),
            (
                "http.websocket.ping_interval_ms",
                self.http.websocket.ping_interval_ms,
            ),
            (
                "http.websocket.max_outbound_bytes",
                self.http.websocket.max_outbound_bytes,
            ),
            (
                "http.websocket.send_timeout_ms",
                self.http.websocket.send_timeout_ms,
            ),
        ] {
            if value == Some(0) {
                out.push(problem(key, "must be at least 1"));
            }
        }
        if let Some(listen) = &self.http.listen {
            if let Err(e) = parse_listen(listen) {
                out.push(problem("http.listen", e));
            }
        }
        out.extend(check_tls(
            self.http.tls_cert.as_deref(),
            self.http.tls_key.as_deref(),
            "http.tls_cert",
            "http.tls_key",
        ));
        for (i, origin) in self.http.allowed_origins.iter().flatten().enumerate() {
            if let Err(e) = check_origin(origin) {
                out.push(problem(format!("http.allowed_origins[{i}]"), e));
            }
        }
        let mut actors = std::collections::HashSet::new();
        let mut secrets = std::collections::HashMap::new();
        for (i, entry) in self.http.tokens.iter().enumerate() {
            let key = |field: &str| format!("http.tokens[{i}].{field}");
            if let Err(e) = berth_actors::auth::validate_actor_id(&entry.actor) {
                out.push(problem(key("actor"), e));
            } else if !actors.insert(entry.actor.clone()) {
                out.push(problem(
                    key("actor"),
                    format!(
                        "{:?} has another token above; give each token its own actor id",
                        entry.actor
                    ),
                ));
            }
            if let Err(e) = Role::parse(&entry.role) {
                out.push(problem(key("role"), e));
            }
            match (&entry.token, &entry.token_env) {
                (Some(_), Some(_)) => out.push(problem(
                    key("token"),
                    "set either token or token_env, not both",
                )),
                (None, None) => out.push(problem(
                    key("token_env"),
                    "missing: name the environment variable holding the secret (or give token)",
                )),
                (Some(token), None) => {
                    if let Err(e) = berth_http::config::validate_token(token) {
                        out.push(problem(key("token"), e));
                    } else if let Some(first) = secrets.insert(token.as_str(), i) {
                        out.push(problem(
                            key("token"),
                            format!("repeats the secret of http.tokens[{first}]; each token must be unique (which actor would it be?)"),
                        ));
                    }
                }
                (None, Some(var)) => {
                    if var.is_empty() {
                        out.push(problem(
                            key("token_env"),
                            "must name an environment variable",
                        ));
                    }
                }
            }
        }
        // Tool processes never get a secret berth reads, nor one the config
        // names for a token or an API key.
        let secret_vars: Vec<&str> = self
            .http
            .tokens
            .iter()
            .filter_map(|t| t.token_env.as_deref())
            .chain(self.openai.api_key_env.as_deref())
            .collect();
        for (i, name) in self.tools.pass_env.iter().enumerate() {
            if let Err(e) = environment::check_name(name, &secret_vars) {
                out.push(problem(format!("tools.pass_env[{i}]"), e));
            }
        }
        for name in self.tools.env.keys() {
            if let Err(e) = environment::check_name(name, &secret_vars) {
                out.push(problem(format!("tools.env.{name}"), e));
            }
        }
        if self.http.listen.is_none()
            && !listen_elsewhere
            && (self.http.tls_cert.is_some() || !self.http.tokens.is_empty())
        {
            out.push(problem(
                "http.listen",
                "missing: [http] settings are given but the listener is off; set listen = \"127.0.0.1:8080\" (or pass --listen)",
            ));
        }
        out
    }

    /// Resolves flags (and their environment variables) over the file over
    /// defaults; `api_keys` is `BERTH_API_KEYS`.
    ///
    /// # Errors
    /// Every [`FileConfig::problems`] and flag problem, listed; a token
    /// secret that cannot be read; a model that cannot be built.
    pub fn merge(self, args: &ServeArgs, api_keys: Option<&str>) -> anyhow::Result<Settings> {
        let mut problems = self.problems_with(args.listen.is_some());
        let spec = args
            .model
            .clone()
            .or(self.model)
            .unwrap_or_else(|| "scripted".into());
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
        if args.max_frame_bytes == Some(0) {
            problems.push(problem("--max-frame-bytes", "must be at least 1"));
        }
        if args.max_in_flight == Some(0) {
            problems.push(problem("--max-in-flight", "must be at least 1"));
        }
        let tool_env = ToolEnvironment::new(
            self.tools.pass_env.iter().map(String::as_str),
            self.tools
                .env
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str())),
        );
        let http = resolve_http(self.http, args, api_keys, &mut problems);
        if !problems.is_empty() {
            let list: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
            anyhow::bail!("the configuration is invalid:\n{}", list.join("\n"));
        }
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
        let unpriced = unpriced_cost_budgets(&self.budgets, &self.prices, model.name());
        if !unpriced.is_empty() {
            let list: Vec<String> = unpriced.iter().map(|p| format!("  {p}")).collect();
            anyhow::bail!("the configuration is invalid:\n{}", list.join("\n"));
        }
        let data_dir = crate::absolute_data_dir(args.data_dir.clone().or(self.data_dir))?;
        let a2a_anonymous_role = match args
            .a2a_anonymous_role
            .clone()
            .or(self.a2a.anonymous_role.clone())
        {
            None => None,
            Some(role) => match role.as_str() {
                "observer" => Some(berth_actors::Role::Observer),
                "controller" => Some(berth_actors::Role::Controller),
                _ => anyhow::bail!(
                    "key `a2a.anonymous_role` / --a2a-anonymous-role: must be observer or controller, not {role:?}"
                ),
            },
        };
        // A2A is served on the HTTP listener, behind its bearer tokens.
        let contexts_dir = args
            .a2a_contexts_dir
            .clone()
            .or(self.a2a.contexts_dir)
            .unwrap_or_else(|| default_a2a_contexts_dir(&data_dir));
        // Absolute: a session's cwd must be, whatever the data dir is.
        let contexts_dir = std::path::absolute(&contexts_dir).with_context(|| {
            format!(
                "key `a2a.contexts_dir` / --a2a-contexts-dir: cannot make {} absolute",
                contexts_dir.display()
            )
        })?;
        let a2a = http.is_some().then(|| {
            let mut options = berth_a2a::A2aOptions::new(contexts_dir);
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
            options
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
            heap_pretouch_mib: self
                .heap_pretouch_mib
                .unwrap_or(crate::heap::DEFAULT_PRETOUCH_MIB),
            passivate_after_ms: self.passivate_after_ms,
            max_live_sessions: self
                .max_live_sessions
                .unwrap_or(berth_actors::config::DEFAULT_MAX_LIVE_SESSIONS),
            realtime_timers: self.realtime_timers.unwrap_or(true),
            completion_judge: self.completion_judge.unwrap_or(false),
            require_approval: if args.require_approval.is_empty() {
                self.require_approval.unwrap_or_default()
            } else {
                args.require_approval.clone()
            },
            acp,
            a2a,
            a2a_anonymous_role,
            budgets: self.budgets,
            prices: self.prices,
            http,
            tool_env,
        })
    }
}

/// `<data dir>-a2a-contexts`, beside the data dir: the default root of the
/// working directories of contexts created over A2A.
fn default_a2a_contexts_dir(data_dir: &Path) -> PathBuf {
    let mut name = data_dir
        .file_name()
        .map(std::ffi::OsStr::to_os_string)
        .unwrap_or_else(|| "berth-data".into());
    name.push("-a2a-contexts");
    match data_dir.file_name() {
        Some(_) => data_dir.with_file_name(name),
        // `/`, `..` or empty: beside is not defined; use the current dir.
        None => PathBuf::from(name),
    }
}

/// `[http]` + flags + `BERTH_API_KEYS` → the listener's settings (`None`
/// when no address is given); problems are pushed to `problems`.
fn resolve_http(
    section: HttpSection,
    args: &ServeArgs,
    api_keys: Option<&str>,
    problems: &mut Vec<Problem>,
) -> Option<HttpSettings> {
    let (listen_key, listen) = match (&args.listen, &section.listen) {
        (Some(flag), _) => ("--listen / BERTH_LISTEN", flag.clone()),
        (None, Some(file)) => ("http.listen", file.clone()),
        (None, None) => return None,
    };
    let listen = match parse_listen(&listen) {
        Ok(addr) => addr,
        Err(e) => {
            problems.push(problem(listen_key, e));
            return None;
        }
    };
    let mut config = HttpConfig::new(listen);
    let (cert, key) = match (&args.tls_cert, &args.tls_key) {
        (None, None) => (section.tls_cert.clone(), section.tls_key.clone()),
        (cert, key) => {
            problems.extend(check_tls(
                cert.as_deref(),
                key.as_deref(),
                "--tls-cert / BERTH_TLS_CERT",
                "--tls-key / BERTH_TLS_KEY",
            ));
            (cert.clone(), key.clone())
        }
    };
    if let (Some(cert), Some(key)) = (cert, key) {
        config.tls = Some(TlsFiles { cert, key });
    }
    config.allowed_origins = if args.allowed_origins.is_empty() {
        section.allowed_origins.unwrap_or_default()
    } else {
        for origin in &args.allowed_origins {
            if let Err(e) = check_origin(origin) {
                problems.push(problem("--allowed-origin / BERTH_ALLOWED_ORIGINS", e));
            }
        }
        args.allowed_origins.clone()
    };
    let d = HttpConfig::new(listen);
    config.max_body_bytes = section.max_body_bytes.unwrap_or(d.max_body_bytes);
    config.max_connections = section.max_connections.unwrap_or(d.max_connections);
    config.max_requests_in_flight = section
        .max_requests_in_flight
        .unwrap_or(d.max_requests_in_flight);
    config.handshake_timeout = section
        .handshake_timeout_ms
        .map_or(d.handshake_timeout, Duration::from_millis);
    config.header_read_timeout = section
        .header_read_timeout_ms
        .map_or(d.header_read_timeout, Duration::from_millis);
    config.idle_timeout = section
        .idle_timeout_ms
        .map_or(d.idle_timeout, Duration::from_millis);
    for (i, entry) in section.tokens.iter().enumerate() {
        let Ok(role) = Role::parse(&entry.role) else {
            continue; // reported by problems()
        };
        let secret = match (&entry.token, &entry.token_env) {
            (Some(token), None) => token.clone(),
            (None, Some(var)) if !var.is_empty() => match std::env::var(var) {
                Ok(secret) => match berth_http::config::validate_token(&secret) {
                    Ok(()) => secret,
                    Err(e) => {
                        problems.push(problem(
                            format!("http.tokens[{i}].token_env"),
                            format!("the token in ${var} {e}"),
                        ));
                        continue;
                    }
                },
                Err(_) => {
                    problems.push(problem(
                        format!("http.tokens[{i}].token_env"),
                        format!("environment variable {var} is not set"),
                    ));
                    continue;
                }
            },
            _ => continue, // reported by problems()
        };
        config.tokens.push(ApiToken {
            token: secret,
            principal: Principal::new(entry.actor.clone(), role),
        });
    }
    match api_keys.map(berth_http::parse_api_keys) {
        Some(Ok(keys)) => config.tokens.extend(keys),
        Some(Err(e)) => problems.push(problem("BERTH_API_KEYS", e)),
        None => {}
    }
    if config.tokens.is_empty() {
        problems.push(problem(
            "http.tokens",
            "the HTTP listener is on but has no tokens: add [[http.tokens]] or set BERTH_API_KEYS",
        ));
    }
    let ws = section.websocket;
    let ws_defaults = berth_acp::transport::websocket::WsOptions::default();
    Some(HttpSettings {
        config,
        ws_max_connections: ws.max_connections.unwrap_or(ws_defaults.max_connections),
        ws_ping_interval: ws
            .ping_interval_ms
            .map_or(ws_defaults.ping_interval, Duration::from_millis),
        ws_max_outbound_bytes: ws
            .max_outbound_bytes
            .unwrap_or(ws_defaults.max_outbound_bytes),
        ws_send_timeout: ws
            .send_timeout_ms
            .map_or(ws_defaults.send_timeout, Duration::from_millis),
    })
}

/// `IP:PORT` (`127.0.0.1:8080`, `[::1]:8080`, `0.0.0.0:443`), or a bare
/// `PORT`, which means loopback (`127.0.0.1:PORT`).
fn parse_listen(value: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = value.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    value.parse().map_err(|_| {
        format!("{value:?} is not IP:PORT or PORT (e.g. \"127.0.0.1:8080\", \"[::1]:8080\" or \"8080\" for loopback; host names are not resolved)")
    })
}

/// Both TLS files or neither, and each readable.
fn check_tls(
    cert: Option<&Path>,
    key: Option<&Path>,
    cert_key: &str,
    key_key: &str,
) -> Vec<Problem> {
    let mut out = Vec::new();
    match (cert, key) {
        (Some(_), None) => out.push(problem(key_key, "missing: tls_cert needs its tls_key")),
        (None, Some(_)) => out.push(problem(cert_key, "missing: tls_key needs its tls_cert")),
        _ => {}
    }
    for (k, path) in [(cert_key, cert), (key_key, key)] {
        if let Some(path) = path {
            if let Err(e) = std::fs::metadata(path) {
                out.push(problem(k, format!("cannot read {}: {e}", path.display())));
            }
        }
    }
    out
}

/// `*` or `scheme://host[:port]` without a path.
fn check_origin(origin: &str) -> Result<(), String> {
    if origin == "*" {
        return Ok(());
    }
    let Some((scheme, rest)) = origin.split_once("://") else {
        return Err(format!(
            "{origin:?} is not an origin: expected scheme://host[:port] or \"*\""
        ));
    };
    if !["http", "https"].contains(&scheme) || rest.is_empty() || rest.contains('/') {
        return Err(format!(
            "{origin:?} is not an origin: expected http(s)://host[:port] with no path or trailing slash"
        ));
    }
    Ok(())
}

/// A model spec's shape (and a `scripted:PATH` script's contents).
fn check_model_spec(spec: &str) -> Result<(), String> {
    match spec.split_once(':') {
        Some(("openai", name)) if !name.is_empty() => Ok(()),
        Some(("scripted", _)) | None if spec.starts_with("scripted") => model::from_spec(spec)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        _ => Err(format!(
            "unknown model spec {spec:?}: use `scripted`, `scripted:PATH` or `openai:MODEL`"
        )),
    }
}

/// The `max_cost_usd` limits that could never fire: cost is counted from
/// `[prices."MODEL NAME"]`, and the model in use (`model_name`, as
/// `ModelProvider::name` gives it) has no price, so its sessions' cost stays
/// 0 µUSD. One problem per such `[[budgets]]` entry, at its key.
fn unpriced_cost_budgets(
    budgets: &[BudgetPolicy],
    prices: &HashMap<String, Price>,
    model_name: &str,
) -> Vec<Problem> {
    if prices.contains_key(model_name) {
        return Vec::new();
    }
    budgets
        .iter()
        .enumerate()
        .filter(|(_, b)| b.limits.max_cost_usd.is_some())
        .map(|(i, _)| {
            problem(
                format!("budgets[{i}].max_cost_usd"),
                format!(
                    "the model in use, {model_name:?}, has no [prices.{model_name:?}] entry, \
                     so cost is never counted and this limit could never fire"
                ),
            )
        })
        .collect()
}

/// `berth config check FILE`: every problem of the file, or a one-line
/// summary of what it configures.
///
/// # Errors
/// The file cannot be read.
pub fn check_file(path: &Path) -> anyhow::Result<Result<String, Vec<Problem>>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    let config = match parse(&text) {
        Ok(c) => c,
        Err(p) => return Ok(Err(vec![p])),
    };
    let mut problems = config.problems();
    // The model's name keys its price: `openai:MODEL` is its own name; a
    // scripted model's is in its script (an unreadable script is a problem
    // already).
    // As `serve` picks it: BERTH_MODEL over the file (a `--model` flag is
    // `serve`'s own).
    let from_env = std::env::var("BERTH_MODEL").ok().filter(|m| !m.is_empty());
    let spec = from_env
        .as_deref()
        .or(config.model.as_deref())
        .unwrap_or("scripted");
    let name = match spec.strip_prefix("openai:") {
        Some(_) => Some(spec.to_owned()),
        None => model::from_spec(spec).ok().map(|m| m.name().to_owned()),
    };
    if let Some(name) = name {
        problems.extend(unpriced_cost_budgets(
            &config.budgets,
            &config.prices,
            &name,
        ));
    }
    if !problems.is_empty() {
        return Ok(Err(problems));
    }
    let http = match &config.http.listen {
        Some(addr) => format!(
            "HTTP listener on {addr}{} with {} token(s) in the file",
            if config.http.tls_cert.is_some() {
                " (TLS)"
            } else {
                ""
            },
            config.http.tokens.len()
        ),
        None => "no HTTP listener".into(),
    };
    Ok(Ok(format!(
        "ok: model {}, {http}, {} budget polic(ies)",
        config.model.as_deref().unwrap_or("scripted"),
        config.budgets.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<Problem> {
        match parse(text) {
            Ok(c) => c.problems(),
            Err(p) => vec![p],
        }
    }

    /// The heap pre-touch is bounded (it stays resident), and 0 turns it off.
    #[test]
    fn heap_pretouch_is_bounded() {
        let p = problems("heap_pretouch_mib = 100000\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].key, "heap_pretouch_mib", "{p:?}");
        assert!(problems("heap_pretouch_mib = 0\n").is_empty());
        assert!(problems("heap_pretouch_mib = 16384\n").is_empty());
    }

    /// A budget's bad value is reported at its key, and a cost limit the
    /// model in use has no price for is a problem (it could never fire).
    #[test]
    fn budget_problems_are_located_at_their_keys() {
        let p = problems("[[budgets]]\nlabel = \"x\"\nmax_tokens = -1\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].key, "budgets[0].max_tokens", "{p:?}");
        let p = problems("[[budgets]]\nmax_tokenz = 5\n");
        assert!(p[0].message.contains("max_tokenz"), "{p:?}");
        let p = problems("[[budgets]]\nmax_cost_usd = -0.5\n");
        assert_eq!(p[0].key, "budgets[0].max_cost_usd", "{p:?}");
        let p = problems("[prices.m]\ninput_per_mtok_usd = -1.0\noutput_per_mtok_usd = nan\n");
        let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "prices.\"m\".input_per_mtok_usd",
                "prices.\"m\".output_per_mtok_usd"
            ]
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("b.toml");
        let check = |text: &str| {
            std::fs::write(&file, text).expect("write the config");
            check_file(&file).expect("readable")
        };
        let unpriced = check("[[budgets]]\nmax_tokens = 10\n[[budgets]]\nmax_cost_usd = 1.5\n")
            .expect_err("an unpriced cost limit is a problem");
        assert_eq!(unpriced.len(), 1, "{unpriced:?}");
        assert_eq!(unpriced[0].key, "budgets[1].max_cost_usd");
        assert!(
            unpriced[0].message.contains("[prices."),
            "{}",
            unpriced[0].message
        );
        let name = model::from_spec("scripted")
            .expect("demo")
            .name()
            .to_owned();
        check(&format!(
            "[[budgets]]\nmax_cost_usd = 1.5\n[prices.{name:?}]\n\
             input_per_mtok_usd = 1.0\noutput_per_mtok_usd = 2.0\n"
        ))
        .expect("priced");
        // `openai:MODEL` is its own name; nothing is contacted to check it.
        check(
            "model = \"openai:gpt-x\"\n[[budgets]]\nmax_cost_usd = 1.5\n\
             [prices.\"openai:gpt-x\"]\ninput_per_mtok_usd = 1.0\noutput_per_mtok_usd = 2.0\n",
        )
        .expect("priced");
    }

    /// What `serve` would refuse, `config check` reports: an empty data dir
    /// and two tokens with one secret.
    #[test]
    fn a2a_contexts_go_beside_the_data_dir() {
        for (data, contexts) in [
            ("berth-data", "berth-data-a2a-contexts"),
            ("./berth-data/", "./berth-data-a2a-contexts"),
            ("/var/lib/berth", "/var/lib/berth-a2a-contexts"),
            ("/", "berth-data-a2a-contexts"),
        ] {
            assert_eq!(
                default_a2a_contexts_dir(Path::new(data)),
                PathBuf::from(contexts),
                "{data}"
            );
        }
    }

    #[test]
    fn an_empty_data_dir_and_a_repeated_secret_are_problems() {
        let p = problems(
            "data_dir = \"\"\n[http]\nlisten = \"127.0.0.1:1\"\n\
             [[http.tokens]]\nactor = \"a\"\nrole = \"observer\"\ntoken = \"0123456789abcdef0\"\n\
             [[http.tokens]]\nactor = \"b\"\nrole = \"observer\"\ntoken = \"0123456789abcdef0\"\n",
        );
        let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["data_dir", "http.tokens[1].token"], "{p:?}");
        assert!(p[1].message.contains("http.tokens[0]"), "{}", p[1].message);
    }

    #[test]
    fn unknown_keys_and_bad_types_name_the_key() {
        let p = problems("[http]\nlisten = \"127.0.0.1:8080\"\nlisen = 1\n");
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].key, "http.lisen");
        assert!(p[0].message.contains("unknown field"), "{}", p[0].message);
        let p = problems("[http]\nmax_connections = \"many\"\n");
        assert_eq!(p[0].key, "http.max_connections");
        assert!(p[0].message.contains("line 2"), "{}", p[0].message);
        let p = problems(
            "[[http.tokens]]\nactor = \"a\"\nrole = \"x\"\ntoken_env = \"T\"\nextra = 1\n",
        );
        assert_eq!(p[0].key, "http.tokens[0].extra");
    }

    #[test]
    fn semantic_problems_are_all_listed() {
        let p = problems(
            r#"
model = "gpt"
[acp]
max_in_flight = 0
[http]
listen = "localhost:8080"
tls_cert = "/nonexistent/cert.pem"
allowed_origins = ["https://ok.example", "ok.example/"]
[[http.tokens]]
actor = "alice"
role = "admin"
token = "short"
[[http.tokens]]
actor = "alice"
role = "observer"
"#,
        );
        let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
        for key in [
            "model",
            "acp.max_in_flight",
            "http.listen",
            "http.tls_key",
            "http.tls_cert",
            "http.allowed_origins[1]",
            "http.tokens[0].role",
            "http.tokens[0].token",
            "http.tokens[1].actor",
            "http.tokens[1].token_env",
        ] {
            assert!(keys.contains(&key), "{key} missing from {p:?}");
        }
        assert!(problems(
            "[http]\n[[http.tokens]]\nactor = \"a\"\nrole = \"observer\"\ntoken_env = \"X\"\n"
        )
        .iter()
        .any(|p| p.key == "http.listen" && p.message.contains("listener is off")));
    }

    #[test]
    fn flags_and_env_win_over_the_file() {
        let file = parse(
            r#"
[http]
listen = "127.0.0.1:1"
allowed_origins = ["https://file.example"]
[[http.tokens]]
actor = "file-actor"
role = "observer"
token = "file-token-0123456789"
"#,
        )
        .unwrap();
        let args = ServeArgs {
            listen: Some("127.0.0.1:0".into()),
            allowed_origins: vec!["https://flag.example".into()],
            ..ServeArgs::default()
        };
        let settings = file
            .merge(&args, Some("env-token-0123456789=env-actor:controller"))
            .unwrap();
        let http = settings.http.unwrap();
        assert_eq!(http.config.listen.port(), 0);
        assert_eq!(parse_listen("8080"), Ok("127.0.0.1:8080".parse().unwrap()));
        assert!(parse_listen("localhost:8080").is_err());
        assert_eq!(http.config.allowed_origins, vec!["https://flag.example"]);
        let actors: Vec<&str> = http
            .config
            .tokens
            .iter()
            .map(|t| t.principal.actor.as_str())
            .collect();
        assert_eq!(actors, vec!["file-actor", "env-actor"]);
        // No tokens at all: refused with the remedy.
        let err = parse("[http]\nlisten = \"127.0.0.1:0\"\n")
            .unwrap()
            .merge(&ServeArgs::default(), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("http.tokens") && err.contains("BERTH_API_KEYS"),
            "{err}"
        );
        // Off unless configured.
        assert!(parse("")
            .unwrap()
            .merge(&ServeArgs::default(), None)
            .unwrap()
            .http
            .is_none());
    }
}
