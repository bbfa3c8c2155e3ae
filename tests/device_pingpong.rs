//! The ping-pong demo over RDMA (Soft-RoCE), as `scripts/demo` shows it: one process with
//! `RDMX_TRANSPORT=rdma` (`auto` would carry a one-host run over shared memory), and a server
//! and a client process. `#[ignore]`d on the host; `scripts/test`
//! runs it with `--ignored` in the guest, with `RDMX_PINGPONG_BIN` naming the program.

mod pingpong_util;

use pingpong_util::{one_line_error, pingpong_env, rows, server_and_client, start_server, text};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the device tests through scripts/test (it boots the Soft-RoCE guest)")
    })
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn one_process_over_rdma() {
    let out = pingpong_env(
        &["-s", "1,8K,1M", "-n", "10", "--no-progress"],
        &[("RDMX_TRANSPORT", "rdma")],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("# transport rdma, device rxe"), "{stdout}");
    assert!(stdout.contains("eager up to 8152 B"), "{stdout}");
    assert_eq!(
        rows(&stdout),
        vec![
            ("1 B".into(), "eager".into(), 10),
            ("8 KiB".into(), "rndv".into(), 10),
            ("1 MiB".into(), "rndv".into(), 10),
        ]
    );
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn server_and_client_processes_over_rdma() {
    let rdma = [("RDMX_TRANSPORT", "rdma")];
    let (mut server, addr) = start_server(&format!("{}:0", env("SOFTROCE_ADDR_A")), &rdma, "rdma");
    let out = pingpong_env(
        &[
            "--client", &addr, "--bw", "--window", "4", "-s", "8,64K", "-n", "8", "--json",
        ],
        &rdma,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["transport"], "rdma");
    assert_eq!(doc["mode"], "bandwidth");
    let protocols: Vec<&str> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["protocol"].as_str().unwrap())
        .collect();
    assert_eq!(protocols, ["eager", "rndv"]);
    assert!(server.0.wait().unwrap().success());
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn nobody_listening_is_one_line() {
    let addr = format!("{}:1", env("SOFTROCE_ADDR_A"));
    one_line_error(
        &pingpong_env(&["--client", &addr, "-s", "8"], &[]),
        1,
        &format!("cannot connect to {addr}"),
    );
}

/// Sets Yama's `ptrace_scope` for the test's duration, and puts the old value back.
struct PtraceScope(String);

const PTRACE_SCOPE: &str = "/proc/sys/kernel/yama/ptrace_scope";

impl PtraceScope {
    fn set(value: &str) -> PtraceScope {
        let old = std::fs::read_to_string(PTRACE_SCOPE)
            .unwrap_or_else(|e| panic!("{PTRACE_SCOPE}: {e} (the guest's kernel has Yama)"));
        std::fs::write(PTRACE_SCOPE, value).unwrap_or_else(|e| {
            panic!("setting {PTRACE_SCOPE} (the guest runs tests as root): {e}")
        });
        PtraceScope(old.trim().to_string())
    }
}

impl Drop for PtraceScope {
    fn drop(&mut self) {
        let _ = std::fs::write(PTRACE_SCOPE, &self.0);
    }
}

/// Where the kernel forbids one process to read another's memory, a shared-memory
/// connection finds out at connect and copies rendezvous data through its ring. Here the
/// kernel's own policy forbids it, as on Ubuntu's default: Yama's `ptrace_scope` 1 lets a
/// process read only its descendants, and the server and client are siblings run as an
/// unprivileged user (root's CAP_SYS_PTRACE would pass; the suite's other tests, as root,
/// are unaffected). Eager and rendezvous messages go through; the client says how.
#[test]
#[ignore = "needs root and Yama: scripts/test runs it in the Soft-RoCE guest"]
fn processes_the_kernel_forbids_to_read_each_other_copy_rendezvous_through_the_ring() {
    const NOBODY: Option<u32> = Some(65534);
    let _scope = PtraceScope::set("1");
    let shm = [("RDMX_TRANSPORT", "shm")];
    let stdout = server_and_client(
        NOBODY,
        &shm,
        "shm",
        &["-s", "8,1M", "-n", "10", "--no-progress"],
    );
    assert!(
        stdout.contains("# transport shm, rendezvous by copy (CMA refused"),
        "{stdout}"
    );
    assert_eq!(
        rows(&stdout),
        vec![
            ("8 B".into(), "eager".into(), 10),
            ("1 MiB".into(), "rndv".into(), 10),
        ]
    );
    // And as root (CAP_SYS_PTRACE), the same pair reads by CMA: the policy, not the setup,
    // made the difference.
    let stdout = server_and_client(None, &shm, "shm", &["-s", "1M", "-n", "2", "--no-progress"]);
    assert!(
        stdout.contains("# transport shm, rendezvous by CMA"),
        "{stdout}"
    );
}
