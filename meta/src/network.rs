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
//!
//! An AppendEntries without entries is not sent when the same stream's last append
//! succeeded just before it with the same vote and the same matching entry (see
//! `NetClient::confirmed`): openraft 0.9 sends one to each follower whenever its commit
//! index moves, after every append, and waits for its answer before the next append, so
//! on a busy group each commit cost two round trips per follower. The follower learns the
//! commit index from the next append or from a heartbeat instead: within one and a half
//! heartbeat intervals, as a heartbeat inside the window is answered here too.

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
    /// How long after a successful append an empty one to the same follower is answered
    /// without sending it (zero: every one is sent); half the heartbeat interval.
    pub confirmed_for: Duration,
}

/// Sends one partition group's Raft RPCs to one target node.
pub struct NetClient {
    partition: u32,
    me: NodeId,
    target: NodeId,
    peers: Arc<Peers>,
    confirmed_for: Duration,
    /// What the target answered Success to last on this stream: the leader's vote, the
    /// entry the target then held as the request's last, and when it was sent.
    confirmed: Option<Confirmed>,
}

/// A successful append of one stream (see `NetClient::confirmed`).
struct Confirmed {
    vote: openraft::Vote<NodeId>,
    matching: Option<openraft::LogId<NodeId>>,
    sent: std::time::Instant,
}

impl RaftNetworkFactory<TypeConfig> for NetFactory {
    type Network = NetClient;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> NetClient {
        NetClient {
            partition: self.partition,
            me: self.me,
            target,
            peers: self.peers.clone(),
            confirmed_for: self.confirmed_for,
            confirmed: None,
        }
    }
}

impl NetClient {
    /// True if `rpc` carries nothing the target did not confirm a moment ago but a commit
    /// index: no entries, the same vote and the same previous entry as the stream's last
    /// successful append, within `confirmed_for` of sending that one. Its answer would be
    /// Success again, unless the target saw a higher vote since, which the next append or
    /// heartbeat reports (the leader's quorum-acknowledged time may then run ahead by at
    /// most `confirmed_for`, well within the relaxed staleness bound that it serves).
    /// Strict reads confirm leadership with calls of their own, never answered here.
    fn already_confirmed(&self, rpc: &AppendEntriesRequest<TypeConfig>) -> bool {
        rpc.entries.is_empty()
            && self.confirmed.as_ref().is_some_and(|c| {
                c.vote == rpc.vote
                    && c.matching == rpc.prev_log_id
                    && c.sent.elapsed() < self.confirmed_for
            })
    }

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
        if self.already_confirmed(&rpc) {
            return Ok(AppendEntriesResponse::Success);
        }
        let sent = std::time::Instant::now();
        let res = self.send(RPCTypes::AppendEntries, &rpc, &option).await;
        self.confirmed = match res {
            Ok(AppendEntriesResponse::Success) => Some(Confirmed {
                vote: rpc.vote,
                matching: rpc.entries.last().map(|e| e.log_id).or(rpc.prev_log_id),
                sent,
            }),
            _ => None,
        };
        res
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.confirmed = None;
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
pub(crate) mod tests {
    use super::*;
    use openraft::Vote;

    fn client_to(addr: String) -> NetClient {
        NetClient {
            partition: 0,
            me: 1,
            target: 2,
            peers: Peers::new(HashMap::from([(2, addr)])),
            confirmed_for: Duration::ZERO,
            confirmed: None,
        }
    }

    fn heartbeat() -> AppendEntriesRequest<TypeConfig> {
        append(Vote::new_committed(1, 1), None, &[], None)
    }

    /// A listener on a free loopback port, and its address.
    async fn listener() -> (tokio::net::TcpListener, String) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        (l, addr)
    }

    /// A peer that takes the connection and never answers (a follower stalled on a busy
    /// machine) is a timeout, which openraft retries without backing off; a peer nobody
    /// listens for is unreachable, which it backs off from.
    #[tokio::test]
    async fn a_silent_peer_times_out_and_a_missing_one_is_unreachable() {
        let (silent, addr) = listener().await;
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

    /// A node that could not run for a moment (stopped, or starved of CPU) resumes to find
    /// calls its peers sent meanwhile and gave up on. Its server takes them all in stride
    /// on the same connection (`crate::service::PENDING_RESETS_MAX`): with h2's default it
    /// closed the connection after 20, and the peer's next call failed or reconnected.
    #[tokio::test]
    async fn a_node_that_resumes_keeps_the_connection_its_peer_gave_up_calls_on() {
        use tokio_stream::StreamExt;
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("addr");
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let peer = CountingPeer {
            appends: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            answer: Arc::new(Mutex::new(AppendEntriesResponse::Success)),
        };
        // The server runs on a runtime of its own, one thread, which a task can hold still.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let server_rt = rt.handle().clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let counted = accepted.clone();
        let server = std::thread::spawn(move || {
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
                let incoming =
                    tokio_stream::wrappers::TcpListenerStream::new(listener).map(move |c| {
                        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        c
                    });
                let serve = crate::service::server()
                    .add_service(talon_proto::raft::raft_server::RaftServer::new(peer))
                    .serve_with_incoming(incoming);
                tokio::select! {
                    _ = serve => {}
                    _ = stop_rx => {}
                }
            })
        });
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect_lazy();
        let client = RaftClient::new(channel);
        let call = |t: Duration| {
            let mut c = client.clone();
            async move { tokio::time::timeout(t, c.append_entries(RaftRequest::default())).await }
        };
        assert!(matches!(call(Duration::from_secs(5)).await, Ok(Ok(_))));

        // Hold the server still while 60 calls are sent and given up on (each reset).
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        server_rt.spawn(async move {
            let _ = hold_rx.recv();
        });
        let given_up: Vec<_> = (0..60)
            .map(|_| tokio::spawn(call(Duration::from_millis(100))))
            .collect();
        for g in given_up {
            assert!(g.await.expect("join").is_err(), "a held server answered");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        hold_tx.send(()).expect("release");

        match call(Duration::from_secs(5)).await {
            Ok(Ok(_)) => {}
            other => panic!("the call after the resume gave {other:?}"),
        }
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the server closed the connection"
        );
        let _ = stop_tx.send(());
        server.join().expect("server thread");
    }

    /// A peer that counts the AppendEntries it is sent and answers each with `answer`.
    struct CountingPeer {
        appends: Arc<std::sync::atomic::AtomicUsize>,
        answer: Arc<Mutex<AppendEntriesResponse<NodeId>>>,
    }

    #[tonic::async_trait]
    impl talon_proto::raft::raft_server::Raft for CountingPeer {
        async fn append_entries(
            &self,
            _: tonic::Request<RaftRequest>,
        ) -> Result<tonic::Response<talon_proto::raft::RaftReply>, tonic::Status> {
            self.appends
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let payload = crate::format::encode(&*self.answer.lock().expect("answer"));
            Ok(tonic::Response::new(talon_proto::raft::RaftReply {
                payload: payload.expect("encode").into(),
                format: crate::format::FORMAT,
                ..Default::default()
            }))
        }

        async fn vote(
            &self,
            _: tonic::Request<RaftRequest>,
        ) -> Result<tonic::Response<talon_proto::raft::RaftReply>, tonic::Status> {
            Err(tonic::Status::unimplemented("vote"))
        }

        async fn install_snapshot(
            &self,
            _: tonic::Request<RaftRequest>,
        ) -> Result<tonic::Response<talon_proto::raft::RaftReply>, tonic::Status> {
            Err(tonic::Status::unimplemented("install_snapshot"))
        }

        async fn peer(
            &self,
            _: tonic::Request<RaftRequest>,
        ) -> Result<tonic::Response<talon_proto::raft::RaftReply>, tonic::Status> {
            Err(tonic::Status::unimplemented("peer"))
        }
    }

    /// Log id `index` of `term`, written by node 1.
    pub(crate) fn log_id(term: u64, index: u64) -> openraft::LogId<NodeId> {
        openraft::LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
    }

    /// An AppendEntries of `vote` after `prev`, carrying `entries` (blank) and `commit`.
    pub(crate) fn append(
        vote: Vote<NodeId>,
        prev: Option<openraft::LogId<NodeId>>,
        entries: &[openraft::LogId<NodeId>],
        commit: Option<openraft::LogId<NodeId>>,
    ) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote,
            prev_log_id: prev,
            entries: entries
                .iter()
                .map(|id| openraft::Entry {
                    log_id: *id,
                    payload: openraft::EntryPayload::Blank,
                })
                .collect(),
            leader_commit: commit,
        }
    }

    /// An empty AppendEntries right after a successful append, with its vote and its last
    /// entry, is answered without a call; one that differs in any of those, comes after
    /// the window, or follows an answer other than Success, is sent.
    #[tokio::test]
    async fn a_commit_index_alone_right_after_an_append_is_not_sent() {
        let (listener, addr) = listener().await;
        let appends = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let answer = Arc::new(Mutex::new(AppendEntriesResponse::Success));
        let peer = CountingPeer {
            appends: appends.clone(),
            answer: answer.clone(),
        };
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(talon_proto::raft::raft_server::RaftServer::new(peer))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let sent = || appends.load(std::sync::atomic::Ordering::SeqCst);
        let option = || RPCOption::new(Duration::from_secs(5));
        let mut c = client_to(addr);
        c.confirmed_for = Duration::from_millis(300);
        let v = Vote::new_committed(1, 1);

        let ok = |r: Result<_, _>| matches!(r, Ok(AppendEntriesResponse::Success));
        assert!(ok(c
            .append_entries(append(v, None, &[log_id(1, 1)], None), option())
            .await));
        assert_eq!(sent(), 1);
        // The commit index of entry 1 alone: answered here.
        let commit = Some(log_id(1, 1));
        assert!(ok(c
            .append_entries(append(v, commit, &[], commit), option())
            .await));
        assert_eq!(sent(), 1, "the commit index alone was sent");
        // Another previous entry, another vote: sent.
        assert!(ok(c
            .append_entries(append(v, None, &[], commit), option())
            .await));
        assert_eq!(sent(), 2);
        let higher = Vote::new_committed(2, 1);
        assert!(ok(c
            .append_entries(append(higher, commit, &[], commit), option())
            .await));
        assert_eq!(sent(), 3);
        // A successful append of entries 2 and 3, then their commit: not sent.
        let (e2, e3) = (log_id(2, 2), log_id(2, 3));
        assert!(ok(c
            .append_entries(append(higher, commit, &[e2, e3], commit), option())
            .await));
        assert!(ok(c
            .append_entries(append(higher, Some(e3), &[], Some(e3)), option())
            .await));
        assert_eq!(sent(), 4);
        // After the window: sent, as a heartbeat must be.
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(ok(c
            .append_entries(append(higher, Some(e3), &[], Some(e3)), option())
            .await));
        assert_eq!(sent(), 5);
        // A follower that saw a higher vote answers so; the empty one after it is sent.
        *answer.lock().expect("answer") = AppendEntriesResponse::HigherVote(Vote::new(3, 2));
        let e4 = log_id(2, 4);
        let r = c
            .append_entries(append(higher, Some(e3), &[e4], Some(e3)), option())
            .await;
        assert!(
            matches!(r, Ok(AppendEntriesResponse::HigherVote(_))),
            "{r:?}"
        );
        let r = c
            .append_entries(append(higher, Some(e4), &[], Some(e3)), option())
            .await;
        assert!(
            matches!(r, Ok(AppendEntriesResponse::HigherVote(_))),
            "{r:?}"
        );
        assert_eq!(sent(), 7);
        server.abort();
    }
}
