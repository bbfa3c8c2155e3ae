//! Nonblocking requests: a tag send or receive, or a one-sided operation, in flight,
//! completed by progress.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rdmx_proto::{ConnId, RequestKind, Status, Tag};

use crate::error::{Error, Result};
use crate::worker::{RequestKey, WaitFor, Worker};

/// What a request ended with.
pub(crate) struct Outcome {
    pub(crate) status: Status,
    /// A send's or a receive's.
    pub(crate) kind: RequestKind,
    pub(crate) length: u64,
    pub(crate) tag: Tag,
    pub(crate) buf: Vec<u8>,
    /// The endpoint the message came from or went to, when known.
    pub(crate) conn: Option<ConnId>,
}

impl Outcome {
    /// The outcome of a send of `len` bytes on `cs` that went out as it was made.
    #[inline(always)]
    pub(crate) fn sent(cs: &crate::transport::Conn, tag: Tag, len: usize, buf: Vec<u8>) -> Outcome {
        Outcome {
            status: Status::Ok,
            kind: RequestKind::Send,
            length: len as u64,
            tag,
            buf,
            conn: Some(cs.id),
        }
    }

    /// The outcome the engine's completion `c` reports, with the request's buffer.
    #[inline]
    pub(crate) fn of(c: &rdmx_proto::Completion, buf: Vec<u8>) -> Outcome {
        Outcome {
            status: c.status,
            kind: c.kind,
            length: c.length,
            tag: c.tag,
            buf,
            conn: c.conn,
        }
    }
}

/// What a request's handle says of it when it reports errors: a send or a receive, and the
/// tag it was made with.
#[derive(Clone, Copy)]
pub(crate) struct Describe {
    pub(crate) kind: RequestKind,
    pub(crate) tag: Tag,
}

impl Describe {
    /// What a request done at once was, from its outcome.
    fn of(outcome: &Outcome) -> Describe {
        Describe {
            kind: outcome.kind,
            tag: outcome.tag,
        }
    }

    /// Says what the request was, naming the endpoint it went to or came from when known
    /// (as [`crate::Ep::id`] names it).
    fn describe(&self, conn: Option<ConnId>) -> String {
        let call = match self.kind {
            RequestKind::Send => "tag_send",
            RequestKind::Recv => "tag_recv",
            RequestKind::Put => "put",
            RequestKind::Get => "get",
            RequestKind::Atomic => "atomic",
            RequestKind::Flush => "flush",
        };
        // (A one-sided operation's "tag" is its remote offset.)
        let what = match self.kind {
            RequestKind::Send | RequestKind::Recv => format!("{call} (tag {:#x})", self.tag),
            RequestKind::Flush => call.to_string(),
            _ => format!("{call} (remote offset {:#x})", self.tag),
        };
        match conn {
            Some(c) => format!("{what} on endpoint {}", c.0),
            None => what,
        }
    }
}

/// A finished request: the buffer handed back, with the message's tag and length.
#[derive(Debug)]
pub struct Done {
    /// The buffer that was moved into the request. For a receive, its first `length` bytes
    /// are the message; the rest of it is untouched. Its length is never changed.
    pub buf: Vec<u8>,
    /// The message's tag (for a receive: the sender's tag, which may differ from the
    /// requested one where the mask has zeros); 0 for a one-sided operation.
    pub tag: Tag,
    /// The message's length in bytes (a put's or get's bytes; 8 for an atomic operation).
    pub length: usize,
    /// An atomic operation's result: the remote word's old value. 0 for other requests.
    pub value: u64,
    /// The endpoint the message came from (a receive) or went to (a send), as
    /// [`crate::Ep::id`] names it: map it to the endpoint the receive was from.
    pub conn: Option<ConnId>,
}

/// A tag send or receive in flight, made by [`crate::Ep::tag_send`] or
/// [`crate::Worker::tag_recv`].
///
/// The request owns the buffer it was given until it completes; [`Request::wait`] hands it
/// back. Requests complete through the worker's progress: [`Request::wait`] and
/// [`Request::test`] drive it themselves (unless the worker has a progress thread). An eager
/// send that goes out as it is made (credit to spare, nothing queued ahead) is complete at
/// once, like a UCP send that returns no request: its handle holds the outcome, and waiting
/// for it takes no lock.
///
/// Dropping an unfinished request does not give the buffer back: a receive is cancelled,
/// a send goes on (fire and forget); either way the worker drops the buffer once the NIC
/// and the peer are done with it. `mem::forget` on a request leaks the buffer; it never
/// lets the NIC touch freed memory, since the worker owns the buffer throughout.
#[must_use = "a request does nothing visible unless waited for; dropping it cancels a receive"]
pub struct Request {
    state: State,
}

/// Where a request's outcome is.
enum State {
    /// In the worker's request table.
    Pending(Pending),
    /// Completed as it was made (a send whose frame was queued at once, or one refused at
    /// once): the outcome travels in the handle, and no table slot, lock or reference to the
    /// worker is needed to wait for it.
    Done(Outcome),
}

/// A request in the worker's request table, under `slot`. Dropping it gives the slot up
/// (cancelling a receive still pending); [`Request::wait`] takes the worker out first
/// (`None` then), and the drop does nothing. (So the handle itself needs no `Drop`, and
/// `wait` takes its parts apart without copying them: only this part knows it is let go.)
struct Pending {
    slot: RequestKey,
    worker: Option<Worker>,
    /// What it is (a receive is cancelled when its handle is dropped before it completes).
    what: Describe,
}

impl Pending {
    /// [`Request::cancel`] of a request in the table.
    fn cancel(&self) -> bool {
        self.worker.as_ref().is_some_and(|w| {
            !self.slot.is_done(&w.driver.done_flags) && w.driver.cancel(&self.slot)
        })
    }

    /// Whether it completed (no lock taken).
    #[inline]
    fn is_done(&self) -> bool {
        self.worker
            .as_ref()
            .map_or(true, |w| self.slot.is_done(&w.driver.done_flags))
    }
}

impl Drop for Pending {
    // (Once per request: inlined, see `worker::requests`.)
    #[inline(always)]
    fn drop(&mut self) {
        let Some(worker) = &self.worker else {
            return;
        };
        if self.what.kind == RequestKind::Recv {
            self.cancel();
        }
        // (A future dropped while its task waited for it.)
        worker.driver.forget_task(&self.slot);
        worker.driver.abandon(&self.slot);
    }
}

impl Request {
    pub(crate) fn new(worker: &Worker, slot: RequestKey, what: Describe) -> Request {
        Request {
            state: State::Pending(Pending {
                slot,
                worker: Some(worker.clone()),
                what,
            }),
        }
    }

    /// A request that completed as it was made.
    pub(crate) fn done(outcome: Outcome) -> Request {
        Request {
            state: State::Done(outcome),
        }
    }

    /// Whether the request has completed, without progressing the worker.
    pub fn is_done(&self) -> bool {
        match &self.state {
            State::Pending(p) => p.is_done(),
            State::Done(_) => true,
        }
    }

    /// Progresses the worker once, then says whether the request has completed.
    pub fn test(&self) -> bool {
        match &self.state {
            State::Pending(p) => {
                if let (false, Some(worker)) = (p.is_done(), &p.worker) {
                    worker.progress();
                }
                p.is_done()
            }
            State::Done(_) => true,
        }
    }

    /// Waits up to `timeout` for completion (progressing the worker in its wait mode);
    /// true when complete. After `true`, [`Request::wait`] returns at once.
    pub fn wait_for(&self, timeout: Duration) -> bool {
        match &self.state {
            State::Pending(Pending {
                slot,
                worker: Some(worker),
                ..
            }) => worker.driver.wait_until(
                WaitFor::Request(slot.index),
                || slot.is_done(&worker.driver.done_flags),
                Some(Instant::now() + timeout),
            ),
            _ => true,
        }
    }

    /// Waits for completion and returns the buffer with the message's tag and length.
    ///
    /// A request that ended badly is an [`Error::Request`] with its [`Status`]
    /// and the buffer (see [`Error::take_buffer`]).
    // (Inlined into the caller, with `Driver::take_outcome`, for the reason and with the
    // figures given at `Worker::tag_recv` and `Driver::take_outcome`.)
    #[inline(always)]
    pub fn wait(self) -> Result<Done> {
        let (outcome, what) = match self.state {
            State::Pending(mut p) => {
                let Some(worker) = p.worker.take() else {
                    return Err(Error::Invalid(
                        "the request's result was already taken".into(),
                    ));
                };
                let outcome = worker.driver.wait_take(&p.slot).ok_or_else(|| {
                    Error::Invalid("the request's result was already taken".into())
                })?;
                let what = p.what;
                // (Its worker taken, the handle owns nothing more: its drop would only find
                // that out, in a call of its own per request.)
                std::mem::forget(p);
                (outcome, what)
            }
            State::Done(outcome) => {
                let what = Describe::of(&outcome);
                (outcome, what)
            }
        };
        match outcome.status {
            Status::Ok => {
                // (The engine reports an atomic operation's old value as its tag.)
                let (tag, value) = if outcome.kind == RequestKind::Atomic {
                    (0, outcome.tag)
                } else {
                    (outcome.tag, 0)
                };
                Ok(Done {
                    buf: outcome.buf,
                    tag,
                    length: outcome.length as usize,
                    value,
                    conn: outcome.conn,
                })
            }
            status => Err(Error::Request {
                status,
                what: what.describe(outcome.conn),
                buffer: outcome.buf,
                length: outcome.length as usize,
                tag: outcome.tag,
            }),
        }
    }

    /// Asks for the request to be cancelled; returns whether the cancellation took. A
    /// cancelled request completes with [`Status::Cancelled`] and hands its buffer back.
    ///
    /// The rule is MPI's: **a cancelled send is never received**, and a cancelled receive
    /// never matches.
    /// - A receive can be cancelled while it is unmatched; once a message matched it (a
    ///   rendezvous receive being filled), `cancel` returns false and it completes normally.
    /// - A send can be cancelled while nothing of it has left: waiting for credits, or (a
    ///   rendezvous send) before its announcement went out. Once its eager data or its RTS
    ///   was sent, the peer may match it at any moment, so `cancel` returns false and the
    ///   send completes as it would have (when the peer receives it, or fails if the
    ///   connection dies). An eager send that went out at once is complete already.
    pub fn cancel(&self) -> bool {
        match &self.state {
            State::Pending(p) => p.cancel(),
            State::Done(_) => false,
        }
    }
}

/// The error of a request whose result was taken already.
#[cold]
fn taken() -> Error {
    Error::Invalid("the request's result was already taken".into())
}

/// A request is a future of its result: what [`Request::wait`] returns.
///
/// Polling it progresses the worker once (never blocking; in busy-poll mode, while no other
/// task or thread waits on the worker, up to 64 times, so that a latency-bound loop completes
/// without a task switch), and if the request is still under way registers the task's
/// waker, which the progress call that completes the request wakes — that task's and no
/// other. What progresses the worker meanwhile is the
/// worker's driver in the event loop (`rdmx::tokio::drive`, or any loop built on
/// [`crate::Worker::arm`] and the worker's file descriptor) or its progress thread; with
/// neither, the future asks to be polled again at once, so it completes, spinning through
/// the executor.
///
/// Dropping the future before it completes is dropping the request: a receive is cancelled
/// (nothing is consumed: a message it would have matched goes to the next receive that
/// matches it), and a send or a one-sided operation that can no longer be withdrawn goes on
/// detached, its buffer kept by the worker until the NIC and the peer are done with it.
impl Future for Request {
    type Output = Result<Done>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Done>> {
        let this = self.get_mut();
        if let State::Pending(p) = &this.state {
            let Some(worker) = &p.worker else {
                return Poll::Ready(Err(taken()));
            };
            let driver = &worker.driver;
            if !p.slot.is_done(&driver.done_flags) {
                driver.progress();
                if !p.slot.is_done(&driver.done_flags) && driver.spins_in_poll() {
                    // Busy-polling: the task looks a while itself before it waits for a
                    // wake-up (a task switch and the waker's round through the executor).
                    let mut left = crate::worker::POLL_SPINS;
                    while left > 0 && !p.slot.is_done(&driver.done_flags) {
                        if driver.progress() == 0 {
                            std::hint::spin_loop();
                        }
                        left -= 1;
                    }
                }
                if !p.slot.is_done(&driver.done_flags) {
                    // Registered under the lock its completion is recorded under, then
                    // checked: a completion either is seen here or wakes the task.
                    driver.register_task(&p.slot, cx.waker());
                    if !p.slot.is_done(&driver.done_flags) {
                        if !driver.is_driven() {
                            cx.waker().wake_by_ref();
                        }
                        return Poll::Pending;
                    }
                }
            }
            driver.forget_task(&p.slot);
        }
        // (What is left names no request: its worker gone from it, waiting for it again is
        // an error and dropping it does nothing.)
        let taken = State::Pending(Pending {
            slot: RequestKey::NONE,
            worker: None,
            what: Describe {
                kind: RequestKind::Send,
                tag: 0,
            },
        });
        let state = std::mem::replace(&mut this.state, taken);
        Poll::Ready(Request { state }.wait())
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.state {
            State::Pending(p) => p.what.describe(None),
            State::Done(o) => Describe::of(o).describe(o.conn),
        };
        f.debug_struct("Request")
            .field("what", &what)
            .field("done", &self.is_done())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request handle is moved by value (into and out of a user's queue of requests, out
    /// of `tag_recv`): it stays within a cache line.
    #[test]
    fn a_request_handle_fits_a_cache_line() {
        assert!(std::mem::size_of::<Request>() <= 64);
    }

    #[test]
    fn a_failed_request_names_its_endpoint() {
        let what = Describe {
            kind: RequestKind::Send,
            tag: 0x2a,
        };
        assert_eq!(
            what.describe(Some(ConnId(7))),
            "tag_send (tag 0x2a) on endpoint 7"
        );
        assert_eq!(what.describe(None), "tag_send (tag 0x2a)");
    }
}
