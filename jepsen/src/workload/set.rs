//! `set`: unique creates in a relaxed directory, whose entries spread over every partition.
//!
//! Each operation creates a new name (`e<n>`, exclusive create), through the library or,
//! for `set-fuse`, with `open(O_CREAT | O_EXCL)` on a FUSE mount of the cluster. After the
//! faults are healed, one linearizable listing (every page from the partition leaders,
//! through the library) must hold every acknowledged create and nothing never attempted
//! (`checker::check_set`).

use super::{classify, list, retry, Ctx, Outcome, Worker, WorkloadError};
use crate::history::{Call, EventType};
use std::path::{Path, PathBuf};
use talon_client::{CreateSpec, Ino, MkdirOptions};

/// The directory of the set (relaxed: not under a strict prefix).
pub const DIR: &str = "/data/set";

/// The set workload's state.
pub struct Set {
    dir: Ino,
    /// The set directory seen through a FUSE mount, for `set-fuse`.
    mounted: Option<PathBuf>,
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
        })
    }

    /// Creates files through `mnt`, a FUSE mount of the cluster, instead of the library.
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
        while let Some(n) = ctx.next_op() {
            let element = format!("e{n}");
            let call = Call::Add {
                element: element.clone(),
            };
            let c = &ctx.client;
            if let Some(dir) = &self.mounted {
                let path = dir.join(&element);
                w.op(call.clone(), async {
                    let r = tokio::task::spawn_blocking(move || {
                        std::fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .open(path)
                    })
                    .await;
                    match r {
                        Ok(Ok(_)) => Outcome::Ok(call.clone()),
                        Ok(Err(e)) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                            Outcome::Fail(e.to_string())
                        }
                        Ok(Err(e)) => Outcome::Info(e.to_string()),
                        Err(e) => Outcome::Info(e.to_string()),
                    }
                })
                .await;
                continue;
            }
            w.op(call.clone(), async {
                match c
                    .create(self.dir, element.as_bytes(), CreateSpec::file(0o644))
                    .await
                {
                    Ok(_) => Outcome::Ok(call.clone()),
                    Err(e) if classify(&e).is_some() => Outcome::Fail(e.to_string()),
                    Err(e) => Outcome::Info(e.to_string()),
                }
            })
            .await;
        }
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
