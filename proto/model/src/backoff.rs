//! How long to wait before sending a refused or unanswered request again: the pauses of
//! every retry loop in Talon, client and server, in one place.
//!
//! Each loop decides *what* it retries (the router: an unreachable replica, `NotLeader`,
//! `Retry`; the client's settle wrapper: `StaleEpoch`, `ClassChanged`; a server's peer
//! call: an unknown leader; a server's planner: a plan the state moved under). This module
//! decides only *when*, with three named policies:
//!
//! | policy                  | pauses                              | used by                   |
//! |-------------------------|-------------------------------------|---------------------------|
//! | [`Backoff::rpc`]        | 5 ms doubling to 200 ms             | router, batches, peers    |
//! | [`Backoff::contention`] | random in 4 ms doubling to 128 ms   | stale epochs (client)     |
//! | [`Backoff::replan`]     | 5 ms plus up to `spread_ms`, flat   | server plans (`Retry`)    |
//!
//! The random ones keep clients (or planners) that refused one another from meeting again in
//! lockstep. Pure logic: callers sleep for the pause with their own runtime.

use std::time::{Duration, Instant};

/// A sequence of pauses; see the module docs for the policies.
#[derive(Debug, Clone)]
pub struct Backoff {
    /// The next pause before jitter.
    next: Duration,
    /// The longest pause before jitter.
    cap: Duration,
    jitter: Jitter,
}

#[derive(Debug, Clone, Copy)]
enum Jitter {
    /// The pause as it is.
    None,
    /// Uniform in `0..=pause`.
    Full,
    /// The pause plus uniform in `0..spread`.
    Add(Duration),
}

impl Backoff {
    /// Pauses between attempts at a replica or a leader: 5 ms, doubling to 200 ms.
    pub fn rpc() -> Self {
        Backoff {
            next: Duration::from_millis(5),
            cap: Duration::from_millis(200),
            jitter: Jitter::None,
        }
    }

    /// Pauses after a refusal caused by another client's change (a directory rename moved
    /// the epoch): random within a window of 4 ms, doubling to 128 ms.
    pub fn contention() -> Self {
        Backoff {
            next: Duration::from_millis(4),
            cap: Duration::from_millis(128),
            jitter: Jitter::Full,
        }
    }

    /// Pauses before planning again after the state moved under a plan: 5 ms plus a random
    /// spread of up to `spread_ms` (at least 1), the same every time.
    pub fn replan(spread_ms: u64) -> Self {
        let base = Duration::from_millis(5);
        Backoff {
            next: base,
            cap: base,
            jitter: Jitter::Add(Duration::from_millis(spread_ms.max(1))),
        }
    }

    /// The next pause; the one after it doubles, up to the policy's cap.
    pub fn pause(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.cap);
        match self.jitter {
            Jitter::None => base,
            Jitter::Full => random_up_to(base),
            Jitter::Add(spread) => {
                base + random_up_to(spread.saturating_sub(Duration::from_millis(1)))
            }
        }
    }

    /// The next pause, or `None` when sleeping it would reach `deadline` (the caller then
    /// gives up with the last error instead of waking up too late to try).
    pub fn pause_before(&mut self, deadline: Instant) -> Option<Duration> {
        let p = self.pause();
        (Instant::now() + p < deadline).then_some(p)
    }
}

/// Uniform in `0..=max`, at millisecond grain.
fn random_up_to(max: Duration) -> Duration {
    let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::random_range(0..=ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn rpc_pauses_double_to_the_cap() {
        let mut b = Backoff::rpc();
        let got: Vec<_> = (0..8).map(|_| b.pause()).collect();
        assert_eq!(
            got,
            [
                ms(5),
                ms(10),
                ms(20),
                ms(40),
                ms(80),
                ms(160),
                ms(200),
                ms(200)
            ]
        );
    }

    #[test]
    fn contention_pauses_stay_within_a_doubling_window() {
        for _ in 0..50 {
            let mut b = Backoff::contention();
            for window in [4, 8, 16, 32, 64, 128, 128] {
                assert!(b.pause() <= ms(window));
            }
        }
    }

    #[test]
    fn replan_pauses_do_not_grow() {
        for _ in 0..50 {
            let mut b = Backoff::replan(10);
            for _ in 0..5 {
                let p = b.pause();
                assert!(p >= ms(5) && p < ms(15), "{p:?}");
            }
        }
        assert_eq!(Backoff::replan(0).pause(), ms(5));
    }

    #[test]
    fn no_pause_runs_past_the_deadline() {
        let mut b = Backoff::rpc();
        assert_eq!(b.pause_before(Instant::now() + ms(1)), None);
        assert_eq!(b.pause_before(Instant::now() + ms(1000)), Some(ms(10)));
    }
}
