/* console.h: the agent's console writer (console.c), a part of the outputs
 * (agent/outputs.h): a bounded queue per stream over the caller's stdout and
 * stderr, written by a thread, or by the loop in poll mode, so that a reader
 * that stops reading never blocks the loop.
 */
#ifndef CRUN_AGENT_CONSOLE_H
#define CRUN_AGENT_CONSOLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct agent_console;

/* A console over out_fd/err_fd (borrowed) with a queue of cap_bytes per
 * stream: with base NULL a writer thread does the writes; with a base (poll
 * mode) there is no thread and the loop writes what the fds take without
 * blocking (the waits below then poll, bounded). 0 or a negative code. */
int console_new(struct event_base *base, int out_fd, int err_fd, size_t cap_bytes,
		struct agent_console **ret);
/* Queues n bytes for stream `which` (CRUN_STD_OUT/ERR); never blocks. When
 * the queue is full the chunk is dropped and the lines it begins counted
 * (starts_line: p[0] begins a line); the count is shown as
 * "[crun: N lines dropped]" before the next chunk that fits. */
void console_put(struct agent_console *c, int which, const char *p, size_t n, bool starts_line);
/* Free bytes in the queue of `which` (SIZE_MAX when nothing is written any
 * more); *ret_stalled_ms (may be NULL) gets how long bytes have waited
 * without the writer making progress (0 when the queue is empty). */
size_t console_room(struct agent_console *c, int which, uint64_t *ret_stalled_ms);
/* Waits until `need` bytes are free or clock_now_ms() reaches until_ms; true
 * when they are. Blocks: not for the loop while it serves. */
bool console_wait_room(struct agent_console *c, int which, size_t need, uint64_t until_ms);
/* Lines dropped on `which` so far. */
uint64_t console_dropped(struct agent_console *c, int which);
/* Waits at most timeout_ms for both queues to be written; true if they were. */
bool console_flush(struct agent_console *c, uint32_t timeout_ms);
/* Flushes (bounded), stops the thread and frees. NULL: no-op. */
void console_free(struct agent_console *c, uint32_t flush_timeout_ms);

#endif /* CRUN_AGENT_CONSOLE_H */
