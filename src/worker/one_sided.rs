//! Starting one-sided operations, flushes and fences (the API is `crate::rma`'s): each a
//! request in the table like a send, its buffer (a put's bytes, a get's destination, none
//! for the others) owned by the worker until it completes.

use super::*;

/// An operation for [`Driver::one_sided`] to start: the engine call that makes it, given
/// the request's buffer.
pub(crate) type Start<'a> =
    &'a mut dyn FnMut(&mut Engine, UserBufId) -> std::result::Result<RequestId, rdmx_proto::Error>;

impl Driver {
    /// Makes a one-sided request of `what` (its `tag`: the remote offset) with `buf` on
    /// `cs` (`None`: the worker's flush), started by `start`. A connection that is gone
    /// completes it at once with [`Status::ConnectionClosed`]; an operation the engine
    /// cannot carry on it is an error (the buffer is dropped).
    pub(crate) fn one_sided(
        &self,
        worker: &Worker,
        cs: Option<&Arc<Conn>>,
        what: Describe,
        buf: Vec<u8>,
        start: Start<'_>,
    ) -> Result<Request> {
        let len = buf.len() as u64;
        let made = self.with_protocol(|st| {
            let bufid = st.new_buf(UserMem::Plain(buf));
            match start(&mut st.engine, bufid) {
                Ok(id) => {
                    if let Some(cs) = cs {
                        // (Counted as a send: flushing and closing the endpoint wait for it.)
                        cs.pending_sends.fetch_add(1, Ordering::AcqRel);
                    }
                    Ok(Made::Pending(st.requests.open(bufid, id, cs)))
                }
                Err(rdmx_proto::Error::UnknownConnection(_)) => Ok(Made::Done(Outcome {
                    status: Status::ConnectionClosed,
                    kind: what.kind,
                    length: len,
                    tag: 0,
                    buf: st.take_buf(bufid),
                    conn: cs.map(|c| c.id),
                })),
                Err(e) => {
                    drop(st.take_buf(bufid));
                    Err(match e {
                        rdmx_proto::Error::Refused(r) => Error::Rma(r),
                        e => Error::Proto(e),
                    })
                }
            }
        })?;
        Ok(made.into_request(worker, what))
    }

    /// A fence on every connection of the worker (`crate::Worker::fence`).
    pub(crate) fn fence_all(&self) {
        self.with_protocol(|st| {
            for id in st.conns.keys() {
                // (A connection the engine forgot is closing: nothing to order on it.)
                let _ = st.engine.rma_fence(*id);
            }
        });
    }

    /// A fence on `cs` (`crate::Ep::fence`).
    pub(crate) fn fence(&self, cs: &Conn) {
        self.with_protocol(|st| {
            let _ = st.engine.rma_fence(cs.id);
        });
    }

    /// Where the worker's NIC finds the mapped region `key` names (mapped with `access`),
    /// once the worker uses an RDMA device (`crate::rma::SharedRegions`'s table registers
    /// it on first use).
    pub(crate) fn nic_part(
        &self,
        key: &rdmx_proto::rma::KeyRef,
        access: rdmx_proto::rma::RemoteAccess,
    ) -> Option<rdmx_proto::rma::RdmaPart> {
        #[cfg(feature = "rdma")]
        if let Some(rdma) = self.ifaces.rdma.get() {
            return self.regions.lock().nic_part(key, access, &rdma.pd);
        }
        let _ = (key, access);
        None
    }
}
