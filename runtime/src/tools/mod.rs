//! Tools behind one trait.
//!
//! A [`Tool`] takes JSON arguments and returns a [`ToolOutput`] or a typed
//! [`ToolError`]; it never panics on model input. Built-ins: [`shell::Shell`],
//! [`files::ReadFile`], [`files::WriteFile`], [`wait_for_file::WaitForFile`]
//! (a long wait that suspends with its own continuation) and
//! [`await_resumption::AwaitResumption`] (the agent parks its session). A
//! [`ToolSet`] is what a session offers its model.

pub mod await_resumption;
pub mod beneath;
pub mod direct_reply;
pub mod environment;
pub mod files;
pub mod processes;
pub mod publish_artifact;
pub mod shell;
pub mod supervisor;
pub mod wait_for_file;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use environment::ToolEnvironment;
pub use processes::{ProcessGroups, ProcessLedger};

use crate::event::ToolKind;
use crate::model::{ToolSpec, ToolSpecs};
use crate::suspension::{ResumeCause, ResumeConditions};

/// What a tool call may touch.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The session's working directory (absolute); the shell runs here.
    pub cwd: PathBuf,
    /// Directories file tools may use besides `cwd` (absolute).
    pub additional_directories: Vec<PathBuf>,
    /// The session's process groups; cancel kills them all.
    pub processes: Arc<ProcessGroups>,
    /// The tool call being run (its process groups are registered under it so
    /// `session/cancel_tool_call` can kill just them).
    pub call_id: Option<String>,
    /// Fires when the session is asked to suspend (`session/suspend` in mode
    /// `finish_step` or `interrupt_immediate`). A cooperative long-running tool
    /// watches it and returns [`ToolExit::Suspended`] instead of blocking the
    /// suspension; an ordinary tool ignores it and settles.
    pub suspend: CancellationToken,
}

impl ToolContext {
    /// A context for `cwd` alone, with fresh process groups and no call id.
    pub fn new(cwd: PathBuf) -> Self {
        Self {
            cwd,
            additional_directories: Vec::new(),
            processes: Arc::new(ProcessGroups::default()),
            call_id: None,
            suspend: CancellationToken::new(),
        }
    }
}

/// How a call that may suspend came out (`seeds/execution-suspension.md`:
/// `ToolExecutionSuspended` is neither a result nor a failure).
#[derive(Debug, Clone, PartialEq)]
pub enum ToolExit {
    /// The call finished with a result.
    Done(ToolOutput),
    /// The call parked itself; the engine suspends the turn and, on resume,
    /// calls [`Tool::resume_execution`] with the continuation — it never
    /// re-dispatches the call.
    Suspended(Box<ToolSuspension>),
}

impl From<ToolOutput> for ToolExit {
    fn from(output: ToolOutput) -> Self {
        Self::Done(output)
    }
}

/// A tool's parked state.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSuspension {
    /// What the tool needs to pick up where it stopped.
    pub continuation: ToolContinuation,
    /// Set when the call asks to park the whole session (the agent's
    /// `await_resumption`); `None` when the tool only yielded to a
    /// suspension someone else asked for.
    pub park: Option<AgentPark>,
}

/// A tool's own versioned continuation, stored in the frame
/// (e.g. `{"tool": "wait_for_file", "version": 1, "state": {"path": …}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolContinuation {
    /// The tool that owns it (its completion owner).
    pub tool: String,
    /// The tool's continuation format version.
    pub version: u32,
    /// Tool-private state.
    pub state: Value,
}

/// An agent-initiated self-park (RFC `session/await_resumption`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentPark {
    /// Why the agent parks.
    pub reason: String,
    /// What should wake it (empty: only an explicit resume).
    #[serde(default)]
    pub conditions: ResumeConditions,
    /// A digest to show while parked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// What a resume hands to the waitpoint (RFC `SessionResumeRequest.input`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResumeInput {
    /// The value fed back, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// Why the session woke.
    pub cause: ResumeCause,
}

/// A tool's successful result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolOutput {
    /// Text the model reads.
    pub content: String,
    /// Structured result (ACP `rawOutput`).
    pub raw: Value,
    /// Files the call changed, for turn checkpoints (`session/rollback`);
    /// not sent to clients.
    #[serde(skip)]
    pub file_changes: Vec<FileChange>,
}

/// A file a tool changed: its text before and after (`None`: absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FileChange {
    /// The real (canonical) path.
    pub path: PathBuf,
    /// Content before the turn touched it.
    pub before: Option<String>,
    /// Content after.
    pub after: Option<String>,
}

/// Typed tool failures; the model reads them as error results. Journaled
/// on the replay tape as they serialize here (`{"error": "unknown_tool", …}`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum ToolError {
    /// The model called a tool this session does not have.
    #[error("unknown tool `{name}`")]
    UnknownTool {
        /// The name it used.
        name: String,
    },
    /// Arguments missing or of the wrong type.
    #[error("invalid arguments: {message}")]
    InvalidArguments {
        /// What was wrong.
        message: String,
    },
    /// A path that is not absolute.
    #[error("path `{path}` is not absolute")]
    RelativePath {
        /// The path given.
        path: String,
    },
    /// A path outside the session's cwd and additional directories.
    #[error("path `{path}` is outside the session's directories")]
    OutsideRoots {
        /// The path given.
        path: String,
    },
    /// A session root is no longer the directory it was when the session
    /// first used it (renamed away, replaced by another directory or by a
    /// symlink); nothing was read or written.
    #[error("the root {root} changed since the session started")]
    RootChanged {
        /// The root as the session names it.
        root: String,
    },
    /// A symlink whose target does not exist (it could point anywhere). The
    /// built-in file tools report every symlink as [`ToolError::Symlink`];
    /// this shape stays so tool results journaled with it still decode.
    #[error("path `{path}` is a symlink that does not resolve")]
    DanglingSymlink {
        /// The path given.
        path: String,
    },
    /// A symlink at some component of the path (the file tools follow
    /// none: a link could be swapped to point anywhere between a check and
    /// the open).
    #[error("path `{path}` goes through a symlink; the file tools follow none")]
    Symlink {
        /// The path given.
        path: String,
    },
    /// A regular file with more than one hard link: another name of it may
    /// lie outside the session's directories, so `write_file` does not
    /// replace it.
    #[error("file `{path}` has {links} hard links; write_file replaces only a file with one")]
    HardLink {
        /// The path given.
        path: String,
        /// Its link count.
        links: u64,
    },
    /// Not a regular file (a directory, FIFO, device, socket…).
    #[error("path `{path}` is not a regular file")]
    NotAFile {
        /// The path given.
        path: String,
    },
    /// A file larger than the read bound.
    #[error("file `{path}` is {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size (bytes).
        size: u64,
        /// The bound (bytes).
        limit: u64,
    },
    /// An I/O error.
    #[error("{op} `{path}` failed: {message}")]
    Io {
        /// What was attempted (`read`, `write`, `spawn`).
        op: String,
        /// The path or command.
        path: String,
        /// The OS error.
        message: String,
    },
    /// A continuation this tool cannot resume (unknown version or a tool
    /// that never suspends); the call's outcome is unknown and not retried.
    #[error("cannot resume a `{tool}` continuation: {message}")]
    NotResumable {
        /// The tool.
        tool: String,
        /// Why.
        message: String,
    },
    /// The call ran past its timeout and was killed.
    #[error("timed out after {timeout_ms} ms")]
    Timeout {
        /// The timeout (ms).
        timeout_ms: u64,
    },
}

impl ToolError {
    /// Shorthand for [`ToolError::InvalidArguments`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidArguments {
            message: message.into(),
        }
    }
}

/// A tool.
#[async_trait]
pub trait Tool: Send + Sync + std::fmt::Debug {
    /// Name, description and argument schema offered to the model.
    fn spec(&self) -> ToolSpec;

    /// ACP presentation kind.
    fn kind(&self) -> ToolKind;

    /// A one-line title for a call with these arguments, e.g. `shell: ls -la`.
    fn title(&self, arguments: &Value) -> String;

    /// Runs the call. Dropping the future abandons it (the engine does so on
    /// cancel, after killing the session's process groups).
    ///
    /// # Errors
    /// A typed [`ToolError`]; never panics on bad arguments.
    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<ToolOutput, ToolError>;

    /// Runs the call allowing it to suspend. The engine calls this; an
    /// ordinary tool keeps the default, which runs [`Tool::call`] to the end.
    ///
    /// # Errors
    /// As [`Tool::call`].
    async fn execute(&self, ctx: &ToolContext, arguments: Value) -> Result<ToolExit, ToolError> {
        self.call(ctx, arguments).await.map(ToolExit::Done)
    }

    /// Continues a call this tool suspended, from its `continuation`
    /// (`seeds/execution-suspension.md`: the engine calls the original
    /// completion owner instead of `execute(arguments)`; there is no
    /// re-dispatch fallback). It may suspend again.
    ///
    /// # Errors
    /// [`ToolError::NotResumable`] by default and for a continuation version
    /// the tool does not know; the call's outcome is then unknown.
    async fn resume_execution(
        &self,
        ctx: &ToolContext,
        continuation: &ToolContinuation,
        resume: &ResumeInput,
    ) -> Result<ToolExit, ToolError> {
        let _ = (ctx, resume);
        Err(ToolError::NotResumable {
            tool: continuation.tool.clone(),
            message: "this tool never suspends".into(),
        })
    }

    /// Whether calls of this tool may run at the same time as their
    /// neighbours in a batch. Default `false`: the engine dispatches a batch
    /// in order, running consecutive concurrency-safe calls together and every
    /// other call alone, so a call that mutates state never races a sibling
    /// and a suspension can stop between calls (keeping the rest unstarted).
    fn concurrency_safe(&self) -> bool {
        false
    }
}

/// The tools a session offers, by name.
#[derive(Debug, Clone, Default)]
pub struct ToolSet {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    /// [`ToolSet::specs`] and their compact JSON, built on first use and
    /// shared by every clone (each turn works on a clone of the node's set):
    /// every turn fingerprints its configuration and every model call
    /// carries the specs, and building and encoding the schemas each time
    /// was about 5-8 % of berth's CPU in the wake-up bench.
    specs: Arc<std::sync::OnceLock<ToolSpecs>>,
}

impl ToolSet {
    /// `shell`, `read_file`, `write_file`, `wait_for_file`,
    /// `await_resumption`, `publish_artifact` and `direct_reply` with their
    /// default bounds; tool processes get the allow-listed environment alone
    /// ([`ToolEnvironment::allowed`]).
    pub fn builtin() -> Self {
        Self::builtin_with(Arc::new(ToolEnvironment::allowed()))
    }

    /// [`ToolSet::builtin`] whose tool processes get exactly `env`.
    pub fn builtin_with(env: Arc<ToolEnvironment>) -> Self {
        let mut set = Self::default();
        set.insert(Arc::new(shell::Shell {
            env,
            ..shell::Shell::default()
        }));
        set.insert(Arc::new(files::ReadFile::default()));
        set.insert(Arc::new(files::WriteFile));
        set.insert(Arc::new(wait_for_file::WaitForFile::default()));
        set.insert(Arc::new(await_resumption::AwaitResumption));
        set.insert(Arc::new(publish_artifact::PublishArtifact));
        set.insert(Arc::new(direct_reply::DirectReply));
        set
    }

    /// Adds (or replaces) a tool under its spec name.
    pub fn insert(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.spec().name, tool);
        self.specs = Arc::default();
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Specs of all tools, sorted by name.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|t| t.spec()).collect()
    }

    /// [`ToolSet::specs`], built and encoded once per set and shared by its
    /// clones (also those made before the first call): what each model
    /// request carries.
    pub fn shared_specs(&self) -> &ToolSpecs {
        self.specs.get_or_init(|| ToolSpecs::new(self.specs()))
    }

    /// [`ToolSet::specs`] encoded as compact JSON (`serde_json::to_vec`),
    /// computed once per set (see [`ToolSet::shared_specs`]).
    pub fn specs_json(&self) -> &[u8] {
        self.shared_specs().json()
    }

    /// The tool names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// The same set with every tool replaced by `wrap(tool)` under the same
    /// name (the replay tape's recorders, `berth replay`'s stand-ins).
    /// `wrap` must keep each tool's spec (the wrappers delegate `spec()`):
    /// the encoded specs carry over rather than being built again.
    pub fn wrapped(&self, wrap: impl Fn(&Arc<dyn Tool>) -> Arc<dyn Tool>) -> Self {
        Self {
            tools: self
                .tools
                .iter()
                .map(|(name, tool)| (name.clone(), wrap(tool)))
                .collect(),
            specs: Arc::clone(&self.specs),
        }
    }
}

/// Reads a required string argument.
pub(crate) fn str_arg<'a>(args: &'a Value, key: &str) -> Result<&'a str, ToolError> {
    args.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::invalid(format!("`{key}` must be a string")))
}

/// Reads an optional non-negative integer argument.
pub(crate) fn opt_u64_arg(args: &Value, key: &str) -> Result<Option<u64>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| ToolError::invalid(format!("`{key}` must be a non-negative integer"))),
    }
}
