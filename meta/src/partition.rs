//! One partition replica hosted on this node: its Raft group, its state, and the two
//! merging queues in front of Raft.
//!
//! - The proposer merges concurrent commands into one `Command::Batch` proposal: while one
//!   proposal is in flight, the next batch gathers, so N concurrent creates cost about one
//!   Raft round and one WAL fsync instead of N (group commit; the log store also shares
//!   one fsync across partitions).
//! - The read barrier merges concurrent linearizable reads behind one
//!   `ensure_linearizable` (ReadIndex): a read that arrives while a barrier is in flight
//!   waits for the next one, which started after it arrived, so it is still linearizable.
//!
//! Both queues are tasks owned by the partition and stop when its cancellation token
//! fires; callers still waiting get `Unavailable`.
//!
//! Behind each new snapshot, the log is purged up to the snapshot before it (a task that
//! watches the group's metrics, `purge_behind`): openraft keeps a number of entries
//! whatever they weigh, and entries of file data made that a second copy of gigabytes.
//!
//! A follower serves relaxed reads on the strength of its own round trip to its leader
//! ([`Partition::relaxed_ok`], [`Partition::note_leader_answer`]; `node`'s loop asks, and
//! the leader answers after a ReadIndex): the time that counts is when it asked, on its own
//! clock, so no message delayed in the network can make old state look fresh. It asks only
//! while relaxed reads come to it ([`Partition::wants_leader_answers`]): a follower nobody
//! reads from costs its leader no ReadIndex and its links no traffic.
//!
//! Strict reads leave a trace at debug level under the target [`STRICT_READS`]: each read
//! barrier that passes (the log id it waited for, the leader's vote) and each strict lookup
//! answered after one (the entry found, and the applied id of the state it was read from),
//! so that a stale strict read a fault-injection run finds can be traced to the replica
//! and the state that answered it.
//!
//! A proposal holds one of the few in-flight slots only while this replica leads in the
//! term it was made in. openraft answers a proposal when its entry applies or is cut from
//! the log, but not when a deposed leader installs a snapshot that covers the entry
//! without a conflicting entry at the snapshot's own index: that answer never comes, and
//! a slot held for it would stop the partition's proposals on this node for good (jepsen
//! finding F9). So a deposed leader's proposals give their slots back, and are answered
//! `Unavailable` (outcome unknown) if no answer comes within `DEPOSED_WAIT`.

use crate::network::Peers;
use crate::sm::SmStore;
use crate::types::{Command, CommandResult, NodeId, Raft, TypeConfig};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ServerState, Vote};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use talon_model::TalonError;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::sync::CancellationToken;

type Reply = oneshot::Sender<Result<CommandResult, TalonError>>;

/// Proposals in flight at once per partition (each a merged batch).
const PROPOSALS_IN_FLIGHT: usize = 2;
/// A merged proposal stops growing at this many payload bytes (file data), so one Raft
/// entry stays well within a peer message.
const PROPOSAL_BYTES: usize = 4 << 20;
/// How long a proposal made by a leader since deposed waits for openraft's answer (its
/// entry applied, or cut from the log) before it is answered `Unavailable`.
const DEPOSED_WAIT: Duration = Duration::from_secs(5);

/// A partition replica on this node.
pub struct Partition {
    /// Partition id.
    pub id: u32,
    /// Its Raft group.
    pub raft: Raft,
    /// Its state.
    pub store: Arc<SmStore>,
    peers: Arc<Peers>,
    proposals: mpsc::Sender<(Command, Reply)>,
    reads: mpsc::Sender<oneshot::Sender<Result<(), TalonError>>>,
    /// What this replica, as a follower, knows for relaxed reads, and when it last had one
    /// to answer: see [`Partition::relaxed_ok`].
    follower_reads: Mutex<FollowerReads>,
    /// Set while this node's disk is full and another replica should take the leadership:
    /// proposals and linearizable reads are then refused as from a follower, so that
    /// nothing this leader does renews the other replicas' leader lease.
    handing_over: std::sync::atomic::AtomicBool,
    /// When the last snapshot chunk from the current leader arrived, while this replica
    /// holds off elections for it (see [`Partition::receiving_snapshot`]).
    snapshot_chunk_at: Mutex<Option<Instant>>,
    /// One AppendEntries at a time in the Raft core (see [`Partition::append_entries`]).
    appends: Arc<Semaphore>,
    /// When the Raft core last reported its metrics (see [`leader_fresh`]).
    metrics_at: Mutex<Instant>,
}

/// A follower's relaxed reads (see [`Partition::relaxed_ok`]).
#[derive(Clone, Copy, Debug, Default)]
struct FollowerReads {
    /// When this follower last asked its leader for its applied index (by its own clock, at
    /// the asking), and the answer.
    answer: Option<(Instant, u64)>,
    /// When a relaxed read last came to this replica while it followed.
    wanted: Option<Instant>,
}

impl std::fmt::Debug for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Partition({})", self.id)
    }
}

impl Partition {
    /// Wraps a started Raft group and spawns its merging queues, which stop on `cancel`.
    pub fn start(
        id: u32,
        raft: Raft,
        store: Arc<SmStore>,
        peers: Arc<Peers>,
        max_batch: usize,
        cancel: CancellationToken,
        tasks: &tokio_util::task::TaskTracker,
    ) -> Arc<Partition> {
        let (ptx, prx) = mpsc::channel(4096);
        let (rtx, rrx) = mpsc::channel(4096);
        let p = Arc::new(Partition {
            id,
            raft: raft.clone(),
            store,
            peers,
            proposals: ptx,
            reads: rtx,
            follower_reads: Mutex::new(FollowerReads::default()),
            handing_over: std::sync::atomic::AtomicBool::new(false),
            snapshot_chunk_at: Mutex::new(None),
            appends: Arc::new(Semaphore::new(1)),
            metrics_at: Mutex::new(Instant::now()),
        });
        tasks.spawn(proposer(p.clone(), prx, max_batch.max(1), cancel.clone()));
        tasks.spawn(watch_metrics(p.clone(), cancel.clone()));
        tasks.spawn(read_barrier(raft, p.id, p.peers.clone(), rrx, cancel));
        p
    }

    /// Proposes `cmd` through Raft (merged with concurrent ones) and returns its result
    /// once applied on this leader.
    pub async fn propose(&self, cmd: Command) -> Result<CommandResult, TalonError> {
        self.check_handing_over()?;
        let (tx, rx) = oneshot::channel();
        self.proposals.send((cmd, tx)).await.map_err(|_| {
            TalonError::Unavailable(format!("partition {} is shutting down", self.id))
        })?;
        rx.await.map_err(|_| {
            TalonError::Unavailable(format!("partition {} is shutting down", self.id))
        })?
    }

    /// Hands a leader's AppendEntries to this replica's Raft core, one at a time, and
    /// answers what the core answers.
    ///
    /// A call handed over stays in the core's queue, entries and all, until the core takes
    /// it, even if the leader gave up on it meanwhile. While this node's log waits for disk
    /// room (a full disk), the core takes nothing, and the leader sends the same entries
    /// again at every timeout: each copy used to be queued, and a node grew by gigabytes a
    /// minute until the kernel killed it (finding F12). Now a call waits here for the one
    /// before it to be taken and answered; the leader giving up on a waiting call drops it,
    /// and its entries with it. The one handed over is awaited in a task of its own, so that
    /// the leader giving up on it does not let the next one in while it is still queued.
    /// `tests/full_follower.rs` watches a node's memory while its log waits.
    pub async fn append_entries(
        &self,
        req: openraft::raft::AppendEntriesRequest<TypeConfig>,
    ) -> Result<openraft::raft::AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        let Ok(turn) = self.appends.clone().acquire_owned().await else {
            return Err(RaftError::Fatal(openraft::error::Fatal::Stopped));
        };
        let raft = self.raft.clone();
        let handed = tokio::spawn(async move {
            let res = raft.append_entries(req).await;
            drop(turn);
            res
        });
        handed
            .await
            .unwrap_or(Err(RaftError::Fatal(openraft::error::Fatal::Panicked)))
    }

    /// Waits until this replica is the leader and has applied everything committed before
    /// the call (ReadIndex), so a local read is linearizable.
    pub async fn linearizable(&self) -> Result<(), TalonError> {
        self.check_handing_over()?;
        let (tx, rx) = oneshot::channel();
        self.reads.send(tx).await.map_err(|_| {
            TalonError::Unavailable(format!("partition {} is shutting down", self.id))
        })?;
        rx.await.map_err(|_| {
            TalonError::Unavailable(format!("partition {} is shutting down", self.id))
        })?
    }

    /// True if a relaxed read may be served from this replica's state: a leader heard
    /// from a quorum within `bound` and applied an entry of its own term (so it has
    /// applied every entry committed before its term: every write any earlier leader
    /// acknowledged, which a client's session read relies on); a follower asked its leader
    /// within `bound` and has applied what the leader had applied when it answered. The
    /// leader answers only after a ReadIndex begun after the question arrived
    /// (`Node::handle_peer`), so its answer covers every write acknowledged before the
    /// follower asked: the follower's state is then at most `bound` old, and a client that
    /// reads relaxed only a session window (twice the bound) after its own write sees it.
    ///
    /// A follower's time is when it asked, by its own clock. It used to be when the
    /// leader's last AppendEntries arrived, which says nothing of when the leader sent it:
    /// one held up in the network longer than a client's session window made state older
    /// than that client's own write look fresh. The leader's answer rests on a quorum's
    /// round trip, not on its lease, so a leader whose Raft core is stuck (its metrics,
    /// and so its lease, frozen) gives no answer.
    pub fn relaxed_ok(&self, bound: Duration) -> bool {
        // Read in place: every relaxed read asks, and a copy of the metrics allocates.
        let applied = {
            let m = self.raft.metrics();
            let m = m.borrow();
            if m.running_state.is_err() {
                return false;
            }
            if m.state == ServerState::Leader {
                return leader_fresh(&m, bound, self.metrics_age());
            }
            m.last_applied.map(|l| l.index).unwrap_or(0)
        };
        let answer = {
            let mut g = self
                .follower_reads
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            g.wanted = Some(Instant::now());
            g.answer
        };
        match answer {
            Some((asked, leader_applied)) => asked.elapsed() < bound && applied >= leader_applied,
            None => false,
        }
    }

    /// What this replica answers a follower that asks for its applied index: after a
    /// ReadIndex (which confirms with a quorum that it still leads, and waits until it has
    /// applied everything committed before, an entry of its own term included), its
    /// applied index; nothing if it does not lead.
    pub async fn answer_for_follower(&self) -> Option<u64> {
        self.linearizable().await.ok()?;
        let m = self.raft.metrics();
        let applied = m.borrow().last_applied.map(|l| l.index).unwrap_or(0);
        Some(applied)
    }

    /// Records the leader's answer to a question this follower asked at `asked`: the
    /// leader's applied index then. A late answer to an older question changes nothing.
    pub fn note_leader_answer(&self, asked: Instant, leader_applied: u64) {
        let mut g = self
            .follower_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if g.answer.is_none_or(|(at, _)| at <= asked) {
            g.answer = Some((asked, leader_applied));
        }
    }

    /// True if a relaxed read came to this replica as a follower within `within`: only
    /// then does the node ask the leader for answers. After a quiet spell longer than
    /// `within` plus the bound, the first relaxed read finds no fresh answer and is
    /// refused (NotLeader; its client reads at the leader instead), and the node asks from
    /// its next round on.
    pub fn wants_leader_answers(&self, within: Duration) -> bool {
        self.follower_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .wanted
            .is_some_and(|at| at.elapsed() < within)
    }

    /// True if this replica leads and a relaxed read here is within `bound` (the
    /// leader's half of [`Partition::relaxed_ok`]).
    pub fn leads_fresh(&self, bound: Duration) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.running_state.is_ok()
            && m.state == ServerState::Leader
            && leader_fresh(&m, bound, self.metrics_age())
    }

    /// How long ago the Raft core last reported its metrics.
    fn metrics_age(&self) -> Duration {
        self.metrics_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }

    /// Hands the leadership on, or stops doing so: while `on`, this replica neither
    /// campaigns nor sends heartbeats, and refuses proposals and linearizable reads as a
    /// follower would (NotLeader, no leader known), so the other replicas' lease runs out
    /// and one of them takes over.
    pub fn hand_over(&self, on: bool) {
        self.handing_over
            .store(on, std::sync::atomic::Ordering::Relaxed);
        self.raft.runtime_config().heartbeat(!on);
        let at = self
            .snapshot_chunk_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.allow_elections(&at);
    }

    /// Lets this replica campaign unless it hands its leadership over or a snapshot is
    /// streaming in (`at`, the guarded time of the last chunk, so that the two settle it
    /// under one lock).
    fn allow_elections(&self, at: &Option<Instant>) {
        let handing_over = self.handing_over.load(std::sync::atomic::Ordering::Relaxed);
        self.raft
            .runtime_config()
            .elect(!handing_over && at.is_none());
    }

    /// Records a snapshot chunk sent with `vote`, and holds off this replica's elections
    /// while chunks from the current leader keep coming.
    ///
    /// openraft sends a follower no heartbeat while a snapshot streams to it, and a chunk
    /// does not reset the follower's election timer. A snapshot that takes longer to send
    /// than an election timeout (a partition of a real dataset is gigabytes) would make the
    /// follower campaign in the middle of it; it cannot win (its log is behind), but its
    /// higher term deposes the leader, the stream starts over under the next one, and the
    /// replica never catches up (seen at 150 MB a partition: elections every second, for
    /// good). Elections come back once no chunk has come for the longest election timeout,
    /// so a leader that dies mid-stream is still replaced.
    pub fn receiving_snapshot(self: &Arc<Self>, vote: &Vote<NodeId>) {
        let mine = self.raft.metrics().borrow().vote;
        if !matches!(
            vote.partial_cmp(&mine),
            Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
        ) {
            // Not from this replica's leader (openraft refuses the chunk the same way):
            // the answer carries this replica's vote.
            return;
        }
        {
            let mut at = self
                .snapshot_chunk_at
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if at.replace(Instant::now()).is_some() {
                return;
            }
            self.allow_elections(&at);
        }
        let quiet = Duration::from_millis(self.raft.config().election_timeout_max);
        let p = self.clone();
        // Ends by itself, once no chunk came for `quiet`.
        tokio::spawn(async move {
            loop {
                let due = {
                    let mut at = p
                        .snapshot_chunk_at
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    let Some(last) = *at else { return };
                    if Instant::now() >= last + quiet {
                        *at = None;
                        p.allow_elections(&at);
                        return;
                    }
                    last + quiet
                };
                tokio::time::sleep_until(due.into()).await;
            }
        });
    }

    fn check_handing_over(&self) -> Result<(), TalonError> {
        if self.handing_over.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(not_leader(self.id, None, &self.peers));
        }
        Ok(())
    }

    /// The current leader, as this replica knows it (none once this replica has failed).
    pub fn leader(&self) -> Option<NodeId> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.running_state
            .is_ok()
            .then_some(m.current_leader)
            .flatten()
    }

    /// Why this replica's Raft group stopped, if it did: a storage error (a full disk, an
    /// I/O error). The node goes on serving its other partitions; the other replicas of
    /// this one elect a leader among themselves; a restart once the cause is gone brings
    /// this replica back, catching up from the others.
    pub fn failure(&self) -> Option<String> {
        match &self.raft.metrics().borrow().running_state {
            Ok(()) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    /// A NotLeader error pointing at the known leader.
    pub fn not_leader(&self) -> TalonError {
        not_leader(self.id, self.leader(), &self.peers)
    }
}

/// A leader's relaxed reads are fresh: it applied an entry of its own term and heard
/// from a quorum within `bound`, by metrics `m` that its Raft core reported `reported_ago`.
///
/// openraft works out the time since a quorum's ack when its core reports its metrics, at
/// every turn of its loop (a running core turns at least at every tick, one and a half
/// heartbeat intervals). A core that is stuck (its log waiting for disk room) reports
/// nothing, and the last report's figure would stay young for as long as it stays stuck:
/// the time since that report counts too.
fn leader_fresh(
    m: &openraft::RaftMetrics<NodeId, openraft::BasicNode>,
    bound: Duration,
    reported_ago: Duration,
) -> bool {
    let applied_own_term = m
        .last_applied
        .is_some_and(|l| l.leader_id.term == m.current_term);
    let reported_ago = u64::try_from(reported_ago.as_millis()).unwrap_or(u64::MAX);
    applied_own_term
        && m.millis_since_quorum_ack
            .is_some_and(|ms| ms.saturating_add(reported_ago) < bound.as_millis() as u64)
}

/// Records in `p.metrics_at` when its Raft core last reported its metrics, and purges the
/// log behind each new snapshot up to the one before it ([`purge_behind`]), until `cancel`
/// or until the core stops.
async fn watch_metrics(p: Arc<Partition>, cancel: CancellationToken) {
    let mut metrics = p.raft.metrics();
    let mut snapshot = metrics.borrow().snapshot;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            changed = metrics.changed() => {
                if changed.is_err() {
                    break;
                }
                *p.metrics_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                let (now, purged) = {
                    let m = metrics.borrow_and_update();
                    (m.snapshot, m.purged)
                };
                if now == snapshot {
                    continue;
                }
                if let Some(upto) = purge_behind(snapshot, now, purged) {
                    if let Err(e) = p.raft.trigger().purge_log(upto).await {
                        tracing::warn!(partition = p.id, "purge the log behind a snapshot: {e}");
                    }
                }
                snapshot = now;
            }
        }
    }
}

/// How far to purge the log once a snapshot at `now` follows one at `prev`: up to `prev`,
/// if the log (purged up to `purged`) still holds entries there.
///
/// openraft keeps `keep_entries_after_snapshot` entries behind a snapshot (1,000 by
/// default) whatever they weigh, for followers that lag a little. Entries carry file data,
/// up to a 4 MiB chunk each: a partition written with large files kept up to 4 GiB of log
/// behind its snapshot, a second copy of data its store already holds, though snapshots
/// come every `snapshot_after_bytes` (64 MiB) of log. Purging up to the previous snapshot
/// keeps behind each snapshot at most what was logged since the one before (about
/// `snapshot_after_bytes`, or `snapshot_after_entries` entries); a follower further
/// behind than that is sent a snapshot, as one behind the entries openraft keeps is.
fn purge_behind(
    prev: Option<openraft::LogId<NodeId>>,
    now: Option<openraft::LogId<NodeId>>,
    purged: Option<openraft::LogId<NodeId>>,
) -> Option<u64> {
    let (prev, now) = (prev?, now?);
    let held = purged.is_none_or(|p| p.index < prev.index);
    (prev.index < now.index && held).then_some(prev.index)
}

fn not_leader(partition: u32, leader: Option<NodeId>, peers: &Peers) -> TalonError {
    TalonError::NotLeader {
        partition,
        leader_id: leader,
        leader_addr: leader.and_then(|l| peers.addr(l).map(str::to_string)),
    }
}

/// Maps a client_write failure: forward-to-leader becomes NotLeader; the rest Unavailable.
fn write_error(
    partition: u32,
    e: RaftError<NodeId, ClientWriteError<NodeId, openraft::BasicNode>>,
    peers: &Peers,
) -> TalonError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            not_leader(partition, f.leader_id, peers)
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            TalonError::Unavailable(e.to_string())
        }
        RaftError::Fatal(f) => TalonError::Unavailable(format!("partition {partition}: {f}")),
    }
}

async fn proposer(
    p: Arc<Partition>,
    mut rx: mpsc::Receiver<(Command, Reply)>,
    max_batch: usize,
    cancel: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(PROPOSALS_IN_FLIGHT));
    loop {
        let first = tokio::select! {
            _ = cancel.cancelled() => break,
            m = rx.recv() => match m { Some(m) => m, None => break },
        };
        // Wait for a free proposal slot first: requests arriving meanwhile join this batch.
        let permit = tokio::select! {
            _ = cancel.cancelled() => break,
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let mut bytes = first.0.approx_bytes();
        let mut batch = vec![first];
        while batch.len() < max_batch && bytes < PROPOSAL_BYTES {
            match rx.try_recv() {
                Ok(m) => {
                    bytes += m.0.approx_bytes();
                    batch.push(m);
                }
                Err(_) => break,
            }
        }
        let p = p.clone();
        tokio::spawn(async move {
            let (cmds, replies): (Vec<Command>, Vec<Reply>) = batch.into_iter().unzip();
            let single = cmds.len() == 1;
            let cmd = if single {
                cmds.into_iter().next().unwrap_or(Command::Noop)
            } else {
                Command::Batch(cmds)
            };
            let write = p.raft.client_write(cmd);
            tokio::pin!(write);
            let answer = tokio::select! {
                biased;
                r = &mut write => r,
                _ = deposed(&p.raft) => {
                    drop(permit);
                    match tokio::time::timeout(DEPOSED_WAIT, write).await {
                        Ok(r) => r,
                        Err(_) => {
                            let err = TalonError::Unavailable(format!(
                                "partition {}: this replica stopped leading before the \
                                 proposal was answered; it may still apply",
                                p.id
                            ));
                            for r in replies {
                                let _ = r.send(Err(err.clone()));
                            }
                            return;
                        }
                    }
                }
            };
            match answer {
                Ok(resp) => {
                    if single {
                        for r in replies {
                            let _ = r.send(Ok(resp.data.clone()));
                        }
                    } else if let CommandResult::Batch(results) = resp.data {
                        for (r, res) in replies.into_iter().zip(results) {
                            let _ = r.send(Ok(res));
                        }
                    } else {
                        for r in replies {
                            let _ = r.send(Err(TalonError::Unavailable(
                                "batch answered without results".into(),
                            )));
                        }
                    }
                }
                Err(e) => {
                    let err = write_error(p.id, e, &p.peers);
                    for r in replies {
                        let _ = r.send(Err(err.clone()));
                    }
                }
            }
        });
    }
    // Dropping rx answers queued callers with Unavailable (their oneshot is dropped).
}

/// Returns once this replica does not lead, or leads in a later term than when first
/// polled: a proposal made in the first term is then no longer this leader's to answer.
async fn deposed(raft: &Raft) {
    // The server metrics change only with the vote, role, leader or membership, not with
    // every entry, so this wakes rarely on a busy leader.
    let mut server = raft.server_metrics();
    let mut term = None;
    loop {
        {
            let m = server.borrow_and_update();
            let now = m.vote.leader_id().term;
            if m.state != ServerState::Leader || *term.get_or_insert(now) != now {
                return;
            }
        }
        if server.changed().await.is_err() {
            return;
        }
    }
}

/// The tracing target of the strict reads' trace (see the module's header).
pub const STRICT_READS: &str = "talon_meta::strict_reads";

async fn read_barrier(
    raft: Raft,
    partition: u32,
    peers: Arc<Peers>,
    mut rx: mpsc::Receiver<oneshot::Sender<Result<(), TalonError>>>,
    cancel: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            _ = cancel.cancelled() => break,
            m = rx.recv() => match m { Some(m) => m, None => break },
        };
        let mut waiters = vec![first];
        while let Ok(w) = rx.try_recv() {
            waiters.push(w);
        }
        let res = match raft.ensure_linearizable().await {
            Ok(read_log_id) => {
                tracing::debug!(
                    target: STRICT_READS,
                    partition,
                    read_log_id = ?read_log_id,
                    vote = ?raft.metrics().borrow().vote,
                    waiters = waiters.len(),
                    "read barrier passed"
                );
                Ok(())
            }
            Err(RaftError::APIError(e)) => {
                let leader = match &e {
                    openraft::error::CheckIsLeaderError::ForwardToLeader(f) => f.leader_id,
                    _ => None,
                };
                Err(not_leader(partition, leader, &peers))
            }
            Err(RaftError::Fatal(f)) => Err(TalonError::Unavailable(format!(
                "partition {partition}: {f}"
            ))),
        };
        for w in waiters {
            let _ = w.send(res.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::leader_fresh;
    use crate::network::tests::log_id;
    use openraft::{RaftMetrics, ServerState};
    use std::time::Duration;

    #[test]
    fn the_log_is_purged_up_to_the_snapshot_before() {
        use super::purge_behind;
        let at = |index| Some(log_id(1, index));
        // (previous snapshot, new snapshot, purged, how far to purge)
        let cases = [
            // A second snapshot: purge up to the first, whatever openraft keeps.
            (at(40), at(90), None, Some(40)),
            (at(40), at(90), at(12), Some(40)),
            // The first snapshot, or a log already purged that far: nothing more.
            (None, at(90), None, None),
            (at(40), at(90), at(40), None),
            (at(40), at(90), at(80), None),
            // No newer snapshot (none, or one not past the last).
            (at(40), None, None, None),
            (Some(log_id(2, 40)), at(40), None, None),
        ];
        for (prev, now, purged, want) in cases {
            assert_eq!(
                purge_behind(prev, now, purged),
                want,
                "{prev:?} {now:?} {purged:?}"
            );
        }
    }

    #[test]
    fn a_leaders_lease_counts_the_time_since_its_core_reported() {
        let mut m = RaftMetrics::<u64, openraft::BasicNode>::new_initial(1);
        m.current_term = 3;
        m.state = ServerState::Leader;
        m.last_applied = Some(log_id(3, 40));
        m.millis_since_quorum_ack = Some(100);
        let bound = Duration::from_millis(2000);
        assert!(leader_fresh(&m, bound, Duration::from_millis(50)));
        // The same report, from a core that has not turned for two seconds.
        assert!(!leader_fresh(&m, bound, Duration::from_millis(1900)));
        // A leader that has not applied an entry of its own term yet (finding F11).
        m.last_applied = Some(log_id(2, 39));
        assert!(!leader_fresh(&m, bound, Duration::ZERO));
    }
}
