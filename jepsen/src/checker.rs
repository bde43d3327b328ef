//! Checkers: each takes a whole history and says whether it is allowed, naming every
//! anomaly it found.
//!
//! - [`check_registers`]: the operations on each register file must be linearizable. The
//!   search is stateright's `LinearizabilityTester` (a maintained Wing–Gong style checker),
//!   fed per key in history order. An `info` operation is left in flight forever, so the
//!   tester may place it at any point after its invocation, or nowhere; a `fail` operation
//!   is dropped, since it certainly had no effect.
//! - [`check_set`]: after the run, every acknowledged create is listed, no listed name was
//!   never attempted, and no create that failed is listed.
//! - [`check_renames`]: at every listing of the two rename directories (`a`, then `b`) a
//!   file appears exactly once, unless a rename of it could have taken effect between the
//!   two reads: twice only if one from `a` to `b` was in flight, nowhere only if one from
//!   `b` to `a` was. At the final quiescent listing every file appears exactly once.
//! - [`check_links`]: the links workload's operations on each file (link, unlink, read of
//!   the link count) must be linearizable, with the same search and treatment of unknown
//!   operations as the registers ([`check_keyed`] is both).
//! - Any [`Call::Torn`] result (a checkpoint whose checksum did not match) is an anomaly.
//!
//! Checkers never look at timing beyond the real-time order of events, so a slow machine
//! cannot turn a good history into a bad one.

use crate::history::{pair, Call, Completed, Event, EventType, NEMESIS};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Most operations on one register the checker accepts; the search is exponential in the
/// worst case, so workloads move on to a new key well before this.
pub const MAX_OPS_PER_KEY: usize = 64;

/// What a checker concluded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the history is allowed.
    pub valid: bool,
    /// Every anomaly found, one line each, naming the operations (history indices).
    pub anomalies: Vec<String>,
    /// What was checked, for the summary.
    pub checked: String,
}

impl Verdict {
    fn new(checked: String, anomalies: Vec<String>) -> Verdict {
        Verdict {
            valid: anomalies.is_empty(),
            anomalies,
            checked,
        }
    }

    /// Joins two verdicts on parts of one history.
    pub fn and(mut self, other: Verdict) -> Verdict {
        self.valid &= other.valid;
        self.anomalies.extend(other.anomalies);
        if self.checked.is_empty() {
            self.checked = other.checked;
        } else if !other.checked.is_empty() {
            self.checked = format!("{}; {}", self.checked, other.checked);
        }
        self
    }
}

/// How far to trust answers that Talon's client may have guessed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Leniency {
    /// After re-sending a write whose answer was lost, Talon's client guesses its outcome
    /// from the namespace (finding F1): a rename's ENOENT or EEXIST and an unlink's success
    /// can be wrong. When set, such answers count as unknown: the rename as possibly applied
    /// at any time after its invocation, the unlink as "removed, whether or not the file
    /// was there".
    pub guessed: bool,
}

/// Whether `c` is a rename that failed with an answer the client may have guessed.
fn guessed_rename_failure(c: &Completed) -> bool {
    c.kind == EventType::Fail
        && c.error.as_deref().is_some_and(|e| {
            !e.starts_with("write the temporary file")
                && (e.contains("ENOENT") || e.contains("EEXIST"))
        })
}

/// A file used as a register: its contents (a number) or no file at all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileRegister(pub Option<u64>);

/// An operation on a [`FileRegister`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RegisterOp {
    /// Read the contents.
    Read,
    /// Replace the contents (rename over).
    Write(u64),
    /// Set the contents if there is no file (rename NOREPLACE).
    Cas(u64),
    /// Remove the file.
    Delete,
    /// Remove the file, not saying whether it was there (a lenient unlink).
    Remove,
}

/// The result of a [`RegisterOp`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RegisterRet {
    /// What a read saw.
    Value(Option<u64>),
    /// A write took effect.
    Written,
    /// Whether a compare-and-set took effect.
    Created(bool),
    /// Whether a delete found the file.
    Deleted(bool),
    /// A lenient unlink took effect.
    Removed,
}

impl SequentialSpec for FileRegister {
    type Op = RegisterOp;
    type Ret = RegisterRet;

    fn invoke(&mut self, op: &RegisterOp) -> RegisterRet {
        match op {
            RegisterOp::Read => RegisterRet::Value(self.0),
            RegisterOp::Write(v) => {
                self.0 = Some(*v);
                RegisterRet::Written
            }
            RegisterOp::Cas(v) => {
                if self.0.is_none() {
                    self.0 = Some(*v);
                    RegisterRet::Created(true)
                } else {
                    RegisterRet::Created(false)
                }
            }
            RegisterOp::Delete => RegisterRet::Deleted(self.0.take().is_some()),
            RegisterOp::Remove => {
                self.0 = None;
                RegisterRet::Removed
            }
        }
    }
}

/// A call's key, operation and (on a completion) result, as a [`Keyed`] object sees it.
pub type KeyedCall<'a, S> = (
    &'a str,
    <S as SequentialSpec>::Op,
    Option<<S as SequentialSpec>::Ret>,
);

/// A sequential object the history's operations are checked against, one per key: which
/// calls act on it and how answers the client may have guessed are weakened.
pub trait Keyed: SequentialSpec + Clone + Default
where
    Self::Op: Clone + std::fmt::Debug,
    Self::Ret: Clone + std::fmt::Debug,
{
    /// What the objects are, for the verdict ("registers").
    const NAME: &'static str;

    /// The key, operation and (on a completion) result of `c`, if it acts on such an object.
    fn call(c: &Call) -> Option<KeyedCall<'_, Self>>;

    /// How to check completed operation `done` when the client may have guessed its
    /// answer ([`Leniency::guessed`]).
    fn guessed(done: &Completed) -> Mode;

    /// The blind form of `op`, checked as [`Mode::Blind`], and what it returns.
    fn blind(op: &Self::Op) -> (Self::Op, Self::Ret);

    /// One operation of `e`, for an anomaly report.
    fn describe(e: &Event) -> String;
}

/// How the checker treats one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// As recorded.
    AsIs,
    /// As unknown: left in flight.
    Unknown,
    /// As its blind form (a delete that does not say whether it found anything).
    Blind,
}

impl Keyed for FileRegister {
    const NAME: &'static str = "registers";

    fn call(c: &Call) -> Option<KeyedCall<'_, Self>> {
        Some(match c {
            Call::Read { key, value } => (key, RegisterOp::Read, Some(RegisterRet::Value(*value))),
            Call::Write { key, value } => {
                (key, RegisterOp::Write(*value), Some(RegisterRet::Written))
            }
            Call::Cas {
                key,
                value,
                created,
            } => (
                key,
                RegisterOp::Cas(*value),
                created.map(RegisterRet::Created),
            ),
            Call::Delete { key, existed } => {
                (key, RegisterOp::Delete, existed.map(RegisterRet::Deleted))
            }
            Call::Torn { key, .. } => (key, RegisterOp::Read, None),
            _ => return None,
        })
    }

    fn guessed(done: &Completed) -> Mode {
        match (&done.result, done.kind) {
            (_, EventType::Fail) if guessed_rename_failure(done) => Mode::Unknown,
            (
                Call::Cas {
                    created: Some(false),
                    ..
                },
                EventType::Ok,
            ) => Mode::Unknown,
            (
                Call::Delete {
                    existed: Some(true),
                    ..
                },
                EventType::Ok,
            ) => Mode::Blind,
            _ => Mode::AsIs,
        }
    }

    fn blind(_: &RegisterOp) -> (RegisterOp, RegisterRet) {
        (RegisterOp::Remove, RegisterRet::Removed)
    }

    fn describe(e: &Event) -> String {
        match &e.call {
            Call::Read { value, .. } => match e.kind {
                EventType::Ok => format!("read={value:?}"),
                _ => "read".into(),
            },
            Call::Write { value, .. } => format!("write {value}"),
            Call::Cas { value, created, .. } => format!("cas {value}->{created:?}"),
            Call::Delete { existed, .. } => format!("delete->{existed:?}"),
            _ => "torn".into(),
        }
    }
}

/// Checks that the register operations of `events`, per key, are linearizable.
pub fn check_registers(events: &[Event], lenient: Leniency) -> Verdict {
    check_keyed::<FileRegister>(events, lenient)
}

/// Checks that the operations of `events` on objects `S`, per key, are linearizable.
pub fn check_keyed<S: Keyed>(events: &[Event], lenient: Leniency) -> Verdict
where
    S::Op: Clone + std::fmt::Debug,
    S::Ret: Clone + std::fmt::Debug,
{
    let ops = pair(events);
    let by_invoke: HashMap<u64, &Completed> = ops.iter().map(|c| (c.index, c)).collect();
    let mut testers: BTreeMap<String, LinearizabilityTester<u64, S>> = BTreeMap::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    // Per process, its operation in flight: key, mode, tester thread, and the result of a
    // blind one.
    type Open<R> = (String, Mode, u64, Option<R>);
    let mut open: HashMap<u64, Open<S::Ret>> = HashMap::new();
    // The tester's thread of each process. An operation the checker leaves in flight
    // (`Mode::Unknown`) although its process went on gets its thread retired: the process
    // continues on a fresh one, so no thread ever has two operations in flight.
    let mut threads: HashMap<u64, u64> = HashMap::new();
    let mut next_thread: u64 = 1 << 48;
    let mut anomalies = Vec::new();
    let mut broken: BTreeSet<String> = BTreeSet::new();
    let (mut n_ok, mut n_info) = (0usize, 0usize);
    for e in events.iter().filter(|e| e.process != NEMESIS) {
        if let Call::Torn { key, detail } = &e.call {
            anomalies.push(format!(
                "torn read of {key} by process {} (event {}): {detail}",
                e.process, e.index
            ));
            open.remove(&e.process);
            continue;
        }
        match e.kind {
            EventType::Invoke => {
                let Some((key, op, _)) = S::call(&e.call) else {
                    continue;
                };
                let Some(done) = by_invoke.get(&e.index) else {
                    continue;
                };
                let mode = if lenient.guessed {
                    S::guessed(done)
                } else {
                    Mode::AsIs
                };
                if (done.kind == EventType::Fail && mode == Mode::AsIs)
                    || matches!(done.result, Call::Torn { .. })
                    || broken.contains(key)
                {
                    continue;
                }
                let (op, blind_ret) = if mode == Mode::Blind {
                    let (op, ret) = S::blind(&op);
                    (op, Some(ret))
                } else {
                    (op, None)
                };
                *counts.entry(key.to_string()).or_default() += 1;
                match (done.kind, mode) {
                    (EventType::Ok, Mode::AsIs | Mode::Blind) => n_ok += 1,
                    _ => n_info += 1,
                }
                let t = testers
                    .entry(key.to_string())
                    .or_insert_with(|| LinearizabilityTester::new(S::default()));
                let thread = threads.get(&e.process).copied().unwrap_or(e.process);
                if let Err(err) = t.on_invoke(thread, op) {
                    anomalies.push(format!("{key}: malformed history: {err}"));
                    broken.insert(key.to_string());
                }
                open.insert(e.process, (key.to_string(), mode, thread, blind_ret));
            }
            EventType::Ok => {
                let Some((key, mode, thread, blind_ret)) = open.remove(&e.process) else {
                    continue;
                };
                if mode == Mode::Unknown {
                    threads.insert(e.process, next_thread);
                    next_thread += 1;
                }
                if broken.contains(&key) || mode == Mode::Unknown {
                    continue;
                }
                let ret = match blind_ret {
                    Some(r) => Some(r),
                    None => S::call(&e.call).and_then(|(_, _, ret)| ret),
                };
                let Some(ret) = ret else {
                    anomalies.push(format!(
                        "{key}: event {} completes without a result",
                        e.index
                    ));
                    broken.insert(key);
                    continue;
                };
                if let Some(t) = testers.get_mut(&key) {
                    if let Err(err) = t.on_return(thread, ret) {
                        anomalies.push(format!("{key}: malformed history: {err}"));
                        broken.insert(key);
                    }
                }
            }
            EventType::Fail | EventType::Info => {
                if let Some((_, Mode::Unknown, _, _)) = open.remove(&e.process) {
                    threads.insert(e.process, next_thread);
                    next_thread += 1;
                }
            }
        }
    }
    for (key, t) in &testers {
        if broken.contains(key) {
            continue;
        }
        let n = counts.get(key).copied().unwrap_or(0);
        if n > MAX_OPS_PER_KEY {
            anomalies.push(format!(
                "{key}: {n} operations, more than the checker's bound {MAX_OPS_PER_KEY}"
            ));
            continue;
        }
        if !t.is_consistent() {
            anomalies.push(format!(
                "{key}: not linearizable; operations: {}",
                describe_key::<S>(events, key)
            ));
        }
    }
    Verdict::new(
        format!(
            "linearizability of {} {} ({n_ok} ok and {n_info} unknown operations)",
            testers.len(),
            S::NAME
        ),
        anomalies,
    )
}

/// A compact listing of the operations on `key`, for an anomaly report.
fn describe_key<S: Keyed>(events: &[Event], key: &str) -> String
where
    S::Op: Clone + std::fmt::Debug,
    S::Ret: Clone + std::fmt::Debug,
{
    let mut parts = Vec::new();
    for e in events {
        if S::call(&e.call).is_none_or(|(k, _, _)| k != key) {
            continue;
        }
        parts.push(format!(
            "#{} {:.3}s p{} {:?} {}",
            e.index,
            e.time_ns as f64 / 1e9,
            e.process,
            e.kind,
            S::describe(e)
        ));
        if parts.len() >= 200 {
            parts.push("...".into());
            break;
        }
    }
    parts.join(" | ")
}

/// A file with hard links (the links workload): which of its link slots hold a name. Its
/// first name is never removed, so its link count is one more than the slots held.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LinkedFile(pub u8);

/// An operation on a [`LinkedFile`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LinkOp {
    /// Make link `slot`, unless it exists.
    Link(u8),
    /// Remove link `slot`, if it exists.
    Unlink(u8),
    /// Remove link `slot`, not saying whether it existed (a lenient unlink).
    Remove(u8),
    /// Read the link count.
    Stat,
}

/// The result of a [`LinkOp`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LinkRet {
    /// Whether a link was made (false: the name existed).
    Linked(bool),
    /// Whether an unlink found the name.
    Unlinked(bool),
    /// A lenient unlink took effect.
    Removed,
    /// The link count read.
    Nlink(u32),
}

impl SequentialSpec for LinkedFile {
    type Op = LinkOp;
    type Ret = LinkRet;

    fn invoke(&mut self, op: &LinkOp) -> LinkRet {
        let bit = |slot: &u8| 1u8.checked_shl(u32::from(*slot)).unwrap_or(0);
        match op {
            LinkOp::Link(slot) => {
                let had = self.0 & bit(slot) != 0;
                self.0 |= bit(slot);
                LinkRet::Linked(!had)
            }
            LinkOp::Unlink(slot) => {
                let had = self.0 & bit(slot) != 0;
                self.0 &= !bit(slot);
                LinkRet::Unlinked(had)
            }
            LinkOp::Remove(slot) => {
                self.0 &= !bit(slot);
                LinkRet::Removed
            }
            LinkOp::Stat => LinkRet::Nlink(1 + self.0.count_ones()),
        }
    }
}

impl Keyed for LinkedFile {
    const NAME: &'static str = "linked files";

    fn call(c: &Call) -> Option<KeyedCall<'_, Self>> {
        Some(match c {
            Call::Link { key, slot, created } => {
                (key, LinkOp::Link(*slot), created.map(LinkRet::Linked))
            }
            Call::Unlink { key, slot, existed } => {
                (key, LinkOp::Unlink(*slot), existed.map(LinkRet::Unlinked))
            }
            Call::Nlink { key, nlink } => (key, LinkOp::Stat, nlink.map(LinkRet::Nlink)),
            _ => return None,
        })
    }

    fn guessed(done: &Completed) -> Mode {
        match (&done.result, done.kind) {
            (
                Call::Link {
                    created: Some(false),
                    ..
                },
                EventType::Ok,
            ) => Mode::Unknown,
            (
                Call::Unlink {
                    existed: Some(true),
                    ..
                },
                EventType::Ok,
            ) => Mode::Blind,
            _ => Mode::AsIs,
        }
    }

    fn blind(op: &LinkOp) -> (LinkOp, LinkRet) {
        match op {
            LinkOp::Unlink(slot) | LinkOp::Remove(slot) => {
                (LinkOp::Remove(*slot), LinkRet::Removed)
            }
            other => (other.clone(), LinkRet::Removed),
        }
    }

    fn describe(e: &Event) -> String {
        match (&e.call, e.kind) {
            (Call::Link { slot, created, .. }, _) => format!("link {slot}->{created:?}"),
            (Call::Unlink { slot, existed, .. }, _) => format!("unlink {slot}->{existed:?}"),
            (Call::Nlink { nlink, .. }, EventType::Ok) => format!("nlink={nlink:?}"),
            _ => "nlink".into(),
        }
    }
}

/// Checks that the operations on each linked file (links workload) are linearizable: every
/// link count read is one plus the links held at some point within the read, whatever
/// partitions the links' directories are on.
pub fn check_links(events: &[Event], lenient: Leniency) -> Verdict {
    check_keyed::<LinkedFile>(events, lenient)
}

/// Checks the set workload: every read back of a file whose add had been acknowledged
/// before the read began finds it, holding its name (the one client's own change, seen at
/// once and ever after); the last successful listing holds every acknowledged create,
/// nothing never attempted, and nothing whose create certainly failed.
pub fn check_set(events: &[Event]) -> Verdict {
    let ops = pair(events);
    let mut attempted = BTreeSet::new();
    // Each acknowledged add, with when it completed.
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    let mut failed = BTreeSet::new();
    let mut unknown = 0usize;
    let mut last: Option<&Completed> = None;
    for c in &ops {
        match (&c.invoke, c.kind) {
            (Call::Add { element }, kind) => {
                attempted.insert(element.clone());
                match kind {
                    EventType::Ok => {
                        acked.insert(element.clone(), c.complete_ns.unwrap_or(u64::MAX));
                    }
                    EventType::Fail => {
                        failed.insert(element.clone());
                    }
                    _ => unknown += 1,
                }
            }
            (Call::ReadSet { .. }, EventType::Ok)
                if last.is_none_or(|l| l.invoke_ns < c.invoke_ns) =>
            {
                last = Some(c);
            }
            _ => {}
        }
    }
    let Some(Completed {
        result: Call::ReadSet {
            elements: Some(listed),
        },
        index,
        ..
    }) = last
    else {
        return Verdict::new(
            "set".into(),
            vec!["no final listing of the set succeeded".into()],
        );
    };
    let listed: BTreeSet<String> = listed.iter().cloned().collect();
    let (read_back, mut anomalies) = check_read_backs(&ops, &acked);
    let lost: Vec<&String> = acked.keys().filter(|e| !listed.contains(*e)).collect();
    if !lost.is_empty() {
        anomalies.push(format!(
            "{} acknowledged creates missing from the final listing (event {index}): {}",
            lost.len(),
            sample(&lost)
        ));
    }
    let unexpected: Vec<&String> = listed.difference(&attempted).collect();
    if !unexpected.is_empty() {
        anomalies.push(format!(
            "{} names listed that were never created: {}",
            unexpected.len(),
            sample(&unexpected)
        ));
    }
    let resurrected: Vec<&String> = listed.intersection(&failed).collect();
    if !resurrected.is_empty() {
        anomalies.push(format!(
            "{} creates answered as failed are listed: {}",
            resurrected.len(),
            sample(&resurrected)
        ));
    }
    let recovered = listed
        .iter()
        .filter(|e| attempted.contains(*e) && !acked.contains_key(*e))
        .count();
    Verdict::new(
        format!(
            "set: {} attempted, {} acknowledged, {} failed, {unknown} unknown ({recovered} of \
             them present), {} listed at the end; {read_back} own files read back",
            attempted.len(),
            acked.len(),
            failed.len(),
            listed.len()
        ),
        anomalies,
    )
}

/// The successful reads back of `ops` that began after their file's add was acknowledged
/// (at `acked`), and one anomaly per kind of wrong answer among them.
fn check_read_backs(ops: &[Completed], acked: &BTreeMap<String, u64>) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut missing: Vec<String> = Vec::new();
    let mut wrong: Vec<String> = Vec::new();
    for c in ops {
        let (Call::ReadBack { element, body }, EventType::Ok) = (&c.result, c.kind) else {
            continue;
        };
        if acked.get(element).is_none_or(|&t| t > c.invoke_ns) {
            continue;
        }
        checked += 1;
        match body {
            None => missing.push(format!("{element} (event {})", c.index)),
            Some(b) if b != element => {
                wrong.push(format!("{element} read as {b:?} (event {})", c.index))
            }
            Some(_) => {}
        }
    }
    let mut anomalies = Vec::new();
    for (what, v) in [
        ("found no file", &missing),
        ("found other contents", &wrong),
    ] {
        if !v.is_empty() {
            let refs: Vec<&String> = v.iter().collect();
            anomalies.push(format!(
                "{} reads back of the client's own acknowledged creates {what}: {}",
                v.len(),
                sample(&refs)
            ));
        }
    }
    (checked, anomalies)
}

fn sample(v: &[&String]) -> String {
    let mut s: Vec<String> = v.iter().take(10).map(|s| s.to_string()).collect();
    if v.len() > 10 {
        s.push("...".into());
    }
    s.join(", ")
}

/// Checks the rename workload (see the module docs). The files are the acknowledged
/// `Add`s the workload made before the faults began.
pub fn check_renames(events: &[Event], lenient: Leniency) -> Verdict {
    let ops = pair(events);
    let files: BTreeSet<String> = ops
        .iter()
        .filter_map(|c| match (&c.invoke, c.kind) {
            (Call::Add { element }, EventType::Ok) => Some(element.clone()),
            _ => None,
        })
        .collect();
    let guessed = |c: &Completed| lenient.guessed && guessed_rename_failure(c);
    let moves: Vec<&Completed> = ops
        .iter()
        .filter(|c| {
            matches!(c.invoke, Call::Move { .. }) && (c.kind != EventType::Fail || guessed(c))
        })
        .collect();
    let mut windows: HashMap<(&str, &str), MoveWindows> = HashMap::new();
    for m in &moves {
        if let Call::Move { file, from, .. } = &m.invoke {
            let done = if guessed(m) { None } else { m.complete_ns };
            windows
                .entry((file.as_str(), from.as_str()))
                .or_default()
                .add(m.invoke_ns, done);
        }
    }
    for w in windows.values_mut() {
        w.seal();
    }
    let mut anomalies = Vec::new();
    let mut listings = 0usize;
    let mut final_seen = false;
    for c in &ops {
        let (
            EventType::Ok,
            Call::List {
                last,
                a: Some(a),
                b: Some(b),
            },
        ) = (c.kind, &c.result)
        else {
            continue;
        };
        listings += 1;
        final_seen |= *last;
        let start = c.invoke_ns;
        let end = c.complete_ns.unwrap_or(u64::MAX);
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for name in a.iter().chain(b.iter()) {
            if !files.contains(name) {
                anomalies.push(format!(
                    "listing (event {}) shows {name:?}, which was never created",
                    c.index
                ));
            }
            *count.entry(name).or_default() += 1;
        }
        for (dir, names) in [("a", a), ("b", b)] {
            let uniq: BTreeSet<&String> = names.iter().collect();
            if uniq.len() != names.len() {
                anomalies.push(format!(
                    "listing (event {}) shows a name twice in directory {dir}",
                    c.index
                ));
            }
        }
        for f in &files {
            let n = count.get(f.as_str()).copied().unwrap_or(0);
            // Directory a is listed before b. A move from a to b between the two makes
            // the file show twice; one from b to a makes it show nowhere. Nothing else may.
            let in_flight = |dir: &str| {
                windows
                    .get(&(f.as_str(), dir))
                    .is_some_and(|w| w.overlaps(start, end))
            };
            let allowed = match n {
                1 => true,
                0 => !*last && in_flight("b"),
                2 => !*last && in_flight("a"),
                _ => false,
            };
            if !allowed {
                let why = if *last {
                    "the final listing"
                } else if n == 0 {
                    "a listing while no rename of it from b to a was in flight"
                } else if n == 2 {
                    "a listing while no rename of it from a to b was in flight"
                } else {
                    "a listing"
                };
                anomalies.push(format!(
                    "{f} appears {n} times in {why} (event {}, {:.3}-{:.3} s)",
                    c.index,
                    start as f64 / 1e9,
                    end as f64 / 1e9
                ));
            }
        }
    }
    if !final_seen {
        anomalies.push("no final listing succeeded".into());
    }
    Verdict::new(
        format!(
            "renames: {} files, {} renames not failed, {listings} listings",
            files.len(),
            moves.len()
        ),
        anomalies,
    )
}

/// The time windows of the (not failed) renames of one file in one direction, for fast
/// "was one in flight during [start, end]?" questions over long histories.
#[derive(Default)]
struct MoveWindows {
    /// `(invoke, complete)`, sorted by invocation once sealed; `u64::MAX`: never completed.
    spans: Vec<(u64, u64)>,
    /// `reach[i]`: the latest completion among `spans[..=i]`.
    reach: Vec<u64>,
}

impl MoveWindows {
    fn add(&mut self, invoke: u64, complete: Option<u64>) {
        self.spans.push((invoke, complete.unwrap_or(u64::MAX)));
    }

    fn seal(&mut self) {
        self.spans.sort_unstable();
        let mut max = 0;
        self.reach = self
            .spans
            .iter()
            .map(|&(_, done)| {
                max = max.max(done);
                max
            })
            .collect();
    }

    /// Whether one was invoked before `end` and completed after `start` (or never).
    fn overlaps(&self, start: u64, end: u64) -> bool {
        let n = self.spans.partition_point(|&(invoke, _)| invoke < end);
        n > 0 && self.reach[n - 1] > start
    }
}
