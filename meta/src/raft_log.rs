//! The Raft log of every partition replica on a node, in one RocksDB instance.
//!
//! Keys are `group (u32 BE) ‖ tag ‖ ...`: `e` ‖ index (u64 BE) for entries, `v` for the
//! vote, `c` for the committed id, `p` for the last purged id. Because all groups share one
//! instance, they share one WAL: `append` writes entries without syncing (they are
//! readable at once, as openraft requires) and hands its callback to the node's flusher
//! thread, which fsyncs the WAL once for every append that arrived meanwhile and then
//! acknowledges them all — group commit across partitions. Votes are written with a sync
//! of their own, since a vote must be durable before it is answered.

use crate::types::{NodeId, StorageError, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, Entry, ErrorSubject, ErrorVerb, LogId, RaftLogId, StorageIOError, Vote};
use rocksdb::{Options, WriteBatch, WriteOptions, DB};
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

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
}

/// Where appends wait for disk space: the node's space, and its stop signal.
#[derive(Clone, Debug)]
pub struct LogGate {
    /// The node's data file system.
    pub space: Arc<crate::space::Space>,
    /// Fires when the node stops; a waiting append then fails.
    pub cancel: tokio_util::sync::CancellationToken,
}

/// The node-wide log database and its WAL flusher.
pub struct LogDb {
    db: Arc<DB>,
    /// Holds appends back while the disk is all but full (see `crate::space`).
    gate: Option<LogGate>,
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
        gate: Option<LogGate>,
        tuning: &crate::tuning::Tuning,
    ) -> Result<Arc<LogDb>, LogOpenError> {
        let mut o = Options::default();
        tuning.apply(&mut o);
        // Entries that carry file data go to blob files, so compaction rewrites only keys
        // and references: a compaction of inline values would need as much free disk as the
        // log holds. The log is purged in order, so whole blob files fall out of use and are
        // deleted without garbage collection rewriting anything.
        o.set_enable_blob_files(true);
        o.set_min_blob_size(4096);
        o.set_enable_blob_gc(false);
        o.create_if_missing(true);
        o.set_max_background_jobs(2);
        o.set_keep_log_file_num(2);
        let db = Arc::new(DB::open(&o, path)?);
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

    /// The log store of one group.
    pub fn group(self: &Arc<Self>, group: u32) -> LogStore {
        LogStore {
            group,
            db: self.clone(),
        }
    }

    /// Group-commit counters: (appends, fsyncs) since the node started.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.stats.appends.load(Ordering::Relaxed),
            self.stats.syncs.load(Ordering::Relaxed),
        )
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

/// The log store of one partition group (a handle on the node's shared log database).
#[derive(Clone, Debug)]
pub struct LogStore {
    group: u32,
    db: Arc<LogDb>,
}

impl LogStore {
    fn key(&self, tag: u8, index: Option<u64>) -> Vec<u8> {
        let mut k = Vec::with_capacity(13);
        k.extend_from_slice(&self.group.to_be_bytes());
        k.push(tag);
        if let Some(i) = index {
            k.extend_from_slice(&i.to_be_bytes());
        }
        k
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
        bincode::deserialize(&b).map(Some).map_err(|e| {
            io_err(
                subject,
                ErrorVerb::Read,
                Corrupt(format!("decode log metadata: {e}")),
            )
        })
    }

    fn put_meta<T: serde::Serialize>(
        &self,
        tag: u8,
        v: &T,
        sync: bool,
        subject: ErrorSubject<NodeId>,
    ) -> Result<(), StorageError> {
        let b = bincode::serialize(v).map_err(|e| io_err(subject.clone(), ErrorVerb::Write, e))?;
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db
            .db
            .put_opt(self.key(tag, None), b, &wo)
            .map_err(|e| io_err(subject, ErrorVerb::Write, e))
    }

    fn decode_entry(b: &[u8]) -> Result<Entry<TypeConfig>, StorageError> {
        bincode::deserialize(b).map_err(|e| {
            io_err(
                ErrorSubject::Logs,
                ErrorVerb::Read,
                Corrupt(format!("decode log entry: {e}")),
            )
        })
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
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let prefix = self.key(b'e', None);
        let mut it = self.db.db.raw_iterator();
        it.seek(self.key(b'e', Some(start)));
        let mut out = Vec::new();
        while let Some(k) = it.key() {
            if !k.starts_with(&prefix) {
                break;
            }
            let idx = u64::from_be_bytes(k[prefix.len()..].try_into().map_err(|_| {
                io_err(
                    ErrorSubject::Logs,
                    ErrorVerb::Read,
                    Corrupt("log key".into()),
                )
            })?);
            if !range.contains(&idx) {
                break;
            }
            out.push(Self::decode_entry(it.value().unwrap_or_default())?);
            it.next();
        }
        it.status()
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
        Ok(out)
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
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.put_meta(b'v', vote, true, ErrorSubject::Vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.get_meta(b'v', ErrorSubject::Vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError> {
        self.put_meta(b'c', &committed, false, ErrorSubject::Store)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError> {
        Ok(self
            .get_meta::<Option<LogId<NodeId>>>(b'c', ErrorSubject::Store)?
            .flatten())
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
        let mut batch = WriteBatch::default();
        for e in entries {
            let b = bincode::serialize(&e)
                .map_err(|err| io_err(ErrorSubject::Logs, ErrorVerb::Write, err))?;
            batch.put(self.key(b'e', Some(e.get_log_id().index)), b);
        }
        if let Some(g) = &self.db.gate {
            g.space
                .wait_for_log_room(batch.size_in_bytes() as u64, &g.cancel)
                .await
                .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Write, e))?;
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(false);
        self.db
            .db
            .write_opt(batch, &wo)
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Write, e))?;
        self.db.stats.appends.fetch_add(1, Ordering::Relaxed);
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
        let mut batch = WriteBatch::default();
        batch.delete_range(
            self.key(b'e', Some(log_id.index)),
            self.key(b'e', Some(u64::MAX)),
        );
        batch.delete(self.key(b'e', Some(u64::MAX)));
        self.db
            .db
            .write(batch)
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        let b = bincode::serialize(&log_id)
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Write, e))?;
        let mut batch = WriteBatch::default();
        batch.put(self.key(b'p', None), b);
        batch.delete_range(
            self.key(b'e', Some(0)),
            self.key(b'e', Some(log_id.index + 1)),
        );
        self.db
            .db
            .write(batch)
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }
}
