/* Two attachments (one to each of two roced nodes) through libferroce.so: an RC QP on each,
 * connected, and WRITE, SEND with immediate, READ and both atomics between them, each byte
 * checked; then bad work requests, each refused with a reason. Prints "capi: ok" and exits 0,
 * or says what failed and exits 1.
 *
 *   gcc -I capi/include capi/tests/rdma.c -L<dir> -lferroce -o rdma && ./rdma A.sock B.sock
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferroce.h"

#define MEM (64 * 1024)

#define CHECK(c, ...)                                                                     \
    do {                                                                                  \
        if (!(c)) {                                                                       \
            fprintf(stderr, "capi: line %d: ", __LINE__);                                 \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, " (last error: %s)\n", ferroce_last_error());                 \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

struct end {
    ferroce_ctx *ctx;
    uint32_t pd, lkey, rkey;
    ferroce_mem *mem;
    uint8_t *buf;
    ferroce_cq *cq;
    ferroce_qp *qp;
    char gid[64];
};

static void open_end(struct end *e, const char *sock) {
    e->ctx = ferroce_attach(sock);
    CHECK(e->ctx, "attach to %s", sock);
    CHECK(strcmp(ferroce_device_name(e->ctx), "ferroce0") == 0, "device %s",
          ferroce_device_name(e->ctx));
    /* The IPv4 GID (IPv4-mapped), as rxe lists it. */
    int n = ferroce_gid_count(e->ctx), found = 0;
    for (int i = 0; i < n && !found; i++) {
        CHECK(ferroce_gid(e->ctx, i, e->gid, sizeof e->gid) == 0, "gid %d", i);
        found = strchr(e->gid, '.') != NULL;
    }
    CHECK(found, "no IPv4 GID among %d", n);
    CHECK(ferroce_alloc_pd(e->ctx, &e->pd) == 0, "alloc_pd");
    e->mem = ferroce_mem_alloc(MEM);
    CHECK(e->mem && ferroce_mem_len(e->mem) >= MEM, "mem_alloc");
    e->buf = ferroce_mem_addr(e->mem);
    uint32_t access = FERROCE_ACCESS_LOCAL_WRITE | FERROCE_ACCESS_REMOTE_WRITE |
                      FERROCE_ACCESS_REMOTE_READ | FERROCE_ACCESS_REMOTE_ATOMIC;
    CHECK(ferroce_reg_mr(e->ctx, e->pd, e->mem, access, &e->lkey, &e->rkey) == 0, "reg_mr");
    e->cq = ferroce_create_cq(e->ctx, 256);
    CHECK(e->cq, "create_cq");
    e->qp = ferroce_create_qp(e->ctx, e->pd, e->cq, e->cq, NULL);
    CHECK(e->qp, "create_qp");
}

static void connect_to(struct end *e, const struct end *peer) {
    struct ferroce_qp_attr a;
    memset(&a, 0, sizeof a);
    a.state = FERROCE_QPS_INIT;
    a.access_flags =
        FERROCE_ACCESS_REMOTE_WRITE | FERROCE_ACCESS_REMOTE_READ | FERROCE_ACCESS_REMOTE_ATOMIC;
    CHECK(ferroce_modify_qp(e->ctx, e->qp, &a, FERROCE_QP_STATE | FERROCE_QP_ACCESS_FLAGS) == 0,
          "to INIT");
    memset(&a, 0, sizeof a);
    a.state = FERROCE_QPS_RTR;
    a.path_mtu = 1024;
    a.dest_qp_num = ferroce_qp_num(peer->qp);
    a.rq_psn = ferroce_qp_sq_psn(peer->qp);
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.remote_gid = peer->gid;
    CHECK(ferroce_modify_qp(e->ctx, e->qp, &a,
                            FERROCE_QP_STATE | FERROCE_QP_AV | FERROCE_QP_PATH_MTU |
                                FERROCE_QP_DEST_QPN | FERROCE_QP_RQ_PSN |
                                FERROCE_QP_MAX_DEST_RD_ATOMIC | FERROCE_QP_MIN_RNR_TIMER) == 0,
          "to RTR");
    memset(&a, 0, sizeof a);
    a.state = FERROCE_QPS_RTS;
    a.sq_psn = ferroce_qp_sq_psn(e->qp);
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    CHECK(ferroce_modify_qp(e->ctx, e->qp, &a,
                            FERROCE_QP_STATE | FERROCE_QP_SQ_PSN | FERROCE_QP_TIMEOUT |
                                FERROCE_QP_RETRY_CNT | FERROCE_QP_RNR_RETRY |
                                FERROCE_QP_MAX_QP_RD_ATOMIC) == 0,
          "to RTS");
}

static struct ferroce_wc wait_one(struct end *e) {
    struct ferroce_wc wc;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int n = ferroce_poll_cq(e->cq, 1, &wc);
        CHECK(n >= 0, "poll_cq: %d", n);
        if (n == 1)
            return wc;
        clock_gettime(CLOCK_MONOTONIC, &t);
        CHECK(t.tv_sec - t0.tv_sec < 10, "no completion in 10 s");
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
    }
}

static void post(struct end *e, uint64_t id, uint32_t op, uint32_t off, uint32_t len,
                 uint64_t raddr, uint32_t rkey, uint32_t imm, uint64_t cmp, uint64_t swp) {
    struct ferroce_sge sge = {(uint64_t)(uintptr_t)(e->buf + off), len, e->lkey};
    struct ferroce_send_wr wr;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = id;
    wr.opcode = op;
    wr.send_flags = FERROCE_SEND_SIGNALED;
    wr.imm_data = imm;
    wr.num_sge = 1;
    wr.sg_list = &sge;
    wr.remote_addr = raddr;
    wr.rkey = rkey;
    wr.compare_add = cmp;
    wr.swap = swp;
    CHECK(ferroce_post_send(e->qp, &wr) == 0, "post_send %llu", (unsigned long long)id);
    struct ferroce_wc wc = wait_one(e);
    CHECK(wc.wr_id == id && wc.status == 0, "completion of %llu: wr_id %llu status %u",
          (unsigned long long)id, (unsigned long long)wc.wr_id, wc.status);
}

int main(int argc, char **argv) {
    CHECK(argc == 3, "usage: rdma A.sock B.sock");
    struct end a, b;
    open_end(&a, argv[1]);
    open_end(&b, argv[2]);
    connect_to(&a, &b);
    connect_to(&b, &a);
    uint64_t rb = (uint64_t)(uintptr_t)b.buf;

    /* WRITE 16 KiB of a pattern into B. */
    for (int i = 0; i < 16384; i++)
        a.buf[i] = (uint8_t)(i * 7 + 3);
    post(&a, 1, FERROCE_WR_RDMA_WRITE, 0, 16384, rb, b.rkey, 0, 0, 0);
    CHECK(memcmp(a.buf, b.buf, 16384) == 0, "WRITE: B's bytes differ");

    /* SEND with immediate into a receive B posted. */
    for (int i = 0; i < 4096; i++)
        a.buf[16384 + i] = (uint8_t)(i ^ 0x5a);
    struct ferroce_sge rsge = {(uint64_t)(uintptr_t)(b.buf + 32768), 4096, b.lkey};
    struct ferroce_recv_wr rwr = {77, 1, &rsge};
    CHECK(ferroce_post_recv(b.qp, &rwr) == 0, "post_recv");
    post(&a, 2, FERROCE_WR_SEND_WITH_IMM, 16384, 4096, 0, 0, 0x1234abcd, 0, 0);
    struct ferroce_wc wc = wait_one(&b);
    CHECK(wc.wr_id == 77 && wc.status == 0 && wc.byte_len == 4096, "receive: %llu %u %u",
          (unsigned long long)wc.wr_id, wc.status, wc.byte_len);
    CHECK((wc.wc_flags & FERROCE_WC_WITH_IMM) && wc.imm_data == 0x1234abcd, "imm %x flags %x",
          wc.imm_data, wc.wc_flags);
    CHECK(memcmp(a.buf + 16384, b.buf + 32768, 4096) == 0, "SEND: B's bytes differ");

    /* READ 8 KiB of B back. */
    for (int i = 0; i < 8192; i++)
        b.buf[40960 + i] = (uint8_t)(i * 13 + 1);
    post(&a, 3, FERROCE_WR_RDMA_READ, 49152, 8192, rb + 40960, b.rkey, 0, 0, 0);
    CHECK(memcmp(a.buf + 49152, b.buf + 40960, 8192) == 0, "READ: A's bytes differ");

    /* Fetch-and-add, then compare-and-swap, on a word of B's. */
    uint64_t *word = (uint64_t *)(b.buf + 61440), *old = (uint64_t *)(a.buf + 57344);
    *word = 1000;
    post(&a, 4, FERROCE_WR_ATOMIC_FETCH_AND_ADD, 57344, 8, rb + 61440, b.rkey, 0, 25, 0);
    CHECK(*old == 1000 && *word == 1025, "FETCH_ADD: old %llu, now %llu",
          (unsigned long long)*old, (unsigned long long)*word);
    post(&a, 5, FERROCE_WR_ATOMIC_CMP_AND_SWP, 57344, 8, rb + 61440, b.rkey, 0, 1025, 42);
    CHECK(*old == 1025 && *word == 42, "CMP_SWAP: old %llu, now %llu",
          (unsigned long long)*old, (unsigned long long)*word);

    /* Bad requests: refused with a reason, nothing posted. */
    struct ferroce_sge sge = {(uint64_t)(uintptr_t)a.buf, 8, a.lkey};
    struct ferroce_send_wr bad;
    memset(&bad, 0, sizeof bad);
    bad.opcode = 99;
    bad.num_sge = 1;
    bad.sg_list = &sge;
    CHECK(ferroce_post_send(a.qp, &bad) == -EINVAL && strstr(ferroce_last_error(), "opcode"),
          "opcode 99 taken");
    bad.opcode = FERROCE_WR_RDMA_WRITE;
    bad.num_sge = 9;
    CHECK(ferroce_post_send(a.qp, &bad) == -EINVAL, "9 SGEs taken");
    bad.num_sge = 1;
    bad.sg_list = NULL;
    CHECK(ferroce_post_send(a.qp, &bad) == -EINVAL, "a NULL sg_list taken");
    CHECK(ferroce_post_send(NULL, &bad) == -EINVAL, "a NULL QP taken");
    CHECK(ferroce_poll_cq(a.cq, -1, &wc) == -EINVAL, "max -1 taken");
    CHECK(ferroce_attach("/nonexistent/ferroce.sock") == NULL && *ferroce_last_error(),
          "attached to nothing");
    struct ferroce_qp_attr bad_attr;
    memset(&bad_attr, 0, sizeof bad_attr);
    bad_attr.state = 9;
    CHECK(ferroce_modify_qp(a.ctx, a.qp, &bad_attr, FERROCE_QP_STATE) == -EINVAL, "state 9");
    CHECK(ferroce_poll_cq(a.cq, 4, &wc) == 0, "a refused request completed");

    /* Teardown, each verb answered. */
    struct end *ends[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        struct end *e = ends[i];
        CHECK(ferroce_destroy_qp(e->ctx, e->qp) == 0, "destroy_qp");
        CHECK(ferroce_destroy_cq(e->ctx, e->cq) == 0, "destroy_cq");
        CHECK(ferroce_dereg_mr(e->ctx, e->lkey) == 0, "dereg_mr");
        CHECK(ferroce_dealloc_pd(e->ctx, e->pd) == 0, "dealloc_pd");
        ferroce_mem_free(e->mem);
        ferroce_detach(e->ctx);
    }
    printf("capi: ok\n");
    return 0;
}
