//! Paths resolved beneath a session root without following any symlink, so
//! a check cannot be raced.
//!
//! A path is matched against the session's roots lexically (`.` dropped,
//! `..` resolved on the text; one that climbs out of every root is outside).
//! Each root is pinned for the session the first time it is seen
//! ([`RootPin`](super::processes::RootPin): its canonical path, device and
//! inode); the root is opened at that canonical path with `O_NOFOLLOW` and
//! its device and inode compared, so a root renamed away and replaced by a
//! symlink or another directory is [`ToolError::RootChanged`] and nothing is
//! read or written. Everything under it is resolved from that directory fd:
//! `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`
//! for the directories, or — where the kernel has no `openat2` (`ENOSYS`,
//! `EINVAL`) — an `openat(O_PATH | O_DIRECTORY | O_NOFOLLOW)` walk one
//! component at a time; the last component is opened from its directory's fd
//! with `O_NOFOLLOW`. A symlink at any component is refused
//! ([`ToolError::Symlink`]): swapping a directory for a link while a tool
//! runs (`renameat2(RENAME_EXCHANGE)`) reaches nothing outside.
//!
//! Writes never go through an existing inode: the new text is written to a
//! fresh temporary file (`O_CREAT | O_EXCL | O_NOFOLLOW`) in the same
//! directory fd and renamed over the name (`renameat`), and a file with more
//! than one hard link is refused ([`ToolError::HardLink`]), since another of
//! its names may be outside the roots.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstatat, FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;

use super::{ToolContext, ToolError};

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

/// What a name beneath a root is (from `fstatat` without following).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// A regular file: its size (bytes) and link count.
    File {
        /// Bytes.
        size: u64,
        /// Hard links.
        links: u64,
    },
    /// A symlink.
    Symlink,
    /// A directory, FIFO, device or socket.
    Other,
}

impl Entry {
    fn of(stat: &FileStat) -> Self {
        let kind = SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFREG {
            Self::File {
                size: u64::try_from(stat.st_size).unwrap_or(0),
                links: stat.st_nlink,
            }
        } else if kind == SFlag::S_IFLNK {
            Self::Symlink
        } else {
            Self::Other
        }
    }
}

/// An absolute path located under one of a session's roots (see the
/// [module docs](self)).
#[derive(Debug, Clone)]
pub struct Beneath {
    /// The path as the caller gave it (for errors).
    raw: String,
    /// The root as the session names it (for errors).
    root: PathBuf,
    /// The root's identity as pinned for the session.
    pin: super::processes::RootPin,
    /// The rest: normal components only (may be empty: the root itself).
    rel: PathBuf,
    /// The root's canonical path joined with `rel`: the real path, since
    /// nothing under the root may be a symlink.
    real: PathBuf,
    /// Resolve by the component walk even where `openat2` exists.
    walk_only: bool,
}

/// Counter for temporary file names.
static TEMP: AtomicU64 = AtomicU64::new(0);

impl Beneath {
    /// Locates `raw` under the session's cwd or additional directories (no
    /// filesystem access beyond canonicalizing the roots).
    ///
    /// # Errors
    /// [`ToolError::RelativePath`], or [`ToolError::OutsideRoots`] when the
    /// normalized path is under no root.
    pub fn locate(ctx: &ToolContext, raw: &str) -> Result<Self, ToolError> {
        let given = Path::new(raw);
        if !given.is_absolute() {
            return Err(ToolError::RelativePath { path: raw.into() });
        }
        let lexical = normalize(given);
        for root in std::iter::once(&ctx.cwd).chain(&ctx.additional_directories) {
            let pin = ctx.processes.root_pin(root).ok();
            let canonical = pin.as_ref().map(|p| p.canonical.clone());
            for candidate in std::iter::once(normalize(root)).chain(canonical.clone()) {
                if let Ok(rel) = lexical.strip_prefix(&candidate) {
                    let Some(pin) = pin else {
                        return Err(ToolError::RootChanged {
                            root: root.display().to_string(),
                        });
                    };
                    return Ok(Self {
                        raw: raw.into(),
                        real: pin.canonical.join(rel),
                        rel: rel.to_path_buf(),
                        root: root.clone(),
                        pin,
                        walk_only: false,
                    });
                }
            }
        }
        Err(ToolError::OutsideRoots { path: raw.into() })
    }

    /// The same location, always resolved by the `openat` walk (to test the
    /// fallback on kernels that have `openat2`).
    #[cfg(test)]
    pub(crate) fn walk_only(self) -> Self {
        Self {
            walk_only: true,
            ..self
        }
    }

    /// The real path (the root's canonical path joined with the rest).
    pub fn real(&self) -> &Path {
        &self.real
    }

    fn io(&self, op: &str, e: impl std::fmt::Display) -> ToolError {
        ToolError::Io {
            op: op.into(),
            path: self.raw.clone(),
            message: e.to_string(),
        }
    }

    /// The error for `errno` met resolving or opening: a symlink is
    /// [`ToolError::Symlink`], an escape [`ToolError::OutsideRoots`].
    fn errno(&self, op: &str, errno: Errno) -> ToolError {
        match errno {
            Errno::ELOOP => ToolError::Symlink {
                path: self.raw.clone(),
            },
            Errno::EXDEV => ToolError::OutsideRoots {
                path: self.raw.clone(),
            },
            e => self.io(op, std::io::Error::from(e)),
        }
    }

    /// Opens the pinned canonical root (`O_NOFOLLOW`: a symlink put in its
    /// place is not followed) and checks it is the pinned directory.
    fn open_root(&self) -> Result<OwnedFd, ToolError> {
        let changed = || ToolError::RootChanged {
            root: self.root.display().to_string(),
        };
        let fd = nix::fcntl::open(
            &self.pin.canonical,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::ELOOP | Errno::ENOTDIR | Errno::ENOENT => changed(),
            e => self.io("open", std::io::Error::from(e)),
        })?;
        let stat =
            nix::sys::stat::fstat(&fd).map_err(|e| self.io("stat", std::io::Error::from(e)))?;
        if stat.st_dev != self.pin.dev || stat.st_ino != self.pin.ino {
            return Err(changed());
        }
        Ok(fd)
    }

    /// The last component's directory (opened `O_PATH`) and its name; `None`
    /// when a directory on the way does not exist and `create` is off.
    /// `None` name: the path is the root itself.
    fn parent(
        &self,
        op: &str,
        create: bool,
    ) -> Result<Option<(OwnedFd, Option<OsString>)>, ToolError> {
        let root = self.open_root()?;
        let (dirs, name) = match self.rel.file_name() {
            Some(name) => (
                self.rel.parent().unwrap_or(Path::new("")),
                Some(name.to_owned()),
            ),
            None => (Path::new(""), None),
        };
        if dirs.as_os_str().is_empty() {
            return Ok(Some((root, name)));
        }
        if !self.walk_only {
            match openat2_dir(&root, dirs) {
                Ok(fd) => return Ok(Some((fd, name))),
                // No openat2 here: walk instead.
                Err(Errno::ENOSYS | Errno::EINVAL | Errno::EPERM) => {}
                Err(Errno::ENOENT) if create => {}
                Err(Errno::ENOENT) => return Ok(None),
                Err(e) => return Err(self.errno(op, e)),
            }
        }
        let mut dir = root;
        for component in dirs.components() {
            let Component::Normal(part) = component else {
                return Err(ToolError::OutsideRoots {
                    path: self.raw.clone(),
                });
            };
            dir = match self.step(&dir, part, op, create)? {
                Some(next) => next,
                None => return Ok(None),
            };
        }
        Ok(Some((dir, name)))
    }

    /// Opens directory `part` of `dir` without following a symlink
    /// (creating it with `create`); `None` if it does not exist.
    fn step(
        &self,
        dir: &OwnedFd,
        part: &OsStr,
        op: &str,
        create: bool,
    ) -> Result<Option<OwnedFd>, ToolError> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        for _ in 0..2 {
            match openat(dir, part, flags, Mode::empty()) {
                Ok(fd) => return Ok(Some(fd)),
                Err(Errno::ENOENT) if create => {
                    match nix::sys::stat::mkdirat(dir, part, Mode::from_bits_truncate(0o777)) {
                        // Made here or by someone else meanwhile: open it.
                        Ok(()) | Err(Errno::EEXIST) => continue,
                        Err(e) => return Err(self.errno(op, e)),
                    }
                }
                Err(Errno::ENOENT) => return Ok(None),
                Err(e @ (Errno::ENOTDIR | Errno::ELOOP)) => {
                    let link = fstatat(dir, part, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                        .is_ok_and(|s| Entry::of(&s) == Entry::Symlink);
                    return Err(if link {
                        self.errno(op, Errno::ELOOP)
                    } else {
                        self.errno(op, e)
                    });
                }
                Err(e) => return Err(self.errno(op, e)),
            }
        }
        Err(self.io(op, "a directory on the way keeps changing"))
    }

    /// What the path is now (`None`: it or a directory on the way does not
    /// exist), not following a symlink.
    ///
    /// # Errors
    /// [`ToolError::Symlink`] for a symlink on the way; I/O errors.
    pub fn entry(&self) -> Result<Option<Entry>, ToolError> {
        let Some((dir, name)) = self.parent("stat", false)? else {
            return Ok(None);
        };
        let Some(name) = name else {
            return Ok(Some(Entry::Other));
        };
        match fstatat(
            &dir,
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(stat) => Ok(Some(Entry::of(&stat))),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(self.errno("stat", e)),
        }
    }

    /// Opens the file for reading (`O_NOFOLLOW | O_NONBLOCK`: a FIFO cannot
    /// hang the call); the caller checks it is a regular file (`fstat`).
    ///
    /// # Errors
    /// [`ToolError::Symlink`], [`ToolError::NotAFile`] for the root itself,
    /// I/O errors (a missing file is `Io` with the OS message).
    pub fn open_read(&self) -> Result<std::fs::File, ToolError> {
        let Some((dir, name)) = self.parent("read", false)? else {
            return Err(self.io("read", std::io::Error::from(Errno::ENOENT)));
        };
        let Some(name) = name else {
            return Err(ToolError::NotAFile {
                path: self.raw.clone(),
            });
        };
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        openat(&dir, name.as_os_str(), flags, Mode::empty())
            .map(std::fs::File::from)
            .map_err(|e| self.errno("read", e))
    }

    /// Puts `text` at the path: creates missing directories (with
    /// `create_dirs`), writes a temporary file in the same directory and
    /// renames it over the name, keeping an existing file's permission bits
    /// (not set-id bits; the new file is owned by berth's user).
    /// Refuses a name that is a symlink, not a regular file, or a file with
    /// more than one hard link.
    ///
    /// # Errors
    /// [`ToolError::Symlink`], [`ToolError::NotAFile`],
    /// [`ToolError::HardLink`], I/O errors; the file is then unchanged.
    pub fn replace(&self, text: &[u8], create_dirs: bool) -> Result<(), ToolError> {
        let Some((dir, name)) = self.parent("write", create_dirs)? else {
            return Err(self.io("write", std::io::Error::from(Errno::ENOENT)));
        };
        let Some(name) = name else {
            return Err(ToolError::NotAFile {
                path: self.raw.clone(),
            });
        };
        let mode = match fstatat(
            &dir,
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(stat) => {
                self.replaceable(Entry::of(&stat))?;
                Some(Mode::from_bits_truncate(stat.st_mode & 0o777))
            }
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(self.errno("write", e)),
        };
        let temp = format!(
            ".berth-write-{}-{}.tmp",
            std::process::id(),
            TEMP.fetch_add(1, Ordering::Relaxed)
        );
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(&dir, temp.as_str(), flags, Mode::from_bits_truncate(0o666))
            .map_err(|e| self.errno("write", e))?;
        let written = (|| {
            if let Some(mode) = mode {
                nix::sys::stat::fchmod(fd.as_fd(), mode).map_err(std::io::Error::from)?;
            }
            let mut file = std::fs::File::from(fd);
            file.write_all(text)?;
            file.flush()?;
            nix::fcntl::renameat(&dir, temp.as_str(), &dir, name.as_os_str())
                .map_err(std::io::Error::from)
        })();
        written.map_err(|e| {
            let _ = nix::unistd::unlinkat(&dir, temp.as_str(), UnlinkatFlags::NoRemoveDir);
            self.io("write", e)
        })
    }

    /// `Ok` for an entry [`Beneath::replace`] may replace.
    ///
    /// # Errors
    /// [`ToolError::Symlink`], [`ToolError::NotAFile`], [`ToolError::HardLink`].
    pub fn replaceable(&self, entry: Entry) -> Result<(), ToolError> {
        let path = self.raw.clone();
        match entry {
            Entry::Symlink => Err(ToolError::Symlink { path }),
            Entry::Other => Err(ToolError::NotAFile { path }),
            Entry::File { links, .. } if links > 1 => Err(ToolError::HardLink { path, links }),
            Entry::File { .. } => Ok(()),
        }
    }

    /// Removes the file (a missing one is fine); never a directory. A
    /// symlink or hard link is removed as a name: what it points to is
    /// untouched.
    ///
    /// # Errors
    /// [`ToolError::Symlink`] for a symlink on the way; I/O errors.
    pub fn remove(&self) -> Result<(), ToolError> {
        let Some((dir, name)) = self.parent("remove", false)? else {
            return Ok(());
        };
        let Some(name) = name else {
            return Err(ToolError::NotAFile {
                path: self.raw.clone(),
            });
        };
        match nix::unistd::unlinkat(&dir, name.as_os_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(self.errno("remove", e)),
        }
    }
}

/// `openat2(root, dirs, O_PATH | O_DIRECTORY, RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`.
fn openat2_dir(root: &OwnedFd, dirs: &Path) -> Result<OwnedFd, Errno> {
    #[cfg(target_os = "linux")]
    {
        use nix::fcntl::{OpenHow, ResolveFlag};
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS,
            );
        // An interior NUL is no path (the walk reports it).
        if dirs.as_os_str().as_bytes().contains(&0) {
            return Err(Errno::EINVAL);
        }
        nix::fcntl::openat2(root, dirs, how)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (root, dirs);
        Err(Errno::ENOSYS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `openat` walk (the fallback where the kernel has no `openat2`)
    /// refuses symlink components and hard links as `openat2` does, and
    /// holds against a racing swap.
    #[test]
    fn the_walk_refuses_symlinks_and_holds_against_a_swap() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = root.path().canonicalize().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "SECRET").unwrap();
        std::fs::create_dir(r.join("d")).unwrap();
        std::fs::write(r.join("d/secret.txt"), "inside").unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("l")).unwrap();
        let ctx = ToolContext::new(r.clone());
        let at = |p: &str| {
            Beneath::locate(&ctx, &r.join(p).display().to_string())
                .unwrap()
                .walk_only()
        };
        assert!(matches!(
            at("l/secret.txt").open_read(),
            Err(ToolError::Symlink { .. })
        ));
        assert!(matches!(
            at("l/new/x").replace(b"x", true),
            Err(ToolError::Symlink { .. })
        ));
        std::fs::hard_link(outside.path().join("secret.txt"), r.join("hard")).unwrap();
        assert!(matches!(
            at("hard").replace(b"x", false),
            Err(ToolError::HardLink { links: 2, .. })
        ));
        at("made/deep/x.txt").replace(b"made", true).unwrap();
        assert_eq!(
            std::fs::read_to_string(r.join("made/deep/x.txt")).unwrap(),
            "made"
        );
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, r) = (Arc::clone(&stop), r.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    nix::fcntl::renameat2(
                        nix::fcntl::AT_FDCWD,
                        &r.join("d"),
                        nix::fcntl::AT_FDCWD,
                        &r.join("l"),
                        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                    )
                    .unwrap();
                }
            })
        };
        let (mut reads, mut writes) = (0, 0);
        // At least 300 rounds, and on until some of each got through (a
        // loaded machine may hold the swapper mid-swap for many rounds).
        for i in 0..20_000 {
            if i >= 300 && reads > 0 && writes > 0 {
                break;
            }
            if let Ok(mut file) = at("d/secret.txt").open_read() {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut file, &mut text).unwrap();
                assert_ne!(text, "SECRET", "a read escaped");
                reads += 1;
            }
            writes += usize::from(at(&format!("d/w{i}")).replace(b"x", false).is_ok());
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            1,
            "a write escaped"
        );
        assert!(
            reads > 0 && writes > 0,
            "{reads} reads, {writes} writes got through"
        );
    }
}
