//! The scheduler thread's real-time priority, seen from outside: the policy
//! the kernel reports for the thread named `berth-scheduler`. Its own test
//! binary, so that no other test's scheduler thread shares the name.

use std::sync::Arc;

use berth_runtime::clock::SystemClock;
use berth_scheduler::Scheduler;

/// The scheduling policy of this process's thread named `name`
/// (`/proc/self/task/TID/stat`, field 41: 0 normal, 1 `SCHED_FIFO`).
fn policy_of(name: &str) -> u32 {
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // The fields after the parenthesised command name (field 2, which
        // may hold spaces) start at field 3.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        return rest.split(' ').nth(41 - 3).unwrap().parse().unwrap();
    }
    panic!("no thread named {name}");
}

#[test]
fn a_scheduler_started_real_time_runs_fifo_when_the_os_allows_it() {
    let (_scheduler, _fired, raised) = Scheduler::start_with(Arc::new(SystemClock), true);
    let policy = policy_of("berth-scheduler");
    match raised {
        Ok(raised) => {
            assert!(raised, "asked for, so it is raised or refused");
            assert_eq!(policy, 1, "reported raised, yet not SCHED_FIFO");
        }
        Err(why) => assert_eq!(policy, 0, "reported refused ({why}), yet not normal"),
    }
}
