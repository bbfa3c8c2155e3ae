//! Rendezvous send buffers exposed to one peer through memory windows.

use rdmx_conn::{Access, MemoryWindow};
use rdmx_proto::UserBufId;
use rustc_hash::FxHashMap as HashMap;

use super::{Outgoing, Rdma, RdmaLink, RegCache};
use crate::config::RndvRegistration;
use crate::usermem::UserMem;

/// Rendezvous send buffers exposed through memory windows, by buffer.
#[derive(Default)]
pub(crate) struct Windows {
    by_buf: HashMap<UserBufId, MemoryWindow>,
}

impl Windows {
    /// Makes `len` bytes of the send buffer `buf` (`mem`) readable by the peer of `link`
    /// alone, while the rendezvous runs. Where the device has memory windows, the buffer is
    /// registered (per operation or through the cache, as `mode` says) without remote
    /// access, and a window bound to the connection's QP exposes exactly the message (its
    /// bind is queued before the RTS, so it is in place when the peer reads). Otherwise the
    /// buffer is registered in place with remote read for this one operation (never through
    /// the cache, whose regions outlive the message). The caller flushes `link`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn expose(
        &mut self,
        rdma: &Rdma,
        mode: RndvRegistration,
        link: &RdmaLink,
        buf: UserBufId,
        mem: &mut UserMem,
        rcache: &mut RegCache,
        len: u64,
    ) -> std::result::Result<rdmx_proto::RemoteBuf, String> {
        if !rdma.windows {
            mem.register(
                RndvRegistration::PerOperation,
                &rdma.pd,
                rcache,
                Access::REMOTE_READ,
                false,
            )?;
            let r = mem.remote().ok_or("no remote key")?;
            return Ok(rdmx_proto::RemoteBuf {
                addr: r.addr,
                rkey: r.rkey,
            });
        }
        mem.register(mode, &rdma.pd, rcache, Access::WINDOW_READ, false)?;
        let len = usize::try_from(len).map_err(|_| "the message is too long")?;
        let window = match (mem.registered(), mem.registered_shared()) {
            (Some(head), _) => MemoryWindow::new(head, len),
            (None, Some(shared)) => MemoryWindow::new_shared(shared, len),
            (None, None) => return Err("the send buffer is not registered".into()),
        }
        .map_err(|e| e.to_string())?;
        let remote = rdmx_proto::RemoteBuf {
            addr: window.addr(),
            rkey: window.rkey(),
        };
        link.push(Outgoing::Bind(window.clone()));
        self.by_buf.insert(buf, window);
        Ok(remote)
    }

    /// Kills the window of `buf`, if it has one: true once it is dead (or there was none),
    /// false while a bind of it is still posted (try again after polling completions).
    #[inline]
    pub(crate) fn invalidate(&mut self, buf: UserBufId) -> bool {
        if self.by_buf.is_empty() {
            // (Every message is released: most have no window, and most workers none at all.)
            return true;
        }
        match self.by_buf.remove(&buf) {
            None => true,
            Some(window) => match window.invalidate() {
                Ok(()) => true,
                Err(window) => {
                    self.by_buf.insert(buf, window);
                    false
                }
            },
        }
    }
}
