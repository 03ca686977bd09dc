//! The `shell` tool: `sh -c COMMAND` in the session's cwd.
//!
//! Each call runs under its own supervisor ([`supervisor`](super::supervisor):
//! a child subreaper that every process the command starts stays under, even
//! one that left the process group with `setsid`), registered in the session's
//! [`ProcessGroups`](super::ProcessGroups), so cancel and close kill the whole
//! tree. The shell gets exactly the configured [`ToolEnvironment`], never
//! berth's own environment. stdout and stderr are captured up to a byte bound
//! each; the rest is read and counted but dropped. A call ends when the shell
//! exits; output that background children keep writing afterwards is not
//! waited for beyond a short grace period.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use super::environment::ToolEnvironment;
use super::{opt_u64_arg, str_arg, supervisor, Tool, ToolContext, ToolError, ToolOutput};
use crate::event::ToolKind;
use crate::model::ToolSpec;

/// How long to keep reading pipes after the shell exited (ms): a background
/// child holding stdout open must not hold the call open.
const PIPE_GRACE_MS: u64 = 50;

/// The `shell` tool and its bounds.
#[derive(Debug, Clone)]
pub struct Shell {
    /// Bytes kept of stdout and of stderr, each (default 64 KiB).
    pub output_limit_bytes: usize,
    /// Timeout when the call gives none (ms, default 600 000).
    pub default_timeout_ms: u64,
    /// The environment the shell gets (default: the allow-list alone).
    pub env: Arc<ToolEnvironment>,
}

impl Default for Shell {
    fn default() -> Self {
        Self {
            output_limit_bytes: 64 * 1024,
            default_timeout_ms: 600_000,
            env: Arc::new(ToolEnvironment::allowed()),
        }
    }
}

/// Kills a call's process tree if the call is dropped before its shell
/// exited (its future abandoned).
struct KillUnlessDone(Option<i32>);

impl Drop for KillUnlessDone {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            supervisor::kill_tree(pid);
        }
    }
}

#[derive(Debug, Default)]
struct Captured {
    kept: Vec<u8>,
    total: u64,
}

async fn capture(mut pipe: impl AsyncRead + Unpin, limit: usize, into: Arc<Mutex<Captured>>) {
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let mut c = into.lock().unwrap_or_else(|e| e.into_inner());
                let room = limit.saturating_sub(c.kept.len()).min(n);
                c.kept.extend_from_slice(&buf[..room]);
                c.total += n as u64;
            }
        }
    }
}

fn take(c: &Arc<Mutex<Captured>>) -> (String, u64, bool) {
    let c = c.lock().unwrap_or_else(|e| e.into_inner());
    let text = String::from_utf8_lossy(&c.kept).into_owned();
    (text, c.total, c.total > c.kept.len() as u64)
}

#[async_trait]
impl Tool for Shell {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "shell".into(),
            description: "Run a shell command (sh -c) in the session's working directory. \
                          Returns exit code, stdout and stderr."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command line."},
                    "timeout_ms": {"type": "integer", "minimum": 1, "description": "Kill after this many milliseconds."}
                },
                "required": ["command"]
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Execute
    }

    fn title(&self, arguments: &Value) -> String {
        let cmd = arguments
            .get("command")
            .and_then(Value::as_str)
            .unwrap_or("");
        let short: String = cmd.chars().take(80).collect();
        format!("shell: {short}")
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let command_line = str_arg(&arguments, "command")?;
        let timeout_ms = opt_u64_arg(&arguments, "timeout_ms")?.unwrap_or(self.default_timeout_ms);
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(command_line)
            .current_dir(&ctx.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.env.apply(&mut command);
        let mut proc = supervisor::spawn(&mut command).map_err(|e| ToolError::Io {
            op: "spawn".into(),
            path: command_line.into(),
            message: e.to_string(),
        })?;
        let mut guard = KillUnlessDone(Some(proc.pid));
        ctx.processes.register(proc.pid, ctx.call_id.as_deref());
        let (out, err) = (Arc::default(), Arc::default());
        let readers = [
            proc.child
                .stdout
                .take()
                .map(|p| tokio::spawn(capture(p, self.output_limit_bytes, Arc::clone(&out)))),
            proc.child
                .stderr
                .take()
                .map(|p| tokio::spawn(capture(p, self.output_limit_bytes, Arc::clone(&err)))),
        ];
        let status =
            match tokio::time::timeout(Duration::from_millis(timeout_ms), proc.status()).await {
                Ok(status) => status,
                Err(_) => {
                    // The guard kills the whole tree.
                    return Err(ToolError::Timeout { timeout_ms });
                }
            };
        guard.0 = None;
        for reader in readers.into_iter().flatten() {
            let abort = reader.abort_handle();
            if tokio::time::timeout(Duration::from_millis(PIPE_GRACE_MS), reader)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        ctx.processes.prune();
        let (stdout, stdout_bytes, stdout_truncated) = take(&out);
        let (stderr, stderr_bytes, stderr_truncated) = take(&err);
        // No status: the supervisor was killed (a stop) before the shell exited.
        let exit_code = status.and_then(|s| s.code());
        let mut content = format!(
            "exit code: {}\n",
            exit_code.map_or_else(|| "killed by signal".to_owned(), |c| c.to_string())
        );
        if !stdout.is_empty() {
            content.push_str(&format!("stdout:\n{stdout}\n"));
        }
        if !stderr.is_empty() {
            content.push_str(&format!("stderr:\n{stderr}\n"));
        }
        if stdout_truncated || stderr_truncated {
            content.push_str(&format!(
                "(output truncated to {} bytes per stream)\n",
                self.output_limit_bytes
            ));
        }
        Ok(ToolOutput {
            content,
            file_changes: Vec::new(),
            raw: json!({
                "exit_code": exit_code,
                "stdout": stdout,
                "stderr": stderr,
                "stdout_bytes": stdout_bytes,
                "stderr_bytes": stderr_bytes,
                "truncated": stdout_truncated || stderr_truncated,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(dir: &std::path::Path) -> ToolContext {
        ToolContext::new(dir.to_path_buf())
    }

    #[tokio::test]
    async fn runs_in_cwd_and_captures_both_streams() {
        let dir = tempfile::tempdir().unwrap();
        let out = Shell::default()
            .call(
                &ctx(dir.path()),
                json!({"command": "pwd; echo oops >&2; exit 3"}),
            )
            .await
            .unwrap();
        assert_eq!(out.raw["exit_code"], 3);
        let pwd = out.raw["stdout"].as_str().unwrap().trim().to_owned();
        assert_eq!(
            std::fs::canonicalize(pwd).unwrap(),
            std::fs::canonicalize(dir.path()).unwrap()
        );
        assert_eq!(out.raw["stderr"], "oops\n");
    }

    #[tokio::test]
    async fn output_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let shell = Shell {
            output_limit_bytes: 10,
            ..Shell::default()
        };
        let out = shell
            .call(
                &ctx(dir.path()),
                json!({"command": "head -c 100000 /dev/zero | tr '\\0' a"}),
            )
            .await
            .unwrap();
        assert_eq!(out.raw["stdout"], "aaaaaaaaaa");
        assert_eq!(out.raw["stdout_bytes"], 100000);
        assert_eq!(out.raw["truncated"], true);
    }

    #[tokio::test]
    async fn background_child_does_not_hold_the_call_and_is_killed_with_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        let out = Shell::default()
            .call(&c, json!({"command": "sleep 30 & echo $!"}))
            .await
            .unwrap();
        let pid: i32 = out.raw["stdout"].as_str().unwrap().trim().parse().unwrap();
        let alive = |pid| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        assert!(alive(pid), "background child should outlive the call");
        assert_eq!(c.processes.kill_all(), 1);
        // The child is ours to reap only via init; wait until it is gone.
        for _ in 0..200 {
            if !alive(pid)
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z"))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("background child {pid} survived kill_all");
    }

    #[tokio::test]
    async fn bad_arguments_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = Shell::default()
            .call(&ctx(dir.path()), json!({"command": 5}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::InvalidArguments { .. }));
        let err = Shell::default()
            .call(
                &ctx(dir.path()),
                json!({"command": "sleep 5", "timeout_ms": 50}),
            )
            .await
            .unwrap_err();
        assert_eq!(err, ToolError::Timeout { timeout_ms: 50 });
    }

    fn running(pid: i32) -> bool {
        supervisor::is_running(pid)
    }

    /// Waits (bounded) until none of `pids` runs; those still running.
    async fn survivors(pids: &[i32]) -> Vec<i32> {
        for _ in 0..500 {
            if pids.iter().all(|&p| !running(p)) {
                return Vec::new();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        pids.iter().copied().filter(|&p| running(p)).collect()
    }

    /// Processes that left the call's process group (`setsid`, a double
    /// fork) are killed with it, by `kill_all` and by `kill_call`.
    #[tokio::test]
    async fn processes_that_left_the_group_are_killed_too() {
        for by_call in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let c = ToolContext {
                call_id: Some("call_1".into()),
                ..ctx(dir.path())
            };
            let out = Shell::default()
                .call(
                    &c,
                    json!({"command": "setsid sleep 30 >/dev/null 2>&1 & echo $!; \
                        (setsid sh -c 'sleep 30 & echo $!' >pid2 &) ; \
                        while [ ! -s pid2 ]; do sleep 0.01; done; cat pid2"}),
                )
                .await
                .unwrap();
            let pids: Vec<i32> = out.raw["stdout"]
                .as_str()
                .unwrap()
                .lines()
                .map(|l| l.trim().parse().unwrap())
                .collect();
            assert_eq!(pids.len(), 2, "{out:?}");
            for &pid in &pids {
                assert!(running(pid), "{pid} outlives the call until a stop");
            }
            let killed = if by_call {
                c.processes.kill_call("call_1")
            } else {
                c.processes.kill_all()
            };
            assert_eq!(killed, 1);
            let left = survivors(&pids).await;
            for &pid in &left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            assert!(left.is_empty(), "by_call {by_call}: {left:?} survived");
        }
    }

    /// The shell sees the allow-list and the configured variables, nothing
    /// else of berth's environment.
    #[tokio::test]
    async fn the_environment_is_explicit() {
        let dir = tempfile::tempdir().unwrap();
        let shell = Shell {
            env: Arc::new(ToolEnvironment::new(["CARGO_PKG_NAME"], [("X_SET", "1")])),
            ..Shell::default()
        };
        let out = shell
            .call(&ctx(dir.path()), json!({"command": "env"}))
            .await
            .unwrap();
        let stdout = out.raw["stdout"].as_str().unwrap();
        assert!(
            std::env::var_os("CARGO_MANIFEST_DIR").is_some(),
            "cargo sets it"
        );
        assert!(!stdout.contains("CARGO_MANIFEST_DIR"), "{stdout}");
        assert!(stdout.lines().any(|l| l == "X_SET=1"), "{stdout}");
        assert!(
            stdout.lines().any(|l| l == "CARGO_PKG_NAME=berth-runtime"),
            "{stdout}"
        );
        assert!(stdout.lines().any(|l| l.starts_with("PATH=")), "{stdout}");
    }
}
