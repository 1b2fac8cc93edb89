//! Generates the libibverbs and librdmacm structures and constants from Debian's
//! `<infiniband/verbs.h>` and `<rdma/rdma_cma.h>` (packages libibverbs-dev, librdmacm-dev):
//! their layout is the ABI the programs were compiled against.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let header = "/usr/include/infiniband/verbs.h";
    println!("cargo:rerun-if-changed={header}");
    println!("cargo:rerun-if-changed=/usr/include/rdma/rdma_cma.h");
    let b = bindgen::Builder::default()
        .header_contents(
            "wrapper.h",
            "#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n",
        )
        .allowlist_type("ibv_.*|verbs_.*|_compat_ibv_port_attr|rdma_.*")
        .allowlist_var("IBV_.*|IB_.*|RDMA_.*|RAI_.*")
        // Enums as modules of constants: a C enum may hold any value, a Rust enum may not.
        .constified_enum_module("ibv_.*|rdma_.*")
        .derive_default(true)
        .generate_comments(false)
        .layout_tests(true)
        .generate()
        .expect("bindgen failed on <infiniband/verbs.h> or <rdma/rdma_cma.h> (are libibverbs-dev and librdmacm-dev installed?)");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    b.write_to_file(out.join("verbs.rs"))
        .expect("writing the bindings");
}
