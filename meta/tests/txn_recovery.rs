//! Recovery of transactions whose coordinator vanished: a participant holding a prepared
//! intent asks the coordinator's partition for the decision. Undecided → aborted (the
//! namespace as before); decided commit → finished (the namespace as after). Meanwhile
//! readers of the locked entries wait rather than see half a rename. Recovery counts an
//! intent's age on its own monotonic clock, so a coordinator whose wall clock ran ahead
//! when it prepared does not hold the keys for as long as its clock was ahead (finding F13).

mod common;

use std::time::{Duration, Instant};
use talon_client::CreateSpec;
use talon_meta::types::{Command, CommandResult, Expect, Op, Target, TxId};
use talon_model::placement::entry_partition;
use talon_model::{Class, FileKind, Ino};

/// Age of a prepared intent after which recovery resolves it.
const RECOVERY_AFTER: Duration = Duration::from_secs(10);
/// Bound on how long a reader of a locked entry waits: recovery's delay plus slack for a
/// loaded machine. A liveness bound, not a timing claim.
const READER_BOUND: Duration = Duration::from_secs(60);

/// Names in /a and /b whose entries live on different partitions.
fn split_names(a: Ino, b: Ino) -> (Vec<u8>, Vec<u8>) {
    for i in 0..100 {
        let (x, y) = (format!("x{i}").into_bytes(), format!("y{i}").into_bytes());
        if entry_partition(a, &x, Class::Relaxed, 8) != entry_partition(b, &y, Class::Relaxed, 8) {
            return (x, y);
        }
    }
    panic!("no split pair found");
}

async fn orphaned_rename(commit_decided: bool, coordinator_ahead: Duration) {
    // Recovery waits well past how long preparing and deciding can take on a loaded machine,
    // so it never aborts the transaction before this test has decided it.
    // The reader below waits for recovery; its deadline must outlast READER_BOUND, so a
    // slow recovery fails the bound below rather than the lookup.
    let (cluster, c) = common::recovering_cluster(8, RECOVERY_AFTER, READER_BOUND * 2).await;
    let a = c.mkdir("/a", Default::default()).await.expect("mkdir").ino;
    let b = c.mkdir("/b", Default::default()).await.expect("mkdir").ino;
    let (x, y) = split_names(a, b);
    let ino = c
        .create(a, &x, CreateSpec::file(0o644))
        .await
        .expect("create")
        .ino;
    let (pa, pb) = (
        entry_partition(a, &x, Class::Relaxed, 8),
        entry_partition(b, &y, Class::Relaxed, 8),
    );
    let node = &cluster.node(1).expect("node 1").node;

    // A coordinator on partition `pa` prepares both halves of the rename, then "dies".
    let txid = TxId {
        coordinator: pa,
        id: 42,
    };
    let src = vec![
        Op::ExpectDentry {
            parent: a,
            name: x.clone(),
            expect: Expect::Ino(ino),
        },
        Op::DelDentry {
            parent: a,
            name: x.clone(),
        },
    ];
    let dst = vec![
        Op::ExpectDentry {
            parent: b,
            name: y.clone(),
            expect: Expect::Absent,
        },
        Op::PutDentry {
            parent: b,
            name: y.clone(),
            target: Target::Existing(ino),
            kind: FileKind::Regular,
        },
    ];
    common::prepare_stamped(node, txid, vec![(pa, src), (pb, dst)], coordinator_ahead).await;
    if commit_decided {
        let r = node
            .propose_on(pa, Command::Decide { txid, commit: true })
            .await
            .expect("decide");
        assert_eq!(r, CommandResult::Decided(true));
    }

    // Readers wait on the locked entries until recovery settles the transaction.
    let started = Instant::now();
    let at_a = c.lookup(a, &x).await.ok().map(|t| t.ino);
    let waited = started.elapsed();
    let at_b = c.lookup(b, &y).await.ok().map(|t| t.ino);
    println!("commit decided: {commit_decided}; reader waited {waited:?}; /a {at_a:?} /b {at_b:?}");
    if commit_decided {
        assert_eq!(
            (at_a, at_b),
            (None, Some(ino)),
            "a decided commit must finish"
        );
    } else {
        assert_eq!(
            (at_a, at_b),
            (Some(ino), None),
            "an undecided transaction must abort"
        );
    }
    // The locks are gone: the entry can be renamed normally.
    let (from, to) = if commit_decided {
        ((b, &y), (a, &x))
    } else {
        ((a, &x), (b, &y))
    };
    c.rename_entry(from.0, from.1, to.0, to.1, Default::default())
        .await
        .expect("rename after recovery");
    assert!(
        waited < READER_BOUND,
        "the reader waited {waited:?} for recovery (after {RECOVERY_AFTER:?})"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn undecided_transaction_is_aborted_by_recovery() {
    orphaned_rename(false, Duration::ZERO).await;
}

/// The clock jump of the fault harness's F13: the coordinator's clock 400 s ahead when it
/// prepared. Recovery that read the stamp against the participants' clocks waited those
/// 400 s, and the reader's bound fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_intent_stamped_by_a_clock_ahead_is_recovered_as_soon() {
    orphaned_rename(false, Duration::from_secs(400)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn decided_transaction_is_finished_by_recovery() {
    orphaned_rename(true, Duration::ZERO).await;
}
