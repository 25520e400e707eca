/* dlist.h: the intrusive doubly linked list of store/ (the server's
 * connections and leases, the proxy's clients and wait sets). A head and
 * its nodes are all `struct dl`; an empty head and an unlinked node point
 * at themselves, so removing a node twice is harmless.
 */
#ifndef CRUN_STORE_DLIST_H
#define CRUN_STORE_DLIST_H

#include <stddef.h>

struct dl {
	struct dl *next, *prev;
};

#define DL_INIT(h)		    ((h)->next = (h)->prev = (h))
#define DL_EMPTY(h)		    ((h)->next == (h))
#define DL_ENTRY(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static inline void dl_add_tail(struct dl *h, struct dl *n)
{
	n->prev = h->prev;
	n->next = h;
	h->prev->next = n;
	h->prev = n;
}

static inline void dl_del(struct dl *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	n->next = n->prev = n;
}

#endif
