//! Tools behind one trait.
//!
//! A [`Tool`] takes JSON arguments and returns a [`ToolOutput`] or a typed
//! [`ToolError`]; it never panics on model input. Built-ins: [`shell::Shell`],
//! [`files::ReadFile`], [`files::WriteFile`]. A [`ToolSet`] is what a session
//! offers its model.

pub mod files;
pub mod processes;
pub mod shell;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

pub use processes::{ProcessGroups, ProcessLedger};

use crate::event::ToolKind;
use crate::model::ToolSpec;

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

/// Typed tool failures; the model reads them as error results.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
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
    /// A symlink whose target does not exist (it could point anywhere).
    #[error("path `{path}` is a symlink that does not resolve")]
    DanglingSymlink {
        /// The path given.
        path: String,
    },
    /// Not a regular file (a directory, FIFO, device, socket…).
    #[error("path `{path}` is not a regular file")]
    NotAFile {
        /// The path given.
        path: String,
    },
    /// A file larger than the read bound.
    #[error("file `{path}` is {size} bytes, over the {limit}-byte read limit")]
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
}

/// The tools a session offers, by name.
#[derive(Debug, Clone, Default)]
pub struct ToolSet {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl ToolSet {
    /// `shell`, `read_file` and `write_file` with their default bounds.
    pub fn builtin() -> Self {
        let mut set = Self::default();
        set.insert(Arc::new(shell::Shell::default()));
        set.insert(Arc::new(files::ReadFile::default()));
        set.insert(Arc::new(files::WriteFile));
        set
    }

    /// Adds (or replaces) a tool under its spec name.
    pub fn insert(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.spec().name, tool);
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Specs of all tools, sorted by name.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|t| t.spec()).collect()
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
