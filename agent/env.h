/* env.h: the worker's environment and argv (env.c). */
#ifndef CRUN_AGENT_ENV_H
#define CRUN_AGENT_ENV_H

#include <stdbool.h>
#include <stdint.h>
struct env_vars {
	int local_rank, rank, group_rank, role_rank;
	const char *role;
	int local_world_size, world_size, group_world_size, role_world_size;
	const char *master_addr;
	uint16_t master_port;
	int restart_count, max_restarts;
	const char *run_id;
	const char *error_file;
	const char *signals; /* TORCHELASTIC_SIGNALS_TO_HANDLE, or NULL */
	bool virtual_local_rank;
	const char *auth_secret_file; /* CRUN_AUTH_SECRET_FILE for the SDK's mesh, or NULL */
};

/* The interpreter for *.py and -m programs: $PYTHON_EXEC when set, else the
 * python3 beside the running program (a venv's bin/), else "python3" (looked
 * up on PATH at spawn). Returns a string borrowed from env, buf (cap bytes,
 * PATH_MAX is enough) or a static one. */
const char *env_python(char *const *env, char *buf, size_t cap);

/* A new NULL-terminated environment: `base` (borrowed) updated with the
 * torchrun worker variables. Free with env_free(). */
char **env_build(char *const *base, const struct env_vars *v);
char **env_copy(char *const *env);
void env_free(char **env);
const char *env_get(char *const *env, const char *name);
/* argv with "${local_rank}" replaced in every element; malloc'd. */
char **env_argv_subst(char *const *argv, int local_rank);

#endif /* CRUN_AGENT_ENV_H */
