//! The C allocator of the process a node runs in: glibc's malloc, which RocksDB allocates
//! its memtables and cached blocks from. Fewer arenas, and freed memory handed back to the
//! kernel, so that a node's resident memory follows its configured budget.
//!
//! glibc keeps what is freed on its arenas' free lists and gives back only the top of each
//! heap. A node's compactions and its filling block cache free memory in the middle of
//! them, and it stayed resident: one node holding 600,000 files of 1 KiB, with its cache
//! full, was 65 MiB smaller after a `malloc_trim` than before, its cache and memtables
//! unchanged. [`trim_loop`] gives those pages back every few seconds (10 by default);
//! [`tune`] caps the arenas (glibc's default is eight per core, one per contending thread;
//! two by default here). Both are `[storage]` settings. Owns nothing else. Builds on
//! another C library leave its allocator alone.
//!
//! Rust's own allocations do not go through it in the `talon` and `talon-meta` binaries,
//! whose global allocator is jemalloc (it hands freed pages back by itself, after a decay
//! time); a library user's process keeps whatever allocator it chose.

use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Caps the allocator's arenas at `arenas` (0: leaves its default); the threads that
/// already have one keep it. Called as a node opens (`[storage] malloc_arenas`).
pub fn tune(arenas: u32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if let Ok(arenas @ 1..) = libc::c_int::try_from(arenas) {
        #[expect(
            unsafe_code,
            reason = "glibc's mallopt, a call with no caller-side invariants"
        )]
        // SAFETY: mallopt sets one of the allocator's parameters under its own lock; a
        // value it does not accept is refused (it returns 0), and nothing else depends on
        // the result.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

/// Gives the pages the allocator holds free back to the kernel; true if any went back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn trim() -> bool {
    #[expect(
        unsafe_code,
        reason = "glibc's malloc_trim, a call with no caller-side invariants"
    )]
    // SAFETY: malloc_trim walks the allocator's own free lists under each arena's lock and
    // releases only pages no allocation uses.
    unsafe {
        libc::malloc_trim(0) != 0
    }
}

/// Without glibc there is nothing to trim.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() -> bool {
    false
}

/// Trims every `every` (`[storage] trim_every_ms`) until `cancel`, on a blocking thread: a
/// trim walks every arena and takes milliseconds on a heap of hundreds of MiB.
pub async fn trim_loop(every: Duration, cancel: CancellationToken) {
    if every.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {
                let started = std::time::Instant::now();
                let released = tokio::task::spawn_blocking(trim).await.unwrap_or(false);
                tracing::debug!(released, took = ?started.elapsed(), "trimmed the allocator");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory freed in the middle of the heap goes back: after a trim the process is
    /// resident for less than the pages it freed (glibc alone keeps them).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_trim_gives_freed_pages_back() {
        let resident = || {
            crate::tuning::ProcStatus::read("self")
                .bytes("RssAnon")
                .expect("RssAnon")
        };
        tune(2);
        // 64 MiB in 4 KiB blocks, written so that their pages are resident, then a block
        // above them all so that what is freed below is not the heap's top (which glibc
        // gives back by itself); then every block but one in 16 freed: runs of 60 KiB, whole
        // pages, free in the middle of the heap.
        let mut blocks: Vec<Vec<u8>> = (0..16_384).map(|i| vec![i as u8 | 1; 4096]).collect();
        let fence = vec![1u8; 4096];
        let before = resident();
        let mut i = 0;
        blocks.retain(|_| {
            i += 1;
            i % 16 == 0
        });
        let after_free = resident();
        trim();
        let after_trim = resident();
        assert!(
            after_trim + (32 << 20) < after_free,
            "resident {before} before, {after_free} after freeing, {after_trim} after the trim"
        );
        assert_eq!((blocks.len(), fence.len()), (1024, 4096));
    }
}
