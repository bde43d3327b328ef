//! `talon-bench traverse`: path resolution in a deep tree, the way FalconFS measures it.
//!
//! Builds a tree of `--depth` levels of `--fanout` directories each (`d0`…`dF-1` at every
//! level) with `--files-per-leaf` files of `--size` bytes in each leaf directory, then
//! opens and reads every leaf file once per epoch in a new random order with `--workers`
//! threads. Every open resolves `--depth` + 1 components, so the rate shows what path
//! resolution costs on the target: kernel dentry cache, FUSE lookups, or the client's path
//! cache. `--cold` drops caches (page and dentry cache as root, or a fresh client) before
//! every epoch, so the first lookups of each directory go to the servers again.
//!
//! The library does not expose per-call RPC counters, so server round trips per open are
//! not reported; the latency percentiles show the same thing indirectly (a warm path
//! cache makes an open one round trip).

use crate::epoch::{self, BuildResult, EpochResult, FileSpec, Tree};
use crate::mdtest::shell_word;
use crate::target::{self, TargetSpec};
use anyhow::{bail, Context};
use rand::SeedableRng;
use serde::Serialize;
use std::path::PathBuf;

/// Flags of `talon-bench traverse`.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct TraverseArgs {
    /// Where to run: posix:PATH or talon:HOST:PORT[,...]. Without it, -d is a local path.
    #[arg(long)]
    pub target: Option<TargetSpec>,
    /// Directory of the tree (inside the target when --target is given).
    #[arg(short = 'd', long = "dir", default_value = "./traverse")]
    pub dir: String,
    /// Directory levels below the top.
    #[arg(long, default_value_t = 6)]
    pub depth: u32,
    /// Subdirectories of every directory above the leaves.
    #[arg(long, default_value_t = 4)]
    pub fanout: usize,
    /// Files in every leaf directory.
    #[arg(long, default_value_t = 2)]
    pub files_per_leaf: usize,
    /// Bytes per file.
    #[arg(long, default_value_t = 4096)]
    pub size: usize,
    /// Threads that build the tree.
    #[arg(long, default_value_t = 4)]
    pub build_tasks: usize,
    /// Concurrent readers.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Measured epochs.
    #[arg(long, default_value_t = 2)]
    pub epochs: u32,
    /// Drop caches before every epoch.
    #[arg(long)]
    pub cold: bool,
    /// Use the tree already there (built by an earlier run with the same flags).
    #[arg(long)]
    pub no_build: bool,
    /// Leave the tree in place at the end.
    #[arg(long)]
    pub keep: bool,
    /// Also write the report as JSON to this file ("-" for stdout instead of the table).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

impl Default for TraverseArgs {
    fn default() -> Self {
        TraverseArgs {
            target: None,
            dir: "./traverse".into(),
            depth: 6,
            fanout: 4,
            files_per_leaf: 2,
            size: 4096,
            build_tasks: 4,
            workers: 8,
            epochs: 2,
            cold: false,
            no_build: false,
            keep: false,
            json: None,
            quiet: false,
        }
    }
}

/// Most files one traverse tree may hold, a bound on the build.
const MAX_FILES: u64 = 50_000_000;

impl TraverseArgs {
    /// The command that reproduces this run.
    pub fn command_line(&self) -> String {
        let mut c = format!(
            "talon-bench traverse -d {} --depth {} --fanout {} --files-per-leaf {} --size {} \
             --build-tasks {} --workers {} --epochs {}",
            shell_word(&self.dir),
            self.depth,
            self.fanout,
            self.files_per_leaf,
            self.size,
            self.build_tasks,
            self.workers,
            self.epochs
        );
        c.push_str(&target::target_flag(self.target.as_ref()));
        for (on, flag) in [
            (self.cold, " --cold"),
            (self.no_build, " --no-build"),
            (self.keep, " --keep"),
        ] {
            if on {
                c.push_str(flag);
            }
        }
        c
    }

    /// Leaf directories and files the tree holds, or why the flags ask too much.
    pub fn shape(&self) -> anyhow::Result<(u64, u64)> {
        if self.fanout == 0 || self.files_per_leaf == 0 || self.workers == 0 {
            bail!("--fanout, --files-per-leaf and --workers must be at least 1");
        }
        if self.build_tasks == 0 {
            bail!("--build-tasks must be at least 1");
        }
        let leaves = (self.fanout as u64)
            .checked_pow(self.depth)
            .filter(|l| *l <= MAX_FILES)
            .context("--fanout and --depth make too many directories")?;
        let files = leaves.saturating_mul(self.files_per_leaf as u64);
        if files > MAX_FILES {
            bail!("{files} files is more than this harness builds");
        }
        Ok((leaves, files))
    }
}

/// The tree's directories (parents first) and files.
pub fn tree(top: &str, a: &TraverseArgs) -> (Vec<String>, Vec<FileSpec>) {
    let mut dirs = Vec::new();
    let mut level = vec![top.to_string()];
    for _ in 0..a.depth {
        let mut next = Vec::with_capacity(level.len() * a.fanout);
        for parent in &level {
            for c in 0..a.fanout {
                next.push(format!("{parent}/d{c}"));
            }
        }
        dirs.extend(next.iter().cloned());
        level = next;
    }
    let mut files = Vec::with_capacity(level.len() * a.files_per_leaf);
    for leaf in &level {
        for f in 0..a.files_per_leaf {
            files.push(FileSpec {
                path: format!("{leaf}/f{f}"),
                len: a.size,
            });
        }
    }
    (dirs, files)
}

/// The report of one `traverse` run.
#[derive(Clone, Debug, Serialize)]
pub struct TraverseReport {
    /// `"traverse"`.
    pub workload: &'static str,
    /// The command that reproduces the run.
    pub command: String,
    /// The target (`posix:…`, `talon:…` or `local`).
    pub target: String,
    /// The tree's top directory.
    pub dir: String,
    /// Directory levels.
    pub depth: u32,
    /// Directories in the tree (not counting the top).
    pub dirs: u64,
    /// Files in the tree.
    pub files: u64,
    /// The build, unless `--no-build`.
    pub build: Option<BuildResult>,
    /// The measured epochs.
    pub epochs: Vec<EpochResult>,
    /// Failed calls over the run.
    pub errors: u64,
}

impl TraverseReport {
    /// The human-readable report.
    pub fn table(&self) -> String {
        let mut s = format!(
            "Command line used: {}\nTarget: {}  Path: {}\nTree: depth {}, {} directories, {} files\n",
            self.command, self.target, self.dir, self.depth, self.dirs, self.files
        );
        if let Some(b) = &self.build {
            s.push_str(&format!(
                "Build: {} tasks, {:.2} s, {:.1} files/s, {} errors\n",
                b.tasks, b.seconds, b.files_per_sec, b.errors
            ));
        }
        s.push('\n');
        s.push_str(&epoch::epoch_table(&self.epochs));
        if self.errors > 0 {
            s.push_str(&format!("\nWARNING: {} operations failed\n", self.errors));
        }
        s
    }
}

/// Runs the workload as `args` asks and returns its report.
pub fn run(args: &TraverseArgs) -> anyhow::Result<TraverseReport> {
    args.shape()?;
    let spec = args
        .target
        .clone()
        .unwrap_or_else(|| TargetSpec::Posix(PathBuf::from(".")));
    let fs = target::open(&spec)?;
    let top = target::work_dir(args.target.as_ref(), &args.dir);
    let (dirs, files) = tree(&top, args);
    let tree = Tree { top, dirs, files };
    let build = if args.no_build {
        None
    } else {
        Some(tree.build(fs.as_ref(), args.build_tasks, args.quiet)?)
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let (epochs, _) = tree.read_epochs(
        fs.as_ref(),
        &mut rng,
        args.epochs,
        args.workers,
        args.cold,
        args.quiet,
    )?;
    let mut errors = build.as_ref().map_or(0, |b| b.errors);
    errors += epochs.iter().map(|e| e.errors).sum::<u64>();
    if !args.keep {
        errors += tree.remove(fs.as_ref(), args.build_tasks, !args.no_build);
    }
    Ok(TraverseReport {
        workload: "traverse",
        command: args.command_line(),
        target: target::describe(args.target.as_ref()),
        depth: args.depth,
        dirs: tree.dirs.len() as u64,
        files: tree.files.len() as u64,
        dir: tree.top,
        build,
        epochs,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_has_fanout_to_the_depth_leaves() {
        let a = TraverseArgs {
            depth: 3,
            fanout: 2,
            files_per_leaf: 3,
            ..TraverseArgs::default()
        };
        let (dirs, files) = tree("/t", &a);
        assert_eq!(dirs.len(), 2 + 4 + 8);
        assert_eq!(files.len(), 8 * 3);
        assert_eq!(a.shape().expect("shape"), (8, 24));
        assert_eq!(files[0].path, "/t/d0/d0/d0/f0");
        assert_eq!(files[23].path, "/t/d1/d1/d1/f2");
        // Parents come before their children.
        let pos = |p: &str| dirs.iter().position(|d| d == p).expect("dir");
        assert!(pos("/t/d1") < pos("/t/d1/d0") && pos("/t/d1/d0") < pos("/t/d1/d0/d1"));
    }

    #[test]
    fn oversized_trees_are_refused() {
        let a = TraverseArgs {
            depth: 40,
            fanout: 10,
            ..TraverseArgs::default()
        };
        assert!(a.shape().is_err());
    }
}
