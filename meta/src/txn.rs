//! Two-phase commit over Raft for namespace changes that span partitions (rename across
//! partitions, rmdir, link, unlink of a moved inode, class changes).
//!
//! Protocol, driven by the leader of the coordinator partition (the one the client's
//! request reached):
//! 1. `Prepare` on every participant, in parallel: each checks its preconditions, locks
//!    the keys its ops touch (intents, replicated), allocates inos, or refuses.
//! 2. Any refusal: `Decide(abort)` on the coordinator, `Finish(abort)` everywhere.
//! 3. Otherwise (and after an optional check that needs the locks held, such as "a
//!    directory is not moved into itself"): `Decide(commit)` on the coordinator. The
//!    decision is a Raft entry; the first decision recorded wins, so a recovery that
//!    aborted first makes this commit fail cleanly.
//! 4. `Finish(commit)` everywhere, in parallel; the client is answered when every
//!    participant has applied it, so what it does next sees the whole change.
//!
//! Recovery: every partition leader scans its prepared intents; one it has seen prepared
//! for `txn_recovery_after_ms` by its own monotonic clock is resolved by proposing
//! `Decide(abort)` at its coordinator (which answers the decision already recorded, if any)
//! and finishing accordingly. A crash at any step thus leaves the namespace as before or as
//! after. Readers that meet a locked key get `Retry`, so no one observes half of a
//! transaction.
//!
//! Its operations are methods of [`Txns`], a view of a [`Node`] borrowed for one call
//! (`Txns::new(&node).run_ops(..)`), so a call names the file that defines it. It builds on
//! the node's routing and proposals only; the operations that use it (`namespace`,
//! `rename`, `attrs`) sit above it, and it must not reach up to them.

use crate::node::Node;
use crate::types::{ApplyError, Command, CommandResult, Op, Outcome, TxId};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use talon_model::TalonError;
use tokio_util::sync::CancellationToken;

/// Ranks refusals so the user sees the most meaningful one (a POSIX error over a lock).
fn rank(e: &TalonError) -> u8 {
    match e {
        TalonError::Posix { .. } => 0,
        TalonError::StaleEpoch { .. } => 1,
        TalonError::Invalid(_) => 2,
        TalonError::Retry(_) => 3,
        _ => 4,
    }
}

/// The node's transactions: its multi-partition changes and the recovery of their stale
/// intents. A view of a [`Node`] borrowed for a call: `Txns::new(&node).run_ops(..)`.
#[derive(Clone, Copy, Debug)]
pub struct Txns<'a> {
    node: &'a Node,
}

impl<'a> Txns<'a> {
    /// The transactions `node` coordinates and recovers.
    pub fn new(node: &'a Node) -> Self {
        Txns { node }
    }

    /// Applies `parts` (partition → ops) atomically. One partition: a single `Atomic`
    /// proposal. Several: two-phase commit coordinated by `coordinator`; `check` runs
    /// after every participant prepared (locks held) and may veto.
    pub async fn run_ops<F, Fut>(
        &self,
        coordinator: u32,
        parts: BTreeMap<u32, Vec<Op>>,
        check: F,
    ) -> Result<BTreeMap<u32, Outcome>, TalonError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), TalonError>>,
    {
        if parts.len() == 1 {
            let (p, ops) = parts.into_iter().next().unwrap_or_default();
            check().await?;
            return match self.node.propose_on(p, Command::Atomic(ops)).await? {
                CommandResult::Applied(o) => Ok(BTreeMap::from([(p, o)])),
                CommandResult::Failed(e) => Err(e.into()),
                other => Err(TalonError::Unavailable(format!(
                    "unexpected result {other:?}"
                ))),
            };
        }
        let txid = TxId {
            coordinator,
            id: rand::random(),
        };
        let at_ms = crate::clock::now().as_millis();
        let prepares = parts.iter().map(|(p, ops)| {
            let cmd = Command::Prepare {
                txid,
                ops: ops.clone(),
                at_ms,
            };
            async move { (*p, self.node.propose_on(*p, cmd).await) }
        });
        let results = futures::future::join_all(prepares).await;
        let mut refusal: Option<TalonError> = None;
        for (p, r) in results {
            let err = match r {
                Ok(CommandResult::Prepared { .. }) => continue,
                Ok(CommandResult::Failed(e)) => TalonError::from(e),
                Ok(other) => {
                    TalonError::Unavailable(format!("partition {p}: unexpected {other:?}"))
                }
                Err(e) => e,
            };
            if refusal.as_ref().is_none_or(|r| rank(&err) < rank(r)) {
                refusal = Some(err);
            }
        }
        if refusal.is_none() {
            if let Err(e) = check().await {
                refusal = Some(e);
            }
        }
        if let Some(err) = refusal {
            self.abort(txid, parts.keys().copied()).await;
            return Err(err);
        }
        crate::fail_point!("txn-prepared");
        match self
            .node
            .propose_on(coordinator, Command::Decide { txid, commit: true })
            .await
        {
            Ok(CommandResult::Decided(true)) => {}
            Ok(_) => {
                self.abort(txid, parts.keys().copied()).await;
                return Err(TalonError::Retry(format!(
                    "transaction {txid} was aborted by recovery"
                )));
            }
            Err(e) => {
                // The decision may or may not be recorded; recovery settles it either way.
                return Err(TalonError::Unavailable(format!(
                    "transaction {txid}: decision unknown: {e}"
                )));
            }
        }
        crate::fail_point!("txn-decided");
        let finishes = parts.keys().map(|p| async move {
            (
                *p,
                self.node
                    .propose_on(*p, Command::Finish { txid, commit: true })
                    .await,
            )
        });
        let mut out = BTreeMap::new();
        for (p, r) in futures::future::join_all(finishes).await {
            match r {
                Ok(CommandResult::Applied(o)) => {
                    out.insert(p, o);
                }
                Ok(other) => tracing::error!(%txid, partition = p, "finish answered {other:?}"),
                // Committed: recovery at the participant will finish it.
                Err(e) => tracing::warn!(%txid, partition = p, "finish deferred to recovery: {e}"),
            }
        }
        Ok(out)
    }

    async fn abort(&self, txid: TxId, parts: impl Iterator<Item = u32>) {
        // Record the abort first, so a late prepare cannot revive the transaction.
        let _ = self
            .node
            .propose_on(
                txid.coordinator,
                Command::Decide {
                    txid,
                    commit: false,
                },
            )
            .await;
        let finishes = parts.map(|p| async move {
            if let Err(e) = self
                .node
                .propose_on(
                    p,
                    Command::Finish {
                        txid,
                        commit: false,
                    },
                )
                .await
            {
                tracing::warn!(%txid, partition = p, "abort deferred to recovery: {e}");
            }
        });
        futures::future::join_all(finishes).await;
    }

    /// Resolves prepared intents that this node has found on partitions it leads, round after
    /// round, for the recovery threshold by its monotonic clock. The wall-clock time a prepare
    /// carries is its coordinator's: read against this node's clock it is wrong by their
    /// difference, and a coordinator whose clock ran minutes ahead would have its intents
    /// look young, and hold their keys, for those minutes (finding F13). A node that takes a
    /// partition over starts its count afresh, so an orphaned intent waits at most the
    /// threshold after its new leader's first round.
    async fn recover_stale(&self) {
        let threshold = Duration::from_millis(self.node.config.raft.txn_recovery_after_ms);
        for (p, part) in &self.node.partitions {
            if part.leader() != Some(self.node.config.node_id) {
                self.node.txns_due.forget(*p);
                continue;
            }
            let prepared = match part.store.prepared() {
                Ok(v) => v,
                Err(e) => {
                    tracing::error!(partition = p, "scan prepared transactions: {e}");
                    continue;
                }
            };
            let due = self.node.txns_due.confirmed(
                *p,
                prepared.into_iter().map(|(txid, _)| txid).collect(),
                threshold,
            );
            for txid in due {
                let decision = match self
                    .node
                    .propose_on(
                        txid.coordinator,
                        Command::Decide {
                            txid,
                            commit: false,
                        },
                    )
                    .await
                {
                    Ok(CommandResult::Decided(d)) => d,
                    Ok(other) => {
                        tracing::warn!(%txid, "decision query answered {other:?}");
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(%txid, "decision query failed: {e}");
                        continue;
                    }
                };
                tracing::info!(%txid, partition = p, commit = decision, "recovering stale transaction");
                if let Err(e) = part
                    .propose(Command::Finish {
                        txid,
                        commit: decision,
                    })
                    .await
                {
                    tracing::warn!(%txid, "finish during recovery failed: {e}");
                }
            }
        }
    }
}

/// Periodic recovery of stale intents; stops on `cancel`.
pub async fn recovery_loop(node: Arc<Node>, cancel: CancellationToken) {
    let period =
        Duration::from_millis((node.config.raft.txn_recovery_after_ms / 3).clamp(100, 1000));
    let txns = Txns::new(&node);
    crate::node::every(period, &cancel, || txns.recover_stale()).await;
}

/// Turns an apply refusal into the caller's error.
pub fn refused(e: ApplyError) -> TalonError {
    e.into()
}
