//! Real-time priority for the threads that keep time.
//!
//! A burst of woken turns saturates the CPUs, and that is exactly when
//! wake-ups come due. A thread at normal priority that wakes for a due time
//! then waits for a time slice behind every runnable thread. Measured with
//! 10,000 sessions parked for 1 s on 2 cores, the scheduler handed wake-ups
//! out 6–45 ms late at p99 (`bench-sched`, "fire"). At the lowest real-time
//! priority (`SCHED_FIFO` 1) it runs as soon as it wakes: 1–3 ms.
//!
//! Only the two timekeeping threads ask for it: the scheduler and the node's
//! claimer. Both sleep between due times and do little per wake-up, so they
//! do not starve the rest. The kernel's real-time throttling (by default 95 %
//! of each second) bounds them besides.

use thread_priority::{
    set_thread_priority_and_policy, thread_native_id, RealtimeThreadSchedulePolicy, ThreadPriority,
    ThreadSchedulePolicy,
};

/// Moves the calling thread to the lowest real-time priority (`SCHED_FIFO`
/// priority 1).
///
/// # Errors
/// The OS refused, with why, as a sentence for the log. Unprivileged
/// processes get `EPERM`: it needs `CAP_SYS_NICE` or an `RLIMIT_RTPRIO` of
/// at least 1 (systemd `LimitRTPRIO=1`; Docker `--ulimit rtprio=1`). The
/// thread then keeps its normal priority.
pub fn raise_current_thread() -> Result<(), String> {
    set_thread_priority_and_policy(
        thread_native_id(),
        ThreadPriority::Min,
        ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo),
    )
    .map_err(|e| match e {
        thread_priority::Error::OS(code) => {
            let os = std::io::Error::from_raw_os_error(code);
            if os.kind() == std::io::ErrorKind::PermissionDenied {
                format!(
                    "{os}: real-time priority needs CAP_SYS_NICE or an RLIMIT_RTPRIO of at \
                     least 1 (systemd LimitRTPRIO=1, docker --ulimit rtprio=1), and a \
                     cgroup that grants real-time time"
                )
            } else {
                os.to_string()
            }
        }
        other => format!("{other:?}"),
    })
}

/// [`raise_current_thread`] when `wanted` (the `realtime_timers` setting):
/// `Ok(true)` raised, `Ok(false)` not asked, `Err` refused (why).
pub fn raise_current_thread_if(wanted: bool) -> Result<bool, String> {
    if wanted {
        raise_current_thread().map(|()| true)
    } else {
        Ok(false)
    }
}

/// Whether the calling thread runs at a real-time priority.
pub fn current_thread_is_realtime() -> bool {
    matches!(
        thread_priority::unix::thread_schedule_policy(),
        Ok(ThreadSchedulePolicy::Realtime(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raised_thread_is_real_time_and_a_refusal_leaves_it_as_it_was() {
        let (raised, realtime) = std::thread::spawn(|| {
            let raised = raise_current_thread();
            (raised, current_thread_is_realtime())
        })
        .join()
        .unwrap();
        match raised {
            Ok(()) => assert!(realtime, "raised, yet not real-time"),
            Err(why) => {
                assert!(!realtime, "refused ({why}), yet real-time");
                assert!(!why.is_empty());
            }
        }
    }
}
