//! Listening and connecting: each transport in use, one connection-setup path.

use super::*;
use crate::ep::{reject_with, RawRequest};
#[cfg(feature = "rdma")]
use crate::transport::rdma::{Rdma, RdmaLink};

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
        if sh.transports.contains(&Transport::Tcp) {
            let l = rdmx_tcp::Listener::bind(&addr)?;
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
        let listener = rdmx_conn::Listener::bind(&info, 128)?;
        match listener.device() {
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
                Box::new(sh.ifaces.tcp.link(id, link, sh.cfg.keepalive()))
            }
            Transport::Rdma | Transport::Auto => sh.rdma_connect(id, addr, &handshake, timeout)?,
            #[cfg(test)]
            Transport::Memory => {
                return Err(Error::Invalid(
                    "in-memory connections are made with Worker::connect_in_memory".into(),
                ))
            }
        };
        sh.admit(
            id,
            limits,
            link.peer_private_data(),
            &format!("{addr} accepted"),
        )?;
        Ok(Ep::new(self.clone(), sh.add_conn(id, link)))
    }

    /// Accepts a connection request: the engine admits the peer first (an incompatible peer,
    /// or one more endpoint than the worker can feed, is rejected with the reason), then the
    /// link is made with this side's handshake.
    pub(crate) fn accept_request(&self, req: RawRequest) -> Result<Ep> {
        let sh = &self.driver;
        #[cfg(feature = "rdma")]
        let rdma = match &req {
            RawRequest::Rdma(r) => match r.device() {
                Some(device) => sh.rdma_on(&device).map(Some),
                None => Err(Error::Invalid(
                    "the request arrived on no known device".into(),
                )),
            },
            RawRequest::Tcp(_) => Ok(None),
        };
        #[cfg(feature = "rdma")]
        let rdma = match rdma {
            Ok(r) => r,
            Err(e) => return Err(reject_with(req, e)),
        };
        let id = sh.new_conn_id();
        let transport = req.transport();
        let who = format!("{:?} asked", req.peer_addr());
        let (ours, limits) = sh.local_handshake(transport);
        if let Err(e) = sh.admit(id, limits, req.private_data(), &who) {
            return Err(reject_with(req, e));
        }
        let tcp = |link| -> Box<dyn TransportLink> {
            Box::new(sh.ifaces.tcp.link(id, link, sh.cfg.keepalive()))
        };
        #[cfg(feature = "rdma")]
        let link = match (req, rdma) {
            (RawRequest::Rdma(r), Some(rdma)) => r
                .accept(&rdma.qp_config, &ours, sh.cfg.connect_timeout())
                .map(|conn| -> Box<dyn TransportLink> {
                    Box::new(RdmaLink::new(id, conn, rdma.clone()))
                })
                .map_err(Error::from),
            (RawRequest::Tcp(r), _) => r.accept(&ours).map(tcp).map_err(Error::from),
            (RawRequest::Rdma(_), None) => Err(Error::Invalid("no RDMA resources".into())),
        };
        #[cfg(not(feature = "rdma"))]
        let link = match req {
            RawRequest::Tcp(r) => r.accept(&ours).map(tcp).map_err(Error::from),
        };
        match link {
            Ok(link) => Ok(Ep::new(self.clone(), sh.add_conn(id, link))),
            Err(e) => {
                sh.engine_down(id);
                Err(e)
            }
        }
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

    /// The worker's RDMA resources, created on `device` if there are none yet.
    #[cfg(feature = "rdma")]
    pub(crate) fn rdma_on(&self, device: &Device) -> Result<&Arc<Rdma>> {
        self.ifaces.rdma.on(device, &self.cfg, &self.registry)
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
        let peer = Handshake::decode(peer)
            .map_err(|e| Error::Invalid(format!("{who} with an unusable handshake: {e}")))?;
        self.engine_up(id, &peer, limits)
    }
}
