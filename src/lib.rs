//! rdmx: message passing over RDMA, modelled on UCX's UCP.
//!
//! The endpoint API (Context → Worker → Ep / Listener) is being built on two crates that this
//! package re-exports:
//! - [`conn`]: safe wrappers over rdmacm and verbs (connections, memory regions, a shared receive
//!   queue, completion queues and channels);
//! - [`proto`]: the sans-IO protocol engine (eager, rendezvous, tag matching, flow control).

pub use rdmx_conn as conn;
pub use rdmx_proto as proto;

/// The librdmacm version this build was compiled against (from pkg-config).
pub const RDMACM_VERSION: &str = env!("RDMX_RDMACM_VERSION");
/// The libibverbs version this build was compiled against (from pkg-config).
pub const IBVERBS_VERSION: &str = env!("RDMX_IBVERBS_VERSION");
