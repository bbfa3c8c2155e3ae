//! Listening and connecting: each transport in use, one connection-setup path.

use super::accepting::{PendingAccept, Started, Waiting};
use super::*;
use crate::listener::{reject_with, RawRequest};
#[cfg(feature = "rdma")]
use crate::transport::rdma::{Rdma, RdmaLink};
use crate::transport::shm::setup::{self as shm_setup, Accepting, Answer, Offer};
use crate::transport::shm::{ShmLink, ShmParts};

impl Worker {
    /// Listens at `addr` (`"host:port"`; port 0 picks a free port, see
    /// [`Listener::local_addr`]) on each transport in use: TCP, and RDMA where `addr` is an
    /// RDMA device's address (rdmacm's port space is separate from TCP's, so both listen at
    /// the same port). Where RDMA is the only transport, an address on no RDMA device is an
    /// error.
    pub fn listen(&self, addr: &str) -> Result<Listener> {
        let sh = &self.driver;
        let mut tcp = None;
        let mut addr = addr.to_string();
        // (Shared-memory connections are set up over TCP.)
        if sh.transports.contains(&Transport::Tcp) || sh.transports.contains(&Transport::Shm) {
            let mut l = rdmx_tcp::Listener::bind(&addr)?;
            // Each connection taken has the connect timeout for its handshake to arrive.
            l.set_handshake_timeout(sh.cfg.connect_timeout());
            l.set_max_pending(sh.cfg.max_pending_handshakes());
            if let Some(bound) = l.local_addr() {
                addr = bound.to_string();
            }
            tcp = Some(l);
        }
        #[cfg(feature = "rdma")]
        {
            let rdma = match sh.transports.contains(&Transport::Rdma) {
                false => None,
                true => match self.listen_rdma(&addr) {
                    Ok(l) => Some(l),
                    Err(e) if tcp.is_some() => {
                        log::info!("listening at {addr} over TCP only: {e}");
                        None
                    }
                    Err(e) => return Err(e),
                },
            };
            Listener::new(self.clone(), rdma, tcp)
        }
        #[cfg(not(feature = "rdma"))]
        Listener::new(self.clone(), tcp)
    }

    #[cfg(feature = "rdma")]
    pub(super) fn listen_rdma(&self, addr: &str) -> Result<rdmx_conn::Listener> {
        let info = AddrInfo::resolve(addr, Side::Passive)?;
        // (Requests not yet taken: as many as TCP handshakes may wait.)
        let backlog = i32::try_from(self.driver.cfg.max_pending_handshakes()).unwrap_or(i32::MAX);
        let listener = rdmx_conn::Listener::bind(&info, backlog)?;
        match listener.device()? {
            Some(device) => {
                self.driver.rdma_on(&device)?;
            }
            None if self.driver.ifaces.rdma.get().is_some() => {}
            None => {
                return Err(Error::Invalid(format!(
                    "{addr} is not on an RDMA device; listen on a device's address or set \
                     RDMX_DEVICE"
                )))
            }
        }
        Ok(listener)
    }

    /// Connects to a listener at `addr` (`"host:port"`) over the first transport in use that
    /// reaches it (RDMA when a device routes to `addr` and the peer listens there, else the
    /// next), waiting at most the configured connect timeout (`RDMX_CONNECT_TIMEOUT_MS`) per
    /// transport. Nobody listening, a rejection or an unreachable address is an error naming
    /// the address.
    pub fn connect(&self, addr: &str) -> Result<Ep> {
        let sh = &self.driver;
        let mut failure = None;
        for (i, &transport) in sh.transports.iter().enumerate() {
            let last = i + 1 == sh.transports.len();
            // Shared memory is offered only to an address of this host, unless it is all
            // there is to try: to another host, the next transport goes first.
            if transport == Transport::Shm && !last && !is_this_host(addr) {
                log::debug!("{addr} is not an address of this host: not offering shared memory");
                continue;
            }
            match self.connect_over(transport, addr) {
                Ok(ep) => return Ok(ep),
                // A peer that refused us on purpose is not asked again another way.
                Err(e) if last || matches!(e, Error::Rejected { .. }) => return Err(e),
                Err(e) => {
                    log::info!("connecting to {addr} over {transport}: {e}; trying the next");
                    failure.get_or_insert(e);
                }
            }
        }
        Err(failure.unwrap_or_else(|| Error::Invalid("no transport to connect with".into())))
    }

    pub(super) fn connect_over(&self, transport: Transport, addr: &str) -> Result<Ep> {
        let sh = &self.driver;
        let (handshake, limits) = sh.local_handshake(transport);
        let timeout = sh.cfg.connect_timeout();
        let id = sh.new_conn_id();
        let link: Box<dyn TransportLink> = match transport {
            Transport::Tcp => {
                let link = rdmx_tcp::connect(addr, &handshake, timeout)
                    .map_err(|e| rejected(addr, e.reject_data()).unwrap_or_else(|| e.into()))?;
                Box::new(sh.ifaces.tcp.link(id, link, &sh.cfg))
            }
            Transport::Shm => return self.connect_shm(addr),
            Transport::Rdma | Transport::Auto => sh.rdma_connect(id, addr, &handshake, timeout)?,
            #[cfg(test)]
            Transport::Memory => {
                return Err(Error::Invalid(
                    "in-memory connections are made with Worker::connect_in_memory".into(),
                ))
            }
        };
        self.admitted(id, limits, link, addr)
    }

    /// Accepts a connection request and waits for its setup to end, on this one peer (up to
    /// the connect timeout): [`Worker::accept_start`], then [`PendingAccept::wait`].
    pub(crate) fn accept_request(&self, req: RawRequest) -> Result<Ep> {
        match self.accept_start(req)? {
            Started::Ep(ep) => Ok(ep),
            Started::Pending(p) => p.wait(self.driver.cfg.connect_timeout()),
        }
    }

    /// Accepts a connection request without waiting on its peer: the engine admits the
    /// peer first (an incompatible peer, or one more endpoint than the worker can feed, is
    /// rejected with the reason), then the connection is answered with this side's
    /// handshake. A TCP connection is an endpoint then; one that waits on its peer — over
    /// RDMA for its last CM message (the RTU), over shared memory for the connector's
    /// doorbell — is a [`PendingAccept`].
    pub(crate) fn accept_start(&self, req: RawRequest) -> Result<Started> {
        let sh = &self.driver;
        #[cfg(feature = "rdma")]
        let rdma = match &req {
            RawRequest::Rdma(r) => match sh.ifaces.rdma.get() {
                // (Compared without listing the devices, which takes descriptors.)
                Some(rdma) if r.is_on(&rdma.device) => Ok(Some(rdma)),
                Some(rdma) => Err(Error::Invalid(format!(
                    "the request arrived on another device than this worker's {}; use one \
                     worker per device",
                    rdma.device.name()
                ))),
                None => r
                    .device()
                    .map_err(Error::from)
                    .and_then(|device| sh.rdma_on(&device).map(Some)),
            },
            RawRequest::Tcp(_) => Ok(None),
        };
        #[cfg(feature = "rdma")]
        let rdma = match rdma {
            Ok(r) => r,
            Err(e) => return Err(reject_with(req, e)),
        };
        let id = sh.new_conn_id();
        // A TCP request may offer shared memory: taken (the segment handed over before the
        // TCP ACCEPT), declined with the reason (the connection stays TCP), or refused.
        let mut transport = req.transport();
        let mut shm: Option<std::result::Result<Accepting, String>> = None;
        if let RawRequest::Tcp(r) = &req {
            let offer = match Offer::decode(shm_setup::split(r.private_data()).1) {
                Ok(o) => o,
                Err(e) => return Err(reject_with(req, Error::Invalid(e))),
            };
            match offer {
                Some(offer) if sh.transports.contains(&Transport::Shm) => {
                    let started = sh
                        .ifaces
                        .shm
                        .on(&sh.registry, sh.never_sleeps())
                        .map_err(|e| e.to_string())
                        .and_then(|shared| {
                            Accepting::start(
                                shared,
                                &offer,
                                sh.cfg.connect_timeout(),
                                sh.cfg.shm_cma(),
                            )
                        });
                    if started.is_ok() {
                        transport = Transport::Shm;
                    }
                    // (Its steps' errors are text: where descriptors ran out, say so.)
                    shm = Some(started.map_err(|e| e + &crate::fd_limit::suffix_if_exhausted()));
                }
                Some(_) => shm = Some(Err("this worker does not use shared memory".into())),
                None => {}
            }
            let tcp_allowed = sh.transports.contains(&Transport::Tcp);
            match &shm {
                Some(Err(why)) if !tcp_allowed => {
                    let e = Error::Invalid(format!("shared memory is not possible: {why}"));
                    return Err(reject_with(req, e));
                }
                None if !tcp_allowed => {
                    let e = Error::Invalid(
                        "this worker takes shared-memory connections only (RDMX_TRANSPORT)".into(),
                    );
                    return Err(reject_with(req, e));
                }
                _ => {}
            }
        }
        let peer = req.peer_addr();
        let who = format!("{peer:?} asked");
        let (ours, limits) = sh.local_handshake(transport);
        if let Err(e) = sh.admit(id, limits, req.private_data(), &who) {
            return Err(reject_with(req, e));
        }
        // Admitted: from here a failure (or a pending accept dropped) undoes that.
        let pending = |waiting| Box::new(PendingAccept::new(self.clone(), id, peer, waiting));
        let tcp =
            |link| -> Box<dyn TransportLink> { Box::new(sh.ifaces.tcp.link(id, link, &sh.cfg)) };
        let over_tcp = |r: rdmx_tcp::ConnectionRequest| -> Result<Answered> {
            match shm {
                None => Ok(Answered::Link(tcp(r.accept(&ours)?))),
                Some(Err(why)) => {
                    log::info!(
                        "{:?} offered shared memory; the connection stays TCP: {why}",
                        r.peer_addr()
                    );
                    let answer = Answer::Declined(why).encode();
                    Ok(Answered::Link(tcp(
                        r.accept(&shm_setup::with_ext(&ours, &answer))?
                    )))
                }
                Some(Ok(accepting)) => {
                    let answer = Answer::Accepted {
                        capacity: accepting.capacity(),
                    }
                    .encode();
                    let link = r.accept(&shm_setup::with_ext(&ours, &answer))?;
                    Ok(Answered::Pending(Waiting::Shm(Box::new((accepting, link)))))
                }
            }
        };
        #[cfg(feature = "rdma")]
        let made = match (req, rdma) {
            (RawRequest::Rdma(r), Some(rdma)) => r
                .accept_start(&rdma.qp_config, &ours)
                .map(|accepting| {
                    Answered::Pending(Waiting::Rdma {
                        accepting,
                        rdma: rdma.clone(),
                    })
                })
                .map_err(Error::from),
            (RawRequest::Tcp(r), _) => over_tcp(r),
            (RawRequest::Rdma(_), None) => Err(Error::Invalid("no RDMA resources".into())),
        };
        #[cfg(not(feature = "rdma"))]
        let made = match req {
            RawRequest::Tcp(r) => over_tcp(r),
        };
        match made {
            Ok(Answered::Link(link)) => {
                Ok(Started::Ep(Ep::new(self.clone(), sh.add_conn(id, link))))
            }
            Ok(Answered::Pending(waiting)) => Ok(Started::Pending(pending(waiting))),
            Err(e) => {
                sh.engine_down(id);
                Err(e)
            }
        }
    }
}

/// What answering a request made.
enum Answered {
    /// The connection's link: it is set up.
    Link(Box<dyn TransportLink>),
    /// What its setup waits for.
    Pending(Waiting),
}

impl Worker {
    /// The endpoint of connection `id`, once the engine admitted the peer's handshake that
    /// `link` carries (an incompatible peer is an error naming `addr`).
    fn admitted(
        &self,
        id: ConnId,
        limits: ConnLimits,
        link: Box<dyn TransportLink>,
        addr: &str,
    ) -> Result<Ep> {
        let sh = &self.driver;
        sh.admit(
            id,
            limits,
            link.peer_private_data(),
            &format!("{addr} accepted"),
        )?;
        Ok(Ep::new(self.clone(), sh.add_conn(id, link)))
    }

    /// Connects over shared memory: a TCP connection whose handshake offers it (see
    /// `transport::shm::setup`). A peer that declines keeps the connection on TCP when TCP
    /// is among this worker's transports; otherwise that is an error naming its reason.
    fn connect_shm(&self, addr: &str) -> Result<Ep> {
        let sh = &self.driver;
        let shared = sh.ifaces.shm.on(&sh.registry, sh.never_sleeps())?.clone();
        let (handshake, limits) = sh.local_handshake(Transport::Shm);
        let timeout = sh.cfg.connect_timeout();
        let id = sh.new_conn_id();
        // (Given up when dropped: the hand-over, if it came, is closed.)
        let expected = shared.hand_overs.expect(timeout);
        let offer = Offer {
            identity: shared.identity,
            token: expected.token(),
            probe: shared.probe(),
            name: shared.hand_overs.name()?.to_string(),
        };
        let private = shm_setup::with_ext(&handshake, &offer.encode());
        let tcp = rdmx_tcp::connect(addr, &private, timeout)
            .map_err(|e| rejected(addr, e.reject_data()).unwrap_or_else(|| e.into()))?;
        let answer = Answer::decode(shm_setup::split(tcp.peer_private_data()).1)
            .map_err(|e| Error::Invalid(format!("{addr} accepted with {e}")))?;
        let link = match answer {
            Some(Answer::Accepted { capacity }) => {
                let path =
                    shm_setup::connected(&shared, expected, capacity, timeout, sh.cfg.shm_cma())
                        .map_err(|e| {
                            let out = crate::fd_limit::suffix_if_exhausted();
                            Error::Invalid(format!("shared memory with {addr}: {e}{out}"))
                        })?;
                sh.shm_link(id, path, &tcp)?
            }
            other => {
                let why = match other {
                    Some(Answer::Declined(why)) => why,
                    _ => "it did not answer the offer".into(),
                };
                if !sh.transports.contains(&Transport::Tcp) {
                    return Err(Error::Invalid(format!(
                        "{addr} declined shared memory: {why}"
                    )));
                }
                log::info!("{addr} declined shared memory ({why}): the connection stays TCP");
                Box::new(sh.ifaces.tcp.link(id, tcp, &sh.cfg))
            }
        };
        self.admitted(id, limits, link, addr)
    }
}

#[cfg(test)]
impl Worker {
    /// Tests: connects this worker to `peer` (another worker of this process) through the
    /// in-memory transport, by the same admission path as connect and accept; returns this
    /// side's endpoint, the peer's, and the cable between them.
    pub(crate) fn connect_in_memory(
        &self,
        peer: &Worker,
    ) -> Result<(Ep, Ep, crate::transport::memory::Cable)> {
        let (a, b) = (&self.driver, &peer.driver);
        let (ida, idb) = (a.new_conn_id(), b.new_conn_id());
        let ((hsa, lim_a), (hsb, lim_b)) = (
            a.local_handshake(Transport::Memory),
            b.local_handshake(Transport::Memory),
        );
        a.admit(ida, lim_a, &hsb, "the in-memory peer")?;
        if let Err(e) = b.admit(idb, lim_b, &hsa, "the in-memory peer") {
            a.engine_down(ida);
            return Err(e);
        }
        let (la, lb, cable) = crate::transport::memory::pair(
            (ida, idb),
            (hsb, hsa),
            (a.ifaces.tcp.exposure_table(), b.ifaces.tcp.exposure_table()),
        )
        .map_err(|e| Error::Invalid(format!("in-memory link: {e}")))?;
        Ok((
            Ep::new(self.clone(), a.add_conn(ida, Box::new(la))),
            Ep::new(peer.clone(), b.add_conn(idb, Box::new(lb))),
            cable,
        ))
    }
}

impl Driver {
    /// The shared-memory link of connection `id` over `path`, set up inside `tcp` (whose
    /// handshake and addresses it keeps; the socket itself is closed when `tcp` is dropped).
    pub(super) fn shm_link(
        &self,
        id: ConnId,
        path: shm_setup::DataPath,
        tcp: &rdmx_tcp::Link,
    ) -> Result<Box<dyn TransportLink>> {
        let shared = self
            .ifaces
            .shm
            .get()
            .ok_or_else(|| Error::Invalid("no shared-memory resources".into()))?
            .clone();
        let parts = ShmParts {
            path,
            peer_data: shm_setup::split(tcp.peer_private_data()).0.to_vec(),
            peer_addr: tcp.peer_addr(),
            local_addr: tcp.local_addr(),
            recv_buf_size: self.cfg.recv_buf_size_for(Transport::Shm),
        };
        let link = ShmLink::new(id, parts, shared, self.ifaces.tcp.exposure_table())
            .map_err(|e| Error::os("setting the shared-memory socket up", e))?;
        log::info!(
            "{:?}: {:?} is on this host: {}",
            id,
            link.peer_addr(),
            link.data_path()
        );
        Ok(Box::new(link))
    }

    /// Connects over RDMA (the worker's device resources made on the first connection).
    #[cfg(feature = "rdma")]
    fn rdma_connect(
        &self,
        id: ConnId,
        addr: &str,
        handshake: &[u8],
        timeout: Duration,
    ) -> Result<Box<dyn TransportLink>> {
        let dst = AddrInfo::resolve(addr, Side::Active)?;
        let rdma = match self.ifaces.rdma.get() {
            Some(r) => r,
            None => self.rdma_on(&Device::for_route(&dst)?)?,
        };
        let conn = rdmx_conn::connect(&dst, &rdma.qp_config, handshake, timeout)
            .map_err(|e| rejected(addr, e.reject_data()).unwrap_or_else(|| e.into()))?;
        Ok(Box::new(RdmaLink::new(id, conn, rdma.clone())))
    }

    /// The worker's RDMA resources, created on `device` if there are none yet. When a
    /// connect or accept waiting on their event channel reads events of the worker's
    /// connections, their housekeeping is due at once (and a sleeping worker wakes for it).
    #[cfg(feature = "rdma")]
    pub(crate) fn rdma_on(&self, device: &Device) -> Result<&Arc<Rdma>> {
        let me = self.me.clone();
        let events_ready = move || {
            if let Some(sh) = me.upgrade() {
                sh.cm_due.store(true, Ordering::Release);
                sh.waker.wake();
            }
        };
        self.ifaces
            .rdma
            .on(device, &self.cfg, &self.registry, events_ready)
    }

    #[cfg(not(feature = "rdma"))]
    fn rdma_connect(
        &self,
        _: ConnId,
        addr: &str,
        _: &[u8],
        _: Duration,
    ) -> Result<Box<dyn TransportLink>> {
        Err(Error::Invalid(format!(
            "cannot connect to {addr} over RDMA: this build of rdmx has no RDMA support"
        )))
    }

    /// The engine takes a connection over `transport` whose peer sent the handshake `peer`
    /// (as `who` describes it, for errors), with that transport's limits.
    fn admit(&self, id: ConnId, limits: ConnLimits, peer: &[u8], who: &str) -> Result<()> {
        // (What follows the rdmx handshake belongs to the transport's setup.)
        let peer = Handshake::decode(shm_setup::split(peer).0)
            .map_err(|e| Error::Invalid(format!("{who} with an unusable handshake: {e}")))?;
        self.engine_up(id, &peer, limits)
    }
}

/// Whether `addr` (`host:port`) names this host: every address it resolves to can be bound
/// here (loopback, or an address of one of this host's interfaces).
fn is_this_host(addr: &str) -> bool {
    use std::net::ToSocketAddrs;
    let Ok(addrs) = addr.to_socket_addrs() else {
        return false;
    };
    let mut any = false;
    for a in addrs {
        any = true;
        if std::net::UdpSocket::bind((a.ip(), 0)).is_err() {
            return false;
        }
    }
    any
}
