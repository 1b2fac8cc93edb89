/*
 * An ordinary libibverbs program, built against Debian's <infiniband/verbs.h> and run with
 * libferroce_ibverbs.so preloaded: two devices (two roced nodes, FERROCE_SOCKET=A:B), one RC QP
 * on each, connected to each other in-process; then through the extended work-request API
 * (ibv_wr_*) and through ibv_post_send: WRITE, READ, SEND with immediate, fetch-and-add and
 * compare-and-swap, every byte checked; a batch of three posted at once; an aborted batch
 * that posts nothing. Prints "ok" and exits 0, or says what failed and exits 1.
 */
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LEN (64 * 1024)
#define die(...) do { fprintf(stderr, "wr_api: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

struct node {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	unsigned char *buf;
	union ibv_gid gid;
};

static void open_node(struct ibv_device *d, struct node *n)
{
	n->ctx = ibv_open_device(d);
	if (!n->ctx) die("ibv_open_device");
	n->pd = ibv_alloc_pd(n->ctx);
	if (!n->pd) die("ibv_alloc_pd");
	/* Ordinary heap memory, not page aligned. */
	n->buf = malloc(LEN + 100);
	if (!n->buf) die("malloc");
	n->buf += 64 - ((unsigned long)n->buf % 64);
	memset(n->buf, 0, LEN);
	n->mr = ibv_reg_mr(n->pd, n->buf, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	if (!n->mr) die("ibv_reg_mr");
	n->cq = ibv_create_cq(n->ctx, 64, NULL, NULL, 0);
	if (!n->cq) die("ibv_create_cq");
	struct ibv_qp_init_attr_ex a = {
		.send_cq = n->cq, .recv_cq = n->cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 1,
			 .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = n->pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
				  IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
				  IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_SEND,
	};
	n->qp = ibv_create_qp_ex(n->ctx, &a);
	if (!n->qp) die("ibv_create_qp_ex");
	n->qpx = ibv_qp_to_qp_ex(n->qp);
	if (!n->qpx) die("ibv_qp_to_qp_ex");
	/* GID 1: the port's IPv4 address. */
	if (ibv_query_gid(n->ctx, 1, 1, &n->gid)) die("ibv_query_gid");
}

static void connect_to(struct node *n, struct node *peer)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags =
				 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC };
	if (ibv_modify_qp(n->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify to INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 0x1234;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(n->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify to RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x1234;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	if (ibv_modify_qp(n->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify to RTS");
	struct ibv_qp_init_attr init;
	if (ibv_query_qp(n->qp, &a, IBV_QP_STATE | IBV_QP_CAP, &init)) die("ibv_query_qp");
	if (a.qp_state != IBV_QPS_RTS || n->qp->state != IBV_QPS_RTS) die("state %d after RTS", a.qp_state);
	if (init.cap.max_inline_data < 64) die("max_inline_data %u", init.cap.max_inline_data);
}

static struct ibv_wc wait_wc(struct node *n)
{
	struct ibv_wc wc;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int r = ibv_poll_cq(n->cq, 1, &wc);
		if (r < 0) die("ibv_poll_cq %d", r);
		if (r == 1) {
			if (wc.status != IBV_WC_SUCCESS)
				die("wr %llu: %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
			return wc;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 20) die("no completion in 20 s");
	}
}

static void expect(struct node *n, unsigned long long id, enum ibv_wc_opcode op)
{
	struct ibv_wc wc = wait_wc(n);
	if (wc.wr_id != id || wc.opcode != op)
		die("completion wr %llu opcode %d, want %llu %d", (unsigned long long)wc.wr_id, wc.opcode, id, op);
}

static void fill(unsigned char *p, int len, int seed)
{
	for (int i = 0; i < len; i++) p[i] = (unsigned char)(i * 7 + seed);
}

static void same(const unsigned char *a, const unsigned char *b, int len, const char *what)
{
	for (int i = 0; i < len; i++)
		if (a[i] != b[i]) die("%s: byte %d is %d, want %d", what, i, a[i], b[i]);
}

int main(void)
{
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list || num < 2) die("want two devices (FERROCE_SOCKET=A:B), have %d", num);
	struct node a, b;
	open_node(list[0], &a);
	open_node(list[1], &b);
	ibv_free_device_list(list);
	connect_to(&a, &b);
	connect_to(&b, &a);
	struct ibv_qp_ex *x = a.qpx;

	/* WRITE of 16 KiB through ibv_wr_*, from two SGEs. */
	fill(a.buf, 16384, 1);
	ibv_wr_start(x);
	x->wr_id = 1;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(x, b.mr->rkey, (uintptr_t)b.buf);
	struct ibv_sge two[2] = { { (uintptr_t)a.buf, 10000, a.mr->lkey },
				  { (uintptr_t)a.buf + 10000, 6384, a.mr->lkey } };
	ibv_wr_set_sge_list(x, 2, two);
	if (ibv_wr_complete(x)) die("ibv_wr_complete");
	expect(&a, 1, IBV_WC_RDMA_WRITE);
	same(b.buf, a.buf, 16384, "WRITE");

	/* An aborted batch posts nothing. */
	ibv_wr_start(x);
	x->wr_id = 99;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(x, b.mr->rkey, (uintptr_t)b.buf);
	ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)a.buf + 32768, 4096);
	ibv_wr_abort(x);

	/* A batch of three: READ back into A, an inline WRITE, a fetch-and-add. */
	fill(b.buf + 20000, 8192, 5);
	uint64_t *counter = (uint64_t *)(b.buf + 40960);
	*counter = 1000;
	ibv_wr_start(x);
	x->wr_id = 2;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(x, b.mr->rkey, (uintptr_t)b.buf + 20000);
	ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)a.buf + 20000, 8192);
	x->wr_id = 3;
	x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_write(x, b.mr->rkey, (uintptr_t)b.buf + 30000);
	char msg[] = "inline bytes from the stack";
	ibv_wr_set_inline_data(x, msg, sizeof(msg));
	x->wr_id = 4;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_fetch_add(x, b.mr->rkey, (uintptr_t)counter, 23);
	ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)a.buf + 48000, 8);
	if (ibv_wr_complete(x)) die("ibv_wr_complete of three");
	expect(&a, 2, IBV_WC_RDMA_READ);
	expect(&a, 3, IBV_WC_RDMA_WRITE);
	expect(&a, 4, IBV_WC_FETCH_ADD);
	same(a.buf + 20000, b.buf + 20000, 8192, "READ");
	same(b.buf + 30000, (unsigned char *)msg, sizeof(msg), "inline WRITE");
	if (*(uint64_t *)(a.buf + 48000) != 1000 || *counter != 1023)
		die("fetch-and-add: got %llu, now %llu", (unsigned long long)*(uint64_t *)(a.buf + 48000),
		    (unsigned long long)*counter);

	/* Compare-and-swap through ibv_post_send: one that matches, one that does not. */
	struct ibv_sge s = { (uintptr_t)a.buf + 48008, 8, a.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 5, .sg_list = &s, .num_sge = 1,
				 .opcode = IBV_WR_ATOMIC_CMP_AND_SWP, .send_flags = IBV_SEND_SIGNALED };
	w.wr.atomic.remote_addr = (uintptr_t)counter;
	w.wr.atomic.rkey = b.mr->rkey;
	w.wr.atomic.compare_add = 1023;
	w.wr.atomic.swap = 7;
	struct ibv_send_wr *bad;
	if (ibv_post_send(a.qp, &w, &bad)) die("ibv_post_send cmp-swap");
	expect(&a, 5, IBV_WC_COMP_SWAP);
	if (*(uint64_t *)(a.buf + 48008) != 1023 || *counter != 7) die("compare-and-swap that matches");
	w.wr_id = 6;
	if (ibv_post_send(a.qp, &w, &bad)) die("ibv_post_send cmp-swap 2");
	expect(&a, 6, IBV_WC_COMP_SWAP);
	if (*(uint64_t *)(a.buf + 48008) != 7 || *counter != 7) die("compare-and-swap that does not match");

	/* SEND with immediate into a posted receive. */
	struct ibv_sge rs = { (uintptr_t)b.buf + 50000, 4096, b.mr->lkey };
	struct ibv_recv_wr r = { .wr_id = 7, .sg_list = &rs, .num_sge = 1 }, *rbad;
	if (ibv_post_recv(b.qp, &r, &rbad)) die("ibv_post_recv");
	fill(a.buf + 52000, 3000, 9);
	ibv_wr_start(x);
	x->wr_id = 8;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(x, htonl(0xfeedbeef));
	ibv_wr_set_sge(x, a.mr->lkey, (uintptr_t)a.buf + 52000, 3000);
	if (ibv_wr_complete(x)) die("ibv_wr_complete send");
	expect(&a, 8, IBV_WC_SEND);
	struct ibv_wc wc = wait_wc(&b);
	if (wc.wr_id != 7 || wc.opcode != IBV_WC_RECV || wc.byte_len != 3000 ||
	    !(wc.wc_flags & IBV_WC_WITH_IMM) || ntohl(wc.imm_data) != 0xfeedbeef || wc.qp_num != b.qp->qp_num)
		die("receive: wr %llu opcode %d len %u flags %x imm %x", (unsigned long long)wc.wr_id,
		    wc.opcode, wc.byte_len, wc.wc_flags, ntohl(wc.imm_data));
	same(b.buf + 50000, a.buf + 52000, 3000, "SEND");

	/* The aborted WRITE never happened, and nothing else completed. */
	for (int i = 0; i < 4096; i++)
		if (b.buf[i] != a.buf[i]) die("the aborted batch wrote byte %d", i);
	if (ibv_poll_cq(a.cq, 1, &wc) != 0) die("a completion nobody asked for: wr %llu", (unsigned long long)wc.wr_id);

	/* A bad lkey fails its request, and the QP goes to the error state, as on any RNIC. */
	ibv_wr_start(x);
	x->wr_id = 10;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(x, b.mr->rkey, (uintptr_t)b.buf);
	ibv_wr_set_sge(x, a.mr->lkey ^ 0x5a5a00, (uintptr_t)a.buf, 64);
	if (ibv_wr_complete(x)) die("ibv_wr_complete bad lkey");
	for (;;) {
		int n = ibv_poll_cq(a.cq, 1, &wc);
		if (n < 0) die("poll");
		if (n == 1) break;
	}
	if (wc.wr_id != 10 || wc.status == IBV_WC_SUCCESS) die("a bad lkey succeeded");

	/* Asynchronous events: a pollable async_fd with nothing waiting (an error a completion
	 * reports raises none); made non-blocking, ibv_get_async_event says EAGAIN. */
	if (a.ctx->async_fd < 0) die("no async_fd");
	struct pollfd pfd = { .fd = a.ctx->async_fd, .events = POLLIN };
	if (poll(&pfd, 1, 200) != 0) die("an asynchronous event after a completion error");
	if (fcntl(a.ctx->async_fd, F_SETFL, fcntl(a.ctx->async_fd, F_GETFL) | O_NONBLOCK))
		die("fcntl");
	struct ibv_async_event ev;
	errno = 0;
	if (ibv_get_async_event(a.ctx, &ev) != -1 || errno != EAGAIN)
		die("ibv_get_async_event on a quiet non-blocking async_fd: errno %d", errno);

	if (ibv_destroy_qp(a.qp) || ibv_destroy_qp(b.qp)) die("ibv_destroy_qp");
	if (ibv_destroy_cq(a.cq) || ibv_destroy_cq(b.cq)) die("ibv_destroy_cq");
	if (ibv_dereg_mr(a.mr) || ibv_dereg_mr(b.mr)) die("ibv_dereg_mr");
	if (ibv_dealloc_pd(a.pd) || ibv_dealloc_pd(b.pd)) die("ibv_dealloc_pd");
	if (ibv_close_device(a.ctx) || ibv_close_device(b.ctx)) die("ibv_close_device");
	printf("ok\n");
	return 0;
}
