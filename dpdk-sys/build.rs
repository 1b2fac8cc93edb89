//! Finds Debian's DPDK with pkg-config, generates bindings for a narrow allowlist,
//! and compiles the wrappers bindgen generates for DPDK's `static inline` fast path
//! together with our small shim for macros and thread-locals.

use std::env;
use std::path::PathBuf;

/// Functions we call. Every allowlisted `static inline` one gets a C wrapper.
const FUNCTIONS: &[&str] = &[
    // EAL, lcores, time
    "rte_eal_init",
    "rte_eal_cleanup",
    "rte_eal_remote_launch",
    "rte_eal_wait_lcore",
    "rte_eal_mp_wait_lcore",
    "rte_get_main_lcore",
    "rte_lcore_count",
    "rte_lcore_to_socket_id",
    "rte_socket_id",
    "rte_get_tsc_hz",
    "rte_rdtsc",
    "rte_strerror",
    "rte_exit",
    // mempools and mbufs
    "rte_pktmbuf_pool_create",
    "rte_mempool_free",
    "rte_mempool_avail_count",
    "rte_mempool_in_use_count",
    "rte_pktmbuf_alloc",
    "rte_pktmbuf_alloc_bulk",
    "rte_pktmbuf_free",
    "rte_pktmbuf_free_bulk",
    "rte_pktmbuf_prepend",
    "rte_pktmbuf_append",
    "rte_pktmbuf_adj",
    "rte_pktmbuf_trim",
    "rte_pktmbuf_headroom",
    "rte_pktmbuf_tailroom",
    "rte_pktmbuf_reset",
    "rte_pktmbuf_attach_extbuf",
    "rte_pktmbuf_ext_shinfo_init_helper",
    "rte_mbuf_ext_refcnt_update",
    "rte_mbuf_ext_refcnt_read",
    "rte_pktmbuf_chain",
    "rte_pktmbuf_linearize",
    "rte_malloc",
    "rte_zmalloc",
    "rte_free",
    "rte_malloc_virt2iova",
    "rte_mem_virt2iova",
    // external memory (an application's registered pages, carried by attached mbufs)
    "rte_eal_iova_mode",
    "rte_extmem_register",
    "rte_extmem_unregister",
    "rte_dev_dma_map",
    "rte_dev_dma_unmap",
    "rte_dev_bus",
    "rte_bus_name",
    // ethdev
    "rte_eth_dev_count_avail",
    "rte_eth_dev_get_port_by_name",
    "rte_eth_dev_get_name_by_port",
    "rte_eth_dev_info_get",
    "rte_eth_dev_configure",
    "rte_eth_dev_adjust_nb_rx_tx_desc",
    "rte_eth_rx_queue_setup",
    "rte_eth_tx_queue_setup",
    "rte_eth_dev_start",
    "rte_eth_dev_stop",
    "rte_eth_dev_close",
    "rte_eth_dev_socket_id",
    "rte_eth_dev_set_mtu",
    "rte_eth_dev_get_mtu",
    "rte_eth_macaddr_get",
    "rte_eth_promiscuous_enable",
    "rte_eth_allmulticast_enable",
    "rte_eth_link_get_nowait",
    "rte_eth_stats_get",
    "rte_eth_stats_reset",
    "rte_eth_xstats_get",
    "rte_eth_xstats_get_names",
    "rte_eth_rx_burst",
    "rte_eth_dev_rss_hash_update",
    "rte_eth_dev_rss_hash_conf_get",
    "rte_eth_dev_rss_reta_update",
    "rte_eth_dev_rss_reta_query",
    "rte_eth_tx_burst",
    // rings (lock-free handoff between lcores)
    "rte_ring_create",
    "rte_ring_free",
    "rte_ring_count",
    "rte_ring_enqueue_burst",
    "rte_ring_dequeue_burst",
    // shim
    "ferroce_.*",
];

const TYPES: &[&str] = &[
    "rte_mbuf",
    "rte_mempool",
    "rte_eth_conf",
    "rte_eth_dev_info",
    "rte_eth_rxconf",
    "rte_eth_txconf",
    "rte_eth_link",
    "rte_eth_stats",
    "rte_eth_xstat",
    "rte_eth_xstat_name",
    "rte_ether_addr",
    "rte_ring",
    "rte_mbuf_ext_shared_info",
    "rte_eth_rss_conf",
    "rte_eth_rss_reta_entry64",
];

const VARS: &[&str] = &[
    "RTE_MBUF_F_.*",
    "RTE_ETH_TX_OFFLOAD_.*",
    "RTE_ETH_RX_OFFLOAD_.*",
    "RTE_ETH_RSS_.*",
    "RTE_ETH_LINK_.*",
    "RTE_ETH_SPEED_NUM_.*",
    "RTE_PKTMBUF_HEADROOM",
    "RTE_MBUF_DEFAULT_BUF_SIZE",
    "RTE_MAX_LCORE",
    "RTE_MAX_ETHPORTS",
    "SOCKET_ID_ANY",
    "LCORE_ID_ANY",
    "RING_F_.*",
    "RTE_ETH_XSTATS_NAME_SIZE",
    "RTE_ETHDEV_QUEUE_STAT_CNTRS",
    "RTE_ETH_RETA_GROUP_SIZE",
    "RTE_IOVA_.*",
    "RTE_BAD_IOVA",
];

fn main() {
    let dpdk = pkg_config::Config::new()
        .atleast_version("22.11")
        .probe("libdpdk")
        .expect(
            "libdpdk >= 22.11 not found by pkg-config: install Debian's libdpdk-dev \
             (`make deps` does it)",
        );

    // Where the installed PMDs live, so configuration can check a vdev's driver exists.
    let libdir = pkg_config::get_variable("libdpdk", "libdir").unwrap_or_default();
    let pmd_dir = std::fs::read_dir(format!("{libdir}/dpdk"))
        .ok()
        .and_then(|rd| {
            rd.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("pmds-"))
            })
        })
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=FERROCE_DPDK_PMD_DIR={pmd_dir}");
    println!("cargo:rustc-env=FERROCE_DPDK_VERSION={}", dpdk.version);

    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let wrap_src = out.join("static_fns.c");

    let mut clang_args: Vec<String> = dpdk
        .include_paths
        .iter()
        .map(|p| format!("-I{}", p.display()))
        .collect();
    clang_args.push("-include".into());
    clang_args.push("rte_config.h".into());
    clang_args.push("-march=corei7".into());
    clang_args.push("-DALLOW_EXPERIMENTAL_API".into());
    clang_args.push(format!("-I{}", env!("CARGO_MANIFEST_DIR")));

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(&clang_args)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&wrap_src)
        .allowlist_recursively(true)
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(false)
        .generate_comments(false)
        .prepend_enum_name(false)
        // Types bindgen cannot lay out; we never touch their fields.
        .opaque_type("rte_arp_.*")
        .opaque_type("rte_l2tpv2_combined_msg_hdr")
        .opaque_type("rte_gtp_psc_generic_hdr")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for f in FUNCTIONS {
        builder = builder.allowlist_function(f);
    }
    for t in TYPES {
        builder = builder.allowlist_type(t);
    }
    for v in VARS {
        builder = builder.allowlist_var(v);
    }
    builder
        .generate()
        .expect("bindgen failed on the DPDK headers")
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");

    let mut cc = cc::Build::new();
    cc.file(&wrap_src)
        .file("shim.c")
        .include(env!("CARGO_MANIFEST_DIR"))
        .flag("-include")
        .flag("rte_config.h")
        .flag("-march=corei7")
        .flag("-O3")
        .define("ALLOW_EXPERIMENTAL_API", None)
        .flag_if_supported("-Wno-duplicate-decl-specifier")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false);
    for p in &dpdk.include_paths {
        cc.include(p);
    }
    cc.compile("ferroce_dpdk_shim");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=shim.h");
    println!("cargo:rerun-if-changed=shim.c");
}
