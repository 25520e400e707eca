/* shm.c: the shared-memory transport between ranks on one host. Each rank
 * owns an "inbox" segment (shm_open, name published in the store) holding one
 * single-producer/single-consumer ring per peer; a sender copies straight
 * into its ring in the receiver's inbox and the receiver copies (or reduces)
 * straight out of it, so no byte goes through the kernel. Segments are
 * unlinked as soon as every member has mapped them, so a crash leaks nothing
 * after set-up.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/common.h"
#include "kernels/kernels.h"
#include "worker_sdk/worker.h"

#define SHM_MAGIC     0x6372756e73686d31ull /* "crunshm1" */
#define SEG_HDR_BYTES 4096u

static size_t ring_stride(size_t ring_bytes)
{
	return (sizeof(struct shm_ring) + ring_bytes + 4095) & ~(size_t)4095;
}

static struct shm_ring *seg_ring(void *map, size_t ring_bytes, int idx)
{
	return (struct shm_ring *)((uint8_t *)map + SEG_HDR_BYTES +
				   (size_t)idx * ring_stride(ring_bytes));
}

static int open_pidfd(pid_t pid)
{
#ifdef SYS_pidfd_open
	int fd = (int)syscall(SYS_pidfd_open, pid, 0); /* always close-on-exec */

	return fd < 0 ? -1 : fd;
#else
	return -1;
#endif
}

static int seg_create(struct crun_pg *pg, char *name, size_t name_cap, size_t len)
{
	uint64_t nonce = 0;
	void *map;
	int fd, r;

	if (getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce))
		nonce = clock_now_us() ^ ((uint64_t)getpid() << 32);
	TRY(pg_fmt(name, name_cap, "/crun-%d-%s-%016llx", (int)getpid(), pg->name,
		   (unsigned long long)nonce));
	fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)len) < 0) {
		r = -errno;
		goto out_unlink;
	}
	map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		r = -errno;
		goto out_unlink;
	}
	fd_close(fd);
	pg->inbox = map;
	pg->inbox->magic = SHM_MAGIC;
	pg->inbox->ring_bytes = pg->ring_bytes;
	pg->inbox->nranks = (uint32_t)pg->size;
	pg->peers[pg->rank].map = map;
	pg->peers[pg->rank].map_len = len;
	return 0;
out_unlink:
	fd_close(fd);
	(void)shm_unlink(name);
	return r;
}

static int seg_map_peer(struct crun_pg *pg, int p, const char *val, size_t len)
{
	struct pg_peer *peer = &pg->peers[p];
	char name[128];
	struct stat sb;
	struct shm_seg_hdr *h;
	uint64_t pid;
	void *map;
	const char *sp = memchr(val, ' ', len);
	int fd;

	if (!sp || (size_t)(sp - val) >= sizeof(name) || parse_u64(sp + 1, &pid) < 0 || pid == 0 ||
	    pid > INT32_MAX)
		return CRUN_EPROTO;
	memcpy(name, val, (size_t)(sp - val));
	name[sp - val] = '\0';
	fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) < 0 || (size_t)sb.st_size != peer->map_len) {
		fd_close(fd);
		return CRUN_EPROTO;
	}
	map = mmap(NULL, peer->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	fd_close(fd);
	if (map == MAP_FAILED)
		return -errno;
	h = map;
	peer->map = map;
	if (h->magic != SHM_MAGIC || h->ring_bytes != pg->ring_bytes ||
	    h->nranks != (uint32_t)pg->size)
		return CRUN_EPROTO;
	peer->tx = seg_ring(map, pg->ring_bytes, pg->rank);
	peer->rx = seg_ring(pg->inbox, pg->ring_bytes, p);
	peer->pid = (pid_t)pid;
	peer->pidfd = open_pidfd(peer->pid);
	peer->kind = PEER_SHM;
	return 0;
}

/* Store barrier: the last of the group to ADD sets `done`; the rest wait. */
static int store_barrier(crun_store_t *st, const char *ns, const char *what, int n)
{
	char key[256], done[256];
	int64_t v;
	void *val;
	size_t len;

	TRY(pg_fmt(key, sizeof(key), "%s%s", ns, what));
	TRY(pg_fmt(done, sizeof(done), "%s%s/done", ns, what));
	TRY(crun_store_add(st, key, 1, &v));
	if (v == n)
		return crun_store_set(st, done, "1", 1);
	TRY(crun_store_get(st, done, 0, &val, &len));
	crun_free(val);
	return 0;
}

int pg_shm_setup(struct crun_pg *pg, crun_store_t *st, const char *ns, const int *is_shm)
{
	size_t len = SEG_HDR_BYTES + (size_t)pg->size * ring_stride(pg->ring_bytes);
	char name[128], key[256], val[160];
	int any = 0, r;

	for (int p = 0; p < pg->size; p++)
		any |= is_shm[p];
	if (any) {
		TRY(seg_create(pg, name, sizeof(name), len));
		r = pg_fmt(val, sizeof(val), "%s %d", name, (int)getpid());
		if (r == 0)
			r = pg_fmt(key, sizeof(key), "%sshm/%d", ns, pg->rank);
		if (r == 0)
			r = crun_store_set(st, key, val, strlen(val));
		if (r < 0)
			goto out_unlink;
		for (int p = 0; p < pg->size && r == 0; p++) {
			void *v;
			size_t vlen;

			if (!is_shm[p])
				continue;
			pg->peers[p].map_len = len;
			r = pg_fmt(key, sizeof(key), "%sshm/%d", ns, p);
			if (r == 0)
				r = crun_store_get(st, key, 0, &v, &vlen);
			if (r < 0)
				break;
			r = seg_map_peer(pg, p, v, vlen);
			crun_free(v);
		}
		if (r < 0)
			goto out_unlink;
	}
	/* Every member joins, so nobody unlinks before all peers have mapped. */
	r = store_barrier(st, ns, "shm_mapped", pg->size);
out_unlink:
	if (any)
		(void)shm_unlink(name);
	return r;
}

void pg_shm_release(struct crun_pg *pg)
{
	for (int p = 0; p < pg->size; p++) {
		struct pg_peer *peer = &pg->peers[p];

		if (peer->map)
			(void)munmap(peer->map, peer->map_len);
		peer->map = NULL;
		if (peer->pidfd >= 0)
			fd_close(peer->pidfd);
		peer->pidfd = -1;
	}
	pg->inbox = NULL;
}

/* Copies len bytes at ring position pos (wrapping) to or from buf. A
 * receive into a message larger than PG_STREAM_BYTES streams past the
 * cache: the destination is too big to stay cached anyway. */
static void ring_copy(struct shm_ring *ring, size_t cap, uint64_t pos, uint8_t *buf, size_t len,
		      int to_ring, int stream)
{
	size_t off = (size_t)(pos & (cap - 1)), first = MIN(len, cap - off);

	if (to_ring) {
		memcpy(ring->data + off, buf, first);
		memcpy(ring->data, buf + first, len - first);
	} else if (stream) {
		kernels_copy_stream(buf, ring->data + off, first);
		kernels_copy_stream(buf + first, ring->data, len - first);
	} else {
		memcpy(buf, ring->data + off, first);
		memcpy(buf + first, ring->data, len - first);
	}
}

/* Reduces len bytes at ring position pos into buf. Messages start 8-aligned
 * and cap is a multiple of 8, so both pieces hold whole elements. */
static void ring_reduce(struct shm_ring *ring, size_t cap, uint64_t pos, uint8_t *buf,
			const uint8_t *acc, size_t len, int dtype, int op, size_t esz)
{
	size_t off = (size_t)(pos & (cap - 1)), first = MIN(len, cap - off);

	if (acc) /* a ring's worth at most: still in cache for the reduce */
		memcpy(buf, acc, len);
	(void)kernels_reduce(buf, ring->data + off, first / esz, dtype, op);
	if (len > first)
		(void)kernels_reduce(buf + first, ring->data, (len - first) / esz, dtype, op);
}

void pg_shm_ring_bell(struct shm_seg_hdr *h, int force)
{
	/* Pairs with the fence in pg_xfer between setting `sleeping` and
	 * looking at the rings: either we see the sleeper, or it sees our
	 * ring update and does not sleep. */
	atomic_thread_fence(memory_order_seq_cst);
	if (force || atomic_load_explicit(&h->sleeping, memory_order_relaxed)) {
		atomic_fetch_add(&h->bell, 1);
		(void)syscall(SYS_futex, &h->bell, FUTEX_WAKE, 1, NULL, NULL, 0);
	}
}

void pg_shm_sleep(struct crun_pg *pg, uint32_t seen, unsigned timeout_ms)
{
	struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000};

	/* Shared mapping: a plain (not PRIVATE) futex, across processes. */
	(void)syscall(SYS_futex, &pg->inbox->bell, FUTEX_WAIT, seen, &ts, NULL, 0);
}

size_t pg_shm_progress(struct crun_pg *pg, struct xfer *x)
{
	struct pg_peer *p = &pg->peers[x->peer];
	size_t cap = pg->ring_bytes, total = (x->len + 7) & ~(size_t)7, n, pay;
	uint64_t head, tail;

	if (x->dir == XF_SEND) {
		head = atomic_load_explicit(&p->tx->head, memory_order_relaxed);
		tail = atomic_load_explicit(&p->tx->tail, memory_order_acquire);
		n = MIN(cap - (size_t)(head - tail), total - x->wire);
		if (!n)
			return 0;
		pay = x->wire < x->len ? MIN(n, x->len - x->wire) : 0;
		if (pay)
			ring_copy(p->tx, cap, head, x->buf + x->wire, pay, 1, 0);
		atomic_store_explicit(&p->tx->head, head + n, memory_order_release);
		pg_shm_ring_bell(p->map, 0);
	} else {
		tail = atomic_load_explicit(&p->rx->tail, memory_order_relaxed);
		head = atomic_load_explicit(&p->rx->head, memory_order_acquire);
		n = MIN((size_t)(head - tail), total - x->wire);
		if (x->wire < x->len) {
			/* Payload and padding never share one step: padding
			 * is only consumed once the payload is done. */
			n = MIN(n, x->len - x->wire);
			if (x->dir == XF_RECV_REDUCE) {
				size_t esz = crun_dtype_size(x->dtype);

				n -= n % esz;
				if (n)
					ring_reduce(p->rx, cap, tail, x->buf + x->wire,
						    x->acc ? x->acc + x->wire : NULL, n, x->dtype,
						    x->op, esz);
			} else if (n) {
				ring_copy(p->rx, cap, tail, x->buf + x->wire, n, 0,
					  x->len >= PG_STREAM_BYTES);
			}
		}
		if (!n)
			return 0;
		atomic_store_explicit(&p->rx->tail, tail + n, memory_order_release);
		pg_shm_ring_bell(p->map, 0); /* the writer may wait for space */
	}
	x->wire += n;
	x->done = MIN(x->wire, x->len);
	return n;
}
