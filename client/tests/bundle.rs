//! Bundles of small requests (`talon_client::bundle`): many tasks of one client creating,
//! looking up, reading the attributes of and removing files at once share bundles, and
//! every request still gets its own answer (a name two tasks create exclusively is made by
//! one of them); a caller alone sends none, and a window of 0 turns bundles off.

mod common;

use common::{connect_with, errno, Fixture, STRICT_PREFIX};
use std::sync::Arc;
use talon_client::{Client, ClientOptions, CreateSpec, Errno, Ino, MkdirOptions};

const TASKS: usize = 32;
const FILES: usize = 20;

/// Every task creates its own files and races the others for one shared name, then looks
/// up, reads the attributes of and removes its files, asking for a name never made too.
async fn workload(c: &Arc<Client>, dir: Ino) {
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut inos = Vec::new();
            for i in 0..FILES {
                let name = format!("t{t}-{i}");
                let a = c
                    .create(dir, name.as_bytes(), CreateSpec::file(0o644))
                    .await
                    .unwrap_or_else(|e| panic!("create {name}: {e}"));
                inos.push(a.ino);
            }
            let shared = c
                .create(
                    dir,
                    b"shared",
                    CreateSpec {
                        exclusive: true,
                        ..CreateSpec::file(0o644)
                    },
                )
                .await;
            for (i, ino) in inos.iter().enumerate() {
                let name = format!("t{t}-{i}");
                let a = c.lookup(dir, name.as_bytes()).await.expect("lookup");
                assert_eq!(a.ino, *ino, "{name} is the inode its create answered");
                assert_eq!(c.getattr(*ino).await.expect("getattr").ino, *ino);
            }
            assert_eq!(
                errno(c.lookup(dir, format!("never-{t}").as_bytes()).await),
                Errno::ENOENT
            );
            for i in 0..FILES {
                c.remove(dir, format!("t{t}-{i}").as_bytes(), false)
                    .await
                    .expect("remove");
            }
            assert_eq!(
                errno(c.remove(dir, format!("t{t}-0").as_bytes(), false).await),
                Errno::ENOENT
            );
            shared.map(|_| ()).map_err(|e| e.errno())
        }));
    }
    let mut made = 0;
    for t in tasks {
        match t.await.expect("task") {
            Ok(()) => made += 1,
            Err(e) => assert_eq!(e, Errno::EEXIST, "the shared name's losers"),
        }
    }
    assert_eq!(made, 1, "one task made the shared name");
    let mut pager = c.read_dir_ino(dir, 1000, false).linearizable(true);
    let mut names = Vec::new();
    while let Some(page) = pager.next_page().await.expect("list") {
        names.extend(page.into_iter().map(|e| e.name));
    }
    assert_eq!(
        names,
        vec![b"shared".to_vec()],
        "only the shared name is left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_bundles_and_each_gets_its_own_answer() {
    let fx = Fixture::start(1).await;
    let window = |w| ClientOptions {
        bundle_window: w,
        ..ClientOptions::default()
    };
    for (dir, w) in [("/relaxed", 1), (&format!("{STRICT_PREFIX}/strict"), 1)] {
        let c = Arc::new(connect_with(&fx.cluster, window(w)).await);
        let d = c
            .mkdir(
                dir,
                MkdirOptions {
                    parents: true,
                    ..MkdirOptions::default()
                },
            )
            .await
            .expect("mkdir");
        workload(&c, d.ino).await;
        let (bundles, requests) = c.bundle_counts();
        println!("{dir}: {requests} requests in {bundles} bundles");
        assert!(bundles > 0, "{dir}: {TASKS} tasks at once sent bundles");
        assert!(
            requests >= 2 * bundles,
            "{dir}: each bundle carries several"
        );
    }

    // Bundles off: the same workload, each request on its own.
    let c = Arc::new(connect_with(&fx.cluster, window(0)).await);
    let d = c
        .mkdir("/off", MkdirOptions::default())
        .await
        .expect("mkdir");
    workload(&c, d.ino).await;
    assert_eq!(c.bundle_counts(), (0, 0), "a window of 0 sends no bundle");

    // A caller alone never waits for a bundle: its requests go as they come.
    let c = connect_with(&fx.cluster, window(1)).await;
    let d = c
        .mkdir("/alone", MkdirOptions::default())
        .await
        .expect("mkdir");
    for i in 0..FILES {
        let name = format!("f{i}");
        c.create(d.ino, name.as_bytes(), CreateSpec::file(0o644))
            .await
            .expect("create");
        c.lookup(d.ino, name.as_bytes()).await.expect("lookup");
    }
    assert_eq!(c.bundle_counts(), (0, 0), "one caller sends no bundle");
    fx.shutdown().await;
}
