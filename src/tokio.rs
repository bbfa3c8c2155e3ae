//! A worker driven by a tokio runtime: [`drive`] spawns the task that progresses it, so
//! that its requests, awaited as futures, complete without blocking a thread.
//!
//! ```no_run
//! # async fn service() -> rdmx::Result<()> {
//! let ctx = rdmx::Context::new()?;
//! let worker = ctx.worker()?;
//! let _driver = rdmx::tokio::drive(&worker)?;
//! let ep = worker.connect_nb("192.0.2.1:7000").await?;
//! ep.tag_send(7, b"hello".to_vec()).await?;
//! let reply = worker.tag_recv(8, rdmx::TAG_MASK_ALL, vec![0; 64]).await?;
//! println!("{} bytes with tag {}", reply.length, reply.tag);
//! # Ok(())
//! # }
//! ```
//!
//! The driver follows the worker's wait mode. In [`WaitMode::Event`] it arms the worker
//! and sleeps on its file descriptor (registered with tokio's reactor) whenever a
//! progress call finds nothing, so an idle worker costs no CPU. In [`WaitMode::BusyPoll`]
//! it first spins: [`SPIN_POLLS`] progress calls that find nothing in a row, yielding to
//! the runtime between them, before it arms and sleeps (the lowest latency, a runtime
//! thread kept busy while messages flow). A busy-polling worker's shared-memory peers are
//! told once, at its first shared-memory connection, whether it may sleep: drive it from
//! before then, or its driver can never sleep on those connections and keeps spinning.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::Interest;
use ::tokio::runtime::Handle;
use ::tokio::task::JoinHandle;

use crate::config::WaitMode;
use crate::ep::Ep;
use crate::error::{Error, Result};
use crate::listener::Listener;
use crate::worker::{LoopDriver, Worker};

/// How many progress calls in a row that find nothing the driver of a busy-polling worker
/// makes (yielding between them) before it arms the worker and sleeps.
pub const SPIN_POLLS: u32 = 256;

/// The longest the driver sleeps without looking at the worker, however far its next timer
/// is (a bound on what a missed timer could cost, not a tick: nothing needs it).
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// Spawns, on the current tokio runtime, the task that progresses `worker` (see the
/// module's documentation); it runs until the returned [`Driver`] is dropped. One is
/// enough per worker; more do no harm. An error if called outside a runtime, or if the
/// runtime's reactor cannot watch the worker's fd.
pub fn drive(worker: &Worker) -> Result<Driver> {
    let handle = Handle::try_current()
        .map_err(|e| Error::Invalid(format!("rdmx::tokio::drive needs a tokio runtime: {e}")))?;
    let counted = worker.count_loop_driver();
    let fd = {
        // (Registered with the reactor in the runtime's context.)
        let _in = handle.enter();
        watch(
            worker.as_fd(),
            [
                "duplicating the worker's fd",
                "registering the worker's fd with tokio",
            ],
        )?
    };
    let task = handle.spawn(run(fd, worker.clone()));
    Ok(Driver {
        task,
        _counted: counted,
    })
}

/// The task progressing a worker in a tokio runtime ([`drive`]); dropping it stops the
/// task.
#[must_use = "the worker is driven only while the driver lives"]
pub struct Driver {
    task: JoinHandle<()>,
    _counted: LoopDriver,
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("finished", &self.task.is_finished())
            .finish()
    }
}

/// Registers a duplicate of `fd` with the current runtime's reactor for input (errors named
/// by the `calls` that fail: duplicating it, registering it). A duplicate, so that several registrations of one fd (drivers of one worker,
/// tasks accepting on one listener) each have theirs: epoll refuses the same fd twice.
/// (tokio 1.54 deprecates the safe constructor for `AsyncFd::register_with_interest`, an
/// `unsafe fn` whose contract is that the fd stays open and the same while it is
/// registered: the `AsyncFd` owns its duplicate, so that holds by construction, the safe
/// call is sound, and `unsafe` stays out of this crate.)
fn watch(fd: BorrowedFd<'_>, calls: [&'static str; 2]) -> Result<AsyncFd<OwnedFd>> {
    let [duplicating, registering] = calls;
    let dup = fd
        .try_clone_to_owned()
        .map_err(|e| Error::os(duplicating, e))?;
    #[allow(deprecated)]
    AsyncFd::with_interest(dup, Interest::READABLE).map_err(|e| Error::os(registering, e))
}

/// Accepts a connection on `listener` without blocking the task: [`Listener::accept`] for
/// a tokio task. It answers the requests as they come (their setup waiting on the peer
/// proceeds meanwhile) and returns the first endpoint set up; between rounds it waits on
/// the listener's fd, registered with tokio's reactor, and for the deadlines of the accepts
/// under way ([`Listener::next_timeout`]). Dropping the future leaves the listener as it
/// was: requests it answered whose setup goes on are returned by a later accept. An error
/// if called outside a runtime, or the listener's own (see [`Listener::accept`]).
pub async fn accept(listener: &Listener) -> Result<Ep> {
    let fd = watch(
        listener.as_fd(),
        [
            "duplicating the listener's fd",
            "registering the listener's fd with tokio",
        ],
    )?;
    loop {
        if let Some(ep) = listener.try_accept()? {
            return Ok(ep);
        }
        let readable = fd.readable();
        let ready = match listener.next_timeout() {
            Some(t) => match ::tokio::time::timeout(t, readable).await {
                Ok(r) => r,
                Err(_) => continue,
            },
            None => readable.await,
        };
        // (Cleared before the next look: what arrives after it makes the fd readable
        // again, and what arrived before it is seen by that look.)
        ready
            .map_err(|e| Error::os("waiting on the listener's fd", e))?
            .clear_ready();
    }
}

async fn run(fd: AsyncFd<OwnedFd>, worker: Worker) {
    let spins = match worker.wait_mode() {
        WaitMode::BusyPoll => SPIN_POLLS,
        WaitMode::Event => 0,
    };
    let mut idle = 0;
    loop {
        if worker.progress() > 0 {
            idle = 0;
            ::tokio::task::yield_now().await;
            continue;
        }
        if idle < spins {
            idle += 1;
            ::tokio::task::yield_now().await;
            continue;
        }
        match worker.arm() {
            Ok(true) => {}
            Ok(false) => {
                ::tokio::task::yield_now().await;
                continue;
            }
            Err(e) => {
                log::error!("arming the worker: {e}");
                ::tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        }
        let sleep = worker
            .next_timeout()
            .map_or(MAX_SLEEP, |t| t.min(MAX_SLEEP));
        let woke = ::tokio::time::timeout(sleep, fd.readable()).await;
        worker.driver.woke_in_loop();
        if let Ok(ready) = woke {
            match ready {
                // What made it readable is taken by the next `arm`, after a progress call:
                // tokio's readiness is cleared now, so the next wait is for news.
                Ok(mut guard) => guard.clear_ready(),
                Err(e) => {
                    log::error!("waiting on the worker's fd: {e}");
                    ::tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        idle = 0;
    }
}
