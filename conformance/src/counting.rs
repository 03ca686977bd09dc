//! A global allocator that counts the live heap bytes of its process,
//! exactly: the system allocator, wrapped. A benchmark or a footprint test
//! installs it in its own binary and reads [`live_bytes`] before and after
//! what it measures:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: berth_conformance::counting::Counting = berth_conformance::counting::Counting;
//! ```
//!
//! Only the bytes asked for are counted (not the allocator's own overhead),
//! so figures are what the code holds, independent of the allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// The system allocator, counting the bytes currently allocated.
pub struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

/// Bytes allocated and not yet freed through [`Counting`] (0 when it is not
/// the process's global allocator).
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

fn add(bytes: usize) {
    LIVE_BYTES.fetch_add(
        isize::try_from(bytes).unwrap_or(isize::MAX),
        Ordering::Relaxed,
    );
}

fn sub(bytes: usize) {
    LIVE_BYTES.fetch_sub(
        isize::try_from(bytes).unwrap_or(isize::MAX),
        Ordering::Relaxed,
    );
}

// SAFETY: every call is forwarded unchanged to `System`; the counter is only
// arithmetic on the sizes the caller passed.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        sub(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            sub(layout.size());
            add(new_size);
        }
        p
    }
}
