//! Threads asleep in a worker's waits, and waking exactly the ones an event concerns: a
//! completed request wakes the threads waiting for that request, and nothing else; an
//! unexpected arrival, a send's work completing or a connection closing wakes the threads
//! waiting for such news (probing receivers, flushing endpoints); a thread giving up the
//! event-mode wait on the worker's file descriptors wakes every sleeper, so that one of them
//! takes it over.
//!
//! Sleeping is `std::thread::park_timeout`: a wake-up between registering and parking is
//! not lost (the thread's token is set), and a stale wake-up only makes a sleeper look again.
//! A task awaiting a request ([`crate::Request`] as a future) sleeps the same way with its
//! [`std::task::Waker`] in place of a thread: registered under the same lock, woken once
//! (and then forgotten), and forgotten when its future completes or is dropped.
//!
//! A sleeper registers under the lock the events it waits for are recorded under (the
//! worker's state lock), and checks its condition after that section; a waker records the
//! events in a section of that lock and looks for sleepers after it. Of the two sections,
//! whichever comes second sees the other's work: if the sleeper's came first, the waker's
//! lock acquired its registration, so the waker's later look finds it; if the waker's came
//! first, the sleeper's lock acquired the events, so its check finds them. So neither needs
//! a fence of its own: before, the waker fenced (`mfence`) after every locked section that
//! completed a request, on the path from a message's arrival to its waiter.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Waker;
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

/// Who sleeps: a thread (parked) or a task (its waker).
enum Wakee {
    Thread(Thread),
    Task(Waker),
}

struct Sleeper {
    wakee: Wakee,
    on: WaitFor,
}

impl Sleeper {
    /// Whether this is the task registered for `on`: a request's (one task awaits it), or
    /// for news the task `waker` (`None`: none).
    fn is_task(&self, on: WaitFor, waker: Option<&Waker>) -> bool {
        let Wakee::Task(w) = &self.wakee else {
            return false;
        };
        self.on == on && (on != WaitFor::News || waker.is_some_and(|x| w.will_wake(x)))
    }
}

/// The sleepers of one worker.
#[derive(Default)]
pub(crate) struct Sleepers {
    list: Mutex<Vec<Sleeper>>,
    count: AtomicUsize,
}

impl Sleepers {
    /// Whether any thread is asleep (or about to be). Looked at after the section of the
    /// lock the events were recorded in (see the module's documentation).
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// Sleeps the calling thread up to `max` unless `done()`, until woken for `on`. It
    /// registers while holding what `lock` returns: the guard of the lock the events it
    /// waits for are recorded under.
    pub(crate) fn sleep<G>(
        &self,
        on: WaitFor,
        done: &mut impl FnMut() -> bool,
        max: Duration,
        lock: impl FnOnce() -> G,
    ) {
        let me = std::thread::current();
        let id = me.id();
        // (In the list before it is counted: a waker that counts it finds it.)
        self.list.lock().push(Sleeper {
            wakee: Wakee::Thread(me),
            on,
        });
        {
            let _guard = lock();
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        if !done() {
            std::thread::park_timeout(max);
        }
        // (Outside the lock: a waker that still counts it only looks through the list.)
        self.count.fetch_sub(1, Ordering::Relaxed);
        let mut list = self.list.lock();
        if let Some(i) = list
            .iter()
            .position(|s| matches!(&s.wakee, Wakee::Thread(t) if t.id() == id))
        {
            list.swap_remove(i);
        }
    }

    /// Registers the task `waker` for `on`, while holding what `lock` returns (as
    /// [`Sleepers::sleep`] does): for a request's slot, in place of the waker its one task
    /// registered before; for news, once per task (several tasks may wait for news: each
    /// is one entry, found again by [`Waker::will_wake`]). The caller checks its condition
    /// after this, and forgets the registration once it no longer waits
    /// ([`Sleepers::forget_task`]).
    ///
    /// A task's entry is listed and counted in one section of the list's lock (inside
    /// `lock`'s): a waker that removes it (and uncounts it) always finds it counted. (Listed
    /// first and counted after, as a thread is, a completion between the two removed it and
    /// uncounted another sleeper's entry: the count fell to 0 with that one still listed,
    /// and its completion, seeing no sleeper, woke no one — a task stalled for good.)
    pub(crate) fn register_task<G>(&self, on: WaitFor, waker: &Waker, lock: impl FnOnce() -> G) {
        let _guard = lock();
        let mut list = self.list.lock();
        if let Some(s) = list.iter_mut().find(|s| s.is_task(on, Some(waker))) {
            if let Wakee::Task(w) = &mut s.wakee {
                w.clone_from(waker);
            }
            return;
        }
        list.push(Sleeper {
            wakee: Wakee::Task(waker.clone()),
            on,
        });
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Forgets the task registered for `on` (for news: the task `waker`), if one is.
    pub(crate) fn forget_task(&self, on: WaitFor, waker: Option<&Waker>) {
        let mut list = self.list.lock();
        if let Some(i) = list.iter().position(|s| s.is_task(on, waker)) {
            list.swap_remove(i);
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Wakes the threads and tasks waiting for the requests in `slots`, and when `news`,
    /// those waiting for news. A task woken is forgotten (a waker wakes once: the task
    /// registers again if it waits on).
    pub(crate) fn wake(&self, slots: &[u32], news: bool) {
        let wanted = |on: WaitFor| match on {
            WaitFor::Request(i) => slots.contains(&i),
            WaitFor::News => news,
        };
        self.wake_where(wanted);
    }

    /// Wakes every sleeper.
    pub(crate) fn wake_all(&self) {
        self.wake_where(|_| true);
    }

    fn wake_where(&self, wanted: impl Fn(WaitFor) -> bool) {
        let mut woken: Vec<Waker> = Vec::new();
        {
            let mut list = self.list.lock();
            list.retain(|s| {
                if !wanted(s.on) {
                    return true;
                }
                match &s.wakee {
                    Wakee::Thread(t) => {
                        t.unpark();
                        true
                    }
                    Wakee::Task(w) => {
                        woken.push(w.clone());
                        false
                    }
                }
            });
            if !woken.is_empty() {
                self.count.fetch_sub(woken.len(), Ordering::Relaxed);
            }
        }
        // (Outside the list's lock: a waker may run its task here and then, which may
        // register again.)
        for w in woken {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    /// A sleeper for one request is woken by that request only; waker and sleepers follow
    /// the module's protocol (the events recorded under the lock the sleepers register
    /// under, the sleepers looked for after that section).
    #[test]
    fn a_completion_wakes_only_its_waiter() {
        let sleepers = Arc::new(Sleepers::default());
        let state = Arc::new(Mutex::new(()));
        let flags: Arc<[AtomicBool; 2]> =
            Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let spawn = |slot: u32| {
            let (sleepers, flags, state) = (sleepers.clone(), flags.clone(), state.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut done = || flags[slot as usize].load(Ordering::Relaxed);
                while !done() && start.elapsed() < Duration::from_secs(20) {
                    sleepers.sleep(
                        WaitFor::Request(slot),
                        &mut done,
                        Duration::from_secs(30),
                        || state.lock().unwrap(),
                    );
                }
                done()
            })
        };
        let complete = |slot: u32| {
            {
                let _guard = state.lock().unwrap();
                flags[slot as usize].store(true, Ordering::Relaxed);
            }
            if sleepers.any() {
                sleepers.wake(&[slot], false);
            }
        };
        let a = spawn(0);
        let b = spawn(1);
        while sleepers.count.load(Ordering::SeqCst) < 2 {
            std::thread::yield_now();
        }
        complete(0);
        assert!(a.join().unwrap());
        // The other is still asleep (its slot was not named), until its own wake-up.
        assert!(!b.is_finished());
        complete(1);
        assert!(b.join().unwrap());
        assert!(!sleepers.any());
    }

    /// A completion recorded while a sleeper registers is never missed: the sleeper either
    /// sees it or is woken (many rounds, each racing one completion against one sleeper,
    /// whose sleep would otherwise last the whole test).
    #[test]
    fn a_completion_racing_a_sleeper_is_not_missed() {
        let sleepers = Arc::new(Sleepers::default());
        let state = Arc::new(Mutex::new(()));
        for _ in 0..2000 {
            let flag = Arc::new(AtomicBool::new(false));
            let sleeper = {
                let (sleepers, flag, state) = (sleepers.clone(), flag.clone(), state.clone());
                std::thread::spawn(move || {
                    let mut done = || flag.load(Ordering::Relaxed);
                    let start = Instant::now();
                    while !done() {
                        sleepers.sleep(
                            WaitFor::Request(0),
                            &mut done,
                            Duration::from_secs(60),
                            || state.lock().unwrap(),
                        );
                    }
                    start.elapsed()
                })
            };
            {
                let _guard = state.lock().unwrap();
                flag.store(true, Ordering::Relaxed);
            }
            if sleepers.any() {
                sleepers.wake(&[0], false);
            }
            // Woken or never asleep: far under the sleep's 60 s.
            assert!(sleeper.join().unwrap() < Duration::from_secs(30));
        }
    }

    /// A waker that flags when it is woken.
    struct Flag(AtomicBool);

    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A completion that comes while a task registers (inside the section it registers
    /// under, where another thread's completion may run) never leaves another registered
    /// task uncounted: that task's completion, which wakes only when it sees sleepers,
    /// still wakes it. (Listed, then counted in a later section, the first task's entry was
    /// removed and uncounted by that completion before it was counted: the count fell to 0
    /// with the other task still listed, and its completion woke no one.)
    #[test]
    fn a_completion_while_a_task_registers_loses_no_other_wake_up() {
        let sleepers = Sleepers::default();
        let other = Arc::new(Flag(AtomicBool::new(false)));
        sleepers.register_task(WaitFor::Request(2), &Waker::from(other.clone()), || ());
        let mine = Arc::new(Flag(AtomicBool::new(false)));
        sleepers.register_task(WaitFor::Request(1), &Waker::from(mine), || {
            // Slot 1 completes now; then slot 2, whose completer wakes only if it sees a
            // sleeper (as `Driver::after_unlock` does).
            sleepers.wake(&[1], false);
            if sleepers.any() {
                sleepers.wake(&[2], false);
            }
        });
        assert!(
            other.0.load(Ordering::SeqCst),
            "the other task's wake-up was lost"
        );
    }
}
