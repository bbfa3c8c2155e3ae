# shellcheck shell=bash
# Sourced by scripts/test: the device tests are built once on the host (cargo-nextest's
# archive), unpacked once beside the workspace, and run from there in the Soft-RoCE guests
# (which see the host's files and build nothing), each under a profile of
# .config/nextest.toml that names its tests (filtersets), bounds each test (slow-timeout) and
# writes a JUnit report.

# Where the archive is unpacked (its target directory).
NEXTEST_UNPACKED=target/nextest/unpacked/target

# nextest_archive: builds every test target of the workspace and archives it, then unpacks
# the archive for the guests.
nextest_archive() {
  mkdir -p target/nextest
  cargo nextest archive --workspace --locked --archive-file target/nextest/rdmx-tests.tar.zst
  rm -rf target/nextest/unpacked
  mkdir -p target/nextest/unpacked
  # (Listing is how nextest unpacks an archive without running it.)
  cargo nextest list --archive-file target/nextest/rdmx-tests.tar.zst --workspace-remap . \
    --extract-to target/nextest/unpacked --run-ignored only --profile guest > /dev/null
}

# nextest_run PROFILE [ARGS...]: runs the unpacked tests of PROFILE (#[ignore]d ones only: the
# device tests are ignored on the host), without building; its JUnit report is
# `nextest_junit PROFILE`.
nextest_run() {
  local profile=$1; shift
  rm -f "$(nextest_junit "$profile")"
  cargo nextest run --profile "$profile" --run-ignored only --no-tests fail \
    --color never --show-progress counter \
    --binaries-metadata "$NEXTEST_UNPACKED/nextest/binaries-metadata.json" \
    --cargo-metadata "$NEXTEST_UNPACKED/nextest/cargo-metadata.json" \
    --target-dir-remap "$NEXTEST_UNPACKED" --workspace-remap . "$@"
}

# nextest_junit PROFILE: the JUnit report of PROFILE's last run.
nextest_junit() {
  echo "target/nextest/$1/junit.xml"
}

# junit_counts FILE: "PASSED FAILED" of a JUnit report ("0 1" when there is none: a run that
# wrote no report did not pass).
junit_counts() {
  [ -s "$1" ] || { echo 0 1; return; }
  awk 'match($0, /<testsuites[^>]*>/) {
      s = substr($0, RSTART, RLENGTH)
      t = s; sub(/.* tests="/, "", t); sub(/".*/, "", t)
      f = s; sub(/.* failures="/, "", f); sub(/".*/, "", f)
      e = s; sub(/.* errors="/, "", e); sub(/".*/, "", e)
      print t - f - e, f + e; found = 1; exit }
    END { if (!found) print 0, 1 }' "$1"
}
