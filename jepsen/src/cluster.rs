//! A cluster of real `talon-meta` processes: written by `talon-meta init`, one process per
//! node, each on its own loopback address (`127.0.0.11`, `.12`, ...) and port 7000 inside
//! the harness's private network namespace, so runs never collide on ports.
//!
//! Each node runs with its own group id (`NODE_GID_BASE + id`): the network nemesis tells a
//! node's packets apart by the sending socket's group, because every loopback connection
//! leaves from 127.0.0.1 whatever node opened it.
//!
//! Each node follows a fail-point file of its own (`conf/nodeN.failpoints`, named to it by
//! `$TALON_FAIL_POINTS`): a `talon-meta` built with the `failpoints` feature arms what the
//! file names, so the nemesis can crash a node at an exact step or slow its log fsyncs.
//!
//! The [`Cluster`] owns its processes. Dropping it sends SIGKILL to every node still
//! running (a stopped node dies of SIGKILL too) and reaps it, so a harness that fails or is
//! interrupted leaves no process behind. Nodes are started through `setpriv --pdeathsig
//! KILL` when util-linux's `setpriv` is there, so that even a harness killed with SIGKILL
//! (whose destructors never run) takes its nodes with it.

use crate::disk::{DiskError, Disks};
use crate::net::NetNs;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The first node's group id minus one; node `id` runs with group `NODE_GID_BASE + id`.
pub const NODE_GID_BASE: u32 = 47_000;

/// The port every node listens on (each node has its own address).
pub const NODE_PORT: u16 = 7000;

/// The variable through which `talon-meta start` learns its fail-point file.
const FAIL_POINTS_ENV: &str = "TALON_FAIL_POINTS";

/// Errors controlling the cluster's processes.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A command or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// `talon-meta init` failed.
    #[error("talon-meta init failed: {0}")]
    Init(String),
    /// A signal could not be sent.
    #[error("signal {signal} to node {node}: {source}")]
    Signal {
        /// The node.
        node: u64,
        /// The signal.
        signal: Signal,
        /// The cause.
        source: nix::Error,
    },
    /// No such node.
    #[error("no node {0}")]
    NoNode(u64),
    /// A data directory's file system.
    #[error(transparent)]
    Disk(#[from] DiskError),
    /// A disk fault was asked for without mounted data directories.
    #[error("disk faults need the data directories on their own file systems")]
    NoDisks,
    /// Fail-point faults were asked for and the binary has none.
    #[error(
        "the crash, slow-disk and clock-jump faults need a talon-meta built with fail points \
         (cargo build -p talon-meta --features failpoints): {0}"
    )]
    NoFailPoints(String),
    /// A node config could not be read or rewritten.
    #[error("node config {0}")]
    Config(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Io { what, source }
}

/// How to build a cluster.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// The `talon-meta` binary.
    pub meta_bin: PathBuf,
    /// Directory for configs, data and logs.
    pub dir: PathBuf,
    /// Number of nodes.
    pub nodes: u64,
    /// Replicas per partition.
    pub replication: u32,
    /// Number of partitions.
    pub partitions: u32,
    /// The nodes' log filter (`RUST_LOG` syntax); a run's default is
    /// [`crate::run::DEFAULT_NODE_LOG`].
    pub node_log: String,
}

/// State of one node's process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// Running.
    Up,
    /// Stopped by SIGSTOP.
    Paused,
    /// Killed (or never started).
    Down,
}

struct Node {
    id: u64,
    ip: Ipv4Addr,
    config: PathBuf,
    log: PathBuf,
    fail_points: PathBuf,
    child: Option<Child>,
    paused: bool,
}

/// The running cluster.
pub struct Cluster {
    spec: ClusterSpec,
    nodes: Vec<Node>,
    starts: u64,
    /// Dropped after the nodes are killed (see `Drop`), which unmounts them.
    disks: Option<Disks>,
    /// Filled disks, by node: whether healing restarts the node too.
    filled: BTreeMap<u64, bool>,
    exits: Vec<Exit>,
}

/// A node process that ended by itself: how, and the last lines of its log.
#[derive(Clone, Debug)]
pub struct Exit {
    /// The node.
    pub node: u64,
    /// `exit N` or `signal N`.
    pub how: String,
    /// The last lines of its log then.
    pub last: String,
}

/// The loopback address of node `id`.
pub fn node_ip(id: u64) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 10 + id as u8)
}

impl Cluster {
    /// Writes the nodes' configs with `talon-meta init`; starts nothing.
    pub fn init(spec: ClusterSpec) -> Result<Cluster, ClusterError> {
        let conf = spec.dir.join("conf");
        let logs = spec.dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(io("create the log directory"))?;
        let ids: Vec<u64> = (1..=spec.nodes).collect();
        let list: Vec<String> = ids
            .iter()
            .map(|id| format!("{id}={}:{NODE_PORT}", node_ip(*id)))
            .collect();
        let out = Command::new(&spec.meta_bin)
            .arg("init")
            .arg("--nodes")
            .arg(list.join(","))
            .arg("--partitions")
            .arg(spec.partitions.to_string())
            .arg("--replication")
            .arg(spec.replication.to_string())
            .arg("--data-root")
            .arg(spec.dir.join("data"))
            .arg("--out")
            .arg(&conf)
            .output()
            .map_err(io(format!("run {} init", spec.meta_bin.display())))?;
        if !out.status.success() {
            return Err(ClusterError::Init(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        let nodes = ids
            .iter()
            .map(|&id| Node {
                id,
                ip: node_ip(id),
                config: conf.join(format!("node{id}.toml")),
                log: logs.join(format!("node{id}.log")),
                fail_points: conf.join(format!("node{id}.failpoints")),
                child: None,
                paused: false,
            })
            .collect();
        Ok(Cluster {
            spec,
            nodes,
            starts: 0,
            disks: None,
            filled: BTreeMap::new(),
            exits: Vec::new(),
        })
    }

    /// The node ids.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// The client addresses (`host:port`) of every node.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("{}:{NODE_PORT}", n.ip))
            .collect()
    }

    /// The spec the cluster was built from.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The data directory of node `id`.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.spec.dir.join("data").join(format!("node{id}"))
    }

    /// Puts every node's data directory on a tmpfs of `size_mib` MiB (before any start).
    pub fn mount_disks(&mut self, ns: &NetNs, size_mib: u64) -> Result<(), ClusterError> {
        let dirs: Vec<PathBuf> = self.ids().into_iter().map(|id| self.data_dir(id)).collect();
        self.disks = Some(Disks::mount(ns, &dirs, size_mib)?);
        Ok(())
    }

    /// Fills node `id`'s data file system; returns the bytes taken. Healing frees it, and
    /// with `restart` also restarts the node, as an operator may; without, the node comes
    /// back by itself.
    pub fn fill_disk(&mut self, id: u64, restart: bool) -> Result<u64, ClusterError> {
        if self.disks.is_none() {
            return Err(ClusterError::NoDisks);
        }
        self.node(id)?;
        let n = Disks::fill(&self.data_dir(id))?;
        let again = self.filled.entry(id).or_insert(restart);
        *again |= restart;
        Ok(n)
    }

    /// The fail points the `talon-meta` binary can arm (`talon-meta fail-points`).
    pub fn fail_points(&self) -> Result<Vec<String>, ClusterError> {
        let out = Command::new(&self.spec.meta_bin)
            .arg("fail-points")
            .output()
            .map_err(io(format!(
                "run {} fail-points",
                self.spec.meta_bin.display()
            )))?;
        if !out.status.success() {
            return Err(ClusterError::NoFailPoints(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        let points: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split('\t').next())
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        if points.is_empty() {
            return Err(ClusterError::NoFailPoints("it lists none".into()));
        }
        Ok(points)
    }

    /// Arms node `id`'s fail points to exactly `lines` (`name=actions` each, the `fail`
    /// crate's syntax); the node applies the change within 50 ms. Empty disarms all.
    pub fn arm(&mut self, id: u64, lines: &[String]) -> Result<(), ClusterError> {
        let path = self.node(id)?.fail_points.clone();
        let tmp = path.with_extension("failpoints.new");
        let mut text = lines.join("\n");
        text.push('\n');
        std::fs::write(&tmp, text).map_err(io(format!("write {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(io(format!("replace {}", path.display())))
    }

    /// Makes every node snapshot its partitions after `entries` log entries and keep a tenth
    /// of that behind each snapshot (before any start), so that a node that was down a few
    /// seconds catches up by installing a snapshot rather than by replaying the log.
    pub fn snapshot_every(&mut self, entries: u64) -> Result<(), ClusterError> {
        let n = entries.max(1);
        self.set_config("raft", "snapshot_after_entries", n)?;
        self.set_config("raft", "keep_entries_after_snapshot", (n / 10).max(1))
    }

    /// Sets every node's relaxed staleness bound (before any start). Clients read a
    /// partition from its leader for twice the bound after they change it (their session
    /// window) and from any replica after that, so a bound shorter than half a leader
    /// election sends a client's reads of its own changes to followers right after one.
    pub fn relaxed_staleness(&mut self, ms: u64) -> Result<(), ClusterError> {
        self.set_config("cluster", "relaxed_staleness_ms", ms.max(1))
    }

    /// Sets every node's unlinked grace (before any start): how long a file whose last name
    /// went, and chunks a commit took out of a file's layout, are kept before they are
    /// reclaimed (half of it on a nearly full disk). Clients hold a file they keep open from
    /// a quarter of it on.
    pub fn unlinked_grace(&mut self, ms: u64) -> Result<(), ClusterError> {
        self.set_config("cluster", "unlinked_grace_ms", ms.max(1))
    }

    /// Sets `key` of table `[section]` to `value` in every node's configuration file.
    fn set_config(&mut self, section: &str, key: &str, value: u64) -> Result<(), ClusterError> {
        let value = i64::try_from(value)
            .map_err(|_| ClusterError::Config(format!("{section}.{key} = {value} is too large")))?;
        for n in &self.nodes {
            let bad = |e: &dyn std::fmt::Display| {
                ClusterError::Config(format!("{}: {e}", n.config.display()))
            };
            let text = std::fs::read_to_string(&n.config).map_err(|e| bad(&e))?;
            let mut doc: toml::Table = text.parse().map_err(|e| bad(&e))?;
            let table = doc
                .entry(section)
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let Some(table) = table.as_table_mut() else {
                return Err(bad(&format!("[{section}] is not a table")));
            };
            table.insert(key.into(), toml::Value::Integer(value));
            let text = toml::to_string_pretty(&doc).map_err(|e| bad(&e))?;
            std::fs::write(&n.config, text).map_err(|e| bad(&e))?;
        }
        Ok(())
    }

    /// How many times a node process was started.
    pub fn starts(&self) -> u64 {
        self.starts
    }

    fn node(&mut self, id: u64) -> Result<&mut Node, ClusterError> {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .ok_or(ClusterError::NoNode(id))
    }

    /// The state of node `id` (a process that exited by itself counts as down).
    pub fn state(&mut self, id: u64) -> NodeState {
        let Ok(n) = self.node(id) else {
            return NodeState::Down;
        };
        let exited = match n.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) if n.paused => return NodeState::Paused,
            Some(Ok(None)) => return NodeState::Up,
            Some(Ok(Some(status))) => {
                n.child = None;
                status
            }
            _ => return NodeState::Down,
        };
        use std::os::unix::process::ExitStatusExt;
        let how = match exited.signal() {
            Some(s) => format!("signal {s}"),
            None => format!("exit {}", exited.code().unwrap_or(-1)),
        };
        // The error it ended with, if its log says (a backtrace may follow it); else its
        // last lines.
        let text = tail(&n.log, 80);
        let last = match text.lines().rev().find(|l| l.starts_with("Error: ")) {
            Some(l) => l.to_string(),
            None => tail(&n.log, 3).replace('\n', " | "),
        };
        self.exits.push(Exit {
            node: id,
            how,
            last,
        });
        NodeState::Down
    }

    /// The nodes that stopped by themselves (not killed by the harness), in order.
    pub fn exits(&self) -> &[Exit] {
        &self.exits
    }

    /// Starts every node that is not running.
    pub fn start_all(&mut self) -> Result<(), ClusterError> {
        for id in self.ids() {
            if self.state(id) == NodeState::Down {
                self.start(id)?;
            }
        }
        Ok(())
    }

    /// Starts node `id` (after reaping a dead process of it), appending to its log.
    pub fn start(&mut self, id: u64) -> Result<(), ClusterError> {
        let bin = self.spec.meta_bin.clone();
        let filter = self.spec.node_log.clone();
        let n = self.node(id)?;
        if let Some(mut c) = n.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&n.log)
            .map_err(io(format!("open {}", n.log.display())))?;
        let log2 = log.try_clone().map_err(io("clone the log handle"))?;
        let mut cmd = if setpriv_available() {
            let mut c = Command::new("setpriv");
            c.args(["--pdeathsig", "KILL", "--"]).arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        let child = cmd
            .arg("start")
            .arg("--config")
            .arg(&n.config)
            .env("RUST_LOG", filter)
            .env(FAIL_POINTS_ENV, &n.fail_points)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .gid(NODE_GID_BASE + id as u32)
            .spawn()
            .map_err(io(format!("start node {id}")))?;
        n.child = Some(child);
        n.paused = false;
        self.starts += 1;
        Ok(())
    }

    fn signal(&mut self, id: u64, signal: Signal) -> Result<(), ClusterError> {
        let n = self.node(id)?;
        let Some(c) = n.child.as_ref() else {
            return Ok(());
        };
        kill(Pid::from_raw(c.id() as i32), signal).map_err(|source| ClusterError::Signal {
            node: id,
            signal,
            source,
        })
    }

    /// Kills node `id` with SIGKILL and reaps it.
    pub fn kill(&mut self, id: u64) -> Result<(), ClusterError> {
        let n = self.node(id)?;
        if let Some(mut c) = n.child.take() {
            // SIGKILL also ends a stopped process.
            let _ = c.kill();
            c.wait().map_err(io(format!("reap node {id}")))?;
        }
        n.paused = false;
        Ok(())
    }

    /// Stops node `id` with SIGSTOP.
    pub fn pause(&mut self, id: u64) -> Result<(), ClusterError> {
        self.signal(id, Signal::SIGSTOP)?;
        self.node(id)?.paused = true;
        Ok(())
    }

    /// Continues node `id` with SIGCONT.
    pub fn resume(&mut self, id: u64) -> Result<(), ClusterError> {
        self.signal(id, Signal::SIGCONT)?;
        self.node(id)?.paused = false;
        Ok(())
    }

    /// Frees every filled disk (restarting its node where the fault said so), continues
    /// every paused node and starts every dead one.
    pub fn heal(&mut self) -> Result<(), ClusterError> {
        for (id, restart) in std::mem::take(&mut self.filled) {
            Disks::drain(&self.data_dir(id))?;
            if restart {
                self.kill(id)?;
            }
        }
        for id in self.ids() {
            match self.state(id) {
                NodeState::Paused => self.resume(id)?,
                NodeState::Down => self.start(id)?,
                NodeState::Up => {}
            }
        }
        Ok(())
    }

    /// Kills every node and reaps it.
    pub fn stop_all(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// The crashes at fail points, by point, as the nodes' logs record them (a node says
    /// which point it dies at before it aborts).
    pub fn fail_point_crashes(&self) -> BTreeMap<String, u64> {
        let mut by = BTreeMap::new();
        for n in &self.nodes {
            let text = std::fs::read_to_string(&n.log).unwrap_or_default();
            for line in text.lines() {
                if let Some(rest) = line.strip_prefix("fail point ") {
                    if let Some((point, _)) = rest.split_once(": aborting") {
                        *by.entry(point.to_string()).or_default() += 1;
                    }
                }
            }
        }
        by
    }

    /// Every panic a node's log records, with the line after it (the message): a node
    /// that panics has lost a partition replica or its process, whatever the history says.
    pub fn panics(&self) -> Vec<String> {
        let mut out = Vec::new();
        for n in &self.nodes {
            let text = std::fs::read_to_string(&n.log).unwrap_or_default();
            let mut lines = text.lines();
            while let Some(line) = lines.next() {
                if line.contains("panicked at") {
                    let msg = lines.next().unwrap_or_default();
                    out.push(format!(
                        "node {} panicked: {} {}",
                        n.id,
                        line.trim(),
                        msg.trim()
                    ));
                }
            }
        }
        out
    }

    /// The last `lines` lines of node `id`'s log, for reports.
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let Some(n) = self.nodes.iter().find(|n| n.id == id) else {
            return String::new();
        };
        tail(&n.log, lines)
    }
}

/// Whether `setpriv` (util-linux) can be run.
fn setpriv_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        Command::new("setpriv")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    })
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}
