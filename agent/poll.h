/* poll.h: poll mode: the loop's fds mirrored into one epoll fd (poll.c). */
#ifndef CRUN_AGENT_POLL_H
#define CRUN_AGENT_POLL_H

struct event_base;
struct agent_poll;

int agent_poll_new(struct event_base *base, struct agent_poll **ret);
void agent_poll_free(struct agent_poll *p); /* NULL: no-op */
int agent_poll_fd(const struct agent_poll *p);
/* Mirrors the fds the loop waits on into the epoll fd (after each pass). */
int agent_poll_refresh(struct agent_poll *p);
/* Milliseconds to the loop's next timer, 0 when events are active, -1. */
int agent_poll_timeout_ms(struct agent_poll *p);

#endif /* CRUN_AGENT_POLL_H */
