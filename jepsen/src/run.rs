//! One run: build and start the cluster, set the workload up, run workers and the nemesis
//! until the time or operation bound, heal, do the final reads, stop every process, check
//! the history, and summarise.
//!
//! Cleanup does not depend on reaching the end: the cluster's processes die with the
//! [`Cluster`] value (SIGKILL on drop), the firewall's rules and the loopback addresses live
//! in the harness's private network namespace, which the kernel removes when the harness and
//! its nodes are gone, and the working directory is a temporary directory, kept only when
//! asked or when the verdict is not valid (so its history and logs can be read).

use crate::checker::Verdict;
use crate::cluster::{Cluster, ClusterError, ClusterSpec};
use crate::history::{fault_windows, pair, Call, Event, EventType, Recorder};
use crate::nemesis::{Nemesis, NemesisKind, ScheduleMode, Timing};
use crate::net::{Firewall, NetError, NetNs};
use crate::workload::{
    checkpoint::Checkpoint, links::Links, register::Register, rename::Rename, set::Set, Ctx,
    Worker, WorkloadError, WorkloadKind,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use talon_client::{Client, ClientOptions};

/// The nodes' default log filter: warnings, and the trace of strict reads (each read
/// barrier and each strict lookup, with the applied id it answered from), which a stale
/// read the checker finds is traced back with; a run kept for an invalid verdict has it.
pub const DEFAULT_NODE_LOG: &str = "warn,talon_meta::strict_reads=debug";

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The workload.
    pub workload: WorkloadKind,
    /// The fault kinds.
    pub nemeses: Vec<NemesisKind>,
    /// How kinds are scheduled.
    pub mode: ScheduleMode,
    /// Seed of every random choice.
    pub seed: u64,
    /// How long workers run.
    pub time: Duration,
    /// Most operations.
    pub ops: u64,
    /// Number of nodes.
    pub nodes: u64,
    /// Replicas per partition.
    pub replication: u32,
    /// Number of partitions.
    pub partitions: u32,
    /// Number of workers.
    pub concurrency: u64,
    /// The `talon-meta` binary.
    pub meta_bin: PathBuf,
    /// Where the temporary working directory goes (default: the system's).
    pub dir: Option<PathBuf>,
    /// Keep the working directory (history, logs, data) even if the verdict is valid.
    pub keep: bool,
    /// Operations per register or checkpoint key.
    pub ops_per_key: u64,
    /// Body size of a checkpoint.
    pub checkpoint_bytes: usize,
    /// Files in the rename workload.
    pub rename_files: u64,
    /// The nemesis's timing.
    pub timing: Timing,
    /// Time one operation may take before it is recorded as unknown.
    pub op_timeout: Duration,
    /// Time the final reads may take after healing.
    pub recovery: Duration,
    /// Check with [`crate::checker::Leniency::guessed`] (open finding F1).
    pub lenient: bool,
    /// Size of each node's data file system when disk faults are on (MiB).
    pub disk_mib: u64,
    /// The `talon` binary, for `set-fuse`.
    pub talon_bin: PathBuf,
    /// Snapshot every partition after this many log entries (default: the server's), so
    /// that a node back from a fault is sent a snapshot.
    pub snapshot_every: Option<u64>,
    /// The nodes' log filter (`RUST_LOG` syntax).
    pub node_log: String,
    /// The nodes' relaxed staleness bound, ms (default: the server's).
    pub staleness_ms: Option<u64>,
    /// The nodes' unlinked grace, ms (default: the server's): how long a replaced or
    /// unlinked file, and chunks a rewrite took out of a layout, are kept.
    pub unlinked_grace_ms: Option<u64>,
}

impl RunConfig {
    /// Defaults for `workload`: 5 nodes, R = 3, 8 partitions, 30 s, every fault kind in turn.
    pub fn new(workload: WorkloadKind, meta_bin: PathBuf) -> RunConfig {
        RunConfig {
            workload,
            nemeses: NemesisKind::ALL.to_vec(),
            mode: ScheduleMode::Each,
            seed: 1,
            time: Duration::from_secs(30),
            ops: 100_000,
            nodes: 5,
            replication: 3,
            partitions: 8,
            concurrency: 6,
            meta_bin,
            dir: None,
            keep: false,
            ops_per_key: 15,
            checkpoint_bytes: (5 << 20) + 12_345,
            rename_files: 8,
            timing: Timing {
                quiet: Duration::from_millis(1500),
                hold_min: Duration::from_secs(2),
                hold_max: Duration::from_secs(4),
            },
            op_timeout: Duration::from_secs(8),
            recovery: Duration::from_secs(90),
            lenient: false,
            disk_mib: 2048,
            talon_bin: PathBuf::from("talon"),
            snapshot_every: None,
            node_log: DEFAULT_NODE_LOG.into(),
            staleness_ms: None,
            unlinked_grace_ms: None,
        }
    }
}

/// Why a run could not reach a verdict.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The cluster's processes.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The network namespace or firewall.
    #[error(transparent)]
    Net(#[from] NetError),
    /// Set-up or final reads.
    #[error("{0} (working directory kept at {1})")]
    Workload(WorkloadError, PathBuf),
    /// The working directory or history file.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// No node answered.
    #[error("connect to the cluster: {0}")]
    Connect(String),
    /// The FUSE mount did not come up.
    #[error(transparent)]
    Mount(#[from] crate::mount::MountError),
    /// A worker task panicked.
    #[error("a worker failed: {0}")]
    Worker(String),
}

/// What a run produced.
#[derive(Debug)]
pub struct Report {
    /// The checker's verdict.
    pub verdict: Verdict,
    /// The human summary (printed by the binary).
    pub summary: String,
    /// The working directory, if kept.
    pub kept: Option<PathBuf>,
    /// The history.
    pub events: Vec<Event>,
}

enum Load {
    Register(Register),
    Set(Set),
    Rename(Rename),
    Checkpoint(Checkpoint),
    Links(Links),
}

impl Load {
    async fn work(&self, ctx: Ctx, w: Worker) {
        match self {
            Load::Register(l) => l.work(ctx, w).await,
            Load::Set(l) => l.work(ctx, w).await,
            Load::Rename(l) => l.work(ctx, w).await,
            Load::Checkpoint(l) => l.work(ctx, w).await,
            Load::Links(l) => l.work(ctx, w).await,
        }
    }
}

async fn connect(addrs: &[String], opts: ClientOptions) -> Result<Client, RunError> {
    let until = Instant::now() + Duration::from_secs(60);
    // Bounded by time: the nodes need a moment to bind and elect.
    loop {
        match Client::connect(addrs, opts.clone()).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() >= until => return Err(RunError::Connect(e.to_string())),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Runs `cfg` inside the namespace `ns` proves this process is in.
pub async fn run(cfg: &RunConfig, ns: &NetNs) -> Result<Report, RunError> {
    let mut builder = tempfile::Builder::new();
    let builder = builder.prefix("talon-jepsen-");
    let tmp = match &cfg.dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|source| RunError::Io {
                what: format!("create {}", d.display()),
                source,
            })?;
            builder.tempdir_in(d)
        }
        None => builder.tempdir(),
    }
    .map_err(|source| RunError::Io {
        what: "create the working directory".into(),
        source,
    })?;
    let dir = tmp.path().to_path_buf();
    let rec = Recorder::new(Some(&dir.join("history.jsonl"))).map_err(|e| RunError::Io {
        what: "create the history file".into(),
        source: std::io::Error::other(e.to_string()),
    })?;

    let needs_net = cfg.nemeses.iter().any(|k| k.is_network());
    let firewall = if needs_net {
        Some(Firewall::new(
            ns,
            cfg.nemeses.contains(&NemesisKind::SlowLink),
        )?)
    } else {
        None
    };
    let mut cluster = Cluster::init(ClusterSpec {
        meta_bin: cfg.meta_bin.clone(),
        dir: dir.clone(),
        nodes: cfg.nodes,
        replication: cfg.replication,
        partitions: cfg.partitions,
        node_log: cfg.node_log.clone(),
    })?;
    if cfg.nemeses.contains(&NemesisKind::DiskFull) {
        cluster.mount_disks(ns, cfg.disk_mib)?;
    }
    let points = if cfg.nemeses.iter().any(|k| k.needs_fail_points()) {
        cluster.fail_points()?
    } else {
        Vec::new()
    };
    if let Some(n) = cfg.snapshot_every {
        cluster.snapshot_every(n)?;
    }
    if let Some(ms) = cfg.staleness_ms {
        cluster.relaxed_staleness(ms)?;
    }
    if let Some(ms) = cfg.unlinked_grace_ms {
        cluster.unlinked_grace(ms)?;
    }
    cluster.start_all()?;
    let addrs = cluster.addrs();
    let cluster = Arc::new(Mutex::new(cluster));

    let opts = ClientOptions {
        op_timeout: cfg.op_timeout.saturating_sub(Duration::from_secs(1)),
        connect_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_secs(2),
        ..ClientOptions::default()
    };
    let client = connect(&addrs, opts).await?;
    let mut ctx = Ctx {
        client: client.clone(),
        rec: rec.clone(),
        deadline: Instant::now() + Duration::from_secs(3600),
        started: Arc::new(AtomicU64::new(0)),
        op_limit: cfg.ops,
        workers: cfg.concurrency,
        op_timeout: cfg.op_timeout,
        seed: cfg.seed,
    };
    let keep = |e: WorkloadError| RunError::Workload(e, dir.clone());
    // Declared before the cluster's last user so that it unmounts before the nodes stop.
    let mut mount: Option<crate::mount::FuseMount> = None;
    let load = match cfg.workload {
        WorkloadKind::Register => {
            Load::Register(Register::setup(&ctx, cfg.ops_per_key).await.map_err(keep)?)
        }
        WorkloadKind::Set => Load::Set(Set::setup(&ctx).await.map_err(keep)?),
        WorkloadKind::SetFuse => {
            let set = Set::setup(&ctx).await.map_err(keep)?;
            let m = crate::mount::FuseMount::start(
                &cfg.talon_bin,
                &addrs,
                &dir.join("mnt"),
                &dir.join("logs").join("mount.log"),
            )?;
            let set = set.through_mount(m.path());
            mount = Some(m);
            Load::Set(set)
        }
        WorkloadKind::Rename => {
            Load::Rename(Rename::setup(&ctx, cfg.rename_files).await.map_err(keep)?)
        }
        WorkloadKind::Links => {
            Load::Links(Links::setup(&ctx, cfg.ops_per_key).await.map_err(keep)?)
        }
        WorkloadKind::Checkpoint => Load::Checkpoint(
            Checkpoint::setup(&ctx, cfg.ops_per_key, cfg.checkpoint_bytes)
                .await
                .map_err(keep)?,
        ),
    };
    let partitions = match &load {
        Load::Register(l) => l.partitions(),
        Load::Set(l) => l.partitions(&ctx),
        Load::Rename(l) => l.partitions(),
        Load::Checkpoint(l) => l.partitions(),
        Load::Links(l) => l.partitions(),
    };

    let started = Instant::now();
    ctx.deadline = started + cfg.time;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let nemesis = Nemesis::new(
        cfg.nemeses.clone(),
        cfg.mode,
        cfg.timing.clone(),
        cfg.seed,
        cluster.clone(),
        firewall,
        client.clone(),
        rec.clone(),
        partitions,
        points,
    );
    let nemesis = tokio::spawn(nemesis.run(stop_rx));
    let load = Arc::new(load);
    let mut workers = Vec::new();
    for id in 0..cfg.concurrency {
        let (load, ctx) = (load.clone(), ctx.clone());
        let w = Worker::new(&ctx, id);
        workers.push(tokio::spawn(async move { load.work(ctx, w).await }));
    }
    let mut worker_error = None;
    for w in workers {
        if let Err(e) = w.await {
            worker_error.get_or_insert(e.to_string());
        }
    }
    let _ = stop_tx.send(true);
    let nemesis = nemesis
        .await
        .map_err(|e| RunError::Worker(format!("nemesis: {e}")))?;
    if let Some(e) = worker_error {
        return Err(RunError::Worker(e));
    }
    let workers_done = started.elapsed();

    // Every fault is healed; the final reads may still wait for elections and recovery.
    let secs = cfg.recovery.as_secs();
    let final_result = match &*load {
        Load::Set(l) => l.finish(&ctx, secs).await,
        Load::Rename(l) => l.finish(&ctx, secs).await,
        _ => Ok(()),
    };
    drop(mount);
    let (restarts, crashes, panics, exits) = {
        let mut c = match cluster.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        // Notes any node that ended by itself since the last heal.
        for id in c.ids() {
            c.state(id);
        }
        c.stop_all();
        (
            c.starts() - cfg.nodes,
            c.fail_point_crashes(),
            c.panics(),
            c.exits().to_vec(),
        )
    };
    let events = rec.finish().map_err(|source| RunError::Io {
        what: "write the history".into(),
        source,
    })?;
    let mut verdict = cfg.workload.check(&events, cfg.lenient);
    // A node that ends by itself with an exit status (not a signal: a crash at a fail point
    // is SIGABRT) failed at something it should survive, such as starting again.
    let failed_exits: Vec<String> = exits
        .iter()
        .filter(|e| e.how.starts_with("exit"))
        .map(|e| format!("node {} ended by itself ({}): {}", e.node, e.how, e.last))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !failed_exits.is_empty() {
        verdict = verdict.and(Verdict {
            valid: false,
            anomalies: failed_exits,
            checked: String::new(),
        });
    }
    if !panics.is_empty() {
        verdict = verdict.and(Verdict {
            valid: false,
            anomalies: panics,
            checked: String::new(),
        });
    }
    if let Err(e) = final_result {
        verdict = verdict.and(Verdict {
            valid: false,
            anomalies: vec![format!("the cluster did not recover after healing: {e}")],
            checked: String::new(),
        });
    }
    let kept = if cfg.keep || !verdict.valid {
        Some(tmp.keep())
    } else {
        None
    };
    let summary = summarize(
        cfg,
        &events,
        &verdict,
        &nemesis,
        &Nodes {
            restarts,
            crashes,
            exits,
        },
        workers_done,
        &kept,
    );
    Ok(Report {
        verdict,
        summary,
        kept,
        events,
    })
}

fn op_name(c: &Call) -> &'static str {
    match c {
        Call::Read { .. } => "read",
        Call::Write { .. } => "write",
        Call::Cas { .. } => "cas",
        Call::Delete { .. } => "delete",
        Call::Add { .. } => "add",
        Call::ReadBack { .. } => "read-back",
        Call::ReadSet { .. } => "read-set",
        Call::Move { .. } => "move",
        Call::List { .. } => "list",
        Call::Link { .. } => "link",
        Call::Unlink { .. } => "unlink",
        Call::Nlink { .. } => "nlink",
        Call::Torn { .. } => "torn",
        Call::Fault { .. } => "fault",
    }
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1e6
}

/// What the nodes' processes went through: restarts, and crashes at fail points by point.
struct Nodes {
    restarts: u64,
    crashes: BTreeMap<String, u64>,
    exits: Vec<crate::cluster::Exit>,
}

/// The human summary of a run: operations by outcome, faults, latency and availability
/// during and outside faults, and the verdict.
fn summarize(
    cfg: &RunConfig,
    events: &[Event],
    verdict: &Verdict,
    nemesis: &Nemesis,
    nodes: &Nodes,
    elapsed: Duration,
    kept: &Option<PathBuf>,
) -> String {
    let mut s = String::new();
    let ops = pair(events);
    let end = events.last().map(|e| e.time_ns).unwrap_or(0);
    let windows = fault_windows(events, end);
    let in_fault = |t: u64| windows.iter().any(|&(a, b)| a <= t && t < b);
    let _ =
        writeln!(
        s,
        "workload {} | nodes {} R={} P={} | workers {} | seed {} | schedule {:?} of [{}] | {:.1} s",
        cfg.workload.name(),
        cfg.nodes,
        cfg.replication,
        cfg.partitions,
        cfg.concurrency,
        cfg.seed,
        cfg.mode,
        cfg.nemeses.iter().map(|k| k.name()).collect::<Vec<_>>().join(","),
        elapsed.as_secs_f64()
    );
    let mut by: BTreeMap<&str, [u64; 3]> = BTreeMap::new();
    for c in &ops {
        let slot = match c.kind {
            EventType::Ok => 0,
            EventType::Fail => 1,
            _ => 2,
        };
        by.entry(op_name(&c.invoke)).or_default()[slot] += 1;
    }
    let total: [u64; 3] = by
        .values()
        .fold([0; 3], |a, b| [a[0] + b[0], a[1] + b[1], a[2] + b[2]]);
    let _ = writeln!(
        s,
        "operations: {} ({} ok, {} fail, {} info)",
        total.iter().sum::<u64>(),
        total[0],
        total[1],
        total[2]
    );
    for (f, [ok, fail, info]) in &by {
        let _ = writeln!(s, "  {f:<9} ok {ok:>6}  fail {fail:>6}  info {info:>6}");
    }
    let faults: Vec<String> = nemesis
        .injected
        .iter()
        .map(|(k, n)| format!("{k} x{n}"))
        .collect();
    let _ = writeln!(
        s,
        "faults: {} ({}); node restarts {}; fault time {:.1} s",
        nemesis.injected.values().sum::<u64>(),
        if faults.is_empty() {
            "none".to_string()
        } else {
            faults.join(", ")
        },
        nodes.restarts,
        windows.iter().map(|(a, b)| b - a).sum::<u64>() as f64 / 1e9
    );
    if let Some(n) = nemesis.injected.get(NemesisKind::Crash.name()) {
        let died: Vec<String> = nodes
            .crashes
            .iter()
            .map(|(p, n)| format!("{p} x{n}"))
            .collect();
        let _ = writeln!(
            s,
            "  crashes at fail points: {n} armed, {} reached ({})",
            nodes.crashes.values().sum::<u64>(),
            if died.is_empty() {
                "none".into()
            } else {
                died.join(", ")
            }
        );
    }
    if !nodes.exits.is_empty() {
        let mut by: BTreeMap<(u64, &str), u64> = BTreeMap::new();
        for e in &nodes.exits {
            *by.entry((e.node, e.how.as_str())).or_default() += 1;
        }
        let list: Vec<String> = by
            .iter()
            .map(|((n, how), k)| format!("n{n} {how} x{k}"))
            .collect();
        let _ = writeln!(
            s,
            "  nodes that stopped by themselves: {} ({})",
            nodes.exits.len(),
            list.join(", ")
        );
        let mut shown = std::collections::BTreeSet::new();
        for e in &nodes.exits {
            if shown.insert(e.how.as_str()) {
                let _ = writeln!(s, "    last words of n{} ({}): {}", e.node, e.how, e.last);
            }
        }
    }
    for e in &nemesis.errors {
        let _ = writeln!(s, "  nemesis error: {e}");
    }
    for (label, during) in [("outside faults", false), ("during faults", true)] {
        let mine: Vec<&crate::history::Completed> = ops
            .iter()
            .filter(|c| in_fault(c.invoke_ns) == during)
            .collect();
        let mut lat: Vec<u64> = mine
            .iter()
            .filter(|c| c.kind == EventType::Ok)
            .filter_map(|c| c.complete_ns.map(|d| d - c.invoke_ns))
            .collect();
        lat.sort_unstable();
        let ok = lat.len();
        let _ = writeln!(
            s,
            "{label:<15}: {} ops, {:.1}% ok, latency of ok ops p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            mine.len(),
            if mine.is_empty() {
                100.0
            } else {
                100.0 * ok as f64 / mine.len() as f64
            },
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            percentile(&lat, 1.0)
        );
    }
    if cfg.lenient {
        let _ = writeln!(
            s,
            "note: checked leniently: answers the client may have guessed after a lost reply \
             count as unknown (finding F1)"
        );
    }
    let _ = writeln!(s, "checked: {}", verdict.checked);
    for a in &verdict.anomalies {
        let _ = writeln!(s, "ANOMALY: {a}");
    }
    if let Some(k) = kept {
        let _ = writeln!(s, "history and logs kept in {}", k.display());
    }
    let _ = write!(
        s,
        "verdict: {}",
        if verdict.valid { "VALID" } else { "INVALID" }
    );
    s
}
