//! `checkpoint`: multi-MiB files written under a temporary name and renamed into place in a
//! strict directory, the pattern a training job uses for its checkpoints.
//!
//! A checkpoint is `version (8 bytes LE) ‖ body length (8) ‖ CRC32C of the body (4) ‖
//! body`, the body pseudo-random from the version, larger than the small-file threshold so
//! it is stored in chunks. Half the workers write (temporary file, then `rename` over the
//! key), half read and verify: a read whose bytes do not verify is recorded as a torn read,
//! which is an anomaly. Writes and verified reads of each key form a register history that
//! must be linearizable, which is "after a successful rename every later open sees the new
//! contents". Keys advance every `ops_per_key` operations; readers are paced so that a key
//! sees several writes.

use super::{classify, retry, Ctx, Outcome, Worker, WorkloadError};
use crate::history::Call;
use talon_client::{Errno, MkdirOptions};

/// The directory of the checkpoints (strict by the cluster's default prefixes).
pub const DIR: &str = "/checkpoints/run";

const HEADER: usize = 20;

/// Pause before each read.
const READ_PACE: std::time::Duration = std::time::Duration::from_millis(40);

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
                let tmp = format!("{DIR}/{key}.tmp.{value}");
                let bytes = encode(value, self.size);
                w.op(call.clone(), async {
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
                w.op(call, async {
                    match c.read_file(&path).await {
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
