//! talon-meta: Talon's metadata server. A node hosts replicas of many partitions (one
//! openraft group each, multi-Raft), keeps every group's Raft log in one RocksDB and each
//! partition's state in a RocksDB of its own, and serves the client API and the node-to-node
//! Raft/transaction service on one gRPC port.
//!
//! Map of the crate:
//! - `config`: the node's TOML configuration and its validation.
//! - `types`: the Raft type config and the replicated command language (ops, commands).
//! - `keys`: the key schema of a partition's state.
//! - `apply`: deterministic application of commands (preconditions, locks, mutations).
//! - `sm`: the per-partition state machine on RocksDB, with checkpoint snapshots.
//! - `space`: fullness of the node's data file system, thresholds and the start-up reserve.
//! - `tuning`: RocksDB memtable sizes shared by a node's stores.
//! - `raft_log`: the node's shared Raft log with group commit of WAL fsyncs.
//! - `network`: node-to-node channels and openraft's network for every group.
//! - `partition`: one hosted replica with its proposal merging and read barrier.
//! - `node`: a whole node: startup, routing to other partitions' leaders, shutdown.
//! - `namespace`: the namespace operations (planning op lists per partition).
//! - `data`: file contents: packed small-file bodies, chunks, layouts, checksums, GC.
//! - `txn`: two-phase commit across partitions and recovery of stale intents.
//! - `service`: the gRPC edge: wire validation and error mapping.
//! - `failpoints`: named steps a fault-injection harness can crash or slow (a feature).

pub mod apply;
pub mod config;
pub mod data;
pub mod failpoints;
pub mod keys;
pub mod namespace;
pub mod network;
pub mod node;
pub mod partition;
pub mod raft_log;
pub mod service;
pub mod sm;
pub mod space;
pub mod tuning;
pub mod txn;
pub mod types;
