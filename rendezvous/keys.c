/* keys.c: which job a rendezvous store key belongs to, for crun-rdzvd's
 * status page (GET /jobs) and crunctl jobs: c10d keeps every key of a job
 * under "crun-c10d/<run_id>/" (with the leading '/' of the v2 dialect's
 * keys). Pure.
 */
#include <string.h>

#include "rendezvous/rdzv.h"
#include "common/common.h"

int rdzv_run_id_of_key(const uint8_t *key, size_t len, char *ret, size_t cap)
{
	const size_t pl = sizeof(RDZV_C10D_PREFIX) - 1;
	const uint8_t *id, *slash;
	size_t n;

	/* crun's and torch 2.x's clients send keys with a leading '/' (as
	 * TCPStore does); the v1 dialect does not. */
	if (len && key[0] == '/') {
		key++;
		len--;
	}
	id = key + pl;
	if (cap == 0 || len <= pl || memcmp(key, RDZV_C10D_PREFIX, pl) != 0)
		return 0;
	slash = memchr(id, '/', len - pl);
	if (!slash || slash == id)
		return 0;
	n = MIN((size_t)(slash - id), cap - 1);
	memcpy(ret, id, n);
	ret[n] = '\0';
	return 1;
}
