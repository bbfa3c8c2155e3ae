//! Probes rdma-core and libclang before anything else is compiled, so a machine without them
//! gets one clear message naming the Debian packages to install, and records the versions found.

fn main() {
    let found = rdmx_build_probe::probe_or_exit();
    println!(
        "cargo:rustc-env=RDMX_RDMACM_VERSION={}",
        found.rdmacm_version
    );
    println!(
        "cargo:rustc-env=RDMX_IBVERBS_VERSION={}",
        found.ibverbs_version
    );
    println!("cargo:rerun-if-changed=build.rs");
}
