//! A device's asynchronous events (`ibv_get_async_event`): read without blocking, each
//! acknowledged at once, and the SRQ limit events handed to the SRQ they concern.
//!
//! rdmacm opens each device once per process, so every SRQ and QP of the process on one
//! device reports through the same event file: whoever drains it passes each SRQ limit event
//! on through a process-wide table of the SRQs that armed a limit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rdmx_sys as sys;

use crate::device::Device;

/// SRQs (by handle address) waiting for their limit event, with the flag to raise.
static SRQ_LIMITS: Mutex<Vec<(usize, Weak<AtomicBool>)>> = Mutex::new(Vec::new());

/// Devices whose event file was made nonblocking (by context address).
static NONBLOCKING: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Raises `flag` when the SRQ `srq` reports its limit reached.
pub(crate) fn watch_srq(srq: *mut sys::ibv_srq, flag: &Arc<AtomicBool>) {
    let mut table = SRQ_LIMITS.lock().unwrap_or_else(|p| p.into_inner());
    table.retain(|(s, f)| *s != srq as usize && f.strong_count() > 0);
    table.push((srq as usize, Arc::downgrade(flag)));
}

/// Forgets the SRQ `srq` (it is being destroyed).
pub(crate) fn unwatch_srq(srq: *mut sys::ibv_srq) {
    let mut table = SRQ_LIMITS.lock().unwrap_or_else(|p| p.into_inner());
    table.retain(|(s, _)| *s != srq as usize);
}

/// Reads every event `device` has pending, without blocking: acknowledges each, raises the
/// flag of an SRQ whose limit was reached, and logs the others.
pub(crate) fn drain(device: &Device) {
    let ctx = device.context();
    {
        let mut done = NONBLOCKING.lock().unwrap_or_else(|p| p.into_inner());
        if !done.contains(&(ctx as usize)) {
            // SAFETY: the context is open while `device` lives; async_fd is its event file,
            // which only this module reads, and fcntl on it changes nothing but its flags.
            let ok = unsafe {
                let fd = (*ctx).async_fd;
                let flags = libc::fcntl(fd, libc::F_GETFL);
                flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
            };
            if !ok {
                log::warn!(
                    "{}: cannot make the async event file nonblocking: {}",
                    device.name(),
                    std::io::Error::last_os_error()
                );
                return;
            }
            done.push(ctx as usize);
        }
    }
    loop {
        let mut ev = sys::ibv_async_event::default();
        // SAFETY: the context is open; its event file is nonblocking, so this returns at
        // once (-1 with EAGAIN when nothing is pending); ev is a valid out-pointer.
        if unsafe { sys::ibv_get_async_event(ctx, &mut ev) } != 0 {
            return;
        }
        let kind = ev.event_type;
        if kind == sys::ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED {
            // SAFETY: for an SRQ event, the element is the SRQ's handle.
            let srq = unsafe { ev.element.srq } as usize;
            let table = SRQ_LIMITS.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(flag) = table
                .iter()
                .find(|(s, _)| *s == srq)
                .and_then(|(_, f)| f.upgrade())
            {
                flag.store(true, Ordering::Release);
            }
        } else {
            log::debug!("{}: async event {}", device.name(), kind.0);
        }
        // SAFETY: ev was filled by ibv_get_async_event and is acknowledged exactly once (a
        // destroy of its QP, CQ or SRQ waits for that).
        unsafe { sys::ibv_ack_async_event(&mut ev) };
    }
}
