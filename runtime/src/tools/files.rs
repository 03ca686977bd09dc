//! `read_file` and `write_file`: absolute paths confined to the session's cwd and
//! additional directories.
//!
//! Every path is resolved beneath a root's directory fd without following any
//! symlink ([`Beneath`]): a symlink at any component is refused, so a
//! component swapped for a link while the tool runs reaches nothing outside.
//! Files are opened with `O_NOFOLLOW` and `O_NONBLOCK` (a FIFO cannot hang the
//! call), and only regular files are read or replaced. `write_file` writes a
//! temporary file in the same directory and renames it over the name, and
//! refuses a file with more than one hard link.

use std::path::PathBuf;

use async_trait::async_trait;
use serde_json::{json, Value};
use std::io::Read;

pub use super::beneath::{Beneath, Entry};
use super::{opt_u64_arg, str_arg, FileChange, Tool, ToolContext, ToolError, ToolOutput};
use crate::event::ToolKind;
use crate::model::ToolSpec;

fn io_err(op: &str, path: &str, e: std::io::Error) -> ToolError {
    ToolError::Io {
        op: op.into(),
        path: path.into(),
        message: e.to_string(),
    }
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

/// The real path `raw` names inside the session's roots (a lexical check:
/// see [`Beneath::locate`]; opening it is [`Beneath`]'s).
///
/// # Errors
/// [`ToolError::RelativePath`] for a relative path, [`ToolError::OutsideRoots`]
/// when it is under no root.
pub fn confine(ctx: &ToolContext, raw: &str) -> Result<PathBuf, ToolError> {
    Beneath::locate(ctx, raw).map(|at| at.real().to_path_buf())
}

/// Reads a regular file of at most `limit` bytes beneath the roots: its
/// bytes, or `None` when it does not exist.
///
/// # Errors
/// [`ToolError::Symlink`], [`ToolError::NotAFile`], [`ToolError::TooLarge`],
/// I/O errors.
pub fn read_beneath(at: &Beneath, raw: &str, limit: u64) -> Result<Option<Vec<u8>>, ToolError> {
    if at.entry()?.is_none() {
        return Ok(None);
    }
    let file = at.open_read()?;
    let meta = file.metadata().map_err(|e| io_err("read", raw, e))?;
    if !meta.is_file() {
        return Err(ToolError::NotAFile { path: raw.into() });
    }
    if meta.len() > limit {
        return Err(ToolError::TooLarge {
            path: raw.into(),
            size: meta.len(),
            limit,
        });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_err("read", raw, e))?;
    if bytes.len() as u64 > limit {
        return Err(ToolError::TooLarge {
            path: raw.into(),
            size: bytes.len() as u64,
            limit,
        });
    }
    Ok(Some(bytes))
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
            let at = Beneath::locate(&ctx, raw)?;
            let file = at.open_read()?;
            let meta = file.metadata().map_err(|e| io_err("read", raw, e))?;
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
                .map_err(|e| io_err("read", raw, e))?;
            Ok((at.real().to_path_buf(), bytes))
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
            let at = Beneath::locate(&ctx, raw)?;
            // The old text, so a rollback can restore it (a binary file could
            // not be restored, so it is refused rather than silently lost).
            let before = match at.entry()? {
                None => None,
                Some(entry) => {
                    at.replaceable(entry)?;
                    let bytes = read_beneath(&at, raw, MAX_REPLACED_BYTES)?.unwrap_or_default();
                    Some(String::from_utf8(bytes).map_err(|_| {
                        ToolError::invalid(format!(
                            "{raw} holds binary data; write_file only replaces text files"
                        ))
                    })?)
                }
            };
            at.replace(text.as_bytes(), true)?;
            Ok((at.real().to_path_buf(), before))
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

    fn ctx(cwd: &std::path::Path, extra: &[&std::path::Path]) -> ToolContext {
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
        assert!(matches!(err, ToolError::Symlink { .. }), "{err:?}");
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
        assert!(matches!(err, ToolError::Symlink { .. }), "{err:?}");
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

    /// A directory component swapped for a symlink to the outside
    /// (`renameat2(RENAME_EXCHANGE)`) while the tools run never lets a read
    /// or a write through.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_component_swapped_for_a_symlink_never_escapes() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root_path = root.path().canonicalize().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "SECRET").unwrap();
        std::fs::create_dir(root_path.join("d")).unwrap();
        std::fs::write(root_path.join("d/secret.txt"), "inside").unwrap();
        std::os::unix::fs::symlink(outside.path(), root_path.join("l")).unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, root_path) = (std::sync::Arc::clone(&stop), root_path.clone());
            std::thread::spawn(move || {
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    nix::fcntl::renameat2(
                        nix::fcntl::AT_FDCWD,
                        &root_path.join("d"),
                        nix::fcntl::AT_FDCWD,
                        &root_path.join("l"),
                        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                    )
                    .unwrap();
                    swaps += 1;
                }
                swaps
            })
        };
        let c = ctx(&root_path, &[]);
        let (mut escapes, mut reads, mut writes) = (0, 0, 0);
        for i in 0..300 {
            let got = ReadFile::default()
                .call(&c, json!({"path": root_path.join("d/secret.txt")}))
                .await;
            if let Ok(out) = got {
                reads += 1;
                if out.content.contains("SECRET") {
                    escapes += 1;
                }
            }
            let wrote = WriteFile
                .call(
                    &c,
                    json!({"path": root_path.join(format!("d/w{i}.txt")), "content": "x"}),
                )
                .await;
            writes += usize::from(wrote.is_ok());
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        let written_outside: Vec<_> = std::fs::read_dir(outside.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n != "secret.txt")
            .collect();
        assert_eq!(
            escapes, 0,
            "{escapes} of {reads} reads returned the outside secret"
        );
        assert!(
            written_outside.is_empty(),
            "writes escaped to the outside: {written_outside:?}"
        );
        assert!(swaps > 300, "the swapper ran ({swaps} swaps)");
        assert!(
            reads > 0 && writes > 0,
            "some calls got through ({reads} reads, {writes} writes)"
        );
    }

    /// The session root itself swapped for a symlink to the outside
    /// (`renameat2(RENAME_EXCHANGE)`) while the tools run never lets a read
    /// or a write through: the root is pinned and checked on each open.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_root_swapped_for_a_symlink_never_escapes() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let top = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let top_path = top.path().canonicalize().unwrap();
        let work = top_path.join("work");
        std::fs::create_dir(&work).unwrap();
        std::fs::write(work.join("secret.txt"), "inside").unwrap();
        std::fs::write(outside.path().join("secret.txt"), "SECRET").unwrap();
        std::os::unix::fs::symlink(outside.path(), top_path.join("l")).unwrap();
        let c = ctx(&work, &[]);
        c.processes.pin_roots([&work]);
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, top_path) = (std::sync::Arc::clone(&stop), top_path.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    nix::fcntl::renameat2(
                        nix::fcntl::AT_FDCWD,
                        &top_path.join("work"),
                        nix::fcntl::AT_FDCWD,
                        &top_path.join("l"),
                        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                    )
                    .unwrap();
                }
            })
        };
        let (mut escapes, mut reads, mut changed) = (0, 0, 0);
        // At least 300 rounds, and on until the swap was seen once.
        for i in 0..20_000 {
            if i >= 300 && changed > 0 {
                break;
            }
            match ReadFile::default()
                .call(&c, json!({"path": work.join("secret.txt")}))
                .await
            {
                Ok(out) => {
                    reads += 1;
                    if out.content.contains("SECRET") {
                        escapes += 1;
                    }
                }
                Err(ToolError::RootChanged { .. }) => changed += 1,
                Err(_) => {}
            }
            let _ = WriteFile
                .call(
                    &c,
                    json!({"path": work.join(format!("w{i}.txt")), "content": "x"}),
                )
                .await;
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        let written_outside: Vec<_> = std::fs::read_dir(outside.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n != "secret.txt")
            .collect();
        assert_eq!(
            escapes, 0,
            "{escapes} of {reads} reads returned the outside secret"
        );
        assert!(
            written_outside.is_empty(),
            "writes escaped to the outside: {written_outside:?}"
        );
        assert!(
            changed > 0,
            "the swap was seen ({reads} reads, {changed} refused)"
        );
    }

    /// A root renamed away and replaced (`mv work work.old && ln -s DIR
    /// work`, or a new directory of the same name) is refused with
    /// `RootChanged`, and nothing is read or written.
    #[tokio::test]
    async fn a_root_replaced_after_the_session_started_is_refused() {
        let top = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let work = top.path().canonicalize().unwrap().join("work");
        std::fs::create_dir(&work).unwrap();
        std::fs::write(outside.path().join("keys.json"), "SECRET").unwrap();
        let c = ctx(&work, &[]);
        c.processes.pin_roots([&work]);
        std::fs::rename(&work, work.with_extension("old")).unwrap();
        std::os::unix::fs::symlink(outside.path(), &work).unwrap();
        let err = ReadFile::default()
            .call(&c, json!({"path": work.join("keys.json")}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::RootChanged { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("changed since the session started"),
            "{err}"
        );
        let err = WriteFile
            .call(&c, json!({"path": work.join("new.txt"), "content": "x"}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::RootChanged { .. }), "{err}");
        assert!(!outside.path().join("new.txt").exists());
        // A fresh directory under the old name is not the pinned root either.
        std::fs::remove_file(&work).unwrap();
        std::fs::create_dir(&work).unwrap();
        std::fs::write(work.join("keys.json"), "other").unwrap();
        let err = ReadFile::default()
            .call(&c, json!({"path": work.join("keys.json")}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::RootChanged { .. }), "{err}");
    }

    /// `write_file` never writes through a hard link (its target may be
    /// outside the roots).
    #[tokio::test]
    async fn a_hard_linked_file_is_not_written() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("target.txt");
        std::fs::write(&target, "outside").unwrap();
        let link = root.path().join("link.txt");
        std::fs::hard_link(&target, &link).unwrap();
        let c = ctx(root.path(), &[]);
        let err = WriteFile
            .call(&c, json!({"path": link, "content": "pwned"}))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ToolError::HardLink { links: 2, .. }),
            "{err:?}"
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "outside");
    }

    /// A symlink at any component is refused, even one pointing inside.
    #[tokio::test]
    async fn symlink_components_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir(r.join("real")).unwrap();
        std::fs::write(r.join("real/a.txt"), "a").unwrap();
        std::os::unix::fs::symlink(r.join("real"), r.join("dirlink")).unwrap();
        std::os::unix::fs::symlink("real/a.txt", r.join("filelink")).unwrap();
        std::os::unix::fs::symlink("/etc", r.join("abs")).unwrap();
        let c = ctx(r, &[]);
        for path in [
            r.join("dirlink/a.txt"),
            r.join("filelink"),
            r.join("abs/passwd"),
            r.join("dirlink/new/b.txt"),
        ] {
            let err = ReadFile::default()
                .call(&c, json!({"path": path}))
                .await
                .unwrap_err();
            assert!(
                matches!(err, ToolError::Symlink { .. }),
                "read {}: {err:?}",
                path.display()
            );
            let err = WriteFile
                .call(&c, json!({"path": path, "content": "x"}))
                .await
                .unwrap_err();
            assert!(
                matches!(err, ToolError::Symlink { .. }),
                "write {}: {err:?}",
                path.display()
            );
        }
        assert_eq!(std::fs::read_to_string(r.join("real/a.txt")).unwrap(), "a");
        assert!(!r.join("real/new").exists());
    }
}
