# crun: one non-recursive Makefile. Output under $(BUILD)/:
#   bin/      crun, crun-rdzvd, ... (one program per cmd/*.c)
#   lib/      libcrun.a, libcrun.so.0
#   tests/    one Check binary per tests/unit/test_*.c
#   examples/ bench/ fuzz/
# `make` and `make test` install missing Debian packages first (scripts/deps.sh).

.DEFAULT_GOAL := all
BUILD ?= build
SAN ?= 0
V ?= 0
WITH_CUDA ?= auto
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= /usr/local/cuda
PYTEST_ARGS ?=
FUZZ_SECONDS ?= 20

ifeq ($(SAN),1)
  BUILD := build-san
  SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif

ifeq ($(WITH_CUDA),auto)
  ifneq ($(NVCC),)
    WITH_CUDA := 1
  else
    WITH_CUDA := 0
  endif
endif

ifeq ($(V),1)
  Q :=
else
  Q := @
endif

CC ?= cc
OBJCOPY ?= objcopy
CFLAGS ?= -O2 -g
WARN := -Wall -Wextra -Wshadow -Wformat=2 -Wmissing-prototypes -Wstrict-prototypes \
	-Wno-unused-parameter -Werror=implicit-function-declaration
ifeq ($(CI),true)
  WARN += -Werror
endif
BASE_CFLAGS := -std=gnu11 -D_GNU_SOURCE -fPIC -fvisibility=hidden -pthread $(WARN) \
	-I. -Iinclude -MMD -MP $(SANFLAGS)
# CPPFLAGS and LDFLAGS come from the caller (dpkg-buildflags: _FORTIFY_SOURCE,
# -z relro -z now under hardening=+all) and go on every compile and link.
BASE_LDFLAGS = -pthread $(SANFLAGS) $(LDFLAGS)

# Dependencies are resolved once into $(BUILD)/config.mk; make rebuilds that
# file (installing missing packages) and restarts itself when it is missing.
PKGS := libevent libevent_openssl libevent_pthreads openssl libcjson
-include $(BUILD)/config.mk

$(BUILD)/config.mk: scripts/deps.sh
	@mkdir -p $(@D)
	$(Q)sh scripts/deps.sh build
	$(Q){ echo "DEP_CFLAGS := $$(pkg-config --cflags $(PKGS))"; \
	     echo "DEP_LIBS := $$(pkg-config --libs $(PKGS))"; \
	     echo "CHECK_CFLAGS := $$(pkg-config --cflags check)"; \
	     echo "CHECK_LIBS := $$(pkg-config --libs check)"; } > $@.tmp && mv $@.tmp $@

ALL_CFLAGS = $(BASE_CFLAGS) $(DEP_CFLAGS) $(CPPFLAGS) $(CFLAGS)
LIBS = $(DEP_LIBS) -lm -ldl

# ---- the library: every module but cmd/ --------------------------------------
# libcrun never links CUDA or NCCL (STYLE §7): the .cu kernels and the NCCL
# backend (worker_sdk/nccl*.c) go into libcrun-cuda.so.0, which links them
# itself and which the SDK dlopens (kernels/cuda_load.c).
# A module may keep its parts in subfolders (store/client/, store/server/ ...):
# one level deep, picked up here, by lint and by check-layers.sh.
MODULES := common store rendezvous service agent worker_sdk kernels
GPU_C_SRCS := $(wildcard worker_sdk/nccl*.c)
LIB_SRCS := $(filter-out $(GPU_C_SRCS),$(foreach m,$(MODULES),$(wildcard $(m)/*.c $(m)/*/*.c)))
CU_SRCS := $(wildcard kernels/*.cu)
LIB_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRCS))
LIBA := $(BUILD)/lib/libcrun.a
LIBINT := $(BUILD)/lib/libcrun-internal.a
LIBSO := $(BUILD)/lib/libcrun.so.0
LIBCUDA := $(BUILD)/lib/libcrun-cuda.so.0
GPU_TESTS := $(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(wildcard tests/gpu/*.c))
# Host-only programs compiled by nvcc: the kernels' arithmetic checked without
# a GPU. Linked by $(CC) (nvcc would split SANFLAGS at its commas), with the
# static cudart its fatbin registration needs, so nothing is looked up at run time.
GPU_HOST_TESTS := $(patsubst tests/gpu/%.cu,$(BUILD)/tests/gpu/%,$(wildcard tests/gpu/*.cu))

ifeq ($(WITH_CUDA),1)
  # sm_80 and sm_90 machine code, plus compute_90 PTX, which the driver JITs
  # on every GPU at or above 9.0 (B200 is 10.0, consumer Blackwell 12.0).
  # PTX JITs only upwards: the newest nvcc's (compute_121) would run on
  # nothing older than 12.1 (issue 27; tests/gpu/fatbin_archs.py checks).
  CUDA_GENCODE := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90
  NVCCFLAGS ?= -O3 -lineinfo
  # kernels/device.c is pure C that both libcrun and the GPU object carry.
  CUDA_OBJS := $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CU_SRCS)) \
	$(patsubst %.c,$(BUILD)/obj-cuda/%.o,$(GPU_C_SRCS) kernels/device.c)
  CUDA_TARGETS := $(LIBCUDA) $(GPU_TESTS) $(GPU_HOST_TESTS)
else
  CUDA_TARGETS :=
endif
# The GPU object is not built with the sanitizers: it is dlopened into
# processes that may or may not carry their runtime.
CUDA_CFLAGS = -std=gnu11 -D_GNU_SOURCE -fPIC -fvisibility=hidden -pthread $(WARN) -I. -Iinclude \
	-isystem $(CUDA_HOME)/include -MMD -MP $(CPPFLAGS) $(CFLAGS)
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -lcudart -lnccl -lstdc++ -lm -ldl -pthread $(LDFLAGS)

PROGS := $(patsubst cmd/%.c,$(BUILD)/bin/%,$(wildcard cmd/*.c))
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
BENCHES := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))
UNIT_TESTS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(wildcard tests/unit/test_*.c))
TEST_HELPERS := $(patsubst tests/helpers/%.c,$(BUILD)/tests/helpers/%,$(wildcard tests/helpers/*.c))
# LD_PRELOAD shims for integration tests (clock steps and the like).
TEST_HELPERS += $(patsubst tests/preload/%.c,$(BUILD)/tests/preload/%.so,$(wildcard tests/preload/*.c))

.PHONY: all test unit integration fuzz fuzz-run lint check-layers check-pure check-cycles check-size \
	check-rdzvd-deps demo bench clean \
	test-deps gpu-test gpu-check print-config install uninstall deb deb-check bench-scale bench-ab flake-hunt
all: $(PROGS) $(LIBA) $(LIBSO) $(EXAMPLES) $(BENCHES) $(BUILD)/crun.pc $(CUDA_TARGETS)
	@echo "built crun (WITH_CUDA=$(WITH_CUDA), SAN=$(SAN)) under $(BUILD)/"

print-config:
	@echo "BUILD=$(BUILD) WITH_CUDA=$(WITH_CUDA) NVCC=$(NVCC) SAN=$(SAN)"

# The dependency file names the object both ways, absolute and relative: a
# build made with BUILD=$$PWD/build (test_install) must still see a changed
# header in a later plain `make` (it did not, and linked a stale layout).
$(BUILD)/obj/%.o: %.c $(BUILD)/config.mk
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(ALL_CFLAGS) -MT $(abspath $@) -MT $(patsubst $(CURDIR)/%,%,$(abspath $@)) \
		-c $< -o $@

# -Xptxas -v: registers, spills and shared memory per kernel in the .ptxas
# file next to the object (read it after touching a kernel).
$(BUILD)/obj/%.cu.o: %.cu kernels/cuda_int.h kernels/kernels.h kernels/reduce_int.cuh
	@mkdir -p $(@D)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) $(NVCCFLAGS) -std=c++17 -I. -Iinclude -Xcompiler -fPIC,-fvisibility=hidden \
		$(CUDA_GENCODE) -Xptxas -v -c $< -o $@ 2> $@.ptxas || { cat $@.ptxas; exit 1; }
	$(Q)grep -i 'warning' $@.ptxas >&2 || true

$(BUILD)/obj-cuda/%.o: %.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $< (GPU object)")
	$(Q)$(CC) $(CUDA_CFLAGS) -c $< -o $@

# The GPU object: self-contained (-z defs: nothing from libcrun), exporting
# only its versioned entry points, no runpath (found next to libcrun).
$(LIBCUDA): $(CUDA_OBJS) kernels/cuda.map
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared -Wl,-soname,libcrun-cuda.so.0 -Wl,--version-script=kernels/cuda.map \
		-Wl,-z,defs -o $@ $(CUDA_OBJS) $(CUDA_LIBS)

# GPU tests (not installed): the SDK plus cuBLAS / NCCL for the baselines.
$(BUILD)/tests/gpu/%: tests/gpu/%.c $(LIBINT) $(BUILD)/config.mk
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CUDA_CFLAGS) $(SANFLAGS) -Wno-missing-prototypes -Itests -o $@ $< $(LIBINT) $(LIBS) \
		-L$(CUDA_HOME)/lib64 -lcudart -lcublas -lnccl -Wl,-rpath,$(CUDA_HOME)/lib64

$(BUILD)/tests/gpu/%: tests/gpu/%.cu kernels/reduce_int.cuh $(LIBINT) $(BUILD)/config.mk
	@mkdir -p $(@D)
	@$(if $(Q),echo "  NVCC    $< (host)")
	$(Q)$(NVCC) -std=c++17 -O2 -I. -Iinclude -c $< -o $@.o
	$(Q)$(CC) $(BASE_LDFLAGS) -o $@ $@.o $(LIBINT) $(LIBS) -L$(CUDA_HOME)/lib64 -lcudart_static \
		-lrt -lstdc++

# libcrun.a, the installed static library, defines no global name beyond
# libcrun.map's (crun_*): its objects are linked into one (ld -r) whose other
# globals objcopy makes local, so a host program with its own parse_bool or
# str_dup links it. The programs, tests and benchmarks use the
# internals too: they link $(LIBINT), the plain archive, which is not installed.
LIB_GLOBALS = $(shell sed -n 's/^[[:space:]]*\(crun_[^;]*\);.*/\1/p' libcrun.map)
$(LIBA): $(LIB_OBJS) libcrun.map Makefile
	@mkdir -p $(@D)
	@$(if $(Q),echo "  AR      $@")
	$(Q)$(LD) -r -o $(BUILD)/obj/libcrun-all.o $(LIB_OBJS)
	$(Q)$(OBJCOPY) --wildcard $(foreach g,$(LIB_GLOBALS),--keep-global-symbol='$(g)') \
		$(BUILD)/obj/libcrun-all.o $(BUILD)/obj/libcrun-public.o
	$(Q)rm -f $@ && $(AR) rcs $@ $(BUILD)/obj/libcrun-public.o

$(LIBINT): $(LIB_OBJS)
	@mkdir -p $(@D)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(LIBSO): $(LIB_OBJS) libcrun.map
	@mkdir -p $(@D)
	$(Q)$(CC) -shared -Wl,-soname,libcrun.so.0 -Wl,--version-script=libcrun.map \
		$(BASE_LDFLAGS) -o $@ $(LIB_OBJS) $(LIBS)
	$(Q)ln -sf libcrun.so.0 $(BUILD)/lib/libcrun.so

$(BUILD)/crun.pc: crun.pc.in
	$(Q)sed -e 's|@PREFIX@|$(abspath $(BUILD))|' -e 's|@LIBDIR@|$${prefix}/lib|' \
		-e 's|@INCLUDE@|$(abspath include)|' $< > $@

$(BUILD)/bin/%: $(BUILD)/obj/cmd/%.o $(LIBINT)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(BASE_LDFLAGS) -o $@ $< $(LIBINT) $(LIBS)

# The examples see only what an installed libcrun offers: the public headers
# (no -I. for the private ones) and libcrun.a, whose only globals are crun_*.
# test_install builds them again with pkg-config against an install.
$(BUILD)/obj/examples/%.o: examples/%.c $(BUILD)/config.mk
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(filter-out -I.,$(ALL_CFLAGS)) -MT $(abspath $@) \
		-MT $(patsubst $(CURDIR)/%,%,$(abspath $@)) -c $< -o $@

$(BUILD)/examples/%: $(BUILD)/obj/examples/%.o $(LIBA)
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_LDFLAGS) -o $@ $< $(LIBA) $(LIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIBINT)
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_LDFLAGS) -o $@ $< $(LIBINT) $(LIBS)

# rdzv_sim runs the library's blocking store client on coroutines: the linker
# routes the client's poll/usleep/connect/send/recv through its scheduler.
SIM_WRAP := -Wl,--wrap=poll,--wrap=usleep,--wrap=connect,--wrap=send,--wrap=recv
$(BUILD)/bench/rdzv_sim: $(BUILD)/obj/bench/rdzv_sim.o $(LIBINT)
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_LDFLAGS) $(SIM_WRAP) -o $@ $< $(LIBINT) $(LIBS)

$(BUILD)/obj/tests/%.o: tests/%.c $(BUILD)/config.mk
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -Itests -c $< -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(LIBINT)
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_LDFLAGS) -o $@ $< $(LIBINT) $(LIBS) $(CHECK_LIBS)

# A stand-in GPU object for test_backend (no CUDA): the nccl path on any host.
$(BUILD)/tests/test_backend: $(BUILD)/tests/libfake_backend.so
$(BUILD)/tests/libfake_backend.so: tests/unit/fake_backend.c worker_sdk/backend_int.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -Wno-missing-prototypes -shared -Wl,-z,defs -o $@ $<

$(BUILD)/tests/preload/%.so: tests/preload/%.c $(BUILD)/config.mk
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -shared -Wl,-z,defs -o $@ $<

$(BUILD)/tests/helpers/%: $(BUILD)/obj/tests/helpers/%.o $(LIBINT)
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_LDFLAGS) -o $@ $< $(LIBINT) $(LIBS)

# ---- tests -------------------------------------------------------------------
# `make test` is what CI runs: packages, build, unit (Check), integration and
# interop (pytest, real crun processes and real PyTorch 1.13 + 2.x), and a
# bounded libFuzzer run of the wire decoder.
test-deps:
	$(Q)sh scripts/deps.sh test

test: test-deps all $(UNIT_TESTS) $(TEST_HELPERS)
	$(Q)$(MAKE) --no-print-directory unit
	$(Q)$(MAKE) --no-print-directory gpu-check
	$(Q)$(MAKE) --no-print-directory integration
	$(Q)$(MAKE) --no-print-directory fuzz-run
	@echo "make test: all suites passed"

# ASan+UBSan runs each test several times slower: its Check timeouts (a
# guard against hangs, not a speed assertion) stretch with it (SAN CI: the
# 40-agent store_round_trips_per_member passed 30 s on a loaded machine).
unit: $(UNIT_TESTS)
	$(Q)CK_TIMEOUT_MULTIPLIER=$(if $(filter 1,$(SAN)),3,1) sh tests/run-unit.sh $(UNIT_TESTS)

integration: all $(TEST_HELPERS)
	$(Q)CRUN_BUILD=$(abspath $(BUILD)) CRUN_SAN=$(SAN) /usr/bin/python3 -m pytest -q \
		-p no:cacheprovider --durations=25 tests/integration $(PYTEST_ARGS)

# Not part of `make test`: runs SUITES RUNS times with HOGS busy loops beside
# them and prints each test's failure count (scripts/flake-hunt.py; issue 23).
# SUITES: unit:<binary> and integration:<file>[::<-k names, commas for "or">] words;
# SAN=1 hunts on the sanitizer build. FLAKE_LOG=file keeps the failures' lines.
SUITES ?= unit:test_rdzv_c10d
RUNS ?= 10
HOGS ?= 2
FLAKE_LOG ?=
FLAKE_UNIT := $(patsubst unit:%,$(BUILD)/tests/%,$(filter unit:%,$(SUITES)))
FLAKE_INTEG := $(if $(filter integration:%,$(SUITES)),all $(TEST_HELPERS))
flake-hunt: $(FLAKE_UNIT) $(FLAKE_INTEG)
	$(Q)/usr/bin/python3 scripts/flake-hunt.py --build $(BUILD) --runs $(RUNS) --hogs $(HOGS) \
		--san $(if $(filter 1,$(SAN)),1,0) $(if $(FLAKE_LOG),--log $(FLAKE_LOG)) $(SUITES)

# libFuzzer needs clang; the fuzz build is separate from $(BUILD).
FUZZ_BUILD := build-fuzz
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZERS := $(patsubst tests/fuzz/%.c,$(FUZZ_BUILD)/%,$(FUZZ_SRCS))
FUZZ_LIB_SRCS := $(wildcard common/*.c) store/proto/proto.c store/proto/proto_ext.c store/auth.c

fuzz: $(FUZZERS)
$(FUZZ_BUILD)/%: tests/fuzz/%.c $(FUZZ_LIB_SRCS) $(wildcard store/*.h store/*/*.h common/*.h \
	include/crun/*.h)
	@mkdir -p $(@D)
	$(Q)clang -std=gnu11 -D_GNU_SOURCE -g -O1 -I. -Iinclude \
		-fsanitize=fuzzer,address,undefined -o $@ $< $(FUZZ_LIB_SRCS) -lcrypto

fuzz-run: $(FUZZERS)
	$(Q)set -e; for f in $(FUZZERS); do \
		n=$$(basename $$f); mkdir -p $(FUZZ_BUILD)/corpus-$$n; \
		echo "fuzz: $$n for $(FUZZ_SECONDS)s"; \
		$$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			$(FUZZ_BUILD)/corpus-$$n tests/fuzz/seeds > $(FUZZ_BUILD)/$$n.log 2>&1 || \
			{ tail -40 $(FUZZ_BUILD)/$$n.log; echo "fuzz: $$n FAILED"; exit 1; }; \
		grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' $(FUZZ_BUILD)/$$n.log; \
	done

# The GPU suite with benchmarks (tests/gpu/run.sh; OUT=dir for the table).
gpu-test:
	$(Q)sh tests/gpu/run.sh $(BUILD)

# What `make test` runs: the GPU correctness tests without the benchmarks;
# on a host without a device they report "skipped: <why>" (a failure where
# nvidia-smi lists a GPU).
gpu-check: all
ifeq ($(WITH_CUDA),1)
	$(Q)GPU_QUICK=1 sh tests/gpu/run.sh $(BUILD)
else
	@echo "gpu-check: skipped (WITH_CUDA=0)"
endif

# ---- lint --------------------------------------------------------------------
SRC_ALL := $(filter-out build%,$(wildcard */*.c */*.h include/crun/*.h tests/*/*.c \
	$(foreach m,$(MODULES),$(m)/*/*.c $(m)/*/*.h)))
lint: check-layers check-pure check-cycles check-rdzvd-deps check-size
	$(Q)clang-format --dry-run --Werror $(filter-out tests/%,$(SRC_ALL))
	$(Q)cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability \
		--suppress=missingIncludeSystem --inline-suppr -I. -Iinclude \
		$(foreach m,$(MODULES) cmd,$(m))

check-layers:
	$(Q)sh scripts/check-layers.sh

# The pure cores call nothing but libc (issue 24): round.c, the round algorithm.
PURE_OBJS := $(BUILD)/obj/rendezvous/round.o
check-pure: $(PURE_OBJS)
	$(Q)CC="$(CC)" sh scripts/check-pure.sh $(PURE_OBJS)

# No loop of more than 4 source files calling each other (issue 24), with no
# exception: agent/'s largest loop is fsm, attempt, supervise and nodecheck.
check-cycles: $(LIB_OBJS)
	$(Q)/usr/bin/python3 scripts/check-cycles.py --max 4 \
		--root $(BUILD)/obj $(LIB_OBJS)

# crun-rdzvd links nothing from agent/ (issue 24): what its object calls,
# and what that calls in turn, is found in the library's objects as the
# linker would; an object under agent/ reached so fails, with the call.
check-rdzvd-deps: $(BUILD)/obj/cmd/crun-rdzvd.o $(LIB_OBJS)
	$(Q)/usr/bin/python3 scripts/check-links.py --forbid agent --root $(BUILD)/obj $^

# No function over 100 lines, no production file over 1,000 (issue 24).
SIZE_SRCS := $(filter-out tests/% examples/% bench/%,$(filter %.c,$(SRC_ALL))) \
	$(wildcard kernels/*.cu)
check-size:
	$(Q)/usr/bin/python3 scripts/check-size.py --max-function 100 --max-file 1000 $(SIZE_SRCS)

# ---- demo and benchmarks -----------------------------------------------------
demo: all
	$(Q)sh scripts/demo.sh $(BUILD)

bench: all
	$(Q)sh bench/run.sh $(BUILD)

# crun against an earlier crun (BEFORE=<commit or build folder>), in one run:
# launch, restart, agent RSS, store ops/s and idle RSS, rdzv rounds, real agents.
BEFORE ?=
bench-ab: all
	$(Q)test -n "$(BEFORE)" || { echo "usage: make bench-ab BEFORE=<commit>" >&2; exit 2; }
	$(Q)/usr/bin/python3 bench/ab_bench.py --before $(BEFORE) --after $(BUILD) \
		--out $(BUILD)/bench/ab.md

# ---- install ----------------------------------------------------------------
# `make install PREFIX=/usr/local DESTDIR=...`: programs, the library (shared
# with its soname, static), public headers, crun.pc, man pages, the systemd
# units and example configs (configs never overwrite what is already there).
PREFIX ?= /usr/local
DESTDIR ?=
BINDIR := $(PREFIX)/bin
# LIBDIR=$(PREFIX)/lib/$(DEB_HOST_MULTIARCH) for Debian's multiarch layout.
LIBDIR ?= $(PREFIX)/lib
INCDIR := $(PREFIX)/include
MANDIR := $(PREFIX)/share/man
UNITDIR ?= $(PREFIX)/lib/systemd/system
BASHCOMPDIR := $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR := $(PREFIX)/share/zsh/vendor-completions
# Shell completions, generated from the option table (--print-completion).
COMPLETED := crun crun-agent crun-rdzvd crunctl
COMPLETIONS := $(foreach p,$(COMPLETED),$(BUILD)/completion/$(p).bash $(BUILD)/completion/_$(p))
$(BUILD)/completion/%.bash: $(BUILD)/bin/%
	@mkdir -p $(@D)
	$(Q)$< --print-completion bash > $@.tmp && mv $@.tmp $@
$(BUILD)/completion/_%: $(BUILD)/bin/%
	@mkdir -p $(@D)
	$(Q)$< --print-completion zsh > $@.tmp && mv $@.tmp $@
SYSUSERSDIR := $(PREFIX)/lib/sysusers.d
TMPFILESDIR := $(PREFIX)/lib/tmpfiles.d
SYSCONFDIR := $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
INST = install -m 644
DATADIR := $(PREFIX)/share/crun
UNITS := $(wildcard configs/systemd/*.service)
# /etc/crun/rdzvd.json is what crun-rdzvd.service reads; job configs for
# crun-agent@.service are per job (/etc/crun/agents/JOB.json), so the
# examples, the schemas and the dashboard go to $(DATADIR).
ETC_CONFIGS := configs/examples/rdzvd.json
DATA := $(wildcard configs/*.schema.json configs/examples/*.json configs/grafana/*.json)
.SECONDEXPANSION:
# Man pages, each generated from what it documents so it cannot drift: the
# programs' from their option rows (--print-man: crun's option table, and
# crun-rdzvd's and crunctl's rows printed by the same code), libcrun(3) from
# the public headers.
MANPAGES := $(BUILD)/man/crun.1 $(BUILD)/man/crun-agent.8 $(BUILD)/man/crun-rdzvd.8 \
	$(BUILD)/man/crunctl.1 $(BUILD)/man/libcrun.3

$(BUILD)/man/crun.1 $(BUILD)/man/crun-agent.8 $(BUILD)/man/crun-rdzvd.8 $(BUILD)/man/crunctl.1: \
		$(BUILD)/man/%: $(BUILD)/bin/$$(basename %)
	@mkdir -p $(@D)
	$(Q)$< --print-man > $@.tmp && mv $@.tmp $@
$(BUILD)/man/libcrun.3: $(wildcard include/crun/*.h) scripts/libcrun-man.sh
	@mkdir -p $(@D)
	$(Q)sh scripts/libcrun-man.sh $(sort $(wildcard include/crun/*.h)) > $@.tmp && mv $@.tmp $@

install: all $(MANPAGES) $(COMPLETIONS)
	$(Q)install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCDIR)/crun
	$(Q)install -m 755 $(PROGS) $(DESTDIR)$(BINDIR)/
	$(Q)install -m 755 $(LIBSO) $(DESTDIR)$(LIBDIR)/libcrun.so.0
	$(Q)$(if $(filter 1,$(WITH_CUDA)),install -m 755 $(LIBCUDA) $(DESTDIR)$(LIBDIR)/)
	$(Q)ln -sf libcrun.so.0 $(DESTDIR)$(LIBDIR)/libcrun.so
	$(Q)$(INST) $(LIBA) $(DESTDIR)$(LIBDIR)/
	$(Q)$(INST) include/crun/*.h $(DESTDIR)$(INCDIR)/crun/
	$(Q)sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@INCLUDE@|$${prefix}/include|' \
		-e 's|@LIBDIR@|$(patsubst $(PREFIX)/%,$${prefix}/%,$(LIBDIR))|' crun.pc.in \
		> $(DESTDIR)$(LIBDIR)/pkgconfig/crun.pc
	$(Q)for m in $(MANPAGES); do s=$${m##*.}; install -d $(DESTDIR)$(MANDIR)/man$$s; \
		$(INST) $$m $(DESTDIR)$(MANDIR)/man$$s/; done
	$(Q)install -d $(DESTDIR)$(UNITDIR) $(DESTDIR)$(DATADIR)
	$(Q)for u in $(UNITS); do sed -e 's|/usr/bin/|$(BINDIR)/|g' -e 's|/etc/crun/|$(SYSCONFDIR)/crun/|g' \
		$$u > $(DESTDIR)$(UNITDIR)/$$(basename $$u) && chmod 644 $(DESTDIR)$(UNITDIR)/$$(basename $$u); done
	$(Q)install -d $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR)
	$(Q)for p in $(COMPLETED); do $(INST) $(BUILD)/completion/$$p.bash $(DESTDIR)$(BASHCOMPDIR)/$$p; \
		$(INST) $(BUILD)/completion/_$$p $(DESTDIR)$(ZSHCOMPDIR)/_$$p; done
	$(Q)install -d $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR)
	$(Q)$(INST) configs/sysusers.d/crun.conf $(DESTDIR)$(SYSUSERSDIR)/crun.conf
	$(Q)$(INST) configs/tmpfiles.d/crun.conf $(DESTDIR)$(TMPFILESDIR)/crun.conf
	$(Q)$(INST) $(DATA) $(DESTDIR)$(DATADIR)/
	$(Q)install -d $(DESTDIR)$(SYSCONFDIR)/crun
	$(Q)for f in $(ETC_CONFIGS); do t=$(DESTDIR)$(SYSCONFDIR)/crun/$$(basename $$f); \
		[ -e $$t ] || $(INST) $$f $$t; done
	@echo "installed crun under $(DESTDIR)$(PREFIX)"

# Removes what install put there, except configs an operator may have edited.
uninstall:
	$(Q)rm -f $(foreach p,$(PROGS),$(DESTDIR)$(BINDIR)/$(notdir $(p))) \
		$(DESTDIR)$(LIBDIR)/libcrun.so.0 $(DESTDIR)$(LIBDIR)/libcrun.so \
		$(DESTDIR)$(LIBDIR)/libcrun-cuda.so.0 \
		$(DESTDIR)$(LIBDIR)/libcrun.a $(DESTDIR)$(LIBDIR)/pkgconfig/crun.pc \
		$(foreach h,$(wildcard include/crun/*.h),$(DESTDIR)$(INCDIR)/crun/$(notdir $(h))) \
		$(foreach u,$(UNITS),$(DESTDIR)$(UNITDIR)/$(notdir $(u))) \
		$(DESTDIR)$(SYSUSERSDIR)/crun.conf $(DESTDIR)$(TMPFILESDIR)/crun.conf \
		$(foreach p,$(COMPLETED),$(DESTDIR)$(BASHCOMPDIR)/$(p) $(DESTDIR)$(ZSHCOMPDIR)/_$(p)) \
		$(foreach m,$(MANPAGES),$(DESTDIR)$(MANDIR)/man$(subst .,,$(suffix $(m)))/$(notdir $(m))) \
		$(foreach f,$(DATA),$(DESTDIR)$(DATADIR)/$(notdir $(f)))
	$(Q)rmdir $(DESTDIR)$(INCDIR)/crun $(DESTDIR)$(DATADIR) 2>/dev/null || true

# Debian packages from debian/ (needs debhelper; installed on demand), built
# in a copy of the tracked files under $(BUILD)/deb/ (dpkg-buildpackage writes
# the .debs beside its tree and cleans it: never the caller's tree or builds).
# deb-check: lintian without errors, and the programs and libraries hardened.
DEB_DIR := $(abspath $(BUILD))/deb
deb:
	$(Q)sh scripts/deps.sh deb
	$(Q)rm -rf $(DEB_DIR) && mkdir -p $(DEB_DIR)/crun
	$(Q)git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - | tar -xf - -C $(DEB_DIR)/crun
	$(Q)cd $(DEB_DIR)/crun && dpkg-buildpackage -us -uc -b
	@ls $(DEB_DIR)/*.deb

deb-check: deb
	$(Q)sh scripts/deb-check.sh $(DEB_DIR)

# The scale benchmarks (not part of make test): the worker-init storm against
# crun's stores and PyTorch's servers, with local and slow name lookups; the
# rendezvous of K = 1,024..12,288 simulated agents beside torchrun's.
bench-scale: all
	$(Q)sh scripts/deps.sh bench
	$(Q)mkdir -p $(BUILD)/bench/scale
	$(Q)for r in local slow; do /usr/bin/python3 bench/storm_bench.py $(BUILD) --resolver $$r \
		--out $(BUILD)/bench/scale/storm-$$r.md --json $(BUILD)/bench/scale/storm-$$r.json \
		--plot $(BUILD)/bench/scale/storm-$$r.svg || exit 1; done
	$(Q)/usr/bin/python3 bench/rdzv_sim.py $(BUILD) --out $(BUILD)/bench/scale/rdzv.md \
		--json $(BUILD)/bench/scale/rdzv.json --plot $(BUILD)/bench/scale/rdzv.svg

clean:
	rm -rf build build-san build-fuzz

# Objects of programs are not intermediates: keep them so a rerun relinks nothing.
.SECONDARY:

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
