//! The lock of the state every message goes through (a worker's protocol state, its progress
//! scratch, a shared-memory send ring): a spin lock whose unlock is a plain store.
//!
//! Why not `parking_lot::Mutex`, as elsewhere: its unlock is a `lock cmpxchg` (it must see
//! whether a thread parked), and a locked instruction waits for every store before it to
//! complete. On the paths a message takes these locks are taken two to four times per
//! message, each held for a few hundred instructions and never across a system call that
//! blocks. With this lock a shared-memory round trip makes 20 locked instructions, not 32,
//! and the 8 B message rate at window 64 rose from 10.1-10.5 to 11.9 M msg/s (alternating
//! runs; `ucx_perftest`, whose worker takes no lock in its default thread mode, 15.6-17.2 M
//! in the same runs). The lock is `spin`'s (acquire on lock, release on unlock:
//! the same ordering a mutex gives); a thread that finds it taken yields its time slice
//! between looks, so a holder that was preempted gets to run.
//!
//! Nothing that may block (a wait, a sleep, a blocking system call) is done while one is
//! held: a waiter would spin (yielding) for as long. The state and a ring are held for a
//! frame's or a send's work; the progress scratch for a whole progress call, which may
//! include a shared-memory READ's copy (a rendezvous message's data, by CMA, after the state
//! is released), but a thread that finds it taken does not wait for it (it tries it, and
//! another thread is making the progress), except event mode's arming before a sleep, which
//! yields until the copy is done.

/// A short-held lock on a hot path (see the module's documentation).
pub(crate) type HotLock<T> = spin::mutex::SpinMutex<T, spin::relax::Yield>;
