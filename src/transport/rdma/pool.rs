//! Registered send buffers for frames too large to go inline.

use rdmx_conn::{Access, ProtectionDomain, RegisteredBuf};

use crate::error::Result;

/// Registered send buffers, grown on demand in chunks of `grow` buffers.
pub(crate) struct SendPool {
    free: Vec<RegisteredBuf>,
    buf_len: usize,
    grow: usize,
    /// Bytes registered for send buffers.
    pub(crate) bytes: u64,
}

impl SendPool {
    pub(crate) fn new(buf_len: usize, grow: usize) -> Self {
        SendPool {
            free: Vec::new(),
            buf_len,
            grow: grow.max(1),
            bytes: 0,
        }
    }

    pub(crate) fn buf_len(&self) -> usize {
        self.buf_len
    }

    pub(crate) fn take(&mut self, pd: &ProtectionDomain) -> Result<RegisteredBuf> {
        if let Some(b) = self.free.pop() {
            return Ok(b);
        }
        let chunks = pd.register_chunks(self.buf_len, self.grow, Access::SEND)?;
        self.bytes += (self.buf_len * self.grow) as u64;
        self.free.extend(chunks);
        Ok(self.free.pop().expect("just registered"))
    }

    pub(crate) fn give(&mut self, buf: RegisteredBuf) {
        if buf.len() == self.buf_len {
            self.free.push(buf);
        }
    }
}
