//! `wait_for_file {path, exists?, timeout_ms?}`: waits until a file appears
//! (or, with `exists: false`, disappears) — the built-in long-running tool
//! that suspends with its own continuation (`seeds/execution-suspension.md`,
//! "A cooperating long-lived tool can raise ToolExecutionSuspended").
//!
//! While it waits, a suspension request makes it return
//! [`ToolExit::Suspended`] with `{"path", "exists", "deadline_ms"}`; on resume
//! [`Tool::resume_execution`] keeps waiting for the same file until the same
//! wall-clock deadline. The call is never re-dispatched.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::beneath::Beneath;
use super::files::confine;
use super::{
    opt_u64_arg, str_arg, ResumeInput, Tool, ToolContext, ToolContinuation, ToolError, ToolExit,
    ToolOutput, ToolSuspension,
};
use crate::event::ToolKind;
use crate::model::ToolSpec;

/// The tool's name.
pub const NAME: &str = "wait_for_file";
/// Continuation format written by this build.
const CONTINUATION_VERSION: u32 = 1;

/// The built-in file waiter.
#[derive(Debug, Clone)]
pub struct WaitForFile {
    /// How often the path is checked.
    pub poll: Duration,
    /// Longest wait a call may ask for (ms; default 7 days).
    pub max_timeout_ms: u64,
}

impl Default for WaitForFile {
    fn default() -> Self {
        Self {
            poll: Duration::from_millis(50),
            max_timeout_ms: 7 * 24 * 3600 * 1000,
        }
    }
}

/// What the wait is for; also the continuation's `state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Wait {
    /// The confined, absolute path.
    path: PathBuf,
    /// Wait for it to exist (`true`) or to be gone (`false`).
    exists: bool,
    /// Wall-clock deadline (ms since the Unix epoch).
    deadline_ms: u64,
    /// The timeout the call asked for (ms), for the error message.
    timeout_ms: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl WaitForFile {
    /// Polls until the wait is satisfied, its deadline passes, or a suspension
    /// is requested.
    async fn wait(&self, ctx: &ToolContext, wait: Wait) -> Result<ToolExit, ToolError> {
        loop {
            // Resolved beneath the roots each time, following no symlink; a
            // symlink as the last component counts as present.
            let present = {
                let (ctx, path) = (ctx.clone(), wait.path.display().to_string());
                tokio::task::spawn_blocking(move || {
                    Beneath::locate(&ctx, &path).and_then(|at| at.entry())
                })
                .await
                .unwrap_or(Ok(None))?
                .is_some()
            };
            if present == wait.exists {
                let verb = if wait.exists { "exists" } else { "is gone" };
                return Ok(ToolExit::Done(ToolOutput {
                    content: format!("{} {verb}", wait.path.display()),
                    raw: json!({"path": wait.path, "exists": present}),
                    file_changes: Vec::new(),
                }));
            }
            let now = now_ms();
            if now >= wait.deadline_ms {
                return Err(ToolError::Timeout {
                    timeout_ms: wait.timeout_ms,
                });
            }
            if ctx.suspend.is_cancelled() {
                return Ok(ToolExit::Suspended(Box::new(ToolSuspension {
                    continuation: ToolContinuation {
                        tool: NAME.into(),
                        version: CONTINUATION_VERSION,
                        state: serde_json::to_value(&wait).unwrap_or(Value::Null),
                    },
                    park: None,
                })));
            }
            let nap = self.poll.min(Duration::from_millis(wait.deadline_ms - now));
            tokio::select! {
                () = tokio::time::sleep(nap) => {}
                () = ctx.suspend.cancelled() => {}
            }
        }
    }
}

#[async_trait]
impl Tool for WaitForFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: NAME.into(),
            description: "Wait until a file exists (or, with exists=false, is gone), by absolute \
                          path inside the session's directories. Survives session suspension."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Absolute path."},
                    "exists": {"type": "boolean", "description": "Wait for presence (default) or absence."},
                    "timeout_ms": {"type": "integer", "minimum": 1, "description": "Give up after this many ms (default 1 hour)."}
                },
                "required": ["path"]
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Read
    }

    fn title(&self, arguments: &Value) -> String {
        format!(
            "wait for {}",
            arguments.get("path").and_then(Value::as_str).unwrap_or("?")
        )
    }

    /// Waits to the end, ignoring suspension requests.
    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let ctx = ToolContext {
            suspend: Default::default(),
            ..ctx.clone()
        };
        match self.execute(&ctx, arguments).await? {
            ToolExit::Done(output) => Ok(output),
            ToolExit::Suspended(_) => Err(ToolError::invalid("suspended without a request")),
        }
    }

    async fn execute(&self, ctx: &ToolContext, arguments: Value) -> Result<ToolExit, ToolError> {
        let raw = str_arg(&arguments, "path")?;
        let path = confine(ctx, raw)?;
        let exists = match arguments.get("exists") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ToolError::invalid("`exists` must be a boolean")),
        };
        let timeout_ms = opt_u64_arg(&arguments, "timeout_ms")?.unwrap_or(3600 * 1000);
        if timeout_ms == 0 || timeout_ms > self.max_timeout_ms {
            return Err(ToolError::invalid(format!(
                "`timeout_ms` must be between 1 and {}",
                self.max_timeout_ms
            )));
        }
        let wait = Wait {
            path,
            exists,
            deadline_ms: now_ms().saturating_add(timeout_ms),
            timeout_ms,
        };
        self.wait(ctx, wait).await
    }

    async fn resume_execution(
        &self,
        ctx: &ToolContext,
        continuation: &ToolContinuation,
        _resume: &ResumeInput,
    ) -> Result<ToolExit, ToolError> {
        let not_resumable = |message: String| ToolError::NotResumable {
            tool: NAME.into(),
            message,
        };
        if continuation.version != CONTINUATION_VERSION {
            return Err(not_resumable(format!(
                "unknown continuation version {}",
                continuation.version
            )));
        }
        let wait: Wait = serde_json::from_value(continuation.state.clone())
            .map_err(|e| not_resumable(e.to_string()))?;
        // The session's directories may have changed while it was parked.
        let path = confine(ctx, &wait.path.display().to_string())?;
        self.wait(ctx, Wait { path, ..wait }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suspension::ResumeCause;

    fn resume() -> ResumeInput {
        ResumeInput {
            input: None,
            cause: ResumeCause::ExplicitResume,
        }
    }

    #[tokio::test]
    async fn suspends_with_a_continuation_and_resumes_from_it() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path().canonicalize().unwrap());
        let path = ctx.cwd.join("done.flag");
        let tool = WaitForFile::default();
        let waiting = tool.execute(&ctx, json!({"path": path}));
        let suspend = ctx.suspend.clone();
        let (exit, ()) = tokio::join!(waiting, async {
            tokio::time::sleep(Duration::from_millis(120)).await;
            suspend.cancel();
        });
        let ToolExit::Suspended(parked) = exit.unwrap() else {
            panic!("expected a suspension");
        };
        assert_eq!(parked.continuation.tool, NAME);
        assert!(parked.park.is_none());
        std::fs::write(&path, "ok").unwrap();
        let fresh = ToolContext::new(ctx.cwd.clone());
        let done = tool
            .resume_execution(&fresh, &parked.continuation, &resume())
            .await
            .unwrap();
        let ToolExit::Done(output) = done else {
            panic!("expected a result");
        };
        assert!(output.content.ends_with("done.flag exists"));
    }

    #[tokio::test]
    async fn times_out_and_refuses_unknown_versions_and_paths_outside() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path().canonicalize().unwrap());
        let tool = WaitForFile::default();
        let err = tool
            .execute(
                &ctx,
                json!({"path": ctx.cwd.join("never"), "timeout_ms": 60}),
            )
            .await
            .unwrap_err();
        assert_eq!(err, ToolError::Timeout { timeout_ms: 60 });
        let err = tool
            .execute(&ctx, json!({"path": "/etc/passwd"}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::OutsideRoots { .. }));
        let bad = ToolContinuation {
            tool: NAME.into(),
            version: 99,
            state: json!({}),
        };
        let err = tool
            .resume_execution(&ctx, &bad, &resume())
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::NotResumable { .. }));
    }
}
