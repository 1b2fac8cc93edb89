/* ferroce.h: the verbs client library for C programs written against ferroce directly.
 *
 * Link with -lferroce (libferroce.so, built by `cargo build -p ferroce-c`). A program attaches
 * to roced's attach socket and gets protection domains, registered memory, completion queues
 * and RC queue pairs whose work and completion queues are shared-memory rings: posting and
 * polling make no system call. Unmodified libibverbs programs use libferroce_ibverbs.so
 * instead (see the README).
 *
 * Every call that can fail returns 0 (or a valid pointer) on success and a negative errno
 * value (or NULL) on failure; ferroce_last_error() then says why, for this thread. Values
 * follow libibverbs: access flags are IBV_ACCESS_*, opcodes IBV_WR_*, send flags IBV_SEND_*,
 * completion statuses IBV_WC_* and completion opcodes IBV_WC_* opcodes.
 */
#ifndef FERROCE_H
#define FERROCE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferroce_ctx ferroce_ctx;
typedef struct ferroce_mem ferroce_mem;
typedef struct ferroce_cq ferroce_cq;
typedef struct ferroce_qp ferroce_qp;

/* Access flags (IBV_ACCESS_*). */
#define FERROCE_ACCESS_LOCAL_WRITE 1u
#define FERROCE_ACCESS_REMOTE_WRITE 2u
#define FERROCE_ACCESS_REMOTE_READ 4u
#define FERROCE_ACCESS_REMOTE_ATOMIC 8u

/* Work request opcodes (IBV_WR_*). */
#define FERROCE_WR_RDMA_WRITE 0
#define FERROCE_WR_RDMA_WRITE_WITH_IMM 1
#define FERROCE_WR_SEND 2
#define FERROCE_WR_SEND_WITH_IMM 3
#define FERROCE_WR_RDMA_READ 4
#define FERROCE_WR_ATOMIC_CMP_AND_SWP 5
#define FERROCE_WR_ATOMIC_FETCH_AND_ADD 6

/* Send flags (IBV_SEND_*). */
#define FERROCE_SEND_FENCE 1u
#define FERROCE_SEND_SIGNALED 2u
#define FERROCE_SEND_SOLICITED 4u
#define FERROCE_SEND_INLINE 8u

/* Completion flags (IBV_WC_GRH, IBV_WC_WITH_IMM, IBV_WC_WITH_INV). */
#define FERROCE_WC_GRH 1u
#define FERROCE_WC_WITH_IMM 2u
#define FERROCE_WC_WITH_INV 4u

/* QP states for ferroce_qp_attr.state. */
enum ferroce_qp_state {
    FERROCE_QPS_RESET = 0,
    FERROCE_QPS_INIT = 1,
    FERROCE_QPS_RTR = 2,
    FERROCE_QPS_RTS = 3,
    FERROCE_QPS_SQD = 4,
    FERROCE_QPS_ERR = 6,
};

/* A scatter/gather entry: bytes at addr (inside registered memory) under lkey. */
struct ferroce_sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
};

#define FERROCE_MAX_SGE 8

struct ferroce_send_wr {
    uint64_t wr_id;
    uint32_t opcode;      /* FERROCE_WR_* */
    uint32_t send_flags;  /* FERROCE_SEND_* */
    uint32_t imm_data;    /* host order */
    uint32_t num_sge;     /* at most FERROCE_MAX_SGE */
    const struct ferroce_sge *sg_list;
    uint64_t remote_addr; /* WRITE, READ, atomics */
    uint32_t rkey;
    uint32_t reserved;
    uint64_t compare_add; /* atomics */
    uint64_t swap;        /* compare-and-swap */
};

struct ferroce_recv_wr {
    uint64_t wr_id;
    uint32_t num_sge;
    const struct ferroce_sge *sg_list;
};

struct ferroce_wc {
    uint64_t wr_id;
    uint32_t status;   /* IBV_WC_* status: 0 is success */
    uint32_t opcode;   /* IBV_WC_* opcode */
    uint32_t byte_len;
    uint32_t imm_data; /* host order; valid with FERROCE_WC_WITH_IMM */
    uint32_t qp_num;
    uint32_t src_qp;
    uint32_t wc_flags; /* FERROCE_WC_* */
};

struct ferroce_qp_cap {
    uint32_t max_send_wr;
    uint32_t max_recv_wr;
    uint32_t max_send_sge;
    uint32_t max_recv_sge;
    uint32_t max_inline_data;
};

/* Which fields of ferroce_qp_attr a modify sets (as ibv_qp_attr_mask). */
#define FERROCE_QP_STATE (1u << 0)
#define FERROCE_QP_ACCESS_FLAGS (1u << 3)
#define FERROCE_QP_AV (1u << 7) /* the path: remote_gid */
#define FERROCE_QP_PATH_MTU (1u << 8)
#define FERROCE_QP_TIMEOUT (1u << 9)
#define FERROCE_QP_RETRY_CNT (1u << 10)
#define FERROCE_QP_RNR_RETRY (1u << 11)
#define FERROCE_QP_RQ_PSN (1u << 12)
#define FERROCE_QP_MAX_QP_RD_ATOMIC (1u << 13)
#define FERROCE_QP_MIN_RNR_TIMER (1u << 15)
#define FERROCE_QP_SQ_PSN (1u << 16)
#define FERROCE_QP_MAX_DEST_RD_ATOMIC (1u << 17)
#define FERROCE_QP_DEST_QPN (1u << 20)

struct ferroce_qp_attr {
    uint32_t state; /* enum ferroce_qp_state; always taken */
    uint32_t access_flags;
    uint32_t path_mtu; /* bytes: 256, 512, 1024, 2048 or 4096 */
    uint32_t dest_qp_num;
    uint32_t rq_psn;
    uint32_t sq_psn;
    uint8_t timeout;
    uint8_t retry_cnt;
    uint8_t rnr_retry;
    uint8_t min_rnr_timer;
    uint8_t max_rd_atomic;
    uint8_t max_dest_rd_atomic;
    uint8_t reserved[2];
    const char *remote_gid; /* "10.0.0.2", "::ffff:10.0.0.2" or an IPv6 address */
};

/* Why this thread's last failed call failed (valid until its next call). */
const char *ferroce_last_error(void);

/* Attaches to roced at `socket` (NULL: $FERROCE_SOCKET). */
ferroce_ctx *ferroce_attach(const char *socket);
/* Detaches: roced destroys whatever the attachment still holds. */
void ferroce_detach(ferroce_ctx *ctx);
/* The device's name ("ferroce0"), its port's path MTU in bytes and its GIDs. */
const char *ferroce_device_name(const ferroce_ctx *ctx);
uint32_t ferroce_port_mtu(const ferroce_ctx *ctx);
int ferroce_gid_count(const ferroce_ctx *ctx);
/* GID `index` as text into buf (len bytes, NUL-terminated). */
int ferroce_gid(const ferroce_ctx *ctx, int index, char *buf, size_t len);

int ferroce_alloc_pd(ferroce_ctx *ctx, uint32_t *pd);
int ferroce_dealloc_pd(ferroce_ctx *ctx, uint32_t pd);

/* `len` zeroed bytes that roced's lcores read and write in place once registered. */
ferroce_mem *ferroce_mem_alloc(size_t len);
void *ferroce_mem_addr(const ferroce_mem *mem);
size_t ferroce_mem_len(const ferroce_mem *mem);
/* Frees it (deregister its regions first). */
void ferroce_mem_free(ferroce_mem *mem);
int ferroce_reg_mr(ferroce_ctx *ctx, uint32_t pd, const ferroce_mem *mem, uint32_t access,
                   uint32_t *lkey, uint32_t *rkey);
int ferroce_dereg_mr(ferroce_ctx *ctx, uint32_t lkey);

ferroce_cq *ferroce_create_cq(ferroce_ctx *ctx, uint32_t cqe);
int ferroce_destroy_cq(ferroce_ctx *ctx, ferroce_cq *cq);
/* Up to `max` completions into wc: how many (0: none yet), or a negative errno value. */
int ferroce_poll_cq(ferroce_cq *cq, int max, struct ferroce_wc *wc);

/* An RC QP in `pd`; cap may be NULL (depths of 128, one SGE, 64 inline bytes). */
ferroce_qp *ferroce_create_qp(ferroce_ctx *ctx, uint32_t pd, ferroce_cq *send_cq,
                              ferroce_cq *recv_cq, const struct ferroce_qp_cap *cap);
uint32_t ferroce_qp_num(const ferroce_qp *qp);
/* The PSN it starts sending with (the peer's rq_psn). */
uint32_t ferroce_qp_sq_psn(const ferroce_qp *qp);
int ferroce_modify_qp(ferroce_ctx *ctx, ferroce_qp *qp, const struct ferroce_qp_attr *attr,
                      uint32_t mask);
int ferroce_destroy_qp(ferroce_ctx *ctx, ferroce_qp *qp);
/* Posts one work request: 0, -ENOMEM if the queue is full, -EINVAL if it is malformed. */
int ferroce_post_send(ferroce_qp *qp, const struct ferroce_send_wr *wr);
int ferroce_post_recv(ferroce_qp *qp, const struct ferroce_recv_wr *wr);

#ifdef __cplusplus
}
#endif

#endif /* FERROCE_H */
