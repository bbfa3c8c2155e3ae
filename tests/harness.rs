//! The test harness itself: `scripts/run-test-binaries` (how `scripts/test` runs the device
//! test binaries in the guest) must fail the run for a binary that crashes, hangs, exits
//! without a result, or reports a failure, even when another binary passed; and
//! `scripts/test-executables` must fail when cargo does. Fake test binaries (shell scripts)
//! stand in for real ones.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(name)
}

/// A fresh directory for this test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rdmx-harness-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes an executable shell script `name` with `body` into `dir`.
fn fake(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

const PASSES: &str = r#"echo "running 1 test"
echo "test works ... ok"
echo
echo "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s""#;

fn run(dir: &Path, bins: &[PathBuf]) -> (Output, String) {
    let log = dir.join("log");
    let out = Command::new(script("run-test-binaries"))
        .arg("--timeout")
        .arg("3")
        .arg("--log")
        .arg(&log)
        .arg("--")
        .args(bins)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    (out, text)
}

#[test]
fn passing_binaries_pass() {
    let dir = scratch("pass");
    let a = fake(&dir, "a", PASSES);
    let b = fake(&dir, "b", PASSES);
    let (out, _) = run(&dir, &[a, b]);
    assert!(out.status.success());
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    assert_eq!(log.matches("test result: ok").count(), 2, "{log}");
}

#[test]
fn a_crashing_binary_fails_the_run_after_a_passing_one() {
    let dir = scratch("crash");
    let good = fake(&dir, "good", PASSES);
    let crash = fake(&dir, "crash", "echo 'running 3 tests'\nkill -SEGV $$");
    let (out, text) = run(&dir, &[good, crash]);
    assert!(!out.status.success());
    assert!(text.contains("crash was killed by signal 11"), "{text}");
}

#[test]
fn a_hanging_binary_fails_the_run() {
    let dir = scratch("hang");
    let good = fake(&dir, "good", PASSES);
    let hang = fake(&dir, "hang", "echo 'running 1 test'\nexec sleep 600");
    let (out, text) = run(&dir, &[hang, good]);
    assert!(!out.status.success());
    assert!(text.contains("hang did not finish within 3 s"), "{text}");
}

#[test]
fn a_binary_exiting_silently_fails_the_run() {
    let dir = scratch("silent");
    let good = fake(&dir, "good", PASSES);
    let silent = fake(&dir, "silent", "exit 0");
    let (out, text) = run(&dir, &[good, silent]);
    assert!(!out.status.success());
    assert!(
        text.contains("silent exited with status 0 but printed 0 \"test result\" lines"),
        "{text}"
    );
}

#[test]
fn failing_tests_fail_the_run() {
    let dir = scratch("fail");
    let failing = fake(
        &dir,
        "failing",
        "echo 'test result: FAILED. 0 passed; 1 failed; 0 ignored'\nexit 101",
    );
    let lying = fake(
        &dir,
        "lying",
        "echo 'test result: FAILED. 0 passed; 1 failed; 0 ignored'",
    );
    let (out, text) = run(&dir, &[failing, lying]);
    assert!(!out.status.success());
    assert!(text.contains("failing exited with status 101"), "{text}");
    assert!(text.contains("lying reported a failure"), "{text}");
}

#[test]
fn a_failed_build_fails_test_executables() {
    let dir = scratch("build");
    let out = Command::new(script("test-executables"))
        .args(["device", "--features", "no-such-feature"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert!(!out.status.success(), "a failed cargo run must fail it");
    assert!(out.stdout.is_empty(), "no binary is named");
    assert!(
        stderr.contains("no-such-feature"),
        "cargo's error is shown: {stderr}"
    );
}
