//! A 1 GiB file written through a streaming `File` and read back streaming, compared piece
//! by piece against deterministically generated data: neither side ever holds the whole
//! file, and the File's memory stays bounded by its dirty and in-flight chunks.

mod common;

use common::Fixture;
use std::time::Instant;
use talon_client::{MkdirOptions, OpenOptions};
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
