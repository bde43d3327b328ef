//! The checkers say "no" to known-bad histories (a stale read, a lost acknowledged write, a
//! client's own create not read back, a file duplicated by a rename, a torn checkpoint, a
//! link count that misses a link) and
//! "yes" to good ones, including
//! histories whose unknown-outcome operations only make sense if they took effect late.

use talon_jepsen::checker::{check_links, check_registers, check_renames, check_set, Leniency};

const STRICT: Leniency = Leniency { guessed: false };
const LENIENT: Leniency = Leniency { guessed: true };
use talon_jepsen::history::{Call, Event, EventType};

/// Builds a history one event at a time, each 1 ms after the last.
#[derive(Default)]
struct H(Vec<Event>);

impl H {
    fn ev(&mut self, process: u64, kind: EventType, call: Call) -> &mut Self {
        let index = self.0.len() as u64;
        self.0.push(Event {
            index,
            time_ns: index * 1_000_000,
            process,
            kind,
            call,
            error: None,
        });
        self
    }
    fn invoke(&mut self, p: u64, c: Call) -> &mut Self {
        self.ev(p, EventType::Invoke, c)
    }
    fn ok(&mut self, p: u64, c: Call) -> &mut Self {
        self.ev(p, EventType::Ok, c)
    }
    fn fail(&mut self, p: u64, c: Call) -> &mut Self {
        self.ev(p, EventType::Fail, c)
    }
    fn info(&mut self, p: u64, c: Call) -> &mut Self {
        self.ev(p, EventType::Info, c)
    }
    /// An operation that completes before the next one starts.
    fn op(&mut self, p: u64, invoke: Call, done: Call) -> &mut Self {
        self.invoke(p, invoke).ok(p, done)
    }
}

fn w(v: u64) -> Call {
    Call::Write {
        key: "r".into(),
        value: v,
    }
}
fn r(v: Option<u64>) -> Call {
    Call::Read {
        key: "r".into(),
        value: v,
    }
}
fn cas(v: u64, created: Option<bool>) -> Call {
    Call::Cas {
        key: "r".into(),
        value: v,
        created,
    }
}

#[test]
fn register_accepts_a_sequential_history() {
    let mut h = H::default();
    h.op(0, r(None), r(None))
        .op(1, cas(1, None), cas(1, Some(true)))
        .op(0, r(None), r(Some(1)))
        .op(1, cas(2, None), cas(2, Some(false)))
        .op(0, w(3), w(3))
        .op(1, r(None), r(Some(3)));
    let v = check_registers(&h.0, STRICT);
    assert!(v.valid, "{v:?}");
}

#[test]
fn register_rejects_a_stale_read() {
    let mut h = H::default();
    h.op(0, w(1), w(1))
        .op(0, w(2), w(2))
        .op(1, r(None), r(Some(1)));
    let v = check_registers(&h.0, STRICT);
    assert!(!v.valid, "a read after write 2 completed saw 1: {v:?}");
    assert!(v.anomalies[0].contains("not linearizable"), "{v:?}");
}

#[test]
fn register_rejects_a_lost_acknowledged_write() {
    let mut h = H::default();
    h.op(0, w(1), w(1)).op(1, r(None), r(None));
    assert!(!check_registers(&h.0, STRICT).valid);
}

#[test]
fn register_rejects_a_failed_write_that_took_effect() {
    let mut h = H::default();
    h.invoke(0, w(1)).fail(0, w(1)).op(1, r(None), r(Some(1)));
    assert!(
        !check_registers(&h.0, STRICT).valid,
        "fail means it did not happen"
    );
}

#[test]
fn register_lets_an_unknown_write_take_effect_late_or_never() {
    // Write 1 times out; a later read still sees nothing, a read after that sees 1.
    let mut h = H::default();
    h.invoke(0, w(1))
        .info(0, w(1))
        .op(1, r(None), r(None))
        .op(1, r(None), r(Some(1)));
    let v = check_registers(&h.0, STRICT);
    assert!(v.valid, "{v:?}");
    // ... but once seen it cannot be undone without another write.
    h.op(1, r(None), r(None));
    assert!(!check_registers(&h.0, STRICT).valid);
    // An unknown write that was never seen is fine too.
    let mut h = H::default();
    h.invoke(0, w(1)).info(0, w(1)).op(1, r(None), r(None));
    assert!(check_registers(&h.0, STRICT).valid);
}

#[test]
fn register_accepts_either_order_of_concurrent_operations() {
    // Read overlaps write: it may see the old or the new value.
    for seen in [None, Some(1)] {
        let mut h = H::default();
        h.invoke(0, w(1))
            .invoke(1, r(None))
            .ok(1, r(seen))
            .ok(0, w(1));
        let v = check_registers(&h.0, STRICT);
        assert!(v.valid, "{seen:?}: {v:?}");
    }
    // Two overlapping CAS: exactly one may succeed.
    let mut h = H::default();
    h.invoke(0, cas(1, None))
        .invoke(1, cas(2, None))
        .ok(0, cas(1, Some(true)))
        .ok(1, cas(2, Some(true)));
    assert!(!check_registers(&h.0, STRICT).valid, "both CAS succeeded");
}

#[test]
fn register_rejects_a_torn_checkpoint() {
    let mut h = H::default();
    h.op(0, w(1), w(1)).invoke(1, r(None)).ok(
        1,
        Call::Torn {
            key: "r".into(),
            detail: "CRC mismatch".into(),
        },
    );
    let v = check_registers(&h.0, STRICT);
    assert!(!v.valid);
    assert!(v.anomalies[0].contains("torn"), "{v:?}");
}

fn add(e: &str) -> Call {
    Call::Add { element: e.into() }
}
fn read_set(names: &[&str]) -> Call {
    Call::ReadSet {
        elements: Some(names.iter().map(|s| s.to_string()).collect()),
    }
}

#[test]
fn set_accepts_acknowledged_and_some_unknown_creates() {
    let mut h = H::default();
    h.op(0, add("e0"), add("e0"))
        .invoke(1, add("e1"))
        .info(1, add("e1"))
        .invoke(2, add("e2"))
        .info(2, add("e2"))
        .invoke(3, add("e3"))
        .fail(3, add("e3"))
        .op(9, Call::ReadSet { elements: None }, read_set(&["e0", "e2"]));
    let v = check_set(&h.0);
    assert!(v.valid, "{v:?}");
}

#[test]
fn set_rejects_a_lost_create_and_a_phantom() {
    let mut h = H::default();
    h.op(0, add("e0"), add("e0"))
        .op(0, add("e1"), add("e1"))
        .op(9, Call::ReadSet { elements: None }, read_set(&["e1", "zz"]));
    let v = check_set(&h.0);
    assert!(!v.valid);
    assert_eq!(v.anomalies.len(), 2, "{v:?}");
    assert!(v.anomalies[0].contains("e0"), "{v:?}");
    assert!(v.anomalies[1].contains("zz"), "{v:?}");
}

#[test]
fn set_rejects_a_failed_create_that_exists_and_a_missing_final_read() {
    let mut h = H::default();
    h.invoke(0, add("e0")).fail(0, add("e0")).op(
        9,
        Call::ReadSet { elements: None },
        read_set(&["e0"]),
    );
    assert!(!check_set(&h.0).valid);
    let mut h = H::default();
    h.op(0, add("e0"), add("e0"));
    assert!(!check_set(&h.0).valid, "no final listing");
}

fn back(e: &str, body: Option<&str>) -> Call {
    Call::ReadBack {
        element: e.into(),
        body: body.map(str::to_string),
    }
}

#[test]
fn set_accepts_reads_back_that_see_the_file_or_began_before_its_add_was_acknowledged() {
    let mut h = H::default();
    h.invoke(0, add("e0"))
        // Began before the add's acknowledgement: may miss it.
        .invoke(1, back("e0", None))
        .ok(1, back("e0", None))
        .ok(0, add("e0"))
        .op(1, back("e0", None), back("e0", Some("e0")))
        .op(0, back("e0", None), back("e0", Some("e0")))
        .op(9, Call::ReadSet { elements: None }, read_set(&["e0"]));
    let v = check_set(&h.0);
    assert!(v.valid, "{v:?}");
    assert!(v.checked.contains("2 own files read back"), "{v:?}");
}

#[test]
fn set_rejects_a_read_back_that_misses_an_acknowledged_create_or_its_contents() {
    let mut h = H::default();
    h.op(0, add("e0"), add("e0"))
        .op(0, add("e1"), add("e1"))
        .op(1, back("e0", None), back("e0", None))
        .op(0, back("e1", None), back("e1", Some("")))
        .op(9, Call::ReadSet { elements: None }, read_set(&["e0", "e1"]));
    let v = check_set(&h.0);
    assert!(!v.valid);
    assert_eq!(v.anomalies.len(), 2, "{v:?}");
    assert!(v.anomalies[0].contains("found no file: e0"), "{v:?}");
    assert!(v.anomalies[1].contains("e1 read as \"\""), "{v:?}");
}

fn mv(f: &str, from: &str, to: &str) -> Call {
    Call::Move {
        file: f.into(),
        from: from.into(),
        to: to.into(),
    }
}
fn listing(last: bool, a: &[&str], b: &[&str]) -> Call {
    Call::List {
        last,
        a: Some(a.iter().map(|s| s.to_string()).collect()),
        b: Some(b.iter().map(|s| s.to_string()).collect()),
    }
}
fn list_call(last: bool) -> Call {
    Call::List {
        last,
        a: None,
        b: None,
    }
}

#[test]
fn renames_accept_a_good_history() {
    let mut h = H::default();
    h.op(9, add("f0"), add("f0"))
        .op(9, add("f1"), add("f1"))
        .op(1, mv("f0", "a", "b"), mv("f0", "a", "b"))
        .op(0, list_call(false), listing(false, &["f1"], &["f0"]))
        // A listing during a move may see the file twice or not at all.
        .invoke(1, mv("f1", "a", "b"))
        .invoke(0, list_call(false))
        .ok(0, listing(false, &["f1"], &["f0", "f1"]))
        .ok(1, mv("f1", "a", "b"))
        .invoke(2, mv("f0", "a", "b"))
        .fail(2, mv("f0", "a", "b"))
        .op(0, list_call(true), listing(true, &[], &["f0", "f1"]));
    let v = check_renames(&h.0, STRICT);
    assert!(v.valid, "{v:?}");
}

#[test]
fn renames_reject_a_duplicated_file() {
    // After the move completed, the file shows in both directories.
    let mut h = H::default();
    h.op(9, add("f0"), add("f0"))
        .op(1, mv("f0", "a", "b"), mv("f0", "a", "b"))
        .op(0, list_call(false), listing(false, &["f0"], &["f0"]));
    let v = check_renames(&h.0, STRICT);
    assert!(!v.valid);
    assert!(
        v.anomalies.iter().any(|a| a.contains("f0 appears 2 times")),
        "{v:?}"
    );
    // In the final listing a duplicate is an anomaly even with an unknown move before it.
    let mut h = H::default();
    h.op(9, add("f0"), add("f0"))
        .invoke(1, mv("f0", "a", "b"))
        .info(1, mv("f0", "a", "b"))
        .op(0, list_call(true), listing(true, &["f0"], &["f0"]));
    assert!(!check_renames(&h.0, STRICT).valid);
}

#[test]
fn renames_reject_half_a_rename() {
    // a is listed first: while f0 moves from a to b it may show in both, never in neither.
    let mut h = H::default();
    h.op(9, add("f0"), add("f0"))
        .invoke(1, mv("f0", "a", "b"))
        .invoke(0, list_call(false))
        .ok(0, listing(false, &[], &[]))
        .ok(1, mv("f0", "a", "b"))
        .op(0, list_call(true), listing(true, &[], &["f0"]));
    let v = check_renames(&h.0, STRICT);
    assert!(!v.valid, "{v:?}");
    assert!(v.anomalies[0].contains("f0 appears 0 times"), "{v:?}");
    // Moving from b to a, it may show in neither.
    let mut h = H::default();
    h.op(9, add("f0"), add("f0"))
        .op(1, mv("f0", "a", "b"), mv("f0", "a", "b"))
        .invoke(1, mv("f0", "b", "a"))
        .invoke(0, list_call(false))
        .ok(0, listing(false, &[], &[]))
        .ok(1, mv("f0", "b", "a"))
        .op(0, list_call(true), listing(true, &["f0"], &[]));
    let v = check_renames(&h.0, STRICT);
    assert!(v.valid, "{v:?}");
}

#[test]
fn renames_reject_a_lost_file_and_an_unknown_name() {
    let mut h = H::default();
    h.op(9, add("f0"), add("f0"))
        .op(9, add("f1"), add("f1"))
        .op(0, list_call(true), listing(true, &["f1", "ghost"], &[]));
    let v = check_renames(&h.0, STRICT);
    assert!(!v.valid);
    assert!(v.anomalies.iter().any(|a| a.contains("ghost")), "{v:?}");
    assert!(
        v.anomalies.iter().any(|a| a.contains("f0 appears 0 times")),
        "{v:?}"
    );
}

#[test]
fn lenient_checks_count_guessed_answers_as_unknown() {
    // A rename answered ENOENT whose value is read later: a lie unless the answer was a guess.
    let mut h = H::default();
    h.invoke(0, w(1));
    h.0.push(Event {
        index: 1,
        time_ns: 1_000_000,
        process: 0,
        kind: EventType::Fail,
        call: w(1),
        error: Some("ENOENT (2): no entry r".into()),
    });
    h.op(1, r(None), r(Some(1)));
    assert!(!check_registers(&h.0, STRICT).valid);
    assert!(check_registers(&h.0, LENIENT).valid);
    // An unlink that says the file was there when nothing ever created it.
    let del = |existed| Call::Delete {
        key: "r".into(),
        existed,
    };
    let mut h = H::default();
    h.op(0, del(None), del(Some(true))).op(1, r(None), r(None));
    assert!(!check_registers(&h.0, STRICT).valid);
    assert!(check_registers(&h.0, LENIENT).valid);
    // The process that got a guessed answer goes on; its guessed operation stays in flight.
    let c = |v, created| cas(v, created);
    let mut h = H::default();
    h.op(0, c(1, None), c(1, Some(false)))
        .op(0, r(None), r(Some(1)))
        .op(0, c(2, None), c(2, Some(false)))
        .op(0, del(None), del(Some(true)))
        .op(0, r(None), r(None));
    let v = check_registers(&h.0, LENIENT);
    assert!(v.valid, "{v:?}");
    assert!(!check_registers(&h.0, STRICT).valid);
    // Leniency does not excuse a stale read.
    let mut h = H::default();
    h.op(0, w(1), w(1))
        .op(0, w(2), w(2))
        .op(1, r(None), r(Some(1)));
    assert!(!check_registers(&h.0, LENIENT).valid);
}

fn link(slot: u8, created: Option<bool>) -> Call {
    Call::Link {
        key: "f".into(),
        slot,
        created,
    }
}
fn unlink(slot: u8, existed: Option<bool>) -> Call {
    Call::Unlink {
        key: "f".into(),
        slot,
        existed,
    }
}
fn nlink(n: Option<u32>) -> Call {
    Call::Nlink {
        key: "f".into(),
        nlink: n,
    }
}

#[test]
fn links_accept_counts_that_follow_the_links() {
    let mut h = H::default();
    h.op(0, nlink(None), nlink(Some(1)))
        .op(1, link(0, None), link(0, Some(true)))
        .op(2, link(3, None), link(3, Some(true)))
        .op(0, nlink(None), nlink(Some(3)))
        .op(1, link(0, None), link(0, Some(false)))
        .op(2, unlink(0, None), unlink(0, Some(true)))
        .op(1, unlink(0, None), unlink(0, Some(false)))
        .op(0, nlink(None), nlink(Some(2)));
    let v = check_links(&h.0, STRICT);
    assert!(v.valid, "{v:?}");
}

/// A count read after an acknowledged link that does not include it: the link's entry
/// committed on its directory's partition and the count on the inode's did not (or not
/// yet, for a strict read).
#[test]
fn links_reject_a_count_that_misses_an_acknowledged_link() {
    let mut h = H::default();
    h.op(1, link(2, None), link(2, Some(true)))
        .op(0, nlink(None), nlink(Some(1)));
    let v = check_links(&h.0, STRICT);
    assert!(!v.valid, "{v:?}");
    assert!(v.anomalies[0].contains("not linearizable"), "{v:?}");
}

/// A count that went up although the only link made failed for certain, and an unlink
/// that found a name no link ever made.
#[test]
fn links_reject_a_failed_link_that_counted_and_an_entry_from_nowhere() {
    let mut h = H::default();
    h.invoke(1, link(4, None))
        .fail(1, link(4, None))
        .op(0, nlink(None), nlink(Some(2)));
    assert!(!check_links(&h.0, STRICT).valid);
    let mut h = H::default();
    h.op(1, unlink(5, None), unlink(5, Some(true)));
    assert!(!check_links(&h.0, STRICT).valid);
}

/// A link whose answer was lost may take effect late or never; a lenient check also lets
/// an EEXIST the client may have guessed mean "made by the first copy".
#[test]
fn links_let_an_unknown_link_take_effect_late_or_never() {
    let mut h = H::default();
    h.invoke(1, link(1, None))
        .info(1, link(1, None))
        .op(0, nlink(None), nlink(Some(1)))
        .op(0, nlink(None), nlink(Some(2)))
        .op(2, unlink(1, None), unlink(1, Some(true)))
        .op(0, nlink(None), nlink(Some(1)));
    let v = check_links(&h.0, STRICT);
    assert!(v.valid, "{v:?}");
    let mut h = H::default();
    h.op(1, link(1, None), link(1, Some(false)))
        .op(0, nlink(None), nlink(Some(2)));
    assert!(!check_links(&h.0, STRICT).valid);
    assert!(check_links(&h.0, LENIENT).valid);
}
