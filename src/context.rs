//! The context: configuration and device selection, shared by the workers made from it.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, RndvRegistration, WaitMode};
use crate::error::{Error, Result};
use crate::transport::Transport;
use crate::worker::Worker;

/// The root of rdmx, like UCP's context: the effective configuration and the devices, from
/// which workers are made.
///
/// [`Context::new`] reads the `RDMX_*` environment variables; [`Context::builder`] overrides
/// them. [`Context::config`] shows every value and where it came from. A `Context` is a cheap
/// handle (`Clone`), `Send` and `Sync`.
///
/// ```no_run
/// # fn main() -> rdmx::Result<()> {
/// let ctx = rdmx::Context::builder()
///     .eager_threshold(4096)
///     .wait_mode(rdmx::WaitMode::Event)
///     .build()?;
/// print!("{}", ctx.config());
/// let worker = ctx.worker()?;
/// # drop(worker);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Context {
    inner: Arc<Config>,
}

impl Context {
    /// A context configured by the defaults and the environment.
    pub fn new() -> Result<Context> {
        Context::builder().build()
    }

    /// A builder whose settings override the environment.
    pub fn builder() -> ContextBuilder {
        ContextBuilder {
            lookup: Box::new(|var| std::env::var(var).ok()),
            overrides: Vec::new(),
            named: Vec::new(),
        }
    }

    /// The effective configuration, with each value's source.
    pub fn config(&self) -> &Config {
        &self.inner
    }

    /// The preferred transport in use: the first of [`Context::transports`].
    pub fn transport(&self) -> Transport {
        self.inner.resolved[0]
    }

    /// The transports in use, in order of preference: `RDMX_TRANSPORT` /
    /// [`ContextBuilder::transports`] without those this machine lacks (`auto`: shared memory
    /// for peers on this host, then RDMA when rdmacm lists a device, then TCP). A worker
    /// connects to a peer over the first one that reaches it, and listens on each.
    pub fn transports(&self) -> &[Transport] {
        &self.inner.resolved
    }

    /// Makes a worker (see [`Worker`]).
    pub fn worker(&self) -> Result<Worker> {
        Worker::new(self)
    }

    /// The RDMA devices on this machine (empty where there are none).
    #[cfg(feature = "rdma")]
    pub fn devices(&self) -> Result<Vec<rdmx_conn::Device>> {
        Ok(rdmx_conn::Device::list()?)
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("config", &self.inner)
            .finish()
    }
}

type Override = Box<dyn FnOnce(&mut Config) + Send>;
type Lookup = Box<dyn Fn(&str) -> Option<String> + Send>;

/// Builds a [`Context`]: defaults, then the environment, then these settings.
pub struct ContextBuilder {
    lookup: Lookup,
    overrides: Vec<Override>,
    named: Vec<(String, String)>,
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $ty:ty => $field:ident) => {
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.overrides.push(Box::new(move |c: &mut Config| c.$field.set(value.into())));
            self
        }
    };
}

impl ContextBuilder {
    /// Reads variables through `lookup` instead of the process environment (for tests and
    /// for embedding; `|_| None` ignores the environment).
    pub fn env_lookup(mut self, lookup: impl Fn(&str) -> Option<String> + Send + 'static) -> Self {
        self.lookup = Box::new(lookup);
        self
    }

    setter!(
        /// Largest message sent eagerly (bytes, 0..=1 MiB).
        eager_threshold: u64 => eager_threshold);
    setter!(
        /// Size of each receive buffer on the SRQ (bytes).
        recv_buf_size: u32 => recv_buf_size);
    setter!(
        /// Receive buffers on each worker's SRQ.
        srq_depth: u32 => srq_depth);
    setter!(
        /// Frames each peer may have in flight towards a worker (at least 4).
        credits: u16 => credits);
    setter!(
        /// Registered send buffers a worker starts with.
        send_bufs: u32 => send_bufs);
    setter!(
        /// How blocking calls wait.
        wait_mode: WaitMode => wait_mode);
    setter!(
        /// Whether workers get a progress thread.
        progress_thread: bool => progress_thread);
    setter!(
        /// How rendezvous memory is registered.
        rndv_registration: RndvRegistration => rndv_registration);
    setter!(
        /// Bytes the registration cache may keep registered.
        rcache_bytes: u64 => rcache_bytes);
    setter!(
        /// Bytes each RDMA READ of a rendezvous fetches; see [`crate::Config::rndv_chunk`].
        rndv_chunk: u64 => rndv_chunk);
    setter!(
        /// Whether building the context raises the process's soft descriptor limit to its
        /// hard limit; see [`crate::Config::raise_nofile`].
        raise_nofile: bool => raise_nofile);
    setter!(
        /// How long connect and accept wait.
        connect_timeout: Duration => connect_timeout);
    setter!(
        /// How often idle connections check that their peer is alive (zero: never); see
        /// [`crate::Config::keepalive`].
        keepalive: Duration => keepalive);
    setter!(
        /// Connections a listener holds at once while their handshake arrives; see
        /// [`crate::Config::max_pending_handshakes`].
        max_pending_handshakes: u32 => max_pending_handshakes);
    /// The transport: `Auto`, or the only one to use.
    pub fn transport(self, transport: Transport) -> Self {
        self.transports(&[transport])
    }

    /// The transports to use, in order of preference (as `RDMX_TRANSPORT=rdma,tcp`).
    pub fn transports(mut self, list: &[Transport]) -> Self {
        let list = list.to_vec();
        self.overrides
            .push(Box::new(move |c: &mut Config| c.transport.set(list)));
        self
    }

    /// Sets a variable by its environment name (e.g. `"RDMX_EAGER_THRESHOLD"`, `"4k"`),
    /// parsed as the environment would be but counted as a builder setting: for tools that
    /// take `VAR=VALUE` options. An unknown name or a bad value fails [`Self::build`].
    pub fn set(mut self, var: &str, value: &str) -> Self {
        self.named.push((var.to_string(), value.to_string()));
        self
    }

    /// The RDMA device to use (e.g. `"rxe0"`).
    pub fn device(mut self, name: &str) -> Self {
        let name = name.to_string();
        self.overrides
            .push(Box::new(move |c: &mut Config| c.device.set(Some(name))));
        self
    }

    /// Validates the result and makes the context.
    pub fn build(self) -> Result<Context> {
        let mut config = Config::from_lookup(self.lookup)?;
        let known: Vec<&str> = config.entries().iter().map(|e| e.var).collect();
        if let Some((var, _)) = self
            .named
            .iter()
            .find(|(v, _)| !known.contains(&v.as_str()))
        {
            return Err(Error::Config(format!(
                "unknown variable {var}; known: {}",
                known.join(", ")
            )));
        }
        let named = self.named;
        config.apply(
            |var| {
                named
                    .iter()
                    .rev()
                    .find(|(v, _)| v == var)
                    .map(|(_, x)| x.clone())
            },
            crate::config::Source::Builder,
        )?;
        for o in self.overrides {
            o(&mut config);
        }
        config.proto()?;
        if config.connect_timeout.value.is_zero() {
            return Err(Error::Config("the connect timeout must be positive".into()));
        }
        config.resolved = resolve(config.transports())?;
        config.proto()?;
        if config.raise_nofile() {
            crate::fd_limit::raise();
        }
        Ok(Context {
            inner: Arc::new(config),
        })
    }
}

/// The RDMA devices' names, or why there are none.
#[cfg(feature = "rdma")]
fn rdma_devices() -> std::result::Result<String, String> {
    match rdmx_conn::Device::list() {
        Ok(d) if !d.is_empty() => Ok(d.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")),
        Ok(_) => Err("rdmacm lists no RDMA device".to_string()),
        Err(e) => Err(format!("cannot list RDMA devices: {e}")),
    }
}

#[cfg(not(feature = "rdma"))]
fn rdma_devices() -> std::result::Result<String, String> {
    Err("this build of rdmx has no RDMA support (built without the `rdma` feature)".into())
}

/// The transports to use: the asked ones this machine has, in order (`auto`: shared memory
/// for peers on this host, then RDMA when rdmacm lists a device, then TCP). Asking only for
/// RDMA where there is none is an error.
fn resolve(asked: &[Transport]) -> Result<Vec<Transport>> {
    let found = rdma_devices();
    let asked = if asked.is_empty() || asked == [Transport::Auto] {
        match &found {
            Ok(names) => {
                log::info!("transports: shm for peers on this host, rdma (devices: {names}), tcp")
            }
            Err(why) => log::info!("transports: shm for peers on this host, tcp ({why})"),
        }
        vec![Transport::Shm, Transport::Rdma, Transport::Tcp]
    } else {
        asked.to_vec()
    };
    let usable: Vec<Transport> = asked
        .iter()
        .copied()
        .filter(|&t| t != Transport::Rdma || found.is_ok())
        .collect();
    match (usable.is_empty(), found) {
        (false, _) => Ok(usable),
        (true, Err(why)) => Err(Error::Config(format!(
            "RDMX_TRANSPORT={}, but {why}; use tcp (or auto) on this machine",
            Transport::list_string(&asked)
        ))),
        (true, Ok(_)) => Err(Error::Config("RDMX_TRANSPORT names no transport".into())),
    }
}
