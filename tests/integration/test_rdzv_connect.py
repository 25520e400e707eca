"""A rendezvous endpoint that cannot be reached (issue 22, item 1): the agent says so at once
and names the cause - "cannot reach H:P: connection refused; retrying for N s" - keeps retrying
until the rendezvous's connect deadline (join_timeout), then fails naming the endpoint and the
errno, not only "timed out". Nothing listens on the endpoint: a port taken from the kernel and
closed again. No test asserts a wall-clock bound."""
import os
import tempfile

import pytest

from conftest import bin_path, free_port, wait_line

SHOW = "print('never started')\n"


@pytest.mark.parametrize("backend,conf,what", [
    ("c10d", "is_host=false,join_timeout=3", "the rendezvous store at"),
    ("etcd", "join_timeout=3", "etcd: no answer from"),
])
def test_an_unreachable_endpoint_is_said_at_once_and_named_at_the_end(procs, backend, conf,
                                                                       what):
    port = free_port()
    ep = f"127.0.0.1:{port}"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(SHOW)
    try:
        p = procs.spawn([bin_path("crun"), "--nnodes=1", "--nproc_per_node=1",
                         f"--rdzv_backend={backend}", f"--rdzv_endpoint={ep}",
                         f"--rdzv_conf={conf}", "--rdzv_id=unreachable", f.name])
        m = wait_line(p.stderr, r"cannot reach (.*): (.*); retrying for (\d+) s", 60)
        assert what in m.group(1) and ep in m.group(0), m.group(0)
        assert "connection refused" in m.group(2), m.group(0)
        rest = p.stderr.read().decode(errors="replace")
        assert p.wait(timeout=60) != 0
        final = [ln for ln in rest.splitlines() if "rendezvous failed" in ln]
        assert final, rest
        assert ep in final[-1] and "connection refused" in final[-1], final[-1]
    finally:
        os.unlink(f.name)
