//! Batch operations: bulk creates spread over every partition of a relaxed directory, then
//! listed back through the pager; and lookups / getattrs in input order with per-op errors.

mod common;

use common::{bulk_options, connect_with, errno, Fixture};
use std::collections::BTreeSet;
use std::time::Instant;
use talon_client::{Class, CreateSpec, Errno, MkdirOptions};
use talon_model::placement::entry_partition;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_thousand_creates_spread_over_every_partition() {
    const N: usize = 200_000;
    let fx = Fixture::start(1).await;
    let c = &connect_with(&fx.cluster, bulk_options()).await;
    let dir = c
        .mkdir("/imagenet", MkdirOptions::default())
        .await
        .expect("mkdir");
    assert_eq!(dir.class, Class::Relaxed);
    let parts = c.cluster_map().partitions;

    let names: Vec<Vec<u8>> = (0..N)
        .map(|i| format!("n{i:08}.JPEG").into_bytes())
        .collect();
    let specs = names
        .iter()
        .map(|n| (n.clone(), CreateSpec::file(0o644)))
        .collect();
    let t = Instant::now();
    let results = c.create_batch(dir.ino, specs).await;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "create_batch: {N} files in {secs:.1} s ({:.0}/s)",
        N as f64 / secs
    );
    assert_eq!(results.len(), N);
    for (i, r) in results.iter().enumerate() {
        let a = r
            .as_ref()
            .unwrap_or_else(|e| panic!("create {i} failed: {e}"));
        // Inodes are created on the entry's partition.
        let p = entry_partition(dir.ino, &names[i], Class::Relaxed, parts);
        assert_eq!(a.ino.home(), p, "inode of {i} is co-located with its entry");
    }

    // List everything back, in bounded pages; count per partition.
    let mut per_partition = vec![0u64; parts as usize];
    let mut seen = 0usize;
    let mut pager = c
        .read_dir("/imagenet")
        .await
        .expect("read_dir")
        .linearizable(true);
    let mut largest_page = 0;
    while let Some(page) = pager.next_page().await.expect("page") {
        largest_page = largest_page.max(page.len());
        for e in page {
            per_partition[entry_partition(dir.ino, &e.name, Class::Relaxed, parts) as usize] += 1;
            seen += 1;
        }
    }
    println!("entries per partition: {per_partition:?}");
    assert_eq!(seen, N, "every created entry is listed once");
    assert!(largest_page <= c.cluster_map().max_batch as usize);
    let mean = N as u64 / parts as u64;
    for (p, n) in per_partition.iter().enumerate() {
        assert!(
            *n > mean * 3 / 4 && *n < mean * 5 / 4,
            "partition {p} holds {n} (mean {mean})"
        );
    }
    // The servers agree on where the entries are.
    let status = c.status().await;
    let held: u64 = status
        .iter()
        .flat_map(|n| n.partitions.as_ref().expect("status").iter())
        .map(|p| p.entries)
        .sum();
    assert!(held >= N as u64, "partitions report {held} entries");
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_answer_in_input_order_with_per_op_errors() {
    let fx = Fixture::start(3).await;
    let c = &fx.client;
    let dir = c.mkdir("/b", MkdirOptions::default()).await.expect("mkdir");
    c.create_file("/b/exists", 0o644).await.expect("create");
    let mut specs: Vec<(Vec<u8>, CreateSpec)> = (0..3000)
        .map(|i| (format!("f{i}").into_bytes(), CreateSpec::file(0o644)))
        .collect();
    specs.push((b"exists".to_vec(), CreateSpec::file(0o644)));
    specs.push((b"bad/name".to_vec(), CreateSpec::file(0o644)));
    specs.push((b"f0".to_vec(), CreateSpec::file(0o644)));
    let mut r = c.create_batch(dir.ino, specs).await;
    assert_eq!(r.len(), 3003);
    // A duplicate within the batch: the two creates of f0 are merged into one proposal in
    // either order, and exactly one of them wins.
    assert!(
        r[0].is_ok() != r[3002].is_ok(),
        "exactly one create of f0 succeeds: {:?} / {:?}",
        r[0],
        r[3002]
    );
    let loser = if r[0].is_ok() { 3002 } else { 0 };
    assert_eq!(errno(r[loser].clone()), Errno::EEXIST);
    if loser == 0 {
        r.swap(0, 3002);
    }
    let inos: Vec<_> = r[..3000]
        .iter()
        .map(|a| a.as_ref().expect("created").ino)
        .collect();
    assert_eq!(
        inos.iter().collect::<BTreeSet<_>>().len(),
        3000,
        "distinct inodes"
    );
    assert_eq!(errno(r[3000].clone()), Errno::EEXIST);
    assert_eq!(errno(r[3001].clone()), Errno::EINVAL);

    let mut names: Vec<Vec<u8>> = (0..3000).map(|i| format!("f{i}").into_bytes()).collect();
    names.push(b"missing".to_vec());
    let looked = c.lookup_batch(dir.ino, names).await;
    for (i, l) in looked[..3000].iter().enumerate() {
        assert_eq!(
            l.as_ref().expect("lookup").ino,
            inos[i],
            "result {i} in input order"
        );
    }
    assert_eq!(errno(looked[3000].clone()), Errno::ENOENT);

    let got = c.getattr_batch(&inos).await;
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.as_ref().expect("getattr").ino, inos[i]);
    }
    fx.shutdown().await;
}
