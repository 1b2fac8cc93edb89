/* The DPDK headers ferroce binds. Keep this list and the allowlist in build.rs narrow. */
#include <rte_config.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_launch.h>
#include <rte_cycles.h>
#include <rte_mempool.h>
#include <rte_mbuf.h>
#include <rte_ethdev.h>
#include <rte_ring.h>
#include <rte_malloc.h>
#include <rte_memory.h>
#include <rte_dev.h>
#include <rte_bus.h>
#include "shim.h"
