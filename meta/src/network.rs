//! Node-to-node transport: one tonic channel per peer node, shared by every partition
//! group's Raft traffic and by transaction calls between partition leaders (multi-Raft
//! over one connection). Implements openraft's `RaftNetworkFactory` per partition.
//!
//! Payloads are postcard (see `format`) of openraft's request/response types, wrapped in a `RaftRequest`
//! that names the partition. A call that fails to reach its peer is reported to openraft as
//! `Unreachable` (a refused connection, a broken stream), so it backs off (half a second)
//! before trying that peer again; a call that got no answer in its time (a follower slowed
//! by a busy machine, or one behind a cut link) is a `Timeout`, retried at the next heartbeat
//! or append without a back-off. An error raised by the remote Raft is passed through as
//! `RemoteError`.

use crate::types::{NodeId, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::{de::DeserializeOwned, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use talon_proto::raft::raft_client::RaftClient;
use talon_proto::raft::RaftRequest;
use tonic::transport::{Channel, Endpoint};

/// Largest gRPC message between nodes (snapshot chunks, large appends).
pub const MAX_PEER_MESSAGE: usize = 160 << 20;

/// Snapshot chunks a node sends at once, over all its partitions and peers.
///
/// openraft streams a snapshot to each follower of each group on its own, so a restarted
/// node that needs one from every partition drew a chunk (3 MiB, then its encoding and its
/// HTTP/2 frames) from each of its leaders at once: a node leading 8 partitions rose by 52
/// MiB within the seconds of one such catch-up. Two at a time keep a sending node within a
/// few chunks; the chunks of one snapshot still go one after the other, and a follower's
/// quiet period (`crate::partition`) outlasts the wait for a turn.
const SNAPSHOT_CHUNKS_IN_FLIGHT: usize = 2;

/// Channels to the other nodes of the cluster, created lazily and kept for the node's life.
#[derive(Debug)]
pub struct Peers {
    addrs: HashMap<NodeId, String>,
    channels: Mutex<HashMap<NodeId, Channel>>,
    /// Turns to send a snapshot chunk ([`SNAPSHOT_CHUNKS_IN_FLIGHT`]).
    snapshot_chunks: tokio::sync::Semaphore,
}

/// A transport-level failure talking to a peer.
#[derive(Debug, thiserror::Error)]
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
    /// The RPC got no answer within its time.
    #[error("rpc to node {0}: no answer within {1:?}")]
    TimedOut(NodeId, Duration),
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
            snapshot_chunks: tokio::sync::Semaphore::new(SNAPSHOT_CHUNKS_IN_FLIGHT),
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
        &self,
        id: NodeId,
        kind: PeerRpc,
        partition: u32,
        req: &Req,
        timeout: Duration,
    ) -> Result<Result<Resp, Vec<u8>>, PeerError> {
        let started = std::time::Instant::now();
        // A snapshot chunk waits for its turn (within its own deadline) before it is
        // encoded: the encoding and the frames are what the turns bound.
        let _turn = match kind {
            PeerRpc::Snapshot => {
                match tokio::time::timeout(timeout, self.snapshot_chunks.acquire()).await {
                    Ok(Ok(permit)) => Some(permit),
                    // The semaphore is never closed.
                    Ok(Err(_)) | Err(_) => return Err(PeerError::TimedOut(id, timeout)),
                }
            }
            _ => None,
        };
        let timeout = timeout.saturating_sub(started.elapsed());
        let payload =
            crate::format::encode(req).map_err(|e| PeerError::Decode(id, e.to_string()))?;
        let mut client = self.client(id)?;
        let mut request = tonic::Request::new(RaftRequest {
            partition,
            payload: payload.into(),
            format: crate::format::FORMAT,
        });
        request.set_timeout(timeout);
        let started = std::time::Instant::now();
        let fut = async {
            match kind {
                PeerRpc::Append => client.append_entries(request).await,
                PeerRpc::Vote => client.vote(request).await,
                PeerRpc::Snapshot => client.install_snapshot(request).await,
                PeerRpc::Peer => client.peer(request).await,
            }
        };
        let reply = match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(r)) => r.into_inner(),
            // The client's own deadline ends the call as Cancelled, the server's as
            // DeadlineExceeded: either way the peer was reached and did not answer in time.
            Ok(Err(s))
                if s.code() == tonic::Code::DeadlineExceeded || started.elapsed() >= timeout =>
            {
                return Err(PeerError::TimedOut(id, timeout))
            }
            Ok(Err(s)) => {
                return Err(PeerError::Transport(
                    id,
                    format!("{:?}: {}", s.code(), s.message()),
                ))
            }
            Err(_) => return Err(PeerError::TimedOut(id, timeout)),
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
    /// This node.
    pub me: NodeId,
}

/// Sends one partition group's Raft RPCs to one target node.
pub struct NetClient {
    partition: u32,
    me: NodeId,
    target: NodeId,
    peers: Arc<Peers>,
}

impl RaftNetworkFactory<TypeConfig> for NetFactory {
    type Network = NetClient;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> NetClient {
        NetClient {
            partition: self.partition,
            me: self.me,
            target,
            peers: self.peers.clone(),
        }
    }
}

impl NetClient {
    async fn send<Req, Resp, E>(
        &self,
        action: RPCTypes,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let kind = match action {
            RPCTypes::AppendEntries => PeerRpc::Append,
            RPCTypes::Vote => PeerRpc::Vote,
            RPCTypes::InstallSnapshot => PeerRpc::Snapshot,
        };
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
            Err(PeerError::TimedOut(_, timeout)) => Err(RPCError::Timeout(Timeout {
                action,
                id: self.me,
                target: self.target,
                timeout,
            })),
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
        self.send(RPCTypes::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.send(RPCTypes::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.send(RPCTypes::Vote, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::Vote;

    fn client_to(addr: String) -> NetClient {
        NetClient {
            partition: 0,
            me: 1,
            target: 2,
            peers: Peers::new(HashMap::from([(2, addr)])),
        }
    }

    fn heartbeat() -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        }
    }

    /// A peer that takes the connection and never answers (a follower stalled on a busy
    /// machine) is a timeout, which openraft retries without backing off; a peer nobody
    /// listens for is unreachable, which it backs off from.
    #[tokio::test]
    async fn a_silent_peer_times_out_and_a_missing_one_is_unreachable() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = silent.local_addr().expect("addr").to_string();
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((c, _)) = silent.accept().await {
                conns.push(c);
            }
        });
        let option = RPCOption::new(Duration::from_millis(200));
        match client_to(addr).append_entries(heartbeat(), option).await {
            Err(RPCError::Timeout(t)) => {
                assert_eq!((t.id, t.target), (1, 2));
                assert_eq!(t.action, RPCTypes::AppendEntries);
            }
            other => panic!("a silent peer gave {other:?}"),
        }
        held.abort();

        let gone = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = gone.local_addr().expect("addr").to_string();
        drop(gone);
        let option = RPCOption::new(Duration::from_secs(5));
        match client_to(addr).append_entries(heartbeat(), option).await {
            Err(RPCError::Unreachable(_)) => {}
            other => panic!("a missing peer gave {other:?}"),
        }
    }
}
