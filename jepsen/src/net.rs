//! The harness's private network namespace and the packet filter that cuts links in it.
//!
//! [`enter_private_netns`] moves the (still single-threaded) harness process into a new,
//! anonymous network namespace with its own loopback device (and a private mount
//! namespace), which every node and tool it starts inherits. The kernel removes the namespace, with every filter rule in it, when
//! the last process inside exits: nothing of it can outlive a run, even one killed with
//! SIGKILL, and the host's own network set-up is never touched.
//!
//! Links are cut with nftables rules in that namespace only. Every connection between nodes
//! leaves from 127.0.0.1, so a rule tells the sender by the group id of its socket (each
//! node runs with its own group, see `cluster`): "packets that node A's sockets send to
//! node B's address are dropped", and the same the other way. The harness's clients run
//! with group 0 and are never cut off.
//!
//! Links are slowed the same way, with a rule that files the packets under a traffic class
//! instead of dropping them: the namespace's loopback device has an HTB queue whose one
//! class sends at a trickle, so a slowed link stays up and delivers everything, in order,
//! seconds late once its queue fills. Packets no rule files go straight through.
//!
//! A [`Firewall`] can only be made from the [`NetNs`] token that entering the namespace
//! returns, so no code path runs `nft` in the host's namespace.

use crate::cluster::{node_ip, NODE_GID_BASE};
use std::io::Write;
use std::process::{Command, Stdio};

/// Name of the nftables table the harness owns inside its namespace.
const TABLE: &str = "talon_jepsen";

/// The HTB class of slowed links, as `tc` and nftables' `meta priority` name it.
const SLOW_CLASS: &str = "1:10";

/// The slow class's rate while no link is slowed: its queue, if any, drains at once.
const FAST_RATE: &str = "10gbit";

/// Errors setting up the namespace or the filter.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// `unshare(CLONE_NEWNET | CLONE_NEWNS)` or making the mounts private failed (the
    /// harness needs CAP_SYS_ADMIN: run it as root).
    #[error("create network and mount namespaces: {0} (the harness must run as root)")]
    Unshare(nix::Error),
    /// A namespace check failed.
    #[error("{0}")]
    NotPrivate(String),
    /// A link was to be slowed by a firewall made without the loopback queue for it.
    #[error("this run's firewall has no queue for slowed links")]
    NoShaper,
    /// A command failed.
    #[error("{cmd}: {detail}")]
    Command {
        /// The command.
        cmd: String,
        /// Its error output or the spawn error.
        detail: String,
    },
}

/// Proof that this process runs in a network namespace of its own.
#[derive(Debug)]
pub struct NetNs {
    inode: String,
}

impl NetNs {
    /// The namespace's identity (`net:[inode]`).
    pub fn id(&self) -> &str {
        &self.inode
    }
}

/// The calling thread's network namespace (a namespace is per thread; `/proc/self` would
/// name the main thread's).
fn netns_id() -> Result<String, NetError> {
    std::fs::read_link("/proc/thread-self/ns/net")
        .map(|p| p.display().to_string())
        .map_err(|e| NetError::NotPrivate(format!("read /proc/thread-self/ns/net: {e}")))
}

fn run(cmd: &str, args: &[&str], stdin: Option<&str>) -> Result<(), NetError> {
    let err = |detail: String| NetError::Command {
        cmd: format!("{cmd} {}", args.join(" ")),
        detail,
    };
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| err(e.to_string()))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|e| err(e.to_string()))?;
    }
    let out = child.wait_with_output().map_err(|e| err(e.to_string()))?;
    if !out.status.success() {
        return Err(err(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    Ok(())
}

/// Moves this process into a new network namespace and brings its loopback device up, and
/// into a new mount namespace whose mounts do not propagate to the host's (for the small
/// data file systems of the disk fault, see `disk`). Must be called before any thread is
/// started: a namespace is per thread, and only threads started afterwards inherit it.
pub fn enter_private_netns() -> Result<NetNs, NetError> {
    let before = netns_id()?;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET | nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(NetError::Unshare)?;
    // A new mount namespace starts as a copy that may still share propagation with the
    // host's: make every mount private before mounting anything.
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(NetError::Unshare)?;
    let after = netns_id()?;
    if after == before {
        return Err(NetError::NotPrivate(format!(
            "still in network namespace {before} after unshare"
        )));
    }
    run("ip", &["link", "set", "lo", "up"], None)?;
    Ok(NetNs { inode: after })
}

/// The nftables table of the harness's namespace, and the loopback queue that slows links.
#[derive(Debug)]
pub struct Firewall {
    ns: String,
    /// Whether the loopback device has the queue of slowed links.
    shaper: bool,
}

impl Firewall {
    /// Creates the (empty) table in the namespace `ns` proves this process is in and, with
    /// `shaper`, the loopback device's queue for slowed links (the kernel's `sch_htb`).
    pub fn new(ns: &NetNs, shaper: bool) -> Result<Firewall, NetError> {
        let fw = Firewall {
            ns: ns.inode.clone(),
            shaper,
        };
        fw.check_ns()?;
        if shaper {
            // Unfiled packets (`default 0`) bypass the classes.
            run(
                "tc",
                &[
                    "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "0",
                ],
                None,
            )?;
            fw.slow_class("add", FAST_RATE)?;
        }
        fw.apply(&[])?;
        Ok(fw)
    }

    fn check_ns(&self) -> Result<(), NetError> {
        let now = netns_id()?;
        if now != self.ns {
            return Err(NetError::NotPrivate(format!(
                "refusing to change packet filters: in namespace {now}, not {}",
                self.ns
            )));
        }
        Ok(())
    }

    /// Replaces the rules so that exactly the links in `cut` (pairs of node ids) drop
    /// packets, in both directions. An empty list heals every link, slowed ones included.
    pub fn apply(&self, cut: &[(u64, u64)]) -> Result<(), NetError> {
        self.rules(cut, "drop")?;
        if self.shaper {
            self.slow_class("change", FAST_RATE)?;
        }
        Ok(())
    }

    /// Replaces the rules so that exactly the links in `slow` (pairs of node ids) carry
    /// `kbit` kilobits a second, shared by every connection on them, in both directions.
    pub fn slow(&self, slow: &[(u64, u64)], kbit: u32) -> Result<(), NetError> {
        if !self.shaper {
            return Err(NetError::NoShaper);
        }
        self.slow_class("change", &format!("{kbit}kbit"))?;
        self.rules(slow, &format!("meta priority set {SLOW_CLASS}"))
    }

    /// Adds (`verb` "add") or changes ("change") the slow class, sending at `rate`.
    fn slow_class(&self, verb: &str, rate: &str) -> Result<(), NetError> {
        self.check_ns()?;
        run(
            "tc",
            &[
                "class", verb, "dev", "lo", "parent", "1:", "classid", SLOW_CLASS, "htb", "rate",
                rate,
            ],
            None,
        )
    }

    /// Replaces the table with one rule per direction of each link in `links`, ending in
    /// `verdict`.
    fn rules(&self, links: &[(u64, u64)], verdict: &str) -> Result<(), NetError> {
        self.check_ns()?;
        let mut script = format!(
            "table inet {TABLE} {{}}\ndelete table inet {TABLE}\n\
             table inet {TABLE} {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n"
        );
        for &(a, b) in links {
            for (from, to) in [(a, b), (b, a)] {
                script.push_str(&format!(
                    "    meta skgid {} ip daddr {} {verdict}\n",
                    NODE_GID_BASE + from as u32,
                    node_ip(to)
                ));
            }
        }
        script.push_str("  }\n}\n");
        run("nft", &["-f", "-"], Some(&script))
    }
}
