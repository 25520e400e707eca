#!/usr/bin/env python3
"""Turn captured PyTorch 1.13 TCPStore traffic into a C test-vector header.

Usage (run once from the repository root; the output is committed as data):

    python3 tests/unit/gen_capture_vectors.py \
        ../shared/tools/torch-capture/results > tests/unit/capture_vectors_113.h

Input: <results>/<scenario>/proxy.jsonl, written by the logging TCP proxy of
torch-compat.md §9: one JSON object per line, {"conn", "dir": "c2s"|"s2c"|...,
"hex"}. For each connection the client->server segments are joined into one
stream and split into v1 frames with this script's own small parser (written
from torch-compat.md §1.3, independent of store/proto/proto.c); the server->client
stream is split into the replies of those requests, in request order, which is
how the single-threaded 1.13 server answers. Connections that used WATCH_KEY
(asynchronous notifications interleave) get no reply vectors.

The header holds, per frame, the exact request bytes and the expected decoded
fields, and per connection the original TCP segment boundaries, so the C test
can also replay the stream segment by segment as a server would see it.

With --seeds DIR it instead writes a few libFuzzer seed files for
tests/fuzz/fuzz_proto.c (first byte: limits selector, then the stream):

    python3 tests/unit/gen_capture_vectors.py ../shared/tools/torch-capture/results \
        --seeds tests/fuzz/seeds
"""
import json
import os
import struct
import sys

SCENARIOS = [
    "store_ops_113",
    "c10d_rdzv_2agents_113",
    "static_2agents_113",
    "workers_rank0hosts_113",
    "workers_agentstore_113",
]

# v1 opcode -> (store_op name, request shape, reply kind)
V1 = {
    0: ("SET", "kv", "none"),
    1: ("COMPARE_SET", "kvv", "bytes"),
    2: ("GET", "k", "bytes"),
    3: ("ADD", "ki", "i64"),
    4: ("CHECK", "keys", "u8"),
    5: ("WAIT", "keys", "u8"),
    6: ("GETNUMKEYS", "", "i64"),
    7: ("WATCH_KEY", "k", "u8"),
    8: ("DELETE_KEY", "k", "i64"),
}


class Short(Exception):
    pass


def take(buf, pos, n):
    if pos + n > len(buf):
        raise Short()
    return buf[pos:pos + n], pos + n


def u64(buf, pos):
    b, pos = take(buf, pos, 8)
    return struct.unpack("<Q", b)[0], pos


def string(buf, pos):
    n, pos = u64(buf, pos)
    return take(buf, pos, n)


def parse_req(buf, pos):
    """One v1 request at buf[pos:]; returns (record, new_pos) or raises Short."""
    start = pos
    code = buf[pos]
    pos += 1
    name, shape, reply = V1[code]
    rec = {"op": name, "reply": reply, "key": b"", "val": b"", "val2": b"", "num": 0,
           "keys": []}
    if shape in ("k", "kv", "kvv", "ki"):
        rec["key"], pos = string(buf, pos)
    if shape in ("kv", "kvv"):
        rec["val"], pos = string(buf, pos)
    if shape == "kvv":
        rec["val2"], pos = string(buf, pos)
    if shape == "ki":
        n, pos = u64(buf, pos)
        rec["num"] = struct.unpack("<q", struct.pack("<Q", n))[0]
    if shape == "keys":
        n, pos = u64(buf, pos)
        for _ in range(n):
            k, pos = string(buf, pos)
            rec["keys"].append(k)
    rec["frame"] = buf[start:pos]
    return rec, pos


def parse_reply(kind, buf, pos):
    start = pos
    rep = {"status": 0, "num": 0, "val": b""}
    if kind == "u8":
        b, pos = take(buf, pos, 1)
        rep["status"] = b[0]
    elif kind == "i64":
        n, pos = u64(buf, pos)
        rep["num"] = struct.unpack("<q", struct.pack("<Q", n))[0]
    elif kind == "bytes":
        rep["val"], pos = string(buf, pos)
    rep["bytes"] = buf[start:pos]
    return rep, pos


def cstr(b):
    """A C string literal for b: printable ASCII as is, the rest as 3-digit
    octal escapes (which never swallow a following digit)."""
    out = []
    for c in b:
        if 0x20 <= c < 0x7f and chr(c) not in '"\\?':
            out.append(chr(c))
        else:
            out.append("\\%03o" % c)
    s = "".join(out)
    parts, cur = [], ""
    for tok in out:
        if len(cur) + len(tok) > 88:
            parts.append(cur)
            cur = ""
        cur += tok
    parts.append(cur)
    return "\n\t\t".join('"%s"' % p for p in parts)


def load(results):
    conns = []  # (scenario, conn, segments, requests)
    for sc in SCENARIOS:
        path = os.path.join(results, sc, "proxy.jsonl")
        segs, s2c, order = {}, {}, []
        with open(path) as f:
            for line in f:
                d = json.loads(line)
                if d["dir"] not in ("c2s", "s2c"):
                    continue
                c = d["conn"]
                if c not in segs:
                    segs[c], s2c[c] = [], b""
                    order.append(c)
                if d["dir"] == "c2s":
                    segs[c].append(bytes.fromhex(d["hex"]))
                else:
                    s2c[c] += bytes.fromhex(d["hex"])
        for c in order:
            stream = b"".join(segs[c])
            reqs, pos = [], 0
            while pos < len(stream):
                rec, pos = parse_req(stream, pos)  # captures hold whole frames
                reqs.append(rec)
            watch = any(r["op"] == "WATCH_KEY" for r in reqs)
            rpos = 0
            for r in reqs:
                if watch or r["reply"] == "none":
                    continue
                try:
                    r["rep"], rpos = parse_reply(r["reply"], s2c[c], rpos)
                except Short:
                    break  # connection ended before this reply (timeout, EOF)
            if segs[c]:
                conns.append((sc, c, segs[c], reqs))
    return conns


def v2_frame(rec):
    """The v2 form of a captured v1 frame: only the opcode byte moves (§1.2)."""
    code = rec["frame"][0]
    return bytes([code if code == 8 else code + 1]) + rec["frame"][1:]


def p64(n):
    return struct.pack("<Q", n & (2**64 - 1))


def pstr(b):
    return p64(len(b)) + b


def write_seeds(conns, out):
    os.makedirs(out, exist_ok=True)
    v1 = b"".join(r["frame"] for _, _, _, reqs in conns[:3] for r in reqs)
    rdzv = b"".join(r["frame"] for sc, _, _, reqs in conns if sc.startswith("c10d")
                    for r in reqs)[:4096]
    replies = b"".join(r["rep"]["bytes"] for _, _, _, reqs in conns[:3] for r in reqs
                       if "rep" in r)
    # A 2.x connection: VALIDATE, PING, the captured ops renumbered, then the
    # v2-only ops (APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT, QUEUE_*, LIST_KEYS,
    # BARRIER) built from torch-compat §1.3.
    v2 = bytes.fromhex("00cef7853c0d39300000")
    v2 += b"".join(v2_frame(r) for _, _, _, reqs in conns[:1] for r in reqs
                   if r["op"] != "WATCH_KEY")
    v2 += b"\x09" + pstr(b"/log") + pstr(b"more")
    v2 += b"\x0a" + p64(2) + pstr(b"/a") + pstr(b"/b")
    v2 += b"\x0b" + p64(2) + pstr(b"/a") + pstr(b"1") + pstr(b"/b") + pstr(b"")
    v2 += b"\x0c"
    v2 += b"\x0e" + pstr(b"/q") + pstr(b"item")
    v2 += b"\x0f" + pstr(b"/q") + b"\x10" + pstr(b"/q") + b"\x11"
    v2 += b"\x12" + pstr(b"/barrier") + p64(4)
    seeds = {
        "v1_store_ops_113": b"\x00" + v1,
        "v1_store_ops_113_small_limits": b"\x01" + v1,
        "v1_c10d_rdzv_113": b"\x00" + rdzv,
        "v2_session": b"\x00" + v2,
        "v2_session_small_limits": b"\x01" + v2,
        "replies_113": b"\x00" + replies,
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


def main():
    results = sys.argv[1] if len(sys.argv) > 1 else "../shared/tools/torch-capture/results"
    conns = load(results)
    if len(sys.argv) > 3 and sys.argv[2] == "--seeds":
        write_seeds(conns, sys.argv[3])
        return
    w = sys.stdout.write
    w("/* capture_vectors_113.h: GENERATED by tests/unit/gen_capture_vectors.py from\n"
      " * ../shared/tools/torch-capture/results/{%s}/proxy.jsonl\n"
      " * (real PyTorch 1.13.1 TCPStore client and server through a logging proxy).\n"
      " * Generated once and committed as data; do not edit by hand. Regenerate with:\n"
      " *   python3 tests/unit/gen_capture_vectors.py ../shared/tools/torch-capture/results \\\n"
      " *       > tests/unit/capture_vectors_113.h\n"
      " */\n" % ",".join(SCENARIOS))
    w("#ifndef CRUN_TESTS_CAPTURE_VECTORS_113_H\n#define CRUN_TESTS_CAPTURE_VECTORS_113_H\n\n")
    w("#include <stddef.h>\n#include <stdint.h>\n\n")
    w("struct cap_str {\n\tconst char *p;\n\tsize_t len;\n};\n\n")
    w("/* One v1 request frame and, when captured, the server's reply to it. */\n")
    w("struct cap_req {\n\tconst char *scenario;\n\tint conn;\n\tint op; /* enum store_op */\n"
      "\tstruct cap_str frame;\n\tstruct cap_str key, val, val2;\n\tint64_t num;\n"
      "\tsize_t nkeys;\n\tconst struct cap_str *keys;\n"
      "\tint has_reply;\n\tstruct cap_str reply; /* exactly the reply's bytes */\n"
      "\tuint8_t rep_status;\n\tint64_t rep_num;\n\tstruct cap_str rep_val;\n};\n\n")
    w("/* One client->server connection: its TCP segments as captured and the index\n"
      " * range of its frames in cap_reqs[]. */\n")
    w("struct cap_conn {\n\tconst char *scenario;\n\tint conn;\n\tsize_t nsegs;\n"
      "\tconst struct cap_str *segs;\n\tsize_t first_req, nreqs;\n};\n\n")
    idx = 0
    for ci, (sc, c, segs, reqs) in enumerate(conns):
        w("static const struct cap_str cap_segs_%d[] = {\n" % ci)
        for s in segs:
            w("\t{ %s, %d },\n" % (cstr(s), len(s)))
        w("};\n")
        for ri, r in enumerate(reqs):
            if r["keys"]:
                w("static const struct cap_str cap_keys_%d_%d[] = {\n" % (ci, ri))
                for k in r["keys"]:
                    w("\t{ %s, %d },\n" % (cstr(k), len(k)))
                w("};\n")
    w("\nstatic const struct cap_req cap_reqs[] = {\n")
    spans = []
    for ci, (sc, c, segs, reqs) in enumerate(conns):
        spans.append((idx, len(reqs)))
        for ri, r in enumerate(reqs):
            rep = r.get("rep")
            keys = "cap_keys_%d_%d" % (ci, ri) if r["keys"] else "NULL"
            w("\t{ .scenario = \"%s\", .conn = %d, .op = STORE_OP_%s,\n" % (sc, c, r["op"]))
            w("\t  .frame = { %s, %d },\n" % (cstr(r["frame"]), len(r["frame"])))
            w("\t  .key = { %s, %d },\n" % (cstr(r["key"]), len(r["key"])))
            w("\t  .val = { %s, %d },\n" % (cstr(r["val"]), len(r["val"])))
            w("\t  .val2 = { %s, %d },\n" % (cstr(r["val2"]), len(r["val2"])))
            w("\t  .num = %dLL, .nkeys = %d, .keys = %s,\n" % (r["num"], len(r["keys"]), keys))
            if rep:
                w("\t  .has_reply = 1, .reply = { %s, %d },\n"
                  % (cstr(rep["bytes"]), len(rep["bytes"])))
                w("\t  .rep_status = %d, .rep_num = %dLL,\n" % (rep["status"], rep["num"]))
                w("\t  .rep_val = { %s, %d } },\n" % (cstr(rep["val"]), len(rep["val"])))
            else:
                w("\t  .has_reply = 0 },\n")
            idx += 1
    w("};\n\nstatic const struct cap_conn cap_conns[] = {\n")
    for ci, (sc, c, segs, reqs) in enumerate(conns):
        w("\t{ \"%s\", %d, %d, cap_segs_%d, %d, %d },\n"
          % (sc, c, len(segs), ci, spans[ci][0], spans[ci][1]))
    w("};\n\n#define CAP_NREQS (sizeof(cap_reqs) / sizeof(cap_reqs[0]))\n")
    w("#define CAP_NCONNS (sizeof(cap_conns) / sizeof(cap_conns[0]))\n\n")
    w("#endif /* CRUN_TESTS_CAPTURE_VECTORS_113_H */\n")


if __name__ == "__main__":
    main()
