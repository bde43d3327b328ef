//! `checkpoint`: multi-MiB files in a strict directory, written the two ways a training job
//! writes its checkpoints: under a temporary name and renamed into place, or rewritten in
//! place (`O_TRUNC`, as `torch.save` to the same name does).
//!
//! A checkpoint is `version (8 bytes LE) ‖ body length (8) ‖ CRC32C of the body (4) ‖
//! body`, the body pseudo-random from the version, larger than the small-file threshold so
//! it is stored in chunks. Half the workers write: one operation in four by a temporary file
//! and a `rename` over the key, the others by opening the key with `truncate` (no `create`:
//! a new key would show empty until the close) and writing it whole, committed at the
//! close; a key not there yet is written by a rename. The other half read and verify,
//! every other read slowly (a pause after the first MiB, while writers replace the file or
//! rewrite it and the servers reclaim what they took out): a read whose bytes do not
//! verify is recorded as a torn read, which is an anomaly. Writes and verified reads of each
//! key form a register history that must be linearizable, which is "after a successful
//! rename or close every later open sees the new contents". Keys advance every
//! `ops_per_key` operations; readers are paced so that a key sees several writes.

use super::{classify, retry, Ctx, Outcome, Worker, WorkloadError};
use crate::history::Call;
use talon_client::{Client, Errno, MkdirOptions, OpenOptions, TalonError};

/// The directory of the checkpoints (strict by the cluster's default prefixes).
pub const DIR: &str = "/checkpoints/run";

const HEADER: usize = 20;

/// Pause before each read.
const READ_PACE: std::time::Duration = std::time::Duration::from_millis(40);

/// A slow read's pause after its first `SLOW_FIRST` bytes.
const SLOW_PAUSE: std::time::Duration = std::time::Duration::from_millis(700);

/// What a slow read reads before its pause.
const SLOW_FIRST: u64 = 1 << 20;

/// Builds checkpoint `version` of `len` body bytes.
pub fn encode(version: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + len);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(len as u64).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    // xorshift64*: cheap, and different for every version.
    let mut x = version.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < HEADER + len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        let room = HEADER + len - out.len();
        out.extend_from_slice(&v[..room.min(8)]);
    }
    let crc = crc32c::crc32c(&out[HEADER..]);
    out[16..20].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The version of a checkpoint whose bytes verify, or what is wrong with them.
pub fn verify(bytes: &[u8]) -> Result<u64, String> {
    if bytes.len() < HEADER {
        return Err(format!("{} bytes, shorter than the header", bytes.len()));
    }
    let word = |r: std::ops::Range<usize>| {
        let mut b = [0u8; 8];
        b[..r.len()].copy_from_slice(&bytes[r]);
        u64::from_le_bytes(b)
    };
    let version = word(0..8);
    let len = word(8..16);
    let crc = word(16..20) as u32;
    if len != (bytes.len() - HEADER) as u64 {
        return Err(format!(
            "version {version}: header says {len} body bytes, file has {}",
            bytes.len() - HEADER
        ));
    }
    let got = crc32c::crc32c(&bytes[HEADER..]);
    if got != crc {
        return Err(format!(
            "version {version}: body CRC32C {got:08x}, header says {crc:08x}"
        ));
    }
    Ok(version)
}

/// The checkpoint workload's state.
pub struct Checkpoint {
    ops_per_key: u64,
    size: usize,
    partition: u32,
}

impl Checkpoint {
    /// Creates the directory.
    pub async fn setup(
        ctx: &Ctx,
        ops_per_key: u64,
        size: usize,
    ) -> Result<Checkpoint, WorkloadError> {
        let attr = retry("create the checkpoint directory", 60, || {
            ctx.client.mkdir(
                DIR,
                MkdirOptions {
                    parents: true,
                    ..MkdirOptions::default()
                },
            )
        })
        .await?;
        Ok(Checkpoint {
            ops_per_key: ops_per_key.max(1),
            size,
            partition: super::strict_entries(ctx, attr.ino),
        })
    }

    /// The directory's partition (chunks spread over all of them).
    pub fn partitions(&self) -> Vec<u32> {
        vec![self.partition]
    }

    /// One worker's loop: even workers write, odd ones read.
    pub async fn work(&self, ctx: Ctx, mut w: Worker) {
        let c = &ctx.client;
        while let Some(n) = ctx.next_op() {
            let key = format!("ckpt{}", n / self.ops_per_key);
            let path = format!("{DIR}/{key}");
            if w.id.is_multiple_of(2) {
                let value = n;
                let call = Call::Write {
                    key: key.clone(),
                    value,
                };
                let bytes = encode(value, self.size);
                w.op(call.clone(), async {
                    if !value.is_multiple_of(4) {
                        match rewrite_in_place(c, &path, &bytes).await {
                            Ok(()) => return Outcome::Ok(call.clone()),
                            // Nothing was opened: write it by a rename.
                            Err(e) if classify(&e) == Some(Errno::ENOENT) => {}
                            Err(e) => return Outcome::Info(e.to_string()),
                        }
                    }
                    let tmp = format!("{DIR}/{key}.tmp.{value}");
                    if let Err(e) = c.write_file(&tmp, &bytes).await {
                        return Outcome::Fail(format!("write the temporary file: {e}"));
                    }
                    match c.rename(&tmp, &path).await {
                        Ok(()) => Outcome::Ok(call.clone()),
                        Err(e) if classify(&e) == Some(Errno::ENOENT) => {
                            Outcome::Fail(e.to_string())
                        }
                        Err(e) => Outcome::Info(e.to_string()),
                    }
                })
                .await;
            } else {
                // Readers are far faster than writers of multi-MiB files: paced, so that
                // each key sees several writes among its reads.
                tokio::time::sleep(READ_PACE).await;
                let call = Call::Read {
                    key: key.clone(),
                    value: None,
                };
                let slow = (n / 2).is_multiple_of(2);
                w.op(call, async {
                    let read = if slow {
                        read_slowly(c, &path).await
                    } else {
                        c.read_file(&path).await
                    };
                    match read {
                        Ok(bytes) => match verify(&bytes) {
                            Ok(v) => Outcome::Ok(Call::Read {
                                key: key.clone(),
                                value: Some(v),
                            }),
                            Err(detail) => Outcome::Ok(Call::Torn {
                                key: key.clone(),
                                detail,
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
            }
        }
    }
}

/// Rewrites the existing file at `path` in place: opened with `truncate` (the file is
/// emptied at the commit, with the new contents), written whole, committed at the close.
async fn rewrite_in_place(c: &Client, path: &str, bytes: &[u8]) -> Result<(), TalonError> {
    let opts = OpenOptions {
        truncate: true,
        ..OpenOptions::read_write()
    };
    let mut f = c.open(path, opts).await?;
    f.write_at(0, bytes).await?;
    f.close().await
}

/// Reads the file at `path` whole through one open, with a pause after its first MiB.
async fn read_slowly(c: &Client, path: &str) -> Result<Vec<u8>, TalonError> {
    let mut f = c.open(path, OpenOptions::read_only()).await?;
    let size = f.metadata().await?.size;
    let mut out = f.read_at(0, SLOW_FIRST.min(size)).await?;
    tokio::time::sleep(SLOW_PAUSE).await;
    let at = out.len() as u64;
    out.extend(f.read_at(at, size - at).await?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_verify_and_a_mix_of_two_does_not() {
        let a = encode(7, 100_000);
        let b = encode(8, 100_000);
        assert_eq!(verify(&a), Ok(7));
        assert_eq!(verify(&b), Ok(8));
        let mut mixed = a.clone();
        mixed[60_000..].copy_from_slice(&b[60_000..]);
        assert!(verify(&mixed).is_err());
        assert!(verify(&a[..50_000]).is_err());
        assert!(verify(&[]).is_err());
    }
}
