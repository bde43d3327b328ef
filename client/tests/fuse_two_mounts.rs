//! Two mounts of one cluster, as on two machines: the mount that made a change sees it at
//! once in both classes; the other sees it at once in a strict directory and within the
//! staleness bound in a relaxed one.

mod fuse_support;

use fuse_support::{eventually, Mounted, STALENESS_MS};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

/// What a stat shows of a directory: link count and mtime (with nanoseconds).
fn dir_view(p: &Path) -> (u64, i64, i64) {
    let m = fs::metadata(p).expect("stat");
    (m.nlink(), m.mtime(), m.mtime_nsec())
}

#[test]
fn a_strict_change_shows_at_once_on_both_mounts() {
    let m = Mounted::start();
    let other = m.mount_again();
    fs::create_dir(m.path("ckpt")).expect("mkdir ckpt");
    let (a, b) = (m.path("ckpt/run"), other.path("ckpt/run"));
    fs::create_dir(&a).expect("mkdir run");
    assert!(b.is_dir(), "the other mount sees the new directory");

    fs::write(a.join("step"), b"one").expect("write");
    assert_eq!(fs::read(b.join("step")).expect("read on the other"), b"one");
    let before = dir_view(&b);
    fs::write(a.join("step.tmp"), b"two").expect("write tmp");
    fs::rename(a.join("step.tmp"), a.join("step")).expect("rename over");
    fs::create_dir(a.join("sub")).expect("mkdir sub");
    for (what, dir) in [("this mount", &a), ("the other mount", &b)] {
        assert_eq!(fs::read(dir.join("step")).expect("read"), b"two", "{what}");
        assert!(
            !dir.join("step.tmp").exists(),
            "{what}: the old name is gone"
        );
        let now = dir_view(dir);
        assert_eq!(
            now.0,
            before.0 + 1,
            "{what}: mkdir adds a link to the parent"
        );
        assert!(now.1 * 1_000_000_000 + now.2 > before.1 * 1_000_000_000 + before.2);
    }
}

#[test]
fn a_relaxed_change_shows_at_once_here_and_within_the_bound_there() {
    let m = Mounted::start();
    let other = m.mount_again();
    let (a, b) = (m.path("data"), other.path("data"));
    fs::create_dir(&a).expect("mkdir data");
    // The other mount looks first, so its kernel and client caches hold the old state.
    assert!(eventually(Duration::from_secs(30), || b.is_dir()));
    let before = dir_view(&b);
    assert!(!b.join("img").exists());

    fs::write(a.join("img"), b"jpeg").expect("write");
    fs::create_dir(a.join("sub")).expect("mkdir sub");
    // This mount: at once.
    assert_eq!(fs::read(a.join("img")).expect("read here"), b"jpeg");
    assert_eq!(
        dir_view(&a).0,
        before.0 + 1,
        "mkdir adds a link here at once"
    );
    // The other mount: within the staleness bound (its kernel TTL and its client's),
    // waited for with a generous margin rather than timed.
    let bound = Duration::from_millis(STALENESS_MS) * 2 + Duration::from_secs(30);
    assert!(
        eventually(bound, || fs::read(b.join("img"))
            .is_ok_and(|d| d == b"jpeg")),
        "the other mount never saw the new file"
    );
    assert!(
        eventually(bound, || dir_view(&b).0 == before.0 + 1),
        "the other mount never saw the new link count"
    );
    fs::remove_file(a.join("img")).expect("unlink");
    assert!(!a.join("img").exists(), "gone here at once");
    assert!(
        eventually(bound, || !b.join("img").exists()),
        "the other mount never saw the unlink"
    );
    drop(other);
}
