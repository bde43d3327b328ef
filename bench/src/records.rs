//! `talon-bench records`: random records of large files, the way a language model's data
//! loader reads a tokenized dataset (Megatron-style indexed `.bin` shards, Arrow and LMDB
//! files): a few big files, each sample a small read at a random offset.
//!
//! Writes `--shards` files of `--shard-mib` MiB, one writer each, every 8-byte word of them a
//! function of its shard and place, so every record read back is checked. Then in each of
//! `--epochs` epochs `--workers` threads, each holding every shard open, read `--reads`
//! records of `--record` bytes at random 8-byte-aligned offsets of random shards;
//! `--cold` drops caches (the page cache as root, or a fresh client) before every epoch.
//! A record that reads back other bytes than were written counts as a failed read.

use crate::cli::{plain_table, render};
use crate::mdtest::shell_word;
use crate::stats::LatencySummary;
use crate::target::{self, Fs, TargetSpec};
use crate::tasks::{progress, run_phase, TaskOutcome, Ticker};
use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// Flags of `talon-bench records`.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct RecordsArgs {
    /// Where to run: posix:PATH or talon:HOST:PORT[,...]. Without it, -d is a local path.
    #[arg(long)]
    pub target: Option<TargetSpec>,
    /// Directory of the shards (inside the target when --target is given).
    #[arg(short = 'd', long = "dir", default_value = "./records")]
    pub dir: String,
    /// Files the records are read from.
    #[arg(long, default_value_t = 4)]
    pub shards: usize,
    /// Size of each shard in MiB.
    #[arg(long, default_value_t = 256)]
    pub shard_mib: u64,
    /// Bytes per record read.
    #[arg(long, default_value_t = 4096)]
    pub record: usize,
    /// Records each worker reads per epoch.
    #[arg(long, default_value_t = 2000)]
    pub reads: u64,
    /// Concurrent readers.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Measured epochs.
    #[arg(long, default_value_t = 2)]
    pub epochs: u32,
    /// Drop caches before every epoch.
    #[arg(long)]
    pub cold: bool,
    /// Use the shards already there (written by an earlier run with the same flags).
    #[arg(long)]
    pub no_build: bool,
    /// Leave the shards in place at the end.
    #[arg(long)]
    pub keep: bool,
    /// Also write the report as JSON to this file ("-" for stdout instead of the table).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

impl Default for RecordsArgs {
    fn default() -> Self {
        RecordsArgs {
            target: None,
            dir: "./records".into(),
            shards: 4,
            shard_mib: 256,
            record: 4096,
            reads: 2000,
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

/// Most bytes of shards one run writes, a bound on the build.
const MAX_BYTES: u64 = 1 << 40;

impl RecordsArgs {
    /// The command that reproduces this run.
    pub fn command_line(&self) -> String {
        let mut c = format!(
            "talon-bench records -d {} --shards {} --shard-mib {} --record {} --reads {} \
             --workers {} --epochs {}",
            shell_word(&self.dir),
            self.shards,
            self.shard_mib,
            self.record,
            self.reads,
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

    /// The bytes of one shard, or why the flags ask for something this workload cannot do.
    pub fn shard_bytes(&self) -> anyhow::Result<u64> {
        if self.shards == 0 || self.workers == 0 || self.shard_mib == 0 {
            bail!("--shards, --workers and --shard-mib must be at least 1");
        }
        let bytes = self.shard_mib.saturating_mul(1 << 20);
        if bytes.saturating_mul(self.shards as u64) > MAX_BYTES {
            bail!(
                "more than {} GiB of shards is more than this harness writes",
                MAX_BYTES >> 30
            );
        }
        if self.record == 0 || self.record as u64 > bytes {
            bail!("--record must be at least 1 byte and at most a shard");
        }
        Ok(bytes)
    }
}

/// Word `i` (bytes `8i..8i+8`) of shard `shard`: splitmix64 of both, so no two words of the
/// run repeat and nothing compresses.
fn word(shard: usize, i: u64) -> u64 {
    let mut z = ((shard as u64) << 48 ^ i).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `out` with shard `shard`'s bytes from `offset` on.
pub fn fill(shard: usize, offset: u64, out: &mut [u8]) {
    for (k, b) in out.iter_mut().enumerate() {
        let at = offset + k as u64;
        *b = word(shard, at / 8).to_le_bytes()[(at % 8) as usize];
    }
}

/// True if `got` holds shard `shard`'s bytes from `offset` on.
fn matches(shard: usize, offset: u64, got: &[u8]) -> bool {
    got.chunks(8).enumerate().all(|(k, w)| {
        let at = offset + 8 * k as u64;
        // Offsets are whole words (`pick`), so each piece is a word's first bytes.
        w == &word(shard, at / 8).to_le_bytes()[..w.len()]
    })
}

/// A record's place: a shard and an 8-byte-aligned offset with room for the record.
fn pick(rng: &mut impl Rng, shards: usize, shard_bytes: u64, record: usize) -> (usize, u64) {
    let shard = rng.random_range(0..shards);
    let last = (shard_bytes - record as u64) / 8;
    (shard, 8 * rng.random_range(0..=last))
}

/// The path of shard `i` under `top`.
fn shard_path(top: &str, i: usize) -> String {
    format!("{top}/shard_{i:05}.bin")
}

/// How writing the shards went.
#[derive(Clone, Debug, Serialize)]
pub struct RecordsBuild {
    /// Seconds from the first write to the last close.
    pub seconds: f64,
    /// Megabytes (10^6 bytes) written per second.
    pub mb_per_sec: f64,
    /// Shards that failed.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
}

/// One epoch of record reads.
#[derive(Clone, Debug, Serialize)]
pub struct RecordsEpoch {
    /// Epoch number, from 1.
    pub epoch: u32,
    /// Readers.
    pub workers: usize,
    /// Whether caches were dropped before it.
    pub cold: bool,
    /// Records read.
    pub reads: u64,
    /// Seconds of the epoch.
    pub seconds: f64,
    /// Records per second.
    pub reads_per_sec: f64,
    /// Megabytes (10^6 bytes) of records per second.
    pub mb_per_sec: f64,
    /// Each read's time.
    pub latency: LatencySummary,
    /// Reads that failed or read back other bytes.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
}

/// The report of one `records` run.
#[derive(Clone, Debug, Serialize)]
pub struct RecordsReport {
    /// `"records"`.
    pub workload: &'static str,
    /// The command that reproduces the run.
    pub command: String,
    /// The target (`posix:…`, `talon:…` or `local`).
    pub target: String,
    /// The shards' directory.
    pub dir: String,
    /// Shards.
    pub shards: usize,
    /// Bytes per shard.
    pub shard_bytes: u64,
    /// Bytes per record.
    pub record: usize,
    /// The build, unless `--no-build`.
    pub build: Option<RecordsBuild>,
    /// The measured epochs.
    pub epochs: Vec<RecordsEpoch>,
    /// Failed calls over the run.
    pub errors: u64,
}

impl RecordsReport {
    /// The human-readable report.
    pub fn table(&self) -> String {
        let mut s = format!(
            "Command line used: {}\nTarget: {}  Path: {}\nShards: {} of {} MiB, records of {} bytes\n",
            self.command,
            self.target,
            self.dir,
            self.shards,
            self.shard_bytes >> 20,
            self.record
        );
        if let Some(b) = &self.build {
            s.push_str(&format!(
                "Build: {} writers, {:.2} s, {:.1} MB/s, {} errors\n",
                self.shards, b.seconds, b.mb_per_sec, b.errors
            ));
        }
        s.push('\n');
        let mut t = plain_table(&[
            "epoch", "workers", "cold", "reads", "reads/s", "MB/s", "p50 ms", "p99 ms", "errors",
        ]);
        for e in &self.epochs {
            t.add_row(vec![
                e.epoch.to_string(),
                e.workers.to_string(),
                if e.cold { "yes" } else { "no" }.to_string(),
                e.reads.to_string(),
                format!("{:.1}", e.reads_per_sec),
                format!("{:.1}", e.mb_per_sec),
                format!("{:.3}", e.latency.p50_ms),
                format!("{:.3}", e.latency.p99_ms),
                e.errors.to_string(),
            ]);
        }
        s.push_str(&render(&t));
        if self.errors > 0 {
            s.push_str(&format!("\nWARNING: {} operations failed\n", self.errors));
        }
        s
    }
}

/// Writes every shard, one writer each.
fn build(fs: &dyn Fs, top: &str, shards: usize, bytes: u64, quiet: bool) -> RecordsBuild {
    let bar = progress("write shards", shards as u64, quiet);
    let run = run_phase(shards, |i| {
        let mut o = TaskOutcome::default();
        let path = shard_path(top, i);
        let r = fs.write_file(&path, bytes, &|offset, out| fill(i, offset, out));
        o.note(&path, r);
        bar.inc(1);
        o
    });
    bar.finish_and_clear();
    let seconds = run.wall.as_secs_f64();
    let errors = run.tasks.iter().map(|(o, _)| o.errors).sum();
    RecordsBuild {
        seconds,
        mb_per_sec: (bytes * shards as u64) as f64 / 1e6 / seconds.max(1e-9),
        errors,
        first_error: run.tasks.into_iter().find_map(|(o, _)| o.first_error),
    }
}

/// One epoch of `args.reads` random records per worker.
fn epoch(fs: &dyn Fs, top: &str, args: &RecordsArgs, bytes: u64, n: u32) -> RecordsEpoch {
    let bar = progress(
        &format!("epoch {n}"),
        args.reads * args.workers as u64,
        args.quiet,
    );
    let run = run_phase(args.workers, |rank| {
        let mut o = TaskOutcome::default();
        let mut readers = Vec::with_capacity(args.shards);
        for i in 0..args.shards {
            let path = shard_path(top, i);
            // Opens are not reads: only a failed one counts, as a failed read.
            match fs.open_reader(&path) {
                Ok(r) => readers.push(r),
                Err(e) => {
                    o.note(&path, Err::<(), _>(e));
                    return o;
                }
            }
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(n) << 32 | rank as u64);
        let mut buf = vec![0u8; args.record];
        let mut ticker = Ticker::new(&bar);
        for _ in 0..args.reads {
            let (shard, offset) = pick(&mut rng, args.shards, bytes, args.record);
            let started = Instant::now();
            let got = readers[shard].read_at(offset, &mut buf).and_then(|got| {
                if got == buf.len() && matches(shard, offset, &buf) {
                    Ok(())
                } else {
                    Err(std::io::Error::other(format!(
                        "{got} bytes read, not the {} written",
                        buf.len()
                    )))
                }
            });
            let what = format!("{} at {offset}", shard_path(top, shard));
            o.note_since(&what, started, got);
            ticker.tick();
        }
        o
    });
    bar.finish_and_clear();
    let mut latency = crate::stats::Latency::new();
    let (mut reads, mut errors, mut first_error) = (0, 0, None);
    for (o, _) in run.tasks {
        latency.merge(&o.latency);
        reads += o.ops;
        errors += o.errors;
        first_error = first_error.or(o.first_error);
    }
    let seconds = run.wall.as_secs_f64().max(1e-9);
    RecordsEpoch {
        epoch: n,
        workers: args.workers,
        cold: args.cold,
        reads,
        seconds,
        reads_per_sec: reads as f64 / seconds,
        mb_per_sec: (reads * args.record as u64) as f64 / 1e6 / seconds,
        latency: latency.summary(),
        errors,
        first_error,
    }
}

/// Runs the workload as `args` asks and returns its report.
pub fn run(args: &RecordsArgs) -> anyhow::Result<RecordsReport> {
    let bytes = args.shard_bytes()?;
    let spec = args
        .target
        .clone()
        .unwrap_or_else(|| TargetSpec::Posix(PathBuf::from(".")));
    let fs = target::open(&spec)?;
    let top = target::work_dir(args.target.as_ref(), &args.dir);
    let build = if args.no_build {
        None
    } else {
        fs.mkdir_all(&top).with_context(|| format!("make {top}"))?;
        Some(build(fs.as_ref(), &top, args.shards, bytes, args.quiet))
    };
    let mut epochs = Vec::new();
    for n in 1..=args.epochs {
        if args.cold {
            fs.drop_caches().context("drop caches")?;
        }
        epochs.push(epoch(fs.as_ref(), &top, args, bytes, n));
    }
    let mut errors = build.as_ref().map_or(0, |b| b.errors);
    errors += epochs.iter().map(|e| e.errors).sum::<u64>();
    if !args.keep {
        for i in 0..args.shards {
            errors += u64::from(fs.unlink(&shard_path(&top, i)).is_err() && !args.no_build);
        }
        // Another run's files may share the directory; then it stays.
        let _ = fs.rmdir(&top);
    }
    Ok(RecordsReport {
        workload: "records",
        command: args.command_line(),
        target: target::describe(args.target.as_ref()),
        dir: top,
        shards: args.shards,
        shard_bytes: bytes,
        record: args.record,
        build,
        epochs,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every record read back is checked against the bytes its place was written with, at
    /// any offset and length; other bytes do not pass.
    #[test]
    fn records_are_checked_against_their_place() {
        let mut shard = vec![0u8; 4096];
        fill(3, 0, &mut shard);
        let mut piece = vec![0u8; 100];
        fill(3, 1000, &mut piece);
        assert_eq!(piece, shard[1000..1100]);
        assert!(matches(3, 1000, &shard[1000..1100]));
        assert!(matches(3, 8, &shard[8..13]));
        assert!(
            !matches(2, 1000, &shard[1000..1100]),
            "another shard's place"
        );
        assert!(!matches(3, 1008, &shard[1000..1100]), "another offset");
        let mut flipped = shard[1000..1100].to_vec();
        flipped[50] ^= 1;
        assert!(!matches(3, 1000, &flipped));
    }

    #[test]
    fn picks_stay_inside_a_shard_on_whole_words() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..10_000 {
            let (shard, offset) = pick(&mut rng, 3, 1 << 20, 4096);
            assert!(shard < 3 && offset % 8 == 0 && offset + 4096 <= 1 << 20);
        }
        assert_eq!(pick(&mut rng, 1, 4096, 4096), (0, 0));
    }

    #[test]
    fn impossible_shapes_are_refused() {
        let base = RecordsArgs::default();
        assert_eq!(base.shard_bytes().expect("default"), 256 << 20);
        for bad in [
            RecordsArgs {
                shards: 0,
                ..base.clone()
            },
            RecordsArgs {
                record: 0,
                ..base.clone()
            },
            RecordsArgs {
                shard_mib: 1,
                record: (1 << 20) + 1,
                ..base.clone()
            },
            RecordsArgs {
                shard_mib: u64::MAX,
                ..base.clone()
            },
        ] {
            assert!(bad.shard_bytes().is_err(), "{bad:?}");
        }
    }
}
