//! Every namespace operation through the library on a 3-node cluster with R = 3, and the
//! POSIX errors a user would expect from each.

mod common;

use common::{errno, eventually, Fixture};
use std::time::Duration;
use talon_client::{Class, CreateSpec, Errno, FileKind, MkdirOptions, SetAttr, Time, TimeSet};

fn mkdir_opts() -> MkdirOptions {
    MkdirOptions::default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_directories() {
    let fx = Fixture::start(3).await;
    let c = &fx.client;

    let d = c.mkdir("/d", mkdir_opts()).await.expect("mkdir /d");
    assert_eq!(d.kind, FileKind::Directory);
    assert_eq!(d.nlink, 2);
    assert_eq!(errno(c.mkdir("/d", mkdir_opts()).await), Errno::EEXIST);
    assert_eq!(errno(c.mkdir("/", mkdir_opts()).await), Errno::EEXIST);
    assert_eq!(errno(c.mkdir("/nope/x", mkdir_opts()).await), Errno::ENOENT);

    let f = c.create_file("/d/f", 0o640).await.expect("create /d/f");
    assert_eq!(
        (f.kind, f.perm, f.size, f.nlink),
        (FileKind::Regular, 0o640, 0, 1)
    );
    // Without O_EXCL an existing file is returned; with it, EEXIST.
    assert_eq!(
        c.create_file("/d/f", 0o600).await.expect("reopen").ino,
        f.ino
    );
    let excl = c.create(d.ino, b"f", CreateSpec::file(0o600)).await;
    assert_eq!(errno(excl), Errno::EEXIST);

    let st = c.stat("/d/f").await.expect("stat /d/f");
    assert_eq!(st.ino, f.ino);
    assert_eq!(c.lookup(d.ino, b"f").await.expect("lookup").ino, f.ino);
    assert_eq!(c.getattr(f.ino).await.expect("getattr").ino, f.ino);
    assert_eq!(errno(c.stat("/d/missing").await), Errno::ENOENT);
    assert_eq!(errno(c.lookup(d.ino, b"missing").await), Errno::ENOENT);

    // A file is not a directory, and a directory is not a file.
    assert_eq!(errno(c.create_file("/d/f/x", 0o644).await), Errno::ENOTDIR);
    assert_eq!(errno(c.stat("/d/f/x").await), Errno::ENOTDIR);
    assert_eq!(errno(c.mkdir("/d/f/x", mkdir_opts()).await), Errno::ENOTDIR);
    assert_eq!(errno(c.unlink("/d").await), Errno::EISDIR);
    assert_eq!(errno(c.rmdir("/d/f").await), Errno::ENOTDIR);
    assert_eq!(errno(c.rmdir("/").await), Errno::EBUSY);

    // rmdir refuses a non-empty directory, whichever partition holds the child.
    assert_eq!(errno(c.rmdir("/d").await), Errno::ENOTEMPTY);
    c.unlink("/d/f").await.expect("unlink /d/f");
    assert_eq!(errno(c.stat("/d/f").await), Errno::ENOENT);
    assert_eq!(errno(c.unlink("/d/f").await), Errno::ENOENT);
    c.rmdir("/d").await.expect("rmdir /d");
    assert_eq!(errno(c.stat("/d").await), Errno::ENOENT);
    // The removed directory cannot get new children through a stale ino.
    assert_eq!(
        errno(c.create(d.ino, b"late", CreateSpec::file(0o644)).await),
        Errno::ENOENT
    );

    // mkdir -p creates what is missing and accepts what exists.
    let deep = c
        .mkdir(
            "/p/q/r",
            MkdirOptions {
                parents: true,
                ..mkdir_opts()
            },
        )
        .await;
    let deep = deep.expect("mkdir -p");
    let again = c
        .mkdir(
            "/p/q/r",
            MkdirOptions {
                parents: true,
                ..mkdir_opts()
            },
        )
        .await;
    assert_eq!(again.expect("mkdir -p again").ino, deep.ino);
    c.create_file("/p/q/r/f", 0o644)
        .await
        .expect("create in new tree");
    c.remove_all("/p").await.expect("rm -r /p");
    assert_eq!(errno(c.stat("/p").await), Errno::ENOENT);

    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_are_refused() {
    let fx = Fixture::start(3).await;
    let c = &fx.client;
    let root = c.root();
    let long = vec![b'n'; 256];
    let cases: [(&[u8], Errno); 5] = [
        (&long, Errno::ENAMETOOLONG),
        (b"a/b", Errno::EINVAL),
        (b"a\0b", Errno::EINVAL),
        (b".", Errno::EINVAL),
        (b"..", Errno::EINVAL),
    ];
    for (name, want) in cases {
        assert_eq!(
            errno(c.create(root, name, CreateSpec::file(0o644)).await),
            want,
            "{name:?}"
        );
        assert_eq!(errno(c.lookup(root, name).await), want, "{name:?}");
    }
    assert_eq!(
        errno(c.create(root, b"", CreateSpec::file(0o644)).await),
        Errno::ENOENT
    );
    let long_path = format!("/{}", "x".repeat(256));
    assert_eq!(
        errno(c.create_file(&long_path, 0o644).await),
        Errno::ENAMETOOLONG
    );
    assert_eq!(errno(c.create_file("relative", 0o644).await), Errno::EINVAL);
    // 255 bytes is fine.
    let ok = format!("/{}", "x".repeat(255));
    c.create_file(&ok, 0o644).await.expect("255-byte name");
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_links_symlinks_and_special_files() {
    let fx = Fixture::start(3).await;
    let c = &fx.client;
    c.mkdir("/a", mkdir_opts()).await.expect("mkdir /a");
    c.mkdir("/b", mkdir_opts()).await.expect("mkdir /b");
    let f = c.create_file("/a/f", 0o644).await.expect("create");

    // Hard links, across directories (and so, usually, partitions).
    let l = c.hard_link("/a/f", "/b/g").await.expect("link");
    assert_eq!((l.ino, l.nlink), (f.ino, 2));
    assert_eq!(c.stat("/b/g").await.expect("stat link").ino, f.ino);
    assert_eq!(c.getattr(f.ino).await.expect("getattr").nlink, 2);
    assert_eq!(errno(c.hard_link("/a/f", "/b/g").await), Errno::EEXIST);
    assert_eq!(errno(c.hard_link("/a", "/b/dirlink").await), Errno::EPERM);
    assert_eq!(errno(c.hard_link("/a/none", "/b/x").await), Errno::ENOENT);
    c.unlink("/a/f").await.expect("unlink first name");
    assert_eq!(c.getattr(f.ino).await.expect("getattr").nlink, 1);
    assert_eq!(
        c.stat("/b/g").await.expect("second name survives").ino,
        f.ino
    );

    // Symlinks: stat does not follow; readlink returns the target; paths resolve through.
    let s = c.symlink("/b", "/a/tob").await.expect("symlink");
    assert_eq!(s.kind, FileKind::Symlink);
    assert_eq!(
        c.stat("/a/tob").await.expect("lstat").kind,
        FileKind::Symlink
    );
    assert_eq!(c.readlink(s.ino).await.expect("readlink"), b"/b".to_vec());
    assert_eq!(
        c.read_link("/a/tob").await.expect("read_link"),
        b"/b".to_vec()
    );
    assert_eq!(
        c.stat("/a/tob/g").await.expect("through the link").ino,
        f.ino
    );
    c.symlink("../b/g", "/a/rel")
        .await
        .expect("relative symlink");
    assert_eq!(
        c.read_link("/a/rel").await.expect("read_link"),
        b"../b/g".to_vec()
    );
    assert_eq!(errno(c.read_link("/b/g").await), Errno::EINVAL);
    c.symlink("/a/loop2", "/a/loop1").await.expect("loop1");
    c.symlink("/a/loop1", "/a/loop2").await.expect("loop2");
    assert_eq!(errno(c.stat("/a/loop1/x").await), Errno::ELOOP);
    let no_target = c
        .create(c.root(), b"empty", CreateSpec::symlink(Vec::new()))
        .await;
    assert_eq!(errno(no_target), Errno::ENOENT);

    // Special files.
    let fifo = c
        .mknod("/a/fifo", FileKind::Fifo, 0o600, 0)
        .await
        .expect("fifo");
    assert_eq!(fifo.kind, FileKind::Fifo);
    let sock = c
        .mknod("/a/sock", FileKind::Socket, 0o600, 0)
        .await
        .expect("socket");
    assert_eq!(sock.kind, FileKind::Socket);
    let chr = c
        .mknod("/a/null", FileKind::CharDevice, 0o666, (1 << 8) | 3)
        .await
        .expect("chr");
    assert_eq!((chr.kind, chr.rdev), (FileKind::CharDevice, (1 << 8) | 3));
    let blk = c
        .mknod("/a/sda", FileKind::BlockDevice, 0o660, 8 << 8)
        .await
        .expect("blk");
    assert_eq!((blk.kind, blk.rdev), (FileKind::BlockDevice, 8 << 8));
    assert_eq!(
        c.stat("/a/null").await.expect("stat chr").rdev,
        (1 << 8) | 3
    );
    assert_eq!(
        errno(c.mknod("/a/dir", FileKind::Directory, 0o755, 0).await),
        Errno::EINVAL
    );
    assert_eq!(
        errno(c.mknod("/a/fifo", FileKind::Fifo, 0o600, 0).await),
        Errno::EEXIST
    );
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setattr_and_statfs() {
    let fx = Fixture::start(3).await;
    let c = &fx.client;
    let f = c.create_file("/f", 0o644).await.expect("create");
    let a = c
        .setattr(
            f.ino,
            SetAttr {
                perm: Some(0o4750),
                ..SetAttr::default()
            },
        )
        .await;
    assert_eq!(a.expect("chmod").perm, 0o4750);
    let a = c.setattr(
        f.ino,
        SetAttr {
            uid: Some(1000),
            gid: Some(100),
            ..SetAttr::default()
        },
    );
    let a = a.await.expect("chown");
    assert_eq!((a.uid, a.gid), (1000, 100));
    // A chown of a file takes its set-user-ID bit, as on Linux.
    assert_eq!(a.perm, 0o0750);
    let a = c
        .setattr(
            f.ino,
            SetAttr {
                size: Some(4096),
                ..SetAttr::default()
            },
        )
        .await;
    assert_eq!(a.expect("truncate up").size, 4096);
    let a = c
        .setattr(
            f.ino,
            SetAttr {
                size: Some(10),
                ..SetAttr::default()
            },
        )
        .await;
    assert_eq!(a.expect("truncate down").size, 10);
    let t = Time {
        secs: 1_000_000_000,
        nanos: 123,
    };
    let set = SetAttr {
        atime: Some(TimeSet::At(t)),
        mtime: Some(TimeSet::At(Time {
            secs: 2_000_000_000,
            nanos: 0,
        })),
        ..SetAttr::default()
    };
    let a = c.setattr(f.ino, set).await.expect("utimens");
    assert_eq!((a.atime, a.mtime.secs), (t, 2_000_000_000));
    let before = a.mtime;
    let a = c.setattr(
        f.ino,
        SetAttr {
            mtime: Some(TimeSet::Now),
            ..SetAttr::default()
        },
    );
    assert!(
        a.await.expect("touch").mtime < before,
        "2033 is later than now"
    );
    let g = c.getattr(f.ino).await.expect("getattr");
    assert_eq!((g.perm, g.uid, g.size), (0o0750, 1000, 10));
    let gone = talon_client::Ino::new(f.ino.home(), f.ino.counter() + 1_000_000);
    assert_eq!(
        errno(c.setattr(gone, SetAttr::default()).await),
        Errno::ENOENT
    );

    let base = c.statfs().await.expect("statfs");
    // Three replicas of every byte on three nodes whose data directories share the
    // temporary directory's file system: the capacity is that file system's size.
    let tmp = rustix::fs::statvfs(std::env::temp_dir()).expect("statvfs of the temp dir");
    let fs_total = tmp.f_blocks * tmp.f_frsize;
    assert!(
        base.space_total <= fs_total && base.space_total + 3 >= fs_total,
        "capacity {} of a {fs_total}-byte file system",
        base.space_total
    );
    assert!(base.space_avail > 0 && base.space_avail <= base.space_free);
    assert!(base.space_free <= base.space_total);
    for i in 0..20 {
        c.create_file(format!("/n{i}"), 0o644)
            .await
            .expect("create");
    }
    // statfs reads any replica, so it may lag by the staleness bound.
    let grew = eventually(Duration::from_secs(30), || async {
        let now = c.statfs().await.expect("statfs");
        now.inodes >= base.inodes + 20 && now.entries >= base.entries + 20
    })
    .await;
    assert!(grew, "statfs counts the new files");
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_follow_prefixes_and_change_only_when_empty() {
    let fx = Fixture::start(3).await;
    let c = &fx.client;
    c.mkdir("/ckpt", mkdir_opts()).await.expect("mkdir /ckpt");
    c.mkdir("/ckptX", mkdir_opts()).await.expect("mkdir /ckptX");
    c.mkdir("/ckpt/run1", mkdir_opts())
        .await
        .expect("mkdir /ckpt/run1");
    assert_eq!(c.policy("/").await.expect("policy /"), Class::Relaxed);
    assert_eq!(c.policy("/ckpt").await.expect("policy"), Class::Strict);
    assert_eq!(c.policy("/ckpt/run1").await.expect("policy"), Class::Strict);
    assert_eq!(c.policy("/ckptX").await.expect("policy"), Class::Relaxed);
    let explicit = MkdirOptions {
        class: Some(Class::Relaxed),
        ..mkdir_opts()
    };
    c.mkdir("/ckpt/bulk", explicit)
        .await
        .expect("explicit relaxed under a strict prefix");
    assert_eq!(
        c.policy("/ckpt/bulk").await.expect("policy"),
        Class::Relaxed
    );
    let strict = MkdirOptions {
        class: Some(Class::Strict),
        ..mkdir_opts()
    };
    c.mkdir("/s", strict).await.expect("mkdir --strict");
    assert_eq!(c.policy("/s").await.expect("policy"), Class::Strict);

    // The class of an empty directory can change; entries then route by the new class.
    c.set_policy("/ckptX", Class::Strict)
        .await
        .expect("set on empty");
    assert_eq!(c.policy("/ckptX").await.expect("policy"), Class::Strict);
    for i in 0..10 {
        c.create_file(format!("/ckptX/f{i}"), 0o644)
            .await
            .expect("create after change");
    }
    assert_eq!(
        errno(c.set_policy("/ckptX", Class::Relaxed).await),
        Errno::ENOTEMPTY
    );
    let f = c.create_file("/plain", 0o644).await.expect("create");
    assert_eq!(
        errno(c.set_policy("/plain", Class::Strict).await),
        Errno::ENOTDIR
    );
    assert_eq!(errno(c.policy("/plain").await), Errno::ENOTDIR);
    assert_eq!(f.kind, FileKind::Regular);

    // Another client, whose class table still says relaxed, is rerouted and succeeds.
    let other = fx.other_client().await;
    other
        .mkdir("/flip", mkdir_opts())
        .await
        .expect("mkdir /flip");
    let flip = other.stat("/flip").await.expect("stat");
    assert_eq!(other.policy("/flip").await.expect("policy"), Class::Relaxed);
    c.set_policy("/flip", Class::Strict)
        .await
        .expect("flip to strict");
    other
        .create(flip.ino, b"x", CreateSpec::file(0o644))
        .await
        .expect("create after flip");
    assert_eq!(
        c.stat("/flip/x").await.expect("stat").kind,
        FileKind::Regular
    );
    fx.shutdown().await;
}
