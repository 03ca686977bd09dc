//! Every process berth starts for a session runs under a supervisor of its
//! own, so a stop reaches the processes that left the process group
//! (`setsid`, a double fork) too.
//!
//! [`spawn`] forks the supervisor from the spawned child before it execs (in
//! `pre_exec`): the supervisor marks itself a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`), forks the command, and then only reaps. Every
//! process the command starts is therefore its descendant for as long as it
//! lives — an orphan is re-parented to the supervisor, not to init — and the
//! supervisor lives until the last of them is gone, so orphans of a call stay
//! attributed to it after the shell exits. The command's wait status goes to
//! berth over a pipe as it exits ([`Supervised::status`]), so a call ends when
//! its shell does. [`kill_tree`] kills a supervisor's descendants (walking
//! `/proc`, again until none remain) and then the supervisor.
//!
//! The supervisor runs between `fork` and `exec` of a multi-threaded process,
//! so it makes only async-signal-safe system calls (no allocation, no locks).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Mutex;

use nix::fcntl::OFlag;
use nix::libc;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;

/// The supervisors this process started, by pid → start time (`/proc/<pid>/stat`
/// field 22, so a reused pid is not mistaken for one), for
/// [`is_in_tool_tree`]. Entries whose process is gone are pruned as new ones
/// are added.
static LIVE: Mutex<Vec<(i32, u64)>> = Mutex::new(Vec::new());

/// `/proc/<pid>/stat`'s start time (field 22, clock ticks since boot).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn register(pid: i32) {
    let Some(started) = start_time(pid) else {
        return;
    };
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|&(p, s)| is_running(p) && start_time(p) == Some(s));
    live.push((pid, started));
}

/// Whether `pid` is a live supervisor this process started or descends from
/// one: a process a tool call started (an orphan too — the supervisor is a
/// subreaper, so it stays the orphan's ancestor). Walks the parent chain in
/// `/proc`; a process that is gone counts as outside.
pub fn is_in_tool_tree(pid: i32) -> bool {
    let live: Vec<(i32, u64)> = LIVE.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if live.is_empty() {
        return false;
    }
    let own = std::process::id() as i32;
    let mut current = pid;
    // Bounded: a parent chain is far shorter than this.
    for _ in 0..4096 {
        if current <= 1 || current == own {
            return false;
        }
        if live
            .iter()
            .any(|&(p, s)| p == current && start_time(p) == Some(s))
        {
            return true;
        }
        let Some((_, parent)) = std::fs::read_to_string(format!("/proc/{current}/stat"))
            .ok()
            .and_then(|s| state_and_parent(&s))
        else {
            return false;
        };
        current = parent;
    }
    false
}

/// A supervised command.
#[derive(Debug)]
pub struct Supervised {
    /// The supervisor's pid (also its process group id).
    pub pid: i32,
    /// The supervisor (reaped by tokio once it exits, after this is dropped).
    pub child: tokio::process::Child,
    status: tokio::net::unix::pipe::Receiver,
}

impl Supervised {
    /// The command's wait status when it exits; `None` when the supervisor
    /// died first (it was killed: a stop or a timeout).
    pub async fn status(&mut self) -> Option<ExitStatus> {
        let mut raw = [0u8; 4];
        self.status.read_exact(&mut raw).await.ok()?;
        Some(ExitStatus::from_raw(i32::from_ne_bytes(raw)))
    }
}

/// Spawns `command` under a supervisor (see the [module docs](self)) in a new
/// process group. Its stdio and environment are the command's.
///
/// # Errors
/// The pipe, the fork or the spawn failed.
pub fn spawn(command: &mut tokio::process::Command) -> io::Result<Supervised> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let status_fd = write.as_raw_fd();
    // Built here, per spawn (entries created since the last one are
    // covered); only applied in the child. Close-on-exec; the supervisor
    // closes it with every other fd.
    let ruleset = confinement();
    let ruleset_fd = ruleset.as_ref().map_or(-1, AsRawFd::as_raw_fd);
    // SAFETY: the closure makes only async-signal-safe calls (see
    // `supervise`), as code between fork and exec must.
    unsafe {
        command.pre_exec(move || {
            if ruleset_fd >= 0 {
                restrict_self(ruleset_fd)?;
            }
            become_supervisor(status_fd)
        });
    }
    let child = command.process_group(0).kill_on_drop(false).spawn()?;
    drop::<OwnedFd>(write);
    drop(ruleset);
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| io::Error::other("the supervisor has no pid"))?;
    register(pid);
    let status = tokio::net::unix::pipe::Receiver::from_owned_fd(read)?;
    Ok(Supervised { pid, child, status })
}

/// Paths no supervised process may reach ([`confine_from`]), canonical.
static DENIED: Mutex<Vec<std::path::PathBuf>> = Mutex::new(Vec::new());

/// Confines every process [`spawn`] starts from now on away from `paths`
/// (berth's data dir, a key file outside it) with Landlock: the ruleset
/// grants full access beneath every entry of each ancestor of a path except
/// the one on the way to it, so the path and everything beneath it is
/// unreachable, and so is creating or listing entries directly in its
/// ancestors. A path whose parent does not exist is skipped. Returns whether the
/// kernel enforces it (`false`: no Landlock; processes run unconfined).
pub fn confine_from(paths: &[std::path::PathBuf]) -> bool {
    // A path not created yet (a first start) is its parent's canonical form
    // joined with its name.
    let canonical: Vec<_> = paths
        .iter()
        .filter_map(|p| {
            let p = std::path::absolute(p).ok()?;
            std::fs::canonicalize(&p).ok().or_else(|| {
                let parent = std::fs::canonicalize(p.parent()?).ok()?;
                Some(parent.join(p.file_name()?))
            })
        })
        .collect();
    *DENIED.lock().unwrap_or_else(|e| e.into_inner()) = canonical;
    confinement().is_some()
}

/// The Landlock ruleset fd for [`DENIED`], `None` when nothing is denied or
/// the kernel has no Landlock.
fn confinement() -> Option<OwnedFd> {
    use landlock::{
        Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr, ABI,
    };
    let denied = DENIED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if denied.is_empty() {
        return None;
    }
    let all = AccessFs::from_all(ABI::V6);
    let mut allowed = Vec::new();
    for path in &denied {
        for ancestor in path.ancestors().skip(1) {
            let Ok(entries) = std::fs::read_dir(ancestor) else {
                continue;
            };
            for entry in entries.flatten() {
                let entry = entry.path();
                // Not the way to a denied path, nor a symlink leading there.
                let target = std::fs::canonicalize(&entry).unwrap_or_else(|_| entry.clone());
                let leads_in = denied.iter().any(|d| {
                    d.starts_with(&entry) || d.starts_with(&target) || target.starts_with(d)
                });
                if !leads_in {
                    allowed.push(entry);
                }
            }
        }
    }
    // An entry allowed beneath one ancestor may be another denied path's
    // ancestor: drop those too.
    allowed.retain(|a| !denied.iter().any(|d| d.starts_with(a)));
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .ok()?
        .create()
        .ok()?
        .add_rules(landlock::path_beneath_rules(&allowed, all))
        .ok()?;
    Option::<OwnedFd>::from(ruleset)
}

/// In the forked child: `no_new_privs` and the prepared Landlock ruleset,
/// two system calls (nothing allocates between fork and exec).
fn restrict_self(ruleset_fd: RawFd) -> io::Result<()> {
    // SAFETY: plain system calls on this process.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_landlock_restrict_self, ruleset_fd, 0u32) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// In the forked child: becomes the subreaper and forks the command, which
/// returns to `exec`; the supervisor itself never returns.
fn become_supervisor(status_fd: RawFd) -> io::Result<()> {
    // SAFETY: plain system calls on this process.
    unsafe {
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        match libc::fork() {
            -1 => Err(io::Error::last_os_error()),
            // The command: `exec` follows; `status_fd` is close-on-exec.
            0 => Ok(()),
            command => supervise(command, status_fd),
        }
    }
}

/// The supervisor's loop: reap every descendant, report the command's wait
/// status on `status_fd`, exit when none is left.
///
/// # Safety
/// Only in a child between fork and exec; never returns.
unsafe fn supervise(command: libc::pid_t, status_fd: RawFd) -> ! {
    // SAFETY: async-signal-safe calls only.
    unsafe {
        // berth's handlers are not ours (their fds are closed below).
        for signal in [
            libc::SIGCHLD,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
        ] {
            libc::signal(signal, libc::SIG_DFL);
        }
        // berth gone (its end of the pipe closed) must not kill the
        // supervisor: its processes would leave for init.
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        close_all_but(status_fd);
        let mut reported = false;
        loop {
            let mut status: libc::c_int = 0;
            let pid = libc::waitpid(-1, &mut status, 0);
            if pid == command && !reported {
                let bytes = status.to_ne_bytes();
                libc::write(status_fd, bytes.as_ptr().cast(), bytes.len());
                libc::close(status_fd);
                reported = true;
            } else if pid < 0 && *libc::__errno_location() != libc::EINTR {
                // ECHILD: nothing left.
                break;
            }
        }
        libc::_exit(0)
    }
}

/// Closes every fd but `keep` (berth's pipes and sockets, the command's
/// stdio): the supervisor holds nothing open that a reader waits on.
unsafe fn close_all_but(keep: RawFd) {
    let keep = u32::try_from(keep).unwrap_or(0);
    // SAFETY: closing fds of this child only.
    unsafe {
        let low = keep == 0 || libc::syscall(libc::SYS_close_range, 0u32, keep - 1, 0u32) == 0;
        let high = libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32) == 0;
        if !(low && high) {
            // No close_range (Linux < 5.9): one at a time.
            let max = libc::sysconf(libc::_SC_OPEN_MAX).clamp(1024, 65_536) as u32;
            for fd in (0..max).filter(|&fd| fd != keep) {
                libc::close(fd as libc::c_int);
            }
        }
    }
}

/// `/proc/<pid>/stat`'s state (field 3) and parent (field 4).
fn state_and_parent(stat: &str) -> Option<(char, i32)> {
    // The command name (field 2) may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

/// Whether `pid` runs (exists and is not a zombie).
pub fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| state_and_parent(&s))
        .is_some_and(|(state, _)| state != 'Z')
}

/// The running (not zombie) descendants of `root`, from one pass over `/proc`.
pub fn descendants(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if let Some((state, parent)) = state_and_parent(&stat) {
            if state != 'Z' {
                children.entry(parent).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            out.push(child);
            todo.push(child);
        }
    }
    out
}

/// Kills every descendant of supervisor `root`, repeating until none is left
/// (one that forked meanwhile, or whose children were re-parented to the
/// supervisor as their parent died), then `root` and its process group.
/// Returns whether `root` was still running.
pub fn kill_tree(root: i32) -> bool {
    if root <= 1 {
        return false;
    }
    let running = is_running(root);
    if running {
        // A bound against a fork bomb outrunning the walk; each pass kills
        // every process it sees.
        for _ in 0..1000 {
            let found = descendants(root);
            if found.is_empty() {
                break;
            }
            for pid in found {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        let _ = kill(Pid::from_raw(root), Signal::SIGKILL);
    }
    let group = killpg(Pid::from_raw(root), Signal::SIGKILL).is_ok();
    running || group
}
