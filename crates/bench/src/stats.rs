//! Summary statistics over timing samples.

/// Percentiles, mean and minimum of a set of samples (same unit as the samples).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Smallest sample.
    pub min: f64,
}

/// Summarises `samples` (sorted in place). `None` if there are none.
pub fn summarize(samples: &mut [f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(f64::total_cmp);
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    Some(Summary {
        p50: percentile(samples, 50.0),
        p99: percentile(samples, 99.0),
        mean,
        min: samples[0],
    })
}

/// Nearest-rank percentile `p` (0..=100) of sorted, non-empty `sorted`.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = summarize(&mut v).unwrap();
        assert_eq!(s.p50, 50.0);
        assert_eq!(s.p99, 99.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.mean, 50.5);
        let mut one = [7.0];
        let s = summarize(&mut one).unwrap();
        assert_eq!((s.p50, s.p99, s.mean, s.min), (7.0, 7.0, 7.0, 7.0));
        assert!(summarize(&mut []).is_none());
    }
}
