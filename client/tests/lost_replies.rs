//! Writes whose answer is lost on the way back: the node carries the request out, the
//! connection breaks before the client reads the reply, and the router sends the request
//! again. The application must see the outcome of its one call — not the ENOENT or EEXIST
//! that the repeated request meets, and not a second exchange that swaps entries back.
//!
//! The cluster's single node sits behind a relay that loses exactly the next reply when
//! told to; each case checks that a reply really was lost, then checks the answer and the
//! namespace.
//!
//! The server records each rename, remove and link by the client's request id in the same
//! commit as the change, and answers a repeated copy from that record: the client no longer
//! guesses an outcome from the namespace after the fact (a guess that another client's
//! change, or a name that was never there, could make wrong).

mod common;

use common::Fixture;
use talon_client::{Client, RenameFlags, XattrFlags};
use talon_testkit::TestCluster;

/// Runs `op` with the node's next reply lost; panics if no reply was lost.
async fn with_lost_reply<T>(cluster: &TestCluster, op: impl std::future::Future<Output = T>) -> T {
    let front = cluster.front(1).expect("the cluster has a lossy front");
    let before = front.lost();
    front.lose_next_replies(1);
    let out = op.await;
    assert_eq!(front.lost(), before + 1, "the reply was lost");
    out
}

async fn ino_of(c: &Client, path: &str) -> u64 {
    c.stat(path).await.expect("stat").ino.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_with_lost_replies_answer_what_they_did() {
    let fx = Fixture::start_with(1, |b| b.partitions(4).lossy_front(true)).await;
    let c = &fx.client;
    let cl = &fx.cluster;
    c.mkdir("/d", Default::default()).await.expect("mkdir");
    for name in ["a", "b", "x", "y", "l"] {
        c.create_file(format!("/d/{name}"), 0o644)
            .await
            .expect("create");
    }

    // unlink: the first attempt removed it.
    with_lost_reply(cl, c.unlink("/d/a"))
        .await
        .expect("unlink answers success");
    assert!(c.stat("/d/a").await.is_err(), "a is gone");

    // rename: the first attempt moved it; the repeat finds no source.
    let b = ino_of(c, "/d/b").await;
    with_lost_reply(cl, c.rename("/d/b", "/d/b2"))
        .await
        .expect("rename answers success");
    assert_eq!(ino_of(c, "/d/b2").await, b);
    assert!(c.stat("/d/b").await.is_err(), "b was moved");

    // exchange: sent again it would swap the entries back.
    let (x, y) = (ino_of(c, "/d/x").await, ino_of(c, "/d/y").await);
    with_lost_reply(
        cl,
        c.rename_with_flags("/d/x", "/d/y", RenameFlags::EXCHANGE),
    )
    .await
    .expect("exchange answers success");
    assert_eq!(
        (ino_of(c, "/d/x").await, ino_of(c, "/d/y").await),
        (y, x),
        "swapped exactly once"
    );

    // link: the first attempt made the name.
    let l = ino_of(c, "/d/l").await;
    let attr = with_lost_reply(cl, c.hard_link("/d/l", "/d/l2"))
        .await
        .expect("link answers success");
    assert_eq!(attr.ino.0, l);
    assert_eq!(c.stat("/d/l").await.expect("stat").nlink, 2);

    // create (the request token answers the repeat with the first attempt's inode).
    let made = with_lost_reply(cl, c.create_file("/d/new", 0o644))
        .await
        .expect("create answers success");
    assert_eq!(ino_of(c, "/d/new").await, made.ino.0);

    // xattrs: create-only set, then remove.
    let ino = made.ino;
    with_lost_reply(cl, c.setxattr(ino, b"user.k", b"v", XattrFlags::Create))
        .await
        .expect("setxattr answers success");
    assert_eq!(c.getxattr(ino, b"user.k").await.expect("getxattr"), b"v");
    with_lost_reply(cl, c.removexattr(ino, b"user.k"))
        .await
        .expect("removexattr answers success");
    assert!(c.getxattr(ino, b"user.k").await.is_err(), "xattr removed");

    // rmdir.
    c.mkdir("/d/sub", Default::default()).await.expect("mkdir");
    with_lost_reply(cl, c.rmdir("/d/sub"))
        .await
        .expect("rmdir answers success");
    assert!(c.stat("/d/sub").await.is_err(), "sub is gone");

    fx.shutdown().await;
}

/// Answers that the client used to guess after a lost reply, and got wrong: a NOREPLACE
/// rename that took effect was answered EEXIST (its repeat found its own entry), and an
/// unlink of a name that never existed was answered success (its repeat's ENOENT was taken
/// for the first attempt's doing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_requests_get_the_first_attempts_answer() {
    let fx = Fixture::start_with(1, |b| b.partitions(4).lossy_front(true)).await;
    let c = &fx.client;
    let cl = &fx.cluster;
    c.mkdir("/a", Default::default()).await.expect("mkdir");
    c.mkdir("/b", Default::default()).await.expect("mkdir");
    c.create_file("/a/f", 0o644).await.expect("create");
    let f = ino_of(c, "/a/f").await;

    with_lost_reply(
        cl,
        c.rename_with_flags("/a/f", "/b/f", RenameFlags::NOREPLACE),
    )
    .await
    .expect("a NOREPLACE rename that moved the file answers success");
    assert_eq!(ino_of(c, "/b/f").await, f);

    let missing = with_lost_reply(cl, c.unlink("/a/never"))
        .await
        .expect_err("an unlink of a name that was never there fails");
    assert_eq!(missing.errno(), talon_client::Errno::ENOENT);

    let missing = with_lost_reply(cl, c.rename("/a/never", "/b/never"))
        .await
        .expect_err("a rename of a name that was never there fails");
    assert_eq!(missing.errno(), talon_client::Errno::ENOENT);

    // An exchange, a plain rename and an unlink across the two directories, each with its
    // answer lost: every one applied exactly once.
    c.create_file("/a/g", 0o644).await.expect("create");
    let g = ino_of(c, "/a/g").await;
    with_lost_reply(
        cl,
        c.rename_with_flags("/a/g", "/b/f", RenameFlags::EXCHANGE),
    )
    .await
    .expect("exchange answers success");
    assert_eq!((ino_of(c, "/a/g").await, ino_of(c, "/b/f").await), (f, g));
    with_lost_reply(cl, c.rename("/b/f", "/a/g"))
        .await
        .expect("a replacing rename answers success");
    assert_eq!(ino_of(c, "/a/g").await, g);
    assert!(c.stat("/b/f").await.is_err(), "moved once");
    with_lost_reply(cl, c.unlink("/a/g"))
        .await
        .expect("unlink answers success");
    assert!(c.stat("/a/g").await.is_err(), "gone");

    fx.shutdown().await;
}
