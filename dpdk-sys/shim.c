#include "shim.h"
#include <rte_errno.h>
#include <rte_lcore.h>

int ferroce_rte_errno(void) { return rte_errno; }

void *ferroce_pktmbuf_mtod(struct rte_mbuf *m) { return rte_pktmbuf_mtod(m, void *); }

void ferroce_mbuf_set_tx_offload(struct rte_mbuf *m, uint16_t l2_len, uint16_t l3_len, uint64_t flags)
{
	m->l2_len = l2_len;
	m->l3_len = l3_len;
	m->ol_flags |= flags;
}

unsigned ferroce_lcore_id(void) { return rte_lcore_id(); }
