//! `talon-bench mdtest`: IOR mdtest's metadata workload, flags, names and SUMMARY table.
//!
//! Each of `--tasks` OS threads plays one MPI rank of mdtest. The directory layout, item
//! names and phase order are mdtest's, so a run here reads beside a run of mdtest itself
//! on the same path:
//!
//! ```text
//! DIR/test-dir.I-0/                       per iteration I
//!     mdtest_tree.R.0/                    tree root (R = rank with -u; "mdtest_tree.0" without)
//!         file.mdtest.R.K, dir.mdtest.R.K items 0..items_per_dir of directory 0
//!         mdtest_tree.R.1/                directory d has parent (d - 1) / b, depth -z
//!             file.mdtest.R.K             items d*items_per_dir ..
//! ```
//!
//! Per iteration: Tree creation (-C), then the directory phases (Directory creation, stat,
//! rename, removal; unless -F), then the file phases (File creation, stat, read, removal;
//! unless -D), then Tree removal (-r). Without any of -C -T -E -r -U every phase runs, as
//! in mdtest. Each phase starts and ends with a barrier; its rate is the operations of all
//! tasks over the time between the barriers (mdtest reports the slowest rank's rate times
//! the task count, which is the same window). Tree creation and removal count the
//! directories of one tree, as mdtest does even when every task builds its own with -u.
//!
//! Items per task (-n) are spread evenly over the tree's directories and rounded down to a
//! multiple of their number (mdtest's rule); -I gives the items per directory instead.
//! Stride -N makes task R stat, read and remove the items of task R + k·N (k = 1, 2, 3),
//! mdtest's way to defeat a client's own cache. A failed operation is counted and named,
//! not fatal, as mdtest warns and goes on; the command exits non-zero at the end if any
//! failed.

use crate::stats::{Latency, LatencySummary, Spread};
use crate::target::{self, Fs, TargetSpec};
use crate::tasks::{self, TaskOutcome, Ticker};
use anyhow::{bail, Context};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Flags of `talon-bench mdtest`, spelled as IOR mdtest spells them.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct MdtestArgs {
    /// Items (files and/or directories) each task creates, stats, reads and removes.
    /// Sizes take k/m/g suffixes (powers of 1024), as in mdtest.
    #[arg(short = 'n', value_parser = parse_size, default_value = "0")]
    pub items: u64,
    /// Depth of the directory tree below each tree root.
    #[arg(short = 'z', default_value_t = 0)]
    pub depth: u32,
    /// Branching factor of the directory tree.
    #[arg(short = 'b', default_value_t = 1)]
    pub branch: u64,
    /// Items per directory of the tree (instead of -n).
    #[arg(short = 'I', value_parser = parse_size, default_value = "0")]
    pub items_per_dir: u64,
    /// A tree of its own for each task.
    #[arg(short = 'u')]
    pub unique_dir: bool,
    /// Files only (no directory phases).
    #[arg(short = 'F')]
    pub files_only: bool,
    /// Directories only (no file phases).
    #[arg(short = 'D')]
    pub dirs_only: bool,
    /// Bytes written to each file after it is created.
    #[arg(short = 'w', value_parser = parse_size, default_value = "0")]
    pub write_bytes: u64,
    /// Bytes read from each file in the read phase (0: open and close only).
    #[arg(short = 'e', value_parser = parse_size, default_value = "0")]
    pub read_bytes: u64,
    /// Iterations of the whole test.
    #[arg(short = 'i', default_value_t = 1)]
    pub iterations: u32,
    /// Create phases only.
    #[arg(short = 'C')]
    pub create: bool,
    /// Stat phases only.
    #[arg(short = 'T')]
    pub stat: bool,
    /// Read phase only.
    #[arg(short = 'E')]
    pub read: bool,
    /// Remove phases only.
    #[arg(short = 'r')]
    pub remove: bool,
    /// Directory rename phase.
    #[arg(short = 'U')]
    pub rename: bool,
    /// Stride between tasks for stat, read and remove (0: each task its own items).
    #[arg(short = 'N', default_value_t = 0)]
    pub stride: usize,
    /// Tasks (mdtest's MPI ranks): OS threads making the same calls concurrently.
    #[arg(long, default_value_t = 1)]
    pub tasks: usize,
    /// Files per call in the file create and stat phases, through the target's batch
    /// calls (talon: targets only, empty files: -w 0). An item's latency is then its
    /// call's. 1: one call per file, as mdtest makes them.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Directory the test runs in (inside the target when --target is given).
    #[arg(short = 'd', default_value = "./out")]
    pub dir: String,
    /// Where to run: posix:PATH (any mounted file system) or talon:HOST:PORT[,...] (the
    /// client library). Without it, -d is a local path.
    #[arg(long)]
    pub target: Option<TargetSpec>,
    /// Also write the report as JSON to this file ("-" for stdout instead of the table).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

impl Default for MdtestArgs {
    fn default() -> Self {
        MdtestArgs {
            items: 0,
            depth: 0,
            branch: 1,
            items_per_dir: 0,
            unique_dir: false,
            files_only: false,
            dirs_only: false,
            write_bytes: 0,
            read_bytes: 0,
            iterations: 1,
            create: false,
            stat: false,
            read: false,
            remove: false,
            rename: false,
            stride: 0,
            tasks: 1,
            batch: 1,
            dir: "./out".into(),
            target: None,
            json: None,
            quiet: false,
        }
    }
}

impl MdtestArgs {
    /// The command that reproduces this run, flags in mdtest's spelling.
    pub fn command_line(&self) -> String {
        let mut c = format!("talon-bench mdtest --tasks {}", self.tasks);
        let mut num = |flag: &str, v: u64, default: u64| {
            if v != default {
                c.push_str(&format!(" -{flag} {v}"));
            }
        };
        num("n", self.items, 0);
        num("z", self.depth as u64, 0);
        num("b", self.branch, 1);
        num("I", self.items_per_dir, 0);
        num("w", self.write_bytes, 0);
        num("e", self.read_bytes, 0);
        num("i", self.iterations as u64, 1);
        num("N", self.stride as u64, 0);
        if self.batch != 1 {
            c.push_str(&format!(" --batch {}", self.batch));
        }
        for (on, flag) in [
            (self.unique_dir, "u"),
            (self.files_only, "F"),
            (self.dirs_only, "D"),
            (self.create, "C"),
            (self.stat, "T"),
            (self.read, "E"),
            (self.remove, "r"),
            (self.rename, "U"),
        ] {
            if on {
                c.push_str(&format!(" -{flag}"));
            }
        }
        c.push_str(&format!(" -d {}", shell_word(&self.dir)));
        c.push_str(&target::target_flag(self.target.as_ref()));
        c
    }
}

/// `s` quoted for a POSIX shell when it needs it.
pub fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-:,=+@%".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A count or size with an optional k, m or g suffix (powers of 1024), as mdtest reads
/// its -n, -I, -w and -e.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&s[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a count (digits with an optional k, m or g)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// A timed phase, named as mdtest names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Phase {
    /// mkdir of each item.
    DirCreate,
    /// stat of each directory item.
    DirStat,
    /// rename of each directory item (a chain that leaves every name in place).
    DirRename,
    /// rmdir of each item.
    DirRemove,
    /// open(O_CREAT) + write + close of each item.
    FileCreate,
    /// stat of each file item.
    FileStat,
    /// open + read + close of each file item.
    FileRead,
    /// unlink of each file item.
    FileRemove,
    /// mkdir of the tree's directories.
    TreeCreate,
    /// rmdir of the tree's directories.
    TreeRemove,
}

impl Phase {
    /// Every phase, in the order of mdtest's SUMMARY table.
    pub const ALL: [Phase; 10] = [
        Phase::DirCreate,
        Phase::DirStat,
        Phase::DirRename,
        Phase::DirRemove,
        Phase::FileCreate,
        Phase::FileStat,
        Phase::FileRead,
        Phase::FileRemove,
        Phase::TreeCreate,
        Phase::TreeRemove,
    ];

    /// mdtest's name of the phase.
    pub fn name(self) -> &'static str {
        match self {
            Phase::DirCreate => "Directory creation",
            Phase::DirStat => "Directory stat",
            Phase::DirRename => "Directory rename",
            Phase::DirRemove => "Directory removal",
            Phase::FileCreate => "File creation",
            Phase::FileStat => "File stat",
            Phase::FileRead => "File read",
            Phase::FileRemove => "File removal",
            Phase::TreeCreate => "Tree creation",
            Phase::TreeRemove => "Tree removal",
        }
    }

    fn is_tree(self) -> bool {
        matches!(self, Phase::TreeCreate | Phase::TreeRemove)
    }
}

/// What a run does, derived from the flags by mdtest's rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Tasks.
    pub tasks: usize,
    /// Tree depth.
    pub depth: u32,
    /// Branching factor.
    pub branch: u64,
    /// Directories in one tree.
    pub dirs_in_tree: u64,
    /// Items per directory.
    pub items_per_dir: u64,
    /// Items per task (a multiple of `dirs_in_tree`).
    pub items: u64,
    /// One tree per task.
    pub unique: bool,
    /// Directory phases run.
    pub dirs: bool,
    /// File phases run.
    pub files: bool,
    /// Create phases run.
    pub create: bool,
    /// Stat phases run.
    pub stat: bool,
    /// Read phase runs.
    pub read: bool,
    /// Remove phases run.
    pub remove: bool,
    /// Directory rename phase runs.
    pub rename: bool,
    /// Bytes written per file.
    pub write_bytes: usize,
    /// Bytes read per file.
    pub read_bytes: usize,
    /// Iterations.
    pub iterations: u32,
    /// Task stride for stat, read and remove.
    pub stride: usize,
    /// Files per call in the file create and stat phases.
    pub batch: usize,
}

/// Most items one run may make (per task, times tasks), a bound on every loop.
const MAX_TOTAL_ITEMS: u64 = 1 << 32;

impl Plan {
    /// The plan the flags ask for, or why they make no sense.
    pub fn new(a: &MdtestArgs) -> anyhow::Result<Plan> {
        if a.tasks == 0 {
            bail!("--tasks must be at least 1");
        }
        if a.iterations == 0 {
            bail!("-i must be at least 1");
        }
        if a.batch == 0 {
            bail!("--batch must be at least 1");
        }
        if a.batch > 1 && a.write_bytes > 0 {
            bail!("--batch creates empty files: it takes -w 0");
        }
        if a.depth > 0 && a.branch == 0 {
            bail!("-b must be at least 1 with -z");
        }
        let dirs_in_tree = if a.depth == 0 {
            1
        } else if a.branch == 1 {
            a.depth as u64 + 1
        } else {
            let mut total: u64 = 0;
            let mut level: u64 = 1;
            for _ in 0..=a.depth {
                total = total
                    .checked_add(level)
                    .context("-z and -b make too many directories")?;
                level = level
                    .checked_mul(a.branch)
                    .context("-z and -b make too many directories")?;
            }
            total
        };
        let (items_per_dir, items) = match (a.items, a.items_per_dir) {
            (0, 0) => bail!("give -n (items per task) or -I (items per directory)"),
            (0, ipd) => (ipd, ipd.saturating_mul(dirs_in_tree)),
            (n, 0) => (n / dirs_in_tree, n / dirs_in_tree * dirs_in_tree),
            (n, ipd) if n == ipd.saturating_mul(dirs_in_tree) => (ipd, n),
            (n, ipd) => bail!(
                "-n {n} and -I {ipd} disagree: {dirs_in_tree} directories of {ipd} items make {}",
                ipd.saturating_mul(dirs_in_tree)
            ),
        };
        if items == 0 {
            bail!(
                "-n {} is fewer than the tree's {dirs_in_tree} directories",
                a.items
            );
        }
        if items.saturating_mul(a.tasks as u64) > MAX_TOTAL_ITEMS {
            bail!(
                "{items} items × {} tasks is more than this harness runs",
                a.tasks
            );
        }
        let any_phase = a.create || a.stat || a.read || a.remove || a.rename;
        let (files, dirs) = match (a.files_only, a.dirs_only) {
            (false, false) | (true, true) => (true, true),
            (f, d) => (f, d),
        };
        Ok(Plan {
            tasks: a.tasks,
            depth: a.depth,
            branch: a.branch.max(1),
            dirs_in_tree,
            items_per_dir,
            items,
            unique: a.unique_dir,
            dirs,
            files,
            create: a.create || !any_phase,
            stat: a.stat || !any_phase,
            read: a.read || !any_phase,
            remove: a.remove || !any_phase,
            rename: a.rename || !any_phase,
            write_bytes: usize::try_from(a.write_bytes).context("-w is too large")?,
            read_bytes: usize::try_from(a.read_bytes).context("-e is too large")?,
            iterations: a.iterations,
            stride: a.stride,
            batch: a.batch,
        })
    }

    /// The phases one iteration times, in the order they run.
    pub fn phases(&self) -> Vec<Phase> {
        let mut p = Vec::new();
        if self.create {
            p.push(Phase::TreeCreate);
        }
        if self.dirs {
            if self.create {
                p.push(Phase::DirCreate);
            }
            if self.stat {
                p.push(Phase::DirStat);
            }
            if self.rename && self.items > 1 {
                p.push(Phase::DirRename);
            }
            if self.remove {
                p.push(Phase::DirRemove);
            }
        }
        if self.files {
            if self.create {
                p.push(Phase::FileCreate);
            }
            if self.stat {
                p.push(Phase::FileStat);
            }
            if self.read {
                p.push(Phase::FileRead);
            }
            if self.remove {
                p.push(Phase::FileRemove);
            }
        }
        if self.remove {
            p.push(Phase::TreeRemove);
        }
        p
    }

    /// The rows of the SUMMARY table: mdtest prints the file rows, the directory rows or
    /// both, then the tree rows, whether or not a phase ran.
    pub fn summary_phases(&self) -> Vec<Phase> {
        Phase::ALL
            .into_iter()
            .filter(|p| match p {
                Phase::DirCreate | Phase::DirStat | Phase::DirRename | Phase::DirRemove => {
                    self.dirs
                }
                Phase::FileCreate | Phase::FileStat | Phase::FileRead | Phase::FileRemove => {
                    self.files
                }
                Phase::TreeCreate | Phase::TreeRemove => true,
            })
            .collect()
    }

    /// Operations a phase counts toward its rate (mdtest's item count).
    pub fn counted_ops(&self, phase: Phase) -> u64 {
        if phase.is_tree() {
            self.dirs_in_tree
        } else {
            self.items * self.tasks as u64
        }
    }

    /// Calls a phase makes over all tasks: the counted ones, except that every task
    /// builds or removes its own tree with -u.
    pub fn calls(&self, phase: Phase) -> u64 {
        match phase {
            p if p.is_tree() && self.unique => self.dirs_in_tree * self.tasks as u64,
            p if p.is_tree() => self.dirs_in_tree,
            _ => self.items * self.tasks as u64,
        }
    }

    /// The tree's base name for task `rank`.
    fn base(&self, rank: usize) -> String {
        if self.unique {
            format!("mdtest_tree.{rank}")
        } else {
            "mdtest_tree".to_string()
        }
    }

    /// Path of tree directory `d` below the iteration directory, as mdtest builds it:
    /// `base.0/base.a/…/base.d`, each directory's parent being `(d - 1) / b`.
    pub fn tree_dir(&self, base: &str, d: u64) -> String {
        let mut chain = vec![d];
        let mut cur = d;
        while cur > 0 {
            cur = (cur - 1) / self.branch;
            chain.push(cur);
        }
        let mut s = String::with_capacity(chain.len() * (base.len() + 8));
        for (i, c) in chain.iter().rev().enumerate() {
            if i > 0 {
                s.push('/');
            }
            s.push_str(base);
            s.push('.');
            s.push_str(&c.to_string());
        }
        s
    }

    /// The directory item `item` of task `owner` lives in, below the iteration directory.
    fn item_dir(&self, owner: usize, item: u64) -> String {
        self.tree_dir(&self.base(owner), item / self.items_per_dir)
    }

    /// Whose items task `rank` works on in phase step `k` (0 create, 1 stat and rename,
    /// 2 read, 3 remove).
    fn owner(&self, rank: usize, k: usize) -> usize {
        (rank + k * self.stride) % self.tasks
    }
}

/// The result of one phase in one iteration.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseResult {
    /// mdtest's name of the phase.
    pub phase: &'static str,
    /// Operations counted toward the rate.
    pub ops: u64,
    /// Calls made over all tasks.
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Seconds between the phase's barriers.
    pub seconds: f64,
    /// `ops / seconds`.
    pub rate: f64,
    /// Each task's own time in seconds, by rank.
    pub task_seconds: Vec<f64>,
    /// Time of one call, over all tasks.
    pub latency: LatencySummary,
    /// The first failure, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// One iteration's phases, in run order.
#[derive(Clone, Debug, Serialize)]
pub struct IterationResult {
    /// Iteration number from 0.
    pub iteration: u32,
    /// Its phases.
    pub phases: Vec<PhaseResult>,
}

/// One SUMMARY row: the rate's spread over the iterations.
#[derive(Clone, Debug, Serialize)]
pub struct SummaryRow {
    /// mdtest's name of the phase.
    pub phase: &'static str,
    /// Whether the phase ran.
    pub ran: bool,
    /// Rate (ops/s) over the iterations.
    #[serde(flatten)]
    pub rate: Spread,
    /// Time of one call, over all tasks and iterations.
    pub latency: LatencySummary,
}

/// A whole run's report, printed as mdtest's table or written as JSON.
#[derive(Clone, Debug, Serialize)]
pub struct MdtestReport {
    /// `"mdtest"`.
    pub workload: &'static str,
    /// The command that reproduces the run.
    pub command: String,
    /// The target as given (`posix:…`, `talon:…`, or `local`).
    pub target: String,
    /// The directory the test ran in.
    pub dir: String,
    /// Tasks.
    pub tasks: usize,
    /// Items per task.
    pub items_per_task: u64,
    /// Items per directory.
    pub items_per_dir: u64,
    /// Directories in one tree.
    pub dirs_in_tree: u64,
    /// Every iteration's phases.
    pub iterations: Vec<IterationResult>,
    /// The SUMMARY table's rows.
    pub summary: Vec<SummaryRow>,
    /// Failed calls over the whole run.
    pub errors: u64,
}

impl MdtestReport {
    /// mdtest's report: the header lines and the SUMMARY rate table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let what = if self.summary.iter().any(|r| r.phase.starts_with("Dir"))
            && self.summary.iter().any(|r| r.phase.starts_with("File"))
        {
            "files/directories"
        } else if self.summary.iter().any(|r| r.phase.starts_with("File")) {
            "files"
        } else {
            "directories"
        };
        s.push_str(&format!("Command line used: {}\n", self.command));
        s.push_str(&format!("Path                : {}\n", self.dir));
        s.push_str(&format!("Target              : {}\n", self.target));
        s.push_str(&format!(
            "{} tasks, {} {what}\n",
            self.tasks,
            self.items_per_task * self.tasks as u64
        ));
        s.push_str(&format!(
            "\nSUMMARY rate (in ops/sec): (of {} iterations)\n",
            self.iterations.len()
        ));
        s.push_str(
            "   Operation                     Max            Min           Mean        Std Dev\n",
        );
        s.push_str(
            "   ---------                     ---            ---           ----        -------\n",
        );
        for row in &self.summary {
            let r = &row.rate;
            if row.phase.starts_with("Tree") {
                s.push_str(&format!("   {:<22} ", row.phase));
            } else {
                s.push_str(&format!("   {:<18}     ", row.phase));
            }
            s.push_str(&format!(
                "{:14.3} {:14.3} {:14.3} {:14.3}\n",
                r.max, r.min, r.mean, r.stddev
            ));
        }
        s.push_str(&format!(
            "\nLatency per call (in ms): (of {} iterations, every task)\n",
            self.iterations.len()
        ));
        s.push_str(
            "   Operation                     p50            p99          p99.9            Max\n",
        );
        s.push_str(
            "   ---------                     ---            ---          -----            ---\n",
        );
        for row in self.summary.iter().filter(|r| r.ran) {
            let l = &row.latency;
            s.push_str(&format!(
                "   {:<22} {:14.3} {:14.3} {:14.3} {:14.3}\n",
                row.phase, l.p50_ms, l.p99_ms, l.p999_ms, l.max_ms
            ));
        }
        if self.errors > 0 {
            s.push_str(&format!("\nWARNING: {} operations failed\n", self.errors));
        }
        s
    }
}

/// Runs mdtest as `args` asks and returns its report (printing nothing but progress).
pub fn run(args: &MdtestArgs) -> anyhow::Result<MdtestReport> {
    let plan = Plan::new(args)?;
    let spec = args
        .target
        .clone()
        .unwrap_or_else(|| TargetSpec::Posix(PathBuf::from(".")));
    let fs = target::open(&spec)?;
    let top = target::work_dir(args.target.as_ref(), &args.dir);
    let made_top = !fs.exists(&top);
    if made_top {
        fs.mkdir_all(&top)
            .with_context(|| format!("make the test directory {top}"))?;
    }
    let mut iterations = Vec::new();
    let mut latencies: Vec<(&'static str, Latency)> = Vec::new();
    for iteration in 0..plan.iterations {
        let mut phases = Vec::new();
        for (result, latency) in run_iteration(&plan, &fs, &top, iteration, args.quiet)? {
            match latencies.iter_mut().find(|(name, _)| *name == result.phase) {
                Some((_, all)) => all.merge(&latency),
                None => latencies.push((result.phase, latency)),
            }
            phases.push(result);
        }
        iterations.push(IterationResult { iteration, phases });
    }
    if made_top && plan.remove {
        // Best effort, as mdtest: other runs may share the directory.
        let _ = fs.rmdir(&top);
    }
    let summary = plan
        .summary_phases()
        .into_iter()
        .map(|phase| {
            let rates: Vec<f64> = iterations
                .iter()
                .filter_map(|it| it.phases.iter().find(|p| p.phase == phase.name()))
                .map(|p| p.rate)
                .collect();
            SummaryRow {
                phase: phase.name(),
                ran: !rates.is_empty(),
                rate: Spread::of(&rates),
                latency: latencies
                    .iter()
                    .find(|(name, _)| *name == phase.name())
                    .map(|(_, l)| l.summary())
                    .unwrap_or_default(),
            }
        })
        .collect();
    let errors = iterations
        .iter()
        .flat_map(|it| it.phases.iter())
        .map(|p| p.errors)
        .sum();
    Ok(MdtestReport {
        workload: "mdtest",
        command: args.command_line(),
        target: target::describe(args.target.as_ref()),
        dir: top,
        tasks: plan.tasks,
        items_per_task: plan.items,
        items_per_dir: plan.items_per_dir,
        dirs_in_tree: plan.dirs_in_tree,
        iterations,
        summary,
        errors,
    })
}

fn run_iteration(
    plan: &Plan,
    fs: &Arc<dyn Fs>,
    top: &str,
    iteration: u32,
    quiet: bool,
) -> anyhow::Result<Vec<(PhaseResult, Latency)>> {
    let idir = format!("{top}/test-dir.{iteration}-0");
    if plan.create && !fs.exists(&idir) {
        fs.mkdir(&idir)
            .with_context(|| format!("make the iteration directory {idir}"))?;
    }
    let mut results = Vec::new();
    for phase in plan.phases() {
        let bar = tasks::progress(phase.name(), plan.calls(phase), quiet);
        let run = tasks::run_phase(plan.tasks, |rank| {
            let mut ticker = Ticker::new(&bar);
            run_task(plan, fs.as_ref(), &idir, phase, rank, &mut ticker)
        });
        bar.finish_and_clear();
        let seconds = run.wall.as_secs_f64().max(1e-9);
        let ops = plan.counted_ops(phase);
        let mut latency = Latency::new();
        for (o, _) in &run.tasks {
            latency.merge(&o.latency);
        }
        let result = PhaseResult {
            phase: phase.name(),
            ops,
            calls: run.tasks.iter().map(|(o, _)| o.ops).sum(),
            errors: run.tasks.iter().map(|(o, _)| o.errors).sum(),
            seconds,
            rate: ops as f64 / seconds,
            task_seconds: run.tasks.iter().map(|(_, d)| d.as_secs_f64()).collect(),
            latency: latency.summary(),
            first_error: run.tasks.iter().find_map(|(o, _)| o.first_error.clone()),
        };
        results.push((result, latency));
    }
    if plan.remove && fs.exists(&idir) {
        fs.rmdir(&idir)
            .with_context(|| format!("remove the iteration directory {idir}"))?;
    }
    Ok(results)
}

/// One task's share of one phase.
fn run_task(
    plan: &Plan,
    fs: &dyn Fs,
    idir: &str,
    phase: Phase,
    rank: usize,
    ticker: &mut Ticker<'_>,
) -> TaskOutcome {
    let mut out = TaskOutcome::default();
    match phase {
        Phase::TreeCreate | Phase::TreeRemove => {
            if !plan.unique && rank != 0 {
                return out;
            }
            let base = plan.base(rank);
            let dirs: Vec<u64> = if phase == Phase::TreeCreate {
                (0..plan.dirs_in_tree).collect()
            } else {
                (0..plan.dirs_in_tree).rev().collect()
            };
            for d in dirs {
                let path = format!("{idir}/{}", plan.tree_dir(&base, d));
                let started = Instant::now();
                let r = if phase == Phase::TreeCreate {
                    fs.mkdir(&path)
                } else {
                    fs.rmdir(&path)
                };
                out.note_since(&path, started, r);
                ticker.tick();
            }
        }
        Phase::DirRename => {
            let owner = plan.owner(rank, 1);
            let mut first = String::new();
            let mut last = String::new();
            for i in 0..plan.items {
                let mut item = item_path(plan, idir, owner, i, true);
                if i == 0 {
                    first = format!("{item}-XX");
                    last = first.clone();
                } else if i == plan.items - 1 {
                    item = first.clone();
                }
                let started = Instant::now();
                let r = fs.rename(&item, &last);
                out.note_since(&item, started, r);
                last = item;
                ticker.tick();
            }
        }
        Phase::FileCreate | Phase::FileStat if plan.batch > 1 => {
            let k = if phase == Phase::FileCreate { 0 } else { 1 };
            run_batches(plan, fs, idir, phase, plan.owner(rank, k), ticker, &mut out);
        }
        _ => {
            let k = match phase {
                Phase::DirCreate | Phase::FileCreate => 0,
                Phase::DirStat | Phase::FileStat => 1,
                Phase::FileRead => 2,
                _ => 3,
            };
            let owner = plan.owner(rank, k);
            let is_dir = matches!(phase, Phase::DirCreate | Phase::DirStat | Phase::DirRemove);
            let body = vec![0x5au8; plan.write_bytes];
            let mut buf = Vec::with_capacity(plan.read_bytes);
            // Items of one directory share its path prefix, built once per directory.
            let mut dir_of = u64::MAX;
            let mut prefix = String::new();
            let mut path = String::new();
            let kind = if is_dir { "dir" } else { "file" };
            for i in 0..plan.items {
                let d = i / plan.items_per_dir;
                if d != dir_of {
                    dir_of = d;
                    prefix = format!("{idir}/{}/{kind}.mdtest.{owner}.", plan.item_dir(owner, i));
                }
                path.clear();
                path.push_str(&prefix);
                path.push_str(&i.to_string());
                let started = Instant::now();
                let r = match phase {
                    Phase::DirCreate => fs.mkdir(&path),
                    Phase::DirStat | Phase::FileStat => fs.stat(&path).map(|_| ()),
                    Phase::DirRemove => fs.rmdir(&path),
                    Phase::FileCreate => fs.create(&path, &body),
                    Phase::FileRead => match fs.open_read(&path, plan.read_bytes, &mut buf) {
                        Ok(n) if n < plan.read_bytes => Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!("read {n} of {} bytes", plan.read_bytes),
                        )),
                        r => r.map(|_| ()),
                    },
                    _ => fs.unlink(&path),
                };
                out.note_since(&path, started, r);
                ticker.tick();
            }
        }
    }
    out
}

/// Task `owner`'s files, created or stat'ed `plan.batch` at a time (each call's files in
/// one directory) through the target's batch calls.
fn run_batches(
    plan: &Plan,
    fs: &dyn Fs,
    idir: &str,
    phase: Phase,
    owner: usize,
    ticker: &mut Ticker<'_>,
    out: &mut TaskOutcome,
) {
    let mut i = 0;
    while i < plan.items {
        let d = i / plan.items_per_dir;
        let end = plan
            .items
            .min((d + 1) * plan.items_per_dir)
            .min(i + plan.batch as u64);
        let dir = format!("{idir}/{}", plan.item_dir(owner, i));
        let names: Vec<String> = (i..end).map(|j| item_name(owner, j, false)).collect();
        let started = Instant::now();
        let results = match phase {
            Phase::FileCreate => fs.create_batch(&dir, &names),
            _ => fs
                .stat_batch(&dir, &names)
                .map(|rs| rs.into_iter().map(|r| r.map(drop)).collect()),
        };
        let results = results.unwrap_or_else(|| {
            let none = || std::io::Error::other("the target has no batch calls (--batch)");
            names.iter().map(|_| Err(none())).collect()
        });
        let elapsed = started.elapsed();
        for (name, r) in names.iter().zip(results) {
            out.latency.record(elapsed);
            out.note(&format!("{dir}/{name}"), r);
            ticker.tick();
        }
        i = end;
    }
}

/// Full path of item `i` of task `owner`.
fn item_path(plan: &Plan, idir: &str, owner: usize, i: u64, is_dir: bool) -> String {
    format!(
        "{idir}/{}/{}",
        plan.item_dir(owner, i),
        item_name(owner, i, is_dir)
    )
}

/// Name of item `i` of task `owner` in its directory, as mdtest names it.
fn item_name(owner: usize, i: u64, is_dir: bool) -> String {
    let kind = if is_dir { "dir" } else { "file" };
    format!("{kind}.mdtest.{owner}.{i}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(f: impl FnOnce(&mut MdtestArgs)) -> Plan {
        let mut a = MdtestArgs {
            items: 10,
            ..MdtestArgs::default()
        };
        f(&mut a);
        Plan::new(&a).expect("valid plan")
    }

    #[test]
    fn tree_paths_follow_mdtest_numbering() {
        let p = plan(|a| {
            a.depth = 2;
            a.branch = 2;
            a.items = 14;
        });
        assert_eq!(p.dirs_in_tree, 7);
        assert_eq!(p.items_per_dir, 2);
        assert_eq!(p.tree_dir("t", 0), "t.0");
        assert_eq!(p.tree_dir("t", 2), "t.0/t.2");
        assert_eq!(p.tree_dir("t", 3), "t.0/t.1/t.3");
        assert_eq!(p.tree_dir("t", 6), "t.0/t.2/t.6");
        assert_eq!(
            item_path(&p, "/x", 0, 13, false),
            "/x/mdtest_tree.0/mdtest_tree.2/mdtest_tree.6/file.mdtest.0.13"
        );
    }

    #[test]
    fn items_round_down_to_whole_directories() {
        let p = plan(|a| {
            a.depth = 1;
            a.branch = 3;
            a.items = 10;
        });
        assert_eq!((p.dirs_in_tree, p.items_per_dir, p.items), (4, 2, 8));
        let p = plan(|a| {
            a.items = 0;
            a.items_per_dir = 5;
            a.depth = 1;
            a.branch = 2;
        });
        assert_eq!(p.items, 15);
    }

    #[test]
    fn stride_shifts_whose_items_a_task_touches() {
        let p = plan(|a| {
            a.tasks = 4;
            a.stride = 1;
            a.unique_dir = true;
        });
        assert_eq!(p.owner(3, 0), 3);
        assert_eq!(p.owner(3, 1), 0);
        assert_eq!(p.owner(3, 3), 2);
    }
}
