//! The path cache under another client's directory rename: a client whose cache still
//! holds the old path must never create under it, and must stop seeing it within the TTL.

mod common;

use common::{errno, eventually, Fixture, STALENESS_MS};
use std::time::{Duration, Instant};
use talon_client::{Client, Errno, MkdirOptions};

fn parents() -> MkdirOptions {
    MkdirOptions {
        parents: true,
        ..MkdirOptions::default()
    }
}

/// Moves the namespace past epoch 0 (at which the client caches no directories).
async fn bump_epoch(c: &Client) {
    c.mkdir("/warmup", MkdirOptions::default())
        .await
        .expect("mkdir warmup");
    c.rename("/warmup", "/warmup2")
        .await
        .expect("rename warmup");
    assert!(c.epoch() > 0, "a directory rename bumps the epoch");
}

/// Client A caches `{base}/d/sub`, client B renames it to `{base}/e/sub`; A's create under
/// the old path fails and nothing appears under the new one.
async fn stale_create_is_refused(base: &str) -> (Fixture, Client) {
    let fx = Fixture::start(3).await;
    let a = fx.client.clone();
    bump_epoch(&a).await;
    let b = fx.other_client().await;
    a.mkdir(format!("{base}/d/sub"), parents())
        .await
        .expect("mkdir d/sub");
    a.mkdir(format!("{base}/e"), parents())
        .await
        .expect("mkdir e");
    a.create_file(format!("{base}/d/sub/y"), 0o644)
        .await
        .expect("A resolves d/sub");
    a.stat(format!("{base}/d/sub"))
        .await
        .expect("A stats d/sub");
    let (_, dirs) = a.cache_len();
    assert!(dirs > 0, "A has cached directory paths");

    b.rename(format!("{base}/d/sub"), format!("{base}/e/sub"))
        .await
        .expect("B renames");
    let r = a.create_file(format!("{base}/d/sub/x"), 0o644).await;
    assert_eq!(
        errno(r),
        Errno::ENOENT,
        "A must not create under the old path"
    );
    assert_eq!(
        errno(b.stat(format!("{base}/e/sub/x")).await),
        Errno::ENOENT
    );
    // B's relaxed stat may reach a replica that has not applied A's create yet.
    assert!(
        eventually(Duration::from_secs(15), || async {
            b.stat(format!("{base}/e/sub/y")).await.is_ok()
        })
        .await,
        "the file made under the old path is there under the new one"
    );
    (fx, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_paths_never_create_under_a_renamed_directory() {
    let (fx, a) = stale_create_is_refused("/ckpt").await;
    // Strict stats go to the leader with the epoch: the old path is gone at once.
    assert_eq!(errno(a.stat("/ckpt/d/sub").await), Errno::ENOENT);
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaxed_paths_never_create_under_a_renamed_directory() {
    let (fx, _) = stale_create_is_refused("/data").await;
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaxed_stat_sees_a_rename_within_the_ttl() {
    let fx = Fixture::start(3).await;
    let a = fx.client.clone();
    bump_epoch(&a).await;
    let b = fx.other_client().await;
    a.mkdir("/d/sub", parents()).await.expect("mkdir /d/sub");
    a.mkdir("/e", parents()).await.expect("mkdir /e");
    let sub = a.stat("/d/sub").await.expect("A caches /d/sub");

    b.rename("/d/sub", "/e/sub").await.expect("B renames");
    let renamed = Instant::now();
    // The TTL plus a generous margin for a loaded machine: what is checked is that the
    // stale view ends, and that until then it is the old entry.
    let limit = Duration::from_millis(STALENESS_MS) * 2 + Duration::from_secs(14);
    let flipped = loop {
        match a.stat("/d/sub").await {
            Err(e) if e.errno() == Errno::ENOENT => break Some(renamed.elapsed()),
            Ok(attr) => assert_eq!(attr.ino, sub.ino, "a stale answer is the old entry"),
            Err(e) => panic!("unexpected error {e}"),
        }
        if renamed.elapsed() > limit {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = flipped.expect("A sees the rename within TTL + margin");
    println!("A saw the rename after {took:?} (ttl {STALENESS_MS} ms)");
    assert_eq!(a.stat("/e/sub").await.expect("new path").ino, sub.ino);
    fx.shutdown().await;
}
