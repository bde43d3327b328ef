//! `set`: unique creates in a relaxed directory, whose entries spread over every partition,
//! each read back by the client that made it.
//!
//! An `add` creates a new name (`e<n>`, exclusive create) and writes the name into the file,
//! through the library or, for `set-fuse`, through a FUSE mount of the cluster (`open` with
//! `O_CREAT | O_EXCL`, `write`, `close`, whose answer carries the flush's). It counts as
//! done when the contents are. Half of the operations instead read back a file whose add was
//! acknowledged: a worker's own latest, or any of the run's; in one second of every three
//! all of them do (see `CYCLE_MS`). The run has one client (one
//! library handle, or one mount), so each read back is of that client's own completed
//! change, which it must see at once and forever after, in the relaxed class as in the
//! strict one, whatever the faults.
//!
//! `checker::check_set` judges both: every read back must find the file with its name in it,
//! and after the faults are healed one linearizable listing (every page from the partition
//! leaders, through the library) must hold every acknowledged add and nothing never
//! attempted.

use super::{classify, list, retry, Ctx, Outcome, Worker, WorkloadError};
use crate::history::{Call, EventType};
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;
use talon_client::{CreateSpec, Errno, Ino, MkdirOptions};

/// The directory of the set (relaxed: not under a strict prefix).
pub const DIR: &str = "/data/set";

/// Percent of operations that read a file back while workers write: half of them the
/// worker's own latest.
const READ_BACK_PERCENT: u32 = 50;

/// Workers write in the first `WRITE_MS` of every `CYCLE_MS` and only read back in the
/// rest: a client reads a partition it changed from the leader for a session window after
/// the change (twice the staleness bound), and from any replica after that, so reads back
/// late in the quiet spell go to followers when the window is shorter than the spell
/// (`--staleness-ms` below 500; at the default 2 s it never is).
const CYCLE_MS: u128 = 3000;
const WRITE_MS: u128 = 2000;

/// The set workload's state.
pub struct Set {
    dir: Ino,
    /// The set directory seen through a FUSE mount, for `set-fuse`.
    mounted: Option<PathBuf>,
    /// The elements whose add was acknowledged, in order.
    acked: Mutex<Vec<String>>,
    /// When the workload was set up: the write and quiet spells count from it.
    start: Instant,
}

impl Set {
    /// Creates the directory.
    pub async fn setup(ctx: &Ctx) -> Result<Set, WorkloadError> {
        let attr = retry("create the set directory", 60, || {
            ctx.client.mkdir(
                DIR,
                MkdirOptions {
                    parents: true,
                    ..MkdirOptions::default()
                },
            )
        })
        .await?;
        Ok(Set {
            dir: attr.ino,
            mounted: None,
            acked: Mutex::new(Vec::new()),
            start: Instant::now(),
        })
    }

    /// Creates and reads files through `mnt`, a FUSE mount of the cluster, instead of the
    /// library.
    pub fn through_mount(mut self, mnt: &Path) -> Set {
        self.mounted = Some(mnt.join(DIR.trim_start_matches('/')));
        self
    }

    /// Entries live on every partition.
    pub fn partitions(&self, ctx: &Ctx) -> Vec<u32> {
        (0..ctx.client.cluster_map().partitions).collect()
    }

    /// One worker's loop.
    pub async fn work(&self, ctx: Ctx, mut w: Worker) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.seed.wrapping_add(w.id));
        let mut latest: Option<String> = None;
        while let Some(n) = ctx.next_op() {
            let quiet = self.start.elapsed().as_millis() % CYCLE_MS >= WRITE_MS;
            let roll: u32 = rng.random_range(0..100);
            let roll = if quiet {
                roll % READ_BACK_PERCENT
            } else {
                roll
            };
            let back = if roll < READ_BACK_PERCENT / 2 {
                latest.clone()
            } else if roll < READ_BACK_PERCENT {
                self.any_acked(&mut rng)
            } else {
                None
            };
            if let Some(element) = back {
                self.read_back(&ctx, &mut w, element).await;
                continue;
            }
            let element = format!("e{n}");
            if self.add(&ctx, &mut w, &element).await == EventType::Ok {
                latest = Some(element.clone());
                self.acked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(element);
            }
        }
    }

    fn any_acked(&self, rng: &mut impl Rng) -> Option<String> {
        let acked = self.acked.lock().unwrap_or_else(|p| p.into_inner());
        if acked.is_empty() {
            return None;
        }
        Some(acked[rng.random_range(0..acked.len())].clone())
    }

    /// Creates `element` and writes its name into it.
    async fn add(&self, ctx: &Ctx, w: &mut Worker, element: &str) -> EventType {
        let call = Call::Add {
            element: element.to_string(),
        };
        if let Some(dir) = &self.mounted {
            let path = dir.join(element);
            let body = element.as_bytes().to_vec();
            return w
                .op(call.clone(), async {
                    match blocking(move || create_through_mount(&path, &body)).await {
                        Ok(()) => Outcome::Ok(call.clone()),
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                            Outcome::Fail(e.to_string())
                        }
                        Err(e) => Outcome::Info(e.to_string()),
                    }
                })
                .await;
        }
        let c = &ctx.client;
        w.op(call.clone(), async {
            let attr = match c
                .create(self.dir, element.as_bytes(), CreateSpec::file(0o644))
                .await
            {
                Ok(attr) => attr,
                Err(e) if classify(&e).is_some() => return Outcome::Fail(e.to_string()),
                Err(e) => return Outcome::Info(e.to_string()),
            };
            match c.write_file_ino(attr.ino, element.as_bytes()).await {
                Ok(_) => Outcome::Ok(call.clone()),
                Err(e) => Outcome::Info(format!("created, then writing failed: {e}")),
            }
        })
        .await
    }

    /// Reads the whole of `element` back.
    async fn read_back(&self, ctx: &Ctx, w: &mut Worker, element: String) {
        let call = Call::ReadBack {
            element: element.clone(),
            body: None,
        };
        let found = |body: Option<Vec<u8>>| {
            Outcome::Ok(Call::ReadBack {
                element: element.clone(),
                body: body.map(|b| String::from_utf8_lossy(&b).into_owned()),
            })
        };
        if let Some(dir) = &self.mounted {
            let path = dir.join(&element);
            w.op(call, async {
                match blocking(move || std::fs::read(path)).await {
                    Ok(body) => found(Some(body)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => found(None),
                    Err(e) => Outcome::Info(e.to_string()),
                }
            })
            .await;
            return;
        }
        let path = format!("{DIR}/{element}");
        w.op(call, async {
            match ctx.client.read_file(&path).await {
                Ok(body) => found(Some(body)),
                Err(e) if classify(&e) == Some(Errno::ENOENT) => found(None),
                Err(e) => Outcome::Info(e.to_string()),
            }
        })
        .await;
    }

    /// The final listing, tried until it succeeds (bounded).
    pub async fn finish(&self, ctx: &Ctx, secs: u64) -> Result<(), WorkloadError> {
        let p = u64::MAX - 1;
        ctx.rec
            .record(p, EventType::Invoke, Call::ReadSet { elements: None }, None);
        match retry("list the set", secs, || list(&ctx.client, DIR)).await {
            Ok(names) => {
                ctx.rec.record(
                    p,
                    EventType::Ok,
                    Call::ReadSet {
                        elements: Some(names),
                    },
                    None,
                );
                Ok(())
            }
            Err(e) => {
                ctx.rec.record(
                    p,
                    EventType::Fail,
                    Call::ReadSet { elements: None },
                    Some(e.to_string()),
                );
                Err(e)
            }
        }
    }
}

/// Runs blocking file system calls off the runtime's worker threads; a panicked task is an
/// error like any other.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

/// `open(O_CREAT | O_EXCL)`, `write`, `close` of a file through the mount. The close is
/// explicit because on FUSE it carries the flush's answer, which dropping the file discards.
fn create_through_mount(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    f.write_all(body)?;
    nix::unistd::close(f).map_err(std::io::Error::from)
}
