//! File contents round trips: whole-file writes and reads of sizes around the small-file
//! threshold and a multi-chunk file, the same through a streaming `File`, sparse files
//! reading zeros, a commit dropped before it finished, a sequential reader's requests, and
//! the errors of reading what is not a file.

mod common;

use common::{errno, Fixture};
use futures::FutureExt;
use talon_client::{Client, ClientOptions, Errno, MkdirOptions, OpenOptions};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use talon_testkit::pattern;

fn sizes(c: &Client) -> Vec<usize> {
    let t = c.cluster_map().small_file_max as usize;
    vec![0, 1, t - 1, t, t + 1, 10 << 20]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_files_round_trip_across_the_threshold() {
    let fx = Fixture::start(3).await;
    let c = &fx.client;
    c.mkdir("/rt", MkdirOptions::default())
        .await
        .expect("mkdir");
    let reader = fx.other_client().await;
    for (i, n) in sizes(c).into_iter().enumerate() {
        let path = format!("/rt/f{n}");
        let data = pattern(i as u64, n);
        let attr = c.write_file(&path, &data).await.expect("write_file");
        assert_eq!(attr.size, n as u64);
        let back = c.read_file(&path).await.expect("read_file");
        assert!(back == data, "{n} bytes read back as written");
        let by_ino = reader.read_file_ino(attr.ino).await.expect("read_file_ino");
        assert!(by_ino == data, "{n} bytes read by ino from another client");
        // Replace with a different size class: contents switch whole.
        let other = pattern(100 + i as u64, (n + 7) % 5000);
        c.write_file(&path, &other).await.expect("overwrite");
        assert!(c.read_file(&path).await.expect("read") == other);
        assert_eq!(c.stat(&path).await.expect("stat").size, other.len() as u64);
    }
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_files_round_trip_across_the_threshold() {
    let fx = Fixture::start(1).await;
    let c = &fx.client;
    c.mkdir("/st", MkdirOptions::default())
        .await
        .expect("mkdir");
    for (i, n) in sizes(c).into_iter().enumerate() {
        let path = format!("/st/f{n}");
        let data = pattern(i as u64 + 7, n);
        let mut f = c
            .open(&path, OpenOptions::create_truncate())
            .await
            .expect("open for writing");
        // Odd-sized writes, so pieces straddle chunk boundaries.
        for part in data.chunks(100_003) {
            f.write_all(part).await.expect("write");
        }
        f.shutdown().await.expect("commit");
        drop(f);
        let mut f = c.open(&path, OpenOptions::read_only()).await.expect("open");
        let mut back = Vec::new();
        f.read_to_end(&mut back).await.expect("read_to_end");
        assert!(back == data, "{n} bytes streamed back as written");
        assert!(c.read_file(&path).await.expect("read_file") == data);
        if n > 10 {
            let at = n as u64 / 3;
            f.seek(std::io::SeekFrom::Start(at)).await.expect("seek");
            let mut part = vec![0u8; 10];
            f.read_exact(&mut part).await.expect("read_exact");
            assert_eq!(part, data[at as usize..at as usize + 10]);
            let end = f.seek(std::io::SeekFrom::End(-3)).await.expect("seek end");
            assert_eq!(end, n as u64 - 3);
        }
    }
    fx.shutdown().await;
}

/// A commit its caller drops before it finished (a timeout around `flush`, say) loses nothing:
/// the next flush commits the same contents, small and chunked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_dropped_midway_loses_nothing() {
    let fx = Fixture::start(1).await;
    let c = &fx.client;
    c.mkdir("/cx", MkdirOptions::default())
        .await
        .expect("mkdir");
    let t = c.cluster_map().small_file_max as usize;
    for (i, n) in [1000, t + (9 << 20)].into_iter().enumerate() {
        let path = format!("/cx/f{i}");
        let data = pattern(i as u64 + 40, n);
        let mut f = c
            .open(&path, OpenOptions::create_truncate())
            .await
            .expect("open for writing");
        f.write_all(&data).await.expect("write");
        // Polled once, then dropped while its requests are under way.
        let dropped = f.flush().now_or_never();
        assert!(dropped.is_none(), "{n} bytes: the commit finished at once");
        f.flush().await.expect("flush after the dropped one");
        drop(f);
        assert!(c.read_file(&path).await.expect("read") == data, "{n} bytes");
    }
    fx.shutdown().await;
}

/// A reader going through a chunked file in order with positional reads (as a mount's
/// kernel does, 128 KiB at a time) asks for each chunk once, not once per read; reads out
/// of order, and reads of what the File itself wrote since, still read what is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequential_reader_asks_for_each_chunk_once() {
    let fx = Fixture::start(1).await;
    let c = &fx.client;
    c.mkdir("/sq", MkdirOptions::default())
        .await
        .expect("mkdir");
    let cs = c.cluster_map().chunk_size as usize;
    let data = pattern(77, 3 * cs + 12345);
    c.write_file("/sq/f", &data).await.expect("write");
    let mut f = c
        .open("/sq/f", OpenOptions::read_write())
        .await
        .expect("open");
    const READ: usize = 128 << 10;
    let before = c.rpc_count();
    let mut back = Vec::with_capacity(data.len());
    while back.len() < data.len() {
        let got = f
            .read_at(back.len() as u64, READ as u64)
            .await
            .expect("read");
        assert!(!got.is_empty(), "read at {} came back empty", back.len());
        back.extend_from_slice(&got);
    }
    let rpcs = c.rpc_count() - before;
    assert!(back == data, "read back in order as written");
    let reads = data.len().div_ceil(READ);
    assert!(
        rpcs <= 4 + 2,
        "{reads} reads of 4 chunks took {rpcs} requests"
    );
    // Out of order: backwards, by pieces that straddle chunks.
    let mut at = data.len();
    while at > 0 {
        let from = at.saturating_sub(300_007);
        let got = f
            .read_at(from as u64, (at - from) as u64)
            .await
            .expect("read backwards");
        assert!(got == data[from..at], "bytes {from}..{at}");
        at = from;
    }
    // The File's own writes show over what it fetched ahead.
    f.read_at(0, READ as u64).await.expect("read the start");
    f.write_at(READ as u64, b"own bytes").await.expect("write");
    let got = f.read_at(READ as u64, 9).await.expect("read own write");
    assert_eq!(&got, b"own bytes");
    f.flush().await.expect("commit");
    let got = f
        .read_at(READ as u64 - 3, 15)
        .await
        .expect("read after the commit");
    let mut want = data[READ - 3..READ].to_vec();
    want.extend_from_slice(b"own bytes");
    want.extend_from_slice(&data[READ + 9..READ + 12]);
    assert_eq!(got, want);
    fx.shutdown().await;
}

/// A streaming reader (`AsyncRead`, as `talon get` and `tokio::io::copy` read) has the
/// next chunk fetched while it works through the one it read, and asks for each chunk once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_reader_has_the_next_chunk_fetched_ahead() {
    let fx = Fixture::start(1).await;
    let c = &fx.client;
    c.mkdir("/st", MkdirOptions::default())
        .await
        .expect("mkdir");
    let cs = c.cluster_map().chunk_size as usize;
    let data = pattern(78, 3 * cs + 4321);
    c.write_file("/st/f", &data).await.expect("write");
    let mut f = c
        .open("/st/f", OpenOptions::read_only())
        .await
        .expect("open");
    let before = c.rpc_count();
    let mut first = vec![0u8; cs];
    f.read_exact(&mut first)
        .await
        .expect("read the first chunk");
    assert!(first == data[..cs], "the first chunk as written");
    // No read asks for it, yet the second chunk is on its way. (Within 3 s: the File's
    // open session, its only other request, starts a quarter of the unlinked grace, 7.5 s,
    // after the open.)
    let ahead = common::eventually(std::time::Duration::from_secs(3), || async {
        c.rpc_count() - before >= 2
    })
    .await;
    assert!(ahead, "the second chunk was not fetched ahead");
    let mut rest = Vec::new();
    f.read_to_end(&mut rest).await.expect("read the rest");
    assert!(rest == data[cs..], "the rest as written");
    let rpcs = c.rpc_count() - before;
    assert!(rpcs <= 4 + 1, "4 chunks streamed in {rpcs} requests");
    fx.shutdown().await;
}

/// What sequential readers hold beyond what they asked for stays within the client's
/// read-ahead budget: a reader that finds it spent is sent what it asks for and no more,
/// and gets its read-ahead again once another reader turns away from reading in order, or
/// its File is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_readers_share_the_read_ahead_budget() {
    let fx = Fixture::start(1).await;
    let cs = fx.client.cluster_map().chunk_size as u64;
    let opts = |read_ahead_bytes| ClientOptions {
        read_ahead_bytes,
        ..ClientOptions::default()
    };
    let addrs = fx.cluster.addrs();
    let connect = |o| Client::connect(&addrs, o);
    // Two chunks: no third for a reader of the second to fetch ahead.
    let data = pattern(79, 2 * cs as usize);
    fx.client.write_file("/budget", &data).await.expect("write");
    const READ: u64 = 128 << 10;
    async fn read(f: &mut talon_client::File, data: &[u8], at: u64) {
        let got = f.read_at(at, READ).await.expect("read");
        assert!(
            got == data[at as usize..(at + READ) as usize],
            "bytes at {at}"
        );
    }
    // No budget: every read is a request of its own.
    let c = connect(opts(0)).await.expect("connect");
    let mut f = c
        .open("/budget", OpenOptions::read_only())
        .await
        .expect("open");
    let before = c.rpc_count();
    for k in 0..8 {
        read(&mut f, &data, k * READ).await;
    }
    assert_eq!(c.rpc_count() - before, 8, "8 reads without read-ahead");
    // A budget of one chunk, which the first reader's rest of chunk 0 takes.
    let c = connect(opts(cs)).await.expect("connect");
    let mut a = c
        .open("/budget", OpenOptions::read_only())
        .await
        .expect("open a");
    let mut b = c
        .open("/budget", OpenOptions::read_only())
        .await
        .expect("open b");
    read(&mut a, &data, 0).await;
    let before = c.rpc_count();
    read(&mut b, &data, 0).await;
    read(&mut b, &data, READ).await;
    assert_eq!(c.rpc_count() - before, 2, "no room left for b's read-ahead");
    // a reads elsewhere, out of order: its read-ahead goes back.
    read(&mut a, &data, cs + 7 * READ).await;
    let before = c.rpc_count();
    read(&mut b, &data, 2 * READ).await;
    read(&mut b, &data, 3 * READ).await;
    read(&mut b, &data, 4 * READ).await;
    assert_eq!(
        c.rpc_count() - before,
        1,
        "b reads ahead once a turned away"
    );
    // b's takes the budget now; once b is closed, a reads ahead again.
    let before = c.rpc_count();
    read(&mut a, &data, cs + 8 * READ).await;
    read(&mut a, &data, cs + 9 * READ).await;
    assert_eq!(c.rpc_count() - before, 2, "no room left for a's read-ahead");
    b.close().await.expect("close b");
    let before = c.rpc_count();
    read(&mut a, &data, cs + 10 * READ).await;
    read(&mut a, &data, cs + 11 * READ).await;
    assert_eq!(c.rpc_count() - before, 1, "a reads ahead once b is closed");
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_files_read_zeros() {
    let fx = Fixture::start(1).await;
    let c = &fx.client;
    let t = c.cluster_map().small_file_max as u64;
    let cs = c.cluster_map().chunk_size as u64;
    c.mkdir("/sp", MkdirOptions::default())
        .await
        .expect("mkdir");

    // A small sparse file: a gap, then data.
    let mut f = c
        .open("/sp/small", OpenOptions::create_truncate())
        .await
        .expect("open");
    f.write_at(1000, b"tail").await.expect("write past the end");
    f.close().await.expect("close");
    let mut want = vec![0u8; 1004];
    want[1000..].copy_from_slice(b"tail");
    assert_eq!(c.read_file("/sp/small").await.expect("read"), want);

    // A chunked sparse file: data in chunk 0 and chunk 3, holes between, a hole at the end.
    let mut f = c
        .open("/sp/big", OpenOptions::create_truncate())
        .await
        .expect("open");
    f.write_at(5, b"head").await.expect("write");
    f.write_at(3 * cs + 17, b"middle").await.expect("write");
    f.set_len(5 * cs + 9).await.expect("extend");
    f.close().await.expect("close");
    let back = c.read_file("/sp/big").await.expect("read");
    assert_eq!(back.len() as u64, 5 * cs + 9);
    assert_eq!(&back[5..9], b"head");
    assert_eq!(
        &back[(3 * cs + 17) as usize..(3 * cs + 23) as usize],
        b"middle"
    );
    let nonzero = back.iter().filter(|b| **b != 0).count();
    assert_eq!(nonzero, b"headmiddle".iter().filter(|b| **b != 0).count());

    // Set_len past the threshold on a small file makes a hole-only chunked file.
    let mut f = c
        .open("/sp/grown", OpenOptions::create_truncate())
        .await
        .expect("open");
    f.set_len(t * 3).await.expect("grow");
    f.close().await.expect("close");
    let back = c.read_file("/sp/grown").await.expect("read");
    assert_eq!(back.len() as u64, t * 3);
    assert!(back.iter().all(|b| *b == 0));

    // Shrinking and growing again: the cut-off bytes come back as zeros, not old data.
    let data = pattern(3, (2 * cs + 100) as usize);
    let a = c.write_file("/sp/cut", &data).await.expect("write");
    c.truncate(a.ino, cs + 10).await.expect("shrink");
    c.truncate(a.ino, 2 * cs + 100).await.expect("grow");
    let back = c.read_file("/sp/cut").await.expect("read");
    assert_eq!(&back[..(cs + 10) as usize], &data[..(cs + 10) as usize]);
    assert!(back[(cs + 10) as usize..].iter().all(|b| *b == 0));
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_what_is_not_a_file_fails_like_posix() {
    let fx = Fixture::start(1).await;
    let c = &fx.client;
    c.mkdir("/e", MkdirOptions::default()).await.expect("mkdir");
    assert_eq!(errno(c.read_file("/e").await), Errno::EISDIR);
    assert_eq!(errno(c.read_file("/e/missing").await), Errno::ENOENT);
    c.write_file("/e/target", b"via a link")
        .await
        .expect("write");
    c.symlink("target", "/e/link").await.expect("symlink");
    assert_eq!(c.read_file("/e/link").await.expect("follow"), b"via a link");
    assert_eq!(
        errno(
            c.open(
                "/e/target",
                OpenOptions {
                    exclusive: true,
                    ..OpenOptions::create_truncate()
                }
            )
            .await
        ),
        Errno::EEXIST
    );
    let mut ro = c
        .open("/e/target", OpenOptions::read_only())
        .await
        .expect("open");
    assert_eq!(errno(ro.write_at(0, b"x").await), Errno(9), "EBADF");
    fx.shutdown().await;
}
