//! The effective configuration of a [`crate::Context`]: every `RDMX_*` knob, its value and
//! where that value came from.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::transport::Transport;

mod modes;
mod parse;
pub use modes::{RndvRegistration, WaitMode};
use parse::{config_error, env_error, parse_bool, parse_count, parse_size};

/// Where a configuration value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// rdmx's built-in default.
    Default,
    /// The process environment (`RDMX_*`).
    Environment,
    /// [`crate::ContextBuilder`], which overrides the environment.
    Builder,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Source::Default => "default",
            Source::Environment => "environment",
            Source::Builder => "builder",
        })
    }
}

/// One knob of the effective configuration, for display (see [`Config::entries`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The environment variable that sets it.
    pub var: &'static str,
    /// The effective value, formatted.
    pub value: String,
    /// Where the value came from.
    pub source: Source,
    /// What it does.
    pub help: &'static str,
}

/// A value and its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Setting<T> {
    pub(crate) value: T,
    pub(crate) source: Source,
}

impl<T> Setting<T> {
    fn default(value: T) -> Self {
        Setting {
            value,
            source: Source::Default,
        }
    }
    pub(crate) fn set(&mut self, value: T) {
        self.value = value;
        self.source = Source::Builder;
    }
}

/// The effective configuration of a context: defaults, overridden by the environment,
/// overridden by the builder. Read it with the accessors or list it with [`Config::entries`]
/// (its `Display` prints a table, as `rdmx-info` does).
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) eager_threshold: Setting<u64>,
    pub(crate) recv_buf_size: Setting<u32>,
    pub(crate) srq_depth: Setting<u32>,
    pub(crate) credits: Setting<u16>,
    pub(crate) send_bufs: Setting<u32>,
    pub(crate) wait_mode: Setting<WaitMode>,
    pub(crate) progress_thread: Setting<bool>,
    pub(crate) shm_cma: Setting<bool>,
    pub(crate) raise_nofile: Setting<bool>,
    pub(crate) device: Setting<Option<String>>,
    pub(crate) rndv_registration: Setting<RndvRegistration>,
    pub(crate) rcache_bytes: Setting<u64>,
    pub(crate) rndv_chunk: Setting<u64>,
    pub(crate) connect_timeout: Setting<Duration>,
    pub(crate) keepalive: Setting<Duration>,
    pub(crate) max_pending_handshakes: Setting<u32>,
    pub(crate) max_unexpected: Setting<u64>,
    pub(crate) rndv_timeout: Setting<Duration>,
    pub(crate) transport: Setting<Vec<Transport>>,
    /// The transports a context resolved `transport` to (usable here, in order of
    /// preference); empty before a context resolved them (then RDMA's values apply).
    pub(crate) resolved: Vec<Transport>,
}

/// The TCP transport's default eager threshold: 64 KiB less the 40-byte frame header (the
/// RDMA default is 8152 B, bounded by the SRQ's pre-posted memory; see [`Config`]).
pub const TCP_EAGER_THRESHOLD: u64 = 64 * 1024 - 40;
/// The TCP transport's default largest frame a peer may send (`RDMX_RECV_BUF_SIZE`).
pub const TCP_RECV_BUF_SIZE: u32 = 64 * 1024;
/// The shared-memory transport's default eager threshold: 16 KiB. Its threshold sweep
/// (BENCHMARKS.md, 2026-11-27) found eager faster than rendezvous up to 16 KiB (p50 3.89 µs
/// against 5.33 at 16 KiB) and about even at 32 KiB; with it, 8 KiB messages, alternating
/// runs, one-way 3.9–7.8 µs → 2.1–5.1 and bandwidth 1507–2287 → 2400–5024 MB/s.
pub const SHM_EAGER_THRESHOLD: u64 = 16 << 10;
/// The shared-memory transport's default largest frame a peer may send: the threshold and
/// the 40-byte frame header.
pub const SHM_RECV_BUF_SIZE: u32 = SHM_EAGER_THRESHOLD as u32 + rdmx_proto::HEADER_LEN as u32;
/// The shared-memory transport's default rendezvous chunk (`RDMX_RNDV_CHUNK`): 1 MiB, see
/// [`Config::rndv_chunk_for`].
pub const SHM_RNDV_CHUNK: u64 = 1 << 20;

/// `RDMX_EAGER_THRESHOLD`: largest message sent eagerly, in bytes.
pub const EAGER_THRESHOLD_VAR: &str = rdmx_proto::EAGER_THRESHOLD_VAR;
/// `RDMX_RECV_BUF_SIZE`: size of each SRQ receive buffer, in bytes.
pub const RECV_BUF_SIZE_VAR: &str = "RDMX_RECV_BUF_SIZE";
/// `RDMX_SRQ_DEPTH`: receive buffers pre-posted on a worker's SRQ, shared by all its eps.
pub const SRQ_DEPTH_VAR: &str = "RDMX_SRQ_DEPTH";
/// `RDMX_CREDITS`: the largest window of frames one peer may have in flight towards a
/// worker over RDMA and TCP (windows start smaller and grow on demand from the worker's
/// pool; shared memory's window is its ring's, fixed).
pub const CREDITS_VAR: &str = "RDMX_CREDITS";
/// `RDMX_SEND_BUFS`: registered send buffers a worker starts with (it grows on demand).
pub const SEND_BUFS_VAR: &str = "RDMX_SEND_BUFS";
/// `RDMX_WAIT_MODE`: `poll` or `event`.
pub const WAIT_MODE_VAR: &str = "RDMX_WAIT_MODE";
/// `RDMX_PROGRESS_THREAD`: `1` gives every worker its own progress thread.
pub const PROGRESS_THREAD_VAR: &str = "RDMX_PROGRESS_THREAD";
/// `RDMX_SHM_CMA`: `1` (default) lets a shared-memory rendezvous read the sender's buffer by
/// CMA (`process_vm_readv`) where the kernel allows it; `0` always copies through the segment.
pub const SHM_CMA_VAR: &str = "RDMX_SHM_CMA";
/// `RDMX_RAISE_NOFILE`: `1` (default) raises the process's soft descriptor limit to its hard
/// limit when a context is made, as Go's runtime does; `0` leaves it (see
/// [`Config::raise_nofile`]).
pub const RAISE_NOFILE_VAR: &str = "RDMX_RAISE_NOFILE";
/// `RDMX_DEVICE`: RDMA device name (e.g. `rxe0`); unset picks the device of the first address.
pub const DEVICE_VAR: &str = "RDMX_DEVICE";
/// `RDMX_RNDV_REG`: `auto`, `per-op` or `cache`, see [`RndvRegistration`].
pub const RNDV_REG_VAR: &str = "RDMX_RNDV_REG";
/// `RDMX_RCACHE_SIZE`: bytes of registered memory the registration cache may keep.
pub const RCACHE_SIZE_VAR: &str = "RDMX_RCACHE_SIZE";
/// `RDMX_RNDV_CHUNK`: bytes each RDMA READ of a rendezvous fetches; see
/// [`Config::rndv_chunk`].
pub const RNDV_CHUNK_VAR: &str = "RDMX_RNDV_CHUNK";
/// Bytes of one message a rendezvous receiver keeps in flight at most (READs of
/// [`Config::rndv_chunk`] each, at least 4 and at most 64 of them).
const RNDV_BYTES_IN_FLIGHT: u64 = 1 << 20;
/// The largest `RDMX_MAX_UNEXPECTED`: 1 TiB (as good as no bound).
const MAX_UNEXPECTED_LIMIT: u64 = 1 << 40;
/// `RDMX_TRANSPORT`: `auto`, or transports in order of preference (`rdma,tcp`, `tcp`, …).
pub const TRANSPORT_VAR: &str = "RDMX_TRANSPORT";
/// `RDMX_CONNECT_TIMEOUT_MS`: how long connect and accept wait for the peer.
pub const CONNECT_TIMEOUT_VAR: &str = "RDMX_CONNECT_TIMEOUT_MS";
/// `RDMX_KEEPALIVE_MS`: how often an idle connection checks that its peer is alive (`0`:
/// never); see [`Config::keepalive`].
pub const KEEPALIVE_VAR: &str = "RDMX_KEEPALIVE_MS";
/// `RDMX_MAX_PENDING_HANDSHAKES`: connections a listener holds at once while their
/// handshake arrives; see [`Config::max_pending_handshakes`].
pub const MAX_PENDING_HANDSHAKES_VAR: &str = "RDMX_MAX_PENDING_HANDSHAKES";
/// `RDMX_MAX_UNEXPECTED`: bytes a worker holds for messages no receive matched yet before
/// their senders wait on credit; see [`Config::max_unexpected`].
pub const MAX_UNEXPECTED_VAR: &str = "RDMX_MAX_UNEXPECTED";
/// `RDMX_RNDV_TIMEOUT_MS`: how long a rendezvous send waits for its receiver to read it
/// (`0`: for ever, the default); see [`Config::rndv_timeout`].
pub const RNDV_TIMEOUT_VAR: &str = "RDMX_RNDV_TIMEOUT_MS";

impl Default for Config {
    fn default() -> Self {
        let proto = rdmx_proto::Config::default();
        Config {
            eager_threshold: Setting::default(proto.eager_threshold),
            recv_buf_size: Setting::default(proto.recv_buf_size),
            srq_depth: Setting::default(proto.srq_depth),
            credits: Setting::default(proto.credits),
            send_bufs: Setting::default(256),
            wait_mode: Setting::default(WaitMode::BusyPoll),
            progress_thread: Setting::default(false),
            shm_cma: Setting::default(true),
            raise_nofile: Setting::default(true),
            device: Setting::default(None),
            rndv_registration: Setting::default(RndvRegistration::Auto),
            rcache_bytes: Setting::default(256 << 20),
            rndv_chunk: Setting::default(proto.rndv_chunk_size),
            connect_timeout: Setting::default(Duration::from_secs(5)),
            keepalive: Setting::default(Duration::from_secs(1)),
            max_pending_handshakes: Setting::default(
                rdmx_tcp::Listener::DEFAULT_MAX_PENDING.min(u32::MAX as usize) as u32,
            ),
            max_unexpected: Setting::default(proto.max_unexpected),
            rndv_timeout: Setting::default(Duration::ZERO),
            transport: Setting::default(vec![Transport::Auto]),
            resolved: Vec::new(),
        }
    }
}

impl Config {
    /// Defaults overridden by the variables `lookup` finds (the environment, for
    /// [`crate::Context::new`]). A set but invalid variable is an error naming it, its value
    /// and what is allowed.
    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut c = Config::default();
        c.apply(lookup, Source::Environment)?;
        Ok(c)
    }

    /// Sets every variable `lookup` finds, parsed as from the environment, marking the
    /// values as coming from `source`.
    pub(crate) fn apply(
        &mut self,
        lookup: impl Fn(&str) -> Option<String>,
        source: Source,
    ) -> Result<()> {
        let c = self;
        let env = |var: &'static str| lookup(var).filter(|v| !v.trim().is_empty());
        fn put<T>(s: &mut Setting<T>, v: T, source: Source) {
            s.value = v;
            s.source = source;
        }
        if let Some(v) = env(EAGER_THRESHOLD_VAR) {
            let n = parse_size(
                EAGER_THRESHOLD_VAR,
                &v,
                0,
                rdmx_proto::config::MAX_EAGER_THRESHOLD,
            )?;
            put(&mut c.eager_threshold, n, source);
        }
        if let Some(v) = env(RECV_BUF_SIZE_VAR) {
            let n = parse_size(RECV_BUF_SIZE_VAR, &v, 256, 2 << 20)?;
            put(&mut c.recv_buf_size, n as u32, source);
        }
        if let Some(v) = env(SRQ_DEPTH_VAR) {
            let n = parse_count(SRQ_DEPTH_VAR, &v, 4, 1 << 20)?;
            put(&mut c.srq_depth, n as u32, source);
        }
        if let Some(v) = env(CREDITS_VAR) {
            let n = parse_count(CREDITS_VAR, &v, 4, 4096)?;
            put(&mut c.credits, n as u16, source);
        }
        if let Some(v) = env(SEND_BUFS_VAR) {
            let n = parse_count(SEND_BUFS_VAR, &v, 1, 1 << 20)?;
            put(&mut c.send_bufs, n as u32, source);
        }
        if let Some(v) = env(WAIT_MODE_VAR) {
            let m = WaitMode::parse(&v)
                .ok_or_else(|| env_error(WAIT_MODE_VAR, &v, "`poll` or `event`"))?;
            put(&mut c.wait_mode, m, source);
        }
        if let Some(v) = env(SHM_CMA_VAR) {
            let b = parse_bool(&v).ok_or_else(|| env_error(SHM_CMA_VAR, &v, "`1` or `0`"))?;
            put(&mut c.shm_cma, b, source);
        }
        if let Some(v) = env(RAISE_NOFILE_VAR) {
            let b = parse_bool(&v).ok_or_else(|| env_error(RAISE_NOFILE_VAR, &v, "`1` or `0`"))?;
            put(&mut c.raise_nofile, b, source);
        }
        if let Some(v) = env(PROGRESS_THREAD_VAR) {
            let b =
                parse_bool(&v).ok_or_else(|| env_error(PROGRESS_THREAD_VAR, &v, "`1` or `0`"))?;
            put(&mut c.progress_thread, b, source);
        }
        if let Some(v) = env(DEVICE_VAR) {
            put(&mut c.device, Some(v.trim().to_string()), source);
        }
        if let Some(v) = env(RNDV_REG_VAR) {
            let m = RndvRegistration::parse(&v)
                .ok_or_else(|| env_error(RNDV_REG_VAR, &v, "`auto`, `per-op` or `cache`"))?;
            put(&mut c.rndv_registration, m, source);
        }
        if let Some(v) = env(RCACHE_SIZE_VAR) {
            let n = parse_size(RCACHE_SIZE_VAR, &v, 0, 1 << 40)?;
            put(&mut c.rcache_bytes, n, source);
        }
        if let Some(v) = env(RNDV_CHUNK_VAR) {
            let n = parse_size(RNDV_CHUNK_VAR, &v, 4096, 16 << 20)?;
            put(&mut c.rndv_chunk, n, source);
        }
        if let Some(v) = env(TRANSPORT_VAR) {
            let t = Transport::parse_list(&v).ok_or_else(|| {
                env_error(
                    TRANSPORT_VAR,
                    &v,
                    "`auto`, or `rdma`, `tcp` and/or `shm` separated by commas, each once",
                )
            })?;
            put(&mut c.transport, t, source);
        }
        if let Some(v) = env(CONNECT_TIMEOUT_VAR) {
            let ms = parse_count(CONNECT_TIMEOUT_VAR, &v, 1, 3_600_000)?;
            put(&mut c.connect_timeout, Duration::from_millis(ms), source);
        }
        if let Some(v) = env(KEEPALIVE_VAR) {
            let ms = parse_count(KEEPALIVE_VAR, &v, 0, 3_600_000)?;
            put(&mut c.keepalive, Duration::from_millis(ms), source);
        }
        if let Some(v) = env(MAX_PENDING_HANDSHAKES_VAR) {
            let n = parse_count(MAX_PENDING_HANDSHAKES_VAR, &v, 1, 1 << 20)?;
            put(&mut c.max_pending_handshakes, n as u32, source);
        }
        if let Some(v) = env(MAX_UNEXPECTED_VAR) {
            let n = parse_size(MAX_UNEXPECTED_VAR, &v, 0, MAX_UNEXPECTED_LIMIT)?;
            put(&mut c.max_unexpected, n, source);
        }
        if let Some(v) = env(RNDV_TIMEOUT_VAR) {
            let ms = parse_count(RNDV_TIMEOUT_VAR, &v, 0, 86_400_000)?;
            put(&mut c.rndv_timeout, Duration::from_millis(ms), source);
        }
        Ok(())
    }

    /// Checks the combination and builds the protocol engine's configuration from it (its
    /// defaults are the largest of the transports'; each connection gets its transport's
    /// own, see [`Config::limits`]).
    pub(crate) fn proto(&self) -> Result<rdmx_proto::Config> {
        let ts = self.transports_or_rdma();
        rdmx_proto::Config::builder()
            .eager_threshold(
                ts.iter()
                    .map(|&t| self.eager_threshold_for(t))
                    .max()
                    .unwrap_or(0),
            )
            .recv_buf_size(
                ts.iter()
                    .map(|&t| self.recv_buf_size_for(t))
                    .max()
                    .unwrap_or(0),
            )
            .srq_depth(self.srq_depth.value)
            .credits(self.credits.value)
            .rndv_chunk_size(self.rndv_chunk.value)
            .max_reads_in_flight(self.reads_in_flight())
            .max_unexpected(self.max_unexpected.value)
            .rndv_timeout_ns(self.rndv_timeout.value.as_nanos() as u64)
            .build()
            .map_err(|e| {
                // The engine names its own fields; say which settings they come from.
                let from = match &e {
                    rdmx_proto::Error::InvalidConfig { var, .. } => match *var {
                        "eager_threshold" => EAGER_THRESHOLD_VAR,
                        "recv_buf_size" => RECV_BUF_SIZE_VAR,
                        "credits" => CREDITS_VAR,
                        "rndv_chunk_size" => RNDV_CHUNK_VAR,
                        "srq_depth" => "RDMX_SRQ_DEPTH (at least RDMX_CREDITS)",
                        _ => "",
                    },
                    _ => "",
                };
                match from {
                    "" => config_error(e),
                    from => Error::Config(format!("{e}: set by {from}")),
                }
            })
    }

    fn transports_or_rdma(&self) -> &[Transport] {
        if self.resolved.is_empty() {
            &[Transport::Rdma]
        } else {
            &self.resolved
        }
    }

    /// The transport whose values [`Config::eager_threshold`] and [`Config::recv_buf_size`]
    /// give: the first one in use.
    fn preferred(&self) -> Transport {
        self.transports_or_rdma()[0]
    }

    /// Largest message sent eagerly (`RDMX_EAGER_THRESHOLD`) on the preferred transport.
    pub fn eager_threshold(&self) -> u64 {
        self.eager_threshold_for(self.preferred())
    }
    /// Size of each receive buffer (`RDMX_RECV_BUF_SIZE`) on the preferred transport.
    pub fn recv_buf_size(&self) -> u32 {
        self.recv_buf_size_for(self.preferred())
    }

    /// `RDMX_EAGER_THRESHOLD` on `transport`. Unless set, RDMA's is 8152 B (bounded by the
    /// SRQ's pre-posted memory) and TCP's [`TCP_EAGER_THRESHOLD`]: a TCP receiver allocates
    /// each frame as it arrives, so large eager messages cost no pre-posted memory, and the
    /// threshold sweeps (BENCHMARKS.md) found eager faster than rendezvous over TCP at every
    /// size up to 32 KiB and about even at 64 KiB. Shared memory's is
    /// [`SHM_EAGER_THRESHOLD`]: its frames go through the connection's ring, whose memory is
    /// fixed, and its sweep found eager faster up to 16 KiB and about even at 32 KiB.
    pub fn eager_threshold_for(&self, transport: Transport) -> u64 {
        match (transport, self.eager_threshold.source) {
            (Transport::Tcp, Source::Default) => TCP_EAGER_THRESHOLD,
            (Transport::Shm, Source::Default) => SHM_EAGER_THRESHOLD,
            #[cfg(test)]
            (Transport::Memory, Source::Default) => TCP_EAGER_THRESHOLD,
            _ => self.eager_threshold.value,
        }
    }

    /// `RDMX_RECV_BUF_SIZE` on `transport`: RDMA's SRQ buffers (8 KiB unless set), TCP's
    /// and shared memory's largest frame a peer may send ([`TCP_RECV_BUF_SIZE`],
    /// [`SHM_RECV_BUF_SIZE`] unless set).
    pub fn recv_buf_size_for(&self, transport: Transport) -> u32 {
        match (transport, self.recv_buf_size.source) {
            (Transport::Tcp, Source::Default) => TCP_RECV_BUF_SIZE,
            (Transport::Shm, Source::Default) => SHM_RECV_BUF_SIZE,
            #[cfg(test)]
            (Transport::Memory, Source::Default) => TCP_RECV_BUF_SIZE,
            _ => self.recv_buf_size.value,
        }
    }

    /// The protocol limits of a connection on `transport` granted `credits` from the pool
    /// at connect — or, over shared memory, its ring's fixed window
    /// (`transport::shm::WINDOW`), not taken from the pool.
    pub(crate) fn limits(&self, transport: Transport, credits: u16) -> rdmx_proto::ConnLimits {
        let (credits, pooled) = match transport {
            Transport::Shm => (crate::transport::shm::WINDOW, false),
            _ => (credits, true),
        };
        rdmx_proto::ConnLimits {
            recv_buf_size: self.recv_buf_size_for(transport),
            eager_threshold: self.eager_threshold_for(transport),
            credits,
            pooled,
            rndv_chunk: self.rndv_chunk_for(transport),
            // (The NIC performs one-sided operations on RDMA links.)
            verbs_rma: transport == Transport::Rdma,
        }
    }
    /// Receive buffers on each worker's SRQ (`RDMX_SRQ_DEPTH`).
    pub fn srq_depth(&self) -> u32 {
        self.srq_depth.value
    }
    /// The largest window of frames one peer may have in flight towards a worker
    /// (`RDMX_CREDITS`); windows start smaller and grow on demand from the worker's pool.
    pub fn credits(&self) -> u16 {
        self.credits.value
    }
    /// Registered send buffers a worker starts with (`RDMX_SEND_BUFS`).
    pub fn send_bufs(&self) -> u32 {
        self.send_bufs.value
    }
    /// How blocking calls wait (`RDMX_WAIT_MODE`).
    pub fn wait_mode(&self) -> WaitMode {
        self.wait_mode.value
    }
    /// Whether workers get a progress thread (`RDMX_PROGRESS_THREAD`).
    pub fn progress_thread(&self) -> bool {
        self.progress_thread.value
    }

    /// Whether a shared-memory rendezvous may read the sender's buffer by CMA
    /// (`RDMX_SHM_CMA`); where it may not, or the kernel refuses, the data is copied through
    /// the shared segment.
    pub fn shm_cma(&self) -> bool {
        self.shm_cma.value
    }

    /// Whether making a context raises the process's soft descriptor limit
    /// (`RLIMIT_NOFILE`) to its hard limit (`RDMX_RAISE_NOFILE`, default on), as Go's runtime
    /// does at start: each TCP endpoint costs a socket, and Linux's default soft limit of
    /// 1024 runs out near 500 endpoints on each side of one process. Turn it off for a
    /// process that uses `select(2)` (which cannot take descriptors past 1023) or whose
    /// children must inherit the lower limit; the limit is the process's, so one context
    /// with it on raises it for all.
    pub fn raise_nofile(&self) -> bool {
        self.raise_nofile.value
    }
    /// The RDMA device requested (`RDMX_DEVICE`), if any.
    pub fn device(&self) -> Option<&str> {
        self.device.value.as_deref()
    }
    /// How rendezvous memory is registered (`RDMX_RNDV_REG`).
    pub fn rndv_registration(&self) -> RndvRegistration {
        self.rndv_registration.value
    }
    /// Bytes each RDMA READ of a rendezvous fetches (`RDMX_RNDV_CHUNK`, default 256 KiB —
    /// over shared memory 1 MiB, see [`Config::rndv_chunk_for`] —, 4 KiB to 16 MiB); a
    /// receiver keeps about 1 MiB of a message in flight, in at least 4
    /// and at most 64 READs. Over TCP a READ is a request answered on the stream, chunked
    /// the same way.
    ///
    /// Smaller chunks cost some bandwidth on a clean link (in one Soft-RoCE guest, 1 MiB
    /// messages: 59–61 MB/s with 256 KiB, 57–59 with 64 KiB, 52–53 with 16 KiB) and lose
    /// less to a lossy one: a READ response packet lost makes the requester retry, and a
    /// READ of 256 packets rarely arrives whole when a few percent of them are lost. (On
    /// Soft-RoCE, Linux 6.1, 5 % loss between two nodes stalled transfers without an error
    /// in most runs whatever the chunk; 16 KiB READs got through once, in 108 s against
    /// 16 s without loss.)
    pub fn rndv_chunk(&self) -> u64 {
        self.rndv_chunk.value
    }

    /// `RDMX_RNDV_CHUNK` on `transport`: over shared memory [`SHM_RNDV_CHUNK`] unless set.
    /// There a READ is one `process_vm_readv` copying the bytes in the receiver's progress
    /// call, with nothing to pipeline; fewer calls per message move more: 1 MiB messages,
    /// 16 receives posted, alternating runs on one host, 256 KiB chunks 5120–6432 MB/s,
    /// 1 MiB chunks 5627–7424 (each run higher), 4 MiB about as 1 MiB.
    pub fn rndv_chunk_for(&self, transport: Transport) -> u64 {
        match (transport, self.rndv_chunk.source) {
            (Transport::Shm, Source::Default) => SHM_RNDV_CHUNK,
            _ => self.rndv_chunk.value,
        }
    }

    /// READs of one message in flight at most: [`Config::rndv_chunk`]s making up about
    /// 1 MiB, between 4 and 64.
    fn reads_in_flight(&self) -> u32 {
        (RNDV_BYTES_IN_FLIGHT / self.rndv_chunk.value.max(1)).clamp(4, 64) as u32
    }

    /// Bytes the registration cache may keep (`RDMX_RCACHE_SIZE`).
    pub fn rcache_bytes(&self) -> u64 {
        self.rcache_bytes.value
    }
    /// The transports asked for (`RDMX_TRANSPORT`), in order of preference (`[Auto]` for
    /// `auto`); see [`crate::Context::transports`] for those in use.
    pub fn transports(&self) -> &[Transport] {
        &self.transport.value
    }
    /// How long connect and accept wait (`RDMX_CONNECT_TIMEOUT_MS`); also how long each
    /// connection a listener takes has for its handshake to arrive (see
    /// [`Config::max_pending_handshakes`]).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout.value
    }
    /// How often an idle connection checks that its peer is alive (`RDMX_KEEPALIVE_MS`,
    /// default 1 s; zero: never), like UCX's keepalive. The check is the transport's own and
    /// is answered by the peer's NIC or kernel, not its application, so a peer that does not
    /// progress is never taken for dead:
    /// - RDMA: a connection with nothing posted for an interval posts a zero-length RDMA
    ///   WRITE, and every QP retransmits unacknowledged work 6 times with an ACK timeout
    ///   sized so that the 7 tries take at most an interval (exponent 15, 134 ms, for 1 s;
    ///   shorter ones made busy emulated guests retransmit needlessly). A dead or
    ///   unreachable peer fails the connection within 3 intervals. RC cannot tell frames
    ///   waiting in a congested queue from a dead peer: a network whose queues can hold a
    ///   connection's frames for longer than those 7 tries needs a longer interval. Between
    ///   two emulated Soft-RoCE guests, 256 connections sending at once queued frames for
    ///   1.6 s (3.6 s with the host busy) and failed connections with the default; their
    ///   tests use 8 s (7 tries of 1.07 s). On a real fabric the same burst drains in
    ///   milliseconds.
    /// - TCP: keepalive after an idle interval (whole seconds), 3 probes an interval apart:
    ///   an idle connection fails within 4 intervals. One with data unacknowledged fails at
    ///   TCP's retransmission limit (`tcp_retries2`, minutes): `TCP_USER_TIMEOUT` would
    ///   shorten that, but Linux counts a zero window against it, cutting off peers that
    ///   are merely slow to read.
    ///
    /// Every pending request of a connection that fails this way completes with
    /// [`crate::Status::ConnectionClosed`].
    pub fn keepalive(&self) -> Duration {
        self.keepalive.value
    }

    /// How many connections a listener holds at once while their handshake arrives
    /// (`RDMX_MAX_PENDING_HANDSHAKES`, default 4096). A connection taken by a listener has
    /// the connect timeout ([`Config::connect_timeout`]) for its handshake to arrive, and is
    /// closed if it has not; one more than this closes the oldest pending one. Each pending
    /// connection holds a descriptor and under 1 KiB. See "Bounds" in the crate docs.
    pub fn max_pending_handshakes(&self) -> usize {
        self.max_pending_handshakes.value as usize
    }

    /// Bytes a worker holds for messages that arrived before a matching receive
    /// (`RDMX_MAX_UNEXPECTED`, default 64 MiB, 0 to 1 TiB): their eager payloads, and 64
    /// bytes per message (rendezvous ones included). Past it, the credit of each frame that
    /// arrives unexpected from a peer holding more than its share (an equal part per
    /// endpoint) is withheld, so that peer's sends wait on credit instead of the worker
    /// growing (as an MPI library stops buffering eager messages); its ATS, RMA replies and
    /// credit updates still go, and its credits come back as the application receives.
    /// Messages that match posted receives are never held back. What the worker may hold:
    /// twice the budget (the budget, then what peers below their share add) and a window
    /// of eager frames per peer ([`Config::credits`] × the eager threshold over RDMA and
    /// TCP, 1024 × 16 KiB over shared memory) — see [`crate::WorkerStats::unexpected_bytes`].
    /// A peer that sends on regardless is a protocol error and its endpoint fails. Messages
    /// of an endpoint gone stay queued until received and count against the others' shares:
    /// a peer that reconnects gets no fresh share, each connection adding at most what its
    /// initial window carries.
    ///
    /// An application that receives a peer's later message before earlier ones that arrived
    /// unexpected needs those to fit in the peer's share, or the peer waits for ever, as it
    /// would for an MPI library's eager buffers; raise it for such patterns.
    pub fn max_unexpected(&self) -> u64 {
        self.max_unexpected.value
    }

    /// How long a rendezvous send (above the eager threshold) waits for its receiver to read
    /// it (`RDMX_RNDV_TIMEOUT_MS`; zero, the default: for ever, as in UCP). Counted from the
    /// RTS leaving to the receiver's ATS: a send not read by then fails with
    /// [`crate::Status::TimedOut`], and its buffer is no longer exposed to the peer: over TCP
    /// a later READ is refused (the receive fails with [`crate::Status::ReadFailed`]); over
    /// RDMA the registration or window is revoked, and a READ in flight or made later fails
    /// at the NIC, which breaks that connection (its requests fail with
    /// [`crate::Status::ConnectionClosed`]); over shared memory the peer reads this
    /// process's memory itself (CMA), which cannot be refused, so the worker keeps the
    /// buffer (the error hands back an empty one) until the endpoint closes. A late ATS is
    /// ignored and the endpoint stays up. `TimedOut` says the sender gave up, not that the
    /// receiver got nothing: a READ the sender's TCP link was already answering, or one by
    /// CMA, still delivers the message.
    ///
    /// A receiver that posts its receive late or reads slowly is legitimate (MPI, UCP): set
    /// it well above the longest the application's receivers may take to post their
    /// receives and read the largest message, or a slow receiver's message is lost to it.
    pub fn rndv_timeout(&self) -> Duration {
        self.rndv_timeout.value
    }

    /// The RC ACK timeout exponent (4.096 µs × 2^e per try) that the keepalive implies:
    /// 7 tries within an interval, between 12 (17 ms) and 20 (4.3 s); `None` (rdmacm's
    /// default) without a keepalive.
    pub(crate) fn rc_ack_timeout(&self) -> Option<u8> {
        let interval = self.keepalive.value;
        if interval.is_zero() {
            return None;
        }
        let per_try_us = interval.as_secs_f64() * 1e6 / 7.0;
        let exponent = (per_try_us / 4.096).log2().floor();
        Some(exponent.clamp(12.0, 20.0) as u8)
    }

    /// Every knob with its value and source.
    pub fn entries(&self) -> Vec<Entry> {
        fn e<T>(var: &'static str, s: &Setting<T>, value: String, help: &'static str) -> Entry {
            Entry {
                var,
                value,
                source: s.source,
                help,
            }
        }
        let c = self;
        // Values that differ between the transports in use: "8152 (tcp 65496)".
        let per_transport = |of: &dyn Fn(Transport) -> u64| {
            let ts = c.transports_or_rdma();
            let first = of(ts[0]);
            let mut text = first.to_string();
            for &t in &ts[1..] {
                if of(t) != first {
                    text += &format!(" ({t} {})", of(t));
                }
            }
            text
        };
        vec![
            e(
                EAGER_THRESHOLD_VAR,
                &c.eager_threshold,
                per_transport(&|t| c.eager_threshold_for(t)),
                "largest message sent eagerly (bytes); larger ones use rendezvous",
            ),
            e(
                RECV_BUF_SIZE_VAR,
                &c.recv_buf_size,
                per_transport(&|t| c.recv_buf_size_for(t).into()),
                "size of each receive buffer (RDMA: on the SRQ; TCP: largest frame) (bytes)",
            ),
            e(
                SRQ_DEPTH_VAR,
                &c.srq_depth,
                c.srq_depth.value.to_string(),
                "receive buffers on each worker's SRQ, shared by all its eps",
            ),
            e(
                CREDITS_VAR,
                &c.credits,
                c.credits.value.to_string(),
                "frames a peer may have in flight to a worker",
            ),
            e(
                SEND_BUFS_VAR,
                &c.send_bufs,
                c.send_bufs.value.to_string(),
                "registered send buffers a worker starts with",
            ),
            e(
                WAIT_MODE_VAR,
                &c.wait_mode,
                c.wait_mode.value.to_string(),
                "poll (spin) or event (sleep on completion channels)",
            ),
            e(
                PROGRESS_THREAD_VAR,
                &c.progress_thread,
                u8::from(c.progress_thread.value).to_string(),
                "1: each worker has a progress thread",
            ),
            e(
                SHM_CMA_VAR,
                &c.shm_cma,
                u8::from(c.shm_cma.value).to_string(),
                "1: shared-memory rendezvous reads by CMA where allowed; 0: copies through the segment",
            ),
            e(
                RAISE_NOFILE_VAR,
                &c.raise_nofile,
                u8::from(c.raise_nofile.value).to_string(),
                "1: a context raises the process's soft descriptor limit to the hard limit",
            ),
            e(
                DEVICE_VAR,
                &c.device,
                c.device
                    .value
                    .clone()
                    .unwrap_or_else(|| "(by address)".into()),
                "RDMA device; unset: the device of the first address used",
            ),
            e(
                RNDV_REG_VAR,
                &c.rndv_registration,
                c.rndv_registration.value.to_string(),
                "rendezvous memory: auto, per-op registration or registration cache",
            ),
            e(
                RCACHE_SIZE_VAR,
                &c.rcache_bytes,
                c.rcache_bytes.value.to_string(),
                "bytes the registration cache may keep registered",
            ),
            e(
                RNDV_CHUNK_VAR,
                &c.rndv_chunk,
                per_transport(&|t| c.rndv_chunk_for(t)),
                "bytes per READ of a rendezvous (smaller for lossy links; shm's are 1 MiB)",
            ),
            e(
                TRANSPORT_VAR,
                &c.transport,
                Transport::list_string(&c.transport.value),
                "auto (shm for peers on this host, rdma for peers a device reaches, tcp for others), or a list: rdma,tcp, shm,tcp",
            ),
            e(
                CONNECT_TIMEOUT_VAR,
                &c.connect_timeout,
                c.connect_timeout.value.as_millis().to_string(),
                "how long connect and accept wait (ms)",
            ),
            e(
                KEEPALIVE_VAR,
                &c.keepalive,
                c.keepalive.value.as_millis().to_string(),
                "how often idle connections check their peer is alive (ms; 0: never)",
            ),
            e(
                MAX_PENDING_HANDSHAKES_VAR,
                &c.max_pending_handshakes,
                c.max_pending_handshakes.value.to_string(),
                "connections a listener holds while their handshake arrives (more: the oldest is closed)",
            ),
            e(
                MAX_UNEXPECTED_VAR,
                &c.max_unexpected,
                c.max_unexpected.value.to_string(),
                "bytes held for unexpected messages before their senders wait on credit",
            ),
            e(
                RNDV_TIMEOUT_VAR,
                &c.rndv_timeout,
                c.rndv_timeout.value.as_millis().to_string(),
                "how long a rendezvous send waits to be read (ms; 0: for ever)",
            ),
        ]
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in self.entries() {
            writeln!(
                f,
                "{:<26} {:<14} {:<12} {}",
                e.var, e.value, e.source, e.help
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
