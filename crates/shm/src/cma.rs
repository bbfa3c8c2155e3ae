//! Cross-memory attach: reading a peer process's memory with `process_vm_readv`, the shared-
//! memory transport's RDMA READ. The kernel allows it for a process of the same user that
//! the caller may ptrace (`/proc/sys/kernel/yama/ptrace_scope` can forbid it); a peer that
//! refuses is found at connection setup by [`probe`], and its rendezvous then takes the
//! segment's copy path.

use std::io::IoSliceMut;

use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

use crate::{Error, Result};

/// Reads `dst.len()` bytes at `addr` in process `pid` into `dst`. Fails (nothing promised
/// about `dst`) if the kernel refuses, the process is gone, or the range is not all mapped
/// in it.
pub fn read_remote(pid: i32, addr: u64, dst: &mut [u8]) -> Result<()> {
    let len = dst.len();
    let fail = |source: std::io::Error| Error::RemoteRead { pid, len, source };
    let mut done = 0;
    while done < len {
        let base = usize::try_from(addr)
            .ok()
            .and_then(|a| a.checked_add(done))
            .ok_or_else(|| fail(std::io::Error::other("the address overflows")))?;
        let remote = [RemoteIoVec {
            base,
            len: len - done,
        }];
        let n = process_vm_readv(
            Pid::from_raw(pid),
            &mut [IoSliceMut::new(&mut dst[done..])],
            &remote,
        )
        .map_err(|e| fail(e.into()))?;
        if n == 0 {
            return Err(fail(std::io::Error::other(format!(
                "only {done} bytes are mapped there"
            ))));
        }
        done += n;
    }
    Ok(())
}

/// Whether this process may read process `pid`'s memory: reads the 8 bytes at `addr`,
/// which the peer said hold `expected`. A failure, or another value
/// ([`Error::RemoteRead`] saying so), means CMA is off for that peer.
pub fn probe(pid: i32, addr: u64, expected: u64) -> Result<()> {
    let mut got = [0u8; 8];
    read_remote(pid, addr, &mut got)?;
    let got = u64::from_ne_bytes(got);
    if got != expected {
        return Err(Error::RemoteRead {
            pid,
            len: 8,
            source: std::io::Error::other(format!(
                "the probe word reads {got:#x}, not {expected:#x}"
            )),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_reads_its_own_memory() {
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        read_remote(std::process::id() as i32, src.as_ptr() as u64, &mut dst).expect("read");
        assert_eq!(src, dst);
        let word = 0x1234_5678_9abc_def0u64;
        probe(std::process::id() as i32, &word as *const u64 as u64, word).expect("probe");
        assert!(probe(std::process::id() as i32, &word as *const u64 as u64, 1).is_err());
    }

    #[test]
    fn unmapped_or_missing_memory_fails_cleanly() {
        let mut dst = [0u8; 16];
        let me = std::process::id() as i32;
        let e = read_remote(me, 8, &mut dst).expect_err("page 0 is unmapped");
        assert!(e.to_string().contains(&format!("process {me}")), "{e}");
        assert!(read_remote(me, u64::MAX - 4, &mut dst).is_err());
        // A pid no process has (pid_max is at most 2^22).
        assert!(read_remote(0x7fff_fff0, 4096, &mut dst).is_err());
    }
}
