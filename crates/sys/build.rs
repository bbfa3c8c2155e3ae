//! Generates bindings to librdmacm and libibverbs with bindgen.
//!
//! Verbs' data-path calls (`ibv_post_send`, `ibv_poll_cq`, `rdma_post_*`, …) are `static inline`
//! functions in the headers, so they have no symbol to link against. bindgen's `wrap_static_fns`
//! writes a C file with one exported wrapper per such function; it is compiled here with `cc`
//! and linked in, so the bindings call the headers' own code rather than a re-implementation.

use std::env;
use std::path::PathBuf;

fn main() {
    let found = rdmx_build_probe::probe_or_exit();
    rdmx_build_probe::emit_link_directives();
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");

    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let wrapper = manifest_dir.join("wrapper.h");
    let static_fns = out_dir.join("static_fns");
    let include_args: Vec<String> = found
        .include_dirs
        .iter()
        .map(|d| format!("-I{}", d.display()))
        .collect();

    let bindings = bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .clang_args(&include_args)
        // `_*` catches the double/triple-underscore functions behind macros such as
        // `ibv_reg_mr` (-> `__ibv_reg_mr`) and `ibv_query_port` (-> `___ibv_query_port`).
        .allowlist_function("_*ibv_.*|rdma_.*")
        .allowlist_type("ibv_.*|rdma_.*")
        .allowlist_var("IBV_.*|RDMA_.*|RAI_.*")
        // C enums read back from the kernel or the NIC may hold values newer than these headers;
        // newtype enums make any value representable, so no read is undefined behaviour.
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .bitfield_enum(
            "ibv_access_flags|ibv_send_flags|ibv_wc_flags|ibv_qp_attr_mask|ibv_srq_attr_mask",
        )
        .derive_default(true)
        .derive_debug(true)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&static_fns)
        .layout_tests(false)
        .generate()
        .unwrap_or_else(|err| {
            eprintln!("rdmx-sys: bindgen failed on {}: {err}", wrapper.display());
            std::process::exit(1)
        });
    bindings
        .write_to_file(out_dir.join("bindings.rs"))
        .expect("writing bindings.rs into OUT_DIR");

    // The generated C file `#include`s wrapper.h by its full path, and wrapper.h includes the
    // rdma-core headers, so cc needs both the crate dir and rdma-core's include dirs.
    cc::Build::new()
        .file(static_fns.with_extension("c"))
        .include(&manifest_dir)
        .includes(&found.include_dirs)
        .warnings(false)
        .compile("rdmx_sys_static_fns");
}
