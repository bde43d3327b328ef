//! The nemesis: faults injected on a schedule drawn from the run's seed.
//!
//! Faults are SIGKILL (the node is restarted when the fault heals), SIGSTOP (continued with
//! SIGCONT), network partitions cut with the namespace's packet filter (one node isolated,
//! a majority/minority split, and a bridge: two halves that only a middle node reaches),
//! a full data disk (freed when the fault heals, and every other time, seeded, the node
//! restarted as an operator may; otherwise it comes back by itself), and two kinds
//! that need a `talon-meta` built with fail points: a crash at an exact step (a fail point
//! armed to abort the node the first time it passes there: between 2PC prepare and
//! decision, between decision and telling participants, while a participant applies the
//! commit, in the middle of a snapshot install, or after a log append before its fsync),
//! a slow disk (every log fsync of a node held 50-300 ms), and a clock jump (the node's wall
//! clock, as Talon reads it, moved 5 s to a day forward or back until the fault heals; the
//! host's clock is never touched). A slow link trickles a node's traffic to and from every
//! other node (16-256 kbit/s, through the namespace's loopback queue): its messages arrive
//! in order but seconds late, while no connection breaks. The `*-leader` kinds, the crash,
//! the slow disk, the clock jump and the slow link aim at the node leading one of the
//! workload's partitions, as the nodes report it; a crash in a snapshot install aims at a
//! random node, killed at once so that it comes back behind the others and is sent a
//! snapshot when the fault heals.
//!
//! A schedule alternates a quiet interval with one fault held for a while, then heals
//! everything: the firewall is cleared, stopped nodes continue and killed nodes restart.
//! With [`ScheduleMode::Each`] every kind runs in turn (what CI uses, so each kind is
//! certainly exercised); with [`ScheduleMode::Random`] kinds are drawn at random and a
//! third of the faults combine two kinds at once. The seed fixes every choice the nemesis
//! makes, so printing it is enough to replay the schedule (timing still varies).

use crate::cluster::Cluster;
use crate::history::{Call, EventType, Recorder, NEMESIS};
use crate::net::Firewall;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use talon_client::Client;

/// The fail point that shifts a node's wall clock (`talon_meta::clock::JUMP_POINT`).
pub const CLOCK_POINT: &str = "wall-clock";

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum NemesisKind {
    /// SIGKILL a random node; restart it when the fault heals.
    Kill,
    /// SIGKILL the leader of one of the workload's partitions.
    KillLeader,
    /// SIGSTOP a random node; SIGCONT when the fault heals.
    Pause,
    /// SIGSTOP the leader of one of the workload's partitions.
    PauseLeader,
    /// Cut one random node off from every other node.
    Isolate,
    /// Cut the leader of one of the workload's partitions off.
    IsolateLeader,
    /// Split the nodes into a minority and a majority.
    Split,
    /// Two halves that only one middle node reaches.
    Bridge,
    /// Fill a random node's data file system; free it on heal, and half the time (seeded)
    /// restart the node too.
    DiskFull,
    /// Crash a node exactly at a fail point drawn from those the binary has.
    Crash,
    /// Hold every Raft log fsync of a partition leader's node for 50-300 ms.
    SlowDisk,
    /// Move a partition leader's wall clock 5 s to a day forward or back.
    ClockJump,
    /// Slow a partition leader's links to every other node to 16-256 kbit/s each way.
    SlowLink,
}

impl NemesisKind {
    /// Every kind.
    pub const ALL: [NemesisKind; 13] = [
        NemesisKind::Kill,
        NemesisKind::KillLeader,
        NemesisKind::Pause,
        NemesisKind::PauseLeader,
        NemesisKind::Isolate,
        NemesisKind::IsolateLeader,
        NemesisKind::Split,
        NemesisKind::Bridge,
        NemesisKind::DiskFull,
        NemesisKind::Crash,
        NemesisKind::SlowDisk,
        NemesisKind::ClockJump,
        NemesisKind::SlowLink,
    ];

    /// Whether the kind cuts or slows links (and so needs the firewall).
    pub fn is_network(self) -> bool {
        matches!(
            self,
            NemesisKind::Isolate
                | NemesisKind::IsolateLeader
                | NemesisKind::Split
                | NemesisKind::Bridge
                | NemesisKind::SlowLink
        )
    }

    /// Whether the kind arms fail points (and so needs a binary built with them).
    pub fn needs_fail_points(self) -> bool {
        matches!(
            self,
            NemesisKind::Crash | NemesisKind::SlowDisk | NemesisKind::ClockJump
        )
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            NemesisKind::Kill => "kill",
            NemesisKind::KillLeader => "kill-leader",
            NemesisKind::Pause => "pause",
            NemesisKind::PauseLeader => "pause-leader",
            NemesisKind::Isolate => "isolate",
            NemesisKind::IsolateLeader => "isolate-leader",
            NemesisKind::Split => "split",
            NemesisKind::Bridge => "bridge",
            NemesisKind::DiskFull => "disk-full",
            NemesisKind::Crash => "crash",
            NemesisKind::SlowDisk => "slow-disk",
            NemesisKind::ClockJump => "clock-jump",
            NemesisKind::SlowLink => "slow-link",
        }
    }
}

/// How kinds are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ScheduleMode {
    /// Every kind in turn, one at a time.
    Each,
    /// Random kinds, sometimes two at once.
    Random,
}

/// Timing of a schedule.
#[derive(Clone, Debug)]
pub struct Timing {
    /// Quiet time between faults.
    pub quiet: Duration,
    /// Shortest time a fault is held.
    pub hold_min: Duration,
    /// Longest time a fault is held.
    pub hold_max: Duration,
}

/// The nemesis of one run.
pub struct Nemesis {
    kinds: Vec<NemesisKind>,
    mode: ScheduleMode,
    timing: Timing,
    rng: StdRng,
    cluster: Arc<Mutex<Cluster>>,
    firewall: Option<Firewall>,
    client: Client,
    rec: Recorder,
    partitions: Vec<u32>,
    /// The fail points the binary has (empty without fail-point kinds).
    points: Vec<String>,
    /// Fail points this fault armed, by node; disarmed when it heals.
    armed: BTreeMap<u64, Vec<String>>,
    /// Crashes in a snapshot install, by node: they stay armed through the restart that
    /// heals the fault, and are disarmed when the next fault starts.
    armed_through_restart: BTreeMap<u64, Vec<String>>,
    /// Which fail point the next crash arms (an index into `points`).
    crash_turn: usize,
    /// Faults injected, by kind.
    pub injected: BTreeMap<&'static str, u64>,

    /// Errors while injecting or healing (reported, not fatal).
    pub errors: Vec<String>,
}

fn lock(c: &Mutex<Cluster>) -> std::sync::MutexGuard<'_, Cluster> {
    match c.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Nemesis {
    /// A nemesis over `cluster` choosing among `kinds`; `partitions` are the workload's.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kinds: Vec<NemesisKind>,
        mode: ScheduleMode,
        timing: Timing,
        seed: u64,
        cluster: Arc<Mutex<Cluster>>,
        firewall: Option<Firewall>,
        client: Client,
        rec: Recorder,
        partitions: Vec<u32>,
        points: Vec<String>,
    ) -> Nemesis {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x006e_656d_6573_6973);
        Nemesis {
            crash_turn: rng.random_range(0..points.len().max(1)),
            kinds,
            mode,
            timing,
            // A stream of its own, apart from the workers'.
            rng,
            cluster,
            firewall,
            client,
            rec,
            partitions,
            points,
            armed: BTreeMap::new(),
            armed_through_restart: BTreeMap::new(),
            injected: BTreeMap::new(),
            errors: Vec::new(),
        }
    }

    /// Runs faults until `stop` turns true, then heals everything.
    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) -> Nemesis {
        let mut turn = 0usize;
        // Bounded by `stop`, which the run sets at its deadline.
        while !*stop.borrow() && !self.kinds.is_empty() {
            tokio::select! {
                _ = tokio::time::sleep(self.timing.quiet) => {}
                _ = stop.changed() => break,
            }
            self.disarm_after_restart();
            let mut now: Vec<NemesisKind> = match self.mode {
                ScheduleMode::Each => vec![self.kinds[turn % self.kinds.len()]],
                ScheduleMode::Random => {
                    let mut v = vec![*self
                        .kinds
                        .choose(&mut self.rng)
                        .unwrap_or(&NemesisKind::Kill)];
                    if self.kinds.len() > 1 && self.rng.random_bool(1.0 / 3.0) {
                        let other = *self.kinds.choose(&mut self.rng).unwrap_or(&v[0]);
                        if other != v[0] {
                            v.push(other);
                        }
                    }
                    v
                }
            };
            turn += 1;
            // At most one network fault at a time: the firewall holds one set of cuts.
            let mut seen_net = false;
            now.retain(|k| !(k.is_network() && std::mem::replace(&mut seen_net, true)));
            let hold = self.rng.random_range(
                self.timing.hold_min..=self.timing.hold_max.max(self.timing.hold_min),
            );
            let mut names = Vec::new();
            for k in now {
                match self.inject(k).await {
                    Ok(name) => {
                        *self.injected.entry(k.name()).or_default() += 1;
                        self.rec.record(
                            NEMESIS,
                            EventType::Invoke,
                            Call::Fault { name: name.clone() },
                            None,
                        );
                        names.push(name);
                    }
                    Err(e) => self.errors.push(format!("{}: {e}", k.name())),
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(hold) => {}
                _ = stop.changed() => {}
            }
            self.heal();
            for name in names {
                self.rec
                    .record(NEMESIS, EventType::Ok, Call::Fault { name }, None);
            }
        }
        self.disarm_after_restart();
        self.heal();
        self
    }

    /// Disarms the nodes armed through a restart.
    fn disarm_after_restart(&mut self) {
        let nodes = std::mem::take(&mut self.armed_through_restart);
        for id in nodes.into_keys() {
            self.write_arms(id);
        }
    }

    /// Arms `line` on node `id` beside what it already has: two faults at once may both
    /// arm the same node. With `through_restart`, it stays until the next fault starts.
    fn arm(&mut self, id: u64, line: String, through_restart: bool) -> Result<(), String> {
        let held = match through_restart {
            true => &mut self.armed_through_restart,
            false => &mut self.armed,
        };
        held.entry(id).or_default().push(line);
        let lines = self.arms_of(id);
        lock(&self.cluster)
            .arm(id, &lines)
            .map_err(|e| format!("arm n{id}: {e}"))
    }

    /// Every line armed on node `id`, by either kind of hold.
    fn arms_of(&self, id: u64) -> Vec<String> {
        let of = |m: &BTreeMap<u64, Vec<String>>| m.get(&id).cloned().unwrap_or_default();
        let mut lines = of(&self.armed);
        lines.extend(of(&self.armed_through_restart));
        lines
    }

    /// Writes node `id`'s fail-point file to what is still armed on it.
    fn write_arms(&mut self, id: u64) {
        let lines = self.arms_of(id);
        if let Err(e) = lock(&self.cluster).arm(id, &lines) {
            self.errors.push(format!("disarm n{id}: {e}"));
        }
    }

    /// Disarms fail points, clears the firewall, continues stopped nodes and restarts
    /// killed ones (a crash at a fail point included).
    pub fn heal(&mut self) {
        if let Some(fw) = &self.firewall {
            if let Err(e) = fw.apply(&[]) {
                self.errors.push(format!("heal the network: {e}"));
            }
        }
        let nodes = std::mem::take(&mut self.armed);
        for id in nodes.into_keys() {
            self.write_arms(id);
        }
        if let Err(e) = lock(&self.cluster).heal() {
            self.errors.push(format!("heal the nodes: {e}"));
        }
    }

    /// The node leading one of the workload's partitions, as the nodes report it.
    async fn leader(&mut self) -> Option<u64> {
        let p = *self.partitions.choose(&mut self.rng)?;
        let status = tokio::time::timeout(Duration::from_secs(3), self.client.status())
            .await
            .ok()?;
        status.iter().find_map(|n| {
            let parts = n.partitions.as_ref().ok()?;
            parts
                .iter()
                .any(|s| s.id == p && s.role == "LEADER")
                .then_some(n.node_id)
        })
    }

    async fn inject(&mut self, kind: NemesisKind) -> Result<String, String> {
        let mut ids = lock(&self.cluster).ids();
        ids.sort_unstable();
        let random = *ids.choose(&mut self.rng).ok_or("no nodes")?;
        let target = match kind {
            NemesisKind::KillLeader
            | NemesisKind::PauseLeader
            | NemesisKind::IsolateLeader
            | NemesisKind::Crash
            | NemesisKind::SlowDisk
            | NemesisKind::ClockJump
            | NemesisKind::SlowLink => self.leader().await.unwrap_or(random),
            _ => random,
        };
        let err = |e: &dyn std::fmt::Display| e.to_string();
        match kind {
            NemesisKind::Kill | NemesisKind::KillLeader => {
                lock(&self.cluster).kill(target).map_err(|e| err(&e))?;
                Ok(format!("{} n{target}", kind.name()))
            }
            NemesisKind::Pause | NemesisKind::PauseLeader => {
                lock(&self.cluster).pause(target).map_err(|e| err(&e))?;
                Ok(format!("{} n{target}", kind.name()))
            }
            NemesisKind::Isolate | NemesisKind::IsolateLeader => {
                self.cut(&links_of(target, &ids))?;
                Ok(format!("{} n{target}", kind.name()))
            }
            NemesisKind::Split => {
                ids.shuffle(&mut self.rng);
                let (minority, majority) = ids.split_at(ids.len() / 2);
                self.cut(&across(minority, majority))?;
                Ok(format!("split {minority:?} | {majority:?}"))
            }
            NemesisKind::DiskFull => {
                let restart = self.rng.random_bool(0.5);
                let bytes = lock(&self.cluster)
                    .fill_disk(target, restart)
                    .map_err(|e| err(&e))?;
                let heal = if restart {
                    "freed and restarted"
                } else {
                    "freed"
                };
                Ok(format!(
                    "disk-full n{target} ({} MiB taken; {heal} on heal)",
                    bytes >> 20
                ))
            }
            NemesisKind::Crash => {
                // In turn from a seeded start, so that a run of a few crashes meets each.
                if self.points.is_empty() {
                    return Err("no fail points to arm".into());
                }
                let point = self.points[self.crash_turn % self.points.len()].clone();
                self.crash_turn += 1;
                let arm = format!("{point}=1*return");
                if point.starts_with("snapshot-") {
                    // Down while the others go on (and snapshot, and purge their logs), it
                    // comes back behind them when the fault heals and is sent a snapshot.
                    lock(&self.cluster).kill(random).map_err(|e| err(&e))?;
                    self.arm(random, arm, true)?;
                    Ok(format!(
                        "crash n{random} at {point} (killed, armed for its restart)"
                    ))
                } else {
                    self.arm(target, arm, false)?;
                    Ok(format!("crash n{target} at {point}"))
                }
            }
            NemesisKind::SlowDisk => {
                let ms = self.rng.random_range(50..=300u32);
                self.arm(target, format!("log-fsync=sleep({ms})"), false)?;
                Ok(format!("slow-disk n{target} (every log fsync +{ms} ms)"))
            }
            NemesisKind::ClockJump => {
                // Past the thresholds the wall clock paces: stale transactions (3 s), an
                // unlinked file's grace (30 s), request records (5 min), chunk GC (10 min).
                let secs = *[5i64, 45, 400, 86_400].choose(&mut self.rng).unwrap_or(&5);
                let secs = if self.rng.random_bool(0.5) {
                    secs
                } else {
                    -secs
                };
                let arm = format!("{CLOCK_POINT}=return({})", secs * 1000);
                self.arm(target, arm, false)?;
                Ok(format!("clock-jump n{target} ({secs:+} s)"))
            }
            NemesisKind::SlowLink => {
                // At 16 kbit/s the node's heartbeats alone outrun the link, so its queue
                // grows for as long as the fault holds; at 256 a heartbeat gets through in
                // a few milliseconds and an append of a file's body in seconds.
                let kbit = *[16u32, 64, 256].choose(&mut self.rng).unwrap_or(&64);
                self.firewall()?
                    .slow(&links_of(target, &ids), kbit)
                    .map_err(|e| err(&e))?;
                Ok(format!("slow-link n{target} ({kbit} kbit/s each way)"))
            }
            NemesisKind::Bridge => {
                ids.shuffle(&mut self.rng);
                let half = ids.len() / 2;
                let (left, rest) = ids.split_at(half);
                let (middle, right) = rest.split_at(rest.len() - half);
                self.cut(&across(left, right))?;
                Ok(format!("bridge {left:?} | {middle:?} | {right:?}"))
            }
        }
    }

    fn cut(&self, pairs: &[(u64, u64)]) -> Result<(), String> {
        self.firewall()?.apply(pairs).map_err(|e| e.to_string())
    }

    /// The run's firewall, which network faults need.
    fn firewall(&self) -> Result<&Firewall, String> {
        self.firewall
            .as_ref()
            .ok_or_else(|| "network faults need the private network namespace".to_string())
    }
}

/// The links between `node` and every other node of `ids`.
fn links_of(node: u64, ids: &[u64]) -> Vec<(u64, u64)> {
    ids.iter()
        .filter(|&&o| o != node)
        .map(|&o| (node, o))
        .collect()
}

fn across(a: &[u64], b: &[u64]) -> Vec<(u64, u64)> {
    a.iter()
        .flat_map(|&x| b.iter().map(move |&y| (x, y)))
        .collect()
}
