//! Generates the libibverbs structures and constants from Debian's `<infiniband/verbs.h>`
//! (package libibverbs-dev): their layout is the ABI the programs were compiled against.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let header = "/usr/include/infiniband/verbs.h";
    println!("cargo:rerun-if-changed={header}");
    let b = bindgen::Builder::default()
        .header_contents("wrapper.h", "#include <infiniband/verbs.h>\n")
        .allowlist_type("ibv_.*|verbs_.*|_compat_ibv_port_attr")
        .allowlist_var("IBV_.*|IB_.*")
        // Enums as modules of constants: a C enum may hold any value, a Rust enum may not.
        .constified_enum_module("ibv_.*")
        .derive_default(true)
        .generate_comments(false)
        .layout_tests(true)
        .generate()
        .expect("bindgen failed on <infiniband/verbs.h> (is libibverbs-dev installed?)");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    b.write_to_file(out.join("verbs.rs"))
        .expect("writing the bindings");
}
