//! rdmx-info on the host: devices (none here), transports, and configuration with sources.

use std::process::Command;

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rdmx-info"));
    cmd.args(args)
        .env_remove("RDMX_EAGER_THRESHOLD")
        .env_remove("RDMX_WAIT_MODE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run rdmx-info");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn line<'a>(out: &'a str, var: &str) -> &'a str {
    out.lines()
        .find(|l| l.trim_start().starts_with(var))
        .unwrap_or_else(|| panic!("no {var} line in:\n{out}"))
}

#[test]
fn shows_transports_and_every_value_with_its_source() {
    let (code, out, err) = run(
        &["-D", "RDMX_EAGER_THRESHOLD=4k"],
        &[("RDMX_WAIT_MODE", "event")],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("tcp:  usable"), "{out}");
    assert!(
        out.contains("shm:  usable for peers on this host") && out.contains("rendezvous by"),
        "{out}"
    );
    assert!(out.contains("selected: shm, then "), "{out}");
    assert!(out.contains("rdma: "), "{out}");
    assert!(out.contains("selected: "), "{out}");
    let eager = line(&out, "RDMX_EAGER_THRESHOLD");
    assert!(
        eager.contains("4096") && eager.contains("builder"),
        "{eager}"
    );
    let wait = line(&out, "RDMX_WAIT_MODE");
    assert!(
        wait.contains("event") && wait.contains("environment"),
        "{wait}"
    );
    let credits = line(&out, "RDMX_CREDITS");
    assert!(
        credits.contains("64") && credits.contains("default"),
        "{credits}"
    );
    #[cfg(feature = "rdma")]
    if rdmx::conn::Device::list().unwrap_or_default().is_empty() {
        assert!(
            out.contains("rdma: not usable: rdmacm lists no RDMA device"),
            "{out}"
        );
    }
    #[cfg(not(feature = "rdma"))]
    assert!(
        out.contains("rdma: not usable: this build of rdmx has no RDMA support"),
        "{out}"
    );
}

#[test]
fn bad_settings_and_arguments_are_one_clear_line_and_a_failure() {
    let (code, _, err) = run(&["-D", "RDMX_EAGER_THRESHOLD=lots"], &[]);
    assert_ne!(code, 0);
    assert!(
        err.contains("RDMX_EAGER_THRESHOLD") && err.contains("lots"),
        "{err}"
    );
    let (code, _, err) = run(&["-D", "RDMX_BOGUS=1"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown variable RDMX_BOGUS"), "{err}");
    let (code, _, err) = run(&["--what"], &[]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
}
