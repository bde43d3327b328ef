//! The node's wall clock.
//!
//! Owns: every read of the wall clock in this crate ([`now`]): the times stamped on files
//! and directories, and the proposal times that pace the background jobs (forgetting
//! request records, reclaiming unlinked files); and [`confirmed_due`] (kept per partition
//! by a [`DueSince`]), which holds those jobs, the recovery of stale transactions and the
//! collection of chunks to the monotonic clock where a jump of the wall clock would act
//! too early or too late. Must not: pace anything that a jump of the wall clock could make
//! unsafe; timers, Raft's and the client's, run on the monotonic clock.
//!
//! With the `failpoints` feature, the `wall-clock` fail point armed as `return(ms)` makes
//! every read `ms` milliseconds later (earlier when negative) until it is disarmed: the
//! fault harness's clock jump on one node, without touching the host's clock. Disarming it
//! is the jump back.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use talon_model::Time;

/// Name of the fail point that shifts this node's wall clock.
pub const JUMP_POINT: &str = "wall-clock";

/// The wall clock as this node reads it.
pub fn now() -> Time {
    let t = Time::now();
    #[cfg(feature = "failpoints")]
    fail::fail_point!("wall-clock", |arg: Option<String>| {
        match arg.as_deref().map(str::trim).map(str::parse::<i64>) {
            Some(Ok(ms)) => shifted(t, ms),
            _ => {
                tracing::error!("fail point {JUMP_POINT}: armed without return(ms): {arg:?}");
                t
            }
        }
    });
    t
}

/// `t` moved by `ms` milliseconds (back when negative), saturating at the ends of time.
#[cfg(any(test, feature = "failpoints"))]
fn shifted(t: Time, ms: i64) -> Time {
    let nanos =
        i128::from(t.secs) * 1_000_000_000 + i128::from(t.nanos) + i128::from(ms) * 1_000_000;
    let secs = nanos.div_euclid(1_000_000_000);
    Time {
        secs: i64::try_from(secs).unwrap_or(if secs < 0 { i64::MIN } else { i64::MAX }),
        // Below 1e9 by the Euclidean remainder.
        nanos: nanos.rem_euclid(1_000_000_000) as u32,
    }
}

/// Of the items `due` (by a wall-clock time they carry, or simply present), those this node
/// has found due for at least `hold` by its monotonic clock; `seen` (items found due, and
/// since when) becomes exactly `due`'s items.
///
/// A wall-clock time stamped by one node and read against another's (or the same node's
/// after a jump) can be wrong by any amount in either direction. Request records are listed
/// here once their stamp looks old: a leader whose clock jumps forward would otherwise find
/// every record due at once and forget them, and a copy of a request re-sent after a lost
/// answer would then apply again (a second unlink, a second rename); so a record lives at
/// least `hold` after it first looked old, twice `hold` under a steady clock. Prepared
/// transactions are listed whatever their stamp: one stamped by a coordinator whose clock
/// ran ahead would otherwise look young, and hold its keys, for as long as the clock was
/// ahead. The monotonic clock cannot jump.
pub fn confirmed_due<K: Copy + Eq + Hash>(
    seen: &mut HashMap<K, Instant>,
    due: Vec<K>,
    now: Instant,
    hold: Duration,
) -> Vec<K> {
    confirmed_due_of(seen, due, now, hold, |_| true)
}

/// As [`confirmed_due`], for a round that looked at some of the items only (a page of a
/// scan): of `seen`, the items `looked_at` that are not due now are forgotten, and the
/// others are kept as they were, so an item found due on one page stays counted until a
/// later round looks at its page again.
pub fn confirmed_due_of<K: Copy + Eq + Hash>(
    seen: &mut HashMap<K, Instant>,
    due: Vec<K>,
    now: Instant,
    hold: Duration,
    looked_at: impl Fn(&K) -> bool,
) -> Vec<K> {
    let due_now: HashSet<K> = due.iter().copied().collect();
    seen.retain(|k, _| due_now.contains(k) || !looked_at(k));
    let mut out = Vec::new();
    for id in due {
        let since = *seen.entry(id).or_insert(now);
        if now.saturating_duration_since(since) >= hold {
            out.push(id);
        }
    }
    out
}

/// What one background job of a node has found due on the partitions it leads, by
/// partition, and since when by the monotonic clock (see [`confirmed_due`]).
#[derive(Debug)]
pub struct DueSince<K> {
    seen: Mutex<HashMap<u32, HashMap<K, Instant>>>,
    /// Where a job that pages through a partition's items stopped its last round.
    resume: Mutex<HashMap<u32, K>>,
}

impl<K> Default for DueSince<K> {
    fn default() -> Self {
        DueSince {
            seen: Mutex::new(HashMap::new()),
            resume: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Copy + Eq + Hash> DueSince<K> {
    /// Of the items `due` on `partition` now, those found due there for at least `hold`
    /// (see [`confirmed_due`]).
    pub fn confirmed(&self, partition: u32, due: Vec<K>, hold: Duration) -> Vec<K> {
        self.confirmed_of(partition, due, hold, |_| true)
    }

    /// As [`DueSince::confirmed`], for a round that looked at some of the partition's items
    /// only (see [`confirmed_due_of`]).
    pub fn confirmed_of(
        &self,
        partition: u32,
        due: Vec<K>,
        hold: Duration,
        looked_at: impl Fn(&K) -> bool,
    ) -> Vec<K> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        confirmed_due_of(
            seen.entry(partition).or_default(),
            due,
            Instant::now(),
            hold,
            looked_at,
        )
    }

    /// The item after which the next round's page of `partition` starts (None: at the
    /// start).
    pub fn resume_after(&self, partition: u32) -> Option<K> {
        let resume = self.resume.lock().unwrap_or_else(|e| e.into_inner());
        resume.get(&partition).copied()
    }

    /// Sets where the next round's page of `partition` starts (see
    /// [`DueSince::resume_after`]).
    pub fn set_resume(&self, partition: u32, after: Option<K>) {
        let mut resume = self.resume.lock().unwrap_or_else(|e| e.into_inner());
        match after {
            Some(k) => resume.insert(partition, k),
            None => resume.remove(&partition),
        };
    }

    /// Forgets what was found on `partition`: this node no longer leads it, and counts
    /// afresh (from the start of its items) if it leads it again.
    pub fn forget(&self, partition: u32) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&partition);
        self.set_resume(partition, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shifts_forward_and_back_across_a_second() {
        let t = Time {
            secs: 100,
            nanos: 900_000_000,
        };
        assert_eq!(
            shifted(t, 250),
            Time {
                secs: 101,
                nanos: 150_000_000
            }
        );
        assert_eq!(
            shifted(t, -1_000),
            Time {
                secs: 99,
                nanos: 900_000_000
            }
        );
        assert_eq!(
            shifted(Time { secs: 0, nanos: 0 }, -1),
            Time {
                secs: -1,
                nanos: 999_000_000
            }
        );
        assert_eq!(shifted(t, 0), t);
    }

    /// The harness's clock jump: armed, every read is moved; disarmed, the clock is back.
    #[cfg(feature = "failpoints")]
    #[test]
    fn an_armed_jump_moves_every_read_until_disarmed() {
        let before = Time::now().as_millis();
        fail::cfg(JUMP_POINT, "return(-86400000)").expect("arm the jump");
        let jumped = now().as_millis();
        fail::cfg(JUMP_POINT, "return(soon)").expect("arm a bad jump");
        let bad = now().as_millis();
        fail::remove(JUMP_POINT);
        let after = now().as_millis();
        assert!(
            jumped + 86_000_000 < before,
            "{jumped} is not a day before {before}"
        );
        assert!(bad >= before && after >= before, "{bad} {after} {before}");
    }

    #[test]
    fn saturates_at_the_ends_of_time() {
        let end = Time {
            secs: i64::MAX,
            nanos: 0,
        };
        assert_eq!(shifted(end, i64::MAX).secs, i64::MAX);
    }

    /// A wall clock that jumps forward makes every record look old at once; none is forgotten
    /// until it has looked old for the hold on the monotonic clock.
    #[test]
    fn records_that_look_old_at_once_are_held_on_the_monotonic_clock() {
        let hold = Duration::from_secs(300);
        let t0 = Instant::now();
        let mut seen = HashMap::new();
        // After a jump: all of 1, 2, 3 look old.
        assert!(confirmed_due(&mut seen, vec![1, 2, 3], t0, hold).is_empty());
        // A minute later (by the monotonic clock) still nothing; 4 looks old now too, and 3
        // is no longer listed (forgotten or replaced).
        let t1 = t0 + Duration::from_secs(60);
        assert!(confirmed_due(&mut seen, vec![1, 2, 4], t1, hold).is_empty());
        assert!(!seen.contains_key(&3));
        // The hold after the first sight: 1 and 2 go, 4 waits for its own.
        let t2 = t0 + hold;
        assert_eq!(
            confirmed_due(&mut seen, vec![1, 2, 4], t2, hold),
            vec![1, 2]
        );
        assert_eq!(confirmed_due(&mut seen, vec![4], t1 + hold, hold), vec![4]);
    }

    /// A round that looks at one page forgets only that page's items no longer due: an item
    /// of another page keeps its count until its own page comes round again.
    #[test]
    fn a_page_forgets_only_its_own_items() {
        let hold = Duration::from_secs(300);
        let t0 = Instant::now();
        let mut seen = HashMap::new();
        let page = |lo: u32, hi: u32| move |k: &u32| *k > lo && *k <= hi;
        // Page (0, 10]: 3 and 7 due. Page (10, 20]: 15 due.
        assert!(confirmed_due_of(&mut seen, vec![3, 7], t0, hold, page(0, 10)).is_empty());
        assert!(confirmed_due_of(&mut seen, vec![15], t0, hold, page(10, 20)).is_empty());
        // The first page again, a minute on: 7 is no longer due there and goes; 15 stays.
        let t1 = t0 + Duration::from_secs(60);
        assert!(confirmed_due_of(&mut seen, vec![3], t1, hold, page(0, 10)).is_empty());
        assert!(!seen.contains_key(&7) && seen.contains_key(&15));
        // The hold after each first sight: 15 on its page, 3 on its own.
        let t2 = t0 + hold;
        assert_eq!(
            confirmed_due_of(&mut seen, vec![15], t2, hold, page(10, 20)),
            vec![15]
        );
        assert_eq!(
            confirmed_due_of(&mut seen, vec![3], t2, hold, page(0, 10)),
            vec![3]
        );
        // Where the next page starts is kept per partition, and forgotten with it.
        let due = DueSince::default();
        due.set_resume(1, Some(10u32));
        assert_eq!((due.resume_after(1), due.resume_after(2)), (Some(10), None));
        due.forget(1);
        assert_eq!(due.resume_after(1), None);
    }

    /// A partition forgotten (its leadership lost) counts afresh; the others keep their
    /// count.
    #[test]
    fn a_forgotten_partition_counts_afresh() {
        let due = DueSince::default();
        let hold = Duration::from_millis(50);
        assert!(due.confirmed(1, vec![7], hold).is_empty());
        assert!(due.confirmed(2, vec![7], hold).is_empty());
        std::thread::sleep(hold);
        due.forget(1);
        assert!(due.confirmed(1, vec![7], hold).is_empty());
        assert_eq!(due.confirmed(2, vec![7], hold), vec![7]);
    }
}
