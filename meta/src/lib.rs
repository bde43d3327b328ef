//! talon-meta: Talon's metadata server. A node hosts replicas of many partitions (one
//! openraft group each, multi-Raft), keeps every group's Raft log in one RocksDB and each
//! partition's state in a RocksDB of its own, and serves the client API and the node-to-node
//! Raft/transaction service on one gRPC port.
//!
//! Map of the crate:
//! - `config`: the node's TOML configuration and its validation.
//! - `types`: the Raft type config and the replicated command language (ops, commands).
//! - `format`: the codec and format version of everything stored or sent between nodes.
//! - `keys`: the key schema of a partition's state.
//! - `records`: the values stored under those keys, their encoding, `Fatal`.
//! - `kv`: the key-value seam under a view: RocksDB, a snapshot, or a map in memory.
//! - `view`: a partition's state as a command or read sees it (store plus staged writes).
//! - `resident`: a partition's counters and locks, kept in memory by its state machine.
//! - `apply`: deterministic application of commands (preconditions, locks, mutations).
//! - `sm`: the per-partition state machine on RocksDB, with checkpoint snapshots.
//! - `archive`: a checkpoint's files packed into one stream, with bounded memory.
//! - `clock`: the node's wall clock, which the fault harness can make jump (a feature).
//! - `space`: fullness of the node's data file system, thresholds and the start-up reserve.
//! - `tuning`: RocksDB memtable sizes shared by a node's stores.
//! - `malloc`: the process's C allocator: fewer arenas, freed memory back to the kernel.
//! - `raft_log`: the node's shared Raft log with group commit of WAL fsyncs.
//! - `log_recent`: a group's entries appended and not yet applied, answered from memory.
//! - `network`: node-to-node channels and openraft's network for every group.
//! - `reads`: a replica's own file and directory reads, shared by clients' and peers' paths.
//! - `dir_touch`: directory attribute updates queued between flushes, and their overlay.
//! - `partition`: one hosted replica with its proposal merging and read barrier.
//! - `node`: a whole node (`Node`): storage and Raft groups, routing to other partitions'
//!   leaders.
//! - `namespace`: `Namespace`, the namespace operations' guards and planning, lookup,
//!   create, remove, link and readdir.
//! - `rename`: `Renames`, rename within and across partitions, NOREPLACE and EXCHANGE.
//! - `attrs`: `Attrs`, getattr/setattr, extended attributes, a directory's class, statfs.
//! - `data`: `Files`, file contents: packed small-file bodies, chunks, layouts, checksums,
//!   GC.
//! - `txn`: `Txns`, two-phase commit across partitions and recovery of stale intents.
//!
//! The operation types above each borrow a `Node` for one call (`Namespace::new(&node)`):
//! a call names the type, and the type's file holds every one of its methods.
//! - `service`: the gRPC edge: wire validation and error mapping.
//! - `server`: starting a node with its background loops, serving it, shutting it down.
//! - `failpoints`: named steps a fault-injection harness can crash or slow (a feature).

pub mod apply;
pub mod archive;
pub mod attrs;
pub mod clock;
pub mod config;
pub mod data;
pub mod dir_touch;
pub mod failpoints;
pub mod format;
pub mod keys;
pub mod kv;
pub mod log_recent;
pub mod malloc;
pub mod namespace;
pub mod network;
pub mod node;
pub mod partition;
pub mod raft_log;
pub mod reads;
pub mod records;
pub mod rename;
pub mod resident;
pub mod server;
pub mod service;
pub mod sm;
pub mod space;
pub mod tuning;
pub mod txn;
pub mod types;
pub mod view;

/// The crate's modules form layers: no module uses (through a `crate::` path) one that uses
/// it back, directly or round a longer loop. Read from the sources, so a change that adds
/// a loop fails here with the loop named.
#[cfg(test)]
mod layering {
    use std::collections::{BTreeMap, BTreeSet};

    /// Module → the crate's modules its non-test code names.
    fn uses() -> BTreeMap<String, BTreeSet<String>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut modules = BTreeMap::new();
        for e in std::fs::read_dir(&dir).expect("read src") {
            let path = e.expect("entry").path();
            if path.extension().is_some_and(|x| x == "rs") {
                let name = path
                    .file_stem()
                    .expect("stem")
                    .to_string_lossy()
                    .into_owned();
                if name != "lib" {
                    modules.insert(name, std::fs::read_to_string(&path).expect("read module"));
                }
            }
        }
        let names: BTreeSet<String> = modules.keys().cloned().collect();
        let mut graph = BTreeMap::new();
        for (name, text) in &modules {
            let mut out = BTreeSet::new();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for line in code.lines() {
                let line = line.split("//").next().unwrap_or_default();
                for (i, _) in line.match_indices("crate::") {
                    let rest = &line[i + "crate::".len()..];
                    let word: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    // The fail point macro is exported at the crate root by `failpoints`.
                    let word = if word == "fail_point" {
                        "failpoints".to_string()
                    } else {
                        word
                    };
                    if names.contains(&word) && &word != name {
                        out.insert(word);
                    }
                }
            }
            graph.insert(name.clone(), out);
        }
        graph
    }

    /// A loop in `graph`, if there is one, as the modules along it.
    fn a_loop(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
        fn visit(
            m: &str,
            graph: &BTreeMap<String, BTreeSet<String>>,
            done: &mut BTreeSet<String>,
            path: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            if let Some(at) = path.iter().position(|p| p == m) {
                let mut cycle = path[at..].to_vec();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            if done.contains(m) {
                return None;
            }
            path.push(m.to_string());
            for next in graph.get(m).into_iter().flatten() {
                if let Some(c) = visit(next, graph, done, path) {
                    return Some(c);
                }
            }
            path.pop();
            done.insert(m.to_string());
            None
        }
        let mut done = BTreeSet::new();
        graph
            .keys()
            .find_map(|m| visit(m, graph, &mut done, &mut Vec::new()))
    }

    #[test]
    fn the_modules_have_no_import_loop() {
        let graph = uses();
        assert!(graph.len() > 10, "found only {:?}", graph.keys());
        if let Some(cycle) = a_loop(&graph) {
            panic!("import loop: {}", cycle.join(" -> "));
        }
    }

    #[test]
    fn the_loop_finder_finds_a_loop() {
        let g = |edges: &[(&str, &str)]| {
            let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (a, b) in edges {
                g.entry(a.to_string()).or_default().insert(b.to_string());
                g.entry(b.to_string()).or_default();
            }
            g
        };
        assert_eq!(a_loop(&g(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
        assert_eq!(
            a_loop(&g(&[("a", "b"), ("b", "c"), ("c", "a")])),
            Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
        );
    }
}
