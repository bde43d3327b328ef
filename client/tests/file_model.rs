//! Random positioned writes, appends and truncates on one `File`, checked against an
//! in-memory model after every op, with commits and reopenings in between. A small
//! threshold and chunk size make the file cross the small/chunked boundary often.

mod common;

use common::Fixture;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use talon_client::{MkdirOptions, OpenOptions};

const SMALL_MAX: u32 = 8192;
const CHUNK: u32 = 4096;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_ops_match_a_model() {
    let fx = Fixture::start_with(1, |b| b.file_sizes(SMALL_MAX, CHUNK)).await;
    let c = &fx.client;
    let other = fx.other_client().await;
    assert_eq!(c.cluster_map().chunk_size, CHUNK);
    c.mkdir("/m", MkdirOptions::default()).await.expect("mkdir");
    let seed = std::env::var("TALON_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7a10_u64);
    println!("seed {seed} (set TALON_SEED to replay)");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model: Vec<u8> = Vec::new();
    let mut committed: Vec<u8> = Vec::new();
    let mut f = c
        .open("/m/f", OpenOptions::create_truncate())
        .await
        .expect("open");
    for step in 0..400 {
        let size = model.len() as u64;
        let what = rng.random_range(0..100);
        let desc;
        if what < 45 {
            let off = rng.random_range(0..=size + 3000);
            let len = rng.random_range(1..6000usize);
            let data: Vec<u8> = (0..len).map(|_| rng.random_range(1..=255u8)).collect();
            f.write_at(off, &data).await.expect("write_at");
            let end = off as usize + len;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].copy_from_slice(&data);
            desc = format!("write {len} at {off}");
        } else if what < 60 {
            let len = rng.random_range(1..3000usize);
            let data: Vec<u8> = (0..len).map(|_| rng.random_range(1..=255u8)).collect();
            f.write_at(size, &data).await.expect("append");
            model.extend_from_slice(&data);
            desc = format!("append {len}");
        } else if what < 75 {
            let to = match rng.random_range(0..4) {
                0 => 0,
                1 => rng.random_range(0..=size),
                _ => rng.random_range(0..=size + 20_000),
            };
            f.set_len(to).await.expect("set_len");
            model.resize(to as usize, 0);
            desc = format!("set_len {to}");
        } else if what < 90 {
            f.flush().await.expect("commit");
            committed = model.clone();
            desc = "commit".into();
        } else {
            f.close().await.expect("close");
            committed = model.clone();
            f = c
                .open("/m/f", OpenOptions::read_write())
                .await
                .expect("reopen");
            desc = "reopen".into();
        }
        // The File sees its own changes.
        assert_eq!(
            f.len().await.expect("len"),
            model.len() as u64,
            "step {step}: {desc}"
        );
        let off = rng.random_range(0..=model.len() as u64);
        let len = rng.random_range(0..10_000u64);
        let got = f.read_at(off, len).await.expect("read_at");
        let end = (off + len).min(model.len() as u64) as usize;
        assert!(
            got == model[off as usize..end],
            "step {step} ({desc}): read {len} at {off} differs from the model"
        );
        // Others see exactly the last commit.
        if step % 10 == 0 || desc == "commit" {
            let seen = other.read_file("/m/f").await.expect("read_file");
            assert!(
                seen == committed,
                "step {step} ({desc}): committed contents differ"
            );
        }
    }
    f.close().await.expect("close");
    assert_eq!(other.read_file("/m/f").await.expect("final read"), model);
    fx.shutdown().await;
}
