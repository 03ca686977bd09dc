//! The process groups a session started, so cancel can reach them.
//!
//! Every `shell` call runs in a new process group whose id is registered here.
//! A backgrounded child (`sleep 60 &`) stays in that group after the call
//! returns, so the group stays registered until it is empty or killed;
//! `session/cancel` and `session/close` kill every registered group
//! (`remote-session-control.md`, "Stop": processes the session started are killed).

use std::collections::BTreeSet;
use std::sync::Mutex;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The live process groups of one session.
#[derive(Debug, Default)]
pub struct ProcessGroups {
    groups: Mutex<BTreeSet<i32>>,
}

impl ProcessGroups {
    /// Registers a process group id (the leader's pid).
    pub fn register(&self, pgid: i32) {
        self.lock().insert(pgid);
    }

    /// Sends SIGKILL to every registered group and forgets them. Returns how
    /// many groups were still alive.
    pub fn kill_all(&self) -> usize {
        let groups = std::mem::take(&mut *self.lock());
        groups
            .into_iter()
            .filter(|&pgid| killpg(Pid::from_raw(pgid), Signal::SIGKILL).is_ok())
            .count()
    }

    /// Forgets groups that have no members left. Returns how many are alive.
    pub fn prune(&self) -> usize {
        let mut groups = self.lock();
        groups.retain(|&pgid| killpg(Pid::from_raw(pgid), None).is_ok());
        groups.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<i32>> {
        // A poisoned set is still a correct set of pids.
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }
}
