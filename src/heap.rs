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
//! than the pre-touched amount. `MIMALLOC_PURGE_DELAY` (ms), when set,
//! wins: berth then neither changes mimalloc's purging nor pre-touches.
//! Under a memory cgroup limit (a container's), the pre-touch takes at
//! most a quarter of what the limit leaves.

use std::path::Path;

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
    if retains_freed_memory() {
        // SAFETY: sets a plain integer in mimalloc's option table; called
        // from `main` before any other thread is started.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}

/// Whether freed memory is kept for reuse: mimalloc with the purge delay
/// [`retain_freed_memory`] sets (the operator did not set
/// `MIMALLOC_PURGE_DELAY`). Without it a pre-touch would be handed back to
/// the OS soon after, so it is not done.
fn retains_freed_memory() -> bool {
    !cfg!(feature = "system-allocator") && std::env::var_os("MIMALLOC_PURGE_DELAY").is_none()
}

/// The heap pre-touch: a thread that writes `mib` MiB of heap (every byte)
/// and frees it, so that with [`retain_freed_memory`] the allocator keeps
/// those pages mapped and hands them out again: the first `mib` MiB berth
/// allocates after it do not fault. ≈ 50 ms of one core for 64 MiB on a
/// 2-core VM (a fault and a zeroed page per 4 KiB), logged at debug.
///
/// It runs at normal priority: at idle priority (`SCHED_IDLE`) a loaded
/// machine starved it for tens of seconds, and a process whose last thread
/// is starved takes seconds to exit (the kernel frees the address space in
/// the last thread to go). Dropping the `Pretouch` ends it between two
/// MiB, so shutdown does not wait for the rest. Resident memory stays at least the
/// amount touched for the process's lifetime; under a memory cgroup limit
/// (a container's, which the kernel enforces by killing the process) the
/// amount is lowered to a quarter of what the limit leaves, logged at info.
pub struct Pretouch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pretouch {
    /// Starts touching `mib` MiB on a thread named `berth-pretouch`. Does
    /// nothing (and dropping it returns at once) for `0`, with the
    /// system allocator (glibc unmaps blocks this large when they are
    /// freed), or when `MIMALLOC_PURGE_DELAY` is set (freed memory is
    /// returned). When the allocator refuses a block (an address-space
    /// limit, `ulimit -v`), touching stops there with a warning; berth
    /// runs on.
    ///
    /// # Errors
    /// The OS refused to start a thread; nothing is touched (the heap
    /// faults in as it grows).
    pub fn start(mib: u32) -> std::io::Result<Self> {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mib = if mib == 0 || !retains_freed_memory() {
            0
        } else {
            within_cgroup_headroom(mib)
        };
        if mib == 0 {
            return Ok(Self { stop, thread: None });
        }
        let stopped = std::sync::Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("berth-pretouch".into())
            .spawn(move || touch(mib, &stopped))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

/// `mib`, or less: at most [`HEADROOM_SHARE`]'s share of what the memory
/// cgroup's limits leave (logged at info when lowered).
fn within_cgroup_headroom(mib: u32) -> u32 {
    let Some(headroom) = cgroup_headroom(Path::new("/proc/self/cgroup"), Path::new(CGROUP_ROOT))
    else {
        return mib;
    };
    let share = headroom / HEADROOM_SHARE;
    if u64::from(mib) << 20 <= share {
        return mib;
    }
    let capped = u32::try_from(share >> 20).unwrap_or(u32::MAX);
    if capped == 0 {
        tracing::info!(
            configured_mib = mib,
            headroom_mib = headroom >> 20,
            "heap pre-touch skipped: a quarter of what the memory cgroup's limit leaves is under 1 MiB"
        );
    } else {
        tracing::info!(
            configured_mib = mib,
            pretouch_mib = capped,
            headroom_mib = headroom >> 20,
            "heap_pretouch_mib lowered to a quarter of what the memory cgroup's limit leaves"
        );
    }
    capped
}

/// Where the cgroup filesystems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The pre-touch takes at most this share (1/N) of the memory a cgroup
/// limit leaves: the rest is for the work it is there to speed up.
const HEADROOM_SHARE: u64 = 4;

/// Bytes this process's memory cgroup may still grow by before the kernel
/// kills something: at every level from its cgroup up to the hierarchy's
/// root that has a limit, the limit less that level's usage (which counts
/// every process below it, a sidecar's too), and the smallest of those.
/// `None`: no limit anywhere (`max`, or v1's near-`u64::MAX` "unlimited"),
/// or no cgroup to read. Reads cgroup v2 (`0::<path>`, `memory.max`,
/// `memory.current`) and v1 (`N:memory:<path>`, `memory.limit_in_bytes`,
/// `memory.usage_in_bytes`, under `memory/`); inside a cgroup namespace the
/// path is `/`, the container's own cgroup at the mount's root.
/// `proc_cgroup` is `/proc/self/cgroup`, `root` the mount point
/// (parameters for tests).
fn cgroup_headroom(proc_cgroup: &Path, root: &Path) -> Option<u64> {
    let listing = std::fs::read_to_string(proc_cgroup).ok()?;
    let (dir, limit_file, usage_file) = listing.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let path = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            Some((
                root.join("memory").join(path),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            ))
        } else if controllers.is_empty() && root.join(path).join("memory.max").exists() {
            Some((root.join(path), "memory.max", "memory.current"))
        } else {
            None
        }
    })?;
    let read = |file: &Path| -> Option<u64> {
        let text = std::fs::read_to_string(file).ok()?;
        // v1 writes "unlimited" as the largest page-aligned i64.
        text.trim().parse::<u64>().ok().filter(|&b| b < 1 << 60)
    };
    let mut headroom: Option<u64> = None;
    let mut level = dir.as_path();
    while level.starts_with(root) {
        if let Some(limit) = read(&level.join(limit_file)) {
            let left = limit.saturating_sub(read(&level.join(usage_file)).unwrap_or(0));
            headroom = Some(headroom.map_or(left, |h| h.min(left)));
        }
        match level.parent() {
            Some(parent) => level = parent,
            None => break,
        }
    }
    headroom
}

/// Ends the touching after the MiB in progress and waits for the thread
/// (which frees what it touched: kept by the allocator, so cheap) — on
/// every way out of `serve`, an early error included.
impl Drop for Pretouch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::warn!("the heap pre-touch thread panicked");
            }
        }
    }
}

/// Writes `mib` 1 MiB blocks, then frees them. 1 MiB blocks are above
/// mimalloc 3's largest size class (512 KiB), so each is a page of its own
/// cut from the arena, and goes back to the arena when freed, where the
/// small-object pages of every thread are cut from. A zeroed (`calloc`)
/// vector would not write (fresh pages read as zero) and so would touch
/// nothing.
fn touch(mib: u32, stop: &std::sync::atomic::AtomicBool) {
    const BLOCK: usize = 1 << 20;
    let started = std::time::Instant::now();
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        let mut block = Vec::new();
        if block.try_reserve_exact(BLOCK).is_err() || blocks.try_reserve(1).is_err() {
            tracing::warn!(
                touched_mib = blocks.len(),
                wanted_mib = mib,
                "the heap pre-touch stopped: the allocator has no more memory to give"
            );
            break;
        }
        block.resize(BLOCK, 0xa5);
        blocks.push(block);
    }
    let touched = blocks.len();
    drop(std::hint::black_box(blocks));
    tracing::debug!(
        mib = touched,
        took_ms = started.elapsed().as_millis() as u64,
        "heap pre-touched"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn v2_headroom_is_the_least_any_limit_up_the_tree_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let (proc_cgroup, root) = (dir.path().join("cgroup"), dir.path().join("fs"));
        write(&proc_cgroup, "0::/box/app\n");
        // A parent's usage counts everything below it.
        write(&root.join("box/app/memory.max"), "max\n");
        write(
            &root.join("box/app/memory.current"),
            &format!("{}\n", 100 << 20),
        );
        write(
            &root.join("box/memory.current"),
            &format!("{}\n", 100 << 20),
        );
        assert_eq!(
            cgroup_headroom(&proc_cgroup, &root),
            None,
            "no limit anywhere"
        );
        write(&root.join("box/memory.max"), &format!("{}\n", 512 << 20));
        assert_eq!(cgroup_headroom(&proc_cgroup, &root), Some(412 << 20));
        write(
            &root.join("box/app/memory.max"),
            &format!("{}\n", 200 << 20),
        );
        assert_eq!(cgroup_headroom(&proc_cgroup, &root), Some(100 << 20));
        // A sibling under the parent's limit uses most of it: what the
        // parent's limit leaves decides, not berth's own usage.
        write(
            &root.join("box/memory.current"),
            &format!("{}\n", 496 << 20),
        );
        assert_eq!(cgroup_headroom(&proc_cgroup, &root), Some(16 << 20));
        write(&root.join("box/memory.current"), "999999999999\n");
        assert_eq!(
            cgroup_headroom(&proc_cgroup, &root),
            Some(0),
            "over a limit: nothing left"
        );
    }

    #[test]
    fn v1_headroom_reads_the_memory_controller_and_ignores_unlimited() {
        let dir = tempfile::tempdir().unwrap();
        let (proc_cgroup, root) = (dir.path().join("cgroup"), dir.path().join("fs"));
        write(&proc_cgroup, "5:cpu,cpuacct:/x\n4:memory:/jobs/7\n0::/\n");
        write(
            &root.join("memory/jobs/7/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        write(
            &root.join("memory/jobs/7/memory.usage_in_bytes"),
            "1048576\n",
        );
        assert_eq!(cgroup_headroom(&proc_cgroup, &root), None, "v1's unlimited");
        write(
            &root.join("memory/jobs/7/memory.limit_in_bytes"),
            "268435456\n",
        );
        assert_eq!(
            cgroup_headroom(&proc_cgroup, &root),
            Some((256 << 20) - (1 << 20))
        );
        assert_eq!(cgroup_headroom(&dir.path().join("absent"), &root), None);
    }
}
