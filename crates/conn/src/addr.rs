//! Address resolution with `rdma_getaddrinfo`.

use std::ffi::{CStr, CString};
use std::net::{IpAddr, SocketAddr};
use std::ptr;

use rdmx_sys as sys;

use crate::{Error, Result};

/// Which side of a connection an address is resolved for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The listening side: the address is bound and listened on (`RAI_PASSIVE`).
    Passive,
    /// The connecting side: the address is the destination.
    Active,
}

/// The result of `rdma_getaddrinfo`: everything `rdma_create_ep` needs for one address
/// (reliable-connected QPs, TCP port space).
pub struct AddrInfo {
    raw: *mut sys::rdma_addrinfo,
    side: Side,
    text: String,
}

// SAFETY: the rdma_addrinfo list is plain heap data owned exclusively by this value; librdmacm
// keeps no reference to it, so it may move to and be read from any thread.
unsafe impl Send for AddrInfo {}
// SAFETY: shared access only reads the list.
unsafe impl Sync for AddrInfo {}

impl AddrInfo {
    /// Resolves `"host:port"` (`"[v6addr]:port"` for IPv6 literals). For [`Side::Passive`] the
    /// host may be empty (`":7471"`), meaning every local address.
    pub fn resolve(host_port: &str, side: Side) -> Result<Self> {
        let (host, port) = split_host_port(host_port)?;
        Self::resolve_parts(host, port, side, false, None)
    }

    /// Resolves a socket address without any name lookup.
    pub fn from_socket_addr(addr: SocketAddr, side: Side) -> Result<Self> {
        Self::resolve_parts(&addr.ip().to_string(), addr.port(), side, true, None)
    }

    /// Resolves an active-side destination that connects from the given local address (which
    /// selects the local RDMA device).
    pub fn connect_from(dst: SocketAddr, src: IpAddr) -> Result<Self> {
        Self::resolve_parts(
            &dst.ip().to_string(),
            dst.port(),
            Side::Active,
            true,
            Some(src),
        )
    }

    fn resolve_parts(
        host: &str,
        port: u16,
        side: Side,
        numeric: bool,
        src: Option<IpAddr>,
    ) -> Result<Self> {
        let text = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let c_host = CString::new(host).map_err(|_| {
            Error::invalid(
                "rdma_getaddrinfo",
                format!("host in {text:?} contains a NUL byte"),
            )
        })?;
        let c_port = CString::new(port.to_string()).expect("digits have no NUL");
        let mut hints = sys::rdma_addrinfo {
            ai_port_space: sys::rdma_port_space::RDMA_PS_TCP.0 as i32,
            ai_qp_type: sys::ibv_qp_type::IBV_QPT_RC.0 as i32,
            ..Default::default()
        };
        if side == Side::Passive {
            hints.ai_flags |= sys::RAI_PASSIVE as i32;
        }
        if numeric {
            hints.ai_flags |= sys::RAI_NUMERICHOST as i32;
        }
        let mut src_storage = SockAddrStorage::default();
        if let Some(src) = src {
            let len = src_storage.set(SocketAddr::new(src, 0));
            hints.ai_src_addr = src_storage.as_mut_ptr().cast();
            hints.ai_src_len = len;
        }
        let node = if host.is_empty() {
            ptr::null()
        } else {
            c_host.as_ptr()
        };
        let mut raw = ptr::null_mut();
        // SAFETY: node/service are NUL-terminated strings that outlive the call, hints is a valid
        // rdma_addrinfo (with ai_src_addr pointing at storage that outlives the call), and raw is
        // a valid out-pointer; on success librdmacm hands us ownership of the list.
        let ret = unsafe { sys::rdma_getaddrinfo(node, c_port.as_ptr(), &hints, &mut raw) };
        if ret != 0 || raw.is_null() {
            // rdma_getaddrinfo returns getaddrinfo-style codes; errno carries the detail when set.
            let reason = gai_reason(ret);
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .filter(|&e| e != 0)
                .unwrap_or(libc::EHOSTUNREACH);
            return Err(Error::new(
                "rdma_getaddrinfo",
                errno,
                format!("cannot resolve {text}: {reason}"),
            ));
        }
        Ok(AddrInfo { raw, side, text })
    }

    /// The side this address was resolved for.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The destination (active side) or bind (passive side) address, when it is IPv4 or IPv6.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        // SAFETY: raw is a valid list head owned by self.
        let ai = unsafe { &*self.raw };
        let (addr, len) = match self.side {
            Side::Passive => (ai.ai_src_addr, ai.ai_src_len),
            Side::Active => (ai.ai_dst_addr, ai.ai_dst_len),
        };
        // SAFETY: librdmacm sets addr to a sockaddr of len bytes, or NULL.
        unsafe { sockaddr_to_std(addr.cast(), len as usize) }
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::rdma_addrinfo {
        self.raw
    }
}

impl std::fmt::Display for AddrInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::fmt::Debug for AddrInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddrInfo")
            .field("addr", &self.text)
            .field("side", &self.side)
            .finish()
    }
}

impl Drop for AddrInfo {
    fn drop(&mut self) {
        // SAFETY: raw came from rdma_getaddrinfo and is freed exactly once, here.
        unsafe { sys::rdma_freeaddrinfo(self.raw) }
    }
}

/// Splits `"host:port"` / `"[v6]:port"` / `":port"`.
pub fn split_host_port(s: &str) -> Result<(&str, u16)> {
    let bad = |why: &str| {
        Error::invalid(
            "rdma_getaddrinfo",
            format!("address {s:?} is not HOST:PORT: {why}"),
        )
    };
    let (host, port) = s.rsplit_once(':').ok_or_else(|| bad("no ':PORT'"))?;
    let host = match host.strip_prefix('[') {
        Some(rest) => rest.strip_suffix(']').ok_or_else(|| bad("unclosed '['"))?,
        None if host.contains(':') => {
            return Err(bad("IPv6 addresses need brackets, as in [::1]:7471"))
        }
        None => host,
    };
    let port = port
        .parse::<u16>()
        .map_err(|_| bad("the port is not a number from 0 to 65535"))?;
    Ok((host, port))
}

fn gai_reason(code: i32) -> String {
    if code == 0 {
        return "no address returned".into();
    }
    // SAFETY: gai_strerror returns a pointer to a static NUL-terminated string for any code.
    unsafe { CStr::from_ptr(libc::gai_strerror(code)) }
        .to_string_lossy()
        .into_owned()
}

/// Storage big enough for an IPv4 or IPv6 socket address, filled from a `SocketAddr`.
#[derive(Default)]
pub(crate) struct SockAddrStorage {
    storage: Storage,
}

#[repr(C)]
struct Storage(libc::sockaddr_storage);

impl Default for Storage {
    fn default() -> Self {
        // SAFETY: sockaddr_storage is plain old data for which all-zero bytes are valid.
        Storage(unsafe { std::mem::zeroed() })
    }
}

impl SockAddrStorage {
    /// Writes `addr` and returns the length of the sockaddr written.
    pub(crate) fn set(&mut self, addr: SocketAddr) -> u32 {
        let dst = &mut self.storage.0 as *mut libc::sockaddr_storage;
        match addr {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { dst.cast::<libc::sockaddr_in>().write(sin) };
                std::mem::size_of::<libc::sockaddr_in>() as u32
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                unsafe { dst.cast::<libc::sockaddr_in6>().write(sin6) };
                std::mem::size_of::<libc::sockaddr_in6>() as u32
            }
        }
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        (&mut self.storage.0 as *mut libc::sockaddr_storage).cast()
    }
}

/// Converts a C socket address into a std one.
///
/// # Safety
/// `addr` must be NULL or point to at least `len` readable bytes of a socket address (when `len`
/// is 0 the family's own size is assumed).
pub(crate) unsafe fn sockaddr_to_std(
    addr: *const libc::sockaddr,
    len: usize,
) -> Option<SocketAddr> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees addr points at a socket address; its family field comes first.
    let family = unsafe { (*addr).sa_family } as i32;
    match family {
        libc::AF_INET if len == 0 || len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: family and length say this is a sockaddr_in; read_unaligned copes with any
            // alignment of the C buffer.
            let sin = unsafe { addr.cast::<libc::sockaddr_in>().read_unaligned() };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::new(ip.into(), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 if len == 0 || len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { addr.cast::<libc::sockaddr_in6>().read_unaligned() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(ip.into(), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_host_and_port() {
        assert_eq!(
            split_host_port("192.0.2.1:7471").unwrap(),
            ("192.0.2.1", 7471)
        );
        assert_eq!(split_host_port("[::1]:80").unwrap(), ("::1", 80));
        assert_eq!(split_host_port(":9").unwrap(), ("", 9));
        assert_eq!(split_host_port("node-a:7471").unwrap(), ("node-a", 7471));
    }

    #[test]
    fn rejects_malformed_addresses_with_a_reason() {
        for bad in ["192.0.2.1", "host:port", "::1:80", "[::1:80", "h:70000"] {
            let err = split_host_port(bad).unwrap_err();
            assert_eq!(err.errno(), libc::EINVAL, "{bad}");
            assert!(err.message().contains(bad), "{err}");
        }
    }

    #[test]
    fn sockaddr_round_trip() {
        for addr in ["192.0.2.7:7471", "[2001:db8::5]:9"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let mut s = SockAddrStorage::default();
            let len = s.set(addr);
            // SAFETY: s holds a socket address of len bytes, just written.
            let back = unsafe { sockaddr_to_std(s.as_mut_ptr(), len as usize) };
            assert_eq!(back, Some(addr));
        }
    }

    #[test]
    fn unresolvable_host_is_an_error_naming_it() {
        // A name under the reserved .invalid TLD never resolves; the lookup fails without
        // reaching any server in this sandbox (no resolver is configured to answer it).
        let err = AddrInfo::resolve("no-such-host.invalid:7471", Side::Active).unwrap_err();
        assert_eq!(err.call(), "rdma_getaddrinfo");
        assert!(err.message().contains("no-such-host.invalid:7471"), "{err}");
    }
}
