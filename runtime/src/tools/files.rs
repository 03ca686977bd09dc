//! `read_file` and `write_file`: absolute paths confined to the session's cwd and
//! additional directories.
//!
//! Confinement is checked on the real path: `..` is resolved lexically, then the
//! deepest existing ancestor is canonicalized (following symlinks) and must lie
//! under a canonicalized root. A symlink that points out of the roots, or that
//! does not resolve, is refused. Files are opened with `O_NOFOLLOW` (a symlink
//! swapped in after the check is not followed) and `O_NONBLOCK` (a FIFO cannot
//! hang the call), and only regular files are read or replaced.

use std::path::{Component, Path, PathBuf};

use async_trait::async_trait;
use nix::fcntl::OFlag;
use serde_json::{json, Value};
use std::io::{Read, Write};

use super::{opt_u64_arg, str_arg, FileChange, Tool, ToolContext, ToolError, ToolOutput};
use crate::event::ToolKind;
use crate::model::ToolSpec;

fn io_err(op: &str, path: &Path, e: std::io::Error) -> ToolError {
    ToolError::Io {
        op: op.into(),
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Removes `.` and resolves `..` without touching the filesystem.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Opens `path` without following a final symlink and without blocking on a
/// FIFO; for writing, creates or truncates it.
fn open_no_follow(path: &Path, write: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = (OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits();
    let mut options = std::fs::OpenOptions::new();
    if write {
        options.write(true).create(true).truncate(true);
    } else {
        options.read(true);
    }
    options.custom_flags(flags).open(path)
}

/// Runs a tool's filesystem work on the blocking pool in one hop (not one per
/// system call: a small read is then one thread hand-off, not four).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(ToolError::Io {
            op: "run".into(),
            path: String::new(),
            message: format!("the file task failed: {e}"),
        })
    })
}

/// Resolves `raw` to a path inside the session's roots.
///
/// # Errors
/// [`ToolError::RelativePath`] for a relative path, [`ToolError::OutsideRoots`]
/// when the real location is outside every root.
pub fn confine(ctx: &ToolContext, raw: &str) -> Result<PathBuf, ToolError> {
    let given = Path::new(raw);
    if !given.is_absolute() {
        return Err(ToolError::RelativePath { path: raw.into() });
    }
    let lexical = normalize(given);
    // Canonicalize the deepest ancestor that exists, then re-append the rest.
    let mut existing = lexical.as_path();
    let mut rest = Vec::new();
    let real_base = loop {
        match std::fs::canonicalize(existing) {
            Ok(p) => break p,
            // It exists but does not resolve: a dangling symlink, which a
            // write would follow to wherever it points.
            Err(_) if std::fs::symlink_metadata(existing).is_ok() => {
                return Err(ToolError::DanglingSymlink { path: raw.into() })
            }
            Err(_) => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_owned());
                    existing = parent;
                }
                _ => return Err(ToolError::OutsideRoots { path: raw.into() }),
            },
        }
    };
    let real = rest.iter().rev().fold(real_base, |p, n| p.join(n));
    let inside = std::iter::once(&ctx.cwd)
        .chain(&ctx.additional_directories)
        .filter_map(|root| std::fs::canonicalize(root).ok())
        .any(|root| real.starts_with(root));
    if inside {
        Ok(real)
    } else {
        Err(ToolError::OutsideRoots { path: raw.into() })
    }
}

/// `read_file {path, line?, limit?}`: a text file's content, optionally from a
/// 1-based `line` for `limit` lines (ACP `fs/read_text_file` semantics).
#[derive(Debug, Clone)]
pub struct ReadFile {
    /// Largest file read (bytes, default 1 MiB).
    pub max_bytes: u64,
}

impl Default for ReadFile {
    fn default() -> Self {
        Self {
            max_bytes: 1024 * 1024,
        }
    }
}

#[async_trait]
impl Tool for ReadFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "read_file".into(),
            description: "Read a text file by absolute path (inside the session's directories)."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Absolute path."},
                    "line": {"type": "integer", "minimum": 1, "description": "First line (1-based)."},
                    "limit": {"type": "integer", "minimum": 1, "description": "Number of lines."}
                },
                "required": ["path"]
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Read
    }

    /// Reads never race each other: a batch's consecutive reads run together.
    fn concurrency_safe(&self) -> bool {
        true
    }

    fn title(&self, arguments: &Value) -> String {
        format!(
            "read {}",
            arguments.get("path").and_then(Value::as_str).unwrap_or("?")
        )
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let raw = str_arg(&arguments, "path")?;
        let line = opt_u64_arg(&arguments, "line")?;
        let limit = opt_u64_arg(&arguments, "limit")?;
        // Lines are 1-based, as the schema says (`minimum: 1`).
        if let Some(key) = [("line", line), ("limit", limit)]
            .iter()
            .find_map(|(key, v)| (*v == Some(0)).then_some(*key))
        {
            return Err(ToolError::invalid(format!(
                "`{key}` must be at least 1 (lines are 1-based)"
            )));
        }
        let max_bytes = self.max_bytes;
        let ctx = ctx.clone();
        let raw_path = raw.to_owned();
        let (path, bytes) = blocking(move || {
            let raw = raw_path.as_str();
            let path = confine(&ctx, raw)?;
            let file = open_no_follow(&path, false).map_err(|e| io_err("read", &path, e))?;
            let meta = file.metadata().map_err(|e| io_err("read", &path, e))?;
            if !meta.is_file() {
                return Err(ToolError::NotAFile { path: raw.into() });
            }
            let size = meta.len();
            if size > max_bytes {
                return Err(ToolError::TooLarge {
                    path: raw.into(),
                    size,
                    limit: max_bytes,
                });
            }
            let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
            file.take(max_bytes)
                .read_to_end(&mut bytes)
                .map_err(|e| io_err("read", &path, e))?;
            Ok((path, bytes))
        })
        .await?;
        let file_bytes = bytes.len();
        let text = String::from_utf8_lossy(&bytes);
        // Not UTF-8: the model reads it with U+FFFD in place of the bad bytes.
        let invalid_utf8 = matches!(text, std::borrow::Cow::Owned(_));
        let content = match (line, limit) {
            (None, None) => text.into_owned(),
            (line, limit) => {
                let skip = line.unwrap_or(1).saturating_sub(1) as usize;
                let take = limit.map_or(usize::MAX, |l| l as usize);
                text.split_inclusive('\n').skip(skip).take(take).collect()
            }
        };
        Ok(ToolOutput {
            // `bytes`: of the text returned; `file_bytes`: of the file read.
            raw: json!({
                "path": path,
                "bytes": content.len(),
                "file_bytes": file_bytes,
                "invalid_utf8": invalid_utf8,
            }),
            content,
            file_changes: Vec::new(),
        })
    }
}

/// Largest file `write_file` replaces (bytes): its old text is kept for a
/// rollback, so it is read whole first; as large as `read_file` reads.
pub const MAX_REPLACED_BYTES: u64 = 1024 * 1024;

/// `write_file {path, content}`: creates or replaces a text file (and its
/// missing parent directories) inside the session's directories. Refuses to
/// replace a file over [`MAX_REPLACED_BYTES`] or one that is not UTF-8 (its
/// old content could not be restored by a rollback).
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteFile;

#[async_trait]
impl Tool for WriteFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "write_file".into(),
            description: "Create or overwrite a text file by absolute path (inside the session's directories).".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Absolute path."},
                    "content": {"type": "string", "description": "The whole new content."}
                },
                "required": ["path", "content"]
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Edit
    }

    fn title(&self, arguments: &Value) -> String {
        format!(
            "write {}",
            arguments.get("path").and_then(Value::as_str).unwrap_or("?")
        )
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> Result<ToolOutput, ToolError> {
        let raw = str_arg(&arguments, "path")?;
        let content = str_arg(&arguments, "content")?;
        let ctx = ctx.clone();
        let (raw_path, text) = (raw.to_owned(), content.to_owned());
        let (path, before) = blocking(move || {
            let raw = raw_path.as_str();
            let path = confine(&ctx, raw)?;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io_err("write", parent, e))?;
            }
            let existing = std::fs::symlink_metadata(&path).ok();
            if existing.as_ref().is_some_and(|m| !m.is_file()) {
                return Err(ToolError::NotAFile { path: raw.into() });
            }
            // The old text, so a rollback can restore it (a binary file could
            // not be restored, so it is refused rather than silently lost).
            let before = match existing {
                Some(meta) if meta.len() > MAX_REPLACED_BYTES => {
                    return Err(ToolError::TooLarge {
                        path: raw.into(),
                        size: meta.len(),
                        limit: MAX_REPLACED_BYTES,
                    })
                }
                Some(_) => {
                    let mut bytes = Vec::new();
                    open_no_follow(&path, false)
                        .and_then(|f| f.take(MAX_REPLACED_BYTES + 1).read_to_end(&mut bytes))
                        .map_err(|e| io_err("read", &path, e))?;
                    if bytes.len() as u64 > MAX_REPLACED_BYTES {
                        return Err(ToolError::TooLarge {
                            path: raw.into(),
                            size: bytes.len() as u64,
                            limit: MAX_REPLACED_BYTES,
                        });
                    }
                    Some(String::from_utf8(bytes).map_err(|_| {
                        ToolError::invalid(format!(
                            "{raw} holds binary data; write_file only replaces text files"
                        ))
                    })?)
                }
                None => None,
            };
            let mut file = open_no_follow(&path, true).map_err(|e| io_err("write", &path, e))?;
            file.write_all(text.as_bytes())
                .map_err(|e| io_err("write", &path, e))?;
            file.flush().map_err(|e| io_err("write", &path, e))?;
            Ok((path, before))
        })
        .await?;
        Ok(ToolOutput {
            content: format!("wrote {} bytes to {}", content.len(), path.display()),
            raw: json!({"path": path, "bytes": content.len()}),
            file_changes: vec![FileChange {
                path: path.clone(),
                before,
                after: Some(content.to_owned()),
            }],
        })
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn ctx(cwd: &Path, extra: &[&Path]) -> ToolContext {
        ToolContext {
            additional_directories: extra.iter().map(|p| p.to_path_buf()).collect(),
            ..ToolContext::new(cwd.to_path_buf())
        }
    }

    #[tokio::test]
    async fn write_then_read_inside_cwd() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path(), &[]);
        let p = dir.path().join("sub/a.txt");
        WriteFile
            .call(&c, json!({"path": p, "content": "one\ntwo\nthree\n"}))
            .await
            .unwrap();
        let all = ReadFile::default()
            .call(&c, json!({"path": p}))
            .await
            .unwrap();
        assert_eq!(all.content, "one\ntwo\nthree\n");
        let part = ReadFile::default()
            .call(&c, json!({"path": p, "line": 2, "limit": 1}))
            .await
            .unwrap();
        assert_eq!(part.content, "two\n");
    }

    #[tokio::test]
    async fn lines_are_one_based_and_binary_is_reported_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path(), &[]);
        let p = dir.path().join("a.txt");
        std::fs::write(&p, "one\ntwo\n").unwrap();
        for args in [
            json!({"path": p, "line": 0}),
            json!({"path": p, "limit": 0}),
        ] {
            let e = ReadFile::default().call(&c, args).await.unwrap_err();
            assert!(e.to_string().contains("at least 1"), "{e}");
        }
        let bin = dir.path().join("b.bin");
        std::fs::write(&bin, [0xff, 0xfe, b'a']).unwrap();
        let read = ReadFile::default()
            .call(&c, json!({"path": bin}))
            .await
            .unwrap();
        assert_eq!(read.raw["file_bytes"], 3);
        assert_eq!(read.raw["invalid_utf8"], true);
        assert_eq!(read.raw["bytes"], read.content.len());
        let text = ReadFile::default()
            .call(&c, json!({"path": p}))
            .await
            .unwrap();
        assert_eq!(text.raw["invalid_utf8"], false);
    }

    #[tokio::test]
    async fn a_file_too_large_to_restore_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path(), &[]);
        let big = dir.path().join("big.txt");
        let content = "x".repeat(usize::try_from(MAX_REPLACED_BYTES).unwrap() + 1);
        std::fs::write(&big, &content).unwrap();
        let e = WriteFile
            .call(&c, json!({"path": big, "content": "small"}))
            .await
            .unwrap_err();
        assert!(matches!(e, ToolError::TooLarge { .. }), "{e}");
        assert_eq!(std::fs::read_to_string(&big).unwrap(), content, "untouched");
        // At the limit it is replaced, its old text kept for a rollback.
        std::fs::write(&big, &content[1..]).unwrap();
        let out = WriteFile
            .call(&c, json!({"path": big, "content": "small"}))
            .await
            .unwrap();
        assert_eq!(out.file_changes[0].before.as_deref(), Some(&content[1..]));
    }

    #[tokio::test]
    async fn escapes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let c = ctx(dir.path(), &[]);
        let dotdot = format!(
            "{}/../{}/x",
            dir.path().display(),
            other.path().file_name().unwrap().to_string_lossy()
        );
        for path in [dotdot, "/etc/passwd".to_owned()] {
            let err = ReadFile::default()
                .call(&c, json!({"path": path}))
                .await
                .unwrap_err();
            assert!(
                matches!(err, ToolError::OutsideRoots { .. }),
                "{path}: {err:?}"
            );
        }
        let err = WriteFile
            .call(&c, json!({"path": "rel.txt", "content": ""}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::RelativePath { .. }));
        std::os::unix::fs::symlink(other.path(), dir.path().join("link")).unwrap();
        let err = WriteFile
            .call(
                &c,
                json!({"path": dir.path().join("link/evil.txt"), "content": "x"}),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::OutsideRoots { .. }));
        assert!(!other.path().join("evil.txt").exists());
    }

    #[tokio::test]
    async fn dangling_symlinks_and_special_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let c = ctx(dir.path(), &[]);
        let target = other.path().join("target.txt");
        std::os::unix::fs::symlink(&target, dir.path().join("dangling")).unwrap();
        let err = WriteFile
            .call(
                &c,
                json!({"path": dir.path().join("dangling"), "content": "x"}),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::DanglingSymlink { .. }), "{err:?}");
        assert!(!target.exists(), "nothing was written through the link");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            ReadFile::default().call(&c, json!({"path": fifo})),
        )
        .await
        .expect("reading a FIFO must not hang");
        assert!(matches!(read, Err(ToolError::NotAFile { .. })), "{read:?}");
        let err = WriteFile
            .call(&c, json!({"path": fifo, "content": "x"}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::NotAFile { .. }), "{err:?}");
        let err = ReadFile::default()
            .call(&c, json!({"path": dir.path()}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::NotAFile { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn additional_directories_are_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let extra = tempfile::tempdir().unwrap();
        let c = ctx(dir.path(), &[extra.path()]);
        WriteFile
            .call(
                &c,
                json!({"path": extra.path().join("b.txt"), "content": "b"}),
            )
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(extra.path().join("b.txt")).unwrap(),
            "b"
        );
    }

    #[tokio::test]
    async fn large_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big");
        std::fs::write(&p, vec![b'x'; 100]).unwrap();
        let err = ReadFile { max_bytes: 10 }
            .call(&ctx(dir.path(), &[]), json!({"path": p}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::TooLarge { size: 100, .. }));
    }
}
