//! What other clients see of a File's changes: nothing before its commit, everything after
//! (close-to-open), and never a mix: a reader that opened before a commit reads the old
//! contents whole, one that opens after reads the new ones whole.

mod common;

use common::Fixture;
use talon_client::{MkdirOptions, OpenOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn filled(byte: u8, len: usize) -> Vec<u8> {
    vec![byte; len]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_see_old_or_new_contents_whole() {
    // A small chunk size: the file spans many chunks, written while readers read.
    let fx = Fixture::start_with(1, |b| b.file_sizes(16 << 10, 64 << 10)).await;
    let c = &fx.client;
    let reader = fx.other_client().await;
    c.mkdir("/v", MkdirOptions::default()).await.expect("mkdir");
    for (round, len) in [(1u8, 10_000usize), (2, 3 << 20), (3, 5_000), (4, 1 << 20)] {
        let old = reader.read_file("/v/f").await.unwrap_or_default();
        let old_byte = old.first().copied();
        // A reader opened before the commit.
        let mut early = reader.open("/v/f", OpenOptions::read_only()).await.ok();
        let mut w = c
            .open("/v/f", OpenOptions::create_truncate())
            .await
            .expect("open for writing");
        let new = filled(round, len);
        for part in new.chunks(50_000) {
            w.write_all(part).await.expect("write");
        }
        // Not committed yet: others still see the old contents.
        assert_eq!(reader.read_file("/v/f").await.unwrap_or_default(), old);
        w.close().await.expect("commit");
        if let Some(f) = early.as_mut() {
            let mut seen = Vec::new();
            f.read_to_end(&mut seen).await.expect("early reader reads");
            assert_eq!(
                seen.len(),
                old.len(),
                "round {round}: early reader sees the old size"
            );
            assert!(
                seen.iter().all(|b| Some(*b) == old_byte),
                "round {round}: early reader sees only old bytes"
            );
        }
        // Close-to-open: a later open sees the new contents, whole.
        let mut late = reader
            .open("/v/f", OpenOptions::read_only())
            .await
            .expect("open");
        let mut seen = Vec::new();
        late.read_to_end(&mut seen).await.expect("read");
        assert!(
            seen == new,
            "round {round}: a later open sees the new contents"
        );
    }
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_whole_file_reads_never_mix_versions() {
    let fx = Fixture::start_with(1, |b| b.file_sizes(16 << 10, 64 << 10)).await;
    let c = fx.client.clone();
    let reader = fx.other_client().await;
    c.mkdir("/w", MkdirOptions::default()).await.expect("mkdir");
    c.write_file("/w/f", &filled(0, 400_000))
        .await
        .expect("write");
    let writer = tokio::spawn(async move {
        for v in 1..=20u8 {
            let len = if v % 2 == 0 { 400_000 } else { 9_000 };
            c.write_file("/w/f", &filled(v, len))
                .await
                .expect("rewrite");
        }
    });
    let mut reads = 0;
    while !writer.is_finished() || reads == 0 {
        let seen = reader.read_file("/w/f").await.expect("read");
        let b = seen[0];
        let want = if b % 2 == 0 { 400_000 } else { 9_000 };
        assert_eq!(seen.len(), want, "a version's size");
        assert!(seen.iter().all(|x| *x == b), "one version's bytes only");
        reads += 1;
    }
    writer.await.expect("writer");
    println!("{reads} whole reads during 20 rewrites");
    fx.shutdown().await;
}
