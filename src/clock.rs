//! The worker's clock for its own timers (the engine's drain timeout, reaping, parked
//! frames, housekeeping intervals): `CLOCK_MONOTONIC_COARSE`, which the vDSO serves without
//! a system call even on machines whose clocksource makes the precise clock one (a VM on
//! hpet, where `clock_gettime(CLOCK_MONOTONIC)` traps into the kernel), at the resolution of
//! a scheduler tick (1–10 ms). Every timer it drives is milliseconds or longer, so the
//! progress loop reads it on every call at no cost. (rustix, not std: `Instant` is the
//! precise clock.)

use rustix::time::{clock_gettime, ClockId};

/// Nanoseconds on the coarse monotonic clock.
pub(crate) fn coarse_now_ns() -> u64 {
    let ts = clock_gettime(ClockId::MonotonicCoarse);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}
