/* algo.c: the collective algorithms, written once over pg_xfer() so they run
 * the same on shared memory and TCP. Small all_reduce: recursive doubling
 * (log2 n steps, non-powers of two folded in and out); large: the ring,
 * reduce-scatter then all-gather, n-1 steps each, every step streaming a
 * block through the transport while the previous one is still arriving.
 * Every rank reduces in an order that gives bit-identical results on all
 * ranks. f16/bf16 reductions run in f32 and round once at the end.
 */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "kernels/kernels.h"
#include "worker_sdk/worker.h"

static int peer_of(const struct crun_pg *pg, int off)
{
	return (int)(((long)pg->rank + off + 2L * pg->size) % pg->size);
}

/* Near-equal partition of count elements into n blocks. */
static size_t blk_off(size_t count, int n, int i)
{
	return (size_t)i * (count / (size_t)n) + MIN((size_t)i, count % (size_t)n);
}

static size_t blk_cnt(size_t count, int n, int i)
{
	return count / (size_t)n + ((size_t)i < count % (size_t)n);
}

static uint8_t *scratch(struct crun_pg *pg, size_t len)
{
	if (len > pg->scratch_len) {
		uint8_t *p = realloc(pg->scratch, len);

		if (!p)
			return NULL;
		pg->scratch = p;
		pg->scratch_len = len;
	}
	return pg->scratch ? pg->scratch : (uint8_t *)pg; /* len 0: any non-NULL */
}

static int is_half(int dtype)
{
	return dtype == CRUN_F16 || dtype == CRUN_BF16;
}

static void half_to_f32(void *dst, const void *src, size_t count, int dtype)
{
	if (dtype == CRUN_BF16)
		kernels_bf16_to_f32(dst, src, count);
	else
		kernels_f16_to_f32(dst, src, count);
}

static void f32_to_half(void *dst, const void *src, size_t count, int dtype)
{
	if (dtype == CRUN_BF16)
		kernels_f32_to_bf16(dst, src, count);
	else
		kernels_f32_to_f16(dst, src, count);
}

int algo_barrier(struct crun_pg *pg)
{
	uint8_t out = 1, in;

	/* Dissemination: after round k every rank has heard from 2^k others. */
	for (int k = 1; k < pg->size; k <<= 1)
		TRY(pg_sendrecv(pg, peer_of(pg, k), &out, 1, peer_of(pg, -k), &in, 1, 0, 0, 0));
	return 0;
}

/* ---- ring phases over blocks of a buffer ---------------------------------- */

/* After it, rank r holds the full reduction of block r in buf. src is the
 * input (src == buf: in place). Out of place, every block received is one
 * buf has not held yet (the block sent at step s was received at s - 1),
 * so it becomes src op incoming and src is never copied to buf up front. */
static int ring_reduce_scatter(struct crun_pg *pg, const uint8_t *src, uint8_t *buf, size_t count,
			       int dtype, int op)
{
	int n = pg->size, r = pg->rank;
	size_t esz = crun_dtype_size(dtype);

	for (int s = 0; s < n - 1; s++) {
		int sb = (r - s - 1 + 2 * n) % n, rb = (r - s - 2 + 2 * n) % n;
		size_t so = blk_off(count, n, sb) * esz, ro = blk_off(count, n, rb) * esz;
		struct xfer x[2] = {
		    {.peer = peer_of(pg, 1),
		     .dir = XF_SEND,
		     .buf = (uint8_t *)(s == 0 ? src : buf) + so,
		     .len = blk_cnt(count, n, sb) * esz},
		    {.peer = peer_of(pg, -1),
		     .dir = XF_RECV_REDUCE,
		     .buf = buf + ro,
		     .len = blk_cnt(count, n, rb) * esz,
		     .dtype = dtype,
		     .op = op,
		     .acc = src != buf ? src + ro : NULL},
		};

		TRY(pg_xfer(pg, x, 2));
	}
	return 0;
}

/* Rank r starts with block r; afterwards everyone has every block. */
static int ring_all_gather(struct crun_pg *pg, uint8_t *buf, size_t count, size_t esz)
{
	int n = pg->size, r = pg->rank;

	for (int s = 0; s < n - 1; s++) {
		int sb = (r - s + n) % n, rb = (r - s - 1 + 2 * n) % n;

		TRY(pg_sendrecv(pg, peer_of(pg, 1), buf + blk_off(count, n, sb) * esz,
				blk_cnt(count, n, sb) * esz, peer_of(pg, -1),
				buf + blk_off(count, n, rb) * esz, blk_cnt(count, n, rb) * esz, 0,
				0, 0));
	}
	return 0;
}

/* ---- all_reduce ------------------------------------------------------------- */

static int rd_all_reduce(struct crun_pg *pg, uint8_t *buf, size_t count, int dtype, int op)
{
	int n = pg->size, r = pg->rank, p2 = 1, rem;
	size_t bytes = count * crun_dtype_size(dtype);
	uint8_t *tmp;

	while (p2 * 2 <= n)
		p2 *= 2;
	rem = n - p2;
	/* Ranks past the largest power of two hand their data to a partner
	 * and get the result back at the end. */
	if (r >= p2) {
		struct xfer x = {.peer = r - p2, .dir = XF_SEND, .buf = buf, .len = bytes};

		TRY(pg_xfer(pg, &x, 1));
		x = (struct xfer){.peer = r - p2, .dir = XF_RECV, .buf = buf, .len = bytes};
		return pg_xfer(pg, &x, 1);
	}
	if (r < rem) {
		struct xfer x = {.peer = r + p2,
				 .dir = XF_RECV_REDUCE,
				 .buf = buf,
				 .len = bytes,
				 .dtype = dtype,
				 .op = op};

		TRY(pg_xfer(pg, &x, 1));
	}
	tmp = scratch(pg, bytes);
	if (!tmp)
		return CRUN_ENOMEM;
	for (int mask = 1; mask < p2; mask <<= 1) {
		int partner = r ^ mask;

		TRY(pg_sendrecv(pg, partner, buf, bytes, partner, tmp, bytes, 0, 0, 0));
		TRY(kernels_reduce(buf, tmp, count, dtype, op));
	}
	if (r < rem) {
		struct xfer x = {.peer = r + p2, .dir = XF_SEND, .buf = buf, .len = bytes};

		TRY(pg_xfer(pg, &x, 1));
	}
	return 0;
}

/* src == buf: in place. Otherwise the ring reads src directly; recursive
 * doubling copies it first. */
static int all_reduce_core(struct crun_pg *pg, const uint8_t *src, uint8_t *buf, size_t count,
			   int dtype, int op)
{
	size_t esz = crun_dtype_size(dtype);

	if (count * esz < pg->ring_threshold || count < (size_t)pg->size) {
		if (src != buf)
			memcpy(buf, src, count * esz);
		return rd_all_reduce(pg, buf, count, dtype, op);
	}
	TRY(ring_reduce_scatter(pg, src, buf, count, dtype, op));
	return ring_all_gather(pg, buf, count, esz);
}

int algo_all_reduce(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype,
		    int op)
{
	float *tmp;
	int r;

	if (!is_half(dtype)) {
		if (pg->size == 1) {
			if (sbuf != rbuf)
				memcpy(rbuf, sbuf, count * crun_dtype_size(dtype));
			return 0;
		}
		TRY(all_reduce_core(pg, sbuf, rbuf, count, dtype, op));
		return op == CRUN_AVG ? kernels_div(rbuf, count, dtype, pg->size) : 0;
	}
	tmp = malloc(count * sizeof(float) + 1);
	if (!tmp)
		return CRUN_ENOMEM;
	half_to_f32(tmp, sbuf, count, dtype);
	r = pg->size == 1
		? 0
		: all_reduce_core(pg, (uint8_t *)tmp, (uint8_t *)tmp, count, CRUN_F32, op);
	if (r == 0 && op == CRUN_AVG)
		r = kernels_div(tmp, count, CRUN_F32, pg->size);
	if (r == 0)
		f32_to_half(rbuf, tmp, count, dtype);
	free(tmp);
	return r;
}

/* ---- broadcast ---------------------------------------------------------------- */

static int tree_broadcast(struct crun_pg *pg, void *buf, size_t bytes, int root)
{
	int n = pg->size, vr = (pg->rank - root + n) % n, mask = 1, nx = 0;
	struct xfer xs[32];

	while (mask < n) {
		if (vr & mask) {
			struct xfer x = {.peer = (vr - mask + root) % n,
					 .dir = XF_RECV,
					 .buf = buf,
					 .len = bytes};

			TRY(pg_xfer(pg, &x, 1));
			break;
		}
		mask <<= 1;
	}
	/* Send to every child at once; they drain in parallel. */
	for (mask >>= 1; mask > 0; mask >>= 1)
		if (vr + mask < n)
			xs[nx++] = (struct xfer){.peer = (vr + mask + root) % n,
						 .dir = XF_SEND,
						 .buf = buf,
						 .len = bytes};
	return nx ? pg_xfer(pg, xs, nx) : 0;
}

int algo_broadcast(struct crun_pg *pg, void *buf, size_t count, int dtype, int root)
{
	size_t esz = crun_dtype_size(dtype);
	int n = pg->size, r;
	struct xfer *xs;

	if (n == 1 || count == 0)
		return 0;
	if (count * esz < pg->ring_threshold || count < (size_t)n)
		return tree_broadcast(pg, buf, count * esz, root);
	/* Large: scatter the blocks from the root, then ring all-gather, so
	 * the root sends the message once instead of log2(n) times. */
	if (pg->rank == root) {
		int nx = 0;

		xs = calloc((size_t)n, sizeof(*xs));
		if (!xs)
			return CRUN_ENOMEM;
		for (int p = 0; p < n; p++)
			if (p != root)
				xs[nx++] = (struct xfer){.peer = p,
							 .dir = XF_SEND,
							 .buf = (uint8_t *)buf +
								blk_off(count, n, p) * esz,
							 .len = blk_cnt(count, n, p) * esz};
		r = pg_xfer(pg, xs, nx);
		free(xs);
		TRY(r);
	} else {
		struct xfer x = {.peer = root,
				 .dir = XF_RECV,
				 .buf = (uint8_t *)buf + blk_off(count, n, pg->rank) * esz,
				 .len = blk_cnt(count, n, pg->rank) * esz};

		TRY(pg_xfer(pg, &x, 1));
	}
	return ring_all_gather(pg, buf, count, esz);
}

/* ---- reduce --------------------------------------------------------------------- */

static int tree_reduce(struct crun_pg *pg, uint8_t *work, size_t count, int dtype, int op, int root)
{
	int n = pg->size, vr = (pg->rank - root + n) % n;
	size_t bytes = count * crun_dtype_size(dtype);

	for (int mask = 1; mask < n; mask <<= 1) {
		struct xfer x = {.buf = work, .len = bytes, .dtype = dtype, .op = op};

		if (vr & mask) {
			x.peer = (vr - mask + root) % n;
			x.dir = XF_SEND;
			return pg_xfer(pg, &x, 1);
		}
		if ((vr | mask) < n) {
			x.peer = ((vr | mask) + root) % n;
			x.dir = XF_RECV_REDUCE;
			TRY(pg_xfer(pg, &x, 1));
		}
	}
	return 0;
}

/* Large: ring reduce-scatter, then every rank sends its block to the root. */
static int ring_reduce(struct crun_pg *pg, uint8_t *work, size_t count, int dtype, int op, int root)
{
	int n = pg->size, nx = 0, r;
	size_t esz = crun_dtype_size(dtype);
	struct xfer *xs;

	TRY(ring_reduce_scatter(pg, work, work, count, dtype, op));
	xs = calloc((size_t)n, sizeof(*xs));
	if (!xs)
		return CRUN_ENOMEM;
	for (int p = 0; p < n; p++) {
		if (pg->rank == root && p != root)
			xs[nx++] = (struct xfer){.peer = p,
						 .dir = XF_RECV,
						 .buf = work + blk_off(count, n, p) * esz,
						 .len = blk_cnt(count, n, p) * esz};
		else if (pg->rank != root && p == pg->rank)
			xs[nx++] = (struct xfer){.peer = root,
						 .dir = XF_SEND,
						 .buf = work + blk_off(count, n, p) * esz,
						 .len = blk_cnt(count, n, p) * esz};
	}
	r = pg_xfer(pg, xs, nx);
	free(xs);
	return r;
}

static int reduce_inplace(struct crun_pg *pg, uint8_t *work, size_t count, int dtype, int op,
			  int root)
{
	if (pg->size == 1)
		return 0;
	if (count * crun_dtype_size(dtype) < pg->ring_threshold || count < (size_t)pg->size)
		return tree_reduce(pg, work, count, dtype, op, root);
	return ring_reduce(pg, work, count, dtype, op, root);
}

int algo_reduce(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype, int op,
		int root)
{
	int at_root = pg->rank == root, wdt = is_half(dtype) ? CRUN_F32 : dtype, r;
	size_t bytes = count * crun_dtype_size(wdt);
	uint8_t *work;

	/* Non-roots reduce in scratch: their recvbuf is not theirs to use. */
	work = is_half(dtype) ? malloc(bytes + 1) : at_root ? rbuf : scratch(pg, bytes);
	if (!work)
		return CRUN_ENOMEM;
	if (is_half(dtype))
		half_to_f32(work, sbuf, count, dtype);
	else if (work != sbuf)
		memcpy(work, sbuf, bytes);
	r = reduce_inplace(pg, work, count, wdt, op, root);
	if (r == 0 && at_root && op == CRUN_AVG)
		r = kernels_div(work, count, wdt, pg->size);
	if (r == 0 && at_root && is_half(dtype))
		f32_to_half(rbuf, work, count, dtype);
	if (is_half(dtype))
		free(work);
	return r;
}

/* ---- gather-like ------------------------------------------------------------------ */

int algo_all_gather(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype)
{
	size_t bytes = count * crun_dtype_size(dtype);
	uint8_t *mine = (uint8_t *)rbuf + (size_t)pg->rank * bytes;

	if (sbuf != mine)
		memcpy(mine, sbuf, bytes);
	if (pg->size == 1 || !count)
		return 0;
	/* Equal blocks of `count`: the ring over the whole output. */
	return ring_all_gather(pg, rbuf, count * (size_t)pg->size, crun_dtype_size(dtype));
}

/* Root exchanges one block with every other rank at once. */
static int root_fanout(struct crun_pg *pg, uint8_t *blocks, size_t bytes, int root, int dir,
		       const void *mine_src, void *mine_dst)
{
	int n = pg->size, nx = 0, r;
	struct xfer *xs;

	if (pg->rank != root) {
		struct xfer x = {.peer = root,
				 .dir = dir == XF_SEND ? XF_RECV : XF_SEND,
				 .buf = dir == XF_SEND ? mine_dst : (uint8_t *)mine_src,
				 .len = bytes};

		return pg_xfer(pg, &x, 1);
	}
	xs = calloc((size_t)n, sizeof(*xs));
	if (!xs)
		return CRUN_ENOMEM;
	for (int p = 0; p < n; p++)
		if (p != root)
			xs[nx++] = (struct xfer){
			    .peer = p, .dir = dir, .buf = blocks + (size_t)p * bytes, .len = bytes};
	r = pg_xfer(pg, xs, nx);
	free(xs);
	return r;
}

int algo_gather(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype, int root)
{
	size_t bytes = count * crun_dtype_size(dtype);

	if (pg->rank == root && (uint8_t *)rbuf + (size_t)root * bytes != sbuf)
		memcpy((uint8_t *)rbuf + (size_t)root * bytes, sbuf, bytes);
	return root_fanout(pg, rbuf, bytes, root, XF_RECV, sbuf, NULL);
}

int algo_scatter(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype,
		 int root)
{
	size_t bytes = count * crun_dtype_size(dtype);

	if (pg->rank == root && (const uint8_t *)sbuf + (size_t)root * bytes != rbuf)
		memcpy(rbuf, (const uint8_t *)sbuf + (size_t)root * bytes, bytes);
	return root_fanout(pg, (uint8_t *)sbuf, bytes, root, XF_SEND, NULL, rbuf);
}

int algo_reduce_scatter(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype,
			int op)
{
	int n = pg->size, wdt = is_half(dtype) ? CRUN_F32 : dtype, r;
	size_t total = count * (size_t)n, esz = crun_dtype_size(wdt);
	uint8_t *work = is_half(dtype) ? malloc(total * esz + 1) : scratch(pg, total * esz);
	uint8_t *mine;

	if (!work)
		return CRUN_ENOMEM;
	if (is_half(dtype))
		half_to_f32(work, sbuf, total, dtype);
	else if (n == 1)
		memcpy(work, sbuf, total * esz);
	/* Out of place from sbuf: the ring fills every block of work it uses. */
	r = n > 1 ? ring_reduce_scatter(pg, is_half(dtype) ? work : sbuf, work, total, wdt, op) : 0;
	mine = work + (size_t)pg->rank * count * esz; /* equal blocks: block r at r*count */
	if (r == 0 && op == CRUN_AVG)
		r = kernels_div(mine, count, wdt, n);
	if (r == 0) {
		if (is_half(dtype))
			f32_to_half(rbuf, mine, count, dtype);
		else
			memmove(rbuf, mine, count * esz);
	}
	if (is_half(dtype))
		free(work);
	return r;
}

int algo_all_to_all(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype)
{
	int n = pg->size, r = pg->rank;
	size_t bytes = count * crun_dtype_size(dtype);
	const uint8_t *src = sbuf;

	if (sbuf == rbuf) {
		uint8_t *copy = scratch(pg, bytes * (size_t)n);

		if (!copy)
			return CRUN_ENOMEM;
		memcpy(copy, sbuf, bytes * (size_t)n);
		src = copy;
	} else {
		memcpy((uint8_t *)rbuf + (size_t)r * bytes, src + (size_t)r * bytes, bytes);
	}
	/* Pairwise exchange: step s sends to r+s while receiving from r-s. */
	for (int s = 1; s < n; s++) {
		int to = peer_of(pg, s), from = peer_of(pg, -s);

		TRY(pg_sendrecv(pg, to, src + (size_t)to * bytes, bytes, from,
				(uint8_t *)rbuf + (size_t)from * bytes, bytes, 0, 0, 0));
	}
	return 0;
}
