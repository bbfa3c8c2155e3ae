//! Driving a worker from an event loop, as UCP's `ucp_worker_get_efd` and
//! `ucp_worker_arm` do: the worker's file descriptor, arming it, and the tasks that await
//! its requests.
//!
//! The protocol, for any loop (tokio's is `crate::tokio`):
//!
//! 1. [`Worker::progress`] until it finds nothing to do;
//! 2. [`Worker::arm`]: `false` means there is work after all (go back to 1); `true` means
//!    the worker is armed, and its fd ([`Worker::as_fd`]) becomes readable when anything
//!    arrives (a completion, a frame, a connection event, a peer's doorbell, a
//!    [`Worker::signal`]);
//! 3. wait until the fd is readable or [`Worker::next_timeout`] passes, then go back to 1.
//!
//! No wake-up is lost between 2 and 3: `arm` takes what the fd reported before it looks
//! for work, and arms the transports before it looks again, so what arrives after its last
//! look makes the fd readable. The fd suits an edge-triggered loop (tokio's): each `arm`
//! drains what made it readable, so the loop clears its readiness after a wake-up and then
//! arms again, never sleeping on a readiness already taken.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::task::Waker;

use super::*;

/// How many progress calls a request's future makes, polled while it is the worker's only
/// waiter in busy-poll mode, before it registers its waker (see [`Driver::spins_in_poll`]).
/// 8 B one-way latency awaited as a future, `pingpong --async` (one task, current-thread
/// runtime), against `Request::wait`, same run: shared memory 1.03 µs without spinning,
/// 0.273 µs with 64 spins, 0.270 µs with 256, against 0.267 µs waiting; TCP 4.28, 3.24 and
/// 3.25 µs against 3.12 µs. Spinning while other tasks wait cost `examples/async_echo`
/// (1000 client tasks) half its calls per second over TCP, hence the lone-waiter rule.
pub(crate) const POLL_SPINS: u32 = 64;

impl Driver {
    /// Whether something progresses the worker without a caller's help: its progress
    /// thread, or a driver in an event loop ([`Worker::count_loop_driver`]).
    #[inline]
    pub(crate) fn is_driven(&self) -> bool {
        self.progress_thread.load(Ordering::Acquire)
            || self.loop_drivers.load(Ordering::Acquire) > 0
    }

    /// Whether a request's future spins on the worker ([`POLL_SPINS`] progress calls) before
    /// it waits for its waker: in [`WaitMode::BusyPoll`], while no other task or thread
    /// waits on the worker. A lone waiter (a latency-bound loop) then completes without a
    /// task switch and the waker's round through the executor; with others waiting, its
    /// spinning would only hold up their tasks on its thread, so it registers at once.
    #[inline]
    pub(crate) fn spins_in_poll(&self) -> bool {
        self.mode == WaitMode::BusyPoll && !self.sleepers.any()
    }

    /// Registers `waker` as the task awaiting the request in `slot`: the progress call
    /// that completes the request wakes it.
    pub(crate) fn register_task(&self, slot: &RequestKey, waker: &Waker) {
        self.sleepers
            .register_task(WaitFor::Request(slot.index), waker, || self.state.lock());
    }

    /// Forgets the task awaiting the request in `slot`, if one is registered.
    #[inline]
    pub(crate) fn forget_task(&self, slot: &RequestKey) {
        if self.sleepers.any() {
            self.sleepers
                .forget_task(WaitFor::Request(slot.index), None);
        }
    }

    /// Registers `waker` as a task awaiting news (an arrival, a send's work completing, a
    /// connection closing): the progress call that makes some wakes it.
    pub(crate) fn register_news_task(&self, waker: &Waker) {
        self.sleepers
            .register_task(WaitFor::News, waker, || self.state.lock());
    }

    /// Forgets the task `waker` awaiting news, if it is registered.
    pub(crate) fn forget_news_task(&self, waker: &Waker) {
        if self.sleepers.any() {
            self.sleepers.forget_task(WaitFor::News, Some(waker));
        }
    }

    /// Polls a task until `done()`, which news makes true (an endpoint flushed or closed):
    /// progresses the worker once, and while not `done`, registers the task for news
    /// (`registered` keeps its waker, to forget it by), checks again and stays pending —
    /// asking to be polled again at once when nothing else drives the worker.
    pub(crate) fn poll_news(
        &self,
        cx: &mut std::task::Context<'_>,
        registered: &mut Option<Waker>,
        done: impl Fn() -> bool,
    ) -> std::task::Poll<()> {
        use std::task::Poll;
        if !done() {
            self.progress();
            if !done() {
                if let Some(old) = registered.take_if(|w| !w.will_wake(cx.waker())) {
                    self.forget_news_task(&old);
                }
                // (Registered under the lock news is recorded under, then checked.)
                self.register_news_task(cx.waker());
                registered.get_or_insert_with(|| cx.waker().clone());
                if !done() {
                    if !self.is_driven() {
                        cx.waker().wake_by_ref();
                    }
                    return Poll::Pending;
                }
            }
        }
        if let Some(w) = registered.take() {
            self.forget_news_task(&w);
        }
        Poll::Ready(())
    }

    /// Whether the worker's shared-memory rings tell their producers that it never sleeps,
    /// sparing them a fence and a read per push: a worker that busy-polls with no driver in
    /// an event loop when its first shared-memory connection is made. (A driver counted
    /// later cannot sleep on those rings: see [`Driver::arm_for_loop`].)
    pub(crate) fn never_sleeps(&self) -> bool {
        self.mode == WaitMode::BusyPoll && self.loop_drivers.load(Ordering::Acquire) == 0
    }

    /// A loop's driver woke (its fd readable, or its timeout passed): the worker is awake
    /// again, its transports disarmed, so that its peers stop ringing its doorbell (a system
    /// call each) for what they send while it is awake. Without this a busy-polling driver
    /// that spun after waking kept its shared-memory rings armed until it slept again, and
    /// its sender rang for every message: 8 B message rate, `pingpong --bw --async`, 2.6-2.7
    /// M msg/s in about one run of two, 5.4-6.9 M in the others.
    pub(crate) fn woke_in_loop(&self) {
        self.disarm();
    }

    /// [`Worker::arm`].
    fn arm_for_loop(&self) -> Result<bool> {
        if !self.ifaces.shm.can_sleep() {
            // Its rings' producers were told it never sleeps: nothing would ring.
            self.progress();
            return Ok(false);
        }
        // Awake: what the fd reported is taken, the transports disarmed (a peer need not
        // ring for what it sends while the worker looks).
        let taken = self.take_ready(Some(Duration::ZERO))?;
        self.disarm();
        if self.progress() > 0 || taken > 0 {
            return Ok(false);
        }
        if self.next_timeout() == Some(Duration::ZERO) {
            return Ok(false);
        }
        self.arm()?;
        // (A completion may have landed before the arming.)
        if self.progress() > 0 {
            self.disarm();
            return Ok(false);
        }
        Ok(true)
    }
}

impl Worker {
    /// Arms the worker for an event loop (UCP's `ucp_worker_arm`): `Ok(true)` when it is
    /// armed — nothing to do now, and its fd ([`Worker::as_fd`]) becomes readable when
    /// anything arrives —, `Ok(false)` when there is work ("busy": progress and arm again).
    ///
    /// It takes what made the fd readable, so an edge-triggered loop clears the fd's
    /// readiness after each wake-up and arms again (see the module's protocol). Sleep no
    /// longer than [`Worker::next_timeout`].
    ///
    /// A worker in [`WaitMode::BusyPoll`] whose first shared-memory connection was made
    /// while no loop driver was counted ([`Worker::count_loop_driver`]) told those peers it
    /// never sleeps, so that they need not check after each push: it is never armed
    /// (always `false`). Count the driver before connecting.
    pub fn arm(&self) -> Result<bool> {
        self.driver.arm_for_loop()
    }

    /// How long an event loop may sleep on the armed worker before its timers (keepalive,
    /// deadlines, rendezvous timeouts) or its housekeeping need a [`Worker::progress`]
    /// call; `None`: until its fd is readable.
    pub fn next_timeout(&self) -> Option<Duration> {
        self.driver.next_timeout()
    }

    /// Counts a driver in an event loop for as long as the guard lives: the worker's
    /// request futures then wait for their wakers rather than asking to be polled again
    /// at once (see [`crate::Request`]'s `Future`). A loop built on [`Worker::arm`] holds
    /// one while it runs.
    pub fn count_loop_driver(&self) -> LoopDriver {
        self.driver.loop_drivers.fetch_add(1, Ordering::AcqRel);
        LoopDriver {
            driver: self.driver.clone(),
        }
    }
}

/// A driver of a worker in an event loop, counted while it lives (see
/// [`Worker::count_loop_driver`]).
#[must_use = "the driver is counted only while this guard lives"]
pub struct LoopDriver {
    driver: Arc<Driver>,
}

impl Drop for LoopDriver {
    fn drop(&mut self) {
        self.driver.loop_drivers.fetch_sub(1, Ordering::AcqRel);
        // Tasks that wait now have no driver: they poll again, driving it themselves.
        self.driver.sleepers.wake_all();
    }
}

impl std::fmt::Debug for LoopDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopDriver").finish_non_exhaustive()
    }
}

/// The worker's file descriptor (UCP's `ucp_worker_get_efd`): an epoll set, readable while
/// the worker, once [armed](Worker::arm), has something to progress. Watch it for input
/// only; never read it or close it.
impl AsFd for Worker {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.driver.registry.fd()
    }
}

impl AsRawFd for Worker {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}
