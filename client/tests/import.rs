//! Bulk import: a local class-per-directory tree of 100,000 small files loaded through
//! `Client::import` (batched creates, concurrent small writes), then every file read back
//! in random order and compared; and a re-import over an existing tree.

mod common;

use common::{bulk_options, connect_with, Fixture};
use futures::stream::{self, StreamExt};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::time::Instant;
use talon_client::{ImportOptions, ImportProgress};

/// Contents of file `i`: 1-4 KiB, derived from `i`.
fn body(i: usize) -> Vec<u8> {
    let len = 1024 + (i * 7919) % 3072;
    talon_testkit::pattern(i as u64 + 1, len)
}

/// Writes `n` files into `classes` directories under `root`; returns their relative paths.
fn make_tree(root: &Path, classes: usize, n: usize) -> Vec<String> {
    let mut rels = Vec::with_capacity(n);
    for c in 0..classes {
        std::fs::create_dir_all(root.join(format!("n{c:08}"))).expect("mkdir local");
    }
    for i in 0..n {
        let rel = format!("n{:08}/img_{i:07}.JPEG", i % classes);
        std::fs::write(root.join(&rel), body(i)).expect("write local");
        rels.push(rel);
    }
    rels
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_small_files_import_and_read_back() {
    const N: usize = 100_000;
    let local = tempfile::tempdir().expect("tempdir");
    let t = Instant::now();
    let rels = make_tree(local.path(), 100, N);
    println!("local tree: {:.1} s", t.elapsed().as_secs_f64());

    let fx = Fixture::start(1).await;
    let c = &connect_with(&fx.cluster, bulk_options()).await;
    let progress = ImportProgress::default();
    let summary = c
        .import(
            local.path(),
            "/data/train",
            &ImportOptions::default(),
            &progress,
        )
        .await
        .expect("import");
    println!("import: {summary}");
    assert_eq!(summary.failed, 0, "failures: {:?}", summary.failures);
    assert_eq!(summary.files, N as u64);
    assert_eq!(summary.dirs, 101, "the destination and 100 classes");
    let want_bytes: usize = (0..N).map(|i| body(i).len()).sum();
    assert_eq!(summary.bytes, want_bytes as u64);

    let mut order: Vec<usize> = (0..N).collect();
    order.shuffle(&mut StdRng::seed_from_u64(7));
    let t = Instant::now();
    let bad = stream::iter(order)
        .map(|i| {
            let path = format!("/data/train/{}", rels[i]);
            async move {
                let got = c.read_file(&path).await.expect("read_file");
                (got != body(i)).then_some(i)
            }
        })
        .buffer_unordered(32)
        .filter_map(|b| async move { b })
        .collect::<Vec<_>>()
        .await;
    println!(
        "read back {N} files in random order: {:.0} files/s",
        N as f64 / t.elapsed().as_secs_f64()
    );
    assert!(
        bad.is_empty(),
        "{} files differ, e.g. {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reimport_overwrites_and_keeps_going_past_failures() {
    let local = tempfile::tempdir().expect("tempdir");
    let rels = make_tree(local.path(), 3, 30);
    // One file above the threshold: streamed through a File.
    let big: Vec<u8> = (0..(3 << 20)).map(|_| rand::rng().random()).collect();
    std::fs::write(local.path().join("n00000000/big.bin"), &big).expect("write big");
    std::os::unix::fs::symlink("big.bin", local.path().join("n00000000/link")).expect("symlink");

    let fx = Fixture::start(1).await;
    let c = &fx.client;
    let opts = ImportOptions {
        batch: 7,
        ..ImportOptions::default()
    };
    let s = c
        .import(local.path(), "/ds", &opts, &ImportProgress::default())
        .await
        .expect("import");
    assert_eq!(
        (s.files, s.failed),
        (32, 0),
        "30 files, one big file, one symlink"
    );
    assert_eq!(
        c.read_file("/ds/n00000000/big.bin").await.expect("big"),
        big
    );
    assert_eq!(c.read_file("/ds/n00000000/link").await.expect("link"), big);

    // Change a file locally and import again: it is overwritten, nothing fails.
    std::fs::write(local.path().join(&rels[4]), b"changed").expect("rewrite");
    let s = c
        .import(local.path(), "/ds", &opts, &ImportProgress::default())
        .await
        .expect("re-import");
    assert_eq!(s.failed, 0, "{:?}", s.failures);
    assert_eq!(
        c.read_file(format!("/ds/{}", rels[4])).await.expect("read"),
        b"changed"
    );

    // A destination that is a file cannot take a tree.
    c.write_file("/plain", b"x").await.expect("write");
    assert!(c
        .import(local.path(), "/plain", &opts, &ImportProgress::default())
        .await
        .is_err());
    fx.shutdown().await;
}
