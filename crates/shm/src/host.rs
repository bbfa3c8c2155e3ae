//! Whether two processes share a host closely enough for shared memory and CMA: the same
//! kernel and boot, the same user, and the same network, pid and user namespaces. An address
//! alone says none of this (a container's 127.0.0.1 is not the host's).

use crate::{Error, Result};

/// What two processes compare at connection setup (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIdentity {
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: [u8; 16],
    /// The process's real user id (CMA reads need the same user, and the ptrace policy).
    pub uid: u32,
    /// The network namespace's inode: a peer reached at a loopback address is in this one.
    pub net_ns: u64,
    /// The pid namespace's inode: a peer's pid means the same process only inside it.
    pub pid_ns: u64,
    /// The user namespace's inode: user ids mean the same user only inside it.
    pub user_ns: u64,
}

/// Bytes of an encoded identity.
pub const IDENTITY_LEN: usize = 56;
const MAGIC: &[u8; 4] = b"RXSH";
const VERSION: u16 = 1;

impl HostIdentity {
    /// This process's identity.
    pub fn this() -> Result<HostIdentity> {
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map_err(|e| Error::io("reading the boot id", e))?;
        let boot_id = parse_boot_id(text.trim()).ok_or_else(|| Error::Malformed {
            what: "boot id",
            why: format!("{:?} is not a UUID", text.trim()),
        })?;
        let ns = |name: &'static str| -> Result<u64> {
            rustix::fs::stat(format!("/proc/self/ns/{name}"))
                .map(|st| st.st_ino)
                .map_err(|e| Error::io("reading a namespace", e))
        };
        Ok(HostIdentity {
            boot_id,
            uid: rustix::process::getuid().as_raw(),
            net_ns: ns("net")?,
            pid_ns: ns("pid")?,
            user_ns: ns("user")?,
        })
    }

    /// The identity as bytes, for a handshake.
    pub fn encode(&self) -> [u8; IDENTITY_LEN] {
        let mut b = [0u8; IDENTITY_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[8..24].copy_from_slice(&self.boot_id);
        b[24..28].copy_from_slice(&self.uid.to_le_bytes());
        b[32..40].copy_from_slice(&self.net_ns.to_le_bytes());
        b[40..48].copy_from_slice(&self.pid_ns.to_le_bytes());
        b[48..56].copy_from_slice(&self.user_ns.to_le_bytes());
        b
    }

    /// Decodes [`encode`](HostIdentity::encode)'s bytes.
    pub fn decode(b: &[u8]) -> Result<HostIdentity> {
        let bad = |why: String| Error::Malformed {
            what: "host identity",
            why,
        };
        if b.len() != IDENTITY_LEN {
            return Err(bad(format!("{} bytes, not {IDENTITY_LEN}", b.len())));
        }
        if &b[..4] != MAGIC || b[4..6] != VERSION.to_le_bytes() {
            return Err(bad("an unknown magic or version".into()));
        }
        if b[6..8] != [0, 0] || b[28..32] != [0; 4] {
            return Err(bad("reserved bytes are set".into()));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(HostIdentity {
            boot_id: b[8..24].try_into().expect("16 bytes"),
            uid: u32::from_le_bytes(b[24..28].try_into().expect("4 bytes")),
            net_ns: u64_at(32),
            pid_ns: u64_at(40),
            user_ns: u64_at(48),
        })
    }

    /// What differs between this identity and `other` (empty: shared memory can join them),
    /// for saying why a peer does not get it.
    pub fn differences(&self, other: &HostIdentity) -> Vec<&'static str> {
        let mut d = Vec::new();
        if self.boot_id != other.boot_id {
            d.push("another kernel or boot");
        }
        if self.uid != other.uid {
            d.push("another user");
        }
        if self.net_ns != other.net_ns {
            d.push("another network namespace");
        }
        if self.pid_ns != other.pid_ns {
            d.push("another pid namespace");
        }
        if self.user_ns != other.user_ns {
            d.push("another user namespace");
        }
        d
    }
}

/// A boot id's 16 bytes from its text (`8-4-4-4-12` hex digits).
fn parse_boot_id(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.bytes().filter(|&c| c != b'-').collect();
    if hex.len() != 32 || text.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_survives_encoding() {
        let me = HostIdentity::this().expect("this process's identity");
        assert_eq!(HostIdentity::decode(&me.encode()).expect("decodes"), me);
        assert!(me.differences(&me).is_empty());
        assert_ne!(me.boot_id, [0; 16]);
    }

    #[test]
    fn identities_differ_where_they_differ() {
        let me = HostIdentity::this().expect("identity");
        let other = HostIdentity {
            uid: me.uid ^ 1,
            pid_ns: me.pid_ns ^ 1,
            ..me
        };
        assert_eq!(
            me.differences(&other),
            ["another user", "another pid namespace"]
        );
    }

    #[test]
    fn malformed_identities_are_refused() {
        let good = HostIdentity::this().expect("identity").encode();
        assert!(HostIdentity::decode(&good[..55]).is_err());
        for i in [0, 4, 6, 28] {
            let mut bad = good;
            bad[i] ^= 0x80;
            assert!(HostIdentity::decode(&bad).is_err(), "byte {i}");
        }
    }

    #[test]
    fn boot_ids_parse() {
        let id = parse_boot_id("0123abcd-4567-89ef-0123-456789abcdef").expect("parses");
        assert_eq!(id[0], 0x01);
        assert_eq!(id[15], 0xef);
        assert!(parse_boot_id("0123abcd456789ef0123456789abcdef").is_none());
        assert!(parse_boot_id("0123abcd-4567-89ef-0123-456789abcdeg").is_none());
    }
}
