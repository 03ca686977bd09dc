//! The data dir is private to the user berth runs as: the directory is
//! created 0700 and may not be writable by group or others, and every file
//! berth keeps in it is created 0600, opened with `O_NOFOLLOW` (a symlink
//! planted where a file should be is refused, its target untouched) and
//! must be a regular file owned by berth's effective uid. A file of ours
//! with wider bits (written by an older berth, or under a loose umask) is
//! narrowed to 0600 on open.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The effective uid berth runs as.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn refused(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, message)
}

/// Creates `dir` (0700, and its missing parents) unless it exists, then
/// checks it: a directory (not a symlink: one is refused, naming its
/// target) owned by berth's
/// user and not writable by group or others. Read or search bits for group
/// or others on a dir of ours are taken away (0700).
///
/// # Errors
/// I/O errors creating or reading it; [`io::ErrorKind::PermissionDenied`]
/// with what to do (`chmod 700 DIR`, or whose it is) when it is not private.
pub fn ensure_dir(dir: &Path) -> io::Result<()> {
    if std::fs::metadata(dir).is_err() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    check_dir(dir)
}

/// Checks an existing data dir as [`ensure_dir`] does (without creating it).
///
/// # Errors
/// As [`ensure_dir`].
pub fn check_dir(dir: &Path) -> io::Result<()> {
    if std::fs::symlink_metadata(dir)?.file_type().is_symlink() {
        let real = std::fs::canonicalize(dir)
            .map(|r| r.display().to_string())
            .unwrap_or_else(|_| "its target".into());
        return Err(refused(format!(
            "the data dir {} is a symlink (to {real}); berth does not follow one there, since \
             whoever owns the link chooses where berth's journal and keys go; \
             give the real path: --data-dir {real}",
            dir.display()
        )));
    }
    let meta = std::fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(refused(format!("{} is not a directory", dir.display())));
    }
    let me = euid();
    if meta.uid() != me {
        return Err(refused(format!(
            "the data dir {} belongs to uid {}, not to uid {me} that berth runs as; \
             use a data dir of your own (--data-dir), or `chown {me} {}`",
            dir.display(),
            meta.uid(),
            dir.display()
        )));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(refused(format!(
            "the data dir {} is writable by group or others (mode {mode:03o}): another user \
             could plant or replace its files; run `chmod 700 {}`",
            dir.display(),
            dir.display()
        )));
    }
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Opens `path` with `options` (its access and create flags), adding mode
/// 0600 for a file it creates and `O_NOFOLLOW | O_CLOEXEC`, then checks the
/// file: regular, owned by berth's user; wider mode bits are narrowed to
/// 0600.
///
/// # Errors
/// I/O errors opening it (`ELOOP` for a symlink is reported as one);
/// [`io::ErrorKind::PermissionDenied`] for a file that is not a regular
/// file or belongs to another user.
pub fn open(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    let file = open_unchecked(path, options)?;
    check_file(path, &file, true)?;
    Ok(file)
}

/// Opens `path` read-only as [`open`] does, checking it the same way but
/// changing nothing (for `berth verify` and `replay`, which leave the data
/// dir as they found it).
///
/// # Errors
/// As [`open`].
pub fn open_read_only(path: &Path) -> io::Result<File> {
    let file = open_unchecked(path, OpenOptions::new().read(true))?;
    check_file(path, &file, false)?;
    Ok(file)
}

fn open_unchecked(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    options
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_CLOEXEC.bits())
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(nix::libc::ELOOP) {
                refused(format!(
                    "{} is a symlink where berth keeps a file of its own; it is not followed \
                     (remove the link)",
                    path.display()
                ))
            } else {
                e
            }
        })
}

/// Checks an open file of the data dir: regular, owned by berth's user;
/// narrowed to 0600 when `narrow`.
fn check_file(path: &Path, file: &File, narrow: bool) -> io::Result<()> {
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refused(format!(
            "{} is not a regular file; berth keeps a file of its own there (move it away)",
            path.display()
        )));
    }
    let me = euid();
    if meta.uid() != me {
        return Err(refused(format!(
            "{} belongs to uid {}, not to uid {me} that berth runs as: another user put it \
             there; remove it (or `chown {me}` it if it is yours)",
            path.display(),
            meta.uid()
        )));
    }
    if narrow && meta.permissions().mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// Reads the whole of a file of the data dir (opened as [`open_read_only`]
/// does).
///
/// # Errors
/// As [`open`], and read errors.
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = open_read_only(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_created_0600_and_symlinks_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        ensure_dir(&data).unwrap();
        let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let path = data.join("f");
        open(&path, OpenOptions::new().write(true).create(true)).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "keep").unwrap();
        std::os::unix::fs::symlink(&outside, data.join("link")).unwrap();
        let e = open(
            &data.join("link"),
            OpenOptions::new().write(true).truncate(true),
        )
        .unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_dir(&data).unwrap_err();
        assert!(e.to_string().contains("chmod 700"), "{e}");
    }
}
