//! The server's file data path, through the raw protocol on a one-node cluster: small
//! bodies of every size class, chunked layouts with holes, truncates, checksums that turn
//! a flipped byte into EIO, and garbage collection of chunks no layout names.

mod common;

use common::{eventually, TestCluster};
use std::collections::HashMap;
use std::time::Duration;
use talon_model::placement::chunk_partition;
use talon_model::{Errno, Ino, TalonError, ROOT_INO};
use talon_proto::v1 as pb;
use talon_proto::v1::namespace_client::NamespaceClient;
use talon_testkit::{chunk_count, TestClusterBuilder};
use tonic::transport::Channel;

const P: u32 = 4;
const SMALL: u32 = 64 * 1024;
const CHUNK: u32 = 16 * 1024;

fn hdr(partition: u32) -> Option<pb::RequestHeader> {
    Some(pb::RequestHeader {
        partition,
        epoch: 0,
        relaxed_read: false,
        session_read: false,
    })
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    talon_testkit::pattern(seed, n)
}

struct Fx {
    cluster: TestCluster,
    c: NamespaceClient<Channel>,
    client: talon_client::Client,
}

async fn fixture(grace_ms: u64) -> Fx {
    fixture_with(grace_ms, grace_ms, None).await
}

/// A fixture whose chunk collector and unlinked files have graces of their own, and whose
/// partitions snapshot (and compact deleted chunks) after `snapshot_bytes` of log if given.
async fn fixture_with(
    chunk_grace_ms: u64,
    unlinked_grace_ms: u64,
    snapshot_bytes: Option<u64>,
) -> Fx {
    fixture_tuned(|b| {
        let b = b
            .chunk_gc_grace_ms(chunk_grace_ms)
            .unlinked_grace_ms(unlinked_grace_ms);
        match snapshot_bytes {
            Some(bytes) => b.snapshot_after_bytes(bytes),
            None => b,
        }
    })
    .await
}

/// The one-node fixture, its builder adjusted by `tune`.
async fn fixture_tuned(tune: impl FnOnce(TestClusterBuilder) -> TestClusterBuilder) -> Fx {
    let builder = TestCluster::builder()
        .nodes(1)
        .partitions(P)
        .replication(1)
        .file_sizes(SMALL, CHUNK);
    let cluster = tune(builder).start().await.expect("cluster");
    let addr = cluster.addrs()[0].clone();
    let c = NamespaceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let client = common::client(&cluster.addrs()).await;
    Fx { cluster, c, client }
}

impl Fx {
    async fn file(&self, name: &str) -> Ino {
        self.client
            .create(
                ROOT_INO,
                name.as_bytes(),
                talon_client::CreateSpec::file(0o644),
            )
            .await
            .expect("create")
            .ino
    }

    async fn write_small(&mut self, ino: Ino, body: Vec<u8>) -> Result<pb::Attr, TalonError> {
        let r = self
            .c
            .write_small(pb::WriteSmallRequest {
                header: hdr(ino.home()),
                ino: ino.0,
                body: body.into(),
                expect_generation: 0,
                drop_setid: false,
            })
            .await?;
        Ok(r.into_inner().attr.expect("attr"))
    }

    async fn open(&mut self, ino: Ino) -> Result<pb::OpenReply, TalonError> {
        Ok(self
            .c
            .open(pb::OpenRequest {
                header: hdr(ino.home()),
                ino: ino.0,
                want_body: true,
            })
            .await?
            .into_inner())
    }

    async fn put_chunk(
        &mut self,
        ino: Ino,
        write_id: u64,
        index: u32,
        data: Vec<u8>,
    ) -> Result<(), TalonError> {
        let p = chunk_partition(ino, index, P);
        self.c
            .put_chunk(pb::PutChunkRequest {
                header: hdr(p),
                ino: ino.0,
                write_id,
                index,
                data: data.into(),
            })
            .await?;
        Ok(())
    }

    async fn get_chunk(
        &mut self,
        ino: Ino,
        write_id: u64,
        index: u32,
    ) -> Result<Vec<u8>, TalonError> {
        self.get_chunk_at(ino, write_id, index, 0, CHUNK).await
    }

    /// Reads `length` bytes at `offset` of a chunk.
    async fn get_chunk_at(
        &mut self,
        ino: Ino,
        write_id: u64,
        index: u32,
        offset: u32,
        length: u32,
    ) -> Result<Vec<u8>, TalonError> {
        let p = chunk_partition(ino, index, P);
        let r = self
            .c
            .get_chunk(pb::GetChunkRequest {
                header: hdr(p),
                ino: ino.0,
                write_id,
                index,
                offset,
                length,
            })
            .await?;
        Ok(r.into_inner().data)
    }

    async fn commit(
        &mut self,
        ino: Ino,
        size: u64,
        chunks: Vec<pb::ChunkRef>,
    ) -> Result<pb::Attr, TalonError> {
        self.commit_held(ino, size, chunks, 0).await
    }

    /// As [`Fx::commit`], by a writer that holds open session `session` (0: none).
    async fn commit_held(
        &mut self,
        ino: Ino,
        size: u64,
        chunks: Vec<pb::ChunkRef>,
        session: u64,
    ) -> Result<pb::Attr, TalonError> {
        self.commit_viewing(ino, size, chunks, session, 0).await
    }

    /// As [`Fx::commit_held`], by a writer whose list of chunks started from the layout
    /// of generation `view` (0: unknown).
    async fn commit_viewing(
        &mut self,
        ino: Ino,
        size: u64,
        chunks: Vec<pb::ChunkRef>,
        session: u64,
        view: u64,
    ) -> Result<pb::Attr, TalonError> {
        let req = pb::CommitLayoutRequest {
            header: hdr(ino.home()),
            ino: ino.0,
            size,
            chunk_size: CHUNK,
            chunks,
            expect_generation: 0,
            open_session: session,
            view_generation: view,
            drop_setid: false,
        };
        Ok(self
            .c
            .commit_layout(req)
            .await?
            .into_inner()
            .attr
            .expect("attr"))
    }

    /// Starts (`renew` false) or renews open session `session` of `ino`: its lease, in ms.
    async fn hold(&mut self, ino: Ino, session: u64, renew: bool) -> Result<u64, TalonError> {
        self.hold_or_end(ino, session, renew, false).await
    }

    /// As [`Fx::hold`], or ends the session (`end`).
    async fn hold_or_end(
        &mut self,
        ino: Ino,
        session: u64,
        renew: bool,
        end: bool,
    ) -> Result<u64, TalonError> {
        let r = self
            .c
            .hold_open(pb::HoldOpenRequest {
                header: hdr(ino.home()),
                ino: ino.0,
                session,
                renew,
                end,
            })
            .await?;
        Ok(r.into_inner().lease_ms)
    }

    /// Writes `n` whole chunks under write id `w` and commits them as the file's layout;
    /// returns its contents.
    async fn write_chunked(&mut self, ino: Ino, w: u64, n: u32) -> Vec<u8> {
        let mut contents = Vec::new();
        for i in 0..n {
            let data = bytes(CHUNK as usize, w * 10 + u64::from(i));
            self.put_chunk(ino, w, i, data.clone()).await.expect("put");
            contents.extend(data);
        }
        let refs = (0..n)
            .map(|_| pb::ChunkRef {
                write_id: w,
                len: CHUNK,
            })
            .collect();
        self.commit(ino, u64::from(n) * u64::from(CHUNK), refs)
            .await
            .expect("commit");
        contents
    }

    /// Reads a whole file the way a client does: body, or chunks with holes and lens.
    async fn read(&mut self, ino: Ino) -> Vec<u8> {
        let o = self.open(ino).await.expect("open");
        let size = o.attr.as_ref().expect("attr").size as usize;
        let layout = o.layout.unwrap_or_default();
        let mut out = vec![0u8; size];
        if !layout.chunked {
            out[..o.body.len()].copy_from_slice(&o.body);
            return out;
        }
        for (i, c) in layout.chunks.iter().enumerate() {
            if c.write_id == 0 {
                continue;
            }
            let data = self
                .get_chunk(ino, c.write_id, i as u32)
                .await
                .expect("chunk");
            let start = i * CHUNK as usize;
            let n = (c.len as usize).min(data.len()).min(size - start);
            out[start..start + n].copy_from_slice(&data[..n]);
        }
        out
    }

    async fn truncate(&mut self, ino: Ino, size: u64) {
        let req = pb::SetAttrRequest {
            header: hdr(ino.home()),
            ino: ino.0,
            size: Some(size),
            ..Default::default()
        };
        self.c.set_attr(req).await.expect("truncate");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_bodies_round_trip_at_every_size() {
    let mut fx = fixture(600_000).await;
    for (i, n) in [0usize, 1, SMALL as usize - 1, SMALL as usize]
        .into_iter()
        .enumerate()
    {
        let ino = fx.file(&format!("s{i}")).await;
        let body = bytes(n, i as u64);
        let attr = fx.write_small(ino, body.clone()).await.expect("write");
        assert_eq!(attr.size, n as u64);
        assert_eq!(fx.read(ino).await, body, "size {n}");
        // One RPC by name: ReadWhole returns the body with the attributes.
        let r =
            fx.c.read_whole(pb::ReadWholeRequest {
                header: hdr(talon_model::placement::entry_partition(
                    ROOT_INO,
                    format!("s{i}").as_bytes(),
                    talon_model::Class::Relaxed,
                    P,
                )),
                parent: ROOT_INO.0,
                name: format!("s{i}").into_bytes(),
            })
            .await
            .expect("read whole")
            .into_inner();
        assert!(r.has_body);
        assert_eq!(r.body, body);
    }
    let ino = fx.file("too-big").await;
    let e = fx
        .write_small(ino, vec![0; SMALL as usize + 1])
        .await
        .expect_err("over threshold");
    assert!(matches!(e, TalonError::Invalid(_)), "{e}");
    // A directory has no body.
    let e = fx
        .write_small(ROOT_INO, vec![1])
        .await
        .expect_err("directory");
    assert_eq!(e.errno(), Errno::EISDIR);
    fx.cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_layouts_holes_and_truncates() {
    let mut fx = fixture(600_000).await;
    let ino = fx.file("big").await;
    let w = 7u64;
    let c0 = bytes(CHUNK as usize, 1);
    let c2 = bytes(CHUNK as usize / 2, 2);
    fx.put_chunk(ino, w, 0, c0.clone()).await.expect("chunk 0");
    fx.put_chunk(ino, w, 2, c2.clone()).await.expect("chunk 2");
    // Until committed, the file is still empty.
    assert_eq!(fx.read(ino).await, Vec::<u8>::new());
    let size = 3 * CHUNK as u64 + 100;
    let chunks = vec![
        pb::ChunkRef {
            write_id: w,
            len: CHUNK,
        },
        pb::ChunkRef {
            write_id: 0,
            len: 0,
        },
        pb::ChunkRef {
            write_id: w,
            len: CHUNK / 2,
        },
    ];
    let attr = fx.commit(ino, size, chunks).await.expect("commit");
    assert_eq!(attr.size, size);
    let mut want = vec![0u8; size as usize];
    want[..CHUNK as usize].copy_from_slice(&c0);
    want[2 * CHUNK as usize..2 * CHUNK as usize + c2.len()].copy_from_slice(&c2);
    assert_eq!(
        fx.read(ino).await,
        want,
        "hole and short chunk read as zeros"
    );
    // Shrink into chunk 0, then grow again: the cut-off bytes must come back as zeros.
    fx.truncate(ino, 1000).await;
    fx.truncate(ino, 2 * CHUNK as u64).await;
    let mut want = vec![0u8; 2 * CHUNK as usize];
    want[..1000].copy_from_slice(&c0[..1000]);
    assert_eq!(fx.read(ino).await, want);
    // Same for a small file.
    let s = fx.file("small").await;
    let body = bytes(5000, 3);
    fx.write_small(s, body.clone()).await.expect("write");
    fx.truncate(s, 10).await;
    fx.truncate(s, 20).await;
    let mut want = body[..10].to_vec();
    want.resize(20, 0);
    assert_eq!(fx.read(s).await, want);
    // Bad layouts are refused.
    let e = fx
        .commit(
            ino,
            10,
            vec![
                pb::ChunkRef {
                    write_id: w,
                    len: 1,
                },
                pb::ChunkRef {
                    write_id: w,
                    len: 1,
                },
            ],
        )
        .await
        .expect_err("too many chunks");
    assert!(matches!(e, TalonError::Invalid(_)), "{e}");
    let e = fx
        .put_chunk(ino, w, 1, vec![0; CHUNK as usize + 1])
        .await
        .expect_err("oversized chunk");
    assert!(matches!(e, TalonError::Invalid(_)), "{e}");
    fx.cluster.shutdown().await;
}

/// Flips one byte of `needle`'s copy in the files under `dir`; true if one was found.
fn flip_on_disk(dir: &std::path::Path, needle: &[u8]) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    for e in rd.flatten() {
        let path = e.path();
        if path.is_dir() {
            if flip_on_disk(&path, needle) {
                return true;
            }
            continue;
        }
        let Ok(mut data) = std::fs::read(&path) else {
            continue;
        };
        if let Some(at) = data.windows(needle.len()).position(|w| w == needle) {
            data[at + needle.len() / 2] ^= 0x40;
            std::fs::write(&path, &data).expect("write back");
            return true;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_is_an_io_error_never_bad_data() {
    let mut fx = fixture(600_000).await;
    let node = fx.cluster.node(1).expect("node").node.clone();
    // A small body.
    let ino = fx.file("jpeg").await;
    let body = bytes(20_000, 9);
    fx.write_small(ino, body.clone()).await.expect("write");
    // A chunk.
    let big = fx.file("ckpt").await;
    let chunk = bytes(CHUNK as usize, 10);
    fx.put_chunk(big, 5, 0, chunk.clone()).await.expect("chunk");
    fx.commit(
        big,
        CHUNK as u64,
        vec![pb::ChunkRef {
            write_id: 5,
            len: CHUNK,
        }],
    )
    .await
    .expect("commit");
    for part in node.partitions.values() {
        part.store.db().flush().expect("flush memtables");
    }
    let sm = node.config.data_dir.join("sm");
    assert!(
        flip_on_disk(&sm.join(ino.home().to_string()), &body[1000..1064]),
        "body not found on disk"
    );
    assert!(
        flip_on_disk(
            &sm.join(chunk_partition(big, 0, P).to_string()),
            &chunk[4000..4064]
        ),
        "chunk not found on disk"
    );
    let e = fx.open(ino).await.expect_err("corrupt body must not read");
    assert_eq!(e.errno(), Errno::EIO, "{e}");
    let e = fx
        .get_chunk(big, 5, 0)
        .await
        .expect_err("corrupt chunk must not read");
    assert_eq!(e.errno(), Errno::EIO, "{e}");
    fx.cluster.shutdown().await;
}

/// A chunk is stored in blocks with checksums of their own: a flipped byte on disk fails
/// the reads of its block (EIO), and only those; ranges over other blocks, in one piece or
/// several, read as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_fails_only_the_reads_of_its_block() {
    const BLOCK: u32 = talon_meta::keys::CHUNK_BLOCK as u32;
    let mut fx = fixture_tuned(|b| b.file_sizes(SMALL, 32 * BLOCK)).await;
    let node = fx.cluster.node(1).expect("node").node.clone();
    let big = fx.file("shard").await;
    let len = 31 * BLOCK + 500;
    let chunk = bytes(len as usize, 11);
    fx.put_chunk(big, 5, 0, chunk.clone()).await.expect("chunk");
    for part in node.partitions.values() {
        part.store.db().flush().expect("flush memtables");
    }
    let at = (20 * BLOCK + 4000) as usize;
    assert!(
        flip_on_disk(
            &node
                .config
                .data_dir
                .join("sm")
                .join(chunk_partition(big, 0, P).to_string()),
            &chunk[at..at + 64]
        ),
        "chunk not found on disk"
    );
    let whole = fx.get_chunk_at(big, 5, 0, 0, u32::MAX).await;
    assert!(whole.is_err(), "the whole chunk covers the corrupt block");
    let tail = fx.get_chunk_at(big, 5, 0, 21 * BLOCK, u32::MAX).await;
    assert!(
        tail.expect("the rest") == chunk[21 * BLOCK as usize..],
        "a length past any chunk"
    );
    for (offset, length) in [(0, 20 * BLOCK), (21 * BLOCK, 11 * BLOCK), (BLOCK - 3, 7)] {
        let got = fx
            .get_chunk_at(big, 5, 0, offset, length)
            .await
            .expect("read");
        let end = (offset + length).min(len) as usize;
        assert!(got == chunk[offset as usize..end], "{offset}+{length}");
    }
    for (offset, length) in [(0, len), (20 * BLOCK + 4000, 1), (19 * BLOCK, 2 * BLOCK)] {
        let e = fx
            .get_chunk_at(big, 5, 0, offset, length)
            .await
            .expect_err("a corrupt block must not read");
        assert_eq!(e.errno(), Errno::EIO, "{offset}+{length}: {e}");
    }
    fx.cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_no_layout_names_are_reclaimed() {
    // Long enough that the set-up below is done before anything becomes garbage.
    let mut fx = fixture(3000).await;
    let node = fx.cluster.node(1).expect("node").node.clone();
    let ino = fx.file("f").await;
    // Generation 1: 4 chunks, committed. Generation 2: rewrite all, committed.
    fx.write_chunked(ino, 1, 4).await;
    let want = fx.write_chunked(ino, 2, 4).await;
    // A writer that died before committing.
    fx.put_chunk(ino, 3, 0, bytes(CHUNK as usize, 99))
        .await
        .expect("put orphan");
    // A deleted file's chunks.
    let gone = fx.file("gone").await;
    fx.write_chunked(gone, 4, 1).await;
    fx.client.unlink("/gone").await.expect("unlink");
    assert_eq!(chunk_count(&node), 10);
    chunks_come_to(&node, 4, 120, "garbage chunks to be reclaimed").await;
    // The live generation still reads back.
    assert_eq!(fx.read(ino).await, want);
    fx.cluster.shutdown().await;
}

/// Chunks stored on all of `node`'s partitions.
/// A writer's open session keeps the chunks it stored, past the collector's grace, for as
/// long as it renews the session; one that stops renewing loses them, and is then refused
/// at its renewal and at its commit (EIO), rather than committing a layout that names chunks
/// no longer there. Expired sessions' records go too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_session_holds_its_chunks_while_renewed() {
    let mut fx = fixture(1000).await;
    let node = fx.cluster.node(1).expect("node").node.clone();
    const S: u64 = 0x12_3456;
    const T: u64 = 0x65_4321;
    let id = |session: u64, n: u64| session << 24 | n;
    let refs = |session: u64| {
        (1..=2)
            .map(|n| pb::ChunkRef {
                write_id: id(session, n),
                len: CHUNK,
            })
            .collect::<Vec<_>>()
    };
    for bad in [0, 1 << 40] {
        let e = fx
            .hold(Ino(ROOT_INO.0), bad, false)
            .await
            .expect_err("bad session");
        assert!(matches!(e, TalonError::Invalid(_)), "{e:?}");
    }
    let kept = fx.file("kept").await;
    let lapsed = fx.file("lapsed").await;
    assert_eq!(fx.hold(kept, S, false).await.expect("hold"), 1000);
    fx.hold(lapsed, T, false).await.expect("hold");
    let mut want = Vec::new();
    for (i, n) in [(0, 1), (1, 2)] {
        let data = bytes(CHUNK as usize, n);
        fx.put_chunk(kept, id(S, n), i, data.clone())
            .await
            .expect("put");
        fx.put_chunk(lapsed, id(T, n), i, data.clone())
            .await
            .expect("put");
        want.extend(data);
    }
    // Renewed every 300 ms for 5 s (the chunks' stamps a grace old, and confirmed so, many
    // times over): the renewed session's chunks stay, the other's go.
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        fx.hold(kept, S, true).await.expect("renew");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        chunk_count(&node),
        2,
        "only the renewed session's chunks are left"
    );
    let size = 2 * u64::from(CHUNK);
    fx.commit_held(kept, size, refs(S), S)
        .await
        .expect("commit");
    assert_eq!(fx.read(kept).await, want);
    // The lapsed writer is told, at its renewal and at its commit.
    let e = fx
        .hold(lapsed, T, true)
        .await
        .expect_err("renew a lapsed session");
    assert_eq!(e.errno(), Errno::EIO, "{e:?}");
    let e = fx
        .commit_held(lapsed, size, refs(T), T)
        .await
        .expect_err("commit");
    assert_eq!(e.errno(), Errno::EIO, "{e:?}");
    assert_eq!(
        fx.read(lapsed).await,
        Vec::<u8>::new(),
        "the file kept its contents"
    );
    // Its record is forgotten a grace after it expired.
    let holds = |node: &talon_meta::node::Node| -> Vec<(Ino, u64)> {
        node.partitions
            .values()
            .flat_map(|p| p.store.open_holds(1000, |_| true).expect("scan"))
            .collect()
    };
    eventually(
        Duration::from_secs(30),
        "the lapsed session's record to go",
        || {
            let h = holds(&node);
            async move { (!h.contains(&(lapsed, T))).then_some(()) }
        },
    )
    .await;
    fx.cluster.shutdown().await;
}

/// An unlinked file that an open session holds is not reclaimed, however long past its
/// unlinked grace, while the session is renewed: its holder (a temporary file's writer, a
/// reader of a replaced checkpoint) still reads it whole and commits to it. A session that
/// lapses holds nothing, and an ended one lets the file go at the next round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlinked_file_stays_while_an_open_session_holds_it() {
    // Leases of 2 s; unlinked files reclaimed after 1 s (rounds every 250 ms).
    let mut fx = fixture_with(2000, 1000, None).await;
    const S: u64 = 0x11;
    const T: u64 = 0x22;
    let held = fx.file("held").await;
    let lapsed = fx.file("lapsed").await;
    let free = fx.file("free").await;
    let mut want = HashMap::new();
    for (w, ino) in [(1, held), (2, lapsed), (3, free)] {
        want.insert(ino, fx.write_chunked(ino, w, 2).await);
    }
    fx.hold(held, S, false).await.expect("hold");
    fx.hold(lapsed, T, false).await.expect("hold");
    for name in ["/held", "/lapsed", "/free"] {
        fx.client.unlink(name).await.expect("unlink");
    }
    // Renewed every 300 ms for 6 s: the file nobody holds goes after its grace, the lapsed
    // one a lease later; the held one stays, whole, and takes a commit.
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        fx.hold(held, S, true).await.expect("renew");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for ino in [lapsed, free] {
        let e = fx.open(ino).await.expect_err("reclaimed");
        assert_eq!(e.errno(), Errno::ENOENT, "{ino}: {e:?}");
    }
    assert_eq!(fx.read(held).await, want[&held]);
    let attr = fx.write_small(held, b"a temporary file".to_vec()).await;
    assert_eq!(attr.expect("write an unlinked held file").nlink, 0);
    // Ended (its File closed): reclaimed at a following round.
    fx.c.hold_open(pb::HoldOpenRequest {
        header: hdr(held.home()),
        ino: held.0,
        session: S,
        renew: false,
        end: true,
    })
    .await
    .expect("end");
    reclaimed_within(&fx.c, held, 30, "the ended file's reclaim").await;
    fx.cluster.shutdown().await;
}

/// Waits up to `secs` for inode `ino` to be gone (an open by inode answers ENOENT).
async fn reclaimed_within(c: &NamespaceClient<Channel>, ino: Ino, secs: u64, what: &str) {
    eventually(Duration::from_secs(secs), what, || {
        let mut c = c.clone();
        async move {
            let r = c
                .open(pb::OpenRequest {
                    header: hdr(ino.home()),
                    ino: ino.0,
                    want_body: false,
                })
                .await;
            let gone = r
                .map_err(TalonError::from)
                .is_err_and(|e| e.errno() == Errno::ENOENT);
            gone.then_some(())
        }
    })
    .await;
}

/// The chunk collector pages through a partition's chunks: with rounds of four records and
/// the committed chunks first in each partition's key order, a dead writer's chunks after
/// them are still found and reclaimed, and the committed ones kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_past_a_rounds_page_are_reclaimed_too() {
    let mut fx = fixture_tuned(|b| b.chunk_gc_grace_ms(1000).gc_scan_records(4)).await;
    let node = fx.cluster.node(1).expect("node").node.clone();
    let ino = fx.file("big").await;
    // 24 committed chunks under write id 1: about six per partition, more than a page.
    let want = fx.write_chunked(ino, 1, 24).await;
    // A dead writer's 24, under a write id that sorts after it.
    for i in 0..24 {
        fx.put_chunk(ino, u64::MAX >> 1, i, bytes(16, u64::from(i)))
            .await
            .expect("put orphan");
    }
    assert_eq!(chunk_count(&node), 48);
    chunks_come_to(
        &node,
        24,
        60,
        "the dead writer's chunks past the first page reclaimed",
    )
    .await;
    assert_eq!(fx.read(ino).await, want);
    fx.cluster.shutdown().await;
}

/// Waits up to `secs` for `node` to hold `n` chunks, failing with `what` otherwise.
async fn chunks_come_to(node: &talon_meta::node::Node, n: usize, secs: u64, what: &str) {
    eventually(Duration::from_secs(secs), what, || {
        let got = chunk_count(node);
        async move { (got == n).then_some(()) }
    })
    .await;
}

/// A file reclaimed after its last name went takes its chunks with it, after the unlinked
/// grace (1 s here) and not the chunk collector's (ten minutes here): a checkpoint replaced
/// by a rename gives its chunks back at once, and its partitions compact them away (past
/// the floor of a snapshot's worth of log, one chunk here). So do the chunks an overwrite
/// took out of a live file's layout; the live layouts' stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_files_chunks_go_with_it() {
    let mut fx = fixture_with(600_000, 1000, Some(u64::from(CHUNK))).await;
    let node = fx.cluster.node(1).expect("node").node.clone();
    let old = fx.file("ckpt").await;
    fx.write_chunked(old, 1, 6).await;
    let over = fx.file("over").await;
    fx.write_chunked(over, 2, 2).await;
    let over_want = fx.write_chunked(over, 3, 2).await;
    let new = fx.file("ckpt.tmp").await;
    let new_want = fx.write_chunked(new, 4, 3).await;
    assert_eq!(chunk_count(&node), 13);
    fx.client
        .rename("/ckpt.tmp", "/ckpt")
        .await
        .expect("rename");
    eventually(
        Duration::from_secs(60),
        "the replaced checkpoint's chunks dropped and compacted away",
        || {
            let n = chunk_count(&node);
            let compacted = node
                .partitions
                .values()
                .all(|p| p.store.chunks_deleted_since_compaction() == 0);
            async move { (n == 5 && compacted).then_some(()) }
        },
    )
    .await;
    assert_eq!(fx.read(new).await, new_want);
    assert_eq!(fx.read(over).await, over_want);
    fx.cluster.shutdown().await;
}

/// A file rewritten in place (`O_TRUNC`, then written, as `torch.save` replaces a
/// checkpoint of the same name) gives back the chunks its old contents took after the
/// unlinked grace (1 s here), not the chunk collector's (ten minutes here), once no open
/// session holds the file; a held one keeps them until it ends. A writer whose view of the
/// layout predates their reclaim cannot name them again (EIO); it may commit the current
/// layout's chunks, and a writer with a newer view what it stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_a_rewrite_took_out_go_after_the_unlinked_grace() {
    let mut fx = fixture_with(600_000, 1000, None).await;
    let node = fx.cluster.node(1).expect("node").node.clone();
    const S: u64 = 0x33;
    let ckpt = fx.file("ckpt").await;
    fx.write_chunked(ckpt, 1, 4).await;
    let old_view = fx
        .open(ckpt)
        .await
        .expect("open")
        .attr
        .expect("attr")
        .generation;
    let held = fx.file("held").await;
    fx.write_chunked(held, 2, 2).await;
    // A reader or writer of `held` that stays open (its lease is the chunk grace).
    fx.hold(held, S, false).await.expect("hold");
    let want = fx.write_chunked(ckpt, 3, 3).await;
    let held_want = fx.write_chunked(held, 4, 2).await;
    assert_eq!(chunk_count(&node), 11);
    chunks_come_to(
        &node,
        7,
        60,
        "the rewritten checkpoint's old chunks reclaimed",
    )
    .await;
    // Rounds every 250 ms, the records due for 2 s by now: the held file keeps its old
    // chunks for as long as its session lasts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(chunk_count(&node), 7, "the held file's old chunks stay");
    fx.hold_or_end(held, S, false, true).await.expect("end");
    chunks_come_to(
        &node,
        5,
        60,
        "the held file's old chunks reclaimed once its session ended",
    )
    .await;
    assert_eq!(fx.read(ckpt).await, want);
    assert_eq!(fx.read(held).await, held_want);

    let chunk = |write_id| pb::ChunkRef {
        write_id,
        len: CHUNK,
    };
    let size = 2 * u64::from(CHUNK);
    let e = fx
        .commit_viewing(ckpt, size, vec![chunk(3), chunk(1)], 0, old_view)
        .await
        .expect_err("a stale writer names a reclaimed chunk");
    assert_eq!(e.errno(), Errno::EIO, "{e:?}");
    assert_eq!(fx.read(ckpt).await, want, "the file kept its contents");
    let current = fx
        .commit_viewing(ckpt, size, vec![chunk(3), chunk(3)], 0, old_view)
        .await
        .expect("the current layout's chunks");
    assert_eq!(fx.read(ckpt).await, want[..size as usize]);
    let data = bytes(CHUNK as usize, 5);
    fx.put_chunk(ckpt, 5, 2, data.clone()).await.expect("put");
    let three = vec![chunk(3), chunk(3), chunk(5)];
    fx.commit_viewing(ckpt, 3 * u64::from(CHUNK), three, 0, current.generation)
        .await
        .expect("a newer view names what it stored");
    let mut want = want[..size as usize].to_vec();
    want.extend(data);
    assert_eq!(fx.read(ckpt).await, want);
    fx.cluster.shutdown().await;
}

/// A chunk's stamp is the wall clock of the leader that wrote it, which can be far behind
/// the collecting leader's (or that leader's clock can jump ahead): the chunk then looks
/// past its grace at once. The chunk of a write still in progress stays for the grace on
/// the collector's monotonic clock, so the writer can still commit it. Here the chunk is
/// stamped at the epoch (1970), the collector runs every 7.5 s, and the writer commits after
/// 16 s, within the 30 s grace: a collector that trusted the stamp alone had dropped it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_stamped_by_a_clock_far_behind_waits_out_the_grace() {
    use talon_meta::types::{Command, CommandResult, Op};
    let mut fx = fixture(30_000).await;
    let node = fx.cluster.node(1).expect("node").node.clone();
    let ino = fx.file("slow").await;
    let body = bytes(CHUNK as usize, 7);
    let put = Op::PutChunk {
        ino,
        write_id: 1,
        index: 0,
        data: body.clone().into(),
        at_ms: 0,
    };
    let r = node
        .propose_on(chunk_partition(ino, 0, P), Command::Atomic(vec![put]))
        .await
        .expect("put the chunk");
    assert!(matches!(r, CommandResult::Applied(_)), "{r:?}");
    // Two of the collector's rounds, at least.
    tokio::time::sleep(Duration::from_secs(16)).await;
    fx.commit(
        ino,
        CHUNK as u64,
        vec![pb::ChunkRef {
            write_id: 1,
            len: CHUNK,
        }],
    )
    .await
    .expect("commit");
    assert!(fx.read(ino).await == body, "the committed chunk reads back");
    fx.cluster.shutdown().await;
}

/// A file unlinked by a leader whose wall clock was far behind (as good as read by one whose
/// clock jumped forward since) is kept for its grace on the reclaiming node's monotonic clock
/// too: a reader that looked its name up just before the unlink, and holds no session until
/// a quarter of the grace after its open, can still open it by inode; it goes after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlink_stamped_by_a_clock_far_behind_waits_out_the_grace() {
    use talon_meta::types::{Command, CommandResult, Op};
    // Unlinked files reclaimed after 8 s (rounds every 2 s).
    let mut fx = fixture_with(60_000, 8_000, None).await;
    let node = fx.cluster.node(1).expect("node").node.clone();
    let ino = fx.file("old").await;
    let body = b"read after the unlink".to_vec();
    fx.write_small(ino, body.clone()).await.expect("write");
    let unlink = vec![
        Op::DelDentry {
            parent: ROOT_INO,
            name: b"old".to_vec(),
        },
        Op::AdjustInode {
            ino,
            nlink: -1,
            parent: None,
            touch_mtime: false,
            now: talon_model::Time { secs: 1, nanos: 0 },
        },
    ];
    let r = node
        .propose_on(ino.home(), Command::Atomic(unlink))
        .await
        .expect("unlink");
    assert!(matches!(r, CommandResult::Applied(_)), "{r:?}");
    // Two of the collector's rounds, at least.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(fx.read(ino).await, body, "kept within its grace");
    reclaimed_within(&fx.c, ino, 30, "the reclaim after the grace").await;
    fx.cluster.shutdown().await;
}

/// One node of two partitions, without replicas, that builds a snapshot once a partition's
/// log holds 1 MiB since the last one (and after a million entries), keeping `keep` entries
/// behind it; with a client and the node's handle.
async fn snapshotting_node(
    keep: u64,
) -> (
    TestCluster,
    talon_client::Client,
    std::sync::Arc<talon_meta::node::Node>,
) {
    let cluster = TestCluster::builder()
        .nodes(1)
        .partitions(2)
        .replication(1)
        .snapshots(1_000_000, keep)
        .snapshot_after_bytes(1 << 20)
        .start()
        .await
        .expect("cluster");
    let c = common::client(&cluster.addrs()).await;
    let node = cluster.node(1).expect("node").node.clone();
    (cluster, c, node)
}

/// The body of `/d/f{i}` in the snapshotting tests: 100 KB of its own.
fn body_of(i: u64) -> Vec<u8> {
    bytes(100_000, i)
}

/// Reads back `/d/f00` .. `/d/f{n-1}`, each as [`body_of`] made it.
async fn read_back(c: &talon_client::Client, n: u64) {
    for i in 0..n {
        let got = c.read_file(format!("/d/f{i:02}")).await.expect("read");
        assert!(got == body_of(i), "f{i:02} read back");
    }
}

/// Behind a snapshot the log keeps `keep_entries_after_snapshot` entries, but none from
/// before the snapshot before it: with 1,000 to keep and a few dozen entries of bodies in
/// all, each partition's log is still purged once a second snapshot by size is built
/// (openraft's rule alone purged nothing here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_behind_a_snapshot_is_purged_up_to_the_one_before() {
    let (cluster, c, node) = snapshotting_node(1_000).await;
    c.mkdir("/d", Default::default()).await.expect("mkdir");
    let mut firsts = std::collections::HashMap::new();
    for i in 0..80u64 {
        c.write_file(format!("/d/f{i:02}"), body_of(i).as_slice())
            .await
            .expect("write");
        for part in node.partitions.values() {
            if let Some(s) = part.raft.metrics().borrow().snapshot {
                firsts.entry(part.id).or_insert(s);
            }
        }
    }
    assert_eq!(
        firsts.len(),
        2,
        "each partition built a snapshot: {firsts:?}"
    );
    eventually(
        Duration::from_secs(60),
        "each partition's log purged up to a snapshot before its last",
        || async {
            node.partitions
                .values()
                .all(|part| {
                    let m = part.raft.metrics().borrow().clone();
                    m.purged.is_some_and(|p| p.index >= firsts[&part.id].index)
                        && m.snapshot.is_some_and(|s| s.index < 1_000)
                })
                .then_some(())
        },
    )
    .await;
    read_back(&c, 80).await;
    cluster.shutdown().await;
}

/// The Raft log keeps file bodies until a snapshot: once a partition's log holds
/// `snapshot_after_bytes` since the last one, the node builds a snapshot, long before the
/// policy by entries would, and purges the log behind it; the bodies read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_of_bodies_is_snapshotted_by_its_size() {
    let (cluster, c, node) = snapshotting_node(10).await;
    for part in node.partitions.values() {
        assert_eq!(part.store.snapshot_mark().get(), None, "a fresh partition");
    }
    c.mkdir("/d", Default::default()).await.expect("mkdir");
    for i in 0..60u64 {
        c.write_file(format!("/d/f{i:02}"), body_of(i).as_slice())
            .await
            .expect("write");
    }
    eventually(
        Duration::from_secs(60),
        "a snapshot by size on each partition, and its log purged",
        || async {
            node.partitions
                .values()
                .all(|part| {
                    part.store.snapshot_mark().get().is_some()
                        && part.raft.metrics().borrow().purged.is_some()
                })
                .then_some(())
        },
    )
    .await;
    read_back(&c, 60).await;
    cluster.shutdown().await;
}
