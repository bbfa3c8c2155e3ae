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

/// An endpoint's flush under way: ready when every send on it has completed and nothing is
/// left to post, or the endpoint is closing. Made by [`Ep::flush_nb`].
#[must_use = "a flush is only waited for by awaiting it"]
pub struct Flushing {
    ep: Ep,
    registered: Option<Waker>,
}

impl Flushing {
    pub(crate) fn new(ep: Ep) -> Self {
        Flushing {
            ep,
            registered: None,
        }
    }

    /// Whether the endpoint is flushed (or closing) now. Progresses nothing.
    pub fn is_done(&self) -> bool {
        let cs = &self.ep.inner.cs;
        cs.is_closing() || cs.flushed()
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
        let this = self.get_mut();
        let cs = &this.ep.inner.cs;
        let driver = &this.ep.inner.worker.driver;
        driver
            .poll_news(cx, &mut this.registered, || cs.is_closing() || cs.flushed())
            .map(Ok)
    }
}

impl Drop for Flushing {
    fn drop(&mut self) {
        if let Some(w) = self.registered.take() {
            self.ep.inner.worker.driver.forget_news_task(&w);
        }
    }
}

/// An endpoint's close under way (flush, then disconnect), made by [`Ep::close_nb`]: ready
/// once the endpoint is closed. The close goes on if the future is dropped.
#[must_use = "a close goes on without its future, but only the future tells how it ended"]
pub struct Closing {
    ep: Ep,
    /// The close's deadline on the worker's coarse clock, and the timeout it came from.
    deadline_ns: u64,
    timeout: Duration,
    /// Whether another close of the endpoint came first (this one has nothing to do).
    already: bool,
    registered: Option<Waker>,
}

impl Closing {
    pub(crate) fn new(ep: Ep, timeout: Duration) -> Self {
        let deadline_ns = crate::clock::coarse_now_ns()
            .saturating_add(timeout.as_nanos().min(u64::MAX as _) as u64);
        let inner = &ep.inner;
        let already = inner.closed.swap(true, Ordering::AcqRel);
        if !already {
            let cs = &inner.cs;
            let driver = &inner.worker.driver;
            if cs.is_closing() || cs.flushed() {
                driver.close_conn(cs.id);
            } else {
                // The worker closes it once drained, or at the deadline, should this
                // future be dropped; the future closes it as soon as it sees it drained.
                driver.linger(cs, timeout);
            }
        }
        Closing {
            ep,
            deadline_ns,
            timeout,
            already,
            registered: None,
        }
    }

    /// Whether the endpoint is closed (closing) now. Progresses nothing.
    pub fn is_done(&self) -> bool {
        self.already || self.ep.inner.cs.is_closing()
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
        if this.already {
            return Poll::Ready(Ok(()));
        }
        let inner = &this.ep.inner;
        let (cs, driver) = (&inner.cs, &inner.worker.driver);
        let drained = || cs.is_closing() || cs.flushed();
        if driver
            .poll_news(cx, &mut this.registered, drained)
            .is_pending()
        {
            return Poll::Pending;
        }
        this.already = true;
        if cs.is_closing() && crate::clock::coarse_now_ns() >= this.deadline_ns {
            // The worker closed it at the deadline, its sends failed.
            return Poll::Ready(Err(Error::Timeout(
                this.timeout,
                format!("closing the endpoint to {:?}: sends still pending", cs.peer),
            )));
        }
        driver.close_conn(cs.id);
        Poll::Ready(Ok(()))
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(w) = self.registered.take() {
            self.ep.inner.worker.driver.forget_news_task(&w);
        }
    }
}

impl std::fmt::Debug for Flushing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flushing")
            .field("ep", &self.ep)
            .field("done", &self.is_done())
            .finish()
    }
}

impl std::fmt::Debug for Closing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Closing")
            .field("ep", &self.ep)
            .field("done", &self.is_done())
            .finish()
    }
}
