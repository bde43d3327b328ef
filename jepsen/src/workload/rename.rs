//! `rename`: files moved back and forth between two strict directories whose entries live
//! on different partitions, so every move is a two-phase commit.
//!
//! Set-up creates `files` files in directory `a` (recorded as acknowledged `Add`s). Workers
//! pick a file and a direction and rename it with NOREPLACE (ENOENT: it is on the other
//! side; a definite failure). One worker instead lists `a` then `b`. After the faults are
//! healed and in-doubt transactions have had time to resolve, a final listing must show
//! every file exactly once (`checker::check_renames`).

use super::{classify, list, mkdir, retry, Ctx, Outcome, Worker, WorkloadError};
use crate::history::{Call, EventType};
use rand::{Rng, SeedableRng};
use std::time::Duration;
use talon_client::{CreateSpec, Errno, Ino, RenameFlags};

/// Parent of the two directories (strict by the cluster's default prefixes).
pub const ROOT: &str = "/control/rename";

/// The rename workload's state.
pub struct Rename {
    a: String,
    b: String,
    files: u64,
    partitions: Vec<u32>,
}

impl Rename {
    /// Creates the directories (on two partitions) and the files.
    pub async fn setup(ctx: &Ctx, files: u64) -> Result<Rename, WorkloadError> {
        let part = |ino: Ino| super::strict_entries(ctx, ino);
        let a = format!("{ROOT}/a");
        let pa = part(mkdir(ctx, &a).await?);
        // The second directory's partition depends on its inode: try names until it differs
        // (with one partition there is nothing to find; the first name is kept).
        let mut b = format!("{ROOT}/b0");
        let mut pb = part(mkdir(ctx, &b).await?);
        for i in 1..32 {
            if pb != pa || ctx.client.cluster_map().partitions == 1 {
                break;
            }
            b = format!("{ROOT}/b{i}");
            pb = part(mkdir(ctx, &b).await?);
        }
        let dir_a = ctx
            .client
            .stat(&a)
            .await
            .map_err(|e| WorkloadError::Timeout {
                what: format!("stat {a}"),
                secs: 0,
                last: e.to_string(),
            })?;
        for i in 0..files {
            let name = format!("f{i}");
            let call = Call::Add {
                element: name.clone(),
            };
            let proc_ = u64::MAX - 2;
            ctx.rec.record(proc_, EventType::Invoke, call.clone(), None);
            retry(&format!("create {a}/{name}"), 60, || async {
                match ctx
                    .client
                    .create(dir_a.ino, name.as_bytes(), CreateSpec::file(0o644))
                    .await
                {
                    Err(e) if classify(&e) == Some(Errno::EEXIST) => Ok(()),
                    r => r.map(|_| ()),
                }
            })
            .await?;
            ctx.rec.record(proc_, EventType::Ok, call, None);
        }
        Ok(Rename {
            a,
            b,
            files,
            partitions: vec![pa, pb],
        })
    }

    /// The two directories' partitions.
    pub fn partitions(&self) -> Vec<u32> {
        self.partitions.clone()
    }

    /// One worker's loop: worker 0 lists, the others move files.
    pub async fn work(&self, ctx: Ctx, mut w: Worker) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.seed.wrapping_add(w.id));
        let c = &ctx.client;
        while ctx.next_op().is_some() {
            if w.id == 0 {
                self.list(&mut w, &ctx, false).await;
                continue;
            }
            let file = format!("f{}", rng.random_range(0..self.files));
            let (from, to, src, dst) = if rng.random_bool(0.5) {
                ("a", "b", &self.a, &self.b)
            } else {
                ("b", "a", &self.b, &self.a)
            };
            let call = Call::Move {
                file: file.clone(),
                from: from.into(),
                to: to.into(),
            };
            w.op(call.clone(), async {
                match c
                    .rename_with_flags(
                        format!("{src}/{file}"),
                        format!("{dst}/{file}"),
                        RenameFlags::NOREPLACE,
                    )
                    .await
                {
                    Ok(()) => Outcome::Ok(call.clone()),
                    Err(e) if classify(&e).is_some() => Outcome::Fail(e.to_string()),
                    Err(e) => Outcome::Info(e.to_string()),
                }
            })
            .await;
        }
    }

    async fn list(&self, w: &mut Worker, ctx: &Ctx, last: bool) -> EventType {
        let c = &ctx.client;
        let call = Call::List {
            last,
            a: None,
            b: None,
        };
        w.op(call, async {
            let a = match list(c, &self.a).await {
                Ok(a) => a,
                Err(e) => return Outcome::Fail(format!("list a: {e}")),
            };
            let b = match list(c, &self.b).await {
                Ok(b) => b,
                Err(e) => return Outcome::Fail(format!("list b: {e}")),
            };
            Outcome::Ok(Call::List {
                last,
                a: Some(a),
                b: Some(b),
            })
        })
        .await
    }

    /// The final listing: tried until two listings in a row agree and one succeeds
    /// (bounded by `secs`), after a pause for in-doubt transactions to resolve.
    pub async fn finish(&self, ctx: &Ctx, secs: u64) -> Result<(), WorkloadError> {
        tokio::time::sleep(Duration::from_secs(4)).await;
        let until = std::time::Instant::now() + Duration::from_secs(secs);
        let mut prev: Option<(Vec<String>, Vec<String>)> = None;
        let mut last = String::from("no listing succeeded");
        while std::time::Instant::now() < until {
            let now = async {
                let mut a = list(&ctx.client, &self.a).await?;
                let mut b = list(&ctx.client, &self.b).await?;
                a.sort();
                b.sort();
                Ok::<_, talon_client::TalonError>((a, b))
            }
            .await;
            match now {
                Ok(now) if prev.as_ref() == Some(&now) => {
                    let p = u64::MAX - 1;
                    let (a, b) = now;
                    ctx.rec.record(
                        p,
                        EventType::Invoke,
                        Call::List {
                            last: true,
                            a: None,
                            b: None,
                        },
                        None,
                    );
                    ctx.rec.record(
                        p,
                        EventType::Ok,
                        Call::List {
                            last: true,
                            a: Some(a),
                            b: Some(b),
                        },
                        None,
                    );
                    return Ok(());
                }
                Ok(now) => prev = Some(now),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(WorkloadError::Timeout {
            what: "the final listing".into(),
            secs,
            last,
        })
    }
}
