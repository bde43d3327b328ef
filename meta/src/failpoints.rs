//! Fail points: named steps at which a fault-injection harness can crash this node or slow
//! it down, so that a run kills a node exactly between two steps of a protocol instead of
//! wherever a SIGKILL happens to land.
//!
//! Owns: the list of points ([`POINTS`]), the [`fail_point!`](crate::fail_point) macro the
//! steps call, and arming them at run time from a file the harness writes. Must not: do
//! anything in a build without the `failpoints` feature (the macro expands to nothing, and
//! release builds never enable it), or act on a point nobody armed.
//!
//! Arming: `talon-meta start` with the feature reads `$TALON_FAIL_POINTS`, a file of
//! `name=actions` lines in the `fail` crate's syntax, every 50 ms; what the file no longer
//! names is disarmed. Two actions matter: `return` aborts the process at the point (the
//! `1*return` form does it on the first pass only), and `sleep(ms)` holds the step, which at
//! `log-fsync` is a slow disk. The file may also arm `wall-clock=return(ms)`, which is no
//! step but the node's clock jumping by `ms` (see `clock`).

/// Every fail point, with the step it sits at.
pub const POINTS: &[(&str, &str)] = &[
    (
        "txn-prepared",
        "two-phase commit, coordinator: every participant prepared, no decision recorded yet",
    ),
    (
        "txn-decided",
        "two-phase commit, coordinator: commit recorded, no participant told yet",
    ),
    (
        "txn-finish-apply",
        "two-phase commit, participant: a committed Finish is being applied, not yet written",
    ),
    (
        "snapshot-install-files",
        "snapshot install: the received files are written, the new state not yet switched to",
    ),
    (
        "snapshot-install-switched",
        "snapshot install: the new state is live, its snapshot record not yet written",
    ),
    (
        "log-fsync",
        "Raft log: entries appended and readable, their fsync not yet done or acknowledged",
    ),
];

/// Marks step `$name` (one of [`POINTS`]), or with `if cond` the step when `cond` holds. Armed with `return`, the process aborts here;
/// armed with `sleep(ms)`, the step waits. Without the `failpoints` feature it is nothing.
#[macro_export]
macro_rules! fail_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name, |_| $crate::failpoints::crash($name));
    };
    ($name:literal, if $cond:expr) => {
        #[cfg(feature = "failpoints")]
        if $cond {
            fail::fail_point!($name, |_| $crate::failpoints::crash($name));
        }
    };
}

/// Aborts the process at fail point `name`: the harness's crash, exactly at that step.
#[cfg(feature = "failpoints")]
pub fn crash(name: &str) -> ! {
    eprintln!("fail point {name}: aborting the process as armed");
    std::process::abort()
}

/// Whether this build has fail points compiled in.
pub const ENABLED: bool = cfg!(feature = "failpoints");

/// Environment variable naming the file that arms fail points.
pub const ENV: &str = "TALON_FAIL_POINTS";

/// Follows the file named by `$TALON_FAIL_POINTS` (if set) for the life of the process,
/// arming and disarming points as its lines change. Without the feature, does nothing.
pub fn follow_env() {
    #[cfg(feature = "failpoints")]
    if let Some(path) = std::env::var_os(ENV) {
        let path = std::path::PathBuf::from(path);
        // A thread of its own: it must arm a point even while the runtime is busy, and it
        // reads a file of a few lines.
        let spawned = std::thread::Builder::new()
            .name("fail-points".into())
            .spawn(move || follow(&path));
        if let Err(e) = spawned {
            tracing::error!("start the fail point watcher: {e}");
        }
    }
}

#[cfg(feature = "failpoints")]
fn follow(path: &std::path::Path) {
    let mut last: Option<String> = None;
    // Runs until the process ends: the feature exists for the harness, which kills nodes.
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if last.as_deref() != Some(text.as_str()) {
            apply(&text);
            last = Some(text);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Every name the fail-point file may arm: the steps, and the clock's jump.
#[cfg(feature = "failpoints")]
fn armable() -> impl Iterator<Item = &'static str> {
    POINTS
        .iter()
        .map(|(p, _)| *p)
        .chain([crate::clock::JUMP_POINT])
}

/// Arms exactly the points `text` names (`name=actions` per line); disarms the rest.
#[cfg(feature = "failpoints")]
fn apply(text: &str) {
    let mut armed = std::collections::BTreeSet::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let Some((name, actions)) = line.split_once('=') else {
            tracing::error!("fail points: {line:?} is not name=actions");
            continue;
        };
        let name = name.trim();
        if !armable().any(|p| p == name) {
            tracing::error!("fail points: no point named {name:?}");
            continue;
        }
        match fail::cfg(name, actions.trim()) {
            Ok(()) => {
                tracing::warn!("fail point {name} armed: {}", actions.trim());
                armed.insert(name);
            }
            Err(e) => tracing::error!("fail point {name}: {e}"),
        }
    }
    for name in armable() {
        if !armed.contains(name) {
            fail::remove(name);
        }
    }
}
