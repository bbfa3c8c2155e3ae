//! `rdmx-bench line-rtt`: the round trip of one cache line between two threads, the
//! host's core-to-core latency. Every shared-memory figure moves with it: a message costs
//! at least one line's transfer, and a sender's ring stores wait for one. This development
//! host, a VM, moves between about 100 ns and 500 ns (its "fast" and "slow" modes; both
//! rdmx and `ucx_perftest` run about twice as fast in the first), so a benchmark reports it
//! beside its ratios.
//!
//! Two threads bounce a counter through two lines: one stores `i` in the first and waits
//! for `i` in the second, the other the reverse. They spin without a pause instruction
//! (what a line's transfer costs, not a pause's), each pinned to one of the first two CPUs
//! the process may run on (unpinned where it may run on one only), and a tenth of the trips
//! go first, untimed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

use crate::clock::Clock;

/// A counter alone in its cache line.
#[repr(align(64))]
struct Line(AtomicU64);

/// What [`measure`] found.
#[derive(Debug, Clone, Copy)]
pub struct LineRtt {
    /// The mean round trip.
    pub per_trip: Duration,
    /// Round trips the answering thread saw through (all of them).
    pub answered: u64,
}

/// The first two CPUs the calling thread may run on, if it may run on two.
fn two_cpus() -> Option<(usize, usize)> {
    let allowed = sched_getaffinity(None).ok()?;
    let mut cpus = (0..CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c));
    Some((cpus.next()?, cpus.next()?))
}

/// Pins the calling thread to `cpu` (best effort: the figure is still a figure unpinned).
fn pin(cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu);
    if let Err(e) = sched_setaffinity(None, &set) {
        log::warn!("cannot pin a thread to CPU {cpu}: {e}");
    }
}

/// Bounces a line `trips` times between this thread and another (after `trips / 10`
/// untimed).
pub fn measure(trips: u64) -> LineRtt {
    let (ping, pong) = (Line(AtomicU64::new(0)), Line(AtomicU64::new(0)));
    let clock = Clock::new();
    let cpus = two_cpus();
    let warm = trips / 10;
    let total = warm + trips;
    std::thread::scope(|s| {
        let peer = s.spawn(|| {
            if let Some((_, cpu)) = cpus {
                pin(cpu);
            }
            let mut answered = 0;
            for i in 1..=total {
                while ping.0.load(Ordering::Acquire) != i {}
                pong.0.store(i, Ordering::Release);
                answered += 1;
            }
            answered
        });
        if let Some((cpu, _)) = cpus {
            pin(cpu);
        }
        let mut t0 = clock.now();
        for i in 1..=total {
            if i == warm + 1 {
                t0 = clock.now();
            }
            ping.0.store(i, Ordering::Release);
            while pong.0.load(Ordering::Acquire) != i {}
        }
        let elapsed = clock.since(t0);
        LineRtt {
            per_trip: Duration::from_secs_f64(elapsed.as_secs_f64() / trips.max(1) as f64),
            answered: peer.join().map_or(0, |n| n - warm),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_trip_is_answered_and_timed() {
        let r = measure(10_000);
        assert_eq!(r.answered, 10_000);
        assert!(r.per_trip > Duration::ZERO);
    }
}
