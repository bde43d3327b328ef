//! The node's wall clock.
//!
//! Owns: every read of the wall clock in this crate ([`now`]): the times stamped on files
//! and directories, and the proposal times that pace the background jobs (forgetting
//! request records, reclaiming unlinked files, recovering stale transactions). Must not:
//! pace anything that a jump of the wall clock could make unsafe; timers, Raft's and the
//! client's, run on the monotonic clock.
//!
//! With the `failpoints` feature, the `wall-clock` fail point armed as `return(ms)` makes
//! every read `ms` milliseconds later (earlier when negative) until it is disarmed: the
//! fault harness's clock jump on one node, without touching the host's clock. Disarming it
//! is the jump back.

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
}
