//! Threads asleep in a worker's waits, and waking exactly the ones an event concerns: a
//! completed request wakes the threads waiting for that request, and nothing else; an
//! unexpected arrival, a send's work completing or a connection closing wakes the threads
//! waiting for such news (probing receivers, flushing endpoints); a thread giving up the
//! event-mode wait on the worker's file descriptors wakes every sleeper, so that one of them
//! takes it over.
//!
//! Sleeping is `std::thread::park_timeout`: a wake-up between registering and parking is
//! not lost (the thread's token is set), and a stale wake-up only makes a sleeper look again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::Thread;
use std::time::Duration;

use parking_lot::Mutex;

/// What a sleeping thread waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitFor {
    /// The request in this slot of the request table.
    Request(u32),
    /// Anything else: an arrival, a send's work, a connection closing.
    News,
}

struct Sleeper {
    thread: Thread,
    on: WaitFor,
}

/// The sleepers of one worker.
#[derive(Default)]
pub(crate) struct Sleepers {
    list: Mutex<Vec<Sleeper>>,
    count: AtomicUsize,
}

impl Sleepers {
    /// Whether any thread is asleep (or about to be). Checked after an event is recorded:
    /// a sleeper registers before it checks its condition, so one of the two sees the other.
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }

    /// Sleeps the calling thread up to `max` unless `done()`, until woken for `on`.
    pub(crate) fn sleep(&self, on: WaitFor, done: &mut impl FnMut() -> bool, max: Duration) {
        let me = std::thread::current();
        let id = me.id();
        self.list.lock().push(Sleeper { thread: me, on });
        self.count.fetch_add(1, Ordering::SeqCst);
        if !done() {
            std::thread::park_timeout(max);
        }
        self.count.fetch_sub(1, Ordering::SeqCst);
        let mut list = self.list.lock();
        if let Some(i) = list.iter().position(|s| s.thread.id() == id) {
            list.swap_remove(i);
        }
    }

    /// Wakes the threads waiting for the requests in `slots`, and when `news`, those
    /// waiting for news.
    pub(crate) fn wake(&self, slots: &[u32], news: bool) {
        for s in self.list.lock().iter() {
            let wanted = match s.on {
                WaitFor::Request(i) => slots.contains(&i),
                WaitFor::News => news,
            };
            if wanted {
                s.thread.unpark();
            }
        }
    }

    /// Wakes every sleeper.
    pub(crate) fn wake_all(&self) {
        for s in self.list.lock().iter() {
            s.thread.unpark();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Instant;

    /// A sleeper for one request is woken by that request only.
    #[test]
    fn a_completion_wakes_only_its_waiter() {
        let sleepers = Arc::new(Sleepers::default());
        let flags: Arc<[AtomicBool; 2]> =
            Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let spawn = |slot: u32| {
            let (sleepers, flags) = (sleepers.clone(), flags.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut done = || flags[slot as usize].load(Ordering::SeqCst);
                while !done() && start.elapsed() < Duration::from_secs(20) {
                    sleepers.sleep(WaitFor::Request(slot), &mut done, Duration::from_secs(30));
                }
                done()
            })
        };
        let a = spawn(0);
        let b = spawn(1);
        while sleepers.count.load(Ordering::SeqCst) < 2 {
            std::thread::yield_now();
        }
        flags[0].store(true, Ordering::SeqCst);
        sleepers.wake(&[0], false);
        assert!(a.join().unwrap());
        // The other is still asleep (its slot was not named), until its own wake-up.
        assert!(!b.is_finished());
        flags[1].store(true, Ordering::SeqCst);
        sleepers.wake(&[1], false);
        assert!(b.join().unwrap());
        assert!(!sleepers.any());
    }
}
