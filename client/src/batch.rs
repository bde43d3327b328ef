//! Batch operations: many creates, lookups or getattrs in few RPCs, for bulk import and
//! mdtest-style phases.
//!
//! Ops are grouped by the partition they route to, cut into chunks of the cluster's
//! `max_batch`, and sent as `Batch` RPCs, several in flight at once
//! (`ClientOptions::batch_concurrency`). Each op answers on its own; results come back in
//! input order. A whole-RPC failure (not leader, unavailable, ...) is retried by the router
//! like any request; if it still fails, every op of that chunk reports the error. A
//! `StaleEpoch` answer for a chunk is retried once with the newer epoch, as for the
//! inode-level operations. The server may also answer "not leader" (or "retry") per op,
//! when leadership moved under the batch; those ops are sent again at the named leader
//! until they settle or the operation deadline passes.

use crate::client::{read_kind, Client};
use crate::router::ReadKind;
use crate::settle::Scope;
use crate::types::CreateSpec;
use crate::wire::replies;
use crate::wire::requests::{self, request_id, BatchOp, Header};
use futures::stream::{self, StreamExt};
use std::collections::BTreeMap;
use talon_model::placement::entry_partition;
use talon_model::{check_name, Attr, Backoff, Class, Ino, TalonError};

/// One op bound for a partition, with its position in the caller's input.
type Slot = (usize, BatchOp);

impl Client {
    /// Creates every `(name, spec)` in `parent`. The result for each input is at the same
    /// position; one failing create does not stop the others.
    pub async fn create_batch(
        &self,
        parent: Ino,
        specs: Vec<(Vec<u8>, CreateSpec)>,
    ) -> Vec<Result<Attr, TalonError>> {
        let n = specs.len();
        let class = match self.dir_class(parent).await {
            Ok(c) => c,
            Err(e) => return vec![Err(e); n],
        };
        let parts = self.router().partitions();
        let mut results: Vec<Option<Result<Attr, TalonError>>> = vec![None; n];
        let mut groups: BTreeMap<u32, Vec<(usize, Vec<u8>, CreateSpec)>> = BTreeMap::new();
        for (i, (name, spec)) in specs.into_iter().enumerate() {
            match spec.check(&name) {
                Ok(()) => {
                    let p = entry_partition(parent, &name, class, parts);
                    groups.entry(p).or_default().push((i, name, spec));
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let names: BTreeMap<usize, Vec<u8>> = groups
            .values()
            .flatten()
            .map(|(i, name, _)| (*i, name.clone()))
            .collect();
        let ops = groups.into_iter().map(|(p, ops)| {
            let ops = ops
                .into_iter()
                .map(|(i, name, spec)| {
                    // The id goes with the op through every resend of its batch.
                    let op = requests::batch_create(
                        Header::new(p, ReadKind::Write, 0),
                        parent,
                        &name,
                        &spec,
                        self.owner(),
                        request_id(),
                    );
                    (i, op)
                })
                .collect();
            (p, ops)
        });
        for (i, r) in self.run_batches(ops.collect(), ReadKind::Write).await {
            if let Ok(attr) = &r {
                if let Some(name) = names.get(&i) {
                    self.cache()
                        .insert_dentry(parent, class, name, attr, self.epoch());
                }
            }
            results[i] = Some(r);
        }
        self.changed_dir(parent);
        finish(results)
    }

    /// Looks up every name of `names` in `parent`; results in input order.
    pub async fn lookup_batch(
        &self,
        parent: Ino,
        names: Vec<Vec<u8>>,
    ) -> Vec<Result<Attr, TalonError>> {
        let n = names.len();
        let class = match self.dir_class(parent).await {
            Ok(c) => c,
            Err(e) => return vec![Err(e); n],
        };
        let parts = self.router().partitions();
        let mut results: Vec<Option<Result<Attr, TalonError>>> = vec![None; n];
        let mut groups: BTreeMap<u32, Vec<Slot>> = BTreeMap::new();
        for (i, name) in names.into_iter().enumerate() {
            if let Err(e) = check_name(&name) {
                results[i] = Some(Err(e));
                continue;
            }
            let p = entry_partition(parent, &name, class, parts);
            let op = requests::batch_lookup(parent, &name);
            groups.entry(p).or_default().push((i, op));
        }
        for (i, r) in self
            .run_batches(groups.into_iter().collect(), read_kind(class))
            .await
        {
            results[i] = Some(r);
        }
        finish(results)
    }

    /// The attributes of every ino of `inos`, read from their partition leaders; results in
    /// input order.
    pub async fn getattr_batch(&self, inos: &[Ino]) -> Vec<Result<Attr, TalonError>> {
        let mut groups: BTreeMap<u32, Vec<Slot>> = BTreeMap::new();
        for (i, ino) in inos.iter().enumerate() {
            let op = requests::batch_get_attr(*ino);
            groups.entry(ino.home()).or_default().push((i, op));
        }
        let mut results: Vec<Option<Result<Attr, TalonError>>> = vec![None; inos.len()];
        for (i, r) in self
            .run_batches(groups.into_iter().collect(), ReadKind::StrictRead)
            .await
        {
            results[i] = Some(r);
        }
        finish(results)
    }

    /// Sends the grouped ops in chunks of `max_batch`, concurrently; answers every slot.
    async fn run_batches(
        &self,
        groups: Vec<(u32, Vec<Slot>)>,
        read: ReadKind,
    ) -> Vec<(usize, Result<Attr, TalonError>)> {
        let max = self.cluster_map().max_batch.max(1) as usize;
        let mut chunks: Vec<(u32, Vec<Slot>)> = Vec::new();
        for (p, mut ops) in groups {
            while !ops.is_empty() {
                let rest = ops.split_off(ops.len().min(max));
                chunks.push((p, std::mem::replace(&mut ops, rest)));
            }
        }
        let concurrency = self.options().batch_concurrency.max(1);
        stream::iter(chunks)
            .map(|(p, slots)| self.run_chunk(p, slots, read))
            .buffer_unordered(concurrency)
            .flat_map(stream::iter)
            .collect()
            .await
    }

    /// Sends one chunk; ops answered with a per-op "try elsewhere or later" error (a
    /// leader change between routing and applying) are sent again, at the leader they
    /// name, until they settle or the operation deadline passes.
    async fn run_chunk(
        &self,
        p: u32,
        slots: Vec<Slot>,
        read: ReadKind,
    ) -> Vec<(usize, Result<Attr, TalonError>)> {
        let deadline = std::time::Instant::now() + self.router().op_timeout();
        let mut backoff = Backoff::rpc();
        let mut pending = slots;
        let mut done = Vec::with_capacity(pending.len());
        loop {
            let answers = self.send_chunk(p, &pending, read).await;
            let mut again = Vec::new();
            for ((i, op), r) in pending.into_iter().zip(answers) {
                match r {
                    Err(e) if per_op_retryable(&e) => {
                        self.router().learn_leader(p, &e);
                        again.push(((i, op), e));
                    }
                    r => done.push((i, r)),
                }
            }
            if again.is_empty() {
                return done;
            }
            let Some(pause) = backoff.pause_before(deadline) else {
                done.extend(again.into_iter().map(|((i, _), e)| (i, Err(e))));
                return done;
            };
            tokio::time::sleep(pause).await;
            pending = again.into_iter().map(|(slot, _)| slot).collect();
        }
    }

    /// One `Batch` RPC (with the router's retries); one result per slot, in order.
    async fn send_chunk(
        &self,
        p: u32,
        slots: &[Slot],
        read: ReadKind,
    ) -> Vec<Result<Attr, TalonError>> {
        let read = self.read_for(p, read);
        let reply = self
            .settle(Scope::Inode, |epoch| async move {
                let req =
                    requests::batch(Header::new(p, read, epoch), slots.iter().map(|(_, op)| op));
                self.call(p, read, |mut c| {
                    let req = req.clone();
                    async move { c.batch(req).await }
                })
                .await
            })
            .await;
        match reply {
            Err(e) => vec![Err(e); slots.len()],
            Ok(reply) => replies::batch(reply, slots.len()),
        }
    }
}

/// Per-op errors of a batch worth sending again: the op was not applied.
fn per_op_retryable(e: &TalonError) -> bool {
    matches!(
        e,
        TalonError::NotLeader { .. } | TalonError::Retry(_) | TalonError::Unavailable(_)
    )
}

fn finish(results: Vec<Option<Result<Attr, TalonError>>>) -> Vec<Result<Attr, TalonError>> {
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(TalonError::Invalid("op was not sent".into()))))
        .collect()
}

/// Which partition each name of a relaxed (or strict) directory lands on; for tools that
/// want to show or plan the spread of a bulk load.
pub fn spread(parent: Ino, class: Class, partitions: u32, names: &[Vec<u8>]) -> Vec<u64> {
    let mut counts = vec![0u64; partitions.max(1) as usize];
    for n in names {
        counts[entry_partition(parent, n, class, partitions) as usize] += 1;
    }
    counts
}
