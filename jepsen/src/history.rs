//! The history of a run: every operation a worker performed, as an `invoke` event followed
//! by exactly one of `ok` (it happened, with this result), `fail` (it certainly did not
//! happen) or `info` (unknown: it may have happened at any moment after its invocation, or
//! never), plus the nemesis's fault start and end events.
//!
//! Events carry a monotonic timestamp (nanoseconds since the run started) and are written
//! as JSON lines, one per event, in the order they were recorded, so a history file can be
//! checked again offline with `talon-jepsen check`. A worker whose operation ended in `info`
//! takes a fresh process id for its next operation: a process never has two operations in
//! flight, which is what the linearizability checker requires.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The process id of the nemesis in a history.
pub const NEMESIS: u64 = u64::MAX;

/// What an event says about its operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    /// The operation started.
    Invoke,
    /// The operation completed, with the result in the event.
    Ok,
    /// The operation certainly had no effect.
    Fail,
    /// The outcome is unknown: it may take effect at any time after its invocation.
    Info,
}

/// An operation and, on completion events, its result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "kebab-case")]
pub enum Call {
    /// Read a register file; `value` is its contents on `ok` (`None`: no such file).
    Read {
        /// The register's file name.
        key: String,
        /// The value read.
        value: Option<u64>,
    },
    /// Replace a register file's contents (write a temporary file, rename it over).
    Write {
        /// The register's file name.
        key: String,
        /// The value written.
        value: u64,
    },
    /// Set a register only if it has no value (rename with NOREPLACE).
    Cas {
        /// The register's file name.
        key: String,
        /// The value to set.
        value: u64,
        /// On `ok`: whether it was set (false: the file existed, EEXIST).
        created: Option<bool>,
    },
    /// Remove a register file.
    Delete {
        /// The register's file name.
        key: String,
        /// On `ok`: whether it existed (false: ENOENT).
        existed: Option<bool>,
    },
    /// Create a new, unique file in the set directory (the set workload writes the file's
    /// name into it before the create counts as done).
    Add {
        /// The file name.
        element: String,
    },
    /// Read back the whole contents of a file of the set whose create this client had
    /// acknowledged (the set workload writes each file's name into it).
    ReadBack {
        /// The file name.
        element: String,
        /// On `ok`: the contents read (`None`: no such file).
        body: Option<String>,
    },
    /// List the set directory (linearizable listing).
    ReadSet {
        /// On `ok`: the names listed.
        elements: Option<Vec<String>>,
    },
    /// Rename a file between the two rename directories.
    Move {
        /// The file name (the same in both directories).
        file: String,
        /// The directory it is moved from (`a` or `b`).
        from: String,
        /// The directory it is moved to.
        to: String,
    },
    /// List both rename directories, one after the other.
    List {
        /// Whether this is the final, quiescent listing.
        last: bool,
        /// On `ok`: the names in directory `a`.
        a: Option<Vec<String>>,
        /// On `ok`: the names in directory `b`.
        b: Option<Vec<String>>,
    },
    /// Add hard link `slot` of file `key`, in a strict directory on another partition.
    Link {
        /// The file's name in the links workload's home directory.
        key: String,
        /// Which of the file's link names (see `workload::links`).
        slot: u8,
        /// On `ok`: whether it was made (false: the name existed, EEXIST).
        created: Option<bool>,
    },
    /// Remove hard link `slot` of file `key`.
    Unlink {
        /// The file's name in the links workload's home directory.
        key: String,
        /// Which of the file's link names.
        slot: u8,
        /// On `ok`: whether it existed (false: ENOENT).
        existed: Option<bool>,
    },
    /// Read file `key`'s link count (a strict getattr).
    Nlink {
        /// The file's name in the links workload's home directory.
        key: String,
        /// On `ok`: the count read.
        nlink: Option<u32>,
    },
    /// A read of a checkpoint whose bytes did not verify: a torn or mixed file.
    Torn {
        /// The checkpoint's file name.
        key: String,
        /// What did not match.
        detail: String,
    },
    /// A fault the nemesis injected (`invoke`) or healed (`ok`).
    Fault {
        /// What the fault is, e.g. `kill n3` or `partition {1,2} {3,4,5}`.
        name: String,
    },
}

/// One line of a history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the history, from 0.
    pub index: u64,
    /// Nanoseconds since the run started (monotonic clock).
    pub time_ns: u64,
    /// The process (worker incarnation) that performed the operation.
    pub process: u64,
    /// What the event says.
    #[serde(rename = "type")]
    pub kind: EventType,
    /// The operation.
    #[serde(flatten)]
    pub call: Call,
    /// Why it failed or is unknown.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
}

/// Errors reading or writing a history.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The history file could not be read or written.
    #[error("history file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A line is not a history event.
    #[error("history line {line}: {source}")]
    Parse {
        /// The 1-based line number.
        line: usize,
        /// The cause.
        source: serde_json::Error,
    },
}

struct Inner {
    events: Vec<Event>,
    out: Option<std::io::BufWriter<std::fs::File>>,
    write_error: Option<std::io::Error>,
}

/// Records events in memory and, when given a file, as JSON lines. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    inner: Arc<Mutex<Inner>>,
}

impl Recorder {
    /// A recorder that keeps events in memory and appends them to `path` if given.
    pub fn new(path: Option<&Path>) -> Result<Recorder, HistoryError> {
        let out = match path {
            Some(p) => Some(std::io::BufWriter::new(std::fs::File::create(p).map_err(
                |source| HistoryError::Io {
                    path: p.display().to_string(),
                    source,
                },
            )?)),
            None => None,
        };
        Ok(Recorder {
            start: Instant::now(),
            inner: Arc::new(Mutex::new(Inner {
                events: Vec::new(),
                out,
                write_error: None,
            })),
        })
    }

    /// Nanoseconds since the recorder was made.
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Appends an event stamped now.
    pub fn record(&self, process: u64, kind: EventType, call: Call, error: Option<String>) {
        let mut g = match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        // The time is taken under the lock so that file order is time order.
        let ev = Event {
            index: g.events.len() as u64,
            time_ns: self.now_ns(),
            process,
            kind,
            call,
            error,
        };
        if let Some(out) = g.out.as_mut() {
            let r = serde_json::to_writer(&mut *out, &ev)
                .map_err(std::io::Error::other)
                .and_then(|()| out.write_all(b"\n"));
            if let Err(e) = r {
                g.write_error.get_or_insert(e);
            }
        }
        g.events.push(ev);
    }

    /// Every event so far, flushing the file; the first write error, if any, is returned.
    pub fn finish(&self) -> Result<Vec<Event>, std::io::Error> {
        let mut g = match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(out) = g.out.as_mut() {
            out.flush()?;
        }
        if let Some(e) = g.write_error.take() {
            return Err(e);
        }
        Ok(g.events.clone())
    }
}

/// Reads a history written by a [`Recorder`].
pub fn read_history(path: &Path) -> Result<Vec<Event>, HistoryError> {
    let io = |source| HistoryError::Io {
        path: path.display().to_string(),
        source,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(&line).map_err(|source| HistoryError::Parse {
                line: i + 1,
                source,
            })?,
        );
    }
    Ok(out)
}

/// An operation with its invocation and completion, paired from a history.
#[derive(Clone, Debug)]
pub struct Completed {
    /// The process.
    pub process: u64,
    /// The call as invoked.
    pub invoke: Call,
    /// When it was invoked (ns).
    pub invoke_ns: u64,
    /// How it ended: `Ok`, `Fail` or `Info` (an operation still open at the end is `Info`).
    pub kind: EventType,
    /// The call as completed (the invocation for `Info`).
    pub result: Call,
    /// When it completed (ns); `None` for `Info`.
    pub complete_ns: Option<u64>,
    /// The index of the invocation event, for reports.
    pub index: u64,
    /// The completion's error, for `fail` and `info`.
    pub error: Option<String>,
}

/// Pairs every invocation with its completion, in invocation order. An invocation with no
/// completion (the run ended first) counts as `Info`. Fault events are skipped.
pub fn pair(events: &[Event]) -> Vec<Completed> {
    let mut open: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut out: Vec<Completed> = Vec::new();
    for e in events {
        if e.process == NEMESIS {
            continue;
        }
        match e.kind {
            EventType::Invoke => {
                open.insert(e.process, out.len());
                out.push(Completed {
                    process: e.process,
                    invoke: e.call.clone(),
                    invoke_ns: e.time_ns,
                    kind: EventType::Info,
                    result: e.call.clone(),
                    complete_ns: None,
                    index: e.index,
                    error: None,
                });
            }
            kind => {
                if let Some(i) = open.remove(&e.process) {
                    let c = &mut out[i];
                    c.kind = kind;
                    c.error = e.error.clone();
                    if kind != EventType::Info {
                        c.result = e.call.clone();
                        c.complete_ns = Some(e.time_ns);
                    }
                }
            }
        }
    }
    out
}

/// Fault intervals `(start_ns, end_ns)` from the nemesis's events; a fault never healed
/// lasts until `end_ns`.
pub fn fault_windows(events: &[Event], end_ns: u64) -> Vec<(u64, u64)> {
    let mut open: Vec<(String, u64)> = Vec::new();
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e.process == NEMESIS) {
        let Call::Fault { name } = &e.call else {
            continue;
        };
        match e.kind {
            EventType::Invoke => open.push((name.clone(), e.time_ns)),
            _ => {
                if let Some(i) = open.iter().position(|(n, _)| n == name) {
                    let (_, start) = open.remove(i);
                    out.push((start, e.time_ns));
                }
            }
        }
    }
    out.extend(open.into_iter().map(|(_, s)| (s, end_ns)));
    out
}
