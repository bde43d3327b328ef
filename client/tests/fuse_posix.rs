//! POSIX behaviour through a real FUSE mount, checked with `std::fs` and system calls the
//! way applications make them: open flags, positioned I/O, truncate, unlink of an open file,
//! renames (over files and directories, with flags), links, symlinks, special files,
//! attributes, permissions of another user, xattrs, and the errors tools rely on.

mod fuse_support;

use fuse_support::{errno, Mounted};
use rustix::fs::{RenameFlags, XattrFlags, CWD};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, SystemTime};
use talon_model::placement::entry_partition;

/// A user id without privileges, for the permission checks.
const NOBODY: u32 = 65534;

fn read(p: &std::path::Path) -> Vec<u8> {
    fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

#[test]
fn namespace_operations_and_their_errors() {
    let m = Mounted::start();
    fs::create_dir(m.path("d")).expect("mkdir");
    assert_eq!(errno(fs::create_dir(m.path("d"))), libc::EEXIST);
    fs::write(m.path("d/f"), b"").expect("create a file");
    assert_eq!(errno(fs::remove_dir(m.path("d"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs::remove_dir(m.path("d/f"))), libc::ENOTDIR);
    assert_eq!(errno(fs::remove_file(m.path("d"))), libc::EISDIR);
    assert_eq!(errno(fs::metadata(m.path("nope"))), libc::ENOENT);
    assert_eq!(errno(File::open(m.path("d/f/x"))), libc::ENOTDIR);
    let long = "x".repeat(256);
    assert_eq!(errno(fs::write(m.path(&long), b"")), libc::ENAMETOOLONG);
    fs::write(m.path(&"y".repeat(255)), b"").expect("a 255-byte name is fine");

    // Directory link counts: 2 + subdirectories.
    fs::create_dir(m.path("d/sub")).expect("mkdir sub");
    // Directory attributes may follow their children within a bound.
    assert!(fuse_support::eventually(Duration::from_secs(30), || {
        fs::metadata(m.path("d")).map(|a| a.nlink()).unwrap_or(0) == 3
    }));
    fs::remove_file(m.path("d/f")).expect("unlink");
    fs::remove_dir(m.path("d/sub")).expect("rmdir sub");
    fs::remove_dir(m.path("d")).expect("rmdir");
    assert_eq!(errno(fs::metadata(m.path("d"))), libc::ENOENT);

    // mknod: a fifo and a socket-type node; the kernel reports their kinds.
    rustix::fs::mknodat(
        CWD,
        m.path("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("mkfifo");
    use std::os::unix::fs::FileTypeExt;
    assert!(fs::symlink_metadata(m.path("fifo"))
        .expect("stat fifo")
        .file_type()
        .is_fifo());

    // Listing a directory larger than one ReadDir page: every name once.
    fs::create_dir(m.path("big")).expect("mkdir big");
    let n = 1200;
    for i in 0..n {
        File::create(m.path(&format!("big/e{i:05}"))).expect("create");
    }
    let mut names: Vec<String> = fs::read_dir(m.path("big"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let want: Vec<String> = (0..n).map(|i| format!("e{i:05}")).collect();
    assert_eq!(names, want);
}

#[test]
fn open_flags_offsets_and_truncate() {
    let m = Mounted::start();
    let p = m.path("f");
    fs::write(&p, b"hello world").expect("write");
    assert_eq!(read(&p), b"hello world");

    // O_CREAT|O_EXCL on an existing name.
    let excl = OpenOptions::new().write(true).create_new(true).open(&p);
    assert_eq!(errno(excl), libc::EEXIST);

    // O_APPEND.
    let mut f = OpenOptions::new()
        .append(true)
        .open(&p)
        .expect("open append");
    f.write_all(b"!!").expect("append");
    drop(f);
    assert_eq!(read(&p), b"hello world!!");

    // Positioned writes, with a hole, and reads at offsets.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .expect("open rw");
    f.write_all_at(b"HELLO", 0).expect("pwrite 0");
    f.write_all_at(b"end", 20).expect("pwrite past the end");
    let mut buf = [0u8; 5];
    f.read_exact_at(&mut buf, 6).expect("pread");
    assert_eq!(&buf, b"world");
    assert_eq!(f.metadata().expect("fstat").len(), 23);
    drop(f);
    let mut want = b"HELLO world!!".to_vec();
    want.resize(20, 0);
    want.extend_from_slice(b"end");
    assert_eq!(read(&p), want);

    // O_TRUNC empties.
    let f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .expect("open trunc");
    drop(f);
    assert_eq!(fs::metadata(&p).expect("stat").len(), 0);

    // truncate(2) shrinks and extends with zeros.
    fs::write(&p, b"0123456789").expect("write");
    let f = OpenOptions::new().write(true).open(&p).expect("open");
    f.set_len(4).expect("shrink");
    drop(f);
    assert_eq!(read(&p), b"0123");
    let f = OpenOptions::new().write(true).open(&p).expect("open");
    f.set_len(8).expect("extend");
    drop(f);
    assert_eq!(read(&p), b"0123\0\0\0\0");

    // Streaming reads and seeks of a file larger than one kernel request.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(m.path("big"), &big).expect("write big");
    assert_eq!(read(&m.path("big")), big);
    let mut f = File::open(m.path("big")).expect("open big");
    f.seek(SeekFrom::Start(1_234_567)).expect("seek");
    let mut part = vec![0u8; 100_000];
    f.read_exact(&mut part).expect("read part");
    assert_eq!(part, big[1_234_567..1_334_567]);

    // fallocate mode 0 extends the size.
    let f = OpenOptions::new().write(true).open(&p).expect("open");
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, 100).expect("fallocate");
    // KEEP_SIZE reserves without growing; hole punching is not supported.
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::KEEP_SIZE, 0, 4096)
        .expect("fallocate keep size");
    let punch = rustix::fs::FallocateFlags::KEEP_SIZE | rustix::fs::FallocateFlags::PUNCH_HOLE;
    assert_eq!(
        rustix::fs::fallocate(&f, punch, 0, 10).map_err(|e| e.raw_os_error()),
        Err(libc::EOPNOTSUPP)
    );
    drop(f);
    assert_eq!(fs::metadata(&p).expect("stat").len(), 100);
}

/// A file rewritten with `O_TRUNC` (as `torch.save` to the same name does) while another
/// descriptor of it is open for writing, untouched: the truncate is the rewriting open's
/// own, so the other descriptor's close commits nothing and the new contents stay. Without
/// atomic `O_TRUNC`, the kernel sent the truncate as a SETATTR without a handle, the mount
/// applied it through the first writable handle of the file (the idle one), and that
/// handle's close committed an empty file over the rewrite. A read-only `O_TRUNC` open
/// empties the file too.
#[test]
fn a_rewrite_with_o_trunc_is_its_own_beside_another_writer() {
    let m = Mounted::start();
    let p = m.path("ckpt");
    fs::write(&p, b"the first checkpoint").expect("write");
    let idle = OpenOptions::new()
        .write(true)
        .open(&p)
        .expect("open an idle writer");
    let mut rewrite = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .expect("open to rewrite");
    rewrite.write_all(b"second").expect("write");
    drop(rewrite);
    assert_eq!(read(&p), b"second");
    drop(idle);
    assert_eq!(
        read(&p),
        b"second",
        "the idle writer's close kept the rewrite"
    );

    let trunc = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_TRUNC)
        .open(&p)
        .expect("open read-only with O_TRUNC");
    drop(trunc);
    assert_eq!(fs::metadata(&p).expect("stat").len(), 0);
}

/// A truncate by path while this mount has the file open for writing, with nothing
/// written through that descriptor: the cluster has the new size at once, not when the
/// descriptor is closed, and that close commits nothing over it.
#[test]
fn a_truncate_by_path_beside_an_idle_writer_is_seen_at_once() {
    let m = Mounted::start();
    let p = m.path("t");
    fs::write(&p, b"0123456789").expect("write");
    let ino = talon_model::Ino(fs::metadata(&p).expect("stat").ino());
    let idle = OpenOptions::new().write(true).open(&p).expect("open");
    // truncate(2): by path, without a descriptor of its own.
    nix::unistd::truncate(&p, 3).expect("truncate");
    let size = m.block_on(m.client.getattr(ino)).expect("getattr").size;
    assert_eq!(size, 3, "the cluster's size right after the truncate");
    drop(idle);
    assert_eq!(read(&p), b"012");
}

#[test]
fn unlinked_open_file_stays_readable_until_closed() {
    let m = Mounted::start();
    let p = m.path("victim");
    fs::write(&p, b"still here").expect("write");
    let mut f = File::open(&p).expect("open");
    fs::remove_file(&p).expect("unlink");
    assert_eq!(errno(fs::metadata(&p)), libc::ENOENT);
    let mut s = String::new();
    f.read_to_string(&mut s).expect("read after unlink");
    assert_eq!(s, "still here");
    drop(f);

    // Replaced by a rename while open: the old contents stay readable too.
    fs::write(m.path("a"), b"old contents").expect("write a");
    fs::write(m.path("b"), b"new").expect("write b");
    let mut f = File::open(m.path("a")).expect("open a");
    fs::rename(m.path("b"), m.path("a")).expect("rename over a");
    let mut s = String::new();
    f.read_to_string(&mut s).expect("read replaced");
    assert_eq!(s, "old contents");
    assert_eq!(read(&m.path("a")), b"new");
}

/// The temporary-file pattern (`tempfile.TemporaryFile`, `tmpfile(3)`): created, unlinked
/// at once, then written, synced and read back through its descriptor for longer than the
/// servers' unlinked grace (here 1 s, 30 s by default), small and chunked. The file lives
/// until it is closed, and goes once it is; before open sessions held it, the servers
/// reclaimed it a grace after the unlink and the next sync failed with ENOENT.
#[test]
fn a_temporary_file_lives_past_the_unlinked_grace_until_closed() {
    temporary_files_live_until_closed(
        talon_testkit::TestCluster::builder().unlinked_grace_ms(1000),
    );
}

/// The same on a nearly full node, which reclaims unlinked files after half the grace (2 s
/// here, two rounds) rather than the whole: the mount holds a file it unlinks while open at
/// the unlink.
#[test]
fn a_temporary_file_lives_until_closed_on_a_nearly_full_node() {
    let builder = talon_testkit::TestCluster::builder()
        .nearly_full()
        .chunk_gc_grace_ms(8000)
        .unlinked_grace_ms(4000);
    temporary_files_live_until_closed(builder);
}

/// Creates a small and a chunked temporary file on a one-node cluster that `builder` makes,
/// unlinks each at once and uses it for 4 s, then checks that it goes once closed.
fn temporary_files_live_until_closed(builder: talon_testkit::TestClusterBuilder) {
    let m = Mounted::start_on(builder.nodes(1).file_sizes(16 << 10, 64 << 10));
    let mut files = Vec::new();
    for (name, len) in [("small.tmp", 1000), ("big.tmp", 300 << 10)] {
        let p = m.path(name);
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
            .expect("create");
        let want: Vec<u8> = (0..len as u32).map(|i| (i % 253) as u8).collect();
        f.write_all(&want[..len / 2]).expect("write");
        fs::remove_file(&p).expect("unlink");
        files.push((f, want, len));
    }
    // Several of the collector's rounds past the unlinked grace, or past its half on a
    // nearly full node (rounds every quarter of the grace).
    std::thread::sleep(Duration::from_secs(4));
    for (f, want, len) in &mut files {
        f.write_all(&want[*len / 2..]).expect("write on");
        f.sync_all().expect("sync the unlinked file");
        f.seek(SeekFrom::Start(0)).expect("seek");
        let mut got = Vec::new();
        f.read_to_end(&mut got).expect("read back");
        assert!(
            got == *want,
            "a {len}-byte temporary file read back differs"
        );
        assert_eq!(f.metadata().expect("fstat").nlink(), 0);
    }
    // Closed, each goes at a following round (its session ended, not left to expire).
    let inos: Vec<u64> = files
        .iter()
        .map(|(f, _, _)| f.metadata().expect("fstat").ino())
        .collect();
    drop(files);
    let gone = fuse_support::eventually(Duration::from_secs(30), || {
        inos.iter().all(|&i| {
            let r = m.block_on(m.client.getattr(talon_model::Ino(i)));
            r.is_err_and(|e| e.errno() == talon_model::Errno::ENOENT)
        })
    });
    assert!(gone, "the closed temporary files were not reclaimed");
}

#[test]
fn renames_links_and_symlinks() {
    let m = Mounted::start();
    // Over an existing file.
    fs::write(m.path("a"), b"A").expect("write a");
    fs::write(m.path("b"), b"B").expect("write b");
    fs::rename(m.path("a"), m.path("b")).expect("rename over a file");
    assert_eq!(read(&m.path("b")), b"A");
    assert_eq!(errno(fs::metadata(m.path("a"))), libc::ENOENT);

    // A directory with contents, into another directory (other partitions: never EXDEV).
    fs::create_dir_all(m.path("src/inner")).expect("mkdir -p");
    fs::write(m.path("src/inner/f"), b"deep").expect("write deep");
    fs::create_dir(m.path("dst")).expect("mkdir dst");
    fs::rename(m.path("src"), m.path("dst/moved")).expect("rename a directory");
    assert_eq!(read(&m.path("dst/moved/inner/f")), b"deep");
    assert_eq!(errno(fs::metadata(m.path("src"))), libc::ENOENT);

    // Over an empty directory, and not over a non-empty one.
    fs::create_dir(m.path("empty")).expect("mkdir empty");
    fs::create_dir(m.path("full")).expect("mkdir full");
    fs::write(m.path("full/x"), b"x").expect("write x");
    fs::create_dir(m.path("d2")).expect("mkdir d2");
    fs::rename(m.path("d2"), m.path("empty")).expect("rename over an empty dir");
    assert_eq!(
        errno(fs::rename(m.path("empty"), m.path("full"))),
        libc::ENOTEMPTY
    );
    assert_eq!(errno(fs::rename(m.path("b"), m.path("full"))), libc::EISDIR);
    assert_eq!(
        errno(fs::rename(m.path("full"), m.path("b"))),
        libc::ENOTDIR
    );

    // renameat2 flags.
    fs::write(m.path("p"), b"P").expect("write p");
    fs::write(m.path("q"), b"Q").expect("write q");
    let r = rustix::fs::renameat_with(CWD, m.path("p"), CWD, m.path("q"), RenameFlags::NOREPLACE);
    assert_eq!(r.map_err(|e| e.raw_os_error()), Err(libc::EEXIST));
    rustix::fs::renameat_with(CWD, m.path("p"), CWD, m.path("q"), RenameFlags::EXCHANGE)
        .expect("exchange");
    assert_eq!(read(&m.path("p")), b"Q");
    assert_eq!(read(&m.path("q")), b"P");

    // Hard links and link counts.
    fs::write(m.path("orig"), b"linked").expect("write orig");
    fs::hard_link(m.path("orig"), m.path("dst/alias")).expect("link");
    assert_eq!(fs::metadata(m.path("orig")).expect("stat").nlink(), 2);
    assert_eq!(
        fs::metadata(m.path("orig")).expect("stat").ino(),
        fs::metadata(m.path("dst/alias")).expect("stat").ino()
    );
    fs::remove_file(m.path("orig")).expect("unlink one name");
    assert_eq!(fs::metadata(m.path("dst/alias")).expect("stat").nlink(), 1);
    assert_eq!(read(&m.path("dst/alias")), b"linked");
    assert_eq!(
        errno(fs::hard_link(m.path("dst"), m.path("dlink"))),
        libc::EPERM
    );

    // Symlinks: relative and absolute targets, readlink, lstat.
    std::os::unix::fs::symlink("dst/alias", m.path("rel")).expect("symlink");
    assert_eq!(
        fs::read_link(m.path("rel")).expect("readlink").to_str(),
        Some("dst/alias")
    );
    assert_eq!(read(&m.path("rel")), b"linked");
    assert!(fs::symlink_metadata(m.path("rel"))
        .expect("lstat")
        .file_type()
        .is_symlink());
    std::os::unix::fs::symlink("/nowhere/at/all", m.path("dangling")).expect("symlink");
    assert_eq!(errno(fs::metadata(m.path("dangling"))), libc::ENOENT);
}

#[test]
fn attributes_and_permissions_of_another_user() {
    let m = Mounted::start();
    let p = m.path("f");
    fs::write(&p, b"secret").expect("write");

    // chmod, chown, utimens.
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).expect("chmod");
    assert_eq!(fs::metadata(&p).expect("stat").mode() & 0o7777, 0o600);
    std::os::unix::fs::chown(&p, Some(1234), Some(5678)).expect("chown");
    let a = fs::metadata(&p).expect("stat");
    assert_eq!((a.uid(), a.gid()), (1234, 5678));
    std::os::unix::fs::chown(&p, Some(0), Some(0)).expect("chown back");
    let t = SystemTime::UNIX_EPOCH + Duration::new(1_600_000_000, 123_456_789);
    let f = File::options().write(true).open(&p).expect("open");
    f.set_times(fs::FileTimes::new().set_accessed(t).set_modified(t))
        .expect("utimens");
    drop(f);
    let a = fs::metadata(&p).expect("stat");
    assert_eq!((a.mtime(), a.mtime_nsec()), (1_600_000_000, 123_456_789));
    assert_eq!(a.atime(), 1_600_000_000);
    // UTIME_NOW (what `touch` sends).
    let st = Command::new("touch").arg(&p).status().expect("run touch");
    assert!(st.success());
    assert!(fs::metadata(&p).expect("stat").mtime() > 1_600_000_000);

    // Created files belong to their creator.
    fs::create_dir(m.path("pub")).expect("mkdir");
    fs::set_permissions(m.path("pub"), fs::Permissions::from_mode(0o777)).expect("chmod 777");
    let as_nobody = |script: &str| run_as_nobody(&m.root, script);
    let out = as_nobody("echo mine > pub/made && stat -c '%u %g' pub/made");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{NOBODY} {NOBODY}")
    );

    // The kernel checks mode bits for other users.
    assert!(
        !as_nobody("cat f").status.success(),
        "0600 root file is unreadable"
    );
    fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).expect("chmod 644");
    let out = as_nobody("cat f");
    assert!(out.status.success());
    assert_eq!(out.stdout, b"secret");
    assert!(
        !as_nobody("echo x >> f").status.success(),
        "0644 is read-only to others"
    );
    assert!(
        !as_nobody("touch newfile").status.success(),
        "root dir is 0755"
    );
    fs::set_permissions(m.path("pub"), fs::Permissions::from_mode(0o755)).expect("chmod 755");
    assert!(
        !as_nobody("rm pub/made").status.success(),
        "no write permission on the dir"
    );
    fs::set_permissions(m.path("pub"), fs::Permissions::from_mode(0o1777)).expect("sticky");
    fs::write(m.path("pub/roots"), b"r").expect("write as root");
    assert!(
        !as_nobody("rm -f pub/roots").status.success(),
        "sticky dir protects others' files"
    );
    assert!(
        as_nobody("rm pub/made").status.success(),
        "own file in a sticky dir"
    );
}

#[test]
fn extended_attributes() {
    let m = Mounted::start();
    let p = m.path("f");
    fs::write(&p, b"x").expect("write");
    rustix::fs::setxattr(&p, "user.color", b"blue", XattrFlags::empty()).expect("setxattr");
    // Size probe, exact read, too small a buffer.
    assert_eq!(
        rustix::fs::getxattr_query(&p, "user.color").expect("probe"),
        4
    );
    let mut buf = [0u8; 16];
    let n = rustix::fs::getxattr(&p, "user.color", &mut buf[..]).expect("getxattr");
    assert_eq!(&buf[..n], b"blue");
    let mut small = [0u8; 2];
    let r = rustix::fs::getxattr(&p, "user.color", &mut small[..]);
    assert_eq!(r.map_err(|e| e.raw_os_error()), Err(libc::ERANGE));
    // Create/replace flags.
    let r = rustix::fs::setxattr(&p, "user.color", b"red", XattrFlags::CREATE);
    assert_eq!(r.map_err(|e| e.raw_os_error()), Err(libc::EEXIST));
    let r = rustix::fs::setxattr(&p, "user.size", b"9", XattrFlags::REPLACE);
    assert_eq!(r.map_err(|e| e.raw_os_error()), Err(libc::ENODATA));
    rustix::fs::setxattr(&p, "user.size", b"9", XattrFlags::CREATE).expect("create xattr");
    // List.
    let mut list = [0u8; 256];
    let n = rustix::fs::listxattr(&p, &mut list[..]).expect("listxattr");
    let mut names: Vec<&[u8]> = list[..n]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .collect();
    names.sort();
    assert_eq!(names, vec![&b"user.color"[..], b"user.size"]);
    let r = rustix::fs::listxattr(&p, &mut small[..]);
    assert_eq!(r.map_err(|e| e.raw_os_error()), Err(libc::ERANGE));
    // Remove.
    rustix::fs::removexattr(&p, "user.color").expect("removexattr");
    let r = rustix::fs::getxattr(&p, "user.color", &mut buf[..]);
    assert_eq!(r.map_err(|e| e.raw_os_error()), Err(libc::ENODATA));

    // A file this mount has just created has no xattrs (answered without asking the
    // cluster while the handle of the create is open), and shows its own at once.
    let mut f = File::create(m.path("new")).expect("create");
    f.write_all(b"x").expect("write");
    let r = rustix::fs::fgetxattr(&f, "user.color", &mut buf[..]);
    assert_eq!(r.map_err(|e| e.raw_os_error()), Err(libc::ENODATA));
    assert_eq!(rustix::fs::flistxattr(&f, &mut list[..]), Ok(0));
    rustix::fs::fsetxattr(&f, "user.color", b"red", XattrFlags::empty()).expect("fsetxattr");
    let n = rustix::fs::fgetxattr(&f, "user.color", &mut buf[..]).expect("fgetxattr");
    assert_eq!(&buf[..n], b"red");
    let n = rustix::fs::flistxattr(&f, &mut list[..]).expect("flistxattr");
    assert_eq!(&list[..n], b"user.color\0");
    drop(f);
    // The same on a file created again after it was unlinked, and once it is closed.
    fs::remove_file(m.path("new")).expect("unlink");
    let f = File::create(m.path("new")).expect("create again");
    assert_eq!(rustix::fs::flistxattr(&f, &mut list[..]), Ok(0));
    drop(f);
    let n = rustix::fs::listxattr(m.path("new"), &mut list[..]).expect("listxattr");
    assert_eq!(n, 0);

    // Symlinks do not show Talon's internal target attribute.
    std::os::unix::fs::symlink("f", m.path("l")).expect("symlink");
    let n = rustix::fs::llistxattr(m.path("l"), &mut list[..]).expect("llistxattr");
    assert_eq!(n, 0);

    // A directory's class, through the virtual xattr.
    fs::create_dir(m.path("d")).expect("mkdir");
    let n = rustix::fs::getxattr(m.path("d"), "user.talon.class", &mut buf[..]).expect("class");
    assert_eq!(&buf[..n], b"relaxed");
    rustix::fs::setxattr(
        m.path("d"),
        "user.talon.class",
        b"strict",
        XattrFlags::empty(),
    )
    .expect("set the class of an empty dir");
    let n = rustix::fs::getxattr(m.path("d"), "user.talon.class", &mut buf[..]).expect("class");
    assert_eq!(&buf[..n], b"strict");
    fs::write(m.path("d/x"), b"").expect("write into it");
    let r = rustix::fs::setxattr(
        m.path("d"),
        "user.talon.class",
        b"relaxed",
        XattrFlags::empty(),
    );
    assert_eq!(r.map_err(|e| e.raw_os_error()), Err(libc::ENOTEMPTY));
    // A directory under a strict prefix is strict.
    fs::create_dir(m.path("ckpt")).expect("mkdir ckpt");
    let n = rustix::fs::getxattr(m.path("ckpt"), "user.talon.class", &mut buf[..]).expect("class");
    assert_eq!(&buf[..n], b"strict");
}

#[test]
fn statfs_and_other_views_of_the_mount() {
    let m = Mounted::start();
    fs::write(m.path("f"), vec![7u8; 10_000]).expect("write");
    let st = rustix::fs::statvfs(&m.root).expect("statvfs");
    assert!(st.f_files > 0 && st.f_ffree > 0 && st.f_bavail > 0);
    assert_eq!(st.f_namemax, 255);
    // One node, one copy: the mount's size is that of the node's data file system.
    let disk = rustix::fs::statvfs(std::env::temp_dir()).expect("statvfs of the temp dir");
    let (size, disk_size) = (st.f_blocks * st.f_frsize, disk.f_blocks * disk.f_frsize);
    assert!(
        size <= disk_size && size + st.f_frsize >= disk_size,
        "mount size {size}, data file system size {disk_size}"
    );
    assert!(st.f_bfree <= st.f_blocks && st.f_bavail <= st.f_bfree);
    // Creating a file through the library shows in the mount (relaxed: within the TTL).
    m.block_on(m.client.create_file("/from-lib", 0o644))
        .expect("create via library");
    assert!(fuse_support::eventually(Duration::from_secs(30), || m
        .path("from-lib")
        .exists()));
    // And what the mount creates shows in the library.
    fs::write(m.path("from-mount"), b"hi").expect("write");
    let a = m
        .block_on(m.client.stat("/from-mount"))
        .expect("stat via library");
    assert_eq!(a.size, 2);
}

#[test]
fn file_opened_with_o_excl_in_open_mode() {
    let m = Mounted::start();
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .open(m.path("new"))
        .expect("create_new");
    drop(f);
    assert_eq!(
        fs::metadata(m.path("new")).expect("stat").mode() & 0o777,
        0o640
    );
}

/// Sets `p`'s atime and mtime an hour back, so any change after it shows as newer without
/// waiting for the clock; returns the mtime and ctime it then has.
fn age(p: &std::path::Path) -> (i64, i64) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock after 1970");
    let hour_ago = rustix::fs::Timespec {
        tv_sec: now.as_secs() as i64 - 3600,
        tv_nsec: 0,
    };
    let t = rustix::fs::Timestamps {
        last_access: hour_ago,
        last_modification: hour_ago,
    };
    rustix::fs::utimensat(CWD, p, &t, rustix::fs::AtFlags::empty()).expect("utimensat");
    let m = fs::metadata(p).expect("stat");
    (m.mtime(), m.ctime())
}

/// A file's ctime with its nanoseconds, to tell changes within one second apart.
fn ctime(p: &std::path::Path) -> (i64, i64) {
    let m = fs::metadata(p).expect("stat");
    (m.ctime(), m.ctime_nsec())
}

/// POSIX: a create, remove, rename or link updates the parent's mtime and ctime, and a
/// subdirectory the parent's link count; a link or unlink the file's link count and ctime.
/// The mount that made the change sees all of it at the next stat, in both classes, also
/// when the directory's inode lives on another partition than its entries (the case
/// checked here). `root` is a directory of class `class`.
fn own_changes_show_at_once(m: &Mounted, root: &str, class: talon_model::Class) {
    const NAMES: [&[u8]; 4] = [b"f", b"sub", b"g", b"h"];
    fs::create_dir(m.path(root)).expect("mkdir");
    let parts = m.client.cluster_map().partitions;
    let d = (0..32)
        .map(|i| {
            let d = m.path(&format!("{root}/run{i}"));
            fs::create_dir(&d).expect("mkdir");
            let ino = fs::metadata(&d).expect("stat").ino();
            (d, talon_model::Ino(ino))
        })
        .find(|(_, ino)| {
            NAMES
                .iter()
                .all(|n| entry_partition(*ino, n, class, parts) != ino.home())
        })
        .map(|(d, _)| d)
        .expect("a directory whose entries live away from its inode");
    let changed = |what: &str, f: &dyn Fn()| {
        let (mtime, _) = age(&d);
        let nlink = fs::metadata(&d).expect("stat").nlink();
        f();
        let after = fs::metadata(&d).expect("stat");
        assert!(
            after.mtime() > mtime,
            "{class:?} {what}: parent mtime moved"
        );
        assert!(
            after.ctime() >= after.mtime(),
            "{class:?} {what}: parent ctime moved"
        );
        (nlink, after.nlink())
    };
    let file = d.join("f");
    changed("create", &|| fs::write(&file, b"x").expect("create"));
    let (before, after) = changed("mkdir", &|| fs::create_dir(d.join("sub")).expect("mkdir"));
    assert_eq!(
        after,
        before + 1,
        "{class:?}: mkdir adds a link to the parent"
    );
    let was = ctime(&file);
    changed("link", &|| fs::hard_link(&file, d.join("g")).expect("link"));
    assert_eq!(
        fs::metadata(&file).expect("stat").nlink(),
        2,
        "{class:?}: link count"
    );
    assert!(ctime(&file) > was, "{class:?}: link moves the file's ctime");
    changed("rename", &|| {
        fs::rename(d.join("g"), d.join("h")).expect("rename")
    });
    let was = ctime(&file);
    changed("unlink", &|| fs::remove_file(d.join("h")).expect("unlink"));
    assert_eq!(
        fs::metadata(&file).expect("stat").nlink(),
        1,
        "{class:?}: link count"
    );
    assert!(
        ctime(&file) > was,
        "{class:?}: unlink moves the file's ctime"
    );
    let (before, after) = changed("rmdir", &|| fs::remove_dir(d.join("sub")).expect("rmdir"));
    assert_eq!(
        after + 1,
        before,
        "{class:?}: rmdir takes a link from the parent"
    );
}

#[test]
fn strict_directories_show_their_changes_at_once() {
    let m = Mounted::start();
    own_changes_show_at_once(&m, "ckpt", talon_model::Class::Strict);
}

#[test]
fn relaxed_directories_show_this_mounts_changes_at_once() {
    let m = Mounted::start();
    own_changes_show_at_once(&m, "data", talon_model::Class::Relaxed);
}

/// A write through one handle of this mount shows through its other handles at once, as on
/// a local file system, and to every later open once committed, in `root`. A read-only
/// handle held a small file's body from its open on, so it went on reading the old
/// contents, and what it read filled the kernel's page cache, which a relaxed file keeps
/// across opens: a new open after the writer's close read the old contents too.
fn a_change_through_one_handle_shows_through_the_others(m: &Mounted, root: &str) {
    fs::create_dir_all(m.path(root)).expect("mkdir");
    // (read through the reader before the writer's close, the reader opened read-write)
    for (read_before_close, reader_writes) in [(false, false), (true, false), (false, true)] {
        let p = m.path(&format!(
            "{root}/shared-{read_before_close}-{reader_writes}"
        ));
        fs::write(&p, vec![b'a'; 8192]).expect("create");
        let reader = OpenOptions::new()
            .read(true)
            .write(reader_writes)
            .open(&p)
            .expect("open a reader");
        let mut buf = vec![0u8; 8192];
        reader.read_exact_at(&mut buf, 0).expect("read");
        assert_eq!(buf, vec![b'a'; 8192]);
        let writer = OpenOptions::new()
            .write(true)
            .open(&p)
            .expect("open a writer");
        writer.write_all_at(&[b'b'; 4096], 0).expect("write");
        let mut want = vec![b'b'; 4096];
        want.extend_from_slice(&[b'a'; 4096]);
        if read_before_close {
            // The kernel asks for the file's attributes again after the write, sees the
            // writer's newer mtime and drops its pages: the read comes to the mount.
            reader
                .read_exact_at(&mut buf, 0)
                .expect("read before the close");
            assert!(
                buf == want,
                "{root}: the reader sees the write before the close"
            );
        }
        drop(writer);
        reader
            .read_exact_at(&mut buf, 0)
            .expect("read after the close");
        assert!(buf == want, "{root}: the reader sees the committed change");
        assert!(
            read(&p) == want,
            "{root}: a new open sees the committed change"
        );
    }
}

#[test]
fn a_change_through_one_handle_shows_through_the_others_in_both_classes() {
    let m = Mounted::start();
    a_change_through_one_handle_shows_through_the_others(&m, "data");
    a_change_through_one_handle_shows_through_the_others(&m, "ckpt");
}

#[test]
fn truncating_an_open_file_changes_its_times_at_once() {
    let m = Mounted::start();
    let p = m.path("t");
    fs::write(&p, b"0123456789").expect("write");
    let (mtime, ctime) = age(&p);
    let f = OpenOptions::new().write(true).open(&p).expect("open");
    f.set_len(3).expect("ftruncate");
    let st = fs::metadata(&p).expect("stat");
    assert_eq!(st.len(), 3);
    assert!(st.mtime() > mtime && st.ctime() >= ctime, "times moved");
    drop(f);
    assert_eq!(fs::metadata(&p).expect("stat").len(), 3);
}

#[test]
fn setgid_directories_pass_their_group_on() {
    // A directory with the setgid bit gives its group to every new entry, and the bit to new
    // subdirectories; elsewhere an entry takes its creator's group.
    const GROUP: u32 = 4242;
    let m = Mounted::start();
    for (root, class) in [("data", "relaxed"), ("ckpt", "strict")] {
        let d = m.path(&format!("{root}/shared"));
        fs::create_dir_all(&d).expect("mkdir");
        rustix::fs::chown(&d, None, Some(rustix::fs::Gid::from_raw(GROUP))).expect("chgrp");
        fs::set_permissions(&d, fs::Permissions::from_mode(0o2775)).expect("chmod g+s");
        fs::write(d.join("f"), b"x").expect("create");
        fs::create_dir(d.join("sub")).expect("mkdir sub");
        std::os::unix::fs::symlink("f", d.join("l")).expect("symlink");
        for name in ["f", "sub", "l"] {
            let st = fs::symlink_metadata(d.join(name)).expect("stat");
            assert_eq!(
                st.gid(),
                GROUP,
                "{class}: {name} takes the directory's group"
            );
        }
        let sub = fs::metadata(d.join("sub")).expect("stat sub");
        assert_ne!(
            sub.mode() & libc::S_ISGID,
            0,
            "{class}: a subdirectory stays setgid"
        );
        let plain = m.path(&format!("{root}/plain"));
        fs::write(&plain, b"x").expect("create outside");
        assert_eq!(
            fs::metadata(&plain).expect("stat").gid(),
            0,
            "{class}: creator's group"
        );
    }
}

/// Writing a new small file through the mount (`open(O_CREAT)`, write, close) costs five
/// requests of the kernel's that need the cluster: its lookup of the new name, the create,
/// its check for `security.capability` before the first write, the body's write at close,
/// and its getattr of the parent (the parent's attributes changed) before the next lookup
/// there. In a relaxed directory two of them are answered by the mount: the check (a new
/// file has no xattrs) and the parent's attributes (the create's answer carried them). The
/// create's answer opens the empty file: no round trip fetches what a new file holds.
/// Removing the files again is one round trip each in a relaxed directory: the unlink (the
/// kernel knows the name; the parent's attributes come with the previous unlink's answer).
/// The contents read back whole in both classes.
#[test]
fn a_new_file_opens_without_another_round_trip() {
    let m = Mounted::start();
    for dir in ["data", fuse_support::STRICT_PREFIX.trim_start_matches('/')] {
        fs::create_dir_all(m.path(dir)).expect("mkdir");
        let files = 20u64;
        let before = m.client.rpc_count();
        for i in 0..files {
            let mut f = File::create(m.path(&format!("{dir}/f{i}"))).expect("create");
            f.write_all(&[i as u8; 4096]).expect("write");
        }
        let per_file = (m.client.rpc_count() - before) as f64 / files as f64;
        eprintln!("{dir}: {per_file} RPCs per new file");
        if dir == "data" {
            // Lookup of the new name, create, the body at close; a stall of the machine
            // past the TTL may cost a few more.
            assert!(per_file <= 3.25, "{dir}: {per_file} RPCs per new file");
        }
        for i in 0..files {
            assert_eq!(read(&m.path(&format!("{dir}/f{i}"))), [i as u8; 4096]);
        }
        let before = m.client.rpc_count();
        for i in 0..files {
            fs::remove_file(m.path(&format!("{dir}/f{i}"))).expect("unlink");
        }
        let per_file = (m.client.rpc_count() - before) as f64 / files as f64;
        eprintln!("{dir}: {per_file} RPCs per unlink");
        if dir == "data" {
            assert!(per_file <= 1.25, "{dir}: {per_file} RPCs per unlink");
        }
        assert_eq!(
            errno(fs::metadata(m.path(&format!("{dir}/f0")))),
            libc::ENOENT
        );
    }
}

/// On three nodes, where a relaxed file's attributes and xattrs may be read from a
/// follower, the mount still sees its own changes at once: a mode after chmod, a size
/// after a write, an xattr after each set, a parent's link count after mkdir, and a link
/// count after unlink and after a rename over a name. The last two change an inode at its
/// home partition while the request goes to the name's; each is made after the session
/// window of the inode's creation has passed, so nothing else sends its reads to the leader.
#[test]
fn own_changes_to_relaxed_files_show_at_once_on_three_nodes() {
    let m = Mounted::start_with(3);
    let d = m.path("data");
    fs::create_dir(&d).expect("mkdir");
    let nlink = |p: &std::path::Path| fs::metadata(p).expect("stat").nlink();
    // Twice the staleness bound, and a margin.
    let window = Duration::from_millis(2 * fuse_support::STALENESS_MS + 200);
    for i in 0..3u32 {
        let (f, g, h) = (
            d.join(format!("f{i}")),
            d.join(format!("g{i}")),
            d.join(format!("h{i}")),
        );
        fs::write(&f, b"x").expect("create");
        fs::hard_link(&f, &g).expect("link");
        assert_eq!(nlink(&f), 2, "round {i}: after link");
        std::thread::sleep(window);
        fs::remove_file(&g).expect("unlink");
        assert_eq!(nlink(&f), 1, "round {i}: after unlink");

        fs::write(&h, b"y").expect("create another");
        fs::hard_link(&h, &g).expect("link it");
        std::thread::sleep(window);
        fs::rename(&f, &g).expect("rename over one of its names");
        assert_eq!(
            nlink(&h),
            1,
            "round {i}: after the rename replaced its other name"
        );

        fs::set_permissions(&g, fs::Permissions::from_mode(0o600 + i)).expect("chmod");
        assert_eq!(
            fs::metadata(&g).expect("stat").mode() & 0o777,
            0o600 + i,
            "round {i}: after chmod"
        );
        fs::write(&h, vec![7u8; 100 + i as usize]).expect("rewrite");
        assert_eq!(fs::metadata(&h).expect("stat").len(), 100 + u64::from(i));
        for v in 0..10 {
            let value = format!("v{i}.{v}");
            rustix::fs::setxattr(&h, "user.k", value.as_bytes(), XattrFlags::empty())
                .expect("setxattr");
            let mut buf = [0u8; 16];
            let n = rustix::fs::getxattr(&h, "user.k", &mut buf[..]).expect("getxattr");
            assert_eq!(&buf[..n], value.as_bytes(), "round {i}: after setxattr");
        }
        let before = nlink(&d);
        fs::create_dir(d.join(format!("s{i}"))).expect("mkdir");
        assert_eq!(nlink(&d), before + 1, "round {i}: after mkdir");
    }
}

/// A name missing from a relaxed directory is a negative entry for the relaxed TTL: probing
/// it again asks the cluster once per TTL, not once per probe (a strict directory asks every
/// time). This mount's own create of the name shows at once; a create the kernel did not
/// see (made through the library) within the bound, as another client's would.
#[test]
fn a_missing_relaxed_name_is_asked_for_once_per_ttl() {
    let m = Mounted::start();
    let probes = 20u64;
    for dir in ["data", fuse_support::STRICT_PREFIX.trim_start_matches('/')] {
        fs::create_dir_all(m.path(dir)).expect("mkdir");
        let missing = m.path(&format!("{dir}/missing"));
        let before = m.client.rpc_count();
        for _ in 0..probes {
            assert_eq!(errno(fs::metadata(&missing)), libc::ENOENT);
        }
        let rpcs = m.client.rpc_count() - before;
        eprintln!("{dir}: {rpcs} RPCs for {probes} probes of a missing name");
        if dir == "data" {
            // One lookup per TTL; a stall of the machine may cost a few more.
            assert!(rpcs <= 4, "{dir}: {rpcs} RPCs for {probes} probes");
        } else {
            assert!(rpcs >= probes, "{dir}: {rpcs} RPCs for {probes} probes");
        }
        File::create(&missing).expect("create through the mount");
        assert!(
            fs::metadata(&missing).is_ok(),
            "{dir}: own create shows at once"
        );
    }

    let other = m.path("data/made-elsewhere");
    assert_eq!(errno(fs::metadata(&other)), libc::ENOENT);
    m.block_on(m.client.create_file("/data/made-elsewhere", 0o644))
        .expect("create through the library");
    std::thread::sleep(Duration::from_millis(2 * fuse_support::STALENESS_MS));
    assert!(
        fs::metadata(&other).is_ok(),
        "a create made elsewhere shows within the bound"
    );
}

/// Runs shell `script` in `dir` as the unprivileged user `NOBODY`.
fn run_as_nobody(dir: &std::path::Path, script: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .expect("run as nobody")
}

/// The mount takes set-ID bits and capabilities from a file as a kernel file system does,
/// and so the kernel asks nothing before each write: a writer without `CAP_FSETID`
/// (here, another user) clears the set-user-ID bit and a group-executable set-group-ID bit
/// by writing, by truncating and by opening with `O_TRUNC`; root's write keeps them; a
/// chown clears them whoever makes it; every write takes `security.capability`. And a file
/// this mount did not just make is written without a request to the cluster per write(2):
/// before, the kernel asked for its `security.capability` before each one.
#[test]
fn writes_take_set_id_bits_and_capabilities_without_asking_first() {
    let m = Mounted::start();
    fs::create_dir(m.path("pub")).expect("mkdir");
    fs::set_permissions(m.path("pub"), fs::Permissions::from_mode(0o777)).expect("chmod");
    let p = m.path("pub/tool");
    fs::write(&p, b"#!/bin/sh\n").expect("write");
    let mode = |p: &std::path::Path| fs::metadata(p).expect("stat").mode() & 0o7777;
    let set_mode = |p: &std::path::Path, mode: u32| {
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod")
    };
    let as_nobody = |script: &str| {
        let out = run_as_nobody(&m.root, script);
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for script in [
        "echo x >> pub/tool",
        "truncate -s 3 pub/tool",
        "echo y > pub/tool",
    ] {
        set_mode(&p, 0o6777);
        as_nobody(script);
        assert_eq!(mode(&p), 0o0777, "{script}");
    }
    // Without group execute the set-group-ID bit is not a privilege, and stays.
    set_mode(&p, 0o6767);
    as_nobody("echo x >> pub/tool");
    assert_eq!(mode(&p), 0o2767);
    // Root may keep them.
    set_mode(&p, 0o6777);
    fs::OpenOptions::new()
        .append(true)
        .open(&p)
        .and_then(|mut f| f.write_all(b"root\n"))
        .expect("append as root");
    assert_eq!(mode(&p), 0o6777);
    std::os::unix::fs::chown(&p, Some(NOBODY), None).expect("chown");
    assert_eq!(mode(&p), 0o0777);

    // A valid capability set (revision 2, CAP_NET_BIND_SERVICE permitted), which every
    // write takes, root's too.
    let mut caps = Vec::new();
    for word in [0x0200_0000u32, 1 << 10, 0, 0, 0] {
        caps.extend_from_slice(&word.to_le_bytes());
    }
    let cap = "security.capability";
    for (who, append) in [
        (
            "root",
            &(|| fs::write(&p, b"new\n").expect("write as root")) as &dyn Fn(),
        ),
        ("nobody", &|| as_nobody("echo x >> pub/tool")),
    ] {
        rustix::fs::setxattr(&p, cap, &caps, XattrFlags::empty()).expect("set caps");
        let mut buf = [0u8; 64];
        assert_eq!(rustix::fs::getxattr(&p, cap, &mut buf[..]), Ok(caps.len()));
        append();
        assert_eq!(
            rustix::fs::getxattr(&p, cap, &mut buf[..]),
            Err(rustix::io::Errno::NODATA),
            "{who}'s write"
        );
    }

    // Many small writes to a file made before: no request per write.
    let f = m.path("data");
    fs::write(&f, vec![1u8; 1 << 20]).expect("write");
    let mut w = fs::OpenOptions::new().write(true).open(&f).expect("open");
    let before = m.client.rpc_count();
    for i in 0..64u8 {
        w.write_all(&[i; 8192]).expect("write");
    }
    drop(w);
    let rpcs = m.client.rpc_count() - before;
    // The commit at close, and a few more if the machine stalls past a TTL.
    assert!(rpcs <= 8, "{rpcs} requests to the cluster for 64 writes");
    let back = read(&f);
    assert_eq!(back.len(), 1 << 20);
    assert!(back[..64 * 8192]
        .chunks(8192)
        .enumerate()
        .all(|(i, c)| c == [i as u8; 8192]));
}
