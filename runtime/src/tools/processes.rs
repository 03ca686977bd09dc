//! The process trees a session started, so cancel can reach them — even
//! across a crash of berth itself.
//!
//! Every `shell` call runs under a supervisor of its own (a child subreaper in
//! a new process group, see [`supervisor`](super::supervisor)) whose pid is
//! registered here. A backgrounded child (`sleep 60 &`, `setsid sleep 60 &`)
//! stays under that supervisor after the call returns, and the supervisor
//! lives until the last of them is gone, so the entry stays registered until
//! then or until it is killed; `session/cancel`, `session/close` and
//! `session/cancel_tool_call` kill every process under the registered
//! supervisors and the supervisors themselves ([`supervisor::kill_tree`])
//! (`remote-session-control.md`, "Stop": processes the session started are
//! killed).
//!
//! A [`ProcessLedger`] mirrors the registered groups as small files in the data
//! dir. If berth is killed, its children outlive it; at the next start-up
//! [`ProcessLedger::reap`] kills every tree still listed whose supervisor is the
//! same process (pid and start time match, so a reused pid is never hit). Plain
//! writes suffice: the ledger must survive the death of the berth process, not
//! of the machine (which takes the children with it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::sys::signal::killpg;
use nix::unistd::Pid;

use super::supervisor;

/// A registered tree: the tool call that started it, and its supervisor's
/// start time (a pid reused later is never killed).
type Entry = (Option<String>, Option<u64>);

/// The live process trees of one session, by supervisor pid.
#[derive(Debug, Default)]
pub struct ProcessGroups {
    /// supervisor pid (also its pgid) → its entry.
    groups: Mutex<BTreeMap<i32, Entry>>,
    ledger: Option<(Arc<ProcessLedger>, String)>,
    /// The session's roots as first seen: root as named → its pin.
    roots: Mutex<BTreeMap<PathBuf, RootPin>>,
}

/// A session root's identity, recorded the first time the session's tools
/// (or [`ProcessGroups::pin_roots`] at session start) see it: its canonical
/// path and the device and inode of the directory there. File tools open
/// the canonical path without following a symlink at any point of the last
/// component and compare the identity, so a root renamed away and replaced
/// (by a symlink or another directory) is refused rather than followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootPin {
    /// The root's canonical path when pinned.
    pub canonical: PathBuf,
    /// `st_dev` of the directory.
    pub dev: u64,
    /// `st_ino` of the directory.
    pub ino: u64,
}

impl ProcessGroups {
    /// Groups mirrored in `ledger` under the owner name `session` (a session id).
    pub fn with_ledger(ledger: Arc<ProcessLedger>, session: &str) -> Self {
        Self {
            groups: Mutex::default(),
            ledger: Some((ledger, session.to_owned())),
            roots: Mutex::default(),
        }
    }

    /// Pins each of `roots` that exists and is not pinned yet (see
    /// [`RootPin`]); the session does this when its actor starts.
    pub fn pin_roots<'a>(&self, roots: impl IntoIterator<Item = &'a PathBuf>) {
        for root in roots {
            let _ = self.root_pin(root);
        }
    }

    /// `root`'s pin, recorded now when this is its first use.
    ///
    /// # Errors
    /// The I/O error canonicalizing or statting a root not pinned yet.
    pub fn root_pin(&self, root: &Path) -> std::io::Result<RootPin> {
        use std::os::unix::fs::MetadataExt;
        let mut roots = self.roots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pin) = roots.get(root) {
            return Ok(pin.clone());
        }
        let canonical = std::fs::canonicalize(root)?;
        let meta = std::fs::symlink_metadata(&canonical)?;
        let pin = RootPin {
            canonical,
            dev: meta.dev(),
            ino: meta.ino(),
        };
        roots.insert(root.to_path_buf(), pin.clone());
        Ok(pin)
    }

    /// Registers a supervisor's pid (also its process group id) started by
    /// tool call `call` (if known).
    pub fn register(&self, pgid: i32, call: Option<&str>) {
        self.lock()
            .insert(pgid, (call.map(str::to_owned), start_time(pgid)));
        if let Some((ledger, session)) = &self.ledger {
            ledger.record(pgid, session);
        }
    }

    /// Kills every registered tree (SIGKILL) and forgets them. Returns how
    /// many were still alive.
    pub fn kill_all(&self) -> usize {
        let groups = std::mem::take(&mut *self.lock());
        groups
            .into_iter()
            .filter(|(pgid, (_, started))| {
                let alive = kill_recorded(*pgid, *started);
                self.forget(*pgid);
                alive
            })
            .count()
    }

    /// Kills the trees tool call `call` started and forgets them
    /// (`session/cancel_tool_call`). Returns how many were still alive.
    pub fn kill_call(&self, call: &str) -> usize {
        let mut groups = self.lock();
        let mine: Vec<(i32, Option<u64>)> = groups
            .iter()
            .filter(|(_, (c, _))| c.as_deref() == Some(call))
            .map(|(&pgid, (_, started))| (pgid, *started))
            .collect();
        mine.into_iter()
            .filter(|(pgid, started)| {
                groups.remove(pgid);
                let alive = kill_recorded(*pgid, *started);
                self.forget(*pgid);
                alive
            })
            .count()
    }

    /// Forgets trees whose supervisor has exited (nothing is left under it).
    /// Returns how many are alive.
    pub fn prune(&self) -> usize {
        let mut groups = self.lock();
        groups.retain(|&pgid, (_, started)| {
            let alive = is_same(pgid, *started);
            if !alive {
                self.forget(pgid);
            }
            alive
        });
        groups.len()
    }

    fn forget(&self, pgid: i32) {
        if let Some((ledger, _)) = &self.ledger {
            ledger.forget(pgid);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, Entry>> {
        // A poisoned set is still a correct set of pids.
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for ProcessGroups {
    /// Whoever held the groups is gone (the session actor stopped or failed):
    /// nothing it started may keep running unreachable.
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Whether `pid` is still the running process that started at `started`.
fn is_same(pid: i32, started: Option<u64>) -> bool {
    supervisor::is_running(pid) && started.is_some_and(|s| start_time(pid) == Some(s))
}

/// Kills the tree under supervisor `pid` if it is still the recorded
/// process, and its group (whose id is not handed out again while the group
/// has members). Returns whether anything was alive.
fn kill_recorded(pid: i32, started: Option<u64>) -> bool {
    if pid <= 1 {
        return false;
    }
    if is_same(pid, started) {
        supervisor::kill_tree(pid)
    } else {
        killpg(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).is_ok()
    }
}

/// Process trees started by this berth, one file per supervisor in a
/// directory: `<pid>` containing `<start time> <owner>`.
#[derive(Debug)]
pub struct ProcessLedger {
    dir: PathBuf,
}

/// The leader's start time (clock ticks since boot, `/proc/<pid>/stat` field 22),
/// which tells a live process from a later one that reused its pid.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after it follow ") ".
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the live group `pgid` is the one recorded with leader start time
/// `started`. Its leader may have exited (`sh` returns while `sleep &` lives
/// on): Linux does not hand a pid out again while a process group still uses
/// it as its id, so a group with members and no leader is still ours. A live
/// leader with another start time means the pid was reused: not ours.
fn is_recorded_group(pgid: i32, started: &str) -> bool {
    let Ok(started) = started.parse::<u64>() else {
        return false;
    };
    match start_time(pgid) {
        Some(now) => now == started,
        None => killpg(Pid::from_raw(pgid), None).is_ok(),
    }
}

/// Writes a ledger file: created 0600, never through a symlink planted in
/// its place (`O_NOFOLLOW`).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)?
        .write_all(bytes)
}

impl ProcessLedger {
    /// Opens (creating) the ledger directory, mode 0700; its files are 0600.
    ///
    /// # Errors
    /// I/O errors creating the directory.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    fn record(&self, pgid: i32, owner: &str) {
        let Some(started) = start_time(pgid) else {
            return;
        };
        if let Err(e) = write_private(
            &self.dir.join(pgid.to_string()),
            format!("{started} {owner}").as_bytes(),
        ) {
            tracing::warn!(pgid, error = %e, "cannot record a process group in the ledger");
        }
    }

    fn forget(&self, pgid: i32) {
        let _ = std::fs::remove_file(self.dir.join(pgid.to_string()));
    }

    /// Kills every listed tree (and group) whose supervisor is still the
    /// process that was recorded, and empties the ledger. Call once at start-up, before any
    /// session runs. Returns the owners of the groups killed.
    pub fn reap(&self) -> Vec<String> {
        let mut killed = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return killed;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let pgid = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse::<i32>().ok());
            let record = std::fs::read_to_string(&path).unwrap_or_default();
            let (started, owner) = record.split_once(' ').unwrap_or(("", ""));
            if let Some(pgid) = pgid.filter(|&p| p > 1) {
                if is_recorded_group(pgid, started) && supervisor::kill_tree(pgid) {
                    killed.push(owner.to_owned());
                }
            }
            let _ = std::fs::remove_file(&path);
        }
        killed
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    #[test]
    fn ledger_reaps_live_groups_and_skips_reused_pids() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Arc::new(ProcessLedger::open(dir.path()).unwrap());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id() as i32;
        let groups = ProcessGroups::with_ledger(Arc::clone(&ledger), "sess_1");
        groups.register(pgid, Some("call_1"));
        // A group whose leader exited but whose background child lives on.
        let out = std::process::Command::new("sh")
            .args(["-c", "sleep 30 >/dev/null 2>&1 & echo $!"])
            .process_group(0)
            .output()
            .unwrap();
        let orphan: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let orphan_group = nix::unistd::getpgid(Some(Pid::from_raw(orphan)))
            .unwrap()
            .as_raw();
        assert_ne!(orphan_group, orphan, "the child is not its group's leader");
        std::fs::write(dir.path().join(orphan_group.to_string()), "12345 sess_2").unwrap();
        // A stale record: right pid of some process, wrong start time.
        std::fs::write(dir.path().join("1"), "0 sess_stale").unwrap();
        std::mem::forget(groups); // as if berth died: no Drop, no cleanup
        let mut killed = ledger.reap();
        killed.sort();
        assert_eq!(killed, vec!["sess_1".to_owned(), "sess_2".to_owned()]);
        assert!(
            child.wait().is_ok_and(|s| !s.success()),
            "the group was killed"
        );
        let gone = (0..200).any(|_| {
            let stat = std::fs::read_to_string(format!("/proc/{orphan}/stat"));
            if stat.as_ref().map_or(true, |s| s.contains(") Z ")) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            false
        });
        assert!(gone, "the leaderless group's child was killed");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// The crash-time reap kills what left the process group too: a
    /// `setsid` child of a supervised command whose berth died.
    #[tokio::test]
    async fn the_reap_kills_setsid_children_of_a_dead_berth() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Arc::new(ProcessLedger::open(dir.path()).unwrap());
        let groups = ProcessGroups::with_ledger(Arc::clone(&ledger), "sess_1");
        let mut command = tokio::process::Command::new("sh");
        command
            .args(["-c", "setsid sleep 30 >/dev/null 2>&1 & echo $!"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped());
        let mut proc = supervisor::spawn(&mut command).unwrap();
        groups.register(proc.pid, Some("call_1"));
        let mut stdout = proc.child.stdout.take().unwrap();
        let status = proc.status().await.unwrap();
        assert!(status.success());
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut text)
            .await
            .unwrap();
        let orphan: i32 = text.trim().parse().unwrap();
        assert!(supervisor::is_running(orphan));
        assert!(
            supervisor::descendants(proc.pid).contains(&orphan),
            "still under the supervisor"
        );
        std::mem::forget(groups); // as if berth died: no Drop, no cleanup
        assert_eq!(ledger.reap(), vec!["sess_1".to_owned()]);
        let gone = (0..500).any(|_| {
            if !supervisor::is_running(orphan) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            false
        });
        assert!(gone, "the setsid child {orphan} was reaped");
    }
}
