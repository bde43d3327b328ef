//! Criterion benches of the server's per-operation hot paths, through `talon-meta`'s own
//! modules on one partition replica's store (no network, no Raft log, no fsync):
//!
//! - key encoding: a dentry key and an inode key built, a chunk key parsed;
//! - a batch proposal: 64 creates in one `Command::Batch`, encoded as the Raft log stores a
//!   command and decoded back, then applied by the partition's state machine (every
//!   create's checks, its ino allocation and the one RocksDB write batch of the whole
//!   proposal; the state machine's own WAL is not synced, as in the server);
//! - the packed store: a 4 KiB body written (a `WriteBody` command applied) and read back
//!   whole with its checksum (`reads::read_stored_unblocking`, what an open by inode
//!   reads: from the store's memory here);
//! - a lookup's reads (`View::lookup`: the epoch, the parent's class, the entry's lock, the
//!   entry and its inode) in a directory of 20,480 files flushed to table files in five
//!   steps, of a name that is there and of one that is not.
//!
//! `cargo bench -p talon-bench --bench server_paths`

use criterion::{criterion_main, BatchSize, Criterion, Throughput};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use std::hint::black_box;
use std::sync::Arc;
use talon_meta::apply::fresh_attr;
use talon_meta::keys;
use talon_meta::records::{dec, enc};
use talon_meta::sm::{PartitionSm, SmStore};
use talon_meta::types::{Command, CommandResult, Expect, Op, Target, TypeConfig};
use talon_model::{Class, FileKind, Ino, Time, ROOT_INO};

/// Proposals per create batch: what a busy directory's group commit gathers.
const BATCH: usize = 64;

fn keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("keys");
    let parent = Ino::new(3, 12_345);
    g.bench_function("dentry", |b| {
        b.iter(|| keys::dentry(black_box(parent), black_box(b"img_00012345.JPEG")))
    });
    g.bench_function("inode", |b| b.iter(|| keys::inode(black_box(parent))));
    let chunk = keys::chunk(parent, 7, 42);
    g.bench_function("chunk_of", |b| b.iter(|| keys::chunk_of(black_box(&chunk))));
    g.finish();
}

/// The ops a create of a regular file `name` in the root proposes (what the server plans).
fn create_ops(name: &[u8]) -> Vec<Op> {
    let now = Time::now();
    let attr = fresh_attr(
        FileKind::Regular,
        0o644,
        0,
        0,
        0,
        0,
        Class::Relaxed,
        ROOT_INO,
        now,
    );
    vec![
        Op::ExpectEpoch(0),
        Op::ExpectDirLive {
            dir: ROOT_INO,
            class: Class::Relaxed,
            learn: false,
        },
        Op::ExpectDentry {
            parent: ROOT_INO,
            name: name.to_vec(),
            expect: Expect::Absent,
        },
        Op::NewInode {
            attr: Box::new(attr),
            symlink: Vec::new(),
            creator: 0,
        },
        Op::PutDentry {
            parent: ROOT_INO,
            name: name.to_vec(),
            target: Target::New(0),
            kind: FileKind::Regular,
        },
        Op::TouchDir {
            dir: ROOT_INO,
            nlink: 0,
            now,
        },
    ]
}

fn create_batch(first: u64) -> Command {
    Command::Batch(
        (first..first + BATCH as u64)
            .map(|i| Command::Atomic(create_ops(format!("img_{i:010}.JPEG").as_bytes())))
            .collect(),
    )
}

/// A partition-0 replica (it holds the root) in a temp dir, and its state machine.
struct Replica {
    _dir: tempfile::TempDir,
    store: Arc<SmStore>,
    sm: PartitionSm,
    index: u64,
    rt: tokio::runtime::Runtime,
}

impl Replica {
    fn new() -> Replica {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SmStore::open(dir.path(), 0, b"").expect("open store");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        Replica {
            _dir: dir,
            sm: PartitionSm::new(store.clone()),
            store,
            index: 0,
            rt,
        }
    }

    /// Applies `cmd` as the next committed log entry.
    fn apply(&mut self, cmd: Command) -> CommandResult {
        self.index += 1;
        let entry = Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), self.index),
            payload: EntryPayload::Normal(cmd),
        };
        let mut out = self
            .rt
            .block_on(self.sm.apply([entry]))
            .expect("apply to the store");
        out.pop().expect("one result")
    }
}

fn proposal(c: &mut Criterion) {
    let mut g = c.benchmark_group("proposal");
    g.throughput(Throughput::Elements(BATCH as u64));
    let cmd = create_batch(0);
    g.bench_function("encode_64_creates", |b| b.iter(|| enc(black_box(&cmd))));
    let bytes = enc(&cmd);
    g.bench_function("decode_64_creates", |b| {
        b.iter(|| dec::<Command>(black_box(&bytes), "command"))
    });
    let mut replica = Replica::new();
    let mut next = 0u64;
    g.bench_function("apply_64_creates", |b| {
        b.iter_batched(
            || {
                next += BATCH as u64;
                create_batch(next)
            },
            |cmd| {
                let CommandResult::Batch(results) = replica.apply(cmd) else {
                    panic!("a batch answers a batch");
                };
                assert!(results
                    .iter()
                    .all(|r| matches!(r, CommandResult::Applied(_))));
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn packed_store(c: &mut Criterion) {
    let mut g = c.benchmark_group("packed_store");
    let mut replica = Replica::new();
    let CommandResult::Applied(out) = replica.apply(Command::Atomic(create_ops(b"body"))) else {
        panic!("the create applies");
    };
    let ino = out.new_inos[0];
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("write_body_4k", |b| {
        b.iter_batched(
            || {
                Command::Atomic(vec![Op::WriteBody {
                    ino,
                    data: data.clone().into(),
                    expect_generation: 0,
                    now: Time::now(),
                }])
            },
            |cmd| {
                let r = replica.apply(cmd);
                assert!(matches!(r, CommandResult::Applied(_)), "{r:?}");
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("read_body_4k", |b| {
        b.iter(|| {
            let read =
                talon_meta::reads::read_stored_unblocking(&replica.store, black_box(ino), true);
            let f = replica.rt.block_on(read).expect("read").expect("the file");
            assert_eq!(f.body.as_ref().map(Vec::len), Some(4096));
        })
    });
    g.finish();
}

/// Files in the looked-up directory (320 batches), and the flushes that spread them over
/// table files (one every 64 batches).
const LOOKUP_FILES: u64 = 20_480;
const LOOKUP_FLUSHES: u64 = 5;

fn lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("lookup");
    let mut replica = Replica::new();
    let per_flush = LOOKUP_FILES / LOOKUP_FLUSHES;
    for first in (0..LOOKUP_FILES).step_by(BATCH) {
        replica.apply(create_batch(first));
        if (first + BATCH as u64).is_multiple_of(per_flush) {
            replica.store.db().flush().expect("flush the store");
        }
    }
    let names: Vec<Vec<u8>> = (0..LOOKUP_FILES)
        .step_by(97)
        .map(|i| format!("img_{i:010}.JPEG").into_bytes())
        .collect();
    let mut next = 0usize;
    g.bench_function("present", |b| {
        b.iter(|| {
            next = (next + 1) % names.len();
            let got = replica
                .store
                .read(|v| v.lookup(0, ROOT_INO, black_box(&names[next]), false))
                .expect("read");
            assert!(got.dentry.is_some());
        })
    });
    g.bench_function("absent", |b| {
        b.iter(|| {
            let got = replica
                .store
                .read(|v| v.lookup(0, ROOT_INO, black_box(b"img_missing.JPEG"), false))
                .expect("read");
            assert!(got.dentry.is_none());
        })
    });
    g.finish();
}

mod group {
    #![allow(missing_docs)]
    use super::{keys, lookup, packed_store, proposal};
    criterion::criterion_group!(benches, keys, proposal, packed_store, lookup);
}

criterion_main!(group::benches);
