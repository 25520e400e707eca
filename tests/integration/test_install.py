"""`make install` into a temporary prefix, then use only what was installed:
a program built with `pkg-config crun` against the installed headers and
library, the exported symbol list, the public headers as C99 and C++, and the
installed programs' and library's dependencies (no CUDA, no NCCL)."""
import glob
import json
import os
import re
import subprocess
import tempfile

import pytest

from conftest import BUILD, ROOT

SAN = os.environ.get("CRUN_SAN", "0") == "1"
SAN_FLAGS = ["-fsanitize=address,undefined"] if SAN else []

PROGRAM = r"""
#include <stdio.h>
#include <crun/crun.h>
#include <crun/store.h>
#include <crun/worker.h>
#include <crun/agent.h>

int main(void)
{
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;

	printf("%u %s %d\n", crun_version(), crun_strerror(CRUN_EINVAL),
	       (int)(cfg.struct_size == sizeof(cfg)));
	return 0;
}
"""


def run(argv, **kw):
    kw.setdefault("timeout", 300)
    out = subprocess.run(argv, capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{argv}: {out.stdout[-2000:]}{out.stderr[-2000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def prefix():
    with tempfile.TemporaryDirectory(prefix="crun-install-") as dest:
        run(["make", "-C", ROOT, "--no-print-directory", "install", f"DESTDIR={dest}",
             "PREFIX=/usr/local", f"BUILD={BUILD}", f"SAN={'1' if SAN else '0'}"], timeout=900)
        yield os.path.join(dest, "usr/local")


def pc(prefix, *what):
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(prefix, "lib/pkgconfig"),
               PKG_CONFIG_SYSROOT_DIR="")
    out = run(["pkg-config", "--define-variable=prefix=" + prefix, *what, "crun"], env=env)
    return out.split()


def test_a_program_builds_against_the_installed_files_only(prefix, tmp_path):
    src = tmp_path / "p.c"
    src.write_text(PROGRAM)
    for link in ("shared", "static"):
        exe = tmp_path / f"p-{link}"
        libs = pc(prefix, "--libs") if link == "shared" else \
            [os.path.join(prefix, "lib/libcrun.a")] + pc(prefix, "--libs", "--static")[2:]
        if link == "static":
            libs = [l for l in libs if l != "-lcrun"]
        run(["cc", "-std=c99", "-Wall", "-Werror", *SAN_FLAGS, *pc(prefix, "--cflags"),
             "-o", str(exe), str(src), *libs, "-lm", "-ldl", "-pthread"])
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(prefix, "lib"))
        out = run([str(exe)], env=env)
        assert out.split()[0].isdigit() and out.split()[-1] == "1", out
        assert "invalid argument" in out


EXAMPLES = sorted(os.path.basename(p)[:-2] for p in glob.glob(os.path.join(ROOT, "examples", "*.c")))


def build_example(prefix, tmp_path, name):
    """examples/NAME.c built with `pkg-config crun` against the install only:
    the source tree's private headers and libcrun-internal.a are out of reach."""
    exe = tmp_path / name
    run(["cc", "-std=gnu11", "-Wall", "-Werror", *SAN_FLAGS, *pc(prefix, "--cflags"),
         "-o", str(exe), os.path.join(ROOT, "examples", f"{name}.c"),
         *pc(prefix, "--libs"), "-lm", "-pthread"], cwd=str(tmp_path))
    return exe


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_builds_against_the_installed_files_only(prefix, tmp_path, name):
    exe = build_example(prefix, tmp_path, name)
    libs = run(["ldd", str(exe)], env=dict(os.environ, LD_LIBRARY_PATH=os.path.join(prefix, "lib")))
    assert os.path.join(prefix, "lib", "libcrun.so.0") in libs, libs


def test_the_worker_examples_run_under_the_installed_crun(prefix, tmp_path):
    """dist_matmul (collectives) and rank_env (the store client), built from
    the install, as a 2-worker job of the installed crun."""
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(prefix, "lib"), TMPDIR=str(tmp_path))
    crun = os.path.join(prefix, "bin", "crun")
    out = run([crun, "--standalone", "--nproc_per_node=2", "--no_python",
               str(build_example(prefix, tmp_path, "dist_matmul")), "--backend", "cpu", "64"],
              env=env, timeout=120)
    assert re.search(r"dist_matmul: n=64 world=2: ", out), out
    assert re.search(r"max relative error vs single-process product \S+: OK", out), out
    out = run([crun, "--standalone", "--nproc_per_node=2", "--no_python",
               str(build_example(prefix, tmp_path, "rank_env"))], env=env, timeout=120)
    assert "rank 1: WORLD_SIZE=2" in out, out


def test_the_embedding_example_builds_and_runs_against_the_installed_files(prefix, tmp_path):
    """examples/embed_scheduler.c, a scheduler with its own poll loop and spawn
    hook, built with `pkg-config crun` only: a two-node job of 4 ranks."""
    exe = build_example(prefix, tmp_path, "embed_scheduler")
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(prefix, "lib"),
               TMPDIR=str(tmp_path))
    out = run([str(exe)], env=env, timeout=120)
    lines = out.splitlines()
    starts = [l for l in lines if ": worker start: pid " in l]
    exits = [l for l in lines if ": worker exit: " in l and "exit code 0, signal 0" in l]
    assert len(starts) == 4 and len(exits) == 4, out
    assert any("node1: rendezvous: group_rank 1 of 2, ranks 2-3 of world 4" in l
               for l in lines), out
    hellos = sorted(l.split("]:", 1)[1] for l in lines if "hello from rank" in l)
    assert hellos == [f"hello from rank {r} of 4 (local {r % 2})" for r in range(4)], out
    assert lines[-1] == "job exit code 0"


def test_only_crun_symbols_are_exported(prefix):
    out = run(["nm", "-D", "--defined-only", os.path.join(prefix, "lib/libcrun.so.0")])
    names = [l.split()[-1] for l in out.splitlines() if l.strip()]
    assert names, "no exported symbols"
    strays = [n for n in names if not n.startswith("crun_") and not n.startswith("CRUN_")]
    assert not strays, f"exported beyond crun_*: {strays[:20]}"
    soname = run(["objdump", "-p", os.path.join(prefix, "lib/libcrun.so.0")])
    assert "SONAME               libcrun.so.0" in soname


# A scheduler linking libcrun.a statically, with helpers of its own whose
# names libcrun also uses inside (common/: parse_bool, str_dup).
HOST_PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include <crun/crun.h>
#include <crun/agent.h>

int parse_bool(const char *s)
{
	return strcmp(s, "yes") == 0 ? 42 : 0;
}

char *str_dup(const char *s)
{
	return (char *)s;
}

int main(void)
{
	crun_agent_free(NULL); /* pulls in the agent and what it uses inside */
	printf("%d %s %s\n", parse_bool("yes"), str_dup("mine"), crun_strerror(CRUN_EINVAL));
	return 0;
}
"""


def test_the_static_library_defines_only_crun_names(prefix, tmp_path):
    lib = os.path.join(prefix, "lib/libcrun.a")
    out = run(["nm", "-g", "--defined-only", lib])
    names = [l.split()[-1] for l in out.splitlines() if len(l.split()) == 3]
    assert "crun_strerror" in names and "crun_agent_new" in names, names[:20]
    strays = [n for n in names if not n.startswith("crun_")]
    assert not strays, f"libcrun.a defines beyond crun_*: {len(strays)}: {strays[:20]}"
    src = tmp_path / "host.c"
    src.write_text(HOST_PROGRAM)
    exe = tmp_path / "host"
    libs = [l for l in pc(prefix, "--libs", "--static") if l != "-lcrun"]
    run(["cc", "-std=c99", "-Wall", "-Werror", *SAN_FLAGS, *pc(prefix, "--cflags"),
         "-o", str(exe), str(src), lib, *libs, "-lm", "-ldl", "-pthread"])
    assert run([str(exe)]).split(" ", 2) == ["42", "mine", "invalid argument\n"]


@pytest.mark.parametrize("compiler", [
    ["cc", "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-x", "c"],
    ["g++", "-std=c++17", "-pedantic", "-Wall", "-Wextra", "-Werror", "-x", "c++"],
], ids=["c99", "cxx17"])
def test_public_headers_compile_alone(prefix, tmp_path, compiler):
    for h in sorted(os.listdir(os.path.join(prefix, "include/crun"))):
        src = tmp_path / f"{h}.src"
        src.write_text(f"#include <crun/{h}>\nint crun_test_unit_{h[:-2]};\n")
        run([*compiler, "-I", os.path.join(prefix, "include"), "-c", str(src),
             "-o", str(tmp_path / f"{h}.o")])


def test_nothing_installed_needs_cuda(prefix):
    objs = [os.path.join(prefix, "lib/libcrun.so.0")]
    bindir = os.path.join(prefix, "bin")
    objs += [os.path.join(bindir, p) for p in sorted(os.listdir(bindir))]
    for o in objs:
        dyn = run(["objdump", "-p", o])
        needed = [l.split()[-1] for l in dyn.splitlines() if l.strip().startswith("NEEDED")]
        bad = [n for n in needed if "cuda" in n or "nccl" in n or "cublas" in n]
        assert not bad, f"{o} needs {bad}"
        runpath = [l for l in dyn.splitlines() if "RUNPATH" in l or "RPATH" in l]
        assert not runpath, f"{o} carries a build-host runpath: {runpath}"


def test_every_program_and_the_library_have_a_man_page_that_renders(prefix):
    pages = {"man1/crun.1", "man8/crun-agent.8", "man8/crun-rdzvd.8", "man1/crunctl.1",
             "man3/libcrun.3"}
    mandir = os.path.join(prefix, "share/man")
    for page in sorted(pages):
        path = os.path.join(mandir, page)
        assert os.path.exists(path), f"{page} is not installed"
        # --warnings: groff's own (bad requests, escapes, lines it cannot fill).
        out = subprocess.run(["man", "--warnings", "-l", path], capture_output=True,
                             text=True, timeout=60,
                             env=dict(os.environ, MANWIDTH="80", MAN_KEEP_FORMATTING="0"))
        assert out.returncode == 0, out.stderr
        assert "warning" not in out.stderr.lower(), out.stderr
        name = os.path.basename(page).rsplit(".", 1)[0]
        assert name.replace("-", "") in out.stdout.replace("-", "").replace("\u2010", ""), \
            out.stdout[:300]
    # Every exported function of the library is on libcrun(3).
    lib = subprocess.run(["man", "-l", os.path.join(mandir, "man3/libcrun.3")],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, MANWIDTH="200")).stdout
    syms = run(["nm", "-D", "--defined-only", os.path.join(prefix, "lib/libcrun.so.0")])
    for sym in (l.split()[-1].split("@")[0] for l in syms.splitlines() if " T " in l):
        assert sym in lib.replace("\u2010", "-").replace("- ", "-"), f"{sym} missing from libcrun(3)"


def rendered(prefix, page):
    """A man page as a reader sees it, one line per paragraph (no filling
    breaks, no hyphenation) and plain ASCII minus signs."""
    out = subprocess.run(["man", "-l", os.path.join(prefix, "share/man", page)],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, MANWIDTH="2000", LANG="C", LC_ALL="C"))
    assert out.returncode == 0, out.stderr
    return out.stdout.replace("\u2010", "-").replace("\u2212", "-")


def rdzv_conf_keys():
    """The keys crun's --rdzv_conf parser accepts, in its own words (its
    error for an unknown key lists them), store_<limit> expanded through
    crun-rdzvd's limits (its --print-schema)."""
    out = subprocess.run([os.path.join(BUILD, "bin", "crun"), "--rdzv_backend", "c10d",
                          "--rdzv_endpoint", "127.0.0.1:1", "--rdzv_conf", "no_such_key=1",
                          "/bin/true"], capture_output=True, text=True, timeout=60)
    m = re.search(r"unknown key 'no_such_key' \(expected ([^)]*)\)", out.stderr)
    assert m, out.stderr
    keys = m.group(1).split(", ")
    schema = json.loads(run([os.path.join(BUILD, "bin", "crun-rdzvd"), "--print-schema"]))
    limits = schema["properties"]["limits"]["properties"]
    assert "store_<limit>" in keys and len(limits) > 5, (keys, limits)
    return [k for k in keys if k != "store_<limit>"] + \
        ["store_" + n.replace("-", "_") for n in limits if not n.startswith("$")]


def completion_words(prog):
    """Every spelling of every option of crun's table (its bash completion is a
    loop over it), less the hidden --print-man."""
    out = run([os.path.join(BUILD, "bin", prog), "--print-completion", "bash"])
    words = re.search(r'compgen -W "(--[^"]*)" -- "\$cur"\)\)\n\t\treturn', out).group(1)
    return [w for w in words.split() if "print-man" not in w and "print_man" not in w]


@pytest.mark.parametrize("prog,page", [("crun", "man1/crun.1"),
                                       ("crun-agent", "man8/crun-agent.8")])
def test_every_option_and_rdzv_conf_key_is_in_help_and_man(prefix, prog, page):
    """The option table and the --rdzv_conf parser's keys cannot drift from
    --help and the man page (7 of the parser's keys were missing from both)."""
    help_text = run([os.path.join(BUILD, "bin", prog), "--help"])
    man = rendered(prefix, page)

    def has(w, text):  # a word of its own, not part of --auth_secret_file
        return re.search(r"(?<![\w-])" + re.escape(w) + r"(?![\w-])", text)

    missing = [w for w in completion_words(prog) + rdzv_conf_keys()
               if not has(w, help_text) or not has(w, man)]
    assert not missing, f"in the table or the parser but not in {prog} --help or {page}: " \
        f"{[(w, bool(has(w, help_text)), bool(has(w, man))) for w in missing]}"
    rejected = help_text.lower().partition("not supported")[2]
    assert "etcd" not in rejected, f"--help says etcd is not supported: {rejected}"


def spellings_in(lines):
    """The long spellings on option tag lines ("  -j, --rdzv-id, --rdzv_id JOB")."""
    return {w for ln in lines for w in re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", ln)}


# A value each placeholder accepts, to show a flag is parsed (then --version ends the run).
SAMPLE = {"ADDR": "127.0.0.1", "N": "1", "SECONDS": "1", "LEVEL": "info", "ADDR:PORT": "off",
          "FILE": "/nonexistent", "DIR": "/nonexistent", "V": "1.3", "SHELL": "bash",
          "HOST:PORT": "127.0.0.1:1", "JOB": "j", "S": "1", "RANK": "0"}


@pytest.mark.parametrize("prog,page", [("crun-rdzvd", "man8/crun-rdzvd.8"),
                                       ("crunctl", "man1/crunctl.1")])
def test_daemon_flags_come_from_one_table_and_are_all_documented(prefix, prog, page, tmp_path):
    """Issue 22.5: crun-rdzvd's and crunctl's flags are rows of the option
    table mechanism crun and crun-agent use: every spelling of --help is on
    the man page (from --print-man) and in the completion, and the other way
    round, and every one of them is accepted by the parser. Before, both
    pages came from help2man and neither program had --print-man or
    --print-completion."""
    exe = os.path.join(BUILD, "bin", prog)
    help_text = run([exe, "--help"])
    heads = [ln for ln in help_text.splitlines() if re.match(r"^  (-\w, )?--", ln)]
    in_help = spellings_in(heads)
    man = rendered(prefix, page)
    in_man = spellings_in(ln for ln in man.splitlines() if re.match(r"^ {7}(-\w, )?--", ln))
    completion = run([exe, "--print-completion", "bash"])
    words = re.search(r'compgen -W "(--[^"]*)" -- "\$cur"\)\)\n\t\treturn', completion).group(1)
    in_completion = {w for w in words.split() if w.startswith("--") and w != "--print-man"}
    assert len(in_help) > 5 and in_help == in_man == in_completion, \
        (in_help ^ in_man, in_help ^ in_completion)
    cfg = tmp_path / "c.json"
    cfg.write_text("{}")
    limits = {}  # crun-rdzvd's limits: their smallest value (their schema's)
    if prog == "crun-rdzvd":
        limits = {"--" + k: str(v["minimum"]) for k, v in json.loads(run(
            [exe, "--print-schema"]))["properties"]["limits"]["properties"].items()
            if not k.startswith("$")}
    refused = []
    for head in heads:
        meta = re.search(r"--[a-z0-9_-]+ ([A-Z][A-Za-z.:]*)$", head)
        value = [] if not meta else [str(cfg) if meta.group(1) == "FILE.json"
                                     else SAMPLE[meta.group(1)]]
        for flag in spellings_in([head]):
            value = [limits[flag]] if flag in limits else value
            out = subprocess.run([exe, flag, *value, "--version"], capture_output=True,
                                 text=True, timeout=60)
            if out.returncode != 0:
                refused.append((flag, value, out.stderr.strip()))
    assert not refused, refused


@pytest.mark.parametrize("page,opts", [
    ("man8/crun-rdzvd.8", "crun-rdzvd"), ("man1/crunctl.1", "crunctl"),
    ("man1/crun.1", None), ("man8/crun-agent.8", None)])
def test_man_pages_have_the_sections_a_user_expects(prefix, page, opts):
    """Every page has NAME, a SYNOPSIS that is a synopsis (not "usage:"), a
    DESCRIPTION, explained OPTIONS, EXIT STATUS or its equivalent, ENVIRONMENT,
    EXAMPLES and SEE ALSO; the daemons' pages also FILES and SIGNALS; every
    flag of the program's --help is a tagged paragraph of OPTIONS."""
    man = rendered(prefix, page)
    heads = re.findall(r"^([A-Z][A-Z ]+)$", man, re.M)
    want = ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "ENVIRONMENT", "EXAMPLES", "SEE ALSO"]
    if page != "man1/crunctl.1":
        want += ["EXIT STATUS", "SIGNALS", "FILES"]
    assert not [w for w in want if w not in heads], heads
    synopsis = man[man.index("\nSYNOPSIS"):man.index("\nDESCRIPTION")]
    assert "usage:" not in synopsis, synopsis
    if opts:
        flags = set(re.findall(r"^ +(?:-\w, )?(--[a-z][a-z_-]*)", run(
            [os.path.join(BUILD, "bin", opts), "--help"]), re.M))
        assert len(flags) > 5, flags
        # A flag is explained: text follows its tag, on its line or the next.
        unexplained = [f for f in sorted(flags)
                       if not re.search(r"^ {7}(-\w, )?" + re.escape(f) +
                                        r"(, --[a-z][a-z0-9_-]*)*"
                                        r"( [A-Z][A-Za-z0-9:.|_]*)?( +[a-z]|\n {8,}\S)", man, re.M)]
        assert not unexplained, unexplained


def test_the_gpu_object_sits_beside_the_library(prefix):
    """libcrun-cuda.so.0 (built when nvcc is there) is installed next to
    libcrun.so.0, where the SDK's dlopen looks first, with no runpath."""
    built = os.path.exists(os.path.join(BUILD, "lib", "libcrun-cuda.so.0"))
    inst = os.path.join(prefix, "lib", "libcrun-cuda.so.0")
    assert os.path.exists(inst) == built
    if built:
        dyn = run(["objdump", "-p", inst])
        assert "RUNPATH" not in dyn and "RPATH" not in dyn, dyn


def test_uninstall_removes_what_install_put(tmp_path):
    dest = tmp_path / "d"
    args = ["make", "-C", ROOT, "--no-print-directory", f"DESTDIR={dest}", "PREFIX=/usr/local",
            f"BUILD={BUILD}", f"SAN={'1' if SAN else '0'}"]
    run(args + ["install"], timeout=900)
    run(args + ["uninstall"])
    left = [os.path.join(d, f) for d, _, fs in os.walk(dest) for f in fs]
    # Only configs (which an operator may have edited) stay.
    assert all("/etc/crun/" in f for f in left), left


def test_a_header_change_rebuilds_its_objects_whatever_the_build_path_form():
    """A build made with BUILD=$PWD/build (as test_install's) and one made with
    BUILD=build must both see a changed header: the dependency files named
    the object in one form only, and a later build in the other form linked
    objects of an old struct layout (crun crashed at start)."""
    obj = os.path.join("obj", "agent", "fsm.o")
    forms = {BUILD}
    if os.path.abspath(BUILD).startswith(os.path.abspath(ROOT) + os.sep):
        forms.add(os.path.relpath(BUILD, ROOT))
    for b in sorted(forms):
        base = ["make", "-C", ROOT, "--no-print-directory", "-n", f"BUILD={b}",
                f"SAN={'1' if SAN else '0'}"]  # CI comes from the environment or MAKEFLAGS
        target = os.path.join(b, obj)
        idle = subprocess.run(base + [target], capture_output=True, text=True, timeout=120)
        if "agent/fsm.c" in idle.stdout:
            pytest.skip(f"{target} is not up to date with this make's settings")
        touched = subprocess.run(base + ["-W", "agent/agent.h", target], capture_output=True,
                                 text=True, timeout=120)
        assert "agent/fsm.c" in touched.stdout, (b, touched.stdout + touched.stderr)


def test_the_shell_completions_are_installed_and_parse(prefix):
    """bash and zsh completions for crun and crun-agent, generated from the
    option table, are installed where the shells look (they were not)."""
    for prog in ("crun", "crun-agent"):
        bash = os.path.join(prefix, "share/bash-completion/completions", prog)
        zsh = os.path.join(prefix, "share/zsh/vendor-completions", "_" + prog)
        run(["bash", "-n", bash])
        with open(bash) as f:
            assert f"complete -o filenames -F _{prog.replace('-', '_')}_complete {prog}" in \
                f.read()
        with open(zsh) as f:
            assert f.readline().startswith(f"#compdef {prog}")


def test_a_multiarch_install_puts_the_library_and_pc_file_in_libdir(tmp_path):
    """LIBDIR=/usr/lib/TRIPLET (debian/rules) moves the libraries, and crun.pc
    says so relative to its prefix."""
    dest = tmp_path / "d"
    libdir = "/usr/lib/x86_64-linux-gnu"
    run(["make", "-C", ROOT, "--no-print-directory", "install", f"DESTDIR={dest}",
         "PREFIX=/usr", f"LIBDIR={libdir}", f"BUILD={BUILD}",
         f"SAN={'1' if SAN else '0'}"], timeout=900)
    lib = f"{dest}{libdir}"
    assert os.path.exists(os.path.join(lib, "libcrun.so.0")), os.listdir(dest / "usr/lib")
    with open(os.path.join(lib, "pkgconfig", "crun.pc")) as f:
        pc_text = f.read()
    assert "libdir=${prefix}/lib/x86_64-linux-gnu\n" in pc_text, pc_text
    assert not os.path.exists(dest / "usr/lib/libcrun.so.0")


def test_the_build_passes_cppflags_and_ldflags_to_every_compile_and_link(tmp_path):
    """dpkg-buildflags' hardening (-D_FORTIFY_SOURCE=2 in CPPFLAGS, -z now in
    LDFLAGS) reaches every compiler and linker command (make ignored both).
    A dry run into a fresh build directory lists every command."""
    build = tmp_path / "b"
    out = run(["make", "-C", ROOT, "--no-print-directory", "-n", "V=1", f"BUILD={build}",
               "WITH_CUDA=0", "CPPFLAGS=-DCRUN_TEST_CPPFLAGS=1",
               "LDFLAGS=-Wl,-z,now -Wl,--defsym=crun_test_ldflags=1", "all"], timeout=300)
    lines = [l for l in out.replace("\\\n", " ").splitlines()
             if l.lstrip().startswith(("cc ", "gcc ", "clang "))]
    compiles = [l for l in lines if re.search(r"\s-c\s", l)]
    links = [l for l in lines if not re.search(r"\s-c\s", l) and " -o " in l]
    assert compiles and links, out[-3000:]
    assert not [l for l in compiles if "-DCRUN_TEST_CPPFLAGS=1" not in l], compiles[:3]
    assert not [l for l in links if "-Wl,-z,now" not in l], \
        [l for l in links if "-Wl,-z,now" not in l][:3]


def test_the_licence_is_apache_2_and_debian_copyright_says_so():
    with open(os.path.join(ROOT, "LICENSE")) as f:
        text = f.read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    with open(os.path.join(ROOT, "debian", "copyright")) as f:
        dep5 = f.read()
    assert dep5.startswith("Format: https://www.debian.org/doc/packaging-manuals/"
                           "copyright-format/1.0/")
    assert re.search(r"^Files: \*\nCopyright: .+\nLicense: Apache-2.0$", dep5, re.M), dep5
    assert re.search(r"^License: Apache-2.0\n .+", dep5, re.M), dep5
