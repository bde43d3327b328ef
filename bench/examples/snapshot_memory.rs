//! Peak resident memory of a partition snapshot, built on one replica's store and sent to
//! and installed on another's, against the data the partition holds.
//!
//! `cargo run --release -p talon-bench --example snapshot_memory -- 400` loads 400 MiB of
//! incompressible small-file bodies into a partition's store (in a temporary directory, or
//! under `$SNAPSHOT_MEMORY_DIR`), then prints the process's peak resident memory (VmHWM)
//! before and after building a snapshot, and before and after streaming it into a second
//! store and installing it there. Linux only (it reads `/proc/self/status`).

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use talon_meta::sm::{PartitionSm, SmStore};

/// A `/proc/self/status` field, in MiB.
fn status_mib(field: &str) -> anyhow::Result<u64> {
    let s = std::fs::read_to_string("/proc/self/status")?;
    let kib: u64 = s
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .ok_or_else(|| anyhow::anyhow!("no {field} in /proc/self/status"))?
        .parse()?;
    Ok(kib / 1024)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mib: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(400);
    let tmp = tempfile::tempdir()?;
    let base = std::env::var_os("SNAPSHOT_MEMORY_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let a = SmStore::open(&base.join("a"), 3, b"")?;
    // 256 KiB bodies of xorshift output: nothing for compression to shrink.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..mib * 4 {
        let mut body = vec![0u8; 256 << 10];
        for word in body.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        a.db().put(format!("Bbody{i:08}"), &body)?;
    }
    a.db().flush()?;
    println!("partition data: {mib} MiB of bodies");
    println!(
        "after loading: resident {} MiB, peak {} MiB",
        status_mib("VmRSS")?,
        status_mib("VmHWM")?
    );

    let before = status_mib("VmHWM")?;
    let mut snapshot = PartitionSm::new(a.clone())
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await?;
    let built = status_mib("VmHWM")?;
    println!("build: peak {before} -> {built} MiB (+{})", built - before);

    let b = SmStore::open(&base.join("b"), 3, b"")?;
    let mut receiver = PartitionSm::new(b);
    let mut incoming = receiver.begin_receiving_snapshot().await?;
    tokio::io::copy(&mut snapshot.snapshot, &mut *incoming).await?;
    receiver.install_snapshot(&snapshot.meta, incoming).await?;
    let installed = status_mib("VmHWM")?;
    println!(
        "send and install: peak {built} -> {installed} MiB (+{})",
        installed - built
    );
    Ok(())
}
