# Switchyard. `make run` and `make test` are the two commands; see README.md.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
export GOTOOLCHAIN := local

CARGO ?= cargo
DEV := target/debug/switchyard-dev
# The control-plane binaries, built from Go modules and cached outside the repo.
TESTENV_BIN = $(shell scripts/testenv.sh bin-dir)

.PHONY: help deps run test test-long soak e2e-specs lint deny testenv testenv-test build cluster-up cluster-down bench dev-tool bench-queue bench-elector bench-watcher bench-e2e bench-gc bench-capacity bench-batch bench-stateful bench-network bench-sdk images test-images package-sdk

help:
	@echo "make run           start a local control plane and every service against it"
	@echo "make test          lint (fmt, clippy, cargo deny) and every test, against the real control plane;"
	@echo "                   RECORD=docs/testing.md writes each test binary's time there"
	@echo "make soak          23 minutes of rollouts under faults, then 5 under kube-controller-manager (needs root)"
	@echo "make test-long     the HA watchers test on 200 Deployments (make test runs 20)"
	@echo "make e2e-specs     Kubernetes' own e2e specs under kube-controller-manager and under Switchyard, side by side;"
	@echo "                   SWITCHYARD_E2E_FOCUS picks the specs (default: Job, CronJob, TTL-after-finished)"
	@echo "make images        OCI image archives of the services and the plugin, from the release build,"
	@echo "                   in target/images with their SBOMs and the release overlay (docs/deploy.md)"
	@echo "make test-images   make images, then test the archives: a registry, each entrypoint, an upgrade"
	@echo "make package-sdk   cargo package the SDK (switchyard-sdk) and the crates it is built from, each verified"
	@echo "make cluster-up    start a control plane in the background and print its kubeconfig"
	@echo "make cluster-down  stop it"
	@echo "make testenv       build the control-plane binaries (cached; also done by the above)"
	@echo "make deps          install the distribution packages the tests need (prometheus, chromium; apt-get)"
	@echo "make bench         run every benchmark; make bench-<area> one area (queue, elector, watcher, e2e, gc, capacity, batch, stateful, network, sdk);"
	@echo "                   each run's figures are appended to docs/bench-results.tsv and the headline table regenerated"

testenv:
	@scripts/testenv.sh build >/dev/null

# What the tests use beyond `make run`'s control plane: the OpenTelemetry Collector.
testenv-test: testenv
	@scripts/testenv.sh otelcol >/dev/null

deps:
	scripts/install-deps.sh

build:
	$(CARGO) build --locked --workspace --bins

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings

# The dependency graph against deny.toml: licenses, banned crates, sources; and the RustSec
# advisories wherever their database (a git repository on GitHub) can be fetched.
ADVISORY_DB := https://github.com/RustSec/advisory-db
deny:
	@command -v cargo-deny >/dev/null || { echo "cargo-deny is missing: scripts/install-deps.sh installs it" >&2; exit 1; }
	$(CARGO) deny --locked --log-level error check licenses bans sources
	@if timeout 15 git ls-remote --exit-code $(ADVISORY_DB) HEAD >/dev/null 2>&1; then \
		$(CARGO) deny --locked --log-level error check advisories; \
	else \
		echo "cargo deny: advisories not checked: $(ADVISORY_DB) cannot be reached from this machine"; \
	fi

test: lint deny testenv-test
	@# The integration tests run the workspace's binaries (services, tools, examples); cargo test
	@# builds a binary beside the tests only for its own package's tests, so build them all first.
	$(CARGO) build --locked --workspace --bins
	@# What `cargo test --workspace` runs, with several test binaries at a time (docs/testing.md).
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) CARGO=$(CARGO) $(DEV) test --seed docs/testing.md $(if $(RECORD),--record $(RECORD))
	@# The smoke run uses its own control plane, never the cluster KUBECONFIG may name.
	env -u KUBECONFIG SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) run --exit-when-ready
	scripts/check-no-orphans.sh

# The images (docs/deploy.md, "Images"): the release build, then switchyard-dev assembles one
# OCI archive per service and one for the plugin with crane, on a base of Debian packages.
RELEASE_PACKAGES := -p switchyard-watcher -p switchyard-queue -p switchyard-reconciler -p switchyard-elector -p kubectl-switchyard
images: testenv dev-tool
	$(CARGO) build --locked --release $(RELEASE_PACKAGES) --bins
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) images

# The SDK and the crates it is built from, packaged as crates.io would take them, each one
# verified by building it from its .crate against the others (docs/sdk.md). The list is the
# SDK's path dependencies, followed through; tests/boundaries.rs checks it is whole.
SDK_PACKAGES := switchyard-sdk switchyard-proto switchyard-k8s switchyard-runtime switchyard-shards switchyard-queue-client switchyard-reconciler-core switchyard-work switchyard-ownership switchyard-selector
package-sdk:
	@# cargo unpacks the packages it verifies against into its registry's sources by name and
	@# version, and builds them as packages from a registry, which never change: one changed
	@# since under the same version would be verified against the earlier build. So each run
	@# drops our unpacked packages and verifies in a target directory of its own, from
	@# scratch (about 5 minutes here); the .crate files land in target/package-sdk/package.
	rm -rf target/package-sdk $(foreach p,$(SDK_PACKAGES),$${CARGO_HOME:-$$HOME/.cargo}/registry/src/*/$(p)-[0-9]*)
	CARGO_TARGET_DIR=target/package-sdk $(CARGO) package --locked $(addprefix -p ,$(SDK_PACKAGES))

# The images' tests (tests/images.rs): each archive loads into a registry and its entrypoint
# runs from its root filesystem; the release overlay pins them; an upgrade moves every
# workload to the next digests. `.ci/run` runs it after `make test`.
test-images: images
	@scripts/testenv.sh krew >/dev/null
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(CARGO) test --locked -p switchyard-tests --test images -- --include-ignored

# The soak (tests/soak.rs) injects every fault once inside `make test`; here it runs rounds of
# faults for 23 minutes under Switchyard, then 5 minutes of the same workload under
# kube-controller-manager for its figures beside ours.
SOAK_SECONDS ?= 1380
SOAK_PEER_SECONDS ?= 300

soak: testenv
	$(CARGO) build --locked --workspace --bins
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) SWITCHYARD_SOAK_SECONDS=$(SOAK_SECONDS) \
		$(CARGO) test --locked -p switchyard-tests --test soak -- --nocapture
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) SWITCHYARD_SOAK_SECONDS=$(SOAK_PEER_SECONDS) \
		SWITCHYARD_SOAK_PEER=kube-controller-manager \
		$(CARGO) test --locked -p switchyard-tests --test soak -- --nocapture

# The HA watchers test (tests/ha_watchers.rs) on 200 Deployments instead of `make test`'s 20.
HA_DEPLOYMENTS ?= 200

test-long: testenv
	$(CARGO) build --locked --workspace --bins
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) SWITCHYARD_HA_DEPLOYMENTS=$(HA_DEPLOYMENTS) \
		$(CARGO) test --locked -p switchyard-tests --test ha_watchers -- --nocapture

# RUN_ARGS: more `switchyard-dev run` flags, for example a reconciler of your own beside the
# built-in ones (docs/sdk.md): --reconciler target/debug/<binary> --crd <file> [--grant v1/Kind]
RUN_ARGS ?=

# Kubernetes' own e2e specs (e2e.test from the control plane's module) under
# kube-controller-manager's controllers and under Switchyard's, each on a control plane of its
# own, at the same time; fails if a spec passes under the first and not the second
# (tests/e2e_specs.rs, docs/testing.md).
e2e-specs: testenv build
	@scripts/testenv.sh e2e >/dev/null
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(CARGO) test --locked -p switchyard-tests --test e2e_specs -- --ignored --nocapture

run: testenv build
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) run $(RUN_ARGS)

cluster-up: testenv
	$(CARGO) build --locked -p switchyard-testenv --bin switchyard-dev
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) up --detach

cluster-down:
	$(CARGO) build --locked -p switchyard-testenv --bin switchyard-dev
	$(DEV) down

# Each benchmark prints `bench <area>.<figure> <value> <unit>` lines; results are recorded
# in docs/benchmarks.md.
bench: bench-queue bench-elector bench-watcher bench-e2e bench-gc bench-capacity bench-batch bench-stateful bench-network bench-sdk

# Every bench-<area> runs through `switchyard-dev bench`, which appends the figures printed to
# docs/bench-results.tsv and regenerates docs/benchmarks.md's headline table from it.
dev-tool:
	$(CARGO) build --locked -p switchyard-testenv --bin switchyard-dev

bench-queue: dev-tool
	$(DEV) bench queue -- $(CARGO) bench --locked -p switchyard-queue --bench queue

bench-elector: testenv dev-tool
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) bench elector -- $(CARGO) bench --locked -p switchyard-queue --bench elector

bench-watcher: testenv dev-tool
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) bench watcher -- $(CARGO) bench --locked -p switchyard-watcher --bench watcher

# Deployments converged under kube-controller-manager and under Switchyard, SWITCHYARD_BENCH_ROUNDS
# rounds (2 by default) with the order reversed every other round (about 15 minutes a round).
bench-e2e: testenv dev-tool
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) bench e2e -- $(CARGO) bench --locked -p switchyard-reconciler --bench e2e

# The highest rate of Deployment changes kept within a queue-wait and a time-to-ready service
# level: kube-controller-manager, and Switchyard with 1 and 4 reconcilers, every sync slowed
# alike; then kube-controller-manager and one reconciler unslowed. SWITCHYARD_BENCH_ROUNDS rounds
# (2 by default), the order reversed every other round, about 50 minutes a round;
# SWITCHYARD_BENCH_RUNS=kcm,sy1_concurrency10 runs only the named subjects.
bench-capacity: testenv dev-tool
	@scripts/testenv.sh kcm-slowed >/dev/null
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) bench capacity -- $(CARGO) bench --locked -p switchyard-reconciler --bench capacity

# Jobs run to completion and CronJobs' Jobs created on time, under kube-controller-manager and
# Switchyard with 1 and 4 reconcilers (services/reconciler/benches/batch.rs); SWITCHYARD_BENCH_ROUNDS
# rounds (2 by default), the order reversed every other round.
bench-batch: testenv dev-tool
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) bench batch -- $(CARGO) bench --locked -p switchyard-reconciler --bench batch

# StatefulSets of OrderedReady Pods made ready (services/reconciler/benches/stateful.rs, figures
# under `statefulset.`) and DaemonSets rolled out on 1,000 Nodes and following Node churn
# (benches/daemonset.rs, under `daemonset.`), under kube-controller-manager and Switchyard.
bench-stateful: testenv dev-tool
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) bench statefulset -- $(CARGO) bench --locked -p switchyard-reconciler --bench stateful
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) bench daemonset -- $(CARGO) bench --locked -p switchyard-reconciler --bench daemonset

# The EndpointSlice controller beside kube-controller-manager's: readiness churn over 200
# Services and one Service of 5,000 Pods (SWITCHYARD_BENCH_ROUNDS rounds, the order reversed
# every other round).
bench-network: testenv dev-tool
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) bench network -- $(CARGO) bench --locked -p switchyard-reconciler --bench network

# The garbage collector beside kube-controller-manager's: a 10,000-Pod cascade (SWITCHYARD_BENCH_ROUNDS
# rounds, the order reversed every other round) and memory per object (the watcher runs as a
# process of its own, built first).
# What a predicate the watcher cannot run costs in the reconciler (Builder::when): per key
# held back, beside a key let through (SWITCHYARD_BENCH_ROUNDS rounds, about a minute).
bench-sdk: testenv dev-tool
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) bench sdk -- $(CARGO) bench --locked -p switchyard-reconciler --bench sdk

bench-gc: testenv dev-tool
	$(CARGO) build --locked --release -p switchyard-watcher --bins
	SWITCHYARD_TESTENV_BIN=$(TESTENV_BIN) $(DEV) bench gc -- $(CARGO) bench --locked -p switchyard-reconciler --bench gc
