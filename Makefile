# kiln: build, test, benchmark and demo. `make help` lists the targets.
#
# The two README commands, `make demo` and `make test`, install what they need themselves
# (through `make deps`), so each works alone on a fresh Debian/Ubuntu machine.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

# kiln-firstboot is built with the size-optimised `firstboot` profile into a static binary;
# scripts/build-firstboot.sh knows how (docs/building.md explains it).
FIRSTBOOT_BIN := target/firstboot/kiln-firstboot
FIRSTBOOT_ARM64_BIN := target/firstboot/arm64/kiln-firstboot
FIRSTBOOT_BUDGET_KIB := 400
FIRSTBOOT_EXE := target/firstboot/kiln-firstboot.exe
FIRSTBOOT_EXE_BUDGET_KIB := 600

.PHONY: firstboot-amd64 firstboot-arm64 opt-out-reset lock-audit binary-gate build-tests fixture help all build firstboot test check lint fmt fmt-check clippy doc unit size-check \
	bench demo clean dist man deps deps-qemu deps-windows fuzz windows test-windows golden render-examples cli-docs qemu-assets qemu-test

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | sort

all: build

deps: ## install the apt packages and cargo tools the project needs (idempotent)
	scripts/deps.sh windows

deps-qemu: ## install QEMU, kernel tools and debootstrap for the boot tests
	scripts/deps.sh qemu

deps-windows: ## install Debian's Rust with std sources, mingw-w64 and Wine
	scripts/deps.sh windows

build: firstboot man ## build kiln (release), the static kiln-firstboot and the man pages
	$(CARGO) build --release -p kiln

man: ## kiln's man pages (from its command line definition) and kiln-firstboot.8 (from its --help), into target/man/
	$(CARGO) run --locked -q -p kiln -- --quiet man --out target/man

firstboot: firstboot-amd64 firstboot-arm64 ## build the static, size-optimised kiln-firstboot (amd64 and arm64) into target/firstboot/

# Two targets, so `make -j2 firstboot` builds both at once: each ends in a fat-LTO link on one
# core (codegen-units = 1), and they share no target directory.
firstboot-amd64:
	scripts/build-firstboot.sh $(FIRSTBOOT_BIN)

firstboot-arm64:
	KILN_FIRSTBOOT_ARCH=arm64 scripts/build-firstboot.sh $(FIRSTBOOT_ARM64_BIN)

# Checks that need a real tool or privilege run or fail. A developer whose machine cannot do
# one (no loop devices in a container, say) names it in KILN_TEST_OPT_OUT (comma-separated:
# loop-mount, mount-namespace, sysupdate, cosign, containerd, spdx-validator, root); the test then
# records it in $(OPT_OUT_LOG) and `make test` lists every such check at its end. CI never
# sets the variable (docs/boot-tests.md, "Checks that did not run").
OPT_OUT_LOG := target/opted-out-checks.log
export KILN_OPT_OUT_LOG := $(CURDIR)/$(OPT_OUT_LOG)

FIXTURE_MIRROR := target/fixture-mirror

# Each stage of `make test` is timed (scripts/stage.sh); the table is printed at the end, or
# as soon as a stage fails.
STAGE_LOG := target/stage-times.tsv
# The boot tests' slow, cacheable inputs (guest assets, the arm64 cross build) are built in
# the background while the other stages compile and test (scripts/prefetch.sh); qemu-test's
# own calls then wait for them under their locks and redo whatever failed.
PREFETCH_LOG := target/qemu-prefetch.log
STAGE = scripts/stage.sh $(STAGE_LOG)
SUBMAKE = $(MAKE) --no-print-directory
# The boot tests are the longest stage and keep a core per guest busy, but not all the time
# (a guest waits on deadlines, the pod, its network): they run in the background from the
# moment their inputs exist, and the stages that need none of their outputs run beside them,
# at a lower CPU priority so a guest under TCG is never the one kept waiting (its in-guest
# deadlines are real time). A stage that fails there stops the boot tests.
BESIDE = nice -n 10
STOP_BOOTS = { $(STAGE) --stop qemu-test; exit 1; }

test: ## the README's test command: every gate and every test
	@mkdir -p target && rm -f $(OPT_OUT_LOG) $(STAGE_LOG)
	@$(STAGE) --begin
	@$(STAGE) deps $(SUBMAKE) deps
	@scripts/prefetch.sh start $(PREFETCH_LOG)
	@$(STAGE) fmt $(SUBMAKE) fmt-check
	@$(STAGE) build-tests $(SUBMAKE) build-tests
	@$(STAGE) lock-audit $(SUBMAKE) lock-audit KILN_RUN=target/debug/kiln
	@$(STAGE) fixture $(SUBMAKE) fixture
	@$(STAGE) firstboot $(SUBMAKE) -j2 firstboot
	@$(STAGE) --start qemu-test $(SUBMAKE) qemu-test
	@$(BESIDE) $(STAGE) unit $(SUBMAKE) unit || $(STOP_BOOTS)
	@$(BESIDE) $(STAGE) lint $(SUBMAKE) clippy doc || $(STOP_BOOTS)
	@$(BESIDE) $(STAGE) size-check $(SUBMAKE) size-check || $(STOP_BOOTS)
	@$(BESIDE) $(STAGE) binary-gate $(SUBMAKE) binary-gate || $(STOP_BOOTS)
	@$(BESIDE) $(STAGE) test-windows $(SUBMAKE) test-windows || $(STOP_BOOTS)
	@$(STAGE) --join qemu-test
	@$(STAGE) --table
	@scripts/prefetch.sh report $(PREFETCH_LOG)
	@scripts/opted-out.sh $(OPT_OUT_LOG)

opt-out-reset:
	@mkdir -p target && rm -f $(OPT_OUT_LOG)

check: lint lock-audit unit size-check binary-gate test-windows

# How lock-audit runs kiln: alone it builds it; `make test` passes the kiln its build-tests
# stage made (KILN_RUN=target/debug/kiln), so the dev build is not paid twice.
KILN_RUN ?= $(CARGO) run --locked -q -p kiln --

lock-audit: ## the committed lock against images/advisories.toml: fails on any unwaived advisory
	$(KILN_RUN) lock audit images/artifacts.lock --advisories images/advisories.toml

lint: fmt-check clippy doc ## rustfmt, clippy -D warnings, rustdoc -D warnings

fmt: ## format the code
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all --check

clippy:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --locked

# Every dev/test build of `make test` selects the same packages and targets (filters pick the
# tests), so cargo unifies the dependencies' features once and compiles each crate once:
# `cargo run -p kiln`, `nextest -p kiln` and `build -p kiln -p cri-smoke` each unified
# differently (serde_core, hyper, idna, …) and rebuilt kiln's whole dependency tree.
NEXTEST_ARGS := --workspace --all-targets --locked
NOT_BOOT := -E 'not package(kiln-qemu-tests)'

build-tests: ## compile every test suite, target/debug/kiln and the other binaries, running none
	$(CARGO) nextest run $(NEXTEST_ARGS) --no-run
	$(CARGO) build $(NEXTEST_ARGS)  # target/debug/cri-smoke: the only binary nextest left out

# The offline fixture mirror (scripts/fixture-mirror.sh), made once and shared: `make unit`
# names it to the tests in KILN_FIXTURE_MIRROR (each copies it) and qemu-test boots from it.
# qemu-tests/assets/fixture.sh remakes it only when its inputs changed.
fixture: build-tests ## the fixture mirror the tests share -> target/fixture-mirror
	KILN_BIN=$(CURDIR)/target/debug/kiln KILN_STANDINS_AMD64=$(CURDIR)/target/debug \
	  qemu-tests/assets/fixture.sh $(FIXTURE_MIRROR)

unit: fixture ## the test suites (nextest) and doctests; the boot tests run in qemu-test
	@if ! scripts/sysupdate-tools.sh target/sysupdate >/dev/null; then \
	  case ",$${KILN_TEST_OPT_OUT:-}," in *,sysupdate,*) \
	    echo "make unit: no systemd-sysupdate; KILN_TEST_OPT_OUT=sysupdate, so bake_sysupdate_real records it" >&2;; \
	  *) echo "make unit: scripts/sysupdate-tools.sh failed: bake_sysupdate_real needs systemd-sysupdate (set KILN_TEST_OPT_OUT=sysupdate to skip it knowingly)" >&2; exit 1;; esac; \
	fi
	@if ! scripts/repart-257.sh target/repart-257 >/dev/null; then \
	  echo "make unit: scripts/repart-257.sh failed: bake::ddi compares kiln's signed DDI with trixie's systemd-repart 257" >&2; exit 1; \
	fi
	@if ! scripts/attest-tools.sh target/attest-tools >/dev/null; then \
	  case ",$${KILN_TEST_OPT_OUT:-}," in *,cosign,*) \
	    echo "make unit: no cosign/oras; KILN_TEST_OPT_OUT=cosign, so bake_provenance and layer_publish record it" >&2;; \
	  *) echo "make unit: scripts/attest-tools.sh failed: bake_provenance and layer_publish verify with the real cosign, oras and in-toto-attestation (set KILN_TEST_OPT_OUT=cosign to skip it knowingly)" >&2; exit 1;; esac; \
	fi
	KILN_FIXTURE_MIRROR=$(CURDIR)/$(FIXTURE_MIRROR) $(CARGO) nextest run $(NEXTEST_ARGS) $(NOT_BOOT) --no-fail-fast
	$(CARGO) test --workspace --doc --locked

size-check: firstboot windows ## fail if kiln-firstboot (Linux, Windows) is over its size budget
	scripts/check-size.sh $(FIRSTBOOT_BIN) $(FIRSTBOOT_BUDGET_KIB)
	scripts/check-size.sh $(FIRSTBOOT_ARM64_BIN) $(FIRSTBOOT_BUDGET_KIB)
	scripts/check-size.sh $(FIRSTBOOT_EXE) $(FIRSTBOOT_EXE_BUDGET_KIB)

binary-gate: firstboot windows build-tests ## kiln's own goblin gate on the shipped firstboot binaries
	scripts/binary-gate.sh target/debug/kiln $(FIRSTBOOT_BIN) $(FIRSTBOOT_EXE) $(FIRSTBOOT_ARM64_BIN)
	KILN_FIRSTBOOT_EXE=$(CURDIR)/$(FIRSTBOOT_EXE) \
	  $(CARGO) nextest run $(NEXTEST_ARGS) -E 'binary_id(kiln::it) & test(/^windows_layer::/)'

# Not part of `make test` or CI: two release builds with std rebuilt take a while.
dist: ## release archives: static kiln (amd64, arm64) + kiln-firstboot, man pages, completions, SHA256SUMS -> target/dist/ (docs/building.md)
	scripts/build-dist.sh

windows: ## build kiln-firstboot.exe for x86_64-pc-windows-gnu (docs/windows.md)
	scripts/build-windows.sh $(FIRSTBOOT_EXE)

test-windows: ## kiln-firstboot's test suite built for Windows, run under Wine
	scripts/test-windows.sh

bench: deps build ## benchmarks side by side with their baselines (docs/benchmarks.md)
	bench/run.sh

demo: deps ## kiln's main job on the embedded offline default
	scripts/demo.sh

cli-docs: ## regenerate docs/cli.md's reference section from kiln's --help after an intended change
	KILN_BLESS=1 $(CARGO) test -p kiln --test it cli_reference::cli_md_holds_every_commands_help

render-examples: ## regenerate the golden user data in docs/examples/render/ after an intended change
	KILN_BLESS=1 $(CARGO) test -p kiln --test it render_roundtrip::docs_examples_are_current

# The boot tests' guest assets live in a cache outside the repo, keyed by version
# (docs/boot-tests.md); qemu-test exports their paths so each test skips the lookup.
QEMU_ASSETS := qemu-tests/assets/assets.sh

qemu-assets: deps-qemu ## build (once) and cache the boot tests' kernels, initramfs and Debian bases (amd64, arm64)
	$(QEMU_ASSETS) all arm64

qemu-test: deps-qemu firstboot fixture ## boot tests: QEMU boots what kiln baked (docs/boot-tests.md)
	$(CARGO) build $(NEXTEST_ARGS)  # target/debug/cri-smoke (build-tests made it in make test)
	scripts/build-cri-smoke-arm64.sh target/cri-smoke/arm64/cri-smoke
	KILN_STANDINS_AMD64=$(CURDIR)/target/debug qemu-tests/assets/fixture.sh $(FIXTURE_MIRROR)
	assets=$$($(QEMU_ASSETS) all arm64); set -a; eval "$$assets"; set +a; \
	  KILN_FIXTURE_MIRROR=$(CURDIR)/$(FIXTURE_MIRROR) \
	  $(CARGO) nextest run $(NEXTEST_ARGS) -E 'package(kiln-qemu-tests)' --no-fail-fast

fuzz: ## run each fuzz target for a short while (cargo-fuzz, nightly)
	scripts/fuzz.sh

clean: ## remove build outputs
	$(CARGO) clean
	rm -rf target/firstboot

golden: ## regenerate the bake golden listings (builder/tests/golden/) from the real tools
	KILN_UPDATE_GOLDEN=1 $(CARGO) test -p kiln --test it bake_golden::
