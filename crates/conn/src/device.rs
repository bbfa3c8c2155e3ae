//! RDMA devices as rdmacm sees them.
//!
//! rdmacm opens each device once and binds every `rdma_cm_id` to that context; a protection
//! domain used with rdmacm connections must therefore be allocated on rdmacm's own context
//! (from `rdma_get_devices`), not on a second `ibv_open_device` of the same device.

use std::ffi::CStr;
use std::net::IpAddr;
use std::sync::Arc;

use rdmx_sys as sys;

use crate::addr::SockAddrStorage;
use crate::{Error, Result};

/// rdmacm's device list. Holding it keeps every listed context open (`rdma_get_devices` takes
/// a reference that `rdma_free_devices` returns).
struct DeviceList {
    list: *mut *mut sys::ibv_context,
    len: usize,
}

// SAFETY: the list is an immutable array of context pointers; verbs contexts are thread-safe.
unsafe impl Send for DeviceList {}
// SAFETY: as above; nothing mutates the array after rdma_get_devices returns it.
unsafe impl Sync for DeviceList {}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: list came from rdma_get_devices and is released exactly once.
        unsafe { sys::rdma_free_devices(self.list) }
    }
}

/// One RDMA device (an `ibv_context` owned by rdmacm). Cheap to clone; it keeps the context open.
#[derive(Clone)]
pub struct Device {
    list: Arc<DeviceList>,
    index: usize,
}

/// The state of one device port, from `ibv_query_port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (1-based).
    pub port: u8,
    /// Port state, e.g. `"ACTIVE"`, `"DOWN"`.
    pub state: &'static str,
    /// Active MTU in bytes.
    pub active_mtu: u32,
    /// Link layer, e.g. `"Ethernet"` for RoCE, `"InfiniBand"`.
    pub link_layer: &'static str,
}

/// Device limits that matter to rdmx, from `ibv_query_device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Maximum work requests per QP.
    pub max_qp_wr: u32,
    /// Maximum completion queue entries.
    pub max_cqe: u32,
    /// Maximum work requests per SRQ.
    pub max_srq_wr: u32,
    /// Maximum scatter/gather entries per work request.
    pub max_sge: u32,
    /// Maximum outstanding RDMA READs a QP may issue.
    pub max_qp_init_rd_atom: u32,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
    /// Whether the device supports type-2 memory windows ([`crate::MemoryWindow`]).
    pub memory_windows: bool,
    /// The vendor's IEEE OUI (`ibv_device_attr::vendor_id`).
    pub vendor_id: u32,
}

impl DeviceLimits {
    /// The vendor id Soft-RoCE (the kernel's `rdma_rxe`) reports (`RXE_VENDOR_ID`).
    pub const SOFT_ROCE_VENDOR_ID: u32 = 0xff_ffff;

    /// Whether the device is Soft-RoCE (`rdma_rxe`), whose quirks rdmx works around.
    pub fn is_soft_roce(&self) -> bool {
        self.vendor_id == Self::SOFT_ROCE_VENDOR_ID
    }
}

impl Device {
    /// Lists the devices rdmacm can use. An empty list (not an error) means this machine has no
    /// RDMA device or no `rdma_cm` kernel support.
    pub fn list() -> Result<Vec<Device>> {
        let mut n = 0;
        // SAFETY: n is a valid out-pointer; the returned list is owned by the DeviceList below.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        if list.is_null() {
            // librdmacm returns NULL (errno ENODEV) when /dev/infiniband/rdma_cm is missing: no
            // devices. It says the same when it cannot scan the devices for want of a
            // descriptor (it opens sysfs directories each time): that is an error.
            if let Some(errno) = crate::error::out_of_descriptors() {
                return Err(Error::new(
                    "rdma_get_devices",
                    errno,
                    "cannot list the RDMA devices",
                ));
            }
            return Ok(Vec::new());
        }
        let list = Arc::new(DeviceList {
            list,
            len: n.max(0) as usize,
        });
        Ok((0..list.len)
            .map(|index| Device {
                list: list.clone(),
                index,
            })
            .collect())
    }

    /// Finds a device by its name (e.g. `"rxe0"`, `"mlx5_0"`).
    pub fn by_name(name: &str) -> Result<Device> {
        let devices = Device::list()?;
        let names: Vec<String> = devices.iter().map(|d| d.name()).collect();
        devices
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| {
                Error::new(
                    "rdma_get_devices",
                    libc::ENODEV,
                    format!("no RDMA device named {name:?} (found: {names:?})"),
                )
            })
    }

    /// The device that owns a local IP address, found by binding a throwaway rdmacm id to it.
    pub fn for_local_addr(ip: IpAddr) -> Result<Device> {
        let channel_and_id = crate::channel::RawId::create("rdma_bind_addr")?;
        let mut storage = SockAddrStorage::default();
        storage.set(std::net::SocketAddr::new(ip, 0));
        // SAFETY: the id is valid and storage holds a socket address that outlives the call.
        let ret = unsafe { sys::rdma_bind_addr(channel_and_id.id(), storage.as_mut_ptr().cast()) };
        if ret != 0 {
            return Err(Error::last_os(
                "rdma_bind_addr",
                format!("no RDMA device has the address {ip}"),
            ));
        }
        // SAFETY: a bound id's verbs field is rdmacm's context for the device owning the address.
        let ctx = unsafe { (*channel_and_id.id()).verbs };
        Device::from_context(ctx)?.ok_or_else(|| {
            Error::new(
                "rdma_bind_addr",
                libc::ENODEV,
                format!("{ip} is not on an RDMA device"),
            )
        })
    }

    /// The device a connection to `dst` (resolved for [`crate::Side::Active`]) would use: the
    /// one rdmacm's route resolution picks (bounded by its 2 s address and route timeouts).
    pub fn for_route(dst: &crate::AddrInfo) -> Result<Device> {
        if dst.side() != crate::Side::Active {
            return Err(Error::invalid(
                "rdma_create_ep",
                format!("{dst} was resolved for listening, not for connecting"),
            ));
        }
        let mut id = std::ptr::null_mut();
        // SAFETY: dst's list is valid; with no PD and no QP attributes rdma_create_ep only
        // resolves the address and route. The id is destroyed below, once its device is known.
        let ret = unsafe {
            sys::rdma_create_ep(
                &mut id,
                dst.as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if ret != 0 {
            return Err(Error::last_rdmacm(
                "rdma_create_ep",
                format!("cannot resolve a route to {dst}"),
            ));
        }
        // SAFETY: a resolved id's verbs field is rdmacm's context of the route's device.
        let ctx = unsafe { (*id).verbs };
        let device = Device::from_context(ctx);
        // SAFETY: id came from rdma_create_ep above, has no QP, and is destroyed once.
        unsafe { sys::rdma_destroy_ep(id) };
        device?.ok_or_else(|| {
            Error::new(
                "rdma_create_ep",
                libc::ENODEV,
                format!("the route to {dst} uses no RDMA device"),
            )
        })
    }

    /// The device whose context is `ctx` (one of rdmacm's), if it is in rdmacm's list; an
    /// error when the list cannot be had.
    pub(crate) fn from_context(ctx: *mut sys::ibv_context) -> Result<Option<Device>> {
        if ctx.is_null() {
            return Ok(None);
        }
        Ok(Device::list()?.into_iter().find(|d| d.context() == ctx))
    }

    pub(crate) fn context(&self) -> *mut sys::ibv_context {
        // SAFETY: index < len, and the list holds len valid context pointers while it lives.
        unsafe { *self.list.list.add(self.index) }
    }

    /// The device's name, e.g. `"rxe0"`.
    pub fn name(&self) -> String {
        // SAFETY: the context is open while self lives; ibv_get_device_name returns a pointer to
        // a NUL-terminated name owned by the device.
        let name = unsafe { sys::ibv_get_device_name((*self.context()).device) };
        if name.is_null() {
            return String::from("?");
        }
        // SAFETY: checked non-NULL above; the string lives as long as the device.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// The device's limits.
    pub fn limits(&self) -> Result<DeviceLimits> {
        let mut attr = sys::ibv_device_attr::default();
        // SAFETY: the context is open and attr is a valid out-pointer.
        let ret = unsafe { sys::ibv_query_device(self.context(), &mut attr) };
        if ret != 0 {
            return Err(Error::from_ret(
                "ibv_query_device",
                ret,
                format!("cannot query device {}", self.name()),
            ));
        }
        let clamp = |v: i32| v.max(0) as u32;
        Ok(DeviceLimits {
            max_qp_wr: clamp(attr.max_qp_wr),
            max_cqe: clamp(attr.max_cqe),
            max_srq_wr: clamp(attr.max_srq_wr),
            max_sge: clamp(attr.max_sge),
            max_qp_init_rd_atom: clamp(attr.max_qp_init_rd_atom),
            phys_port_cnt: attr.phys_port_cnt,
            memory_windows: attr.max_mw > 0
                && attr.device_cap_flags
                    & (sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0
                        | sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0)
                    != 0,
            vendor_id: attr.vendor_id,
        })
    }

    /// The IP addresses in the device's GID tables, with the port each is on: what a RoCE
    /// device answers to (IPv4 addresses appear as IPv4-mapped GIDs). Link-local IPv6 GIDs are
    /// left out, and so is InfiniBand, whose GIDs are not IP addresses (its IP address is on
    /// the IPoIB interface).
    pub fn ip_addrs(&self) -> Result<Vec<(u8, IpAddr)>> {
        let ports = self.ports()?;
        let mut entries = vec![sys::ibv_gid_entry::default(); 512];
        // SAFETY: the context is open; entries is a writable array of entries.len() elements.
        let n = unsafe {
            sys::ibv_query_gid_table(self.context(), entries.as_mut_ptr(), entries.len(), 0)
        };
        if n < 0 {
            return Err(Error::from_ret(
                "ibv_query_gid_table",
                n as i32,
                format!("cannot read the GID table of {}", self.name()),
            ));
        }
        let mut addrs = Vec::new();
        for e in entries.iter().take(n as usize) {
            let port = e.port_num as u8;
            let roce = ports
                .iter()
                .any(|p| p.port == port && p.link_layer == "Ethernet");
            // SAFETY: every bit pattern of the union is a valid byte array.
            let raw = unsafe { e.gid.raw };
            let v6 = std::net::Ipv6Addr::from(raw);
            let addr = match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None if v6.segments()[0] & 0xffc0 == 0xfe80 || v6.is_unspecified() => continue,
                None => IpAddr::V6(v6),
            };
            if roce && !addrs.contains(&(port, addr)) {
                addrs.push((port, addr));
            }
        }
        Ok(addrs)
    }

    /// The state of every port (through `___ibv_query_port`, what the `ibv_query_port` macro calls).
    pub fn ports(&self) -> Result<Vec<PortInfo>> {
        let count = self.limits()?.phys_port_cnt;
        (1..=count)
            .map(|port| {
                let mut attr = sys::ibv_port_attr::default();
                // SAFETY: the context is open, port is in range and attr is a valid out-pointer.
                let ret = unsafe { sys::___ibv_query_port(self.context(), port, &mut attr) };
                if ret != 0 {
                    return Err(Error::from_ret(
                        "ibv_query_port",
                        ret,
                        format!("cannot query port {port} of {}", self.name()),
                    ));
                }
                Ok(PortInfo {
                    port,
                    state: port_state_name(attr.state),
                    active_mtu: mtu_bytes(attr.active_mtu),
                    link_layer: match u32::from(attr.link_layer) {
                        l if l == sys::IBV_LINK_LAYER_ETHERNET.0 => "Ethernet",
                        l if l == sys::IBV_LINK_LAYER_INFINIBAND.0 => "InfiniBand",
                        _ => "unspecified",
                    },
                })
            })
            .collect()
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.context() == other.context()
    }
}

impl Eq for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Device").field(&self.name()).finish()
    }
}

fn port_state_name(state: sys::ibv_port_state) -> &'static str {
    match state {
        sys::ibv_port_state::IBV_PORT_DOWN => "DOWN",
        sys::ibv_port_state::IBV_PORT_INIT => "INIT",
        sys::ibv_port_state::IBV_PORT_ARMED => "ARMED",
        sys::ibv_port_state::IBV_PORT_ACTIVE => "ACTIVE",
        sys::ibv_port_state::IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER",
        _ => "UNKNOWN",
    }
}

fn mtu_bytes(mtu: sys::ibv_mtu) -> u32 {
    match mtu.0 {
        1..=5 => 128 << mtu.0,
        _ => 0,
    }
}
