//! `links`: hard links made and removed across partitions, checked against the link count.
//!
//! A bank-style invariant that spans partitions: a file's link count lives with its inode
//! on the partition of its home directory, and each of its extra names in a strict link
//! directory whose entries live on another partition, so every `link` and `unlink` of such
//! a name is a two-phase commit that must move the count and the entry together.
//!
//! Each file (a key; keys advance every `ops_per_key` operations, as in `register`) is
//! created in the home directory under its key and never removed there. It has
//! [`SLOTS`] link names, two in each of three link directories. Workers read the count
//! (a strict getattr), make a link (`link`: EEXIST means the name was there) or remove one
//! (`unlink`: ENOENT means it was not). The history must be linearizable per file against
//! `checker::LinkedFile`: every count read is one plus the links held at some moment
//! within the read. A count that lags or leads its entries (a commit applied on one
//! partition and not the other, a decision lost in a crash) is rejected.

use super::{classify, mkdir, Ctx, Outcome, Worker, WorkloadError};
use crate::history::Call;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use talon_client::{Errno, Ino};

/// Parent of the home and link directories (strict by the cluster's default prefixes).
pub const ROOT: &str = "/control/links";

/// Link directories.
const LINK_DIRS: u8 = 3;

/// Link names per file: two in each link directory.
pub const SLOTS: u8 = 2 * LINK_DIRS;

/// The links workload's state.
pub struct Links {
    home: String,
    /// Each link directory's path and inode.
    dirs: Vec<(String, Ino)>,
    ops_per_key: u64,
    partitions: Vec<u32>,
}

impl Links {
    /// Creates the home directory and three link directories, each on a partition of its
    /// own where the cluster has enough.
    pub async fn setup(ctx: &Ctx, ops_per_key: u64) -> Result<Links, WorkloadError> {
        let part = |ino: Ino| super::strict_entries(ctx, ino);
        let home = format!("{ROOT}/home");
        let mut partitions = vec![part(mkdir(ctx, &home).await?)];
        let mut dirs = Vec::new();
        // A directory's partition depends on its inode: try names until each link
        // directory's differs from those chosen (or the names run out: fewer partitions).
        for i in 0..64 {
            if dirs.len() == usize::from(LINK_DIRS) {
                break;
            }
            let path = format!("{ROOT}/l{i}");
            let ino = mkdir(ctx, &path).await?;
            let left = usize::from(LINK_DIRS) - dirs.len();
            if !partitions.contains(&part(ino)) || 64 - i <= left {
                partitions.push(part(ino));
                dirs.push((path, ino));
            }
        }
        partitions.sort_unstable();
        partitions.dedup();
        Ok(Links {
            home,
            dirs,
            ops_per_key: ops_per_key.max(1),
            partitions,
        })
    }

    /// The partitions of the home and link directories.
    pub fn partitions(&self) -> Vec<u32> {
        self.partitions.clone()
    }

    /// Link `slot`'s directory and name for file `key`.
    fn slot(&self, key: &str, slot: u8) -> (&str, Ino, String) {
        let (dir, ino) = &self.dirs[usize::from(slot / 2) % self.dirs.len()];
        (dir, *ino, format!("{key}.{slot}"))
    }

    /// One worker's loop.
    pub async fn work(&self, ctx: Ctx, mut w: Worker) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.seed.wrapping_add(w.id));
        let c = &ctx.client;
        // Inodes of the files this worker has seen, by key.
        let mut files: HashMap<String, Ino> = HashMap::new();
        while let Some(n) = ctx.next_op() {
            let key = format!("f{}", n / self.ops_per_key);
            // The file exists before any operation on it is invoked; creating it is not
            // part of the history (it is never removed, so it cannot be done twice).
            let ino = match files.get(&key) {
                Some(ino) => *ino,
                None => match c.create_file(format!("{}/{key}", self.home), 0o644).await {
                    Ok(a) => {
                        files.insert(key.clone(), a.ino);
                        a.ino
                    }
                    Err(_) => continue,
                },
            };
            let roll: u32 = rng.random_range(0..100);
            let slot = rng.random_range(0..SLOTS);
            if roll < 40 {
                let call = Call::Nlink {
                    key: key.clone(),
                    nlink: None,
                };
                w.op(call, async {
                    match c.getattr(ino).await {
                        Ok(a) => Outcome::Ok(Call::Nlink {
                            key: key.clone(),
                            nlink: Some(a.nlink),
                        }),
                        Err(e) => Outcome::Info(e.to_string()),
                    }
                })
                .await;
            } else if roll < 75 {
                let (_, dir, name) = self.slot(&key, slot);
                let call = Call::Link {
                    key: key.clone(),
                    slot,
                    created: None,
                };
                w.op(call, async {
                    let created = match c.link(ino, dir, name.as_bytes()).await {
                        Ok(_) => true,
                        Err(e) if classify(&e) == Some(Errno::EEXIST) => false,
                        Err(e) => return Outcome::Info(e.to_string()),
                    };
                    Outcome::Ok(Call::Link {
                        key: key.clone(),
                        slot,
                        created: Some(created),
                    })
                })
                .await;
            } else {
                let (dir, _, name) = self.slot(&key, slot);
                let call = Call::Unlink {
                    key: key.clone(),
                    slot,
                    existed: None,
                };
                w.op(call, async {
                    let existed = match c.unlink(format!("{dir}/{name}")).await {
                        Ok(()) => true,
                        Err(e) if classify(&e) == Some(Errno::ENOENT) => false,
                        Err(e) => return Outcome::Info(e.to_string()),
                    };
                    Outcome::Ok(Call::Unlink {
                        key: key.clone(),
                        slot,
                        existed: Some(existed),
                    })
                })
                .await;
            }
        }
    }
}
