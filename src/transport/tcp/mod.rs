//! The TCP transport: connections over `rdmx-tcp`'s nonblocking sockets, and what stands in
//! for RDMA READ over a byte stream (see `exposures`).

mod exposures;

pub(crate) use exposures::{Answer, Exposures};
