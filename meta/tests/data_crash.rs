//! File data under a crash (real processes, SIGKILL): while a large file is being
//! rewritten and small files are being written, a node dies and comes back. Every file
//! whose close returned is complete and correct; the file caught mid-rewrite holds one
//! whole version, old or new, never a torn mix.

mod common;

use common::{test_raft, ProcCluster};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use talon_client::file::OpenOptions;
use talon_client::Client;
use tokio::sync::Mutex;

/// 4 MiB chunks: 3.5 chunks per version of the checkpoint.
const BIG: usize = 14 << 20;
const SMALL: usize = 10_000;

/// Contents of version `v` of a file: every 8-byte word names the version and offset.
fn version(v: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(&(v << 40 | i).to_le_bytes());
        i += 1;
    }
    out.truncate(len);
    out
}

/// The version a whole file was written as, if every word agrees.
fn whole_version(data: &[u8], len: usize) -> Option<u64> {
    if data.len() != len || len < 8 {
        return None;
    }
    let v = u64::from_le_bytes(data[..8].try_into().ok()?) >> 40;
    (data == version(v, len).as_slice()).then_some(v)
}

async fn write_big(c: &Client, path: &str, v: u64) -> Result<(), talon_client::TalonError> {
    let mut f = c.open(path, OpenOptions::create_truncate()).await?;
    let data = version(v, BIG);
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        f.write_at((i << 20) as u64, piece).await?;
    }
    f.close().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn closed_files_survive_a_crash_and_open_writes_are_never_torn() {
    let mut pc = ProcCluster::start(3, 8, test_raft(20_000, 1_000));
    let c = connect(&pc).await;
    c.mkdir("/ckpt", Default::default()).await.expect("mkdir");
    c.mkdir("/small", Default::default()).await.expect("mkdir");
    write_big(&c, "/ckpt/model.pt", 1)
        .await
        .expect("first version");

    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(1));
    let big = {
        let (c, stop, committed) = (c.clone(), stop.clone(), committed.clone());
        tokio::spawn(async move {
            let mut v = 2;
            while !stop.load(Ordering::SeqCst) && v < 40 {
                match write_big(&c, "/ckpt/model.pt", v).await {
                    Ok(()) => committed.store(v, Ordering::SeqCst),
                    Err(e) => eprintln!("version {v} not committed: {e}"),
                }
                v += 1;
            }
        })
    };
    let acked: Arc<Mutex<Vec<u64>>> = Arc::default();
    let small: Vec<_> = (0..4u64)
        .map(|w| {
            let (c, stop, acked) = (c.clone(), stop.clone(), acked.clone());
            tokio::spawn(async move {
                let mut i = w;
                while !stop.load(Ordering::SeqCst) && i < 4000 {
                    let (path, body) = (format!("/small/f{i}"), version(i, SMALL));
                    if c.write_file(path, body.as_slice()).await.is_ok() {
                        acked.lock().await.push(i);
                    }
                    i += 4;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    pc.kill(2);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    pc.restart(2);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.store(true, Ordering::SeqCst);
    big.await.expect("big writer");
    for t in small {
        t.await.expect("small writer");
    }

    let data = c
        .read_file("/ckpt/model.pt")
        .await
        .expect("read checkpoint");
    let v = whole_version(&data, BIG).expect("the checkpoint is one whole version");
    let last = committed.load(Ordering::SeqCst);
    assert!(
        v == last || v == last + 1,
        "checkpoint holds version {v}, last committed {last}"
    );
    let acked = acked.lock().await.clone();
    for i in &acked {
        let got = c
            .read_file(format!("/small/f{i}"))
            .await
            .expect("read small file");
        assert_eq!(got, version(*i, SMALL), "small file {i}");
    }
    println!(
        "checkpoint at version {v} (last committed {last}); {} small files verified",
        acked.len()
    );
}

async fn connect(pc: &ProcCluster) -> Client {
    common::eventually(Duration::from_secs(60), "cluster", || async {
        let c = Client::connect(&pc.addrs, Default::default()).await.ok()?;
        c.stat("/").await.ok()?;
        Some(c)
    })
    .await
}

/// A lone node (one replica: no peer to catch up from) SIGKILLed twice right after writes
/// restarts with every write it acknowledged. Its partitions' stores keep no WAL of their
/// own: what their memtables held when it died is applied again from the Raft log, across
/// snapshots taken every few hundred entries. Creates, small-file bodies, directories and
/// renames between partitions (two-phase) are each checked after the second restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lone_node_killed_after_writes_keeps_every_acknowledged_one() {
    let mut pc = ProcCluster::start(1, 4, test_raft(300, 20));
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut gone: Vec<String> = Vec::new();
    for round in 0..2u64 {
        let c = connect(&pc).await;
        let dir = format!("/r{round}");
        c.mkdir(&dir, Default::default()).await.expect("mkdir");
        c.mkdir(format!("{dir}/moved"), Default::default())
            .await
            .expect("mkdir moved");
        for i in 0..400u64 {
            let path = format!("{dir}/f{i}");
            let body = version(round << 20 | i, 1000 + (i as usize % 7) * 1000);
            c.write_file(&path, body.as_slice()).await.expect("write");
            files.push((path, body));
        }
        for (path, _) in files
            .iter_mut()
            .filter(|(p, _)| p.starts_with(&dir))
            .step_by(10)
        {
            let to = path.replacen(&dir, &format!("{dir}/moved"), 1);
            c.rename(path.as_str(), to.as_str()).await.expect("rename");
            gone.push(std::mem::replace(path, to));
        }
        pc.kill(1);
        pc.restart(1);
    }
    let c = connect(&pc).await;
    for (path, body) in &files {
        let got = c
            .read_file(path.as_str())
            .await
            .unwrap_or_else(|e| panic!("read {path}: {e}\n{}", pc.log(1)));
        assert_eq!(&got, body, "{path}");
    }
    for path in &gone {
        let e = c.stat(path.as_str()).await.expect_err("renamed away");
        assert_eq!(e.errno(), talon_model::Errno::ENOENT, "{path}");
    }
    println!("{} files and {} renames verified", files.len(), gone.len());
}
