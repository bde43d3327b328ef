//! RocksDB settings shared by all of a node's stores (its Raft log and every partition's
//! state): one memtable budget for the node instead of a default 64 MiB per store, and one
//! read cache for the node instead of a default block cache per store.
//!
//! Owns the budget and each store's memtable size, derived from `[storage]` and the space
//! reserve, and the node's read cache (`[storage] cache_bytes`): the block cache of every
//! store, and the blob cache of the partitions' stores, where small-file bodies live, so
//! a dataset that fits in it is read from memory whatever the kernel's page cache holds.
//! Also whether RocksDB compacts the stores on its own: not while the disk is all but full,
//! and the node's account of its memory ([`Memory`]: RocksDB's share beside the process's).
//!
//! Bounding unflushed data matters beyond memory: RocksDB replays and flushes the log's WAL
//! when it opens, and openraft applies again what the partitions' stores had not flushed
//! (they keep no WAL), which needs room on disk for about that much, so a node on a full
//! disk restarts only if its unflushed data fits in what the reserve gives back (see
//! `crate::space`). Must not open stores itself.

use rocksdb::{BlockBasedOptions, Cache, Options, WriteBufferManager, DB};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The smallest memtable a store gets.
const MIN_WRITE_BUFFER: usize = 1 << 20;

/// Memtable sizes of a node's stores.
#[derive(Clone, Default)]
pub struct Tuning {
    /// The partitions' shared memtable budget; the Raft log's memtable is outside it (see
    /// [`Tuning::with_budget`]).
    budget: Option<WriteBufferManager>,
    /// Each store's memtable, the log's included.
    write_buffer_size: usize,
    cache: Option<Cache>,
    /// RocksDB's own compactions are off in every store while set (see
    /// [`Tuning::pause_compactions`]); shared by every clone.
    compactions_paused: Arc<AtomicBool>,
}

impl std::fmt::Debug for Tuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tuning(write buffers of {} bytes, {} cache)",
            self.write_buffer_size,
            if self.cache.is_some() {
                "a shared"
            } else {
                "the default"
            }
        )
    }
}

impl Tuning {
    /// A node-wide budget of `bytes` for all memtables. The Raft log's memtable is a
    /// quarter of it (at least 1 MiB) and its own; the partitions share the rest, and each
    /// one's memtable is also a quarter of the whole, so that writes to any partition flush
    /// before their sum runs over.
    ///
    /// The log is kept out of the partitions' budget because a shared budget flushes the
    /// store that writes when the sum runs over, not the one that holds the most: that was
    /// the log, written at every append, flushed a memtable of a megabyte or so at a time
    /// while the partitions held the budget. Each flush also starts a new WAL file, so the
    /// log's WAL files stayed too small to be written over (see
    /// `crate::raft_log::LogDb::open_gated`), and every append's sync extended a file.
    pub fn with_budget(bytes: u64) -> Tuning {
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        let quarter = (bytes / 4).max(MIN_WRITE_BUFFER);
        let shared = bytes.saturating_sub(quarter).max(MIN_WRITE_BUFFER);
        Tuning {
            budget: Some(WriteBufferManager::new_write_buffer_manager(shared, false)),
            write_buffer_size: quarter,
            cache: None,
            compactions_paused: Arc::default(),
        }
    }

    /// Turns RocksDB's automatic compactions off (`paused`) or on again for the stores
    /// opened from now on; true if that changed, and the caller then does the same to the
    /// stores already open ([`set_compactions`]). For a node whose disk is all but full
    /// (`crate::node::Node::space_round`), and while a node that starts on a full disk
    /// opens its stores: a compaction writes its whole output before it deletes its
    /// input, and with blob garbage collection it rewrites the bodies it holds, so there it
    /// takes the room that the node keeps for its log, and the log's next append (a vote,
    /// an entry) fails. The node's own reclaiming compaction (`crate::data`) claims its
    /// room first and still runs.
    pub fn pause_compactions(&self, paused: bool) -> bool {
        self.compactions_paused.swap(paused, Ordering::AcqRel) != paused
    }

    /// True while compactions are paused.
    pub fn compactions_paused(&self) -> bool {
        self.compactions_paused.load(Ordering::Acquire)
    }

    /// The same, with one cache of `bytes` for every store's blocks and the partitions'
    /// blobs (0: each store keeps RocksDB's default block cache and no blob cache).
    ///
    /// RocksDB's HyperClockCache, its table sized as entries come: its clock ages what was
    /// hit long ago, so a dataset read after another is served from the cache from its
    /// second uncached pass on. RocksDB's LRU cache keeps what was hit once in a half of its
    /// own, and a newly read dataset's bodies churn in the other half: its second uncached
    /// pass still came from the disk (bench/README.md).
    pub fn with_cache(mut self, bytes: u64) -> Tuning {
        if bytes > 0 {
            let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
            self.cache = Some(Cache::new_hyper_clock_cache(bytes, 0));
        }
        self
    }

    /// The memtable budget of a node: `configured`, but no more than a quarter of a
    /// non-zero `reserve` (at least 2 MiB): half of the restart share that a full node
    /// keeps (`crate::space::restart_share`), so what must be flushed at start-up fits in
    /// it with room to spare for what else opening writes (table, blob and manifest files
    /// of every store, memtables that filled while others flushed).
    pub fn budget_for(configured: u64, reserve: u64) -> u64 {
        if reserve == 0 {
            return configured;
        }
        configured.min((reserve / 4).max(2 * MIN_WRITE_BUFFER as u64))
    }

    /// Sets a partition store's options `o`: its memtable size and budget, its bloom
    /// filters and its block cache, and whether RocksDB compacts on its own.
    pub fn apply(&self, o: &mut Options) {
        if let Some(b) = &self.budget {
            o.set_write_buffer_manager(b);
        }
        self.apply_log(o);
    }

    /// Sets the Raft log's store's options `o`: those of [`Tuning::apply`] but the
    /// partitions' budget, so the log's memtable is its own.
    pub fn apply_log(&self, o: &mut Options) {
        o.set_disable_auto_compactions(self.compactions_paused());
        if self.write_buffer_size > 0 {
            o.set_write_buffer_size(self.write_buffer_size);
        }
        // A bloom filter per table file: a point read (an inode, a dentry, a body) skips the
        // files that cannot hold its key, and a create's "name absent" check does not read
        // an index block of every level-0 file once memtables have been flushed.
        let mut table = BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        if let Some(c) = &self.cache {
            table.set_block_cache(c);
            // Index and filter blocks count against the node's cache rather than growing
            // with the number of files; level 0's, read by every lookup, stay pinned.
            table.set_cache_index_and_filter_blocks(true);
            table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        }
        o.set_block_based_table_factory(&table);
    }

    /// Also caches `o`'s blobs (values kept in blob files: small-file bodies) in the
    /// node's cache. Not for the Raft log, whose blobs are read once, by a lagging peer.
    pub fn apply_blob_cache(&self, o: &mut Options) {
        if let Some(c) = &self.cache {
            o.set_blob_cache(c);
        }
    }
}

/// Where a node's memory goes, as RocksDB and the kernel count it, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident memory of the process now.
    pub resident: u64,
    /// The process's peak resident memory.
    pub peak_resident: u64,
    /// Memtables of every store (unflushed and being flushed).
    pub memtables: u64,
    /// Table readers outside the cache: what RocksDB keeps per open table file.
    pub table_readers: u64,
    /// The node's cache in use.
    pub cache: u64,
    /// The part of the cache pinned (in use by readers, or level 0's index and filter
    /// blocks), which it cannot evict.
    pub cache_pinned: u64,
}

impl Tuning {
    /// The memory of `dbs` (every store of the node) and of the node's cache, with the
    /// process's resident memory; RocksDB's figures are 0 where it cannot give them.
    pub fn memory(&self, dbs: &[&DB]) -> Memory {
        let (memtables, table_readers) =
            match rocksdb::perf::get_memory_usage_stats(Some(dbs), None) {
                Ok(s) => (s.mem_table_total, s.mem_table_readers_total),
                Err(_) => (0, 0),
            };
        let status = ProcStatus::read("self");
        Memory {
            resident: status.bytes("VmRSS").unwrap_or(0),
            peak_resident: status.bytes("VmHWM").unwrap_or(0),
            memtables,
            table_readers,
            cache: self.cache.as_ref().map_or(0, |c| c.get_usage() as u64),
            cache_pinned: self
                .cache
                .as_ref()
                .map_or(0, |c| c.get_pinned_usage() as u64),
        }
    }
}

/// A process's status as the kernel gives it (`/proc/<pid>/status`), for its memory
/// fields; empty where there is none (not Linux, no such process).
pub struct ProcStatus(String);

impl ProcStatus {
    /// The status of process `pid`, or of this one for `"self"`.
    pub fn read(pid: &str) -> ProcStatus {
        ProcStatus(std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default())
    }

    /// Memory field `field` (`VmRSS`, `VmHWM`, `RssAnon`, ...) in bytes, if given.
    pub fn bytes(&self, field: &str) -> Option<u64> {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    }
}

/// Turns RocksDB's automatic compactions of open store `db` off (`paused`) or on. The
/// change takes effect in memory even when RocksDB cannot then write its OPTIONS file (as
/// on a full disk): that file is a record no open here reads (every open passes its own
/// options), so that failure is not one.
pub fn set_compactions(db: &DB, paused: bool) -> Result<(), rocksdb::Error> {
    set_option(
        db,
        "disable_auto_compactions",
        if paused { "true" } else { "false" },
    )
}

/// Sets one of RocksDB's mutable options of open store `db`. As with
/// [`set_compactions`], the change holds in memory even when the OPTIONS file cannot be
/// written.
pub fn set_option(db: &DB, name: &str, value: &str) -> Result<(), rocksdb::Error> {
    match db.set_options(&[(name, value)]) {
        Err(e) if e.to_string().contains("Unable to persist options") => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_fits_in_half_the_restart_share() {
        assert_eq!(Tuning::budget_for(64 << 20, 256 << 20), 64 << 20);
        assert_eq!(Tuning::budget_for(128 << 20, 256 << 20), 64 << 20);
        assert_eq!(Tuning::budget_for(128 << 20, 16 << 20), 4 << 20);
        assert_eq!(Tuning::budget_for(128 << 20, 4 << 20), 2 << 20);
        assert_eq!(Tuning::budget_for(128 << 20, 1 << 20), 2 << 20);
        assert_eq!(Tuning::budget_for(128 << 20, 0), 128 << 20);
    }

    /// The Raft log's memtable is its own: partitions that hold the shared budget do not
    /// make the log's next append flush it (which would also start a new WAL file).
    #[test]
    fn the_log_keeps_its_memtable_while_the_partitions_hold_the_budget() {
        let dir = tempfile::tempdir().expect("temp dir");
        let tuning = Tuning::with_budget(16 << 20);
        let open = |name: &str, log: bool| {
            let mut o = Options::default();
            o.create_if_missing(true);
            if log {
                tuning.apply_log(&mut o);
            } else {
                tuning.apply(&mut o);
            }
            DB::open(&o, dir.path().join(name)).expect("open")
        };
        let value = [7u8; 1000];
        let partitions: Vec<DB> = (0..5).map(|p| open(&format!("p{p}"), false)).collect();
        for (p, db) in partitions.iter().enumerate() {
            for i in 0..2_400u32 {
                db.put((p as u32 * 10_000 + i).to_be_bytes(), value)
                    .expect("put");
            }
        }
        let log = open("log", true);
        for i in 0..3_000u32 {
            log.put(i.to_be_bytes(), value).expect("put");
        }
        let int = |name: &str| log.property_int_value(name).expect("property").unwrap_or(0);
        assert_eq!(int("rocksdb.num-files-at-level0"), 0, "the log was flushed");
        assert_eq!(
            int("rocksdb.num-immutable-mem-table"),
            0,
            "the log was flushed"
        );
        assert!(int("rocksdb.cur-size-active-mem-table") > 3_000_000);
    }

    /// A status field is read by its whole name, in bytes.
    #[test]
    fn a_status_field_is_read_by_its_whole_name() {
        let s = ProcStatus("VmRSSx:\t 9 kB\nVmRSS:\t  123 kB\nVmHWM:\t456 kB\n".into());
        assert_eq!(s.bytes("VmRSS"), Some(123 * 1024));
        assert_eq!(s.bytes("VmHWM"), Some(456 * 1024));
        assert_eq!(s.bytes("RssAnon"), None);
    }

    /// The report adds up a store's memtables and the shared cache, and reads the
    /// process's resident memory.
    #[test]
    fn memory_counts_memtables_cache_and_the_process() {
        let dir = tempfile::tempdir().expect("temp dir");
        let tuning = Tuning::with_budget(8 << 20).with_cache(4 << 20);
        let mut o = Options::default();
        o.create_if_missing(true);
        tuning.apply(&mut o);
        let db = DB::open(&o, dir.path()).expect("open");
        let before = tuning.memory(&[&db]);
        for i in 0..10_000u32 {
            db.put(i.to_be_bytes(), [7u8; 100]).expect("put");
        }
        db.flush().expect("flush");
        for i in 0..10_000u32 {
            assert!(db.get(i.to_be_bytes()).expect("get").is_some());
        }
        let m = tuning.memory(&[&db]);
        assert!(m.resident > 0 && m.peak_resident >= m.resident, "{m:?}");
        assert!(m.cache > before.cache, "{before:?} then {m:?}");
        assert!(m.cache <= 4 << 20, "{m:?}");
    }
}
