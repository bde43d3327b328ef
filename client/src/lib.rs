//! Talon's embedded client library and the `talon` command.
//!
//! A [`Client`] holds the cluster map and one lazily connected gRPC channel per node
//! ([`router`]; a node in the client's own process is called directly, [`transport`]), a
//! path-resolution cache invalidated by the namespace epoch and bounded by
//! a TTL for relaxed paths ([`path_cache`]), and exposes two layers of operations:
//!
//! - inode-level calls that map one to one onto the namespace RPCs (for the FUSE mount),
//!   such as [`Client::lookup`], [`Client::create`] and [`Client::readdir_page`];
//! - path-level helpers that resolve `/a/b/c` through the cache, such as [`Client::stat`],
//!   [`Client::mkdir`], [`Client::rename`] and [`Client::read_dir`];
//! - file contents ([`data`], [`file`](mod@file)): [`Client::read_file`], [`Client::write_file`] and
//!   an open [`File`] with `AsyncRead`, `AsyncWrite` and `AsyncSeek`; bulk loading of a
//!   local tree ([`import`]).
//!
//! All operations return [`TalonError`]; a POSIX failure is `TalonError::Posix` with the
//! errno a local file system would give. Only [`Client::connect`] has its own error type,
//! [`ClientError`].

pub mod batch;
pub mod bundle;
pub mod cli;
pub mod client;
pub mod cluster_map;
pub mod data;
pub mod dir;
pub mod error;
pub mod file;
pub mod fuse;
pub mod import;
pub(crate) mod open_session;
pub mod options;
pub mod path;
pub mod path_cache;
pub mod paths;
pub mod router;
pub(crate) mod settle;
pub mod transfer;
pub mod transport;
pub mod types;
#[cfg(feature = "server")]
pub mod up;
pub(crate) mod wire;

pub use client::Client;
pub use cluster_map::{ClusterMap, NodeInfo, PartitionInfo};
pub use dir::{DirCursor, ReadDir};
pub use error::ClientError;
pub use file::{File, OpenOptions};
pub use import::{ImportOptions, ImportProgress, ImportSummary};
pub use options::ClientOptions;
pub use router::ReadKind;
pub use talon_model::{Attr, Class, Errno, FileKind, Ino, TalonError, Time};
pub use talon_model::{ChunkRef, Layout};
pub use transport::LocalNode;
pub use types::{
    CreateSpec, DirEntry, MkdirOptions, NodeLoad, NodeSpace, NodeStatus, PartitionStatus,
    RenameFlags, SetAttr, StatFs, TimeSet, XattrFlags,
};
