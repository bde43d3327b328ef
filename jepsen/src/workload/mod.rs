//! Workloads: what the client workers do, and which checker judges the history.
//!
//! Every worker runs operations one at a time through the `talon-client` library and
//! records each as an invocation and a completion ([`Worker::op`]). How an error maps to a
//! completion is decided once, in [`classify`]: a POSIX error the operation's contract
//! names is a definite answer; anything else (a timeout, an unavailable cluster, an
//! unexpected errno) leaves the outcome unknown (`info`). Being conservative here can only
//! hide anomalies, never invent them.

pub mod checkpoint;
pub mod links;
pub mod register;
pub mod rename;
pub mod set;

use crate::checker::Verdict;
use crate::history::{Call, Event, EventType, Recorder};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use talon_client::{Client, Errno, TalonError};

/// The workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadKind {
    /// Files of a strict directory as linearizable registers.
    Register,
    /// Unique creates in a relaxed directory, read back by their client; nothing
    /// acknowledged is lost or unseen.
    Set,
    /// The set workload through a FUSE mount (`talon mount`).
    SetFuse,
    /// Files renamed between strict directories on two partitions.
    Rename,
    /// Multi-MiB checkpoints written under a temporary name and renamed into place.
    Checkpoint,
    /// Hard links of files made and removed in strict directories on other partitions;
    /// the link count read must match.
    Links,
}

impl WorkloadKind {
    /// Every workload.
    pub const ALL: [WorkloadKind; 6] = [
        WorkloadKind::Register,
        WorkloadKind::Set,
        WorkloadKind::SetFuse,
        WorkloadKind::Rename,
        WorkloadKind::Checkpoint,
        WorkloadKind::Links,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Register => "register",
            WorkloadKind::Set => "set",
            WorkloadKind::SetFuse => "set-fuse",
            WorkloadKind::Rename => "rename",
            WorkloadKind::Checkpoint => "checkpoint",
            WorkloadKind::Links => "links",
        }
    }

    /// Checks a history of this workload; `lenient`: see [`crate::checker::Leniency`].
    pub fn check(self, events: &[Event], lenient: bool) -> Verdict {
        let l = crate::checker::Leniency { guessed: lenient };
        match self {
            WorkloadKind::Register | WorkloadKind::Checkpoint => {
                crate::checker::check_registers(events, l)
            }
            WorkloadKind::Set | WorkloadKind::SetFuse => crate::checker::check_set(events),
            WorkloadKind::Rename => crate::checker::check_renames(events, l),
            WorkloadKind::Links => crate::checker::check_links(events, l),
        }
    }
}

/// Errors of a workload's set-up or final reads (never of its operations: those are
/// recorded, not returned).
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The cluster did not answer in time.
    #[error("{what} did not succeed within {secs} s: {last}")]
    Timeout {
        /// What was being done.
        what: String,
        /// How long it was tried.
        secs: u64,
        /// The last error.
        last: String,
    },
}

/// What workers share: the client, the history, and the run's bounds.
#[derive(Clone)]
pub struct Ctx {
    /// The client (one per run; workers share its channels and cache).
    pub client: Client,
    /// The history.
    pub rec: Recorder,
    /// When workers stop starting operations.
    pub deadline: Instant,
    /// Operations started so far, over all workers.
    pub started: Arc<AtomicU64>,
    /// Most operations to start.
    pub op_limit: u64,
    /// Number of workers (process ids advance by this after an `info`).
    pub workers: u64,
    /// Time one operation may take before it is recorded as `info`.
    pub op_timeout: Duration,
    /// Seed of the run; worker `w` draws from `seed + w`.
    pub seed: u64,
}

impl Ctx {
    /// Takes the next operation number, or `None` when the run's bounds are reached.
    pub fn next_op(&self) -> Option<u64> {
        if Instant::now() >= self.deadline {
            return None;
        }
        let n = self.started.fetch_add(1, Ordering::Relaxed);
        (n < self.op_limit).then_some(n)
    }
}

/// How one operation ended.
pub enum Outcome {
    /// It happened; the call carries the result.
    Ok(Call),
    /// It certainly had no effect.
    Fail(String),
    /// Unknown.
    Info(String),
}

/// Whether an error is a definite answer from the namespace (`Some(errno)`) or leaves the
/// outcome unknown (`None`).
pub fn classify(e: &TalonError) -> Option<Errno> {
    match e {
        TalonError::Posix { errno, .. }
            if matches!(
                *errno,
                Errno::ENOENT | Errno::EEXIST | Errno::ENOTEMPTY | Errno::EISDIR
            ) =>
        {
            Some(*errno)
        }
        _ => None,
    }
}

/// One worker's identity in the history.
pub struct Worker {
    /// The worker's number, 0-based.
    pub id: u64,
    /// Its current process id.
    pub process: u64,
    ctx: Ctx,
}

impl Worker {
    /// Worker `id` of `ctx`.
    pub fn new(ctx: &Ctx, id: u64) -> Worker {
        Worker {
            id,
            process: id,
            ctx: ctx.clone(),
        }
    }

    /// Records `call`'s invocation, runs `f` with the run's per-operation timeout, and
    /// records its completion. After an `info` the worker takes a new process id.
    pub async fn op<F>(&mut self, call: Call, f: F) -> EventType
    where
        F: Future<Output = Outcome>,
    {
        let rec = &self.ctx.rec;
        rec.record(self.process, EventType::Invoke, call.clone(), None);
        let out = match tokio::time::timeout(self.ctx.op_timeout, f).await {
            Ok(o) => o,
            Err(_) => Outcome::Info("timed out".into()),
        };
        match out {
            Outcome::Ok(result) => {
                rec.record(self.process, EventType::Ok, result, None);
                EventType::Ok
            }
            Outcome::Fail(why) => {
                rec.record(self.process, EventType::Fail, call, Some(why));
                EventType::Fail
            }
            Outcome::Info(why) => {
                rec.record(self.process, EventType::Info, call, Some(why));
                self.process += self.ctx.workers;
                EventType::Info
            }
        }
    }
}

/// Runs `f` until it succeeds or `secs` pass, pausing between tries.
pub async fn retry<T, F, Fut>(what: &str, secs: u64, mut f: F) -> Result<T, WorkloadError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, TalonError>>,
{
    let until = Instant::now() + Duration::from_secs(secs);
    // Bounded by time; at least one try.
    loop {
        let last = match tokio::time::timeout(Duration::from_secs(10), f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        if Instant::now() >= until {
            return Err(WorkloadError::Timeout {
                what: what.to_string(),
                secs,
                last,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The partition holding the entries of strict directory `dir` (all of them: a strict
/// directory's entries live at one partition).
pub fn strict_entries(ctx: &Ctx, dir: talon_client::Ino) -> u32 {
    let p = ctx.client.cluster_map().partitions;
    talon_model::placement::entry_partition(dir, b"", talon_client::Class::Strict, p)
}

/// Creates directory `path` and its parents (retrying for up to a minute); its inode.
pub async fn mkdir(ctx: &Ctx, path: &str) -> Result<talon_client::Ino, WorkloadError> {
    let attr = retry(&format!("create {path}"), 60, || {
        ctx.client.mkdir(
            path,
            talon_client::MkdirOptions {
                parents: true,
                ..talon_client::MkdirOptions::default()
            },
        )
    })
    .await?;
    Ok(attr.ino)
}

/// Lists directory `path` completely, from the partition leaders.
pub async fn list(client: &Client, path: &str) -> Result<Vec<String>, TalonError> {
    let mut rd = client.read_dir(path).await?.linearizable(true);
    let mut out = Vec::new();
    while let Some(page) = rd.next_page().await? {
        out.extend(
            page.into_iter()
                .map(|e| String::from_utf8_lossy(&e.name).into_owned()),
        );
    }
    Ok(out)
}
