//! Build-time probe for what rdmx needs from the system: rdma-core's development files
//! (`librdmacm`, `libibverbs` through pkg-config, and their headers) and libclang for bindgen.
//!
//! Both the top-level `rdmx` build script and `rdmx-sys`'s call [`probe`], so a machine that
//! lacks any of it gets the same single message, naming the Debian packages to install.

use std::env;
use std::fmt;
use std::path::{Path, PathBuf};

/// The Debian packages that provide everything [`probe`] looks for.
pub const DEBIAN_PACKAGES: &str = "librdmacm-dev libibverbs-dev libclang-dev pkg-config";

/// Headers that rdmx binds, relative to an include directory.
pub const HEADERS: [&str; 3] = ["infiniband/verbs.h", "rdma/rdma_cma.h", "rdma/rdma_verbs.h"];

/// What the probe found: where the headers are and which versions pkg-config reports.
#[derive(Debug, Clone)]
pub struct RdmaCore {
    /// Include directories (pkg-config's, then the compiler's default `/usr/include`).
    pub include_dirs: Vec<PathBuf>,
    /// `librdmacm` version as pkg-config reports it.
    pub rdmacm_version: String,
    /// `libibverbs` version as pkg-config reports it.
    pub ibverbs_version: String,
    /// The libclang shared library bindgen will load.
    pub libclang: PathBuf,
}

/// Everything that was missing, collected so that one message names all of it.
#[derive(Debug, Default)]
pub struct Missing {
    items: Vec<String>,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "rdmx cannot be built: rdma-core development files or libclang are missing."
        )?;
        for item in &self.items {
            writeln!(f, "  - {item}")?;
        }
        write!(
            f,
            "On Debian or Ubuntu install them with:\n    sudo apt-get install {DEBIAN_PACKAGES}\n\
             (scripts/test and scripts/demo install them for you.)"
        )
    }
}

impl std::error::Error for Missing {}

/// Looks for librdmacm and libibverbs (pkg-config), the three headers rdmx binds, and libclang.
///
/// Does not print cargo directives; call [`emit_link_directives`] for that.
pub fn probe() -> Result<RdmaCore, Missing> {
    let mut missing = Missing::default();
    let mut include_dirs = Vec::new();
    let mut versions = Vec::new();
    for lib in ["librdmacm", "libibverbs"] {
        match pkg_config::Config::new().cargo_metadata(false).probe(lib) {
            Ok(found) => {
                include_dirs.extend(found.include_paths);
                versions.push(found.version);
            }
            Err(err) => {
                // pkg-config's own explanation, e.g. "Package librdmacm was not found in the
                // pkg-config search path."
                let text = err.to_string();
                let detail = text
                    .lines()
                    .map(str::trim)
                    .find(|l| l.starts_with("Package "));
                missing.items.push(match detail {
                    Some(detail) => format!("pkg-config cannot find {lib}: {detail}"),
                    None => format!("pkg-config cannot find {lib}"),
                });
                versions.push(String::new());
            }
        }
    }
    include_dirs.push(PathBuf::from("/usr/include"));
    for header in HEADERS {
        if !include_dirs.iter().any(|dir| dir.join(header).is_file()) {
            missing.items.push(format!("header <{header}> not found"));
        }
    }
    let libclang = find_libclang();
    if libclang.is_none() {
        missing.items.push(
            "libclang (needed by bindgen) not found; set LIBCLANG_PATH if it is installed elsewhere"
                .to_string(),
        );
    }
    match (missing.items.is_empty(), libclang) {
        (true, Some(libclang)) => Ok(RdmaCore {
            include_dirs,
            ibverbs_version: versions.pop().unwrap_or_default(),
            rdmacm_version: versions.pop().unwrap_or_default(),
            libclang,
        }),
        _ => Err(missing),
    }
}

/// Prints the cargo directives that link librdmacm and libibverbs and re-run on changes.
pub fn emit_link_directives() {
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rustc-link-lib=rdmacm");
    println!("cargo:rustc-link-lib=ibverbs");
}

/// Runs [`probe`] and, when something is missing, prints the message and exits the build script
/// with status 1 (a panic would bury the message under a backtrace hint).
pub fn probe_or_exit() -> RdmaCore {
    probe().unwrap_or_else(|missing| {
        eprintln!("{missing}");
        println!("cargo:warning=rdma-core development files or libclang missing: apt-get install {DEBIAN_PACKAGES}");
        std::process::exit(1)
    })
}

fn find_libclang() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(path) = env::var_os("LIBCLANG_PATH") {
        dirs.extend(env::split_paths(&path));
    }
    dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    dirs.push(PathBuf::from("/usr/lib/aarch64-linux-gnu"));
    dirs.push(PathBuf::from("/usr/lib64"));
    dirs.push(PathBuf::from("/usr/lib"));
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        let mut llvm: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("llvm-"))
            })
            .map(|p| p.join("lib"))
            .collect();
        llvm.sort();
        dirs.extend(llvm.into_iter().rev());
    }
    dirs.iter().find_map(|dir| libclang_in(dir))
}

fn libclang_in(dir: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries.flatten().map(|e| e.path()).find(|p| {
        p.file_name().is_some_and(|n| {
            let n = n.to_string_lossy();
            n.starts_with("libclang") && !n.starts_with("libclang-cpp") && n.contains(".so")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_what_is_missing_and_the_packages() {
        let missing = Missing {
            items: vec!["header <rdma/rdma_cma.h> not found".into()],
        };
        let text = missing.to_string();
        assert!(text.contains("rdma/rdma_cma.h"), "{text}");
        assert!(
            text.contains("apt-get install librdmacm-dev libibverbs-dev libclang-dev pkg-config"),
            "{text}"
        );
    }

    #[test]
    fn finds_what_this_machine_has() {
        // scripts/test installs rdma-core's development files and libclang before running this.
        let found = probe().expect("rdma-core and libclang are installed");
        assert!(!found.rdmacm_version.is_empty() && !found.ibverbs_version.is_empty());
        assert!(found.libclang.exists());
    }
}
