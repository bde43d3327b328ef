//! Extended attributes: set, get, list, remove, and the Linux flag semantics.

mod common;

use common::{errno, Fixture};
use talon_client::{Errno, XattrFlags};

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
