/* Hand-written wrappers for what bindgen cannot reach: macros and thread-locals. */
#ifndef FERROCE_SHIM_H
#define FERROCE_SHIM_H
#include <stdint.h>
#include <rte_mbuf.h>

/* The calling thread's rte_errno (a per-lcore thread-local in DPDK). */
int ferroce_rte_errno(void);
/* rte_pktmbuf_mtod(m, void *). */
void *ferroce_pktmbuf_mtod(struct rte_mbuf *m);
/* Sets l2_len and l3_len and ORs ol_flags: what a tx checksum offload request needs. */
void ferroce_mbuf_set_tx_offload(struct rte_mbuf *m, uint16_t l2_len, uint16_t l3_len, uint64_t flags);
/* Per-lcore id of the calling thread (LCORE_ID_ANY for non-EAL threads). */
unsigned ferroce_lcore_id(void);
#endif
