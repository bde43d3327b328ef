//! A partition replica's state machine: one RocksDB instance per partition replica.
//!
//! Owns the namespace state of one partition (see `keys.rs` for the schema) and implements
//! openraft's `RaftStateMachine`. The applied log id and membership are written in the same
//! WriteBatch as the state they produced, so replaying entries after a crash is harmless:
//! apply resumes after the stored applied id. The state machine writes without a WAL of its
//! own: a crash loses what its memtable held, and openraft applies that again from the
//! fsynced Raft log, which keeps every entry after the stored snapshot.
//!
//! Snapshots are RocksDB checkpoints (hard links of the SST files), packed into one data
//! file (`archive.rs`) that is sent and received in chunks and unpacked with bounded
//! memory; installing one unpacks it into a fresh directory, opens it and swaps it in. The
//! record `snapshot.bin` names the current data file; data files it does not name are
//! removed.
//! Readers hold an `Arc<DB>` of the instance they started with, so a swap never pulls data
//! from under a read. The directory `CURRENT_DB` names the live instance.

use crate::apply::Applier;
use crate::keys::{self, meta};
use crate::kv::Overlay;
use crate::raft_log::SnapshotMark;
use crate::records::{dec, enc, storage_error, Fatal, InodeRec};
use crate::resident::Resident;
use crate::types::{CommandResult, NodeId, StorageError, TypeConfig};
use crate::view::View;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{
    AnyError, EntryPayload, ErrorSubject, ErrorVerb, LogId, RaftLogId, Snapshot, SnapshotMeta,
    StorageIOError, StoredMembership,
};
use rocksdb::{Options, WriteBatch, DB};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use talon_model::{attr::Attr, Class, FileKind, Ino, Layout, TalonError, Time, ROOT_INO};

type Membership = StoredMembership<NodeId, openraft::BasicNode>;

/// One entry of a readdir page: name and dentry.
pub type DirPageEntry = (Vec<u8>, crate::records::Dentry);

fn io_err(
    subject: ErrorSubject<NodeId>,
    verb: ErrorVerb,
    e: impl std::error::Error + 'static,
) -> StorageError {
    StorageIOError::new(subject, verb, AnyError::new(&e)).into()
}

fn fatal(verb: ErrorVerb, e: Fatal) -> StorageError {
    io_err(ErrorSubject::StateMachine, verb, e)
}

/// Whether RocksDB's own compactions move live bodies out of old blob files. They do not:
/// a blob file leaves the disk only once no key refers to it, so moving values is how
/// deleted bodies give their room back, but with it on (the oldest quarter of the files
/// eligible, RocksDB's default) every compaction of keys that point into those files
/// rewrote their bodies, deleted or not: importing a dataset wrote each body again and
/// again (bench/README.md). The node's reclaiming compaction turns it on, for every file,
/// while it runs, if the files hold enough garbage ([`SmStore::compact`]); it runs after
/// 2,000 deleted bodies or chunks on a partition, or enough deleted chunks (an eighth of its
/// store and a snapshot's worth of log), or after any while the disk is nearly full.
const AUTO_BLOB_GC: bool = false;

/// The share of the blob files' bytes that must be garbage (deleted values that a
/// compaction of the keys found) before the reclaiming compaction moves the live values
/// ([`SmStore::compact`]): at most an eighth of a store's blob bytes is then dead weight.
const RECLAIM_GARBAGE_SHARE: f64 = 0.125;

/// The garbage share of an eligible blob file past which RocksDB compacts the keys that
/// still point into it, while blob garbage collection is on.
const BLOB_GC_FORCE_THRESHOLD: f64 = 0.5;

/// The share of a memtable's size given to its bloom filter of whole keys.
const MEMTABLE_BLOOM_RATIO: f64 = 0.02;

/// RocksDB options of a state machine instance. Values of 4 KiB and more (small-file
/// bodies, chunks) go to BlobDB's blob files: large append-only segments with their own
/// garbage collection, run by compaction: not by RocksDB's own ([`AUTO_BLOB_GC`]), over
/// every file by the node's reclaiming compaction ([`SmStore::compact`]).
fn db_options(tuning: &crate::tuning::Tuning) -> Options {
    let mut o = Options::default();
    tuning.apply(&mut o);
    tuning.apply_blob_cache(&mut o);
    o.create_if_missing(true);
    o.set_max_background_jobs(2);
    o.set_keep_log_file_num(2);
    o.set_enable_blob_files(true);
    o.set_min_blob_size(4096);
    o.set_blob_file_size(256 << 20);
    o.set_enable_blob_gc(AUTO_BLOB_GC);
    o.set_blob_gc_age_cutoff(1.0);
    o.set_blob_gc_force_threshold(BLOB_GC_FORCE_THRESHOLD);
    // A bloom filter of whole keys in each memtable (allocated in the memtable, so inside
    // the node's memtable budget): most point reads of a change look for keys that are not
    // there (a create's name, a request id not seen before, a lock, an intent) and would
    // otherwise search each memtable's skip list to the bottom (bench/README.md).
    o.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
    o.set_memtable_whole_key_filtering(true);
    o
}

/// The storage of one partition replica's state, shared between the Raft state machine
/// (the only writer) and the read paths of the service.
pub struct SmStore {
    partition: u32,
    dir: PathBuf,
    db: RwLock<Arc<DB>>,
    /// Serializes snapshot building with installing.
    swap: Mutex<()>,
    /// Bodies and chunks deleted since the last compaction of this replica.
    deletes: std::sync::atomic::AtomicU64,
    /// Of those, chunks.
    deleted_chunks: std::sync::atomic::AtomicU64,
    /// Memtable sizes, for every instance this store opens.
    tuning: crate::tuning::Tuning,
    /// Fault injection: while set, applying fails with an I/O error (see
    /// [`SmStore::inject_write_errors`]).
    fail_writes: std::sync::atomic::AtomicBool,
    /// How far the stored snapshot reaches; the partition's log is never purged past it.
    mark: Arc<SnapshotMark>,
    /// The node's data file system, once the node watches it: a snapshot is built only when
    /// the memtable it writes out leaves the critical floor free, and a write that finds
    /// the disk full waits for room.
    space: std::sync::OnceLock<crate::space::Gate>,
    /// Snapshot data being read (sent to a follower), kept until its last reader is done.
    data_in_use: Arc<Mutex<DataInUse>>,
    /// How long this store's reads of file contents took lately, in µs (a moving average
    /// over the last eight or so): whether they come from memory or the disk (see
    /// [`SmStore::read_unblocking`]).
    read_us: std::sync::atomic::AtomicU64,
}

/// Reads of a store that lately took longer than this on average are taken for reads from
/// the disk, and moved off the caller's thread; quicker ones (memory or the OS page cache:
/// 5-30 µs for a body here) stay on it, where a move would cost more than the read.
const DISK_READ_US: u64 = 200;

/// The snapshot data of a replica's directory that readers hold: a checkpoint is read from
/// its files as it is sent, so a newer snapshot must not remove an older one from under a
/// follower receiving it. The last reader of a replaced checkpoint removes it.
#[derive(Debug, Default)]
struct DataInUse {
    /// Readers per data name.
    readers: std::collections::HashMap<String, usize>,
    /// The data the snapshot record names.
    kept: Option<String>,
}

/// A reader's hold on snapshot data (see [`DataInUse`]).
struct DataHold {
    dir: PathBuf,
    name: String,
    in_use: Arc<Mutex<DataInUse>>,
}

impl Drop for DataHold {
    fn drop(&mut self) {
        let mut u = self.in_use.lock().unwrap_or_else(|p| p.into_inner());
        let last = match u.readers.get_mut(&self.name) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                u.readers.remove(&self.name);
                true
            }
        };
        if last && u.kept.as_deref() != Some(self.name.as_str()) {
            remove_data(&self.dir.join(&self.name));
        }
    }
}

impl std::fmt::Debug for SmStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SmStore(partition {}, {})",
            self.partition,
            self.dir.display()
        )
    }
}

/// Seed state written into a brand-new partition 0: the root directory and the cluster
/// map (the `[cluster]` table every node was started with).
fn seed_root(db: &DB, now: Time, cluster_map: &[u8]) -> Result<(), Fatal> {
    if db.get(keys::inode(ROOT_INO))?.is_some() || db.get(meta::APPLIED)?.is_some() {
        return Ok(());
    }
    let attr = Attr {
        ino: ROOT_INO,
        kind: FileKind::Directory,
        perm: 0o755,
        uid: 0,
        gid: 0,
        size: 0,
        nlink: 2,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        generation: 0,
        class: Class::Relaxed,
        rdev: 0,
        parent: ROOT_INO,
    };
    let mut b = WriteBatch::default();
    b.put(
        keys::inode(ROOT_INO),
        enc(&InodeRec {
            attr,
            symlink: Vec::new(),
            creator: 0,
            layout: Layout::Small,
        }),
    );
    b.put(meta::INODES, 1u64.to_le_bytes());
    b.put(meta::CLUSTER_MAP, cluster_map);
    db.write(b)?;
    Ok(())
}

impl SmStore {
    /// Opens (or creates) the state of `partition` under `dir`. A new partition 0 is seeded
    /// with the root directory and `cluster_map`.
    pub fn open(dir: &Path, partition: u32, cluster_map: &[u8]) -> Result<Arc<SmStore>, Fatal> {
        SmStore::open_tuned(
            dir,
            partition,
            cluster_map,
            crate::tuning::Tuning::default(),
        )
    }

    /// As [`SmStore::open`], with the node's memtable sizes.
    pub fn open_tuned(
        dir: &Path,
        partition: u32,
        cluster_map: &[u8],
        tuning: crate::tuning::Tuning,
    ) -> Result<Arc<SmStore>, Fatal> {
        SmStore::open_in_format(dir, partition, cluster_map, tuning, crate::format::FORMAT)
    }

    /// As [`SmStore::open_tuned`], as a build reading format `format` would open it (the
    /// tests' stand-in for another release).
    fn open_in_format(
        dir: &Path,
        partition: u32,
        cluster_map: &[u8],
        tuning: crate::tuning::Tuning,
        format: u32,
    ) -> Result<Arc<SmStore>, Fatal> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Fatal::Corrupt(format!("create {}: {e}", dir.display())))?;
        let current = dir.join("CURRENT_DB");
        let name = match std::fs::read_to_string(&current) {
            Ok(s) => s.trim().to_string(),
            Err(_) => {
                write_atomic(&current, b"db-0")?;
                "db-0".to_string()
            }
        };
        // An install interrupted after its switch to the new instance: its snapshot record
        // goes in place, so the record always covers what the live instance holds.
        let pending = pending_snapshot_file(dir, &name);
        if pending.exists() {
            std::fs::rename(&pending, dir.join(SNAPSHOT_FILE))
                .map_err(|e| Fatal::Corrupt(format!("finish {}: {e}", pending.display())))?;
        }
        // Instances (and their snapshot records) left by an interrupted install or replaced
        // by a later one.
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if (n.starts_with("db-") && n != name) || n.starts_with("checkpoint-") {
                    let _ = std::fs::remove_dir_all(e.path());
                } else if n.starts_with("snapshot-db-") || n.starts_with(INCOMING) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let db = DB::open(&db_options(&tuning), dir.join(&name))?;
        crate::format::check_store(
            &db,
            &format!("partition {partition}'s state at {}", dir.display()),
            format,
        )?;
        let mark = Arc::new(SnapshotMark::default());
        let stored = match std::fs::read(dir.join(SNAPSHOT_FILE)) {
            Ok(b) => Some(dec::<StoredSnapshot>(&b, "snapshot")?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Fatal::Corrupt(format!("read the snapshot: {e}"))),
        };
        if let Some(s) = &stored {
            mark.set(s.meta.last_log_id, 0);
        }
        remove_data_files_but(dir, stored.as_ref().map(|s| s.data_file.as_str()), &|_| {
            false
        });
        if partition == 0 {
            seed_root(&db, crate::clock::now(), cluster_map)?;
        }
        Ok(Arc::new(SmStore {
            partition,
            dir: dir.to_path_buf(),
            db: RwLock::new(Arc::new(db)),
            swap: Mutex::new(()),
            deletes: std::sync::atomic::AtomicU64::new(0),
            deleted_chunks: std::sync::atomic::AtomicU64::new(0),
            tuning,
            fail_writes: std::sync::atomic::AtomicBool::new(false),
            space: std::sync::OnceLock::new(),
            mark,
            data_in_use: Arc::new(Mutex::new(DataInUse {
                kept: stored.map(|s| s.data_file),
                ..DataInUse::default()
            })),
            read_us: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    /// Builds snapshots only when the gate's space has room for the memtable they write out
    /// (see `build_snapshot`), and has writes that find the disk full wait there.
    pub fn watch_space(&self, gate: crate::space::Gate) {
        let _ = self.space.set(gate);
    }

    /// Fault injection for tests of storage failures: while `on`, every apply on this
    /// replica fails as a write to a broken disk would. Off unless a test turns it on.
    pub fn inject_write_errors(&self, on: bool) {
        self.fail_writes
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The live RocksDB instance.
    pub fn db(&self) -> Arc<DB> {
        match self.db.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The partition id.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    fn applied(&self) -> Result<(Option<LogId<NodeId>>, Membership), Fatal> {
        read_applied(&self.db())
    }

    fn snapshot_file(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_FILE)
    }

    /// How far this replica's stored snapshot reaches, for its log (see [`SnapshotMark`]).
    pub fn snapshot_mark(&self) -> Arc<SnapshotMark> {
        self.mark.clone()
    }
}

/// The stored snapshot of a replica, in its directory.
const SNAPSHOT_FILE: &str = "snapshot.bin";
/// Names of snapshot data files begin so.
const DATA_FILE: &str = "snapshot-data-";
/// Names of snapshots being received begin so.
const INCOMING: &str = "incoming-";

/// Removes the snapshot data of `dir` but `keep` and what `in_use` names: replaced or
/// never recorded checkpoints (and the packed files of older builds).
fn remove_data_files_but(dir: &Path, keep: Option<&str>, in_use: &dyn Fn(&str) -> bool) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(DATA_FILE) && Some(n.as_str()) != keep && !in_use(&n) {
                remove_data(&e.path());
            }
        }
    }
}

/// Removes one snapshot's data: a checkpoint directory, or an older build's packed file.
fn remove_data(path: &Path) {
    let _ = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        _ => std::fs::remove_file(path),
    };
}

impl SmStore {
    /// Records `keep` as the stored snapshot's data and removes all other data no reader
    /// holds.
    fn keep_only_data(&self, keep: &str) {
        let mut u = self.data_in_use.lock().unwrap_or_else(|p| p.into_inner());
        u.kept = Some(keep.to_string());
        remove_data_files_but(&self.dir, Some(keep), &|n| u.readers.contains_key(n));
    }

    /// The stored snapshot data `name` for openraft to read (and send on in chunks): the
    /// pack of its checkpoint, held for the reader, or the packed file an older build
    /// stored.
    fn open_data(&self, name: &str) -> Result<Box<crate::archive::Stream>, Fatal> {
        let path = self.dir.join(name);
        let failed = |e: std::io::Error| Fatal::Corrupt(format!("open {}: {e}", path.display()));
        let mut u = self.data_in_use.lock().unwrap_or_else(|p| p.into_inner());
        let stream = if path.is_dir() {
            let layout = crate::archive::Layout::of(&path, in_snapshot).map_err(failed)?;
            *u.readers.entry(name.to_string()).or_default() += 1;
            let hold = DataHold {
                dir: self.dir.clone(),
                name: name.to_string(),
                in_use: self.data_in_use.clone(),
            };
            crate::archive::Stream::Pack(crate::archive::PackReader::new(layout, hold))
        } else {
            let f = std::fs::File::open(&path).map_err(failed)?;
            crate::archive::Stream::File(tokio::fs::File::from_std(f))
        };
        Ok(Box::new(stream))
    }
}

/// Files of a checkpoint that are not part of its snapshot: RocksDB's lock and info logs
/// (opening the checkpoint read-only writes one).
fn in_snapshot(name: &str) -> bool {
    name != "LOCK" && !name.starts_with("LOG")
}

/// Where an install writes the snapshot record of instance `db` before switching to it.
fn pending_snapshot_file(dir: &Path, db: &str) -> PathBuf {
    dir.join(format!("snapshot-{db}.bin"))
}

fn read_applied(db: &DB) -> Result<(Option<LogId<NodeId>>, Membership), Fatal> {
    let applied = db
        .get(meta::APPLIED)?
        .map(|b| dec(&b, "applied"))
        .transpose()?;
    let membership = db
        .get(meta::MEMBERSHIP)?
        .map(|b| dec(&b, "membership"))
        .transpose()?
        .unwrap_or_default();
    Ok((applied, membership))
}

fn write_atomic(path: &Path, data: &[u8]) -> Result<(), Fatal> {
    let tmp = path.with_extension("tmp");
    let res = (|| -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(d) = path.parent() {
            std::fs::File::open(d)?.sync_all()?;
        }
        Ok(())
    })();
    res.map_err(|e| Fatal::Corrupt(format!("write {}: {e}", path.display())))
}

/// A stored snapshot: its metadata and the name of its data in the replica's directory (a
/// checkpoint; an older build's stored snapshot is a packed file, read as it is).
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, openraft::BasicNode>,
    data_file: String,
}

/// The openraft state machine of one partition replica.
pub struct PartitionSm {
    store: Arc<SmStore>,
    applier: Applier,
    /// The live instance's counters and locks, which its commands read.
    resident: Resident,
    /// The file a snapshot is being received into, from `begin_receiving_snapshot`.
    receiving: Option<PathBuf>,
}

/// What applying a run of entries staged: the writes, each entry's result, the last
/// entry's id and the last membership among them.
type Staged = (
    Overlay,
    Vec<CommandResult>,
    Option<LogId<NodeId>>,
    Option<Membership>,
);

impl PartitionSm {
    /// Wraps a store.
    pub fn new(store: Arc<SmStore>) -> PartitionSm {
        let applier = Applier {
            partition: store.partition,
        };
        PartitionSm {
            store,
            applier,
            resident: Resident::default(),
            receiving: None,
        }
    }

    /// Applies `entries` to the live instance `db` as the staged writes of one batch,
    /// reading the resident keys from memory.
    fn stage(
        &mut self,
        db: &DB,
        entries: impl IntoIterator<Item = openraft::Entry<TypeConfig>>,
    ) -> Result<Staged, StorageError> {
        let kv = self
            .resident
            .over(db)
            .map_err(|e| fatal(ErrorVerb::Read, e))?;
        let mut overlay = Overlay::new();
        let mut results = Vec::new();
        let mut last: Option<LogId<NodeId>> = None;
        let mut membership: Option<Membership> = None;
        for entry in entries {
            let log_id = *entry.get_log_id();
            last = Some(log_id);
            let res = match &entry.payload {
                EntryPayload::Blank => CommandResult::None,
                EntryPayload::Normal(cmd) => {
                    crate::fail_point!(
                        "txn-finish-apply",
                        if matches!(cmd, crate::types::Command::Finish { commit: true, .. })
                    );
                    self.applier
                        .apply(&kv, &mut overlay, cmd)
                        .map_err(|e| fatal(ErrorVerb::Write, e))?
                }
                EntryPayload::Membership(m) => {
                    membership = Some(StoredMembership::new(Some(log_id), m.clone()));
                    CommandResult::None
                }
            };
            results.push(res);
        }
        Ok((overlay, results, last, membership))
    }
}

/// Builds snapshots of a partition replica.
pub struct SnapshotBuilder {
    store: Arc<SmStore>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || build_snapshot(&store))
            .await
            .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?
    }
}

/// A compaction of the whole key range, down to and including the last level.
fn whole_compaction() -> rocksdb::CompactOptions {
    let mut o = rocksdb::CompactOptions::default();
    o.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
    o
}

/// RocksDB's integer property `name` of `db`, or 0 where it has none.
fn int_property(db: &DB, name: &str) -> u64 {
    db.property_int_value(name).ok().flatten().unwrap_or(0)
}

/// Builds a snapshot: a RocksDB checkpoint of the live instance, kept as the replica's
/// stored snapshot and sent as a pack read from its files (`crate::archive::Layout`). A
/// checkpoint flushes the memtable and hard-links the table and blob files, which are never
/// written again, so a snapshot costs no copy of the partition: a partition of gigabytes
/// was packed into a second copy at every build before, twice its size on disk and its
/// whole size written each time. The linked files the live instance has since compacted
/// away stay on disk until the next build replaces the checkpoint (after a compaction that
/// reclaims room, the node asks for one: `crate::data`). A build on a disk without room for
/// the memtable it writes out, or that the disk refuses, keeps the stored snapshot:
/// openraft ignores a snapshot no newer than the one it has. Only a replica without any
/// snapshot builds (and fails) regardless.
fn build_snapshot(store: &SmStore) -> Result<Snapshot<TypeConfig>, StorageError> {
    let werr = |e: Fatal| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, e);
    let _g = store.swap.lock().unwrap_or_else(|p| p.into_inner());
    let db = store.db();
    // The checkpoint writes the memtable out: on a disk without room for it beside the
    // critical floor (see `crate::space`), the stored snapshot is kept.
    let memtables = int_property(&db, "rocksdb.cur-size-all-mem-tables");
    let _claim = match store.space.get() {
        None => None,
        Some(gate) => match gate.space.claim(memtables) {
            Ok(c) => Some(c),
            Err(why) => match keep_stored_snapshot(store, &why).map_err(werr)? {
                Some(kept) => return Ok(kept),
                None => None,
            },
        },
    };
    let data_file = format!("{DATA_FILE}{:016x}", rand::random::<u64>());
    let data_path = store.dir.join(&data_file);
    // What the log held when the checkpoint began: a snapshot by size counts from here.
    let log_bytes = store.mark.log_bytes();
    let result = (|| -> Result<Snapshot<TypeConfig>, Fatal> {
        checkpoint(&db, &data_path)?;
        let (applied, membership) = {
            let ro = DB::open_for_read_only(&Options::default(), &data_path, false)?;
            read_applied(&ro)?
        };
        let snapshot_id = match applied {
            Some(l) => format!(
                "{}-{}-{}-{:x}",
                l.leader_id.term,
                l.leader_id.node_id,
                l.index,
                rand::random::<u32>()
            ),
            None => format!("empty-{:x}", rand::random::<u32>()),
        };
        let meta = SnapshotMeta {
            last_log_id: applied,
            last_membership: membership,
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data_file: data_file.clone(),
        };
        let snapshot = store.open_data(&data_file)?;
        write_atomic(&store.snapshot_file(), &enc(&stored))?;
        store.mark.set(meta.last_log_id, log_bytes);
        store.keep_only_data(&data_file);
        Ok(Snapshot { meta, snapshot })
    })();
    match result {
        Ok(s) => Ok(s),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&data_path);
            if crate::space::is_no_space(&e) {
                if let Some(kept) = keep_stored_snapshot(store, &e).map_err(werr)? {
                    return Ok(kept);
                }
            }
            Err(werr(e))
        }
    }
}

/// A RocksDB checkpoint of `db` at `path` (which must not exist), durable with its
/// directory: a snapshot record may name it next.
fn checkpoint(db: &DB, path: &Path) -> Result<(), Fatal> {
    rocksdb::checkpoint::Checkpoint::new(db)?.create_checkpoint(path)?;
    let sync = |d: &Path| std::fs::File::open(d).and_then(|f| f.sync_all());
    sync(path)
        .and_then(|()| path.parent().map_or(Ok(()), sync))
        .map_err(|e| Fatal::Corrupt(format!("sync the checkpoint {}: {e}", path.display())))
}

/// A build given up for want of room (`why`): the replica's stored snapshot, said so in
/// the log, if it has one.
fn keep_stored_snapshot(
    store: &SmStore,
    why: &dyn std::fmt::Display,
) -> Result<Option<Snapshot<TypeConfig>>, Fatal> {
    let kept = stored_snapshot(store)?;
    if kept.is_some() {
        tracing::warn!(
            partition = store.partition,
            "snapshot not built, the stored one is kept: {why}"
        );
    }
    Ok(kept)
}

/// The replica's stored snapshot, if it has one.
fn stored_snapshot(store: &SmStore) -> Result<Option<Snapshot<TypeConfig>>, Fatal> {
    let bytes = match std::fs::read(store.snapshot_file()) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Fatal::Corrupt(format!("read the snapshot record: {e}"))),
    };
    let s: StoredSnapshot = dec(&bytes, "snapshot")?;
    Ok(Some(Snapshot {
        meta: s.meta,
        snapshot: store.open_data(&s.data_file)?,
    }))
}

impl PartitionSm {
    /// A new file in the replica's directory for a snapshot being received; a receipt
    /// started before and not installed is dropped.
    async fn receive_file(&mut self) -> Result<tokio::fs::File, StorageError> {
        let path = self
            .store
            .dir
            .join(format!("{INCOMING}{:016x}", rand::random::<u64>()));
        // Read as well as written: the install reads back what openraft wrote into it.
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?;
        if let Some(old) = self.receiving.replace(path) {
            let _ = tokio::fs::remove_file(old).await;
        }
        Ok(file)
    }
}

impl RaftStateMachine<TypeConfig> for PartitionSm {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId<NodeId>>, Membership), StorageError> {
        self.store.applied().map_err(|e| fatal(ErrorVerb::Read, e))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, StorageError>
    where
        I: IntoIterator<Item = openraft::Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let db = self.store.db();
        let (overlay, results, last, membership) = self.stage(&db, entries)?;
        let Some(last) = last else { return Ok(results) };
        let (mut bodies, mut chunks) = (0, 0);
        let mut bytes = 0;
        for (k, v) in overlay.iter() {
            bytes += k.len() + v.as_ref().map_or(0, Vec::len);
            match (k.first(), v) {
                (Some(&keys::tag::BODY), None) => bodies += 1,
                (Some(&keys::tag::CHUNK), None) if keys::is_chunk_head(k) => chunks += 1,
                _ => {}
            }
        }
        self.store.note_deletes(bodies, chunks);
        let (applied, membership) = (enc(&last), membership.map(|m| enc(&m)));
        if self
            .store
            .fail_writes
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            let e = std::io::Error::other("injected I/O error");
            return Err(io_err(ErrorSubject::Apply(last), ErrorVerb::Write, e));
        }
        // openraft never runs apply and install_snapshot at once, so `db` is still live.
        // Without RocksDB's own WAL: the Raft log is this store's write-ahead log. A crash
        // leaves the store at the last flushed batch, `APPLIED` included (one column
        // family, flushed atomically), and openraft applies the entries after it again from
        // the log, which keeps every entry past the stored snapshot (a checkpoint, built
        // after a flush). A clean stop flushes the memtable.
        let mut wo = rocksdb::WriteOptions::default();
        wo.disable_wal(true);
        let records = overlay.len() + 2;
        let bytes = bytes
            + meta::APPLIED.len()
            + applied.len()
            + membership
                .as_ref()
                .map_or(0, |m| meta::MEMBERSHIP.len() + m.len());
        let write = || {
            let mut batch = crate::kv::batch_with_room(records, bytes);
            for (k, v) in &overlay {
                match v {
                    Some(v) => batch.put(k, v),
                    None => batch.delete(k),
                }
            }
            batch.put(meta::APPLIED, &applied);
            if let Some(m) = &membership {
                batch.put(meta::MEMBERSHIP, m);
            }
            db.write_opt(batch, &wo)
        };
        let what = format!("partition {}'s store", self.store.partition);
        let written = crate::space::Gate::write_waiting(self.store.space.get(), what, write).await;
        match written {
            Ok(()) => self.resident.written(&overlay),
            Err(e) => {
                self.resident.forget();
                return Err(io_err(ErrorSubject::Apply(last), ErrorVerb::Write, e));
            }
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            store: self.store.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<crate::archive::Stream>, StorageError> {
        let file = self.receive_file().await?;
        Ok(Box::new(crate::archive::Stream::File(file)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        snapshot: Box<crate::archive::Stream>,
    ) -> Result<(), StorageError> {
        let werr = |e: std::io::Error| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, e);
        // The resident keys to come are the new instance's.
        self.resident.forget();
        let file = match *snapshot {
            crate::archive::Stream::File(f) => f,
            // A stored snapshot handed over whole: received into a file first, as a sent
            // one is.
            crate::archive::Stream::Pack(mut pack) => {
                let mut into = self.receive_file().await?;
                tokio::io::copy(&mut pack, &mut into).await.map_err(werr)?;
                into
            }
        };
        let store = self.store.clone();
        let meta = meta.clone();
        let received = self.receiving.take();
        let mut file = file.into_std().await;
        file.flush().map_err(werr)?;
        file.sync_all().map_err(werr)?;
        file.rewind().map_err(werr)?;
        tokio::task::spawn_blocking(move || install_snapshot(&store, meta, file, received))
            .await
            .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        stored_snapshot(&self.store)
            .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Read, e))
    }
}

fn install_snapshot(
    store: &SmStore,
    meta: SnapshotMeta<NodeId, openraft::BasicNode>,
    data: std::fs::File,
    received: Option<PathBuf>,
) -> Result<(), StorageError> {
    let werr = |e: Fatal| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, e);
    let _g = store.swap.lock().unwrap_or_else(|p| p.into_inner());
    let name = format!("db-{}", rand::random::<u64>());
    let target = store.dir.join(&name);
    let data_file = format!("{DATA_FILE}{:016x}", rand::random::<u64>());
    let data_path = store.dir.join(&data_file);
    let res = (|| -> Result<(DB, bool), Fatal> {
        let corrupt = |e: std::io::Error| Fatal::Corrupt(format!("unpack the snapshot: {e}"));
        std::fs::create_dir_all(&target).map_err(corrupt)?;
        crate::archive::unpack(&mut std::io::BufReader::new(&data), &target).map_err(corrupt)?;
        crate::fail_point!("snapshot-install-files");
        // Whether the new instance opens with compactions paused (see the switch below).
        let paused = store.tuning.compactions_paused();
        let db = DB::open(&db_options(&store.tuning), &target)?;
        crate::format::check_store(&db, "a received snapshot", crate::format::FORMAT)?;
        let (applied, _) = read_applied(&db)?;
        if applied != meta.last_log_id {
            return Err(Fatal::Corrupt(format!(
                "snapshot holds applied {applied:?}, meta says {:?}",
                meta.last_log_id
            )));
        }
        // The replica's stored snapshot is a checkpoint of the new instance, as a build
        // makes; the received stream goes once it is in place.
        checkpoint(&db, &data_path)?;
        Ok((db, paused))
    })();
    // The received stream has served, whether the install goes on or not.
    if let Some(path) = &received {
        let _ = std::fs::remove_file(path);
    }
    let (db, paused) = match res {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&target);
            let _ = std::fs::remove_dir_all(&data_path);
            return Err(werr(e));
        }
    };
    // The switch is the install's commit point: the new instance's snapshot record is
    // written first, under its name, and put in place after (or by the next open).
    let last = meta.last_log_id;
    let pending = pending_snapshot_file(&store.dir, &name);
    let record = StoredSnapshot {
        meta,
        data_file: data_file.clone(),
    };
    if let Err(e) = write_atomic(&pending, &enc(&record)) {
        let _ = std::fs::remove_dir_all(&target);
        let _ = std::fs::remove_dir_all(&data_path);
        return Err(werr(e));
    }
    write_atomic(&store.dir.join("CURRENT_DB"), name.as_bytes()).map_err(werr)?;
    let old = {
        let mut g = store.db.write().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *g, Arc::new(db))
    };
    drop(old);
    // The node may have paused or resumed compactions while the new instance opened.
    let now_paused = store.tuning.compactions_paused();
    if now_paused != paused {
        if let Err(e) = store.set_compactions(now_paused) {
            tracing::warn!(
                partition = store.partition,
                "compactions of the new instance: {e}"
            );
        }
    }
    crate::fail_point!("snapshot-install-switched");
    std::fs::rename(&pending, store.snapshot_file())
        .map_err(|e| werr(Fatal::Corrupt(format!("put the snapshot in place: {e}"))))?;
    store.mark.set(last, store.mark.log_bytes());
    store.keep_only_data(&data_file);
    tracing::info!(
        partition = store.partition,
        last = ?last,
        "installed a snapshot from the leader"
    );
    Ok(())
}

impl SmStore {
    /// Turns RocksDB's automatic compactions of this store off (`paused`) or on (see
    /// [`crate::tuning::Tuning::pause_compactions`]).
    pub fn set_compactions(&self, paused: bool) -> Result<(), Fatal> {
        crate::tuning::set_compactions(&self.db(), paused)?;
        Ok(())
    }
}

/// Read helpers over the live instance, for the service's read paths.
impl SmStore {
    /// Runs `f` over a consistent point-in-time view of the current state (a RocksDB
    /// snapshot: a concurrent apply is seen whole or not at all).
    pub fn read<T>(&self, f: impl FnOnce(&View<'_>) -> Result<T, Fatal>) -> Result<T, Fatal> {
        let db = self.db();
        let empty = Overlay::new();
        let snap = db.snapshot();
        let view = View::new(&snap, &empty);
        f(&view)
    }

    /// As [`SmStore::read`], without holding the calling thread while the disk is read: `f`
    /// runs here while this store's reads have been quick lately (memory, the OS page
    /// cache), and on the runtime's blocking pool while they have been slow (the disk:
    /// `DISK_READ_US`). Every read is timed into that average, so the pool's reads bring it
    /// back once they come from memory again. For reads of file contents: run in place, a
    /// cold epoch's reads from the disk queued behind each other on the thread that ran
    /// them, the runtime's workers or a mount's session threads (two of each by default),
    /// while the disk could serve many at once (`bench/README.md`, "A cold epoch's reads
    /// off the request threads"). Needs a tokio runtime.
    ///
    /// (RocksDB's memory-only read tier cannot tell a read from memory first: a key whose
    /// block is not cached may read as absent, or as an older version from a cached block.)
    pub async fn read_unblocking<T, F>(self: &Arc<Self>, f: F) -> Result<T, TalonError>
    where
        T: Send + 'static,
        F: Fn(&View<'_>) -> Result<T, Fatal> + Send + 'static,
    {
        if self.read_us.load(Ordering::Relaxed) < DISK_READ_US {
            return self.timed_read(&f).map_err(storage_error);
        }
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.timed_read(&f))
            .await
            .map_err(|e| TalonError::Unavailable(format!("a read of the store stopped: {e}")))?
            .map_err(storage_error)
    }

    /// [`SmStore::read`], timed into the moving average of [`SmStore::read_unblocking`].
    fn timed_read<T>(&self, f: impl FnOnce(&View<'_>) -> Result<T, Fatal>) -> Result<T, Fatal> {
        let t = std::time::Instant::now();
        let got = self.read(f);
        let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
        let avg = self.read_us.load(Ordering::Relaxed);
        // Concurrent updates may lose one another's sample; it is an estimate.
        let next = (avg - avg / 8).saturating_add(us / 8);
        self.read_us.store(next, Ordering::Relaxed);
        got
    }

    /// The partition's namespace epoch.
    pub fn epoch(&self) -> Result<u64, Fatal> {
        self.read(|v| v.epoch())
    }

    /// One page of the entries of `dir` held here, after `after`, at most `limit`.
    pub fn readdir(
        &self,
        dir: Ino,
        after: &[u8],
        limit: usize,
    ) -> Result<(Vec<DirPageEntry>, bool), Fatal> {
        let db = self.db();
        let prefix = keys::dentry_prefix(dir);
        let mut it = db.raw_iterator();
        let start = keys::dentry(dir, after);
        it.seek(&start);
        let mut out = Vec::new();
        let mut more = false;
        while let Some(k) = it.key() {
            if !k.starts_with(&prefix) {
                break;
            }
            let name = &k[prefix.len()..];
            if !after.is_empty() && name == after {
                it.next();
                continue;
            }
            if out.len() >= limit {
                more = true;
                break;
            }
            let v = it.value().unwrap_or_default();
            out.push((name.to_vec(), dec(v, "dentry")?));
            it.next();
        }
        it.status()?;
        Ok((out, more))
    }

    /// Chunks held here with their write times: (ino, write id, index, ms), at most `limit`,
    /// in key order from the first past `after` (from the first of all without it).
    pub fn chunks(
        &self,
        after: Option<(Ino, u64, u32)>,
        limit: usize,
    ) -> Result<Vec<(Ino, u64, u32, u64)>, Fatal> {
        // The first key past `after`'s is that key with a zero byte appended.
        let from = after.map_or_else(
            || vec![keys::tag::CHUNK_TIME],
            |(ino, w, i)| {
                let mut k = keys::chunk_time(ino, w, i);
                k.push(0);
                k
            },
        );
        self.timed_records_from(keys::tag::CHUNK_TIME, &from, limit, |k, at| {
            keys::chunk_of(k).map(|(ino, w, i)| (ino, w, i, at))
        })
    }

    /// Chunks that commits took out of layouts, dropped at a time (ms) for which `due`
    /// holds: (ino, write id, index), at most `limit`.
    pub fn dropped(
        &self,
        limit: usize,
        due: impl Fn(u64) -> bool,
    ) -> Result<Vec<(Ino, u64, u32)>, Fatal> {
        self.timed_records(keys::tag::DROPPED, limit, |k, at| {
            keys::chunk_of(k).filter(|_| due(at))
        })
    }

    /// Unlinked files waiting to be reclaimed, with when they lost their last name:
    /// (ino, ms), at most `limit`.
    pub fn unlinked(&self, limit: usize) -> Result<Vec<(Ino, u64)>, Fatal> {
        self.timed_records(keys::tag::UNLINKED, limit, |k, at| {
            keys::ino_at(k, 1).map(|ino| (ino, at))
        })
    }

    /// Ids of applied client requests recorded at a time (ms) for which `due` holds, at
    /// most `limit`.
    pub fn requests(&self, limit: usize, due: impl Fn(u64) -> bool) -> Result<Vec<u64>, Fatal> {
        self.timed_records(keys::tag::REQUEST, limit, |k, at| {
            keys::request_of(k).filter(|_| due(at))
        })
    }

    /// Open sessions held until a time (ms) for which `due` holds: (ino, session), at most
    /// `limit`.
    pub fn open_holds(
        &self,
        limit: usize,
        due: impl Fn(u64) -> bool,
    ) -> Result<Vec<(Ino, u64)>, Fatal> {
        self.timed_records(keys::tag::WRITE_HOLD, limit, |k, until| {
            keys::open_hold_of(k).filter(|_| due(until))
        })
    }

    /// Up to `limit` records of table `tag` whose values start with u64 ms times, decoded by `f`
    /// from the key and the time (keys `f` cannot decode are skipped).
    fn timed_records<T>(
        &self,
        tag: u8,
        limit: usize,
        f: impl Fn(&[u8], u64) -> Option<T>,
    ) -> Result<Vec<T>, Fatal> {
        self.timed_records_from(tag, &[tag], limit, f)
    }

    /// As [`SmStore::timed_records`], from key `from` (of table `tag`) on.
    fn timed_records_from<T>(
        &self,
        tag: u8,
        from: &[u8],
        limit: usize,
        f: impl Fn(&[u8], u64) -> Option<T>,
    ) -> Result<Vec<T>, Fatal> {
        let db = self.db();
        let mut it = db.raw_iterator();
        it.seek(from);
        let mut out = Vec::new();
        while let Some(k) = it.key() {
            if k.first() != Some(&tag) || out.len() >= limit {
                break;
            }
            // The time comes first (a request record carries an ino after it).
            let at: [u8; 8] = it
                .value()
                .unwrap_or_default()
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| Fatal::Corrupt(format!("time record of table {}", tag as char)))?;
            if let Some(t) = f(k, u64::from_le_bytes(at)) {
                out.push(t);
            }
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    /// Bodies and chunks deleted since this replica last compacted.
    pub fn deletes_since_compaction(&self) -> u64 {
        self.deletes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Chunks deleted since this replica last compacted.
    pub fn chunks_deleted_since_compaction(&self) -> u64 {
        self.deleted_chunks
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn note_deletes(&self, bodies: u64, chunks: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.deletes.fetch_add(bodies + chunks, Relaxed);
        self.deleted_chunks.fetch_add(chunks, Relaxed);
    }

    /// Compacts the whole instance to reclaim deleted values, in two steps: the keys
    /// ([`SmStore::compact_keys`]), then the values if that found enough garbage
    /// ([`SmStore::move_values`]). Returns whether the values were moved.
    #[cfg(test)]
    pub fn compact(&self) -> bool {
        let worth = self.compact_keys().is_some();
        if worth {
            self.move_values();
        }
        worth
    }

    /// The first step of a reclaiming compaction: the keys alone, blob garbage collection
    /// off. Deleted keys go, a blob file none of whose values is still referred to leaves
    /// the disk, and RocksDB counts the garbage left in the others. It writes at most the
    /// store's key tables and memtables again ([`SmStore::key_bytes`]). Returns the bytes of
    /// live values that moving them would copy, if that garbage is at least an eighth of the
    /// blob files' bytes (`RECLAIM_GARBAGE_SHARE`); None if it is not worth the copy.
    pub fn compact_keys(&self) -> Option<u64> {
        self.deletes.store(0, std::sync::atomic::Ordering::Relaxed);
        self.deleted_chunks
            .store(0, std::sync::atomic::Ordering::Relaxed);
        let db = self.db();
        db.compact_range_opt(None::<&[u8]>, None::<&[u8]>, &whole_compaction());
        let garbage = int_property(&db, "rocksdb.live-blob-file-garbage-size");
        let files = int_property(&db, "rocksdb.live-blob-file-size");
        if garbage == 0 || (garbage as f64) < files as f64 * RECLAIM_GARBAGE_SHARE {
            return None;
        }
        Some(files.saturating_sub(garbage))
    }

    /// The second step: once more with blob garbage collection on for every file
    /// (RocksDB's own compactions running meanwhile too, and off again after it: see
    /// `AUTO_BLOB_GC`), which moves the live values out of the files with garbage. That
    /// copies every live value, up to the partition's whole size: on a nearly full node it
    /// waits for room (`crate::data`), as a copy of the whole store claimed before both
    /// steps once took a node from 85 % to full (`jepsen/README.md`).
    pub fn move_values(&self) {
        let db = self.db();
        let gc = |on: bool| {
            let name = "enable_blob_garbage_collection";
            if let Err(e) = crate::tuning::set_option(&db, name, &on.to_string()) {
                tracing::warn!(partition = self.partition, "blob GC {on} not set: {e}");
            }
        };
        gc(true);
        db.compact_range_opt(None::<&[u8]>, None::<&[u8]>, &whole_compaction());
        gc(AUTO_BLOB_GC);
    }

    /// Bytes the first step of a reclaiming compaction may write: the key tables and the
    /// memtables it flushes first.
    pub fn key_bytes(&self) -> u64 {
        let db = self.db();
        int_property(&db, "rocksdb.total-sst-files-size")
            + int_property(&db, "rocksdb.cur-size-all-mem-tables")
    }

    /// Bytes the instance occupies on disk (SST and blob files).
    pub fn disk_bytes(&self) -> u64 {
        let db = self.db();
        int_property(&db, "rocksdb.total-sst-files-size")
            + int_property(&db, "rocksdb.total-blob-file-size")
    }

    /// Prepared transactions held here: (txid, record).
    pub fn prepared(
        &self,
    ) -> Result<Vec<(crate::types::TxId, crate::records::PreparedRec)>, Fatal> {
        let db = self.db();
        let mut it = db.raw_iterator();
        it.seek([keys::tag::PREPARED]);
        let mut out = Vec::new();
        while let Some(k) = it.key() {
            if k.first() != Some(&keys::tag::PREPARED) {
                break;
            }
            if let Some(t) = keys::txid_of(k) {
                out.push((t, dec(it.value().unwrap_or_default(), "prepared")?));
            }
            it.next();
        }
        it.status()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;
    use std::time::Duration;

    /// A read answers the newest value whichever way it goes: in place while reads have
    /// been quick, and on the blocking pool while they have been slow, which counts its
    /// time too. The value was written over many times and flushed between, so older
    /// versions sit in cached blocks and the newest on the disk after a reopen.
    #[tokio::test]
    async fn reads_answer_the_newest_value_in_place_or_off_the_thread() {
        let dir = tempfile::tempdir().expect("temp dir");
        let body = |n: u8| vec![n; 8192];
        {
            let store = SmStore::open(dir.path(), 3, b"").expect("open");
            for n in 1..=20 {
                store.db().put(b"Zk", body(n)).expect("put");
                let got = store.read_unblocking(|v| v.get(b"Zk")).await;
                assert_eq!(got.expect("read"), Some(body(n)));
                if n % 5 == 0 {
                    store.db().flush().expect("flush");
                }
            }
        }
        let store = SmStore::open(dir.path(), 3, b"").expect("reopen");
        let got = store.read_unblocking(|v| v.get(b"Zk")).await;
        assert_eq!(got.expect("read in place"), Some(body(20)));
        let slow = DISK_READ_US * 100;
        store.read_us.store(slow, Ordering::Relaxed);
        let got = store.read_unblocking(|v| v.get(b"Zk")).await;
        assert_eq!(got.expect("read off the thread"), Some(body(20)));
        assert!(store.read_us.load(Ordering::Relaxed) < slow);
    }

    /// An install interrupted after its switch to the new instance is finished by the next
    /// open (its snapshot record goes in place, so the record covers the live state and the
    /// log may be purged behind it); one interrupted before the switch is rolled back.
    #[test]
    fn an_interrupted_install_is_finished_or_rolled_back_at_open() {
        let dir = tempfile::tempdir().expect("temp dir");
        let at = LogId::new(CommittedLeaderId::new(2, 1), 7);
        {
            let store = SmStore::open(dir.path(), 3, b"").expect("open");
            store
                .db()
                .put(meta::APPLIED, enc(&at))
                .expect("write applied");
            build_snapshot(&store).expect("build a snapshot");
            assert_eq!(store.snapshot_mark().get(), Some(at));
            // As the install leaves it between switching instances and the record's rename.
            std::fs::rename(
                store.snapshot_file(),
                pending_snapshot_file(dir.path(), "db-0"),
            )
            .expect("make the record pending");
            // And a record of an instance that an earlier install never switched to.
            std::fs::write(pending_snapshot_file(dir.path(), "db-99"), b"partial")
                .expect("write a stray record");
        }
        let store = SmStore::open(dir.path(), 3, b"").expect("reopen");
        assert_eq!(store.snapshot_mark().get(), Some(at));
        assert!(store.snapshot_file().exists());
        assert!(!pending_snapshot_file(dir.path(), "db-0").exists());
        assert!(!pending_snapshot_file(dir.path(), "db-99").exists());
    }

    /// Partition 0's store in `dir`, opened by a build of format version `format`.
    fn open_as_format(dir: &Path, format: u32) -> Result<Arc<SmStore>, Fatal> {
        SmStore::open_in_format(dir, 0, b"map", crate::tuning::Tuning::default(), format)
    }

    /// A store written by the release before (format 2) opens in this build, which stamps
    /// it with its own format, and its chunks, stored whole, read as they were.
    #[test]
    fn a_format_2_store_opens_and_its_whole_chunks_read() {
        use crate::data::{read_chunk_range, ChunkRead};
        use crate::format::{FORMAT, FORMAT_KEY};
        use crate::records::{enc, ChunkView};
        let dir = tempfile::tempdir().expect("temp dir");
        let open = |format| open_as_format(dir.path(), format);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 249) as u8).collect();
        let chunk = (Ino(7), 1, 0);
        {
            let store = open(2).expect("a format 2 store");
            let whole = ChunkView {
                crc: crc32c::crc32c(&data),
                at_ms: 5,
                data: &data,
            };
            let db = store.db();
            db.put(keys::chunk(chunk.0, chunk.1, chunk.2), enc(&whole))
                .expect("put");
            db.put(
                keys::chunk_time(chunk.0, chunk.1, chunk.2),
                5u64.to_le_bytes(),
            )
            .expect("put");
        }
        let store = open(FORMAT).expect("this build opens it");
        assert_eq!(
            store.db().get(FORMAT_KEY).expect("get"),
            Some(FORMAT.to_be_bytes().to_vec())
        );
        let got = store
            .read(|v| read_chunk_range(v, chunk, 70_000, 100_000))
            .expect("read");
        assert_eq!(got, ChunkRead::Bytes(data[70_000..170_000].to_vec()));
        drop(store);
        let e = open(2).expect_err("the release before refuses it now");
        assert!(e.to_string().contains("newer release"), "{e}");
    }

    /// A store is refused, with both versions named, by a build of another format version:
    /// one written by this build and opened by a bumped one, and one written by a newer
    /// release and opened by this build. Nothing in it is read or changed.
    #[test]
    fn a_store_of_another_format_version_is_refused_naming_both() {
        use crate::format::{FORMAT, FORMAT_KEY};
        let dir = tempfile::tempdir().expect("temp dir");
        let open = |format| open_as_format(dir.path(), format);
        drop(open(FORMAT).expect("create"));
        let e = open(FORMAT + 1).expect_err("a bumped build refuses it");
        let text = e.to_string();
        assert!(
            text.contains(&format!("in format {FORMAT}"))
                && text.contains(&format!("reads format {}", FORMAT + 1))
                && text.contains("older release"),
            "{text}"
        );
        {
            let store = open(FORMAT).expect("this build still opens it");
            store
                .db()
                .put(FORMAT_KEY, (FORMAT + 1).to_be_bytes())
                .expect("stamp as a newer release would");
        }
        let e = open(FORMAT).expect_err("this build refuses a newer store");
        let text = e.to_string();
        assert!(
            text.contains(&format!("in format {}", FORMAT + 1))
                && text.contains(&format!("reads format {FORMAT}"))
                && text.contains("newer release"),
            "{text}"
        );
    }

    /// Sends `built` to the replica of `sm` as a follower receives it, and installs it.
    async fn send_and_install(built: &mut Snapshot<TypeConfig>, sm: &mut PartitionSm) {
        let mut incoming = sm.begin_receiving_snapshot().await.expect("begin");
        tokio::io::copy(&mut built.snapshot, &mut *incoming)
            .await
            .expect("send");
        sm.install_snapshot(&built.meta, incoming)
            .await
            .expect("install");
    }

    /// A snapshot goes from one replica to another as files: built as a checkpoint that
    /// shares the live instance's files (no copy of the data), sent as its pack, received
    /// into a file, unpacked and swapped in; the receiver keeps a checkpoint of its own as
    /// its stored snapshot and nothing else (not the received file), and a reopen finds it.
    #[tokio::test]
    async fn a_snapshot_streams_from_one_replica_to_another_through_files() {
        let (a_dir, b_dir) = (
            tempfile::tempdir().expect("temp dir"),
            tempfile::tempdir().expect("temp dir"),
        );
        let at = LogId::new(CommittedLeaderId::new(3, 1), 40);
        let a = SmStore::open(a_dir.path(), 3, b"").expect("open a");
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        a.db().put(b"Bsome-body", &body).expect("write a body");
        a.db().put(meta::APPLIED, enc(&at)).expect("write applied");
        let mut built = build_snapshot(&a).expect("build");
        let data_files = |dir: &Path| {
            let mut v: Vec<String> = std::fs::read_dir(dir)
                .expect("list")
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(DATA_FILE) || n.starts_with(INCOMING))
                .collect();
            v.sort();
            v
        };
        let built_files = data_files(a_dir.path());
        assert_eq!(built_files.len(), 1);
        // The body's blob file is the live instance's, linked, not copied.
        let linked = std::fs::read_dir(a_dir.path().join(&built_files[0]))
            .expect("list the checkpoint")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".blob"))
            .map(|e| std::os::unix::fs::MetadataExt::nlink(&e.metadata().expect("stat")))
            .collect::<Vec<_>>();
        assert_eq!(linked, vec![2], "the blob file and its links");

        let b = SmStore::open(b_dir.path(), 3, b"").expect("open b");
        let mut sm = PartitionSm::new(b.clone());
        send_and_install(&mut built, &mut sm).await;
        assert_eq!(b.db().get(b"Bsome-body").expect("read"), Some(body.clone()));
        assert_eq!(b.snapshot_mark().get(), Some(at));
        let kept = data_files(b_dir.path());
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert!(kept[0].starts_with(DATA_FILE), "{kept:?}");
        let current = sm
            .get_current_snapshot()
            .await
            .expect("read")
            .expect("a snapshot");
        assert_eq!(current.meta, built.meta);
        drop((sm, b, current));

        // Stray data (builds cut short) is removed at open; the recorded one stays.
        std::fs::write(b_dir.path().join(format!("{DATA_FILE}stray")), b"x").expect("stray");
        std::fs::create_dir(b_dir.path().join(format!("{DATA_FILE}stray.tmp"))).expect("stray");
        let b = SmStore::open(b_dir.path(), 3, b"").expect("reopen b");
        assert_eq!(data_files(b_dir.path()), kept);
        assert_eq!(b.snapshot_mark().get(), Some(at));
        assert_eq!(b.db().get(b"Bsome-body").expect("read"), Some(body));
    }

    /// The counters a replica's commands read are its live instance's: after a snapshot is
    /// installed, the next command moves on from the snapshot's values, not from the ones
    /// the replica had applied before.
    #[tokio::test]
    async fn commands_after_an_installed_snapshot_read_its_counters() {
        let (a_dir, b_dir) = (
            tempfile::tempdir().expect("temp dir"),
            tempfile::tempdir().expect("temp dir"),
        );
        let bump = |index: u64| openraft::Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(3, 1), index),
            payload: EntryPayload::Normal(crate::types::Command::Atomic(vec![
                crate::types::Op::BumpEpoch(0),
            ])),
        };
        let epoch = |store: &SmStore| {
            let b = store
                .db()
                .get(meta::EPOCH)
                .expect("read")
                .expect("an epoch");
            u64::from_le_bytes(b.try_into().expect("eight bytes"))
        };
        let a = SmStore::open(a_dir.path(), 3, b"").expect("open a");
        let at = LogId::new(CommittedLeaderId::new(3, 1), 40);
        a.db()
            .put(meta::EPOCH, 10u64.to_le_bytes())
            .expect("write the epoch");
        a.db().put(meta::APPLIED, enc(&at)).expect("write applied");
        let mut built = build_snapshot(&a).expect("build");

        let b = SmStore::open(b_dir.path(), 3, b"").expect("open b");
        let mut sm = PartitionSm::new(b.clone());
        sm.apply(vec![bump(1), bump(2)]).await.expect("apply");
        assert_eq!(epoch(&b), 3);
        send_and_install(&mut built, &mut sm).await;
        sm.apply(vec![bump(41)]).await.expect("apply");
        assert_eq!(epoch(&b), 11);
    }

    /// A follower may still be receiving a snapshot when a newer one is built: the older
    /// checkpoint is read from its files, so it stays, whole, until its reader is done, and
    /// then goes.
    #[tokio::test]
    async fn a_replaced_snapshot_stays_until_its_reader_is_done() {
        use tokio::io::AsyncReadExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let a = SmStore::open(dir.path(), 3, b"").expect("open");
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 249) as u8).collect();
        a.db().put(b"Bold-body", &body).expect("write a body");
        a.db()
            .put(
                meta::APPLIED,
                enc(&LogId::new(CommittedLeaderId::new(3, 1), 40)),
            )
            .expect("write applied");
        let mut first = build_snapshot(&a).expect("build");
        let data = |dir: &Path| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(dir)
                .expect("list")
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(DATA_FILE))
                .collect();
            v.sort();
            v
        };
        let old = data(dir.path());
        a.db().delete(b"Bold-body").expect("delete the body");
        a.db()
            .put(
                meta::APPLIED,
                enc(&LogId::new(CommittedLeaderId::new(3, 1), 90)),
            )
            .expect("write applied");
        let second = build_snapshot(&a).expect("build again");
        assert_eq!(data(dir.path()).len(), 2, "the first is still being read");
        let mut stream = Vec::new();
        first
            .snapshot
            .read_to_end(&mut stream)
            .await
            .expect("read the replaced snapshot");
        let into = tempfile::tempdir().expect("temp dir");
        crate::archive::unpack(&mut stream.as_slice(), into.path()).expect("unpack");
        let db = DB::open(&db_options(&a.tuning), into.path()).expect("open");
        let got = db.get(b"Bold-body").expect("read");
        assert!(got.as_deref() == Some(&body[..]), "the old body read back");
        drop(first);
        let left = data(dir.path());
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(!old.contains(&left[0]), "the replaced one went: {left:?}");
        drop(second);
        assert_eq!(data(dir.path()), left, "the stored one stays");
    }

    /// Level-0 table files of `store`.
    fn level0_files(store: &SmStore) -> u64 {
        store
            .db()
            .property_int_value("rocksdb.num-files-at-level0")
            .expect("read the property")
            .expect("a level-0 count")
    }

    /// Flushes `n` memtables of one key each: `n` level-0 files, past RocksDB's trigger (4)
    /// for compacting them.
    fn flush_tables(store: &SmStore, n: u32) {
        for i in 0..n {
            let db = store.db();
            db.put(format!("k{i}"), vec![7u8; 1000]).expect("write");
            db.flush().expect("flush");
        }
    }

    /// Blob files (`*.blob`) under `dir`, at any depth.
    fn blob_files(dir: &Path) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).expect("list").flatten() {
                let p = e.path();
                if p.is_dir() {
                    todo.push(p);
                } else if p.extension().is_some_and(|x| x == "blob") {
                    out.insert(e.file_name().to_string_lossy().into_owned());
                }
            }
        }
        out
    }

    /// A compaction on RocksDB's own settings moves no blob values, so bodies written once
    /// are not rewritten by every compaction that passes over their keys; the node's
    /// reclaiming compaction gives a deleted body's room back, moving every live value when
    /// the files hold enough garbage, and leaves the setting as it found it.
    #[test]
    fn only_the_reclaiming_compaction_rewrites_blob_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SmStore::open(dir.path(), 1, b"").expect("open");
        let db = store.db();
        db.set_options(&[("disable_auto_compactions", "true")])
            .expect("pause RocksDB's own compactions");
        for i in 0..8u32 {
            db.put(format!("B{i}"), vec![i as u8; 8192]).expect("write");
            db.flush().expect("flush");
        }
        let written = blob_files(dir.path());
        assert_eq!(written.len(), 8, "{written:?}");

        // What RocksDB's own compactions do: every file stays where it is.
        let mut o = rocksdb::CompactOptions::default();
        o.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
        db.compact_range_opt(None::<&[u8]>, None::<&[u8]>, &o);
        let after = blob_files(dir.path());
        assert_eq!(after, written);

        // Half the values deleted, each its file's only one: those files go, and the
        // others hold no garbage, so nothing is moved.
        for i in 0..4u32 {
            db.delete(format!("B{i}")).expect("delete");
        }
        let before = store.disk_bytes();
        assert!(!store.compact(), "nothing to move");
        let kept = blob_files(dir.path());
        assert_eq!(kept.len(), 4, "{after:?} -> {kept:?}");
        assert!(kept.is_subset(&after), "{after:?} -> {kept:?}");
        assert!(store.disk_bytes() < before, "no room given back");

        // Three of the four left, in one value of each file, and one more file of eight
        // values of which six are deleted: the garbage is over an eighth, so every live value
        // moves, out of every file.
        for i in 10..18u32 {
            db.put(format!("B{i}"), vec![i as u8; 8192]).expect("write");
        }
        db.flush().expect("flush");
        for i in (4..7u32).chain(10..16) {
            db.delete(format!("B{i}")).expect("delete");
        }
        let full = blob_files(dir.path());
        let before = store.disk_bytes();
        assert!(store.compact(), "garbage past the share");
        let reclaimed = blob_files(dir.path());
        assert!(reclaimed.is_disjoint(&full), "{full:?} -> {reclaimed:?}");
        assert!(store.disk_bytes() < before, "no room given back");
        for i in (7..8u32).chain(16..18) {
            assert_eq!(
                db.get(format!("B{i}")).expect("read"),
                Some(vec![i as u8; 8192])
            );
        }
        // The setting is RocksDB's own again: a compaction leaves the one file in place.
        db.compact_range_opt(None::<&[u8]>, None::<&[u8]>, &o);
        assert_eq!(blob_files(dir.path()), reclaimed);
    }

    /// A store whose blob files hold little garbage is compacted without moving its values:
    /// one deleted value of sixteen in one file leaves the file as it is.
    #[test]
    fn little_garbage_moves_no_values() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SmStore::open(dir.path(), 1, b"").expect("open");
        let db = store.db();
        for i in 0..16u32 {
            db.put(format!("B{i:02}"), vec![i as u8; 8192])
                .expect("write");
        }
        db.flush().expect("flush");
        let written = blob_files(dir.path());
        db.delete("B00").expect("delete");
        assert!(!store.compact(), "a sixteenth is not worth the copy");
        assert_eq!(blob_files(dir.path()), written);
        // Half of them deleted: now it is.
        for i in 1..8u32 {
            db.delete(format!("B{i:02}")).expect("delete");
        }
        assert!(store.compact(), "half is");
        assert!(blob_files(dir.path()).is_disjoint(&written));
        for i in 8..16u32 {
            assert_eq!(
                db.get(format!("B{i:02}")).expect("read"),
                Some(vec![i as u8; 8192])
            );
        }
    }

    /// A store opened while the node's compactions are paused (its disk is full) leaves its
    /// level-0 files alone, however many there are: such a compaction would take the room
    /// kept for the log. Resumed, it compacts them; paused again while open, it does not.
    #[test]
    fn paused_compactions_leave_level_0_alone_until_resumed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let tuning = crate::tuning::Tuning::with_budget(64 << 20);
        assert!(tuning.pause_compactions(true));
        assert!(!tuning.pause_compactions(true), "already paused");
        let store = SmStore::open_tuned(dir.path(), 1, b"", tuning.clone()).expect("open");
        flush_tables(&store, 6);
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(level0_files(&store), 6, "nothing compacted while paused");

        assert!(tuning.pause_compactions(false));
        store.set_compactions(false).expect("resume");
        // Writing wakes RocksDB's scheduler up.
        flush_tables(&store, 1);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while level0_files(&store) > 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "level 0 still holds {} files after resuming",
                level0_files(&store)
            );
            std::thread::sleep(Duration::from_millis(50));
        }

        store.set_compactions(true).expect("pause again");
        flush_tables(&store, 6);
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            level0_files(&store) >= 6,
            "nothing compacted once paused again"
        );
    }
}
