//! Summary statistics of repeated measurements and latency distributions.
//!
//! `Spread` is what mdtest's SUMMARY table prints for each phase over the iterations:
//! max, min, mean and the sample standard deviation (0 for a single iteration, as mdtest
//! prints it). `Latency` condenses an HDR histogram of per-operation times into the
//! percentiles the reports name; it records microseconds with three significant digits,
//! so a reported percentile is within 0.1 % of the true one.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::time::Duration;

/// Max, min, mean and sample standard deviation of a series.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    /// Largest value.
    pub max: f64,
    /// Smallest value.
    pub min: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (divides by n - 1); 0 for fewer than two values.
    pub stddev: f64,
}

impl Spread {
    /// The spread of `values`; all zeros for an empty series.
    pub fn of(values: &[f64]) -> Spread {
        if values.is_empty() {
            return Spread::default();
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let max = values.iter().copied().fold(f64::MIN, f64::max);
        let min = values.iter().copied().fold(f64::MAX, f64::min);
        let stddev = if values.len() < 2 {
            0.0
        } else {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        };
        Spread {
            max,
            min,
            mean,
            stddev,
        }
    }
}

/// Per-operation latencies, recorded in microseconds.
#[derive(Clone, Debug)]
pub struct Latency {
    hist: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

impl Latency {
    /// An empty recorder (1 µs to 1 h, three significant digits).
    pub fn new() -> Latency {
        // The bounds are constants that `new_with_bounds` accepts; a failure here is a bug.
        let hist = Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
        Latency { hist }
    }

    /// Records one operation that took `d` (clamped to the recorder's range).
    pub fn record(&mut self, d: Duration) {
        let us = (d.as_micros() as u64).clamp(1, 3_600_000_000);
        self.hist.saturating_record(us);
    }

    /// Adds every value recorded in `other`.
    pub fn merge(&mut self, other: &Latency) {
        // Both histograms have the same bounds, so adding cannot fail on range.
        let _ = self.hist.add(&other.hist);
    }

    /// Number of recorded operations.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The percentiles the reports print.
    pub fn summary(&self) -> LatencySummary {
        let q = |p: f64| self.hist.value_at_quantile(p) as f64 / 1000.0;
        LatencySummary {
            count: self.hist.len(),
            p50_ms: q(0.50),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            max_ms: self.hist.max() as f64 / 1000.0,
        }
    }
}

/// Latency percentiles in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Operations recorded.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Slowest operation.
    pub max_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_matches_hand_computation() {
        let s = Spread::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(s.max, 9.0);
        assert_eq!(s.min, 2.0);
        assert_eq!(s.mean, 5.0);
        // Sample variance: 32 / 7.
        assert!((s.stddev - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!(Spread::of(&[3.0]).stddev, 0.0);
        assert_eq!(Spread::of(&[]), Spread::default());
    }

    #[test]
    fn latency_percentiles_are_ordered() {
        let mut l = Latency::new();
        for us in 1..=1000u64 {
            l.record(Duration::from_micros(us));
        }
        let s = l.summary();
        assert_eq!(s.count, 1000);
        assert!((s.p50_ms - 0.5).abs() < 0.01, "{s:?}");
        assert!(s.p50_ms <= s.p99_ms && s.p99_ms <= s.p999_ms && s.p999_ms <= s.max_ms);
    }
}
