//! A 1 GiB file written through a streaming `File` and read back streaming, compared piece
//! by piece against deterministically generated data: neither side ever holds the whole
//! file, and the File's memory stays bounded by its dirty and in-flight chunks. And Files
//! kept open past the servers' graces: a slow writer, files unlinked while open.

mod common;

use common::Fixture;
use std::time::Instant;
use talon_client::{MkdirOptions, OpenOptions};
use talon_model::Errno;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SIZE: u64 = 1 << 30;
/// Generated and compared in pieces of this size (not a multiple of the chunk size, so
/// pieces straddle chunk boundaries).
const PIECE: usize = 3 << 20 | 12345;

/// Fills `buf` with the bytes at `offset` of the test file: each 8-byte word is a hash of
/// its index, so any misplaced or stale range shows.
fn fill(offset: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        let pos = offset + i as u64;
        let word = (pos / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        *b = (word >> ((pos % 8) * 8)) as u8;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_streams_in_and_out() {
    let fx = Fixture::start(1).await;
    let c = &fx.client;
    c.mkdir("/big", MkdirOptions::default())
        .await
        .expect("mkdir");
    let t = Instant::now();
    let mut f = c
        .open("/big/one.gib", OpenOptions::create_truncate())
        .await
        .expect("open");
    let mut buf = vec![0u8; PIECE];
    let mut at = 0u64;
    while at < SIZE {
        let n = PIECE.min((SIZE - at) as usize);
        fill(at, &mut buf[..n]);
        f.write_all(&buf[..n]).await.expect("write");
        at += n as u64;
    }
    f.shutdown().await.expect("commit");
    drop(f);
    let w = t.elapsed().as_secs_f64();
    println!(
        "wrote 1 GiB in {w:.1} s ({:.0} MB/s)",
        SIZE as f64 / 1e6 / w
    );
    assert_eq!(c.stat("/big/one.gib").await.expect("stat").size, SIZE);

    let t = Instant::now();
    let mut r = c
        .open("/big/one.gib", OpenOptions::read_only())
        .await
        .expect("open");
    let mut want = vec![0u8; PIECE];
    let mut at = 0u64;
    while at < SIZE {
        let n = PIECE.min((SIZE - at) as usize);
        r.read_exact(&mut buf[..n]).await.expect("read");
        fill(at, &mut want[..n]);
        assert!(
            buf[..n] == want[..n],
            "bytes at {at}..{} differ",
            at + n as u64
        );
        at += n as u64;
    }
    assert_eq!(r.read(&mut buf).await.expect("read at the end"), 0, "EOF");
    let s = t.elapsed().as_secs_f64();
    println!("read 1 GiB in {s:.1} s ({:.0} MB/s)", SIZE as f64 / 1e6 / s);
    fx.shutdown().await;
}

/// A writer that keeps a large file open for longer than the servers' chunk grace (here 1 s,
/// ten minutes by default: a checkpoint of hundreds of GB, or a log kept open for a whole
/// run) keeps the chunks it stored early: its open session holds them until it commits.
/// Before sessions, the collector took them as a dead writer's, the commit named chunks no
/// longer there, and the file read EIO after a close that had succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_open_past_the_chunk_grace_keeps_its_chunks() {
    let fx = Fixture::start_with(1, |b| {
        b.file_sizes(16 << 10, CHUNK as u32).chunk_gc_grace_ms(1000)
    })
    .await;
    let c = &fx.client;
    let mut f = c
        .open("/slow", OpenOptions::create_truncate())
        .await
        .expect("open");
    let mut want = vec![0u8; 10 * CHUNK + 777];
    fill(0, &mut want);
    // Eight chunks: the File keeps at most four dirty, so the first ones are stored in the
    // background now.
    f.write_all(&want[..8 * CHUNK]).await.expect("write");
    // Several collector rounds past twice the grace (250 ms apart at this grace).
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    f.write_all(&want[8 * CHUNK..])
        .await
        .expect("write the rest");
    f.shutdown().await.expect("commit");
    drop(f);
    let got = c.read_file("/slow").await.expect("read back");
    assert!(
        got == want,
        "the file read back differs from what was written"
    );
    fx.shutdown().await;
}

/// A file whose last name goes while a File has it open lives until that File is closed, as
/// on a local file system, however long past the servers' unlinked grace (here 1 s, 30 s by
/// default): a temporary file unlinked at once and then written and read through its handle,
/// small or chunked, and a chunked checkpoint that another writer replaces by a rename while
/// it is read. Before open sessions held the file, the servers reclaimed it a grace after
/// the unlink: the reader's next chunk failed with EIO and the writers' commits with ENOENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_unlinked_while_open_lives_until_it_is_closed() {
    let fx = short_unlinked_grace(1).await;
    let c = &fx.client;
    let mut old = vec![0u8; 6 * CHUNK + 5];
    fill(1 << 40, &mut old);
    c.write_file("/ckpt", &old).await.expect("write ckpt");
    let mut reader = c
        .open("/ckpt", OpenOptions::read_only())
        .await
        .expect("open the checkpoint");
    let mut tmp = c
        .open("/tmp.big", OpenOptions::create_truncate())
        .await
        .expect("open tmp");
    let mut small = c
        .open("/tmp.small", OpenOptions::create_truncate())
        .await
        .expect("open small tmp");
    let mut big = vec![0u8; 9 * CHUNK + 321];
    fill(0, &mut big);
    tmp.write_all(&big[..5 * CHUNK]).await.expect("write");
    small.write_all(b"scratch, ").await.expect("write small");
    c.unlink("/tmp.big").await.expect("unlink tmp");
    c.unlink("/tmp.small").await.expect("unlink small tmp");
    c.write_file("/ckpt.new", b"the next checkpoint")
        .await
        .expect("write the next checkpoint");
    c.rename("/ckpt.new", "/ckpt").await.expect("replace");

    // Several of the collector's rounds (250 ms apart at this grace) past the grace.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let mut got = Vec::new();
    reader
        .read_to_end(&mut got)
        .await
        .expect("read the old checkpoint");
    assert!(got == old, "the replaced checkpoint read back differs");
    tmp.write_all(&big[5 * CHUNK..]).await.expect("write on");
    tmp.flush().await.expect("commit the unlinked file");
    assert!(tmp.read_at(0, big.len() as u64).await.expect("read back") == big);
    small.write_all(b"kept").await.expect("write small on");
    small.flush().await.expect("commit the small unlinked file");
    assert_eq!(small.read_at(0, 64).await.expect("read"), b"scratch, kept");
    assert_eq!(tmp.metadata().await.expect("stat").nlink, 0);

    // Closed, each goes at a following round.
    let inos = [reader.ino(), tmp.ino(), small.ino()];
    drop((reader, tmp, small));
    let gone = common::eventually(std::time::Duration::from_secs(30), || async {
        let mut all = true;
        for ino in inos {
            all &= c
                .getattr(ino)
                .await
                .is_err_and(|e| e.errno() == Errno::ENOENT);
        }
        all
    })
    .await;
    assert!(gone, "the closed unlinked files were not reclaimed");
    fx.shutdown().await;
}

/// On a nearly full node, which reclaims sooner than the unlinked grace (here 12 s, 30 s by
/// default), a chunked checkpoint replaced by a rename and one rewritten in place, each
/// while a reader of another client has it open, read back whole however long the readers
/// keep them open; so does the replaced one opened by inode after its rename, late in its
/// grace. Before, a nearly full node reclaimed at its next round, which came before a
/// reader younger than a quarter of the grace held its open session, and the reader's next
/// chunk failed; a file opened unlinked held its session only that quarter later too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_keep_what_a_nearly_full_node_reclaims() {
    let fx = Fixture::start_with(1, |b| {
        b.file_sizes(16 << 10, CHUNK as u32)
            .unlinked_grace_ms(12_000)
            .nearly_full()
    })
    .await;
    let c = &fx.client;
    c.mkdir("/run", MkdirOptions::default())
        .await
        .expect("mkdir");
    let mut old = [vec![0u8; 6 * CHUNK], vec![0u8; 6 * CHUNK]];
    fill(5 << 40, &mut old[0]);
    fill(6 << 40, &mut old[1]);
    let replaced = c.write_file("/run/a", &old[0]).await.expect("write a").ino;
    c.write_file("/run/b", &old[1]).await.expect("write b");
    let r = fx.other_client().await;
    let mut readers = Vec::new();
    for (name, want) in ["/run/a", "/run/b"].into_iter().zip(&old) {
        let mut f = r.open(name, OpenOptions::read_only()).await.expect("open");
        let mut first = vec![0u8; CHUNK];
        f.read_exact(&mut first)
            .await
            .expect("read the first chunk");
        assert!(first == want[..CHUNK], "{name}'s first chunk differs");
        readers.push(f);
    }

    c.write_file("/run/a.new", b"the next checkpoint")
        .await
        .expect("write the next checkpoint");
    c.rename("/run/a.new", "/run/a").await.expect("replace a");
    let new = rewrite_in_place(c, "/run/b", 7 << 40).await;

    // Late in the nearly full node's grace (half the unlinked grace), past a quarter of
    // the grace that a reader opened now would wait before it held its session.
    tokio::time::sleep(std::time::Duration::from_millis(4500)).await;
    let mut late = r
        .open_ino(replaced, OpenOptions::read_only())
        .await
        .expect("open the replaced checkpoint by inode");
    let node = &fx.cluster.node(1).expect("node").node;
    let holds = node
        .partitions
        .values()
        .flat_map(|p| p.store.open_holds(1000, |_| true).expect("scan"))
        .filter(|&(ino, _)| ino == replaced)
        .count();
    assert_eq!(
        holds, 2,
        "the first reader's session and the late one's, at its open"
    );
    // Past when the node would have reclaimed all three without their sessions (half the
    // grace, and a round: rounds every quarter).
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    for ((name, mut f), want) in ["/run/a", "/run/b"].into_iter().zip(readers).zip(&old) {
        let mut rest = Vec::new();
        f.read_to_end(&mut rest).await.expect("read on");
        assert!(rest == want[CHUNK..], "{name}'s old contents changed");
    }
    let mut got = Vec::new();
    late.read_to_end(&mut got)
        .await
        .expect("read the replaced checkpoint by inode");
    assert!(
        got == old[0],
        "the replaced checkpoint read by inode differs"
    );
    drop(late);
    assert!(c.read_file("/run/b").await.expect("read b") == new);

    // Closed, the old contents go: b's new chunks alone are left.
    let gone = common::eventually(std::time::Duration::from_secs(60), || async {
        chunk_count(&fx) == 6
    })
    .await;
    assert!(gone, "{} chunks left, 6 named", chunk_count(&fx));
    fx.shutdown().await;
}

/// Chunks of the tests with short graces.
const CHUNK: usize = 64 << 10;

/// Rewrites `path` in place, as `torch.save` to the same name does: a File opened with
/// `O_TRUNC`, six chunks of contents generated from `seed` written, committed at its
/// close. Returns what it wrote.
async fn rewrite_in_place(c: &talon_client::Client, path: &str, seed: u64) -> Vec<u8> {
    let mut contents = vec![0u8; 6 * CHUNK];
    fill(seed, &mut contents);
    let mut f = c
        .open(path, OpenOptions::create_truncate())
        .await
        .expect("open to rewrite");
    f.write_all(&contents).await.expect("write anew");
    f.shutdown().await.expect("commit the rewrite");
    contents
}

/// A cluster of `nodes` whose files past 16 KiB are stored in chunks of `CHUNK` bytes, and
/// whose unlinked files and chunks taken out of layouts are reclaimed after 1 s.
async fn short_unlinked_grace(nodes: u64) -> Fixture {
    Fixture::start_with(nodes, |b| {
        b.file_sizes(16 << 10, CHUNK as u32).unlinked_grace_ms(1000)
    })
    .await
}

/// Chunks on all of node `id`'s partitions.
fn chunk_count_on(fx: &Fixture, id: u64) -> usize {
    talon_testkit::chunk_count(&fx.cluster.node(id).expect("node").node)
}

/// Chunks on all of node 1's partitions (all of them, on one node).
fn chunk_count(fx: &Fixture) -> usize {
    chunk_count_on(fx, 1)
}

/// A checkpoint rewritten in place (`O_TRUNC`, as `torch.save` to the same name does)
/// while a reader and another writer have it open: neither loses a byte, however long past
/// the unlinked grace (here 1 s) they stay open, since their open sessions hold the chunks
/// the rewrite took out of the layout; the other writer's later commit, which names some of
/// them again (the last writer's layout wins), reads back whole. Once every File is closed,
/// the chunks no layout names any more go after that grace, not the chunk collector's (ten
/// minutes by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_rewritten_in_place_keeps_its_readers_and_gives_back_its_chunks() {
    let fx = short_unlinked_grace(1).await;
    let c = &fx.client;
    let mut v1 = vec![0u8; 6 * CHUNK];
    fill(1 << 40, &mut v1);
    c.write_file("/ckpt", &v1).await.expect("write v1");
    let mut reader = c
        .open("/ckpt", OpenOptions::read_only())
        .await
        .expect("open a reader");
    let mut patcher = c
        .open("/ckpt", OpenOptions::read_write())
        .await
        .expect("open a second writer");
    patcher.write_all(b"patched").await.expect("patch");

    let v2 = rewrite_in_place(c, "/ckpt", 2 << 40).await;
    assert!(c.read_file("/ckpt").await.expect("read v2") == v2);

    // Several of the collector's rounds (250 ms apart at this grace) past the grace.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let mut got = Vec::new();
    reader.read_to_end(&mut got).await.expect("read v1");
    assert!(got == v1, "the reader's contents changed under it");
    patcher.shutdown().await.expect("commit the patch");
    let mut patched = v1.clone();
    patched[..7].copy_from_slice(b"patched");
    assert!(
        c.read_file("/ckpt").await.expect("read the patch") == patched,
        "the last writer's layout, v1's chunks in it, differs"
    );
    drop((reader, patcher));

    // v1's chunks 1-5 are named again; its chunk 0 and all of v2's are not.
    let live = 6;
    let gone = common::eventually(std::time::Duration::from_secs(30), || async {
        chunk_count(&fx) == live
    })
    .await;
    assert!(gone, "{} chunks left, {live} named", chunk_count(&fx));
    assert!(c.read_file("/ckpt").await.expect("read back") == patched);
    fx.shutdown().await;
}

/// On three nodes (R = 3), the leader of a rewritten file's home stopped right after the
/// rewrite: the next leader finds the dropped chunks due afresh and reclaims them on every
/// partition that holds them, and the new contents read back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_a_rewrite_took_out_are_reclaimed_after_a_failover() {
    let mut fx = short_unlinked_grace(3).await;
    let c = fx.client.clone();
    let mut v1 = vec![0u8; 6 * CHUNK];
    fill(3 << 40, &mut v1);
    let ino = c.write_file("/ckpt", &v1).await.expect("write v1").ino;
    let mut v2 = vec![0u8; 6 * CHUNK];
    fill(4 << 40, &mut v2);
    c.write_file("/ckpt", &v2).await.expect("rewrite");
    let victim = common::settled_leader(&fx.cluster, ino.home()).await;
    fx.cluster.stop_node(victim).await;
    let survivor = if victim == 1 { 2 } else { 1 };
    let reclaimed = common::eventually(std::time::Duration::from_secs(60), || async {
        chunk_count_on(&fx, survivor) == 6
    })
    .await;
    assert!(
        reclaimed,
        "{} chunks left on node {survivor}, 6 named",
        chunk_count_on(&fx, survivor)
    );
    assert!(c.read_file("/ckpt").await.expect("read back") == v2);
    fx.shutdown().await;
}
