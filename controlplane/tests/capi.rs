//! The C client library (issue 21, Build 3): a C program compiled against `capi/include/ferroce.h`
//! and linked with `libferroce.so` attaches to two memif nodes, connects an RC QP on each and
//! moves data with WRITE, SEND with immediate, READ and both atomics, checking every byte, then
//! has bad work requests refused with a reason (`capi/tests/rdma.c`).

mod common;
use common::rdma::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory libferroce.so was built into (a dependency of this test: target/<profile>/deps).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for d in [deps, deps.parent().unwrap()] {
        if d.join("libferroce.so").exists() {
            return d.to_path_buf();
        }
    }
    panic!("libferroce.so not found beside {}", exe.display());
}

#[test]
fn a_c_program_moves_and_checks_data_through_libferroce() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = library_dir();
    let bin = std::env::temp_dir().join(format!("ferroce-capi-{}", std::process::id()));
    let cc = Command::new("gcc")
        .args(["-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("capi/include"))
        .arg(root.join("capi/tests/rdma.c"))
        .arg("-L")
        .arg(&lib)
        .arg("-lferroce")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&bin)
        .output()
        .expect("gcc runs");
    assert!(
        cc.status.success(),
        "the C program does not build against ferroce.h:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let n = memif_nodes("capi", 7660);
    let pid = std::process::id();
    let sock = |s: &str| format!("/run/ferroce/ferroce-rcapi-{s}-{pid}.sock");
    let out = Command::new(&bin)
        .arg(sock("a"))
        .arg(sock("b"))
        .output()
        .expect("the C program runs");
    let _ = std::fs::remove_file(&bin);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("capi: ok"),
        "the C program failed:\n{text}"
    );
    // Both nodes logged the attachment, and neither panicked.
    for node in n.nodes.iter().flatten() {
        let log = node.log_text();
        assert!(log.contains("application attached"), "{log}");
        assert!(!log.contains("panicked"), "roced panicked:\n{log}");
    }
}
