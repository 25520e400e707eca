"""Probe of a worker store (TCPStore v2 greeting: VALIDATE then PING, the
reply must echo the nonce), for the allowlist tests.

    store_probe.py HOST PORT            prints "accepted" or "refused: why"
    store_probe.py --worker OUT SECS    as a crun worker: probes MASTER_ADDR:
                                        MASTER_PORT, writes OUT/<pid>.json
                                        with the result, then sleeps SECS or
                                        until OUT/go exists
"""
import json
import os
import socket
import struct
import sys
import time


def probe(host, port):
    try:
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + bytes([13]) + struct.pack("<I", 4242))
        got = b""
        while len(got) < 4:
            chunk = s.recv(4 - len(got))
            if not chunk:
                return "refused: closed"
            got += chunk
        s.close()
        return "accepted" if struct.unpack("<I", got)[0] == 4242 else "refused: bad echo"
    except (ConnectionResetError, ConnectionRefusedError, socket.timeout, OSError) as e:
        return f"refused: {e}"


if sys.argv[1] == "--worker":
    out, secs = sys.argv[2], float(sys.argv[3])
    rec = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                           "TORCHELASTIC_RESTART_COUNT")}
    rec["probe"] = probe(rec["MASTER_ADDR"], rec["MASTER_PORT"])
    tmp = os.path.join(out, f"{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.rename(tmp, os.path.join(out, f"{os.getpid()}.json"))
    end = time.monotonic() + min(secs, 60)
    while time.monotonic() < end and not os.path.exists(os.path.join(out, "go")):
        time.sleep(0.05)
else:
    print(probe(sys.argv[1], sys.argv[2]))
