"""The documentation against the tree and the programs: every relative link in
README.md, NEWS.md and docs/*.md resolves to a file of the repository (and an
anchor to a heading of that file), and every long flag the pages give to
crun, crun-agent, crun-rdzvd or crunctl is in that program's --help, so a
renamed or removed flag fails here instead of drifting in the docs."""
import glob
import os
import re
import subprocess

import pytest

from conftest import BUILD, ROOT

PAGES = sorted([os.path.join(ROOT, p) for p in ("README.md", "NEWS.md", "examples/README.md")] +
               glob.glob(os.path.join(ROOT, "docs", "*.md")))
PROGRAMS = ("crun", "crun-agent", "crun-rdzvd", "crunctl")

# Flags the pages name without a crun program in front of them that belong to
# another tool: flag -> the file of the tool that must define it (checked too),
# None for a tool outside the repository.
FOREIGN = {
    "--backend": "examples/dist_matmul.c",
    "--kill": "bench/rdzv_sim.c",
    "--cut": "bench/rdzv_sim.c",
    "--late": "bench/rdzv_sim.c",
    "--kill-join": "bench/rdzv_sim.c",
    "--seed": "bench/rdzv_sim.c",
    "--verbose": "bench/rdzv_sim.c",
    "--dialect": "bench/storm.c",
    "--first": "bench/storm.c",
    "--count": "bench/storm.c",
    "--resolver": "bench/storm_bench.py",
    "--agent-uids": "bench/rdzv_vs_torchrun.py",
    "--ntasks-per-node": None,  # srun's
    "--cpus-per-task": None,  # Slurm's
    "--use-env": None,  # torch.distributed.launch's, and what it passes to scripts:
    "--local-rank": None,
    "--local_rank": None,
}

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*")
SPAN = re.compile(r"`([^`\n]+)`")


def text_of(page):
    with open(page, encoding="utf-8") as f:
        return f.read()


def prose(text):
    """The page without its fenced code blocks (links there are not links)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def slug(heading):
    """GitHub's anchor for a heading."""
    h = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")


def anchors(page):
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", prose(text_of(page)), re.M)}


def links(page):
    return [m.group(1) for m in LINK.finditer(prose(text_of(page)))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_resolves_in_the_repository(page):
    bad = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, frag = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not dest.startswith(ROOT + os.sep) or not os.path.exists(dest):
            bad.append(f"{target}: no such file in the repository")
        elif frag and dest.endswith(".md") and frag not in anchors(dest):
            bad.append(f"{target}: no heading '#{frag}' in {os.path.relpath(dest, ROOT)}")
    assert not bad, f"{os.path.relpath(page, ROOT)}: " + "; ".join(bad)


def test_readme_is_a_front_door():
    readme = text_of(os.path.join(ROOT, "README.md"))
    assert len(readme.splitlines()) <= 250
    first = re.search(r"```sh\n(.*?)```", readme, re.S).group(1).splitlines()
    assert [l.split("#")[0].strip() for l in first] == ["make demo", "make test"]
    want = {f"docs/{p}.md" for p in ("usage", "elastic", "security", "operations", "libcrun",
                                     "gpu", "benchmarks", "design", "torch-compat")}
    assert want <= set(links(os.path.join(ROOT, "README.md")))


def code_lines(text):
    """Every piece of code a page shows: fenced and indented blocks line by
    line (backslash continuations joined), and inline spans."""
    out, fenced = [], False
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            out.append(line.split(" #")[0])
        else:
            out += SPAN.findall(line)
    return out


def flags_by_program(line):
    """(program or None, flag) for each long flag of one line of code: a flag
    belongs to the crun program last named before it, until that command's
    script or a shell separator; None for a flag no crun program owns."""
    prog, out = None, []
    braces = re.compile(r"([^\s{]*)\{([^}\s]*)\}(\S*)")
    while braces.search(line):  # --duplicate-std{out,err}-filters
        line = braces.sub(lambda m: " ".join(m.group(1) + alt + m.group(3)
                                             for alt in m.group(2).split(",")), line, count=1)
    for tok in line.split():
        base = os.path.basename(tok.strip("[]()"))
        if base in PROGRAMS:
            prog = base
        elif tok in ("|", ";", "&&", "||", "#") or tok.endswith(";"):
            prog = None
        elif not tok.startswith("-") and ("/" in tok or tok.endswith(".py")) and prog:
            prog = "script"  # what follows is the script's own arguments
        for flag in FLAG.findall(tok) if tok.lstrip("[(").startswith("--") else []:
            out.append((prog, flag))
    return out


@pytest.fixture(scope="module")
def helps():
    out = {}
    for prog in PROGRAMS:
        r = subprocess.run([os.path.join(BUILD, "bin", prog), "--help"], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, f"{prog} --help: {r.returncode} {r.stderr}"
        out[prog] = set(FLAG.findall(r.stdout))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_flag_the_docs_give_a_program_is_in_its_help(page, helps):
    every = set().union(*helps.values())
    bad = set()
    for line in code_lines(text_of(page)):
        first = line.split()[0] if line.split() else ""
        for prog, flag in flags_by_program(line):
            if prog in PROGRAMS and flag not in helps[prog]:
                bad.add(f"{prog} {flag}")
            elif prog is None and first.startswith("--") and flag not in every \
                    and flag not in FOREIGN:
                bad.add(f"{flag} (in no program's --help)")
    assert not bad, f"{os.path.relpath(page, ROOT)}: " + ", ".join(sorted(bad))


@pytest.mark.parametrize("flag", sorted(f for f, src in FOREIGN.items() if src))
def test_the_other_tools_flags_the_docs_name_exist(flag):
    src = text_of(os.path.join(ROOT, FOREIGN[flag]))
    assert re.search(re.escape(flag.lstrip("-")), src), f"{flag} not in {FOREIGN[flag]}"


SOURCE_DIRS = ("agent", "bench", "cmd", "common", "configs", "debian", "examples", "include",
               "kernels", "rendezvous", "scripts", "store", "tests", "worker_sdk")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_source_path_the_docs_name_exists(page):
    """A file the pages name in code (`store/proxy/proxy.c`, `tests/integration/
    test_faults.py`, `bench/storm` for bench/storm.c) is still there: a file
    moved or renamed fails here until the page follows it."""
    bad = set()
    for span in SPAN.findall(prose(text_of(page))):
        path = span.split()[0].rstrip(".,:;)")
        if path.split("/")[0] not in SOURCE_DIRS or "/" not in path:
            continue
        full = os.path.join(ROOT, path)
        if not any(glob.glob(full + ext) for ext in ("", ".c", ".py")):
            bad.add(path)
    assert not bad, f"{os.path.relpath(page, ROOT)} names missing files: {sorted(bad)}"
