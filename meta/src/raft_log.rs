//! The Raft log of every partition replica on a node, in one RocksDB instance.
//!
//! Keys are `group (u32 BE) ‖ tag ‖ ...`: `e` ‖ index (u64 BE) for entries, `v` for the
//! vote, `c` for the committed id, `p` for the last purged id. Because all groups share one
//! instance, they share one WAL: `append` writes entries without syncing (they are
//! readable at once, as openraft requires) and hands its callback to the node's flusher
//! thread, which fsyncs the WAL once for every append that arrived meanwhile and then
//! acknowledges them all — group commit across partitions. Votes are written with a sync
//! of their own, since a vote must be durable before it is answered.
//!
//! Entries appended and not yet applied are also kept in memory (`crate::log_recent`), and
//! the apply and a leader's replication read them from there rather than back from RocksDB.
//!
//! The committed id is written with the group's next write (an append, a truncate, a purge
//! or a vote), or when the handle is dropped at a stop, not by a write of its own: openraft
//! saves it at every commit, and a RocksDB write of its own cost the Raft core half as much
//! as the appends' own writes (bench/README.md, a57b7a6). It is only where a restarted
//! replica starts applying: one read back behind the last commit is applied further when
//! the group commits an entry of the new term, as a replica that saved none is, and reads
//! wait for that (see `crate::partition`).
//!
//! A replica never resumes leading after a restart: the vote it reads back at start-up
//! is never a committed one, so openraft starts it as a follower (as etcd's Raft does)
//! rather than as the leader of the term it led, and leading again takes an election in
//! a new term. openraft 0.9 restores a leader at once, and such a leader's read index is
//! its stored committed id or its term's first entry, whichever is later: a committed id
//! behind entries it acknowledged before the stop let it answer a linearizable read
//! from a state without them (jepsen finding F8). And an entry of its term that its
//! followers made durable before its own log did could be lost from its log, not theirs,
//! by a power cut; resumed in the same term, its next entry would take that entry's log
//! id, which the followers take for the entry they already hold. A new term rules out
//! both.
//!
//! A write that finds the disk full waits for room rather than fails (see
//! `crate::space::Gate::write_waiting`). The memtable's flushes bypass the page cache
//! (`O_DIRECT`) where the file system takes that: the blob files they write hold bodies
//! already applied, read back only by a peer far behind or at a restart.

use crate::log_recent::Recent;
use crate::space::Gate;
use crate::types::{NodeId, StorageError, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, Entry, ErrorSubject, ErrorVerb, LogId, RaftLogId, StorageIOError, Vote};
use rocksdb::{Options, WriteBatch, WriteOptions, DB};
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

fn io_err(
    subject: ErrorSubject<NodeId>,
    verb: ErrorVerb,
    e: impl std::error::Error + 'static,
) -> StorageError {
    StorageIOError::new(subject, verb, AnyError::new(&e)).into()
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Corrupt(String);

/// Opening the log database failed.
#[derive(Debug, thiserror::Error)]
pub enum LogOpenError {
    /// RocksDB refused to open.
    #[error("open log database: {0}")]
    Rocks(#[from] rocksdb::Error),
    /// The flusher thread could not start.
    #[error("start log flusher: {0}")]
    Spawn(#[from] std::io::Error),
    /// The log was written in a format this build does not read.
    #[error(transparent)]
    Format(#[from] crate::format::StoreFormatError),
    /// The log's directory could not be made.
    #[error("create the log's directory: {0}")]
    Dir(std::io::Error),
}

/// Whether `dir`'s file system takes writes that bypass the page cache (`O_DIRECT`): one
/// aligned block written to a file of its own, then removed. Some refuse the flag at open
/// (older tmpfs), some refuse the write; a store whose flushes failed so would stop. A disk
/// without room for the block answers no as well, and the log then flushes through the page
/// cache until the node next starts, as it did before the probe.
fn direct_writes_work(dir: &Path) -> bool {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    const BLOCK: usize = 4096;
    let probe = dir.join("direct-io-probe");
    let mut buf = vec![0u8; 2 * BLOCK];
    let skip = buf.as_ptr().align_offset(BLOCK);
    let Some(block) = buf.get_mut(skip..skip + BLOCK) else {
        return false;
    };
    let works = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .and_then(|mut f| f.write_all(block))
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    works
}

/// Longest range of entries read key by key rather than by a scan (see `entries_by_key`).
const POINT_READS_MAX: u64 = 64;

/// WAL files of the log database kept for reuse once their memtables are flushed.
const WAL_FILES_RECYCLED: usize = 4;

/// The node-wide log database and its WAL flusher.
pub struct LogDb {
    db: Arc<DB>,
    /// Holds appends back while the disk is all but full (see `crate::space`).
    gate: Option<Gate>,
    stats: Arc<LogStats>,
    flush_tx: std::sync::Mutex<Option<mpsc::Sender<LogFlushed<TypeConfig>>>>,
    flusher: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Counters of the log's group commit.
#[derive(Debug, Default)]
pub struct LogStats {
    /// `append` calls (each one batch of entries of one group).
    pub appends: AtomicU64,
    /// WAL fsyncs.
    pub syncs: AtomicU64,
}

impl Debug for LogDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogDb")
    }
}

impl LogDb {
    /// Turns RocksDB's automatic compactions of the log off (`paused`) or on (see
    /// [`crate::tuning::Tuning::pause_compactions`]).
    pub fn set_compactions(&self, paused: bool) -> Result<(), rocksdb::Error> {
        crate::tuning::set_compactions(&self.db, paused)
    }

    /// Opens (or creates) the log database at `path` and starts its flusher thread.
    pub fn open(path: &Path) -> Result<Arc<LogDb>, LogOpenError> {
        LogDb::open_gated(path, None, &crate::tuning::Tuning::default())
    }

    /// As [`LogDb::open`], with the node's memtable sizes, and appends waiting at `gate`: a
    /// node whose
    /// disk is all but full holds a follower's appends back rather than fail them inside
    /// RocksDB, which would stop the group (the leader goes on with the other replicas).
    pub fn open_gated(
        path: &Path,
        gate: Option<Gate>,
        tuning: &crate::tuning::Tuning,
    ) -> Result<Arc<LogDb>, LogOpenError> {
        let mut o = Options::default();
        tuning.apply_log(&mut o);
        // Entries that carry file data go to blob files, so compaction rewrites only keys
        // and references: a compaction of inline values would need as much free disk as the
        // log holds. The log is purged in order, so whole blob files fall out of use and are
        // deleted without garbage collection rewriting anything.
        o.set_enable_blob_files(true);
        o.set_min_blob_size(4096);
        o.set_enable_blob_gc(false);
        // A flush copies the log's bodies once more, into blob files that only a peer far
        // behind or a restart reads back: written past the page cache where the file system
        // allows it, they cost no copy into it and no writeback after (bench/README.md).
        std::fs::create_dir_all(path).map_err(LogOpenError::Dir)?;
        if direct_writes_work(path) {
            o.set_use_direct_io_for_flush_and_compaction(true);
        }
        o.create_if_missing(true);
        o.set_max_background_jobs(2);
        o.set_keep_log_file_num(2);
        // Every append is made durable by an fdatasync of the WAL. On a WAL file that grows,
        // that also commits the file system's journal (the new size, the newly allocated
        // blocks): about twice the time of rewriting blocks already written. So WAL files
        // whose memtables were flushed are kept and written over (RocksDB's recyclable
        // record format tells their stale tail from new records at recovery).
        o.set_recycle_log_file_num(WAL_FILES_RECYCLED);
        let db = Arc::new(DB::open(&o, path)?);
        crate::format::check_store(
            &db,
            &format!("the Raft log at {}", path.display()),
            crate::format::FORMAT,
        )?;
        let (tx, rx) = mpsc::channel::<LogFlushed<TypeConfig>>();
        let fdb = db.clone();
        let stats = Arc::new(LogStats::default());
        let fstats = stats.clone();
        let flusher = std::thread::Builder::new()
            .name("talon-log-flush".into())
            .spawn(move || flush_loop(fdb, fstats, rx))?;
        Ok(Arc::new(LogDb {
            db,
            gate,
            stats,
            flush_tx: std::sync::Mutex::new(Some(tx)),
            flusher: std::sync::Mutex::new(Some(flusher)),
        }))
    }

    /// The log store of one group, purged wherever openraft asks (the storage suite's
    /// contract; a node uses [`LogDb::group_behind`]).
    pub fn group(self: &Arc<Self>, group: u32) -> LogStore {
        LogStore {
            group,
            db: self.clone(),
            mark: None,
            recent: Arc::default(),
            applies: true,
            unsaved_committed: None,
        }
    }

    /// The log store of one group whose purges wait for `mark`, its state machine's stored
    /// snapshot, to reach them.
    pub fn group_behind(self: &Arc<Self>, group: u32, mark: Arc<SnapshotMark>) -> LogStore {
        LogStore {
            group,
            db: self.clone(),
            mark: Some(mark),
            recent: Arc::default(),
            applies: true,
            unsaved_committed: None,
        }
    }

    /// Group-commit counters: (appends, fsyncs) since the node started.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.stats.appends.load(Ordering::Relaxed),
            self.stats.syncs.load(Ordering::Relaxed),
        )
    }

    /// The log's store, for memory accounting.
    pub fn store(&self) -> &DB {
        &self.db
    }

    /// Stops the flusher after it has acknowledged everything queued.
    pub fn close(&self) {
        if let Ok(mut g) = self.flush_tx.lock() {
            g.take();
        }
        let h = self.flusher.lock().ok().and_then(|mut g| g.take());
        if let Some(h) = h {
            let _ = h.join();
        }
    }
}

/// The last handle gone, the flusher stops with it: a flusher left running would keep the
/// database open past the end of the process, which RocksDB does not survive (it aborts
/// in its own teardown).
impl Drop for LogDb {
    fn drop(&mut self) {
        self.close();
    }
}

impl LogDb {
    fn flush_sender(&self) -> Option<mpsc::Sender<LogFlushed<TypeConfig>>> {
        self.flush_tx.lock().ok().and_then(|g| g.clone())
    }
}

/// One fsync for every append queued while the previous one ran.
fn flush_loop(db: Arc<DB>, stats: Arc<LogStats>, rx: mpsc::Receiver<LogFlushed<TypeConfig>>) {
    while let Ok(first) = rx.recv() {
        let mut pending = vec![first];
        while let Ok(more) = rx.try_recv() {
            pending.push(more);
        }
        crate::fail_point!("log-fsync");
        let res = db.flush_wal(true);
        stats.syncs.fetch_add(1, Ordering::Relaxed);
        for cb in pending {
            match &res {
                Ok(()) => cb.log_io_completed(Ok(())),
                Err(e) => cb.log_io_completed(Err(std::io::Error::other(e.to_string()))),
            }
        }
    }
}

/// The last log id a partition's stored snapshot covers: set by its state machine once a
/// snapshot is durably in place, read by its log, which purges nothing past it. It also
/// counts the bytes the log took since that snapshot, for a snapshot by size (see
/// [`SnapshotMark::is_due`]).
///
/// openraft 0.9 asks to purge the log behind a received snapshot in the same step as it
/// hands the snapshot to the state machine, without waiting for the install. A crash between
/// the two left a log purged past the stored snapshot, and openraft then refuses to start
/// the group (it panics on `purge_upto <= snapshot_last_log_id`): finding F5 of the
/// fault-injection harness. So a purge past the stored snapshot waits for it.
#[derive(Debug)]
pub struct SnapshotMark {
    stored: tokio::sync::watch::Sender<Option<LogId<NodeId>>>,
    /// Bytes of entries appended to the group's log since the node started.
    appended: AtomicU64,
    /// `appended` when the stored snapshot was taken (its build began, or it was
    /// installed).
    at_snapshot: AtomicU64,
    /// Log bytes since the stored snapshot past which one is due (0: never by size).
    limit: AtomicU64,
    /// Woken when a snapshot falls due by size (see [`SnapshotMark::due`]).
    due: tokio::sync::Notify,
}

impl Default for SnapshotMark {
    fn default() -> SnapshotMark {
        SnapshotMark {
            stored: tokio::sync::watch::Sender::new(None),
            appended: AtomicU64::new(0),
            at_snapshot: AtomicU64::new(0),
            limit: AtomicU64::new(0),
            due: tokio::sync::Notify::new(),
        }
    }
}

/// Longest a purge waits for the snapshot it follows to be stored.
const PURGE_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

impl SnapshotMark {
    /// The last log id the stored snapshot covers (None: no snapshot).
    pub fn get(&self) -> Option<LogId<NodeId>> {
        *self.stored.borrow()
    }

    /// Records a snapshot durably stored up to `id`, taken when the log's byte count was
    /// `at` (see [`SnapshotMark::log_bytes`]).
    pub fn set(&self, id: Option<LogId<NodeId>>, at: u64) {
        self.at_snapshot.store(at, Ordering::Relaxed);
        self.stored.send_replace(id);
    }

    /// Bytes of entries appended to the group's log since the node started.
    pub fn log_bytes(&self) -> u64 {
        self.appended.load(Ordering::Relaxed)
    }

    /// Bytes of entries appended to the group's log since its stored snapshot was taken
    /// (since the node started, if that was before).
    pub fn log_bytes_since_snapshot(&self) -> u64 {
        self.log_bytes()
            .saturating_sub(self.at_snapshot.load(Ordering::Relaxed))
    }

    /// Makes a snapshot due once the log holds `bytes` since the stored one (0: never by
    /// size).
    pub fn snapshot_after_bytes(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// Whether the log holds more since the stored snapshot than its limit.
    pub fn is_due(&self) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        limit > 0 && self.log_bytes_since_snapshot() >= limit
    }

    /// Resolves once a snapshot may have fallen due by size (check [`SnapshotMark::is_due`]).
    pub async fn due(&self) {
        self.due.notified().await
    }

    fn appended(&self, bytes: u64) {
        self.appended.fetch_add(bytes, Ordering::Relaxed);
        if self.is_due() {
            self.due.notify_one();
        }
    }

    /// A receiver that sees each snapshot stored from now on.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<Option<LogId<NodeId>>> {
        self.stored.subscribe()
    }

    /// Waits until the stored snapshot reaches `id`, at most `limit`.
    async fn reach(&self, id: LogId<NodeId>, limit: std::time::Duration) -> Result<(), String> {
        let mut rx = self.stored.subscribe();
        let reached = tokio::time::timeout(limit, async {
            rx.wait_for(|m| *m >= Some(id)).await.map(|_| ())
        })
        .await;
        match reached {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err("the state machine is gone".into()),
            Err(_) => Err(format!(
                "no snapshot up to {id} was stored within {limit:?} (stored: {:?})",
                self.get()
            )),
        }
    }
}

/// A key and the record to put at it.
type KeyValue = (Vec<u8>, Vec<u8>);

/// The log store of one partition group (a handle on the node's shared log database).
#[derive(Clone, Debug)]
pub struct LogStore {
    group: u32,
    db: Arc<LogDb>,
    /// Purges wait for this snapshot mark (see [`SnapshotMark`]).
    mark: Option<Arc<SnapshotMark>>,
    /// The group's entries appended and not yet applied, shared by its readers.
    recent: Arc<Mutex<Recent>>,
    /// Reads through this handle are the apply's (the group's own handle, not a reader
    /// handed out for replication): they take what they read out of `recent`.
    applies: bool,
    /// The committed id openraft saved last, while it waits for the handle's next write
    /// (see the module's header).
    unsaved_committed: Option<Option<LogId<NodeId>>>,
}

/// A handle dropped with a committed id not yet saved saves it (not synced: it is where a
/// restart starts applying, not a promise; see the module's header). A reader handed out
/// for replication never holds one.
impl Drop for LogStore {
    fn drop(&mut self) {
        let saved = match self.unsaved_committed_put() {
            Ok(Some((key, value))) => self.db.db.put(key, value).map_err(|e| e.to_string()),
            Ok(None) => return,
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = saved {
            tracing::warn!(group = self.group, "save the committed id at a stop: {e}");
        }
    }
}

impl LogStore {
    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        // Nothing panics while holding it; a poisoned lock still holds a whole run.
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key(&self, tag: u8, index: Option<u64>) -> Vec<u8> {
        let mut k = Vec::with_capacity(13);
        k.extend_from_slice(&self.group.to_be_bytes());
        k.push(tag);
        if let Some(i) = index {
            k.extend_from_slice(&i.to_be_bytes());
        }
        k
    }

    /// The key and record of the committed id openraft saved and no write has carried yet.
    fn unsaved_committed_put(&self) -> Result<Option<KeyValue>, postcard::Error> {
        self.unsaved_committed
            .map(|c| Ok((self.key(b'c', None), crate::format::encode(&c)?)))
            .transpose()
    }

    fn get_meta<T: serde::de::DeserializeOwned>(
        &self,
        tag: u8,
        subject: ErrorSubject<NodeId>,
    ) -> Result<Option<T>, StorageError> {
        let Some(b) = self
            .db
            .db
            .get(self.key(tag, None))
            .map_err(|e| io_err(subject.clone(), ErrorVerb::Read, e))?
        else {
            return Ok(None);
        };
        crate::format::decode(&b).map(Some).map_err(|e| {
            io_err(
                subject,
                ErrorVerb::Read,
                Corrupt(format!("decode log metadata: {e}")),
            )
        })
    }

    async fn put_meta<T: serde::Serialize>(
        &mut self,
        tag: u8,
        v: &T,
        sync: bool,
        subject: ErrorSubject<NodeId>,
    ) -> Result<(), StorageError> {
        let b =
            crate::format::encode(v).map_err(|e| io_err(subject.clone(), ErrorVerb::Write, e))?;
        let key = self.key(tag, None);
        self.write_waiting(subject, ErrorVerb::Write, sync, || {
            let mut batch = WriteBatch::default();
            batch.put(&key, &b);
            batch
        })
        .await
    }

    /// Writes the batch `build` makes, with the committed id not yet saved, synced if
    /// `sync`; one that finds the disk full waits for room and is written again (see
    /// [`Gate::write_waiting`]).
    async fn write_waiting(
        &mut self,
        subject: ErrorSubject<NodeId>,
        verb: ErrorVerb,
        sync: bool,
        build: impl Fn() -> WriteBatch,
    ) -> Result<(), StorageError> {
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        let committed = self
            .unsaved_committed_put()
            .map_err(|e| io_err(subject.clone(), verb, e))?;
        let what = format!("the Raft log of group {}", self.group);
        Gate::write_waiting(self.db.gate.as_ref(), what, || {
            let mut batch = build();
            if let Some((key, value)) = &committed {
                batch.put(key, value);
            }
            self.db.db.write_opt(batch, &wo)
        })
        .await
        .map_err(|e| io_err(subject, verb, e))?;
        self.unsaved_committed = None;
        Ok(())
    }

    fn decode_entry(b: &[u8]) -> Result<Entry<TypeConfig>, StorageError> {
        crate::format::decode(b).map_err(|e| {
            io_err(
                ErrorSubject::Logs,
                ErrorVerb::Read,
                Corrupt(format!("decode log entry: {e}")),
            )
        })
    }

    /// The entries of `start..end` this log holds, read one key at a time in one view of
    /// the log. Apply and replication ask for the few entries just appended; while those
    /// are still in the memtable a point read never opens the log's table files, where an
    /// iterator opens one on every level.
    fn entries_by_key(&self, start: u64, end: u64) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let snap = self.db.db.snapshot();
        let mut out = Vec::with_capacity(end.saturating_sub(start) as usize);
        for idx in start..end {
            let value = snap
                .get_pinned(self.key(b'e', Some(idx)))
                .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
            // A missing entry is skipped, as a scan skips it: openraft reads ranges that
            // may begin before a log's first entry.
            if let Some(b) = value {
                out.push(Self::decode_entry(&b)?);
            }
        }
        Ok(out)
    }

    /// Entries from `start` up to `end` (the group's last when `None`), in one scan.
    fn entries_by_scan(
        &self,
        start: u64,
        end: Option<u64>,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let prefix = self.key(b'e', None);
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_upper_bound(self.key(b'e', Some(end.unwrap_or(u64::MAX))));
        let mut it = self.db.db.raw_iterator_opt(ro);
        it.seek(self.key(b'e', Some(start)));
        let mut out = Vec::new();
        while let Some(k) = it.key() {
            let idx = k
                .strip_prefix(prefix.as_slice())
                .and_then(|i| <[u8; 8]>::try_from(i).ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| {
                    io_err(
                        ErrorSubject::Logs,
                        ErrorVerb::Read,
                        Corrupt("log key".into()),
                    )
                })?;
            if end.is_some_and(|e| idx >= e) {
                break;
            }
            out.push(Self::decode_entry(it.value().unwrap_or_default())?);
            it.next();
        }
        it.status()
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
        Ok(out)
    }

    fn last_entry_id(&self) -> Result<Option<LogId<NodeId>>, StorageError> {
        let mut it = self.db.db.raw_iterator();
        it.seek_for_prev(self.key(b'e', Some(u64::MAX)));
        let prefix = self.key(b'e', None);
        let res = match it.key() {
            Some(k) if k.starts_with(&prefix) => {
                let e = Self::decode_entry(it.value().unwrap_or_default())?;
                Some(*e.get_log_id())
            }
            _ => None,
        };
        it.status()
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
        Ok(res)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.checked_add(1),
            Bound::Excluded(&e) => Some(e),
            Bound::Unbounded => None,
        };
        if let Some(held) = end.and_then(|end| self.recent().get(start, end, self.applies)) {
            return Ok(held);
        }
        match end {
            Some(end) if end.saturating_sub(start) <= POINT_READS_MAX => {
                self.entries_by_key(start, end)
            }
            _ => self.entries_by_scan(start, end),
        }
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId<NodeId>> = self.get_meta(b'p', ErrorSubject::Logs)?;
        let last = self.last_entry_id()?.or(last_purged);
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        let mut reader = self.clone();
        reader.applies = false;
        reader.unsaved_committed = None;
        reader
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.put_meta(b'v', vote, true, ErrorSubject::Vote).await
    }

    /// The stored vote, as a vote not known to have won (see the module's header: a
    /// replica never resumes leading after a restart).
    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        let vote: Option<Vote<NodeId>> = self.get_meta(b'v', ErrorSubject::Vote)?;
        Ok(vote.map(|v| Vote {
            committed: false,
            ..v
        }))
    }

    /// Kept until the handle's next write (see the module's header).
    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError> {
        self.unsaved_committed = Some(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError> {
        let committed = match self.unsaved_committed {
            Some(c) => c,
            None => self
                .get_meta::<Option<LogId<NodeId>>>(b'c', ErrorSubject::Store)?
                .flatten(),
        };
        // A follower that crashed while installing a snapshot may have saved a committed id
        // past the end of its log (the entries it lacks were in the snapshot). At start-up
        // openraft re-applies up to the committed id and would fail on the missing entries;
        // what this replica holds is all it can know to be committed.
        let last_purged: Option<LogId<NodeId>> = self.get_meta(b'p', ErrorSubject::Logs)?;
        let held = self.last_entry_id()?.max(last_purged);
        Ok(committed.min(held))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut puts = Vec::new();
        let mut kept = Vec::new();
        let mut bytes = 0;
        for e in entries {
            let b = crate::format::encode(&e)
                .map_err(|err| io_err(ErrorSubject::Logs, ErrorVerb::Write, err))?;
            let k = self.key(b'e', Some(e.get_log_id().index));
            bytes += k.len() + b.len();
            kept.push((e, b.len()));
            puts.push((k, b));
        }
        if let Some(g) = &self.db.gate {
            g.log_room(bytes as u64)
                .await
                .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Write, e))?;
        }
        self.write_waiting(ErrorSubject::Logs, ErrorVerb::Write, false, || {
            let mut batch = crate::kv::batch_with_room(puts.len(), bytes);
            for (k, b) in &puts {
                batch.put(k, b);
            }
            batch
        })
        .await?;
        self.recent().append(kept);
        self.db.stats.appends.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.mark {
            m.appended(bytes as u64);
        }
        match self.db.flush_sender() {
            Some(tx) => {
                if let Err(mpsc::SendError(cb)) = tx.send(callback) {
                    cb.log_io_completed(Err(std::io::Error::other("log flusher stopped")));
                }
            }
            None => callback.log_io_completed(Err(std::io::Error::other("log closed"))),
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        // Forgotten first: no read finds in memory what the log no longer holds.
        self.recent().truncate(log_id.index);
        let from = self.key(b'e', Some(log_id.index));
        let last = self.key(b'e', Some(u64::MAX));
        self.write_waiting(ErrorSubject::Logs, ErrorVerb::Delete, false, || {
            let mut batch = WriteBatch::default();
            batch.delete_range(&from, &last);
            batch.delete(&last);
            batch
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        if let Some(mark) = &self.mark {
            // Behind a received snapshot still being installed: wait for it to be stored.
            // (Purging less instead would leave a hole between the old entries kept and the
            // new ones appended after the snapshot.)
            mark.reach(log_id, PURGE_WAIT)
                .await
                .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Delete, Corrupt(e)))?;
        }
        self.recent().purge(log_id.index);
        let done: Option<LogId<NodeId>> = self.get_meta(b'p', ErrorSubject::Logs)?;
        if done >= Some(log_id) {
            return Ok(());
        }
        let b = crate::format::encode(&log_id)
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Write, e))?;
        let (mark_key, first, end) = (
            self.key(b'p', None),
            self.key(b'e', Some(0)),
            self.key(b'e', Some(log_id.index + 1)),
        );
        self.write_waiting(ErrorSubject::Logs, ErrorVerb::Delete, false, || {
            let mut batch = WriteBatch::default();
            batch.put(&mark_key, &b);
            batch.delete_range(&first, &end);
            batch
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};
    use std::time::Duration;

    fn id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    /// Entries 1..=last of group 3, written as `append` would (without its callback).
    fn store_with_entries(dir: &Path, last: u64, mark: Arc<SnapshotMark>) -> LogStore {
        let db = LogDb::open(&dir.join("log")).expect("open the log");
        let s = db.group_behind(3, mark);
        for i in 1..=last {
            let e = Entry::<TypeConfig> {
                log_id: id(i),
                payload: EntryPayload::Blank,
            };
            let b = crate::format::encode(&e).expect("encode an entry");
            s.db.db
                .put(s.key(b'e', Some(i)), b)
                .expect("write an entry");
        }
        s
    }

    /// A snapshot falls due by size once the log holds the limit since the stored one,
    /// counted from where that snapshot was taken; without a limit, never.
    #[tokio::test]
    async fn a_snapshot_falls_due_by_the_log_bytes_since_the_stored_one() {
        let mark = SnapshotMark::default();
        mark.appended(5_000);
        assert!(!mark.is_due(), "no limit set");
        mark.snapshot_after_bytes(4_000);
        assert!(mark.is_due());
        // Taken when the log held 4,500 bytes: 500 since.
        mark.set(Some(id(3)), 4_500);
        assert_eq!(mark.log_bytes_since_snapshot(), 500);
        assert!(!mark.is_due());
        mark.appended(3_499);
        assert!(!mark.is_due());
        mark.appended(1);
        assert!(mark.is_due());
        tokio::time::timeout(Duration::from_secs(5), mark.due())
            .await
            .expect("woken when it fell due");
    }

    /// A vote is read back at start-up as it was saved, except that a leader's (committed)
    /// vote comes back as one not known to have won, so that openraft starts the replica
    /// as a follower rather than as the leader of that term (finding F8).
    #[tokio::test]
    async fn a_leaders_vote_is_read_back_as_not_yet_won() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut s = store_with_entries(dir.path(), 0, Arc::new(SnapshotMark::default()));
        assert_eq!(s.read_vote().await.expect("read"), None);
        let mut vote = Vote::new(7, 2);
        s.save_vote(&vote).await.expect("save a candidate's vote");
        assert_eq!(s.read_vote().await.expect("read"), Some(vote));
        vote.commit();
        s.save_vote(&vote).await.expect("save a leader's vote");
        let read = s.read_vote().await.expect("read").expect("a vote");
        assert!(!read.is_committed());
        assert_eq!(read.leader_id(), vote.leader_id());
    }

    /// A purge waits for the stored snapshot to reach it, and a committed id past the log's
    /// end is not claimed at start-up. openraft purges behind a received snapshot before it
    /// is installed; a crash in between left a replica openraft refused to start
    /// (`talon-jepsen`, a crash at the `snapshot-install-files` fail point, finding F5).
    #[tokio::test]
    async fn a_purge_waits_for_the_stored_snapshot() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mark = Arc::new(SnapshotMark::default());
        let mut s = store_with_entries(dir.path(), 10, mark.clone());

        // No snapshot stored yet: the purge waits, and nothing is purged meanwhile.
        let mut purging = s.clone();
        let purge = tokio::spawn(async move { purging.purge(id(8)).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!purge.is_finished());
        let st = s.get_log_state().await.expect("log state");
        assert_eq!(st.last_purged_log_id, None);
        assert_eq!(s.try_get_log_entries(1..11).await.expect("read").len(), 10);

        // A snapshot short of it does not release it; one that reaches it does.
        mark.set(Some(id(5)), 0);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!purge.is_finished());
        mark.set(Some(id(9)), 0);
        purge.await.expect("join").expect("purge");
        let st = s.get_log_state().await.expect("log state");
        assert_eq!(st.last_purged_log_id, Some(id(8)));
        assert_eq!(st.last_log_id, Some(id(10)));
        assert_eq!(s.try_get_log_entries(9..11).await.expect("read").len(), 2);

        // A mark that never comes is an error after the bound, not a hang.
        let err = mark.reach(id(50), Duration::from_millis(50)).await;
        assert!(err.is_err());

        // A committed id saved past the entries this replica holds is read back as its end.
        s.save_committed(Some(id(20)))
            .await
            .expect("save committed");
        assert_eq!(s.read_committed().await.expect("read"), Some(id(10)));
        s.save_committed(Some(id(9))).await.expect("save committed");
        assert_eq!(s.read_committed().await.expect("read"), Some(id(9)));
    }

    /// openraft's save of the committed id is stored with the group handle's next write,
    /// or when the handle is dropped, not by a write of its own; the handle itself reads
    /// back what it was given at once.
    #[tokio::test]
    async fn the_committed_id_is_stored_with_the_next_write_or_at_the_drop() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mark = Arc::new(SnapshotMark::default());
        let mut s = store_with_entries(dir.path(), 4, mark.clone());
        let mut other = s.db.group_behind(3, mark);

        s.save_committed(Some(id(2))).await.expect("save committed");
        assert_eq!(s.read_committed().await.expect("read"), Some(id(2)));
        assert_eq!(other.read_committed().await.expect("read"), None);

        s.save_vote(&Vote::new(1, 1)).await.expect("save a vote");
        assert_eq!(other.read_committed().await.expect("read"), Some(id(2)));

        s.save_committed(Some(id(3))).await.expect("save committed");
        let mut reader = s.get_log_reader().await;
        drop(reader.try_get_log_entries(1..2).await.expect("read"));
        drop(reader);
        assert_eq!(other.read_committed().await.expect("read"), Some(id(2)));
        drop(s);
        assert_eq!(other.read_committed().await.expect("read"), Some(id(3)));
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("make the copy's directory");
        for f in files_where(from, |_| true) {
            let name = f.file_name().expect("a file's name");
            std::fs::copy(&f, to.join(name)).expect("copy a file");
        }
    }

    /// Entry `i` encoded as the log stores it, followed by `extra` bytes of `fill`: a value
    /// the size of an entry that carries a body.
    fn padded_entry(i: u64, extra: usize, fill: u8) -> Vec<u8> {
        let e = Entry::<TypeConfig> {
            log_id: id(i),
            payload: EntryPayload::Normal(crate::types::Command::Noop),
        };
        let mut b = crate::format::encode(&e).expect("encode an entry");
        b.resize(b.len() + extra, fill);
        b
    }

    /// Writes `value(i)` as entry `i` of `s`'s group for each of `indexes`, straight to the
    /// store (no sync).
    fn put_entries(
        s: &LogStore,
        indexes: impl IntoIterator<Item = u64>,
        value: impl Fn(u64) -> Vec<u8>,
    ) {
        for i in indexes {
            s.db.db.put(s.key(b'e', Some(i)), value(i)).expect("write");
        }
    }

    /// Asserts that entry `i` of `s`'s group holds `value(i)` for each of `indexes`.
    fn assert_entries(
        s: &LogStore,
        indexes: impl IntoIterator<Item = u64>,
        value: impl Fn(u64) -> Vec<u8>,
    ) {
        for i in indexes {
            assert_eq!(
                s.db.db.get(s.key(b'e', Some(i))).expect("read"),
                Some(value(i)),
                "entry {i}"
            );
        }
    }

    /// The files of `dir` whose names `pick` takes.
    fn files_where(dir: &Path, pick: impl Fn(&str) -> bool) -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .expect("list the log's files")
            .map(|f| f.expect("list the log's files"))
            .filter(|f| pick(&f.file_name().to_string_lossy()))
            .map(|f| f.path())
            .collect()
    }

    /// A WAL file written over after a memtable flush is read back to its last new record at
    /// a restart, not into the older records still behind it, and loses nothing before it.
    #[tokio::test]
    async fn a_log_reopens_whole_from_a_wal_file_written_over() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("log");
        let crashed = dir.path().join("crashed");
        let payload = |i: u64| padded_entry(i, 512, b'x');
        {
            let db = LogDb::open(&path).expect("open the log");
            let s = db.group(3);
            put_entries(&s, 1..=2_000, payload);
            // The memtable goes to a table file; its WAL file is kept, and the WAL file
            // after the next flush is that one, written over from its start.
            s.db.db.flush().expect("flush the memtable");
            put_entries(&s, [2_001], payload);
            s.db.db.flush().expect("flush the memtable");
            put_entries(&s, 2_002..=2_010, payload);
            s.db.db.flush_wal(true).expect("sync the WAL");
            // What a crash leaves on disk now: a clean close would cut the WAL file to
            // its new records, so the restart reads a copy taken before it.
            copy_dir(&path, &crashed);
        }
        // The current WAL file is the first one, written over: its older records follow.
        let largest_wal = files_where(&crashed, |n| n.ends_with(".log"))
            .iter()
            .filter_map(|f| f.metadata().ok().map(|m| m.len()))
            .max();
        assert!(largest_wal > Some(1 << 20), "{largest_wal:?}");
        let db = LogDb::open(&crashed).expect("reopen the log");
        let s = db.group(3);
        assert_entries(&s, [1, 1_000, 2_000, 2_001, 2_010], payload);
        assert_eq!(s.db.db.get(s.key(b'e', Some(2_011))).expect("read"), None);
    }

    /// Entries big enough for blob files, flushed (past the page cache where the file
    /// system takes that), are read back whole from the reopened log.
    #[tokio::test]
    async fn flushed_bodies_read_back_whole_after_a_reopen() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("log");
        let payload = |i: u64| padded_entry(i, 8_192 + i as usize, (i % 251) as u8);
        {
            let db = LogDb::open(&path).expect("open the log");
            let s = db.group(5);
            put_entries(&s, 1..=64, payload);
            s.db.db.flush().expect("flush the memtable");
        }
        let blob_files = files_where(&path, |n| n.ends_with(".blob"));
        assert!(!blob_files.is_empty(), "the bodies went to blob files");
        // The store flushed past the page cache exactly when its file system takes that.
        let options: Vec<String> = files_where(&path, |n| n.starts_with("OPTIONS-"))
            .iter()
            .map(|f| std::fs::read_to_string(f).expect("read the options"))
            .collect();
        let direct = format!(
            "use_direct_io_for_flush_and_compaction={}",
            direct_writes_work(&path)
        );
        assert!(!options.is_empty() && options.iter().all(|o| o.contains(&direct)));
        let db = LogDb::open(&path).expect("reopen the log");
        let s = db.group(5);
        assert_entries(&s, 1..=64, payload);
    }

    /// The probe for writes past the page cache leaves nothing behind, and a directory
    /// that is not there takes no writes.
    #[test]
    fn the_direct_write_probe_leaves_no_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let _ = direct_writes_work(dir.path());
        let left = files_where(dir.path(), |_| true);
        assert_eq!(left.len(), 0, "{left:?}");
        assert!(!direct_writes_work(&dir.path().join("absent")));
    }

    /// Appended entries are answered from memory until the apply's read takes them (a
    /// reader handed out for replication reads them without taking); a truncation or a
    /// purge leaves nothing in memory that the log no longer holds. The entries are taken
    /// out of the log's RocksDB behind its back, so that only memory can answer them.
    #[tokio::test]
    async fn appended_entries_are_answered_from_memory_until_applied() {
        use openraft::storage::RaftLogStorageExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let db = LogDb::open(&dir.path().join("log")).expect("open the log");
        let mut s = db.group(3);
        let reader = s.get_log_reader().await;
        let entry = |i: u64| Entry::<TypeConfig> {
            log_id: id(i),
            payload: EntryPayload::Blank,
        };
        s.blocking_append((1..=6).map(entry)).await.expect("append");
        for i in 1..=6 {
            s.db.db.delete(s.key(b'e', Some(i))).expect("delete");
        }
        let indexes = |v: Vec<Entry<TypeConfig>>| -> Vec<u64> {
            v.iter().map(|e| e.get_log_id().index).collect()
        };
        let read = |r: &LogStore, range: std::ops::Range<u64>| {
            let mut r = r.clone();
            async move { indexes(r.try_get_log_entries(range).await.expect("read")) }
        };
        assert_eq!(read(&reader, 2..5).await, vec![2, 3, 4]);
        assert_eq!(read(&reader, 2..5).await, vec![2, 3, 4], "not taken");
        // The apply's read takes them: then only the log (emptied here) answers.
        let applied = indexes(s.try_get_log_entries(1..4).await.expect("apply's read"));
        assert_eq!(applied, vec![1, 2, 3]);
        assert_eq!(read(&reader, 1..4).await, Vec::<u64>::new());
        assert_eq!(read(&reader, 4..7).await, vec![4, 5, 6]);
        s.truncate(id(5)).await.expect("truncate");
        assert_eq!(read(&reader, 4..5).await, vec![4]);
        assert_eq!(read(&reader, 5..7).await, Vec::<u64>::new(), "truncated");
        s.blocking_append((5..=5).map(entry))
            .await
            .expect("append again");
        s.purge(id(4)).await.expect("purge");
        assert_eq!(read(&reader, 4..5).await, Vec::<u64>::new(), "purged");
        assert_eq!(read(&reader, 5..6).await, vec![5], "appended again");
    }

    /// A short range is read key by key and a long one by a scan: both give the entries
    /// of the range the log holds, past a hole and up to the log's end.
    #[tokio::test]
    async fn a_range_reads_alike_key_by_key_and_by_scan() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut s = store_with_entries(dir.path(), 200, Arc::new(SnapshotMark::default()));
        s.db.db.delete(s.key(b'e', Some(150))).expect("make a hole");
        let indexes = |v: Vec<Entry<TypeConfig>>| v.iter().map(|e| e.log_id.index).collect();
        for (start, end, want) in [
            (3, 9, (3..9).collect::<Vec<u64>>()),
            (195, 260, (195..=200).collect()),
            (140, 160, (140..160).filter(|&i| i != 150).collect()),
            (150, 152, vec![151]),
            (0, 150, (1..150).collect()),
            (201, 210, vec![]),
        ] {
            let by_key: Vec<u64> = indexes(s.entries_by_key(start, end).expect("by key"));
            let by_scan: Vec<u64> = indexes(s.entries_by_scan(start, Some(end)).expect("scan"));
            assert_eq!(by_key, want, "{start}..{end} by key");
            assert_eq!(by_scan, want, "{start}..{end} by scan");
            let read: Vec<u64> = indexes(s.try_get_log_entries(start..end).await.expect("read"));
            assert_eq!(read, want, "{start}..{end}");
        }
        let to_end: Vec<u64> = indexes(s.try_get_log_entries(151..).await.expect("read"));
        assert_eq!(to_end, (151..=200).collect::<Vec<u64>>());
        let inclusive: Vec<u64> = indexes(s.try_get_log_entries(7..=7).await.expect("read"));
        assert_eq!(inclusive, vec![7]);
    }

    /// A log written by a newer release is refused at open, naming both versions.
    #[test]
    fn a_log_of_another_format_version_is_refused_naming_both() {
        use crate::format::{FORMAT, FORMAT_KEY};
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("log");
        let db = LogDb::open(&path).expect("create");
        db.db
            .put(FORMAT_KEY, (FORMAT + 1).to_be_bytes())
            .expect("stamp as a newer release would");
        db.close();
        drop(db);
        let e = LogDb::open(&path).expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains(&format!("in format {}", FORMAT + 1))
                && text.contains(&format!("reads format {FORMAT}")),
            "{text}"
        );
    }
}
