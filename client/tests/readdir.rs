//! Directory listings: paging through relaxed (spread) and strict (co-located) directories,
//! readdirplus, and the lazy pager and stream.

mod common;

use common::{eventually, Fixture};
use futures::TryStreamExt;
use std::collections::BTreeSet;
use std::time::Duration;
use talon_client::{Class, Client, DirCursor, FileKind, Ino, MkdirOptions};

/// Every name of `dir` through `readdir_page` with pages of `limit`; checks no page is
/// empty but the last and that no name comes twice.
async fn list_all(
    c: &Client,
    dir: Ino,
    limit: u32,
    plus: bool,
) -> Vec<(Vec<u8>, Option<FileKind>)> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    let mut cursor = Some(DirCursor::start());
    while let Some(cur) = cursor {
        let (page, next) = c
            .readdir_page(dir, &cur, limit, plus)
            .await
            .expect("readdir page");
        assert!(page.len() <= limit as usize);
        assert!(
            !page.is_empty() || next.is_none(),
            "an empty page must end the listing"
        );
        for e in page {
            assert!(seen.insert(e.name.clone()), "{:?} listed twice", e.name);
            assert_eq!(e.attr.is_some(), plus);
            if let Some(a) = &e.attr {
                assert_eq!(a.ino, e.ino);
            }
            out.push((e.name, e.attr.map(|a| a.kind)));
        }
        cursor = next;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_through_relaxed_and_strict_directories() {
    let fx = Fixture::start(3).await;
    let c = &fx.client;
    let strict = MkdirOptions {
        class: Some(Class::Strict),
        ..MkdirOptions::default()
    };
    for (path, opts) in [("/rel", MkdirOptions::default()), ("/str", strict)] {
        let d = c.mkdir(path, opts).await.expect("mkdir");
        assert!(
            list_all(c, d.ino, 10, false).await.is_empty(),
            "a new directory is empty"
        );
        let n = 157;
        for i in 0..n {
            c.create_file(format!("{path}/f{i:04}"), 0o644)
                .await
                .expect("create");
        }
        c.mkdir(format!("{path}/sub"), MkdirOptions::default())
            .await
            .expect("mkdir sub");
        let want: BTreeSet<Vec<u8>> = (0..n)
            .map(|i| format!("f{i:04}").into_bytes())
            .chain([b"sub".to_vec()])
            .collect();
        // Relaxed listings may lag by the staleness bound: wait for all names.
        let complete = eventually(Duration::from_secs(30), || async {
            let got: BTreeSet<_> = list_all(c, d.ino, 7, false)
                .await
                .into_iter()
                .map(|e| e.0)
                .collect();
            got == want
        })
        .await;
        assert!(complete, "{path}: the listing returns every entry once");
        let plus = list_all(c, d.ino, 50, true).await;
        assert_eq!(plus.len(), want.len());
        assert!(plus
            .iter()
            .any(|(n, k)| n == b"sub" && *k == Some(FileKind::Directory)));

        // The pager and the stream give the same entries.
        let mut pager = c.read_dir(path).await.expect("read_dir").linearizable(true);
        let mut paged = BTreeSet::new();
        while let Some(page) = pager.next_page().await.expect("page") {
            paged.extend(page.into_iter().map(|e| e.name));
        }
        assert_eq!(paged, want);
        let streamed: Vec<_> = c
            .read_dir(path)
            .await
            .expect("read_dir")
            .linearizable(true)
            .into_stream()
            .try_collect()
            .await
            .expect("stream");
        assert_eq!(streamed.len(), want.len());
    }
    assert!(
        c.read_dir("/rel/f0000").await.is_err(),
        "a file cannot be listed"
    );
    fx.shutdown().await;
}
