//! The clock a benchmark reads once per message or round trip: the TSC where the kernel
//! itself keeps time by it, the OS's monotonic clock otherwise.
//!
//! Why not [`std::time::Instant`]: the references read the TSC (`ucx_perftest` through
//! `ucs_get_time`, perftest's `get_cycles`), and `clock_gettime` costs more: on the
//! development host 23 ns a read through the vDSO against 9.5 ns for the TSC, which at 8 M
//! messages a second is a tenth of a message's time spent on the benchmark's own clock. Where
//! the clocksource is not the TSC (a VM whose kernel found the TSC unstable and keeps time
//! by hpet, as the Soft-RoCE guests do) a read is a system call, and the TSC is not trusted
//! here either.
//!
//! The TSC is read and scaled by `quanta` (calibrated against the monotonic clock); `quanta`
//! decides from CPUID alone whether the TSC is usable, so [`Clock::new`] asks the kernel
//! first. (Written here rather than taken whole from `quanta` for that question, and for a
//! fallback that is the same clock `Instant` reads.)

use std::time::{Duration, Instant};

/// Where the kernel names its current clocksource.
const CLOCKSOURCE: &str = "/sys/devices/system/clocksource/clocksource0/current_clocksource";

/// A benchmark's clock: [`Clock::now`] per message, [`Clock::between`] two readings.
#[derive(Clone)]
pub struct Clock {
    tsc: Option<quanta::Clock>,
    origin: Instant,
}

/// One reading of a [`Clock`] (meaningful only to the clock that made it).
#[derive(Clone, Copy, Debug)]
pub struct Stamp(u64);

impl Clock {
    /// The TSC when the kernel keeps time by it (`current_clocksource` is `tsc`), the OS's
    /// monotonic clock otherwise.
    pub fn new() -> Clock {
        let kernel_uses_tsc = std::fs::read_to_string(CLOCKSOURCE)
            .map(|s| s.trim() == "tsc")
            .unwrap_or(false);
        Clock::with_tsc(kernel_uses_tsc)
    }

    /// The TSC (where `quanta` finds it usable) if `tsc`, else the OS's monotonic clock.
    pub fn with_tsc(tsc: bool) -> Clock {
        Clock {
            tsc: tsc.then(quanta::Clock::new),
            origin: Instant::now(),
        }
    }

    /// What it reads: `tsc` (through `quanta`, which itself reads the OS clock where CPUID
    /// says the TSC is not invariant) or `os`.
    pub fn source(&self) -> &'static str {
        if self.tsc.is_some() {
            "tsc"
        } else {
            "os"
        }
    }

    /// The time now.
    #[inline]
    pub fn now(&self) -> Stamp {
        match &self.tsc {
            Some(c) => Stamp(c.raw()),
            None => Stamp(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)),
        }
    }

    /// The time from `earlier` to `later` (zero if `later` is not after it).
    #[inline]
    pub fn between(&self, earlier: Stamp, later: Stamp) -> Duration {
        match &self.tsc {
            Some(c) => c.delta(earlier.0, later.0),
            None => Duration::from_nanos(later.0.saturating_sub(earlier.0)),
        }
    }

    /// The time since `earlier`.
    #[inline]
    pub fn since(&self, earlier: Stamp) -> Duration {
        self.between(earlier, self.now())
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both sources measure a sleep as at least its length, and not wildly more.
    #[test]
    fn both_sources_measure_a_sleep() {
        for tsc in [false, true] {
            let c = Clock::with_tsc(tsc);
            let t0 = c.now();
            std::thread::sleep(Duration::from_millis(20));
            let d = c.since(t0);
            assert!(d >= Duration::from_millis(19), "{}: {d:?}", c.source());
            assert!(d < Duration::from_secs(5), "{}: {d:?}", c.source());
        }
    }

    /// Readings in the wrong order give zero, not a wrapped-round age.
    #[test]
    fn readings_in_the_wrong_order_give_zero() {
        for tsc in [false, true] {
            let c = Clock::with_tsc(tsc);
            let a = c.now();
            std::thread::sleep(Duration::from_millis(2));
            let b = c.now();
            assert_eq!(c.between(b, a), Duration::ZERO, "{}", c.source());
            assert!(
                c.between(a, b) >= Duration::from_millis(1),
                "{}",
                c.source()
            );
        }
    }
}
