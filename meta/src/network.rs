//! Node-to-node transport: one tonic channel per peer node, shared by every partition
//! group's Raft traffic and by transaction calls between partition leaders (multi-Raft
//! over one connection). Implements openraft's `RaftNetworkFactory` per partition.
//!
//! Payloads are postcard (see `format`) of openraft's request/response types, wrapped in a `RaftRequest`
//! that names the partition. A transport failure is reported to openraft as `Unreachable`
//! so it backs off; an error raised by the remote Raft is passed through as `RemoteError`.
//!
//! AppendEntries to one peer go through that peer's queue: at most [`APPENDS_IN_FLIGHT`]
//! calls are under way to it at a time, and the appends of every group queued meanwhile
//! leave together in the next call (`AppendBatch`), each answered on its own. A commit is
//! an append to each follower and another carrying the commit index, per group; with many
//! groups busy, one message per peer then carries many of them instead of one HTTP/2
//! stream each. An idle node's appends leave at once, alone; a big one (file data) goes
//! beside the queue, so that small appends do not wait behind its transfer.

use crate::types::{NodeId, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::{de::DeserializeOwned, Serialize};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use talon_proto::raft::raft_client::RaftClient;
use talon_proto::raft::{RaftBatch, RaftReply, RaftRequest};
use tokio::sync::oneshot;
use tonic::transport::{Channel, Endpoint};

/// Largest gRPC message between nodes (snapshot chunks, large appends).
pub const MAX_PEER_MESSAGE: usize = 160 << 20;

/// Most appends in one `AppendBatch` (a receiver refuses more).
pub const MAX_APPEND_BATCH: usize = 256;

/// Calls under way to one peer at a time carrying appends; the rest wait in its queue.
const APPENDS_IN_FLIGHT: usize = 2;

/// Payload bytes past which a batch takes no more appends (the next call takes them).
const APPEND_BATCH_BYTES: usize = 8 << 20;

/// An append bigger than this (file data) goes alone, beside the queue: the small appends
/// of other groups do not wait behind its transfer and fsync.
const QUEUED_APPEND_MAX: usize = 256 << 10;

/// Channels to the other nodes of the cluster, created lazily and kept for the node's life.
#[derive(Debug)]
pub struct Peers {
    addrs: HashMap<NodeId, String>,
    channels: Mutex<HashMap<NodeId, Channel>>,
    appends: Mutex<HashMap<NodeId, Arc<AppendQueue>>>,
    /// Calls that carried appends, and the appends they carried.
    append_calls: AtomicU64,
    appends_sent: AtomicU64,
}

/// A transport-level failure talking to a peer.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PeerError {
    /// The node id is not in the cluster.
    #[error("unknown node {0}")]
    UnknownNode(NodeId),
    /// The address does not parse as an endpoint.
    #[error("bad address {0}: {1}")]
    BadAddr(String, String),
    /// The RPC failed in transport.
    #[error("rpc to node {0}: {1}")]
    Transport(NodeId, String),
    /// The remote answered with an error string.
    #[error("node {0} answered: {1}")]
    Remote(NodeId, String),
    /// A payload did not decode.
    #[error("decode reply from node {0}: {1}")]
    Decode(NodeId, String),
}

impl Peers {
    /// Peers of a cluster with these node addresses.
    pub fn new(addrs: HashMap<NodeId, String>) -> Arc<Peers> {
        Arc::new(Peers {
            addrs,
            channels: Mutex::new(HashMap::new()),
            appends: Mutex::new(HashMap::new()),
            append_calls: AtomicU64::new(0),
            appends_sent: AtomicU64::new(0),
        })
    }

    /// The address of node `id`.
    pub fn addr(&self, id: NodeId) -> Option<&str> {
        self.addrs.get(&id).map(String::as_str)
    }

    /// The node id listening at `addr`.
    pub fn id_of(&self, addr: &str) -> Option<NodeId> {
        self.addrs
            .iter()
            .find(|(_, a)| a.as_str() == addr)
            .map(|(id, _)| *id)
    }

    /// The channel to node `id`, connected lazily.
    pub fn channel(&self, id: NodeId) -> Result<Channel, PeerError> {
        let mut g = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = g.get(&id) {
            return Ok(c.clone());
        }
        let addr = self.addrs.get(&id).ok_or(PeerError::UnknownNode(id))?;
        let ep = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| PeerError::BadAddr(addr.clone(), e.to_string()))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            // Appends carry megabytes of file data: default 64 KiB HTTP/2 windows would
            // stall them on window updates.
            .initial_stream_window_size(Some(16 << 20))
            .initial_connection_window_size(Some(64 << 20))
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5));
        let ch = ep.connect_lazy();
        g.insert(id, ch.clone());
        Ok(ch)
    }

    fn client(&self, id: NodeId) -> Result<RaftClient<Channel>, PeerError> {
        Ok(RaftClient::new(self.channel(id)?)
            .max_decoding_message_size(MAX_PEER_MESSAGE)
            .max_encoding_message_size(MAX_PEER_MESSAGE))
    }

    /// Sends one call of `kind` to node `id` for `partition` and decodes the reply.
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
        self: &Arc<Self>,
        id: NodeId,
        kind: PeerRpc,
        partition: u32,
        req: &Req,
        timeout: Duration,
    ) -> Result<Result<Resp, Vec<u8>>, PeerError> {
        let payload =
            crate::format::encode(req).map_err(|e| PeerError::Decode(id, e.to_string()))?;
        let request = RaftRequest {
            partition,
            payload: payload.into(),
            format: crate::format::FORMAT,
        };
        let reply = match kind {
            PeerRpc::Append => self.append(id, request, timeout).await?,
            _ => send_one(id, self.client(id)?, kind, request, timeout).await?,
        };
        crate::format::check_message(&format!("node {id}"), reply.format)
            .map_err(|e| PeerError::Decode(id, e.to_string()))?;
        if !reply.error.is_empty() && reply.error_payload.is_empty() {
            return Err(PeerError::Remote(id, reply.error));
        }
        if !reply.error_payload.is_empty() {
            return Ok(Err(reply.error_payload.to_vec()));
        }
        crate::format::decode(&reply.payload)
            .map(Ok)
            .map_err(|e| PeerError::Decode(id, e.to_string()))
    }

    /// Calls to peers that carried appends, and the appends they carried, since start.
    pub fn append_counts(&self) -> (u64, u64) {
        (
            self.append_calls.load(Ordering::Relaxed),
            self.appends_sent.load(Ordering::Relaxed),
        )
    }

    /// Sends an AppendEntries through node `id`'s queue (see the module's header).
    async fn append(
        self: &Arc<Self>,
        id: NodeId,
        request: RaftRequest,
        timeout: Duration,
    ) -> Result<RaftReply, PeerError> {
        let client = self.client(id)?;
        if request.payload.len() > QUEUED_APPEND_MAX {
            self.append_calls.fetch_add(1, Ordering::Relaxed);
            self.appends_sent.fetch_add(1, Ordering::Relaxed);
            return send_one(id, client, PeerRpc::Append, request, timeout).await;
        }
        let queue = self
            .appends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_default()
            .clone();
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut st = queue.state.lock().unwrap_or_else(|p| p.into_inner());
            st.waiting.push_back(Queued {
                request,
                timeout,
                reply: tx,
            });
            let start = st.in_flight < APPENDS_IN_FLIGHT;
            st.in_flight += usize::from(start);
            start
        };
        if start {
            tokio::spawn(drain_appends(self.clone(), id, client, queue));
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(PeerError::Transport(id, "append dropped".into())),
            Err(_) => Err(PeerError::Transport(id, "timed out".into())),
        }
    }
}

/// One call of `kind` to node `id`, answered or failed within `timeout`.
async fn send_one(
    id: NodeId,
    mut client: RaftClient<Channel>,
    kind: PeerRpc,
    request: RaftRequest,
    timeout: Duration,
) -> Result<RaftReply, PeerError> {
    let mut request = tonic::Request::new(request);
    request.set_timeout(timeout);
    let fut = async {
        match kind {
            PeerRpc::Append => client.append_entries(request).await,
            PeerRpc::Vote => client.vote(request).await,
            PeerRpc::Snapshot => client.install_snapshot(request).await,
            PeerRpc::Peer => client.peer(request).await,
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(transport(id, &s)),
        Err(_) => Err(PeerError::Transport(id, "timed out".into())),
    }
}

fn transport(id: NodeId, s: &tonic::Status) -> PeerError {
    PeerError::Transport(id, format!("{:?}: {}", s.code(), s.message()))
}

/// The appends waiting for one peer, and how many calls carry others to it now.
#[derive(Debug, Default)]
struct AppendQueue {
    state: Mutex<QueueState>,
    /// Set once the peer answers that it does not serve `AppendBatch` (an older build):
    /// its appends then go one per call.
    singles_only: AtomicBool,
}

#[derive(Debug, Default)]
struct QueueState {
    waiting: VecDeque<Queued>,
    in_flight: usize,
}

/// An append waiting for its call, and where its answer goes.
#[derive(Debug)]
struct Queued {
    request: RaftRequest,
    timeout: Duration,
    reply: oneshot::Sender<Result<RaftReply, PeerError>>,
}

/// One of a peer's call slots: sends what waits in its queue, a batch per call, until
/// nothing does.
async fn drain_appends(
    peers: Arc<Peers>,
    id: NodeId,
    client: RaftClient<Channel>,
    queue: Arc<AppendQueue>,
) {
    loop {
        let batch = {
            let mut st = queue.state.lock().unwrap_or_else(|p| p.into_inner());
            let batch = next_batch(&mut st.waiting);
            if batch.is_empty() {
                st.in_flight -= 1;
                return;
            }
            batch
        };
        let singles = batch.len() == 1 || queue.singles_only.load(Ordering::Relaxed);
        let calls = if singles { batch.len() } else { 1 };
        peers
            .append_calls
            .fetch_add(calls as u64, Ordering::Relaxed);
        peers
            .appends_sent
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        if singles {
            let client = &client;
            futures::future::join_all(batch.into_iter().map(|q| async move {
                let r = send_one(id, client.clone(), PeerRpc::Append, q.request, q.timeout).await;
                let _ = q.reply.send(r);
            }))
            .await;
        } else {
            send_batch(id, client.clone(), &queue, batch).await;
        }
    }
}

/// The front of `waiting` that one call takes: up to [`MAX_APPEND_BATCH`] appends and
/// about [`APPEND_BATCH_BYTES`] (at least one), skipping those whose sender gave up.
fn next_batch(waiting: &mut VecDeque<Queued>) -> Vec<Queued> {
    let mut batch = Vec::new();
    let mut bytes = 0;
    while batch.len() < MAX_APPEND_BATCH && (batch.is_empty() || bytes < APPEND_BATCH_BYTES) {
        let Some(q) = waiting.pop_front() else { break };
        if q.reply.is_closed() {
            continue;
        }
        bytes += q.request.payload.len();
        batch.push(q);
    }
    batch
}

/// Sends `batch` as one `AppendBatch` and hands each append its own answer.
async fn send_batch(
    id: NodeId,
    mut client: RaftClient<Channel>,
    queue: &AppendQueue,
    batch: Vec<Queued>,
) {
    let timeout = batch.iter().map(|q| q.timeout).max().unwrap_or_default();
    let (requests, replies): (Vec<RaftRequest>, Vec<_>) =
        batch.into_iter().map(|q| (q.request, q.reply)).unzip();
    let n = requests.len();
    let mut request = tonic::Request::new(RaftBatch { requests });
    request.set_timeout(timeout);
    let answer = match tokio::time::timeout(timeout, client.append_batch(request)).await {
        Ok(Ok(r)) if r.get_ref().replies.len() == n => Ok(r.into_inner().replies),
        Ok(Ok(r)) => Err(PeerError::Decode(
            id,
            format!("{} answers to {n} appends", r.get_ref().replies.len()),
        )),
        Ok(Err(s)) => {
            if s.code() == tonic::Code::Unimplemented {
                // Failed this once (openraft sends again); one per call from now on.
                queue.singles_only.store(true, Ordering::Relaxed);
            }
            Err(transport(id, &s))
        }
        Err(_) => Err(PeerError::Transport(id, "timed out".into())),
    };
    match answer {
        Ok(got) => {
            for (tx, reply) in replies.into_iter().zip(got) {
                let _ = tx.send(Ok(reply));
            }
        }
        Err(e) => {
            for tx in replies {
                let _ = tx.send(Err(e.clone()));
            }
        }
    }
}

/// Which node-to-node RPC.
#[derive(Clone, Copy, Debug)]
pub enum PeerRpc {
    /// Raft AppendEntries.
    Append,
    /// Raft Vote.
    Vote,
    /// Raft InstallSnapshot (one chunk).
    Snapshot,
    /// A transaction call to a partition leader.
    Peer,
}

/// Creates openraft network clients for one partition group.
#[derive(Clone, Debug)]
pub struct NetFactory {
    /// The partition group.
    pub partition: u32,
    /// The node's peers.
    pub peers: Arc<Peers>,
}

/// Sends one partition group's Raft RPCs to one target node.
pub struct NetClient {
    partition: u32,
    target: NodeId,
    peers: Arc<Peers>,
}

impl RaftNetworkFactory<TypeConfig> for NetFactory {
    type Network = NetClient;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> NetClient {
        NetClient {
            partition: self.partition,
            target,
            peers: self.peers.clone(),
        }
    }
}

impl NetClient {
    async fn send<Req, Resp, E>(
        &self,
        kind: PeerRpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let res = self
            .peers
            .call::<Req, Resp>(self.target, kind, self.partition, req, option.hard_ttl())
            .await;
        match res {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(bytes)) => match crate::format::decode::<RaftError<NodeId, E>>(&bytes) {
                Ok(e) => Err(RPCError::RemoteError(RemoteError::new(self.target, e))),
                Err(e) => Err(RPCError::Network(NetworkError::new(&PeerError::Decode(
                    self.target,
                    e.to_string(),
                )))),
            },
            Err(e @ (PeerError::Transport(..) | PeerError::Remote(..))) => {
                Err(RPCError::Unreachable(Unreachable::new(&e)))
            }
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

impl RaftNetwork<TypeConfig> for NetClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.send(PeerRpc::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.send(PeerRpc::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.send(PeerRpc::Vote, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(bytes: usize) -> (Queued, oneshot::Receiver<Result<RaftReply, PeerError>>) {
        let (reply, rx) = oneshot::channel();
        let request = RaftRequest {
            partition: 0,
            payload: vec![0; bytes].into(),
            format: crate::format::FORMAT,
        };
        let q = Queued {
            request,
            timeout: Duration::from_secs(1),
            reply,
        };
        (q, rx)
    }

    #[test]
    fn a_batch_takes_what_waits_up_to_its_bounds_and_skips_abandoned_appends() {
        let mut waiting = VecDeque::new();
        let mut receivers = Vec::new();
        for _ in 0..MAX_APPEND_BATCH + 10 {
            let (q, rx) = queued(10);
            waiting.push_back(q);
            receivers.push(rx);
        }
        // The caller of the first gave up (timed out): it is not sent.
        drop(receivers.remove(0));
        let batch = next_batch(&mut waiting);
        assert_eq!(batch.len(), MAX_APPEND_BATCH);
        assert_eq!(waiting.len(), 9);
        assert_eq!(next_batch(&mut waiting).len(), 9);
        assert!(next_batch(&mut waiting).is_empty());

        // Bytes: a batch stops once past its budget, but always takes one.
        let (big, _rx1) = queued(APPEND_BATCH_BYTES);
        let (small, _rx2) = queued(1);
        waiting.extend([big, small]);
        assert_eq!(next_batch(&mut waiting).len(), 1);
        assert_eq!(next_batch(&mut waiting).len(), 1);
    }
}
