//! How `berth serve` treats its heap: it keeps the memory it has used, and
//! touches a configured amount of it at start (`heap_pretouch_mib`), so a
//! burst of work — a thousand timers coming due in the same second, the
//! restart that re-arms them — runs on memory that is already mapped
//! instead of taking a page fault (and the kernel's zeroing of the page)
//! for each fresh 4 KiB it touches.
//!
//! Why: in a `perf` profile of `bench-sched`'s 1,000 × 1 s wake-ups
//! (issue 9), 8.7 % of berth's CPU during the wake-up burst was page
//! faults (≈ 5,400 of them, ≈ 22 MB of fresh heap), and mimalloc's default
//! purge delay (1 s in mimalloc 3) handed the memory freed by the
//! suspends back to the OS (`madvise`) just as the wake-ups came due, one
//! second later, so they faulted it in again. This is the JVM's
//! `-XX:+AlwaysPreTouch` and a retaining allocator (glibc's arenas keep
//! freed memory too): resident memory is the high-water mark, never less
//! than the pre-touched amount.

/// mimalloc's `mi_option_purge_delay` (`mimalloc.h`, `mi_option_e`; the
/// same index in mimalloc 2 and 3): how long freed memory stays before it
/// is returned to the OS, in ms; `-1` never.
#[cfg(not(feature = "system-allocator"))]
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// The default of `heap_pretouch_mib` (MiB): the journal's default page
/// cache (`journal_cache_mib`), which a busy server fills anyway.
pub const DEFAULT_PRETOUCH_MIB: u32 = 64;

/// The largest `heap_pretouch_mib` a config may ask for (MiB): a typo of a
/// few more digits must not pin the machine's memory at start.
pub const MAX_PRETOUCH_MIB: u32 = 16_384;

/// Tells the allocator to keep freed memory for reuse instead of returning
/// it to the OS (mimalloc's purge delay → never), unless the operator set
/// `MIMALLOC_PURGE_DELAY`, which then wins. A no-op with the system
/// allocator (`--features system-allocator`). Call once, at start, before
/// other threads exist (mimalloc's option setter is not thread-safe).
pub fn retain_freed_memory() {
    #[cfg(not(feature = "system-allocator"))]
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a plain integer in mimalloc's option table; called
        // from `main` before any other thread is started.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}

/// Touches `mib` MiB of heap (every byte written), then frees it, on a
/// thread of its own at `SCHED_IDLE` (it runs only when no other thread
/// wants a CPU, so it delays neither start-up nor a burst that comes first):
/// with [`retain_freed_memory`] the allocator keeps those pages mapped and
/// hands them out again, so the first `mib` MiB berth allocates after it do
/// not fault. Takes ≈ 50 ms of otherwise idle CPU for 64 MiB on a 2-core VM
/// (one fault and one zeroed page per 4 KiB), logged at debug. `0` does
/// nothing, and so does the system allocator (glibc would unmap blocks
/// this large at once). Leaves the process's resident memory at least
/// `mib` MiB for its lifetime. A refused `SCHED_IDLE` (not expected: it
/// lowers priority) is logged and the touching goes on at normal priority.
///
/// # Errors
/// The OS refused to start a thread; nothing was touched (berth runs on,
/// faulting its heap in as it grows).
pub fn pretouch_in_background(mib: u32) -> std::io::Result<()> {
    if mib == 0 || cfg!(feature = "system-allocator") {
        return Ok(());
    }
    std::thread::Builder::new()
        .name("berth-heap-pretouch".into())
        .spawn(move || {
            use thread_priority::unix::{
                set_thread_priority_and_policy, thread_native_id, NormalThreadSchedulePolicy,
                ThreadSchedulePolicy,
            };
            if let Err(e) = set_thread_priority_and_policy(
                thread_native_id(),
                thread_priority::ThreadPriority::Min,
                ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle),
            ) {
                tracing::warn!(error = ?e, "the heap pre-touch thread runs at normal priority");
            }
            let started = std::time::Instant::now();
            // 1 MiB blocks: below mimalloc's huge-object size, so each comes
            // from (and goes back to) the arena that later small-object
            // pages are cut from. A zeroed (`calloc`) vector would not write
            // (fresh pages read as zero) and so would touch nothing.
            let blocks: Vec<Vec<u8>> = (0..mib).map(|_| vec![0xa5_u8; 1 << 20]).collect();
            drop(std::hint::black_box(blocks));
            tracing::debug!(
                mib,
                took_ms = started.elapsed().as_millis() as u64,
                "heap pre-touched"
            );
        })
        .map(drop)
}
