/* helper.c: rendezvous helper threads (helper_int.h). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/crypto.h>

#include "common/common.h"
#include "rendezvous/helper_int.h"

void helper_job_put(struct helper_job *j)
{
	if (!j || atomic_fetch_sub(&j->refs, 1) != 1)
		return;
	fd_close(j->notify_fd);
	j->release(j);
}

void helper_nudge(struct helper_job *j)
{
	char one = 1;
	ssize_t n;

	do
		n = write(j->notify_fd, &one, 1);
	while (n < 0 && errno == EINTR);
}

void helper_post(struct helper_job *j)
{
	atomic_store(&j->posted, 1);
	helper_nudge(j);
}

/* Our own thread frees OpenSSL's per-thread state (its error queue) as soon
 * as the job is done, before posting: a dropped helper can still be
 * exiting when the process ends, and LeakSanitizer then reported that
 * state (904 bytes from CRYPTO_zalloc) as leaked. An embedder's thread
 * keeps its own. */
static void helper_run(struct helper_job *j, bool own_thread)
{
	j->result = j->run(j);
	if (own_thread)
		OPENSSL_thread_stop();
	if (!atomic_load(&j->posted))
		helper_post(j);
	helper_job_put(j);
}

static void *helper_thread_main(void *arg)
{
	helper_run(arg, true);
	return NULL;
}

static void run_hooked(void *arg)
{
	helper_run(arg, false);
}

void helper_use_runner(struct helper *h, const struct helper_runner *runner)
{
	h->runner = runner ? *runner : (struct helper_runner){0};
}

static void on_pipe(evutil_socket_t fd, short what, void *arg)
{
	struct helper *h = arg;
	char buf[8];
	ssize_t n = read(fd, buf, sizeof(buf));

	(void)what;
	if (n == 0) {
		/* The write end closed with the job's last reference: stop
		 * watching, or the EOF would wake the loop until the next job. */
		event_del(h->ev);
		return;
	}
	if (n < 0 || !h->job)
		return;
	h->on_post(h, h->arg);
}

void helper_init(struct helper *h, struct event_base *base, helper_post_fn on_post, void *arg)
{
	*h = (struct helper){.base = base, .rd = -1, .on_post = on_post, .arg = arg};
}

int helper_start(struct helper *h, struct helper_job *j)
{
	sigset_t all, saved;
	int pfd[2], err;

	if (h->job) {
		j->release(j);
		return CRUN_EBUSY;
	}
	if (pipe2(pfd, O_CLOEXEC | O_NONBLOCK) < 0) {
		err = -errno;
		j->release(j);
		return err;
	}
	atomic_init(&j->refs, 2);
	atomic_init(&j->stop, 0);
	atomic_init(&j->posted, 0);
	j->notify_fd = pfd[1];
	if (h->ev)
		event_free(h->ev);
	fd_close(h->rd); /* also when a failed start left no event */
	h->rd = pfd[0];
	h->ev = event_new(h->base, pfd[0], EV_READ | EV_PERSIST, on_pipe, h);
	if (!h->ev || event_add(h->ev, NULL) < 0) {
		helper_job_put(j);
		helper_job_put(j);
		return CRUN_ENOMEM;
	}
	h->job = j;
	h->threaded = !h->runner.fn;
	if (!h->threaded) {
		/* The embedder's thread: results cross through the pipe and the
		 * references, as with our own thread; nothing to join. */
		err = h->runner.fn(run_hooked, j, h->runner.arg);
		if (err < 0) {
			h->job = NULL;
			helper_job_put(j);
			helper_job_put(j);
			return err;
		}
		return 0;
	}
	/* The helper takes no signals: they belong to the loop thread, and a
	 * write to a closed notify pipe must fail with EPIPE, not kill us. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &saved);
	err = pthread_create(&h->thr, NULL, helper_thread_main, j);
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	if (err) {
		h->job = NULL;
		helper_job_put(j);
		helper_job_put(j);
		return -err;
	}
	return 0;
}

struct helper_job *helper_finish(struct helper *h)
{
	struct helper_job *j = h->job;

	if (!j)
		return NULL;
	if (h->threaded)
		pthread_join(h->thr, NULL);
	h->job = NULL;
	return j;
}

void helper_drop(struct helper *h)
{
	if (!h->job)
		return;
	atomic_store(&h->job->stop, 1);
	if (h->threaded)
		pthread_detach(h->thr);
	helper_job_put(h->job);
	h->job = NULL;
}

void helper_fini(struct helper *h)
{
	helper_drop(h);
	if (h->ev)
		event_free(h->ev);
	h->ev = NULL;
	fd_close(h->rd);
	h->rd = -1;
}
