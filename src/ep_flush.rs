//! Flushing and closing an endpoint without blocking: [`Ep::flush_nb`] and
//! [`Ep::close_nb`], futures that a task awaits while the worker's driver (its event
//! loop's, or its progress thread) progresses it.
//!
//! Both wait for news (a send's work completing, a connection closing), the events that
//! end the blocking [`Ep::flush`]: the task registers for news under the lock such news is
//! recorded under, then checks again, so a completion between its check and its
//! registration still wakes it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::ep::Ep;
use crate::error::{Error, Result};

/// A task waiting on an endpoint for news, with the waker it registered (forgotten when
/// this is dropped).
struct NewsWait {
    ep: Ep,
    registered: Option<Waker>,
}

impl NewsWait {
    fn new(ep: Ep) -> Self {
        NewsWait {
            ep,
            registered: None,
        }
    }

    /// Ready once the endpoint's flush is over (the worker's `Driver::poll_news`).
    fn poll_flush_over(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let inner = &self.ep.inner;
        inner
            .worker
            .driver
            .poll_news(cx, &mut self.registered, || inner.cs.flush_over())
    }
}

impl Drop for NewsWait {
    fn drop(&mut self) {
        if let Some(w) = self.registered.take() {
            self.ep.inner.worker.driver.forget_news_task(&w);
        }
    }
}

/// An endpoint's flush under way: ready when every send on it has completed and nothing is
/// left to post, or the endpoint is closing. Made by [`Ep::flush_nb`].
#[must_use = "a flush is only waited for by awaiting it"]
pub struct Flushing {
    wait: NewsWait,
}

impl Flushing {
    pub(crate) fn new(ep: Ep) -> Self {
        Flushing {
            wait: NewsWait::new(ep),
        }
    }

    /// Whether the endpoint is flushed (or closing) now. Progresses nothing.
    pub fn is_done(&self) -> bool {
        self.wait.ep.inner.cs.flush_over()
    }

    /// Blocks the calling thread until the flush is done, progressing the worker meanwhile
    /// when nothing else does (for a deadline, [`Ep::flush`]).
    pub fn wait(self) -> Result<()> {
        futures_lite::future::block_on(self)
    }
}

impl Future for Flushing {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().wait.poll_flush_over(cx).map(Ok)
    }
}

/// An endpoint's close under way (flush, then disconnect), made by [`Ep::close_nb`]: ready
/// once the endpoint is closed. The close goes on if the future is dropped.
#[must_use = "a close goes on without its future, but only the future tells how it ended"]
pub struct Closing {
    wait: NewsWait,
    /// The deadline the worker closes it at (its coarse clock), with what was still pending
    /// failed; `None` when it closed at once, or another close of the endpoint came first
    /// (this one has nothing to do).
    deadline_ns: Option<u64>,
    /// The timeout the deadline came from.
    timeout: Duration,
    /// Whether the close has ended, or another close of the endpoint came first.
    ended: bool,
}

impl Closing {
    pub(crate) fn new(ep: Ep, timeout: Duration) -> Self {
        let inner = &ep.inner;
        let already = inner.closed.swap(true, Ordering::AcqRel);
        // (The worker closes it once its flush is over, or at the deadline, should this
        // future be dropped; the future closes it as soon as it sees the flush over.)
        let deadline_ns = match already {
            true => None,
            false => inner.close_when_flushed(timeout),
        };
        Closing {
            wait: NewsWait::new(ep),
            deadline_ns,
            timeout,
            ended: already,
        }
    }

    /// Whether the endpoint is closed (closing) now. Progresses nothing.
    pub fn is_done(&self) -> bool {
        self.ended || self.wait.ep.inner.cs.is_closing()
    }

    /// Blocks the calling thread until the close ends (at the latest at its deadline),
    /// progressing the worker meanwhile when nothing else does: what [`Ep::close`] returns.
    pub fn wait(self) -> Result<()> {
        futures_lite::future::block_on(self)
    }
}

impl Future for Closing {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(Ok(()));
        }
        if this.wait.poll_flush_over(cx).is_pending() {
            return Poll::Pending;
        }
        this.ended = true;
        let inner = &this.wait.ep.inner;
        let cs = &inner.cs;
        let past = this
            .deadline_ns
            .is_some_and(|d| crate::clock::coarse_now_ns() >= d);
        if cs.is_closing() && past {
            // The worker closed it at the deadline, its sends failed.
            return Poll::Ready(Err(Error::Timeout(
                this.timeout,
                format!("closing the endpoint to {:?}: sends still pending", cs.peer),
            )));
        }
        inner.worker.driver.close_conn(cs.id);
        Poll::Ready(Ok(()))
    }
}

impl std::fmt::Debug for Flushing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flushing")
            .field("ep", &self.wait.ep)
            .field("done", &self.is_done())
            .finish()
    }
}

impl std::fmt::Debug for Closing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Closing")
            .field("ep", &self.wait.ep)
            .field("done", &self.is_done())
            .finish()
    }
}
