//! `register`: files of a strict directory used as registers.
//!
//! A register is a file whose contents are a decimal number. Workers pick the current key
//! (keys advance every `ops_per_key` operations, so each key's history stays small enough
//! to search) and read it, replace it (write a temporary file, then `rename` it over the
//! key: the rename is the linearization point), set it only if absent (`rename` with
//! NOREPLACE: EEXIST means "already set"), or delete it. Values are unique per run. The
//! history must be linearizable per key (`checker::check_registers`).
//!
//! A write that fails before its rename certainly had no effect on the key; only the
//! rename's outcome can be unknown.

use super::{classify, retry, Ctx, Outcome, Worker, WorkloadError};
use crate::history::Call;
use rand::{Rng, SeedableRng};
use talon_client::{Errno, MkdirOptions, RenameFlags};

/// The directory the registers live in (strict by the cluster's default prefixes).
pub const DIR: &str = "/control/registers";

/// The register workload's state.
pub struct Register {
    ops_per_key: u64,
    partition: u32,
}

impl Register {
    /// Creates the directory.
    pub async fn setup(ctx: &Ctx, ops_per_key: u64) -> Result<Register, WorkloadError> {
        let attr = retry("create the register directory", 60, || {
            ctx.client.mkdir(
                DIR,
                MkdirOptions {
                    parents: true,
                    ..MkdirOptions::default()
                },
            )
        })
        .await?;
        Ok(Register {
            ops_per_key: ops_per_key.max(1),
            partition: super::strict_entries(ctx, attr.ino),
        })
    }

    /// The partition holding every register.
    pub fn partitions(&self) -> Vec<u32> {
        vec![self.partition]
    }

    /// One worker's loop.
    pub async fn work(&self, ctx: Ctx, mut w: Worker) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.seed.wrapping_add(w.id));
        while let Some(n) = ctx.next_op() {
            let key = format!("r{}", n / self.ops_per_key);
            let path = format!("{DIR}/{key}");
            let value = n;
            let roll: u32 = rng.random_range(0..100);
            let c = &ctx.client;
            if roll < 50 {
                let call = Call::Read {
                    key: key.clone(),
                    value: None,
                };
                w.op(call, async {
                    match c.read_file(&path).await {
                        Ok(bytes) => match std::str::from_utf8(&bytes)
                            .ok()
                            .and_then(|s| s.parse::<u64>().ok())
                        {
                            Some(v) => Outcome::Ok(Call::Read {
                                key: key.clone(),
                                value: Some(v),
                            }),
                            None => Outcome::Ok(Call::Torn {
                                key: key.clone(),
                                detail: format!("contents {:?}", String::from_utf8_lossy(&bytes)),
                            }),
                        },
                        Err(e) if classify(&e) == Some(Errno::ENOENT) => Outcome::Ok(Call::Read {
                            key: key.clone(),
                            value: None,
                        }),
                        Err(e) => Outcome::Info(e.to_string()),
                    }
                })
                .await;
            } else if roll < 90 {
                let cas = roll >= 75;
                let call = if cas {
                    Call::Cas {
                        key: key.clone(),
                        value,
                        created: None,
                    }
                } else {
                    Call::Write {
                        key: key.clone(),
                        value,
                    }
                };
                let tmp = format!("{DIR}/{key}.tmp.{value}");
                w.op(call.clone(), async {
                    if let Err(e) = c.write_file(&tmp, value.to_string().as_bytes()).await {
                        return Outcome::Fail(format!("write the temporary file: {e}"));
                    }
                    let flags = if cas {
                        RenameFlags::NOREPLACE
                    } else {
                        RenameFlags::REPLACE
                    };
                    match c.rename_with_flags(&tmp, &path, flags).await {
                        Ok(()) if cas => Outcome::Ok(Call::Cas {
                            key: key.clone(),
                            value,
                            created: Some(true),
                        }),
                        Ok(()) => Outcome::Ok(call.clone()),
                        Err(e) if cas && classify(&e) == Some(Errno::EEXIST) => {
                            Outcome::Ok(Call::Cas {
                                key: key.clone(),
                                value,
                                created: Some(false),
                            })
                        }
                        Err(e) if classify(&e) == Some(Errno::ENOENT) => {
                            Outcome::Fail(e.to_string())
                        }
                        Err(e) => Outcome::Info(e.to_string()),
                    }
                })
                .await;
            } else {
                let call = Call::Delete {
                    key: key.clone(),
                    existed: None,
                };
                w.op(call, async {
                    match c.unlink(&path).await {
                        Ok(()) => Outcome::Ok(Call::Delete {
                            key: key.clone(),
                            existed: Some(true),
                        }),
                        Err(e) if classify(&e) == Some(Errno::ENOENT) => {
                            Outcome::Ok(Call::Delete {
                                key: key.clone(),
                                existed: Some(false),
                            })
                        }
                        Err(e) => Outcome::Info(e.to_string()),
                    }
                })
                .await;
            }
        }
    }
}
