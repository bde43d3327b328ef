//! Node-to-node transport: one tonic channel per peer node, shared by every partition
//! group's Raft traffic and by transaction calls between partition leaders (multi-Raft
//! over one connection). Implements openraft's `RaftNetworkFactory` per partition.
//!
//! Payloads are postcard (see `format`) of openraft's request/response types, wrapped in a
//! `RaftRequest` that names the partition. A call that fails to reach its peer is reported
//! to openraft as `Unreachable` (a refused connection, a broken stream), so it backs off
//! (half a second) before trying that peer again; a call that got no answer in its time (a
//! follower slowed by a busy machine, or one behind a cut link) is a `Timeout`, retried at
//! the next heartbeat or append without a back-off. An error raised by the remote Raft is
//! passed through as `RemoteError`.
//!
//! An AppendEntries without entries is not sent when the same stream's last append
//! succeeded just before it with the same vote and the same matching entry (see
//! `NetClient::confirmed`): openraft 0.9 sends one to each follower whenever its commit
//! index moves, after every append, and waits for its answer before the next append, so
//! on a busy group each commit cost two round trips per follower. The follower learns the
//! commit index from the next append or from a heartbeat instead: within one and a half
//! heartbeat intervals, as a heartbeat inside the window is answered here too.
//!
//! An AppendEntries with entries carries at most `APPEND_BYTES` of them (at least one
//! entry), and goes on after openraft stops waiting for it, one heartbeat interval, until
//! its peer answers or `APPEND_PATIENCE` ends: openraft's next try at the same entries
//! waits for that answer instead of sending them again (see `InFlight`). Without this, a
//! follower that fell behind by several MiB of file data on a busy machine never caught up.

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
    link: Link,
    confirmed_for: Duration,
    /// What the target answered Success to last on this stream: the leader's vote, the
    /// entry the target then held as the request's last, and when it was sent.
    confirmed: Option<Confirmed>,
    /// The stream's append with entries still under way (see [`InFlight`]).
    in_flight: Option<InFlight>,
}

/// Where one stream's calls go; the task that carries an append past openraft's wait holds
/// a copy.
#[derive(Clone)]
struct Link {
    partition: u32,
    me: NodeId,
    target: NodeId,
    peers: Arc<Peers>,
}

/// What an AppendEntries call gives openraft.
type AppendResult =
    Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>>;

/// An append with entries, sent by a task of its own so that it goes on after openraft
/// stops waiting for it (one heartbeat interval).
///
/// openraft times an AppendEntries out after one heartbeat interval (100 ms by default),
/// whatever it carries, and sends the same entries again. Entries carry file data (a chunk
/// is up to 4 MiB), and a follower that fell behind is sent several at once: on a busy
/// machine such a call took longer than the interval every time, each retry started the
/// transfer from nothing, and the follower never caught up while the retries, sixteen
/// streams of several MiB ten times a second, kept the machine busy. So the call lives on
/// for [`APPEND_PATIENCE`], and openraft's next try at the same entries (the same vote and
/// previous entry) waits for its answer instead of sending them again.
struct InFlight {
    vote: openraft::Vote<NodeId>,
    prev: Option<openraft::LogId<NodeId>>,
    /// The last entry sent.
    last: Option<openraft::LogId<NodeId>>,
    sent: std::time::Instant,
    answer: tokio::sync::oneshot::Receiver<AppendResult>,
    /// Ends the call when the stream moves on to other entries or ends (a new term).
    _call: tokio_util::task::AbortOnDropHandle<()>,
}

impl InFlight {
    /// True if `rpc` asks for what this call is sending, or more after it.
    fn serves(&self, rpc: &AppendEntriesRequest<TypeConfig>) -> bool {
        self.vote == rpc.vote
            && self.prev == rpc.prev_log_id
            && self.last <= rpc.entries.last().map(|e| e.log_id)
    }
}

/// How long an append with entries may take before it counts as lost (see [`InFlight`]);
/// as long as a snapshot chunk's install.
const APPEND_PATIENCE: Duration = Duration::from_secs(10);

/// Bytes of entries (file data mostly) one AppendEntries carries at most, or its first entry
/// alone if that is larger: one proposal's worth (`crate::partition`). A follower that fell
/// behind is sent the rest in calls of its own, each answered as a partial success, so that
/// its progress is counted as it goes rather than only once all of it arrived.
const APPEND_BYTES: usize = 4 << 20;

/// How many of `entries`, from the first, one AppendEntries carries: those within
/// [`APPEND_BYTES`], and at least one.
fn entries_within_budget(entries: &[openraft::Entry<TypeConfig>]) -> usize {
    let mut bytes = 0;
    let over = entries.iter().position(|e| {
        bytes += match &e.payload {
            openraft::EntryPayload::Normal(cmd) => cmd.approx_bytes(),
            _ => 64,
        };
        bytes > APPEND_BYTES
    });
    over.map_or(entries.len(), |i| i.max(1))
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
            link: Link {
                partition: self.partition,
                me: self.me,
                target,
                peers: self.peers.clone(),
            },
            confirmed_for: self.confirmed_for,
            confirmed: None,
            in_flight: None,
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

    /// Records the answer to an append of `vote` sent at `sent` whose last entry (or
    /// previous one, with no entries) was `last`.
    fn note_answer(
        &mut self,
        vote: openraft::Vote<NodeId>,
        last: Option<openraft::LogId<NodeId>>,
        sent: std::time::Instant,
        res: &AppendResult,
    ) {
        self.confirmed = match res {
            Ok(AppendEntriesResponse::Success) => Some(Confirmed {
                vote,
                matching: last,
                sent,
            }),
            Ok(AppendEntriesResponse::PartialSuccess(matching)) => Some(Confirmed {
                vote,
                matching: *matching,
                sent,
            }),
            _ => None,
        };
    }

    /// Starts sending `rpc`, entries cut to [`APPEND_BYTES`], in a task of its own.
    fn start_append(&self, mut rpc: AppendEntriesRequest<TypeConfig>) -> InFlight {
        let keep = entries_within_budget(&rpc.entries);
        rpc.entries.truncate(keep);
        let (tx, answer) = tokio::sync::oneshot::channel();
        let link = self.link.clone();
        let (vote, prev, last) = (
            rpc.vote,
            rpc.prev_log_id,
            rpc.entries.last().map(|e| e.log_id),
        );
        let call = tokio::spawn(async move {
            let _ = tx.send(
                link.send(RPCTypes::AppendEntries, &rpc, APPEND_PATIENCE)
                    .await,
            );
        });
        InFlight {
            vote,
            prev,
            last,
            sent: std::time::Instant::now(),
            answer,
            _call: tokio_util::task::AbortOnDropHandle::new(call),
        }
    }
}

impl Link {
    /// Sends one Raft RPC and maps the transport's failures to openraft's errors.
    async fn send<Req, Resp, E>(
        &self,
        action: RPCTypes,
        req: &Req,
        timeout: Duration,
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
            .call::<Req, Resp>(self.target, kind, self.partition, req, timeout)
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
        if rpc.entries.is_empty() {
            // A heartbeat goes on its own, beside an append under way.
            let sent = std::time::Instant::now();
            let res = self
                .link
                .send(RPCTypes::AppendEntries, &rpc, option.hard_ttl())
                .await;
            self.note_answer(rpc.vote, rpc.prev_log_id, sent, &res);
            return res;
        }
        let wanted = rpc.entries.last().map(|e| e.log_id);
        let call = match self.in_flight.take() {
            Some(f) if f.serves(&rpc) => f,
            _ => self.start_append(rpc),
        };
        // If openraft stops waiting here, the call stays in flight for its next try.
        let call = self.in_flight.insert(call);
        let res = (&mut call.answer).await.unwrap_or_else(|_| {
            Err(RPCError::Network(NetworkError::new(&PeerError::Transport(
                self.link.target,
                "the append's call ended without an answer".into(),
            ))))
        });
        let (vote, sent, last) = (call.vote, call.sent, call.last);
        self.in_flight = None;
        // Entries cut to the budget are a partial success: openraft sends the rest next.
        let res = match res {
            Ok(AppendEntriesResponse::Success) if last < wanted => {
                Ok(AppendEntriesResponse::PartialSuccess(last))
            }
            other => other,
        };
        self.note_answer(vote, last, sent, &res);
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
        self.in_flight = None;
        self.link
            .send(RPCTypes::InstallSnapshot, &rpc, option.hard_ttl())
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.link
            .send(RPCTypes::Vote, &rpc, option.hard_ttl())
            .await
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use openraft::Vote;

    fn client_to(addr: String) -> NetClient {
        NetClient {
            link: Link {
                partition: 0,
                me: 1,
                target: 2,
                peers: Peers::new(HashMap::from([(2, addr)])),
            },
            confirmed_for: Duration::ZERO,
            confirmed: None,
            in_flight: None,
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
            delay: Duration::ZERO,
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

    /// A peer that counts the AppendEntries it is sent and answers each with `answer`,
    /// `delay` after it arrived.
    struct CountingPeer {
        appends: Arc<std::sync::atomic::AtomicUsize>,
        answer: Arc<Mutex<AppendEntriesResponse<NodeId>>>,
        delay: Duration,
    }

    #[tonic::async_trait]
    impl talon_proto::raft::raft_server::Raft for CountingPeer {
        async fn append_entries(
            &self,
            _: tonic::Request<RaftRequest>,
        ) -> Result<tonic::Response<talon_proto::raft::RaftReply>, tonic::Status> {
            self.appends
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
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
        let server = serve(
            listener,
            CountingPeer {
                appends: appends.clone(),
                answer: answer.clone(),
                delay: Duration::ZERO,
            },
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

    /// Serves `peer` on `listener` until the returned task is aborted.
    fn serve(
        listener: tokio::net::TcpListener,
        peer: CountingPeer,
    ) -> tokio::task::JoinHandle<Result<(), tonic::transport::Error>> {
        let service = talon_proto::raft::raft_server::RaftServer::new(peer)
            .max_decoding_message_size(MAX_PEER_MESSAGE);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        )
    }

    /// A client of a peer that answers every append with Success, `delay_ms` after it
    /// arrived; the count of appends it was sent; its server task.
    async fn client_of_a_peer_answering_after(
        delay_ms: u64,
    ) -> (
        NetClient,
        Arc<std::sync::atomic::AtomicUsize>,
        tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    ) {
        let (listener, addr) = listener().await;
        let appends = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let server = serve(
            listener,
            CountingPeer {
                appends: appends.clone(),
                answer: Arc::new(Mutex::new(AppendEntriesResponse::Success)),
                delay: Duration::from_millis(delay_ms),
            },
        );
        (client_to(addr), appends, server)
    }

    /// An entry of `id` that stores a chunk of `bytes`.
    fn chunk_entry(id: openraft::LogId<NodeId>, bytes: usize) -> openraft::Entry<TypeConfig> {
        openraft::Entry {
            log_id: id,
            payload: openraft::EntryPayload::Normal(crate::types::Command::Atomic(vec![
                crate::types::Op::PutChunk {
                    ino: talon_model::Ino(7),
                    write_id: 1,
                    index: id.index as u32,
                    data: vec![7; bytes].into(),
                    at_ms: 0,
                },
            ])),
        }
    }

    /// A follower that takes longer than openraft waits (one heartbeat interval) to answer
    /// an append gets it once: openraft's next tries at the same entries wait for that
    /// call's answer, and one of them gets it. Before, each try sent the entries anew and
    /// gave up as the last did, and the follower never caught up.
    #[tokio::test]
    async fn an_append_slower_than_openrafts_wait_is_sent_once_and_answered() {
        let (mut c, appends, server) = client_of_a_peer_answering_after(450).await;
        let v = Vote::new_committed(1, 1);
        let rpc = || append(v, None, &[log_id(1, 1), log_id(1, 2)], None);
        // As openraft's replication does: wait 100 ms, give up, try again.
        let wait = Duration::from_millis(100);
        let mut tries = 0;
        let answer = loop {
            tries += 1;
            assert!(tries <= 30, "no try was answered in 3 s");
            let call = c.append_entries(rpc(), RPCOption::new(wait));
            if let Ok(answer) = tokio::time::timeout(wait, call).await {
                break answer;
            }
        };
        assert!(
            matches!(answer, Ok(AppendEntriesResponse::Success)),
            "{answer:?}"
        );
        assert!(
            tries >= 4,
            "answered at try {tries}, before the follower could answer"
        );
        assert_eq!(appends.load(std::sync::atomic::Ordering::SeqCst), 1);

        // Other entries (a new previous entry) are a new call, and the old one, if still
        // under way, is dropped.
        let next = append(v, Some(log_id(1, 2)), &[log_id(1, 3)], None);
        assert!(
            tokio::time::timeout(wait, c.append_entries(next, RPCOption::new(wait)))
                .await
                .is_err()
        );
        let other = append(v, Some(log_id(1, 1)), &[log_id(1, 2)], None);
        let r = c.append_entries(other, RPCOption::new(wait)).await;
        assert!(matches!(r, Ok(AppendEntriesResponse::Success)), "{r:?}");
        assert_eq!(appends.load(std::sync::atomic::Ordering::SeqCst), 3);
        server.abort();
    }

    /// A follower behind by entries of more than [`APPEND_BYTES`] is sent those within it
    /// (at least one), and the answer is a partial success up to the last sent.
    #[tokio::test]
    async fn entries_past_the_byte_budget_wait_for_the_next_append() {
        let (mut c, appends, server) = client_of_a_peer_answering_after(0).await;
        let v = Vote::new_committed(1, 1);
        let option = || RPCOption::new(Duration::from_secs(5));
        let big = APPEND_BYTES / 2 + 1;
        let mut rpc = append(v, None, &[], None);
        rpc.entries = (1..=3).map(|i| chunk_entry(log_id(1, i), big)).collect();
        let r = c.append_entries(rpc, option()).await;
        assert!(
            matches!(r, Ok(AppendEntriesResponse::PartialSuccess(Some(m))) if m == log_id(1, 1)),
            "{r:?}"
        );
        // One entry over the budget on its own still goes.
        let mut rpc = append(v, Some(log_id(1, 1)), &[], None);
        rpc.entries = vec![chunk_entry(log_id(1, 2), APPEND_BYTES * 2)];
        let r = c.append_entries(rpc, option()).await;
        assert!(matches!(r, Ok(AppendEntriesResponse::Success)), "{r:?}");
        // Small entries all go.
        let r = c
            .append_entries(
                append(v, Some(log_id(1, 2)), &[log_id(1, 3), log_id(1, 4)], None),
                option(),
            )
            .await;
        assert!(matches!(r, Ok(AppendEntriesResponse::Success)), "{r:?}");
        assert_eq!(appends.load(std::sync::atomic::Ordering::SeqCst), 3);
        server.abort();
    }
}
