//! Client tuning knobs. Every field has a default that suits a data loader on a healthy
//! cluster; the cluster map supplies the rest (staleness bound, batch size, strict prefixes).

use std::time::Duration;

/// How a [`Client`](crate::Client) behaves.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Total time one operation may spend, including retries; after it the last error is
    /// returned.
    pub op_timeout: Duration,
    /// How long cached entries of relaxed directories are trusted. `None` takes the cluster
    /// map's `relaxed_staleness_ms`.
    pub relaxed_ttl: Option<Duration>,
    /// Owner of created inodes.
    pub uid: u32,
    /// Group of created inodes.
    pub gid: u32,
    /// Time allowed to open a TCP connection to a node.
    pub connect_timeout: Duration,
    /// Time allowed for one RPC attempt.
    pub request_timeout: Duration,
    /// Most entries each path-cache table holds before it is pruned.
    pub cache_capacity: usize,
    /// Batch RPCs in flight at once in the batch operations.
    pub batch_concurrency: usize,
    /// RPCs of one kind (relaxed reads, strict reads, writes) in flight to one node before
    /// further lookups, getattrs, creates and removes wait to go together in one bundle
    /// ([`crate::bundle`]); 0 sends each on its own RPC.
    pub bundle_window: usize,
    /// Bytes this client may hold for files read in order beyond what their readers asked
    /// for: the rest of a chunk, fetched at a reader's first read of it, and the next chunk,
    /// fetched while it reads one (up to two chunks per such file). A reader that finds it
    /// spent is sent what it asks for and no more; 0 turns read-ahead off.
    pub read_ahead_bytes: u64,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            op_timeout: Duration::from_secs(30),
            relaxed_ttl: None,
            uid: 0,
            gid: 0,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(10),
            cache_capacity: 1 << 20,
            batch_concurrency: 16,
            bundle_window: 2,
            read_ahead_bytes: 256 << 20,
        }
    }
}
