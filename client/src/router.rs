//! Request routing: which node gets an RPC for a partition, and what to do when it says no.
//!
//! The router owns the cluster map, one lazily connected channel per node address (or the
//! direct path to a node in this process, see [`crate::transport`]), and a leader hint per
//! partition. [`Router::call`] runs one logical request:
//!
//! - writes, strict reads and session reads go to the partition's hinted leader, or to its
//!   replicas in turn while no leader is known; relaxed reads go to any replica,
//!   round-robin;
//! - `NotLeader` switches to the named leader at once (or to the next replica);
//!   `Unavailable` and transport failures move to the next replica after a short backoff;
//!   `Retry` backs off and asks again (pauses of [`Backoff::rpc`]); `WrongPartition`
//!   refreshes the cluster map once and asks again;
//! - `StaleEpoch`, `ClassChanged`, POSIX and `Invalid` answers return to the caller at once:
//!   the router does not know how to re-resolve a path (the client's `settle` wrapper does);
//! - everything is bounded by the operation deadline (`ClientOptions::op_timeout`), after
//!   which the last error is returned.
//!
//! A write whose connection broke mid-flight, or whose leader stepped down while it was being
//! replicated, may have been applied; the router still sends the very same request again
//! elsewhere. Creates, renames, removes, links and xattr changes carry a request id that the
//! server records with the change, so such a copy is answered as the first attempt was,
//! never applied twice (see `meta/src/namespace.rs`). Other writes are idempotent as sent
//! (a setattr, a whole-body write, a layout commit at an expected generation).

use crate::bundle::Bundler;
use crate::cluster_map::ClusterMap;
use crate::error::ClientError;
use crate::options::ClientOptions;
use crate::transport::{Conn, LocalNode, NodeClient};
use crate::wire::requests;
use dashmap::DashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use talon_model::{Backoff, TalonError};
use tonic::transport::Endpoint;

/// Redirects followed in a row before the router starts pausing between them (two nodes
/// that each name the other as leader during an election must not spin).
const FREE_REDIRECTS: u32 = 3;

/// How a request may be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadKind {
    /// A mutation: only the leader may serve it.
    Write,
    /// A linearizable read: the leader serves it after confirming leadership.
    StrictRead,
    /// A read any replica may serve within the staleness bound.
    RelaxedRead,
    /// A relaxed read that must reflect this client's own recent writes (session
    /// consistency): it goes to the partition's leader, which serves it from its applied
    /// state without a ReadIndex round. A leader that has applied an entry of its own term
    /// has applied every write any leader acknowledged, and a write is acknowledged only
    /// once its leader applied it.
    SessionRead,
}

/// The cluster map plus the leader hints learnt since it was fetched.
struct MapState {
    map: ClusterMap,
    /// Leader node id per partition; 0 = unknown.
    leaders: Vec<AtomicU64>,
}

impl MapState {
    fn new(map: ClusterMap) -> MapState {
        let leaders = map
            .partition_info
            .iter()
            .map(|p| AtomicU64::new(p.leader_hint.unwrap_or(0)))
            .collect();
        MapState { map, leaders }
    }

    fn leader(&self, p: u32) -> Option<u64> {
        let id = self.leaders.get(p as usize)?.load(Ordering::Relaxed);
        (id != 0).then_some(id)
    }

    fn set_leader(&self, p: u32, id: u64) {
        if let Some(l) = self.leaders.get(p as usize) {
            l.store(id, Ordering::Relaxed);
        }
    }
}

/// Routes RPCs to partition replicas and retries them by the policy above.
pub struct Router {
    seeds: Vec<String>,
    state: RwLock<Arc<MapState>>,
    channels: DashMap<String, Conn>,
    /// Most requests in one bundle, shared by the connections' bundlers: the cluster map's
    /// `max_batch`, set whenever a map is taken.
    bundle_max: Arc<AtomicUsize>,
    /// Spreads relaxed reads over replicas.
    round_robin: AtomicUsize,
    /// Serialises cluster-map refreshes so a burst of WrongPartition answers fetches once.
    refresh: tokio::sync::Mutex<()>,
    opts: ClientOptions,
    /// RPC attempts sent so far, retries and cluster-map fetches included.
    rpcs: AtomicU64,
}

fn endpoint(addr: &str, opts: &ClientOptions) -> Result<Endpoint, String> {
    let uri = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    Endpoint::from_shared(uri)
        .map_err(|e| e.to_string())
        .map(|e| {
            e.connect_timeout(opts.connect_timeout)
                .timeout(opts.request_timeout)
                .tcp_nodelay(true)
                // HTTP/2's default 64 KiB windows cost a round trip per 64 KiB of a reply:
                // a 110 KB image would wait for a window update mid-reply.
                .initial_stream_window_size(Some(8 << 20))
                .initial_connection_window_size(Some(32 << 20))
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_while_idle(true)
        })
}

impl Router {
    /// Fetches the cluster map from the first seed that answers and returns a router over it.
    /// `local`, if given, is a node of the cluster served in this process: RPCs for it
    /// skip the network ([`crate::transport`]).
    pub async fn connect(
        seeds: &[String],
        opts: &ClientOptions,
        local: Option<LocalNode>,
    ) -> Result<Router, ClientError> {
        let seeds: Vec<String> = seeds
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .map(|s| s.strip_prefix("http://").unwrap_or(s).to_string())
            .collect();
        if seeds.is_empty() {
            return Err(ClientError::NoSeeds);
        }
        for s in &seeds {
            endpoint(s, opts).map_err(|reason| ClientError::BadAddress {
                addr: s.clone(),
                reason,
            })?;
        }
        let channels = DashMap::new();
        let bundle_max = Arc::new(AtomicUsize::new(1));
        if let Some(l) = local {
            channels.insert(l.addr().to_string(), Conn::Local(l));
        }
        let mut last = TalonError::Unavailable("no seed tried".into());
        let deadline = Instant::now() + opts.op_timeout;
        // A freshly started cluster may not have elected partition 0's leader yet, and the
        // map lives there: keep asking the seeds until the deadline.
        let mut backoff = Backoff::rpc();
        loop {
            for s in &seeds {
                let ch = Self::channel_in(&channels, s, opts, &bundle_max);
                match fetch_map(ch).await {
                    Ok(map) => {
                        bundle_max.store(map.max_batch.max(1) as usize, Ordering::Relaxed);
                        return Ok(Router {
                            seeds,
                            state: RwLock::new(Arc::new(MapState::new(map))),
                            channels,
                            bundle_max,
                            round_robin: AtomicUsize::new(rand::random::<u32>() as usize),
                            refresh: tokio::sync::Mutex::new(()),
                            opts: opts.clone(),
                            rpcs: AtomicU64::new(0),
                        });
                    }
                    Err(TalonError::Invalid(m)) => return Err(ClientError::BadClusterMap(m)),
                    Err(e) => last = e,
                }
            }
            let Some(pause) = backoff.pause_before(deadline) else {
                return Err(ClientError::Unreachable {
                    seeds: seeds.join(","),
                    last,
                });
            };
            tokio::time::sleep(pause).await;
        }
    }

    fn channel_in(
        channels: &DashMap<String, Conn>,
        addr: &str,
        opts: &ClientOptions,
        bundle_max: &Arc<AtomicUsize>,
    ) -> Conn {
        if let Some(c) = channels.get(addr) {
            return c.clone();
        }
        // Addresses come from the seeds (checked in `connect`) or from a validated map; a
        // malformed one still must not panic, so it maps to a channel that fails on use.
        let ch = match endpoint(addr, opts) {
            Ok(e) => e.connect_lazy(),
            Err(_) => Endpoint::from_static("http://invalid.invalid:1").connect_lazy(),
        };
        let bundler = Bundler::new(ch.clone(), opts.bundle_window, bundle_max.clone());
        channels
            .entry(addr.to_string())
            .or_insert(Conn::Net(ch, bundler))
            .clone()
    }

    fn channel(&self, addr: &str) -> Conn {
        Self::channel_in(&self.channels, addr, &self.opts, &self.bundle_max)
    }

    fn state(&self) -> Arc<MapState> {
        match self.state.read() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The current cluster map.
    pub fn map(&self) -> ClusterMap {
        self.state().map.clone()
    }

    /// Number of partitions.
    pub fn partitions(&self) -> u32 {
        self.state().map.partitions
    }

    /// The operation deadline.
    pub fn op_timeout(&self) -> Duration {
        self.opts.op_timeout
    }

    /// The leader hint of partition `p`, if any.
    pub fn leader_hint(&self, p: u32) -> Option<u64> {
        self.state().leader(p)
    }

    /// Fetches the cluster map again, from any known node or seed, and installs it. Returns
    /// the new map's epoch.
    pub async fn refresh_map(&self) -> Result<u64, TalonError> {
        let before = self.state();
        let _guard = self.refresh.lock().await;
        let now = self.state();
        if !Arc::ptr_eq(&before, &now) {
            // Someone else refreshed while we waited.
            return Ok(now.map.epoch);
        }
        let mut addrs: Vec<String> = now.map.nodes.iter().map(|n| n.addr.clone()).collect();
        for s in &self.seeds {
            if !addrs.contains(s) {
                addrs.push(s.clone());
            }
        }
        let mut last = TalonError::Unavailable("no node to ask for the cluster map".into());
        for a in addrs {
            self.rpcs.fetch_add(1, Ordering::Relaxed);
            match fetch_map(self.channel(&a)).await {
                Ok(map) => {
                    let epoch = map.epoch;
                    self.bundle_max
                        .store(map.max_batch.max(1) as usize, Ordering::Relaxed);
                    let fresh = Arc::new(MapState::new(map));
                    // Keep leader hints the new map does not know.
                    for p in 0..fresh.leaders.len() as u32 {
                        if fresh.leader(p).is_none() {
                            if let Some(l) = now.leader(p) {
                                if fresh.map.replicas(p).contains(&l) {
                                    fresh.set_leader(p, l);
                                }
                            }
                        }
                    }
                    match self.state.write() {
                        Ok(mut s) => *s = fresh,
                        Err(poisoned) => *poisoned.into_inner() = fresh,
                    }
                    return Ok(epoch);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Updates partition `p`'s leader hint from a `NotLeader` error that arrived outside
    /// [`Router::call`] (inside a batch reply); other errors clear the hint.
    pub fn learn_leader(&self, p: u32, err: &TalonError) {
        let state = self.state();
        let hinted = match err {
            TalonError::NotLeader {
                leader_id,
                leader_addr,
                ..
            } => leader_addr
                .as_deref()
                .and_then(|a| state.map.node_by_addr(a))
                .map(|n| n.id)
                .or(*leader_id)
                .filter(|id| state.map.replicas(p).contains(id)),
            _ => None,
        };
        state.set_leader(p, hinted.unwrap_or(0));
    }

    /// RPC attempts this router has sent: every attempt of [`Router::call`] (retries
    /// included), every [`Router::call_node`] and every cluster-map fetch after connecting.
    /// A benchmark divides its change over a workload by the operations it made to get
    /// the round trips each one cost.
    pub fn rpc_count(&self) -> u64 {
        self.rpcs.load(Ordering::Relaxed)
    }

    /// The bundles this router's connections sent ([`crate::bundle`]), and the requests
    /// they carried.
    pub fn bundle_counts(&self) -> (u64, u64) {
        self.channels
            .iter()
            .fold((0, 0), |(b, r), c| match c.value() {
                Conn::Net(_, Some(bundler)) => {
                    let (b2, r2) = bundler.counts();
                    (b + b2, r + r2)
                }
                _ => (b, r),
            })
    }

    /// Sends one RPC to node `id` without routing or retries (used for `Status`).
    pub async fn call_node<T, F, Fut>(&self, id: u64, f: F) -> Result<T, TalonError>
    where
        F: FnOnce(NodeClient) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let state = self.state();
        let node = state
            .map
            .node(id)
            .ok_or_else(|| TalonError::Invalid(format!("no node {id} in the cluster map")))?;
        let client = NodeClient::new(self.channel(&node.addr));
        self.rpcs.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(self.opts.request_timeout, f(client)).await {
            Ok(r) => r.map(|r| r.into_inner()).map_err(TalonError::from),
            Err(_) => Err(TalonError::Unavailable(format!(
                "node {id} did not answer in time"
            ))),
        }
    }

    /// Runs one request for partition `partition` with the retry policy in the module docs.
    /// `f` is called once per attempt with a client for the chosen node.
    pub async fn call<T, F, Fut>(
        &self,
        partition: u32,
        read: ReadKind,
        f: F,
    ) -> Result<T, TalonError>
    where
        F: Fn(NodeClient) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = Instant::now() + self.opts.op_timeout;
        let mut backoff = Backoff::rpc();
        let mut refreshed = false;
        let mut redirects = 0u32;
        // The node to try next, when a previous answer named one.
        let mut next: Option<u64> = None;
        // Position in the replica list for leaderless / relaxed rotation.
        let mut turn = match read {
            ReadKind::RelaxedRead => self.round_robin.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        let mut last = TalonError::Unavailable(format!("partition {partition}: no attempt made"));
        loop {
            let state = self.state();
            let replicas = state.map.replicas(partition);
            if replicas.is_empty() {
                return Err(TalonError::Invalid(format!(
                    "partition {partition} is not in the cluster map ({} partitions)",
                    state.map.partitions
                )));
            }
            let node_id = match (next.take(), read) {
                (Some(n), _) => n,
                (None, ReadKind::RelaxedRead) => replicas[turn % replicas.len()],
                (None, _) => match state.leader(partition) {
                    Some(l) => l,
                    None => replicas[turn % replicas.len()],
                },
            };
            let Some(node) = state.map.node(node_id) else {
                // A hint naming a node the map does not know: forget it.
                state.set_leader(partition, 0);
                turn += 1;
                continue;
            };
            let client = NodeClient::new(self.channel(&node.addr));
            self.rpcs.fetch_add(1, Ordering::Relaxed);
            let remaining = deadline.saturating_duration_since(Instant::now());
            let outcome = match tokio::time::timeout(remaining, f(client)).await {
                Ok(r) => r,
                Err(_) => return Err(last),
            };
            let err = match outcome {
                Ok(reply) => {
                    if read != ReadKind::RelaxedRead {
                        state.set_leader(partition, node_id);
                    }
                    return Ok(reply.into_inner());
                }
                Err(status) => TalonError::from(status),
            };
            let wait = match &err {
                TalonError::NotLeader {
                    leader_id,
                    leader_addr,
                    ..
                } => {
                    let hinted = leader_addr
                        .as_deref()
                        .and_then(|a| state.map.node_by_addr(a))
                        .map(|n| n.id)
                        .or(*leader_id)
                        .filter(|id| *id != node_id && replicas.contains(id));
                    match hinted {
                        Some(l) => {
                            state.set_leader(partition, l);
                            next = Some(l);
                            redirects += 1;
                            redirects > FREE_REDIRECTS
                        }
                        None => {
                            // An election is under way: try the next replica shortly.
                            state.set_leader(partition, 0);
                            turn = replicas.iter().position(|r| *r == node_id).unwrap_or(turn) + 1;
                            true
                        }
                    }
                }
                TalonError::Unavailable(_) => {
                    if state.leader(partition) == Some(node_id) {
                        state.set_leader(partition, 0);
                    }
                    turn = replicas.iter().position(|r| *r == node_id).unwrap_or(turn) + 1;
                    true
                }
                TalonError::Retry(_) => {
                    next = Some(node_id);
                    true
                }
                TalonError::WrongPartition(_) if !refreshed => {
                    refreshed = true;
                    if let Err(e) = self.refresh_map().await {
                        tracing::debug!(partition, error = %e, "cluster map refresh failed");
                    }
                    false
                }
                _ => return Err(err),
            };
            tracing::trace!(partition, node = node_id, error = %err, "retrying");
            last = err;
            if wait {
                let Some(p) = backoff.pause_before(deadline) else {
                    return Err(last);
                };
                tokio::time::sleep(p).await;
            } else if Instant::now() >= deadline {
                return Err(last);
            }
        }
    }
}

async fn fetch_map(ch: Conn) -> Result<ClusterMap, TalonError> {
    let mut client = NodeClient::new(ch);
    let reply = client
        .get_cluster_map(requests::cluster_map())
        .await
        .map_err(TalonError::from)?;
    ClusterMap::try_from(reply.into_inner())
}
