//! Tasks: the OS threads a workload runs on, started together behind a barrier.
//!
//! A phase starts N threads that wait at a barrier; its window runs from the first task's
//! start after the barrier to the last task's end (the closing barrier), read from the
//! tasks' own clocks. Thread start-up is outside the timed window, and no phase
//! overlaps the next, as with mdtest's `MPI_Barrier` between phases. Each task also
//! reports its own time, mdtest's "before barrier" time.
//!
//! Tasks share nothing but the target and a progress counter that they bump in batches, so
//! the harness adds no lock or allocation per operation.

use crate::stats::Latency;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// What one task did in one phase.
#[derive(Clone, Debug, Default)]
pub struct TaskOutcome {
    /// Operations attempted.
    pub ops: u64,
    /// Operations that failed.
    pub errors: u64,
    /// The first failure, as `path: error`.
    pub first_error: Option<String>,
    /// Time of each operation noted with [`TaskOutcome::note_since`].
    pub latency: Latency,
}

impl TaskOutcome {
    /// Counts one operation and its result.
    pub fn note<T, E: std::fmt::Display>(&mut self, what: &str, r: Result<T, E>) -> Option<T> {
        self.ops += 1;
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(format!("{what}: {e}"));
                }
                None
            }
        }
    }

    /// Counts one operation begun at `started` and its result, and records its time.
    pub fn note_since<T, E: std::fmt::Display>(
        &mut self,
        what: &str,
        started: Instant,
        r: Result<T, E>,
    ) -> Option<T> {
        self.latency.record(started.elapsed());
        self.note(what, r)
    }
}

/// One phase's result over all tasks.
#[derive(Clone, Debug)]
pub struct PhaseRun<T> {
    /// From the opening barrier to the last task's end.
    pub wall: Duration,
    /// Each task's result and its own time, by rank.
    pub tasks: Vec<(T, Duration)>,
}

/// Runs `f(rank)` on `n` threads that start together; returns when all have finished.
pub fn run_phase<T, F>(n: usize, f: F) -> PhaseRun<T>
where
    T: Send,
    F: Fn(usize) -> T + Sync,
{
    let n = n.max(1);
    let barrier = Barrier::new(n + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (barrier, f) = (&barrier, &f);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let r = f(rank);
                    (r, start, Instant::now())
                })
            })
            .collect();
        barrier.wait();
        let done: Vec<_> = handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect();
        // The window is measured by the tasks' own clocks: the coordinator may be
        // scheduled late after the barrier, when the tasks are already running.
        let first = done.iter().map(|(_, s, _)| *s).min();
        let last = done.iter().map(|(_, _, e)| *e).max();
        let wall = match (first, last) {
            (Some(f), Some(l)) => l.saturating_duration_since(f),
            _ => Duration::ZERO,
        };
        PhaseRun {
            wall,
            tasks: done.into_iter().map(|(r, s, e)| (r, e - s)).collect(),
        }
    })
}

/// A progress bar on stderr for `total` operations, hidden when `quiet` or when stderr
/// is not a terminal.
pub fn progress(label: &str, total: u64, quiet: bool) -> ProgressBar {
    let target = if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    if let Ok(style) =
        ProgressStyle::with_template("{msg:>20} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(label.to_string());
    bar
}

/// Progress ticks a task adds to the shared bar, batched so tasks seldom touch it.
pub struct Ticker<'a> {
    bar: &'a ProgressBar,
    pending: u64,
}

impl<'a> Ticker<'a> {
    /// Batches ticks for `bar`.
    pub fn new(bar: &'a ProgressBar) -> Ticker<'a> {
        Ticker { bar, pending: 0 }
    }

    /// One operation done.
    pub fn tick(&mut self) {
        self.pending += 1;
        if self.pending == 256 {
            self.bar.inc(self.pending);
            self.pending = 0;
        }
    }
}

impl Drop for Ticker<'_> {
    fn drop(&mut self) {
        self.bar.inc(self.pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_task_runs_once_and_the_phase_waits_for_all() {
        let ran = AtomicUsize::new(0);
        let run = run_phase(4, |rank| {
            std::thread::sleep(Duration::from_millis(5 * rank as u64));
            ran.fetch_add(1, Ordering::SeqCst);
            rank * 10
        });
        assert_eq!(ran.load(Ordering::SeqCst), 4);
        let ranks: Vec<usize> = run.tasks.iter().map(|(r, _)| *r).collect();
        assert_eq!(ranks, vec![0, 10, 20, 30]);
        let slowest = run.tasks.iter().map(|(_, d)| *d).max().unwrap_or_default();
        assert!(run.wall >= slowest);
    }

    #[test]
    fn outcome_counts_failures_and_keeps_the_first() {
        let mut o = TaskOutcome::default();
        assert_eq!(o.note("a", Ok::<u8, String>(1)), Some(1));
        assert_eq!(o.note("b", Err::<u8, _>("gone")), None);
        assert_eq!(o.note("c", Err::<u8, _>("also")), None);
        assert_eq!((o.ops, o.errors), (3, 2));
        assert_eq!(o.first_error.as_deref(), Some("b: gone"));
    }
}
