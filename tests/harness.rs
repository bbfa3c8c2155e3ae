//! The test harness itself. The device tests run in the guests under cargo-nextest
//! (`scripts/lib/nextest.sh`), and `scripts/test` judges each run by its JUnit report: a
//! report with a failure, or no report at all, must fail the run; and `scripts/test-executables`
//! must fail when cargo does.
//!
//! The `fixture_*` tests are what `scripts/test` runs under the `harness` profile of
//! `.config/nextest.toml` to show that nextest's guards hold: a test that crashes and a test
//! that hangs each fail the run (the hang is ended by the profile's slow-timeout), beside one
//! that passes. They are `#[ignore]`d, and do nothing unless `RDMX_HARNESS_FIXTURES=1`.

use std::path::{Path, PathBuf};
use std::process::Command;

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

/// `junit_counts` of `scripts/lib/nextest.sh` on a report holding `xml` (none if `None`).
fn junit_counts(test: &str, xml: Option<&str>) -> String {
    let report = scratch(test).join("junit.xml");
    if let Some(xml) = xml {
        std::fs::write(&report, xml).unwrap();
    }
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            ". '{}' && junit_counts \"$1\"",
            script("lib/nextest.sh").display()
        ))
        .arg("junit_counts")
        .arg(&report)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

const REPORT: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="nextest-run" tests="TESTS" skipped="0" failures="FAILURES" errors="ERRORS" uuid="u" timestamp="t" time="1.5">
    <testsuite name="rdmx::device_api" tests="TESTS" skipped="0" errors="0" failures="0">
    </testsuite>
</testsuites>
"#;

fn report(tests: u32, failures: u32, errors: u32) -> String {
    REPORT
        .replace("TESTS", &tests.to_string())
        .replace("FAILURES", &failures.to_string())
        .replace("ERRORS", &errors.to_string())
}

#[test]
fn a_passing_report_counts_its_tests() {
    assert_eq!(junit_counts("pass", Some(&report(47, 0, 0))), "47 0");
}

#[test]
fn failures_and_errors_count_as_failed() {
    assert_eq!(junit_counts("fail", Some(&report(47, 2, 1))), "44 3");
}

#[test]
fn no_report_or_a_broken_one_is_a_failure() {
    assert_eq!(junit_counts("none", None), "0 1");
    assert_eq!(junit_counts("empty", Some("")), "0 1");
    assert_eq!(
        junit_counts("cut", Some("<?xml version=\"1.0\"?>\n<testsui")),
        "0 1"
    );
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

fn fixtures_on() -> bool {
    std::env::var("RDMX_HARNESS_FIXTURES").as_deref() == Ok("1")
}

#[test]
#[ignore = "a fixture of scripts/test's harness check (RDMX_HARNESS_FIXTURES=1)"]
fn fixture_passes() {}

#[test]
#[ignore = "a fixture of scripts/test's harness check (RDMX_HARNESS_FIXTURES=1)"]
fn fixture_crashes() {
    if fixtures_on() {
        std::process::abort();
    }
}

#[test]
#[ignore = "a fixture of scripts/test's harness check (RDMX_HARNESS_FIXTURES=1)"]
fn fixture_hangs() {
    if fixtures_on() {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
