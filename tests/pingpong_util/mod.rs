//! Running `examples/pingpong` from tests (host and guest) and reading what it prints.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The pingpong program: `$RDMX_PINGPONG_BIN` if set (the guest run, which must not build),
/// else built here.
pub fn pingpong_path() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(bin) = std::env::var_os("RDMX_PINGPONG_BIN") {
                return PathBuf::from(bin);
            }
            // target/<profile>/deps/pingpong-HASH → target/<profile>/examples/pingpong. `cargo
            // test` builds the example only as its unit-test harness, so build the program here
            // (a no-op when it is fresh) rather than run a stale one.
            let exe = std::env::current_exe().expect("test binary path");
            let dir = exe
                .parent()
                .and_then(|d| d.parent())
                .expect("target directory");
            let mut cargo = Command::new(env!("CARGO"));
            cargo
                .args(["build", "--quiet", "--example", "pingpong"])
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if dir.ends_with("release") {
                cargo.arg("--release");
            }
            let ok = cargo
                .status()
                .expect("cargo build --example pingpong")
                .success();
            assert!(ok, "building examples/pingpong failed");
            dir.join("examples").join("pingpong")
        })
        .clone()
}

pub fn pingpong_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    pingpong_as(None, args, env)
}

/// [`pingpong_env`] as the user and group `id` (`None`: as the test's own).
pub fn pingpong_as(id: Option<u32>, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(pingpong_path());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    as_user(&mut cmd, id);
    cmd.output().expect("run pingpong")
}

/// Runs `cmd` as the user and group `id`, if given (the test must be root).
fn as_user(cmd: &mut Command, id: Option<u32>) {
    use std::os::unix::process::CommandExt;
    if let Some(id) = id {
        cmd.uid(id).gid(id);
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The rows of the table: (size column, protocol, iterations).
pub fn rows(stdout: &str) -> Vec<(String, String, usize)> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim_start().starts_with("size"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 9, "row {l:?}");
            (
                format!("{} {}", f[0], f[1]),
                f[2].to_string(),
                f[3].parse().expect("iterations"),
            )
        })
        .collect()
}

/// Checks that the run failed with `code` and said exactly one line containing `needle`.
pub fn one_line_error(out: &Output, code: i32, needle: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.starts_with("pingpong: "), "{stderr:?}");
    assert!(stderr.contains(needle), "{needle:?} in {stderr:?}");
    assert!(out.stdout.is_empty());
}

/// A child process killed when the test ends, passing or failing (a server whose client
/// failed must not outlive the test).
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `pingpong --server ADDR` with `env`; returns the process and the address it says it
/// listens on, after checking it lists `transport` ("pingpong: listening on ADDR (rdma, tcp)").
pub fn start_server(addr: &str, env: &[(&str, &str)], transport: &str) -> (KillOnDrop, String) {
    start_server_as(None, addr, env, transport)
}

/// [`start_server`] as the user and group `id` (`None`: as the test's own).
pub fn start_server_as(
    id: Option<u32>,
    addr: &str,
    env: &[(&str, &str)],
    transport: &str,
) -> (KillOnDrop, String) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut cmd = Command::new(pingpong_path());
    cmd.args(["--server", addr])
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    as_user(&mut cmd, id);
    let mut server = KillOnDrop(cmd.spawn().expect("start the pingpong server"));
    let mut line = String::new();
    BufReader::new(server.0.stderr.take().expect("server stderr"))
        .read_line(&mut line)
        .expect("the server's first line");
    let listed = line
        .trim_end()
        .strip_suffix(')')
        .and_then(|l| l.rsplit_once('('))
        .map(|(_, list)| list.split(", ").any(|t| t == transport));
    assert_eq!(listed, Some(true), "{line:?} should list {transport}");
    let bound = line
        .split_whitespace()
        .nth(3)
        .unwrap_or_else(|| panic!("server said {line:?}"))
        .to_string();
    (server, bound)
}

/// A pingpong server on `127.0.0.1:0` listing `transport`, and a client run against it with
/// `client_args`, both as the user and group `id` (`None`: the test's own) with `env`: checks
/// that both succeed and returns what the client printed.
pub fn server_and_client(
    id: Option<u32>,
    env: &[(&str, &str)],
    transport: &str,
    client_args: &[&str],
) -> String {
    let (mut server, addr) = start_server_as(id, "127.0.0.1:0", env, transport);
    let mut args = vec!["--client", &addr];
    args.extend_from_slice(client_args);
    let out = pingpong_as(id, &args, env);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(server.0.wait().unwrap().success());
    stdout
}
