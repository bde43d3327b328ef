//! Extended attributes: set, get, list, remove, and the Linux flag semantics.

mod common;

use common::{errno, Fixture};
use talon_client::{Errno, OpenOptions, SetAttr, XattrFlags};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xattrs() {
    let fx = Fixture::start(3).await;
    let c = &fx.client;
    let f = c.create_file("/f", 0o644).await.expect("create");
    let d = c.mkdir("/d", Default::default()).await.expect("mkdir");

    assert_eq!(errno(c.getxattr(f.ino, b"user.a").await), Errno::ENODATA);
    assert!(c.listxattr(f.ino).await.expect("list").is_empty());
    c.setxattr(f.ino, b"user.a", b"1", XattrFlags::Any)
        .await
        .expect("set");
    assert_eq!(
        c.getxattr(f.ino, b"user.a").await.expect("get"),
        b"1".to_vec()
    );

    // XATTR_CREATE refuses an existing name; XATTR_REPLACE a missing one.
    let r = c.setxattr(f.ino, b"user.a", b"2", XattrFlags::Create).await;
    assert_eq!(errno(r), Errno::EEXIST);
    let r = c
        .setxattr(f.ino, b"user.b", b"2", XattrFlags::Replace)
        .await;
    assert_eq!(errno(r), Errno::ENODATA);
    c.setxattr(f.ino, b"user.a", b"22", XattrFlags::Replace)
        .await
        .expect("replace");
    c.setxattr(f.ino, b"user.b", b"", XattrFlags::Create)
        .await
        .expect("create empty");
    assert_eq!(
        c.getxattr(f.ino, b"user.a").await.expect("get"),
        b"22".to_vec()
    );
    assert_eq!(
        c.getxattr(f.ino, b"user.b").await.expect("get empty"),
        Vec::<u8>::new()
    );

    let mut names = c.listxattr(f.ino).await.expect("list");
    names.sort();
    assert_eq!(names, vec![b"user.a".to_vec(), b"user.b".to_vec()]);
    c.removexattr(f.ino, b"user.a").await.expect("remove");
    assert_eq!(errno(c.removexattr(f.ino, b"user.a").await), Errno::ENODATA);
    assert_eq!(
        c.listxattr(f.ino).await.expect("list"),
        vec![b"user.b".to_vec()]
    );

    // Directories carry xattrs too, and they are per inode.
    c.setxattr(d.ino, b"user.a", b"dir", XattrFlags::Any)
        .await
        .expect("set on dir");
    assert_eq!(
        c.getxattr(d.ino, b"user.a").await.expect("get"),
        b"dir".to_vec()
    );
    assert_eq!(errno(c.getxattr(f.ino, b"user.a").await), Errno::ENODATA);

    // A value survives the inode's rename.
    c.rename("/f", "/d/f").await.expect("rename");
    assert_eq!(
        c.getxattr(f.ino, b"user.b")
            .await
            .expect("get after rename"),
        Vec::<u8>::new()
    );
    fx.shutdown().await;
}

/// What a change of a file's contents or owner takes from it, as Linux's VFS takes it: its
/// `security.capability` at every change of contents (whoever writes), its set-user-ID bit
/// and its group-executable set-group-ID bit when the writer may not keep them
/// (`File::drop_setid`, a mount's caller without `CAP_FSETID`), and both at a chown.
/// The bits go in the commit that brings the contents, small or chunked; a set-group-ID
/// bit without group execute (mandatory locking) and a directory's (inheritance) stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_contents_or_owner_takes_privileges() {
    const SMALL: u64 = 64 << 10;
    const CHUNK: u64 = 64 << 10;
    let fx = Fixture::start_with(1, |b| b.file_sizes(SMALL as u32, CHUNK as u32)).await;
    let c = &fx.client;
    const CAP: &[u8] = b"security.capability";
    let perm = |ino| async move { c.getattr(ino).await.expect("getattr").perm };
    let set_perm = |ino, perm| async move {
        let set = SetAttr {
            perm: Some(perm),
            ..SetAttr::default()
        };
        c.setattr(ino, set).await.expect("chmod");
    };
    let write = |ino, len: u64, drop_setid: bool| async move {
        let mut f = c
            .open_ino(ino, OpenOptions::read_write())
            .await
            .expect("open");
        f.write_at(0, &vec![7; len as usize]).await.expect("write");
        if drop_setid {
            f.drop_setid().await.expect("drop set-ID bits");
        }
        f.close().await.expect("close");
    };

    for (name, len) in [("small", 100), ("chunked", SMALL + CHUNK + 1)] {
        let f = c
            .create_file(&format!("/{name}"), 0o644)
            .await
            .expect("create");
        set_perm(f.ino, 0o6755).await;
        c.setxattr(f.ino, CAP, b"caps", XattrFlags::Any)
            .await
            .expect("set caps");
        // A writer that may keep the set-ID bits still takes the capabilities.
        write(f.ino, len, false).await;
        assert_eq!(perm(f.ino).await, 0o6755, "{name}");
        assert_eq!(
            errno(c.getxattr(f.ino, CAP).await),
            Errno::ENODATA,
            "{name}"
        );
        // One that may not takes the bits too, with the contents.
        c.setxattr(f.ino, CAP, b"caps", XattrFlags::Any)
            .await
            .expect("set caps again");
        let before = c.getattr(f.ino).await.expect("getattr");
        write(f.ino, len, true).await;
        let after = c.getattr(f.ino).await.expect("getattr");
        assert_eq!(after.perm, 0o0755, "{name}");
        assert_eq!(after.size, len, "{name}");
        assert!(after.ctime >= before.ctime, "{name}");
        assert_eq!(
            errno(c.getxattr(f.ino, CAP).await),
            Errno::ENODATA,
            "{name}"
        );
        // A set-group-ID bit without group execute stays; the set-user-ID bit goes.
        set_perm(f.ino, 0o6745).await;
        write(f.ino, len, true).await;
        assert_eq!(perm(f.ino).await, 0o2745, "{name}");
    }

    // A chown takes both bits and the capabilities, unless the same change sets the mode.
    let f = c.create_file("/owned", 0o644).await.expect("create");
    set_perm(f.ino, 0o6755).await;
    c.setxattr(f.ino, CAP, b"caps", XattrFlags::Any)
        .await
        .expect("set caps");
    let chown = SetAttr {
        uid: Some(1000),
        ..SetAttr::default()
    };
    c.setattr(f.ino, chown.clone()).await.expect("chown");
    assert_eq!(perm(f.ino).await, 0o0755);
    assert_eq!(errno(c.getxattr(f.ino, CAP).await), Errno::ENODATA);
    let both = SetAttr {
        perm: Some(0o4755),
        ..chown.clone()
    };
    c.setattr(f.ino, both).await.expect("chown and chmod");
    assert_eq!(perm(f.ino).await, 0o4755);
    // A change of contents without the bits to drop, or of a directory's owner, keeps
    // everything: nothing is written for it.
    let d = c.mkdir("/d", Default::default()).await.expect("mkdir");
    set_perm(d.ino, 0o2775).await;
    c.setattr(d.ino, chown).await.expect("chown a directory");
    assert_eq!(perm(d.ino).await, 0o2775);
    c.setxattr(d.ino, CAP, b"caps", XattrFlags::Any)
        .await
        .expect("caps on a directory");
    assert_eq!(
        c.getxattr(d.ino, CAP).await.expect("kept"),
        b"caps".to_vec()
    );
}
