//! Probes rdma-core and libclang before anything else is compiled, so a machine without them
//! gets one clear message naming the Debian packages to install, and records the versions found.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_RDMA").is_none() {
        // A TCP-only build (`--no-default-features`) needs no rdma-core.
        println!("cargo:rustc-env=RDMX_RDMACM_VERSION=none (built without the rdma feature)");
        println!("cargo:rustc-env=RDMX_IBVERBS_VERSION=none (built without the rdma feature)");
        return;
    }
    let found = rdmx_build_probe::probe_or_exit();
    println!(
        "cargo:rustc-env=RDMX_RDMACM_VERSION={}",
        found.rdmacm_version
    );
    println!(
        "cargo:rustc-env=RDMX_IBVERBS_VERSION={}",
        found.ibverbs_version
    );
}
