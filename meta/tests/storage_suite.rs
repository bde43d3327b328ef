//! Conformance: the RocksDB Raft log and partition state machine pass openraft's storage
//! test suite (log reads, truncation, purge, vote, membership, snapshots, apply).

use openraft::testing::{StoreBuilder, Suite};
use talon_meta::raft_log::{LogDb, LogStore};
use talon_meta::sm::{PartitionSm, SmStore};
use talon_meta::types::{StorageError, TypeConfig};

struct Builder;

/// Keeps the temporary directory and closes the log database when a case ends.
struct Guard {
    log: std::sync::Arc<LogDb>,
    _dir: tempfile::TempDir,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.log.close();
    }
}

impl StoreBuilder<TypeConfig, LogStore, PartitionSm, Guard> for Builder {
    async fn build(&self) -> Result<(Guard, LogStore, PartitionSm), StorageError> {
        let dir = tempfile::tempdir().expect("create temp dir");
        let log = LogDb::open(&dir.path().join("log")).expect("open log db");
        // Partition 3: not partition 0, whose seeded root would count as applied state.
        let store = SmStore::open(&dir.path().join("sm"), 3, b"").expect("open state machine");
        let ls = log.group(3);
        Ok((Guard { log, _dir: dir }, ls, PartitionSm::new(store)))
    }
}

#[test]
fn rocksdb_storage_passes_openraft_suite() -> Result<(), StorageError> {
    Suite::test_all(Builder)
}
