//! Cross-partition rename is atomic: under concurrent renames, every file is reachable
//! under exactly one name at every instant a reader can observe.
//!
//! Two kinds of files, in two relaxed directories whose entries land on different
//! partitions:
//! - "solo" files are moved back and forth by one renamer each, which publishes a sequence
//!   number (odd while a rename is in flight). A checker samples the sequence, looks both
//!   names up, and samples again; if nothing changed, it knows where the file must be (or
//!   which single rename was in flight) and checks:
//!   * quiescent: exactly the expected name exists, pointing at the file's ino;
//!   * in flight, destination read first: never both names present;
//!   * in flight, source read first: never neither name present.
//! - "contested" files are renamed by three racing tasks at once; in quiescent rounds every
//!   contested file must exist under exactly one of its two names with its original ino.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use talon_client::Client;
use talon_model::placement::entry_partition;
use talon_model::{Class, Errno, Ino};

const SOLO: usize = 6;
const CONTESTED: usize = 6;
/// Consistent samples of solo files the checker must take.
const MIN_CHECKS: u64 = 100;

fn names(i: usize) -> (Vec<u8>, Vec<u8>) {
    (
        format!("file-{i}").into_bytes(),
        format!("moved-{i}").into_bytes(),
    )
}

async fn exists(c: &Client, dir: Ino, name: &[u8]) -> Option<Ino> {
    match c.lookup(dir, name).await {
        Ok(a) => Some(a.ino),
        Err(e) if e.errno() == Errno::ENOENT => None,
        Err(e) => panic!("lookup failed: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cross_partition_rename_is_atomic_under_concurrency() {
    let (cluster, c) = common::cluster(3, 8).await;
    let a = c
        .mkdir("/a", Default::default())
        .await
        .expect("mkdir /a")
        .ino;
    let b = c
        .mkdir("/b", Default::default())
        .await
        .expect("mkdir /b")
        .ino;

    let mut inos = Vec::new();
    let mut cross = 0;
    for i in 0..SOLO + CONTESTED {
        let (n1, n2) = names(i);
        let attr = c
            .create(a, &n1, talon_client::CreateSpec::file(0o644))
            .await
            .expect("create");
        inos.push(attr.ino);
        if entry_partition(a, &n1, Class::Relaxed, 8) != entry_partition(b, &n2, Class::Relaxed, 8)
        {
            cross += 1;
        }
    }
    assert!(
        cross >= 6,
        "want most pairs on different partitions, got {cross}"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let seqs: Arc<Vec<AtomicU64>> = Arc::new((0..SOLO).map(|_| AtomicU64::new(0)).collect());
    // Consistent samples the checker has taken so far.
    let sampled = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    // Solo renamers: 300 renames each, and on (up to ten times as many) while the checker
    // still lacks samples, so a slow checker still has renames to watch.
    for i in 0..SOLO {
        let (c, stop, seqs, sampled) = (c.clone(), stop.clone(), seqs.clone(), sampled.clone());
        tasks.push(tokio::spawn(async move {
            let (n1, n2) = names(i);
            let mut done = 0u64;
            while !stop.load(Ordering::SeqCst)
                && done < 3000
                && (done < 300 || sampled.load(Ordering::SeqCst) < MIN_CHECKS)
            {
                seqs[i].fetch_add(1, Ordering::SeqCst);
                let r = if done.is_multiple_of(2) {
                    c.rename_entry(a, &n1, b, &n2, Default::default()).await
                } else {
                    c.rename_entry(b, &n2, a, &n1, Default::default()).await
                };
                r.unwrap_or_else(|e| panic!("solo rename {i} #{done} failed: {e}"));
                seqs[i].fetch_add(1, Ordering::SeqCst);
                done += 1;
            }
        }));
    }
    // Contested renamers: three tasks race on the same files; losers see ENOENT.
    for t in 0..3u64 {
        let (c, stop) = (c.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut k = t;
            while !stop.load(Ordering::SeqCst) && k < 3 * 80 {
                let i = SOLO + (k as usize * 7 + t as usize) % CONTESTED;
                let (n1, n2) = names(i);
                let r = if k.is_multiple_of(2) {
                    c.rename_entry(a, &n1, b, &n2, Default::default()).await
                } else {
                    c.rename_entry(b, &n2, a, &n1, Default::default()).await
                };
                if let Err(e) = r {
                    assert_eq!(e.errno(), Errno::ENOENT, "contested rename failed with {e}");
                }
                k += 3;
            }
        }));
    }

    // Checker of solo files.
    let mut checks = 0u64;
    let mut in_flight_checks = 0u64;
    // Sample while the solo renamers run. A minute is enough on an idle machine; a loaded
    // one samples more slowly, so the checker goes on past it until it has its 100 samples
    // (or the renamers are done), within a generous cap.
    let started = Instant::now();
    let enough = |checks: u64| {
        let t = started.elapsed();
        t >= Duration::from_secs(300) || (t >= Duration::from_secs(60) && checks >= MIN_CHECKS)
    };
    while !enough(checks) && tasks.iter().take(SOLO).any(|t| !t.is_finished()) {
        for i in 0..SOLO {
            let (n1, n2) = names(i);
            let s1 = seqs[i].load(Ordering::SeqCst);
            let completed = s1 / 2;
            let at_a = completed.is_multiple_of(2);
            let (src, dst) = if at_a {
                ((a, &n1), (b, &n2))
            } else {
                ((b, &n2), (a, &n1))
            };
            let dst_first = checks.is_multiple_of(2);
            let (first, second) = if dst_first { (dst, src) } else { (src, dst) };
            let f = exists(&c, first.0, first.1).await;
            let s = exists(&c, second.0, second.1).await;
            if seqs[i].load(Ordering::SeqCst) != s1 {
                continue;
            }
            checks += 1;
            sampled.store(checks, Ordering::SeqCst);
            let (src_seen, dst_seen) = if dst_first { (s, f) } else { (f, s) };
            if s1.is_multiple_of(2) {
                assert_eq!(src_seen, Some(inos[i]), "file {i} quiescent at its source");
                assert_eq!(
                    dst_seen, None,
                    "file {i} quiescent: destination must be absent"
                );
            } else {
                in_flight_checks += 1;
                if dst_first {
                    assert!(
                        !(src_seen.is_some() && dst_seen.is_some()),
                        "file {i} visible under both names"
                    );
                } else {
                    assert!(
                        src_seen.is_some() || dst_seen.is_some(),
                        "file {i} visible under neither name"
                    );
                }
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("renamer task");
    }
    println!("solo checks: {checks} ({in_flight_checks} during a rename)");
    assert!(checks >= MIN_CHECKS, "too few consistent samples: {checks}");

    // Quiescent: every file exactly once, with its own ino.
    for (i, ino) in inos.iter().enumerate() {
        let (n1, n2) = names(i);
        let x = exists(&c, a, &n1).await;
        let y = exists(&c, b, &n2).await;
        assert!(
            x.is_some() != y.is_some(),
            "file {i}: at /a {x:?}, at /b {y:?}"
        );
        assert_eq!(x.or(y), Some(*ino), "file {i} kept its ino");
    }
    cluster.shutdown().await;
}
