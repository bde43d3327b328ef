//! Shared pieces of the read workloads: building a tree of files in parallel, and an
//! epoch of whole-file reads in a shuffled order by K workers.
//!
//! An epoch hands out the shuffled list through one atomic cursor, so K workers read
//! every file exactly once with no other coordination; each worker records the latency of
//! every read in its own histogram, merged at the end. Bodies come from one random buffer
//! at varying offsets: incompressible, and cheap enough that a build measures the target.

use crate::stats::{Latency, LatencySummary};
use crate::target::Fs;
use crate::tasks::{self, TaskOutcome, Ticker};
use anyhow::Context;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// A file to make: its path and length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSpec {
    /// Absolute path in the target.
    pub path: String,
    /// Length in bytes.
    pub len: usize,
}

/// Lengths around `mean` spread uniformly by ±`spread` (a fraction), from a fixed seed so
/// every run and every target gets the same files.
pub fn lengths(n: usize, mean: usize, spread: f64, seed: u64) -> Vec<usize> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let spread = spread.clamp(0.0, 1.0);
    let lo = (mean as f64 * (1.0 - spread)) as usize;
    let hi = ((mean as f64 * (1.0 + spread)) as usize).max(lo);
    (0..n).map(|_| rng.random_range(lo..=hi)).collect()
}

/// How a build went.
#[derive(Clone, Debug, Serialize)]
pub struct BuildResult {
    /// Files written.
    pub files: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Tasks that wrote them.
    pub tasks: usize,
    /// Seconds for directories and files.
    pub seconds: f64,
    /// Files per second.
    pub files_per_sec: f64,
    /// MB (10^6 bytes) per second.
    pub mb_per_sec: f64,
    /// Calls that failed.
    pub errors: u64,
    /// The first failure, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// Makes `dirs` (parents before children, in order) and then `files` with `tasks`
/// threads.
pub fn build(
    fs: &dyn Fs,
    dirs: &[String],
    files: &[FileSpec],
    tasks: usize,
    quiet: bool,
) -> BuildResult {
    let max_len = files.iter().map(|f| f.len).max().unwrap_or(0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let pool: Vec<u8> = (0..max_len + 4096).map(|_| rng.random()).collect();
    let start = Instant::now();
    let bar = tasks::progress("build", (dirs.len() + files.len()) as u64, quiet);
    let mut outcome = TaskOutcome::default();
    {
        let mut ticker = Ticker::new(&bar);
        for d in dirs {
            let r = match fs.mkdir(d) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                r => r,
            };
            outcome.note(d, r);
            ticker.tick();
        }
    }
    let next = AtomicUsize::new(0);
    let run = tasks::run_phase(tasks, |_| {
        let mut out = TaskOutcome::default();
        let mut ticker = Ticker::new(&bar);
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(f) = files.get(i) else { break };
            let off = i % 4096;
            out.note(&f.path, fs.create(&f.path, &pool[off..off + f.len]));
            ticker.tick();
        }
        out
    });
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64().max(1e-9);
    let bytes: u64 = files.iter().map(|f| f.len as u64).sum();
    let errors = outcome.errors + run.tasks.iter().map(|(o, _)| o.errors).sum::<u64>();
    let first_error = outcome
        .first_error
        .or_else(|| run.tasks.iter().find_map(|(o, _)| o.first_error.clone()));
    BuildResult {
        files: files.len() as u64,
        bytes,
        tasks,
        seconds,
        files_per_sec: files.len() as f64 / seconds,
        mb_per_sec: bytes as f64 / 1e6 / seconds,
        errors,
        first_error,
    }
}

/// A read workload's tree: its top directory, its directories (parents first) and files.
pub struct Tree {
    /// The top directory, in the target's namespace.
    pub top: String,
    /// Directories below the top, parents before children.
    pub dirs: Vec<String>,
    /// The files, at the leaves.
    pub files: Vec<FileSpec>,
}

impl Tree {
    /// Makes the top directory and writes the tree with `tasks` threads.
    pub fn build(&self, fs: &dyn Fs, tasks: usize, quiet: bool) -> anyhow::Result<BuildResult> {
        fs.mkdir_all(&self.top)
            .with_context(|| format!("make the tree's directory {}", self.top))?;
        Ok(build(fs, &self.dirs, &self.files, tasks, quiet))
    }

    /// Runs `epochs` read epochs, each over every file in a new order drawn from `rng`
    /// (after dropping caches when `cold`); returns them and the order of the last one.
    pub fn read_epochs(
        &self,
        fs: &dyn Fs,
        rng: &mut rand::rngs::StdRng,
        epochs: u32,
        workers: usize,
        cold: bool,
        quiet: bool,
    ) -> anyhow::Result<(Vec<EpochResult>, Vec<&str>)> {
        let mut order: Vec<&str> = self.files.iter().map(|f| f.path.as_str()).collect();
        let mut out = Vec::new();
        for e in 1..=epochs {
            order.shuffle(rng);
            if cold {
                fs.drop_caches().context("drop caches")?;
            }
            out.push(read_epoch(fs, &order, workers, e, cold, quiet));
        }
        Ok((out, order))
    }

    /// Removes the tree (its top directory too when this run `built` it); returns the
    /// calls that failed.
    pub fn remove(&self, fs: &dyn Fs, tasks: usize, built: bool) -> u64 {
        let errors = remove(fs, &self.dirs, &self.files, tasks);
        if built {
            let _ = fs.rmdir(&self.top);
        }
        errors
    }
}

/// Removes `files`, then `dirs` children first (the reverse of their build order).
pub fn remove(fs: &dyn Fs, dirs: &[String], files: &[FileSpec], tasks: usize) -> u64 {
    let next = AtomicUsize::new(0);
    let run = tasks::run_phase(tasks, |_| {
        let mut out = TaskOutcome::default();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(f) = files.get(i) else { break };
            out.note(&f.path, fs.unlink(&f.path));
        }
        out
    });
    let mut errors: u64 = run.tasks.iter().map(|(o, _)| o.errors).sum();
    for d in dirs.iter().rev() {
        if fs.rmdir(d).is_err() {
            errors += 1;
        }
    }
    errors
}

/// One epoch of whole-file reads.
#[derive(Clone, Debug, Serialize)]
pub struct EpochResult {
    /// Epoch number from 1.
    pub epoch: u32,
    /// Concurrent readers.
    pub workers: usize,
    /// Whether caches were dropped before it (page cache, or a fresh client).
    pub cold: bool,
    /// Files read.
    pub files: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Seconds from the first read's start to the last one's end.
    pub seconds: f64,
    /// Files per second.
    pub files_per_sec: f64,
    /// MB (10^6 bytes) per second.
    pub mb_per_sec: f64,
    /// Per-read latency.
    pub latency: LatencySummary,
    /// Reads that failed.
    pub errors: u64,
    /// Server round trips per file read (open, read, close), for a target that counts them
    /// (the client library); absent for a mounted path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round_trips_per_file: Option<f64>,
    /// The first failure, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// Reads every file of `order` (paths) once, whole, with `workers` threads.
pub fn read_epoch(
    fs: &dyn Fs,
    order: &[&str],
    workers: usize,
    epoch: u32,
    cold: bool,
    quiet: bool,
) -> EpochResult {
    let next = AtomicUsize::new(0);
    let trips_before = fs.round_trips();
    let bar = tasks::progress(&format!("epoch {epoch}"), order.len() as u64, quiet);
    let run = tasks::run_phase(workers, |_| {
        let mut out = TaskOutcome::default();
        let mut lat = Latency::new();
        let mut bytes = 0u64;
        let mut buf = Vec::new();
        let mut ticker = Ticker::new(&bar);
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(path) = order.get(i) else { break };
            let t = Instant::now();
            let r = fs.read_whole(path, &mut buf);
            lat.record(t.elapsed());
            if let Some(n) = out.note(path, r) {
                bytes += n as u64;
            }
            ticker.tick();
        }
        (out, lat, bytes)
    });
    bar.finish_and_clear();
    let mut lat = Latency::new();
    let mut bytes = 0;
    let mut errors = 0;
    let mut first_error = None;
    for ((o, l, b), _) in &run.tasks {
        lat.merge(l);
        bytes += b;
        errors += o.errors;
        if first_error.is_none() {
            first_error.clone_from(&o.first_error);
        }
    }
    let seconds = run.wall.as_secs_f64().max(1e-9);
    let round_trips_per_file = match (trips_before, fs.round_trips()) {
        (Some(a), Some(b)) if !order.is_empty() => {
            Some(b.saturating_sub(a) as f64 / order.len() as f64)
        }
        _ => None,
    };
    EpochResult {
        epoch,
        workers,
        cold,
        files: order.len() as u64,
        bytes,
        seconds,
        files_per_sec: order.len() as f64 / seconds,
        mb_per_sec: bytes as f64 / 1e6 / seconds,
        latency: lat.summary(),
        errors,
        round_trips_per_file,
        first_error,
    }
}

/// The epoch table's header and rows.
pub fn epoch_table(epochs: &[EpochResult]) -> String {
    let mut t = crate::cli::plain_table(&[
        "epoch",
        "workers",
        "cache",
        "files",
        "files/s",
        "MB/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "errors",
        "RPCs/file",
    ]);
    for e in epochs {
        t.add_row(vec![
            e.epoch.to_string(),
            e.workers.to_string(),
            if e.cold { "cold" } else { "warm" }.to_string(),
            e.files.to_string(),
            format!("{:.1}", e.files_per_sec),
            format!("{:.1}", e.mb_per_sec),
            format!("{:.3}", e.latency.p50_ms),
            format!("{:.3}", e.latency.p99_ms),
            format!("{:.3}", e.latency.p999_ms),
            e.errors.to_string(),
            e.round_trips_per_file
                .map_or_else(|| "-".to_string(), |r| format!("{r:.2}")),
        ]);
    }
    crate::cli::render(&t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_seeded_and_within_the_spread() {
        let a = lengths(1000, 110_000, 0.25, 1);
        assert_eq!(a, lengths(1000, 110_000, 0.25, 1));
        assert!(a.iter().all(|&l| (82_500..=137_500).contains(&l)));
        let mean = a.iter().sum::<usize>() as f64 / a.len() as f64;
        assert!((mean - 110_000.0).abs() < 3_000.0, "{mean}");
        assert_eq!(lengths(3, 100, 0.0, 1), vec![100, 100, 100]);
    }
}
