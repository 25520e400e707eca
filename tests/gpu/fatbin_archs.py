#!/usr/bin/env python3
"""fatbin_archs.py FILE [WANT...]: lists the code a CUDA fat binary embedded
in FILE (an object or shared library) carries, one "ptx NN" / "elf NN" line
each, like cuobjdump --list-ptx / --list-elf (which a bare nvcc install
lacks). With WANT arguments ("ptx90", "elf80"), exits 1 naming what is
missing. Layout: a 16-byte header (magic 0xBA55ED50, version 1, header size
16, payload size), then entries: kind u16 (1 PTX, 2 or 16 ELF), u16, entry
header size u32, padded payload size u64, ..., architecture u32 at 28.
"""
import struct
import sys

MAGIC = struct.pack("<I", 0xBA55ED50)
KINDS = {1: "ptx", 2: "elf", 16: "elf"}


def archs(data):
    seen = set()
    pos = data.find(MAGIC)
    while pos >= 0:
        ver, hsz, size = struct.unpack_from("<HHQ", data, pos + 4)
        if ver == 1 and hsz == 16 and pos + 16 + size <= len(data):
            e, end = pos + 16, pos + 16 + size
            while e + 64 <= end:
                kind, _, ehsz, padded = struct.unpack_from("<HHIQ", data, e)
                if ehsz < 64:
                    break  # not an entry: stop walking this container
                arch = struct.unpack_from("<I", data, e + 28)[0]
                seen.add((KINDS.get(kind, "kind%d" % kind), arch))
                e += ehsz + padded
        pos = data.find(MAGIC, pos + 4)
    return seen


def main(argv):
    if len(argv) < 2:
        print("usage: fatbin_archs.py FILE [ptxNN|elfNN...]", file=sys.stderr)
        return 2
    with open(argv[1], "rb") as f:
        seen = archs(f.read())
    for kind, arch in sorted(seen):
        print(kind, arch)
    missing = [w for w in argv[2:] if (w[:3], int(w[3:])) not in seen]
    if missing:
        print("fatbin_archs: %s lacks %s" % (argv[1], " ".join(missing)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
