//! `talon-bench imagenet`: the training-loader workload.
//!
//! Builds `DIR/nCCCCCCCC/img_IIIIIIII.JPEG`, `--files` files of about `--size` bytes
//! (uniformly ±`--spread`, seeded, so every target gets the same tree) in `--classes`
//! class directories, then reads them whole in a shuffled order (a new shuffle each epoch)
//! with `--workers` threads; each epoch reports images/s, MB/s and the read latency's
//! p50/p99/p99.9. `--cold` drops the page cache (POSIX, as root) or starts a fresh client
//! (library) before every epoch.
//!
//! Loader mode (`--accelerators 1,2,4,...`), in the spirit of MLPerf Storage: each
//! accelerator needs a batch of `--batch` images every `--step-ms` (its compute time per
//! step) for `--steps` steps, fed by `--readers` reader threads through a queue of two
//! batches (prefetch). An accelerator is busy while it computes and idle while it waits
//! for a batch; utilisation is compute time over wall time. The report names the most
//! accelerators the target kept at 90 % or more. Every accelerator reads its own slice of
//! the shuffled files, so no file is read twice in one run unless the run needs more
//! images than the tree holds.

use crate::epoch::{self, BuildResult, EpochResult, FileSpec, Tree};
use crate::mdtest::shell_word;
use crate::target::{self, Fs, PosixFs, TargetSpec};
use anyhow::{bail, Context};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Flags of `talon-bench imagenet`.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct ImagenetArgs {
    /// Where to run: posix:PATH or talon:HOST:PORT[,...]. Without it, -d is a local path.
    #[arg(long)]
    pub target: Option<TargetSpec>,
    /// Directory of the tree (inside the target when --target is given).
    #[arg(short = 'd', long = "dir", default_value = "./imagenet")]
    pub dir: String,
    /// Files in the tree.
    #[arg(long, default_value_t = 10_000)]
    pub files: usize,
    /// Class directories.
    #[arg(long, default_value_t = 100)]
    pub classes: usize,
    /// Mean file size in bytes (ImageNet's JPEGs average about 110 KB).
    #[arg(long, default_value_t = 110_000)]
    pub size: usize,
    /// Spread of the sizes around the mean, as a fraction (uniform).
    #[arg(long, default_value_t = 0.25)]
    pub spread: f64,
    /// Threads that build the tree.
    #[arg(long, default_value_t = 4)]
    pub build_tasks: usize,
    /// Concurrent readers in the epochs.
    #[arg(long, default_value_t = 16)]
    pub workers: usize,
    /// Measured epochs (0 for none).
    #[arg(long, default_value_t = 2)]
    pub epochs: u32,
    /// Drop caches before every epoch and loader run.
    #[arg(long)]
    pub cold: bool,
    /// Accelerator counts to try in loader mode (e.g. 1,2,4,8); none skips it.
    #[arg(long, value_delimiter = ',')]
    pub accelerators: Vec<usize>,
    /// Images per batch in loader mode.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Compute time of one step in loader mode, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub step_ms: u64,
    /// Steps per accelerator in loader mode.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Reader threads per accelerator in loader mode.
    #[arg(long, default_value_t = 4)]
    pub readers: usize,
    /// Build the tree with the target's bulk loader (Talon's `import`) from a local copy
    /// made first in a temporary directory, instead of file by file.
    #[arg(long, conflicts_with = "no_build")]
    pub import: bool,
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

impl Default for ImagenetArgs {
    fn default() -> Self {
        ImagenetArgs {
            target: None,
            dir: "./imagenet".into(),
            files: 10_000,
            classes: 100,
            size: 110_000,
            spread: 0.25,
            build_tasks: 4,
            workers: 16,
            epochs: 2,
            cold: false,
            accelerators: Vec::new(),
            batch: 32,
            step_ms: 100,
            steps: 20,
            readers: 4,
            import: false,
            no_build: false,
            keep: false,
            json: None,
            quiet: false,
        }
    }
}

impl ImagenetArgs {
    /// The command that reproduces this run.
    pub fn command_line(&self) -> String {
        let mut c = format!(
            "talon-bench imagenet -d {} --files {} --classes {} --size {} --spread {} \
             --build-tasks {} --workers {} --epochs {}",
            shell_word(&self.dir),
            self.files,
            self.classes,
            self.size,
            self.spread,
            self.build_tasks,
            self.workers,
            self.epochs
        );
        c.push_str(&target::target_flag(self.target.as_ref()));
        if self.cold {
            c.push_str(" --cold");
        }
        if !self.accelerators.is_empty() {
            let list: Vec<String> = self.accelerators.iter().map(|a| a.to_string()).collect();
            c.push_str(&format!(
                " --accelerators {} --batch {} --step-ms {} --steps {} --readers {}",
                list.join(","),
                self.batch,
                self.step_ms,
                self.steps,
                self.readers
            ));
        }
        if self.import {
            c.push_str(" --import");
        }
        if self.no_build {
            c.push_str(" --no-build");
        }
        if self.keep {
            c.push_str(" --keep");
        }
        c
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.files == 0 || self.classes == 0 {
            bail!("--files and --classes must be at least 1");
        }
        if self.files > 100_000_000 {
            bail!("--files {} is more than this harness builds", self.files);
        }
        if self.size > 1 << 30 {
            bail!("--size is at most 1 GiB");
        }
        if self.workers == 0 || self.build_tasks == 0 || self.readers == 0 {
            bail!("--workers, --build-tasks and --readers must be at least 1");
        }
        if !self.accelerators.is_empty() && (self.batch == 0 || self.steps == 0) {
            bail!("--batch and --steps must be at least 1 in loader mode");
        }
        if self.accelerators.iter().any(|&a| a == 0 || a > 1024) {
            bail!("--accelerators takes counts from 1 to 1024");
        }
        Ok(())
    }
}

/// One loader-mode run.
#[derive(Clone, Debug, Serialize)]
pub struct LoaderResult {
    /// Emulated accelerators.
    pub accelerators: usize,
    /// Mean utilisation over the accelerators (compute time / wall time), 0 to 1.
    pub utilisation: f64,
    /// The least-utilised accelerator's utilisation.
    pub min_utilisation: f64,
    /// Images delivered per second over all accelerators.
    pub images_per_sec: f64,
    /// Seconds the run took.
    pub seconds: f64,
    /// Reads that failed.
    pub errors: u64,
}

/// The report of one `imagenet` run.
#[derive(Clone, Debug, Serialize)]
pub struct ImagenetReport {
    /// `"imagenet"`.
    pub workload: &'static str,
    /// The command that reproduces the run.
    pub command: String,
    /// The target (`posix:…`, `talon:…` or `local`).
    pub target: String,
    /// The tree's directory.
    pub dir: String,
    /// Files in the tree.
    pub files: u64,
    /// Bytes in the tree.
    pub bytes: u64,
    /// Class directories.
    pub classes: usize,
    /// The build, unless `--no-build`.
    pub build: Option<BuildResult>,
    /// The measured epochs.
    pub epochs: Vec<EpochResult>,
    /// Loader-mode runs.
    pub loader: Vec<LoaderResult>,
    /// The most accelerators kept at ≥ 90 % utilisation, if any was.
    pub max_accelerators_at_90: Option<usize>,
    /// Failed calls over the run.
    pub errors: u64,
}

impl ImagenetReport {
    /// The human-readable report.
    pub fn table(&self) -> String {
        let mut s = format!(
            "Command line used: {}\nTarget: {}  Path: {}\nTree: {} files, {:.1} MB in {} classes\n",
            self.command,
            self.target,
            self.dir,
            self.files,
            self.bytes as f64 / 1e6,
            self.classes
        );
        if let Some(b) = &self.build {
            s.push_str(&format!(
                "Build ({}): {:.2} s, {:.1} files/s, {:.1} MB/s, {} errors\n",
                if b.tasks == 0 {
                    "bulk import".to_string()
                } else {
                    format!("{} tasks", b.tasks)
                },
                b.seconds,
                b.files_per_sec,
                b.mb_per_sec,
                b.errors
            ));
        }
        if !self.epochs.is_empty() {
            s.push('\n');
            s.push_str(&epoch::epoch_table(&self.epochs));
        }
        if !self.loader.is_empty() {
            let mut t = crate::cli::plain_table(&[
                "accelerators",
                "utilisation",
                "min utilisation",
                "images/s",
                "errors",
            ]);
            for l in &self.loader {
                t.add_row(vec![
                    l.accelerators.to_string(),
                    format!("{:.1}%", l.utilisation * 100.0),
                    format!("{:.1}%", l.min_utilisation * 100.0),
                    format!("{:.1}", l.images_per_sec),
                    l.errors.to_string(),
                ]);
            }
            s.push('\n');
            s.push_str(&crate::cli::render(&t));
            match self.max_accelerators_at_90 {
                Some(a) => s.push_str(&format!("Most accelerators at >= 90%: {a}\n")),
                None => s.push_str("Most accelerators at >= 90%: none of those tried\n"),
            }
        }
        if self.errors > 0 {
            s.push_str(&format!("\nWARNING: {} operations failed\n", self.errors));
        }
        s
    }
}

/// The tree's directories and files.
pub fn tree(top: &str, a: &ImagenetArgs) -> (Vec<String>, Vec<FileSpec>) {
    let dirs = (0..a.classes).map(|c| format!("{top}/n{c:08}")).collect();
    let files = epoch::lengths(a.files, a.size, a.spread, 1)
        .into_iter()
        .enumerate()
        .map(|(i, len)| FileSpec {
            path: format!("{top}/n{:08}/img_{i:08}.JPEG", i % a.classes),
            len,
        })
        .collect();
    (dirs, files)
}

/// Runs the workload as `args` asks and returns its report.
pub fn run(args: &ImagenetArgs) -> anyhow::Result<ImagenetReport> {
    args.validate()?;
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
    } else if args.import {
        Some(import_tree(fs.as_ref(), &tree.top, args)?)
    } else {
        Some(tree.build(fs.as_ref(), args.build_tasks, args.quiet)?)
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let (epochs, mut order) = tree.read_epochs(
        fs.as_ref(),
        &mut rng,
        args.epochs,
        args.workers,
        args.cold,
        args.quiet,
    )?;
    let mut errors = build.as_ref().map_or(0, |b| b.errors);
    errors += epochs.iter().map(|e| e.errors).sum::<u64>();
    let mut loader = Vec::new();
    for &a in &args.accelerators {
        order.shuffle(&mut rng);
        if args.cold {
            fs.drop_caches().context("drop caches")?;
        }
        let r = run_loader(fs.as_ref(), &order, a, args);
        errors += r.errors;
        loader.push(r);
    }
    let max_accelerators_at_90 = loader
        .iter()
        .filter(|l| l.utilisation >= 0.9)
        .map(|l| l.accelerators)
        .max();
    if !args.keep {
        errors += tree.remove(fs.as_ref(), args.build_tasks, !args.no_build);
    }
    Ok(ImagenetReport {
        workload: "imagenet",
        command: args.command_line(),
        target: target::describe(args.target.as_ref()),
        files: tree.files.len() as u64,
        bytes: tree.files.iter().map(|f| f.len as u64).sum(),
        dir: tree.top,
        classes: args.classes,
        build,
        epochs,
        loader,
        max_accelerators_at_90,
        errors,
    })
}

/// Writes the tree to a local temporary directory (untimed), then copies it into `top`
/// with the target's bulk loader (timed).
fn import_tree(fs: &dyn Fs, top: &str, args: &ImagenetArgs) -> anyhow::Result<BuildResult> {
    let tmp = tempfile::tempdir().context("make a temporary directory")?;
    let local_top = tmp.path().display().to_string();
    let (dirs, files) = tree(&local_top, args);
    let local = epoch::build(&PosixFs, &dirs, &files, args.build_tasks, args.quiet);
    if local.errors > 0 {
        bail!("write the local copy: {:?}", local.first_error);
    }
    let imported = fs
        .bulk_import(tmp.path(), top)
        .context("--import needs a target with a bulk loader (talon:)")?
        .with_context(|| format!("import into {top}"))?;
    let seconds = imported.seconds.max(1e-9);
    Ok(BuildResult {
        files: imported.files,
        bytes: imported.bytes,
        tasks: 0,
        seconds,
        files_per_sec: imported.files as f64 / seconds,
        mb_per_sec: imported.bytes as f64 / 1e6 / seconds,
        errors: imported.failed,
        first_error: None,
    })
}

/// `accelerators` emulated accelerators, each fed by its own readers, over slices of
/// `order`.
fn run_loader(fs: &dyn Fs, order: &[&str], accelerators: usize, a: &ImagenetArgs) -> LoaderResult {
    let per_acc = a.batch * a.steps;
    let step = Duration::from_millis(a.step_ms);
    let errors = AtomicU64::new(0);
    let start = Instant::now();
    let utils: Vec<f64> = std::thread::scope(|s| {
        let accs: Vec<_> = (0..accelerators)
            .map(|acc| {
                let errors = &errors;
                s.spawn(move || {
                    let (tx, rx) = mpsc::sync_channel::<()>(2 * a.batch);
                    let cursor = AtomicU64::new(0);
                    let stop = AtomicBool::new(false);
                    std::thread::scope(|rs| {
                        for _ in 0..a.readers {
                            let (tx, cursor, stop) = (tx.clone(), &cursor, &stop);
                            rs.spawn(move || {
                                let mut buf = Vec::new();
                                loop {
                                    let k = cursor.fetch_add(1, Ordering::Relaxed) as usize;
                                    if k >= per_acc || stop.load(Ordering::Relaxed) {
                                        break;
                                    }
                                    let path = order[(acc * per_acc + k) % order.len()];
                                    if fs.read_whole(path, &mut buf).is_err() {
                                        errors.fetch_add(1, Ordering::Relaxed);
                                    }
                                    if tx.send(()).is_err() {
                                        break;
                                    }
                                }
                            });
                        }
                        drop(tx);
                        // The accelerator: wait for a batch (idle), then compute (busy).
                        let t0 = Instant::now();
                        let mut busy = Duration::ZERO;
                        'steps: for _ in 0..a.steps {
                            for _ in 0..a.batch {
                                if rx.recv().is_err() {
                                    break 'steps;
                                }
                            }
                            std::thread::sleep(step);
                            busy += step;
                        }
                        stop.store(true, Ordering::Relaxed);
                        // Unblock readers waiting on a full queue.
                        while rx.try_recv().is_ok() {}
                        drop(rx);
                        busy.as_secs_f64() / t0.elapsed().as_secs_f64().max(1e-9)
                    })
                })
            })
            .collect();
        accs.into_iter()
            .map(|h| match h.join() {
                Ok(u) => u,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64().max(1e-9);
    let n = utils.len().max(1) as f64;
    LoaderResult {
        accelerators,
        utilisation: utils.iter().sum::<f64>() / n,
        min_utilisation: utils.iter().copied().fold(1.0, f64::min),
        images_per_sec: (accelerators * per_acc) as f64 / seconds,
        seconds,
        errors: errors.load(Ordering::Relaxed),
    }
}
