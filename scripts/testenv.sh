#!/usr/bin/env bash
# Builds the real control plane Switchyard tests against, from published Go modules:
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (k8s.io/kubernetes),
# etcd (go.etcd.io/etcd/server/v3), kwok (sigs.k8s.io/kwok), kustomize, crane
# (github.com/google/go-containerregistry, for `make images`), an OpenTelemetry
# Collector (OTLP receiver, file exporter) assembled by the collector builder, and the CRDs
# of cert-manager (github.com/cert-manager/cert-manager, deploy/crds), of its approver-policy
# (github.com/cert-manager/approver-policy, deploy/crds) and of the Prometheus Operator
# (ServiceMonitor and PrometheusRule, from github.com/prometheus-operator/prometheus-operator,
# example/prometheus-operator-crd), which the deploy tests install to check
# components/cert-manager, components/approver-policy and components/monitoring against the
# real schemas.
#
# A cold build takes minutes per product: each prints when it starts, what it is doing every
# $SWITCHYARD_TESTENV_PROGRESS_SECONDS (30) while it runs, and how long it took, on stderr.
#
# Every product is cached under $SWITCHYARD_CACHE (default ~/.cache/switchyard/testenv),
# keyed by its version and the Go version, and built only when its binaries are missing.
#
#   scripts/testenv.sh build     build what is missing, then print the bin directory
#   scripts/testenv.sh otelcol   also build the OpenTelemetry Collector (only tests use it:
#                                `make test` builds it, `make run` does not)
#   scripts/testenv.sh kcm-slowed  also build kube-controller-manager-slowed (for
#                                  `make bench-capacity`; see build_kcm_slowed)
#   scripts/testenv.sh e2e       also build Kubernetes' e2e.test and ginkgo (for
#                                `make e2e-specs`; see build_e2e)
#   scripts/testenv.sh krew      also build krew and validate-krew-manifest (for
#                                `make test-images`)
#   scripts/testenv.sh bin-dir   print the bin directory (builds nothing)
#   scripts/testenv.sh versions  print the pinned versions
set -euo pipefail

K8S_VERSION=1.35.4
ETCD_VERSION=3.6.16
KWOK_VERSION=0.8.0
KUSTOMIZE_VERSION=5.8.2
# go-containerregistry's crane: `make images` assembles the OCI images with it and the image
# tests serve a registry with it (`crane registry serve`).
CRANE_VERSION=0.22.1
# krew and its manifest validator: `make test-images` installs the plugin with them from the
# archive and manifest `make images` writes.
KREW_VERSION=0.4.3
# The collector builder and the components it assembles are released together (v0.162.0
# goes with core v1.68.0; all declare `go 1.26.0`). Not v0.163/v0.164: their OTLP receiver
# imports go.opentelemetry.io/collector/internal/statusutil, which the Go module proxy
# refuses to serve (403, "This module version is not available").
OTELCOL_VERSION=0.162.0
OTELCOL_CORE_VERSION=1.68.0
# kwok v0.8.0 and kustomize v5.8.2 declare `go 1.26.0`; the Kubernetes 1.35 and etcd 3.6
# modules need 1.25. (kustomize v5.8.3 needs Go 1.27.)
GO_MIN_MINOR=26
# Only the CRDs: the controller's command (module .../cert-manager/cmd/controller) is not
# served by the Go module proxy, so cert-manager itself does not run in the tests.
CERT_MANAGER_VERSION=1.21.2
# approver-policy's CRD (CertificateRequestPolicy), for the schema of components/approver-policy.
APPROVER_POLICY_VERSION=0.28.0
# Only the CRDs too: the ServiceMonitor and PrometheusRule of components/monitoring.
PROMETHEUS_OPERATOR_VERSION=0.85.0

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
CACHE=${SWITCHYARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard/testenv}

die() { echo "testenv: $*" >&2; exit 1; }

check_go() {
  command -v go >/dev/null 2>&1 ||
    die "go not found: Go 1.${GO_MIN_MINOR} or newer is needed to build the control plane (kwok v${KWOK_VERSION} requires it)"
  local v; v=$(go env GOVERSION)            # e.g. go1.26.8
  local minor; minor=$(echo "$v" | sed -n 's/^go1\.\([0-9]*\).*/\1/p')
  [ -n "$minor" ] && [ "$minor" -ge "$GO_MIN_MINOR" ] ||
    die "found $v, but Go 1.${GO_MIN_MINOR} or newer is needed to build the control plane (kwok v${KWOK_VERSION} requires it)"
  GO_VERSION=$v
}

bin_dir() { echo "$CACHE/bin/k8s-v${K8S_VERSION}_etcd-v${ETCD_VERSION}_kwok-v${KWOK_VERSION}_kustomize-v${KUSTOMIZE_VERSION}_crane-v${CRANE_VERSION}_otelcol-v${OTELCOL_VERSION}_cert-manager-v${CERT_MANAGER_VERSION}_approver-policy-v${APPROVER_POLICY_VERSION}_prometheus-operator-v${PROMETHEUS_OPERATOR_VERSION}_${GO_VERSION}"; }
product_dir() { echo "$CACHE/$1-v$2-${GO_VERSION}"; }

# run_logged <product> <log> <cmd...>: run a build step, naming the log file if it fails.
# Each step is written to the log first, as `+ <command>`: the progress lines name it.
run_logged() {
  local product=$1 log=$2; shift 2
  echo "+ $*" >>"$log"
  if ! "$@" >>"$log" 2>&1; then
    echo "testenv: building $product failed; see $log" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
}

# How often a running build says where it is, in seconds.
PROGRESS_EVERY=${SWITCHYARD_TESTENV_PROGRESS_SECONDS:-30}
PROGRESS_PID=

duration() { local s=$1; if [ "$s" -ge 60 ]; then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi; }

# progress_start <what> <log>: until progress_stop, print every PROGRESS_EVERY seconds how
# long <what> has been building, its current step (the last `+ ` line of its log) and the
# modules downloaded so far, so a cold build of many minutes is never silent for long.
progress_start() {
  local what=$1 log=$2 parent=$$ started
  started=$(date +%s)
  (
    sleeper=
    trap '[ -z "$sleeper" ] || kill "$sleeper" 2>/dev/null; exit 0' TERM
    while :; do
      sleep "$PROGRESS_EVERY" & sleeper=$!
      wait "$sleeper"
      kill -0 "$parent" 2>/dev/null || exit 0
      step=$(awk '/^\+ / { if ($3 == "build") s = $2 " " $3; else s = $2 " " $3 " " $4 } END { print s }' "$log")
      downloaded=$(grep -c '^go: downloading' "$log" || true)
      echo "testenv: building $what: $(duration $(($(date +%s) - started))) so far; at: ${step:-starting}; $downloaded modules downloaded" >&2
    done
  ) &
  PROGRESS_PID=$!
}

progress_stop() {
  [ -n "$PROGRESS_PID" ] || return 0
  kill "$PROGRESS_PID" 2>/dev/null || true
  wait "$PROGRESS_PID" 2>/dev/null || true
  PROGRESS_PID=
}
trap progress_stop EXIT

have_all() { local d=$1; shift; for b in "$@"; do [ -x "$d/bin/$b" ] || return 1; done; }

build_kubernetes() {
  local d; d=$(product_dir kubernetes "$K8S_VERSION")
  have_all "$d" kube-apiserver kube-controller-manager kube-scheduler kubectl && return 0
  local log="$d/build.log" src="$d/src"
  mkdir -p "$src" "$d/bin"; : >"$log"
  echo "testenv: building Kubernetes v$K8S_VERSION (cold: about 25 minutes on 2 cores; log: $log)" >&2
  local start=$SECONDS
  progress_start "Kubernetes v$K8S_VERSION" "$log"
  (
    cd "$src"
    rm -f go.mod go.sum
    run_logged kubernetes "$log" go mod init switchyard.invalid/testenv/kubernetes
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
    [ -f "$gomod" ] || die "could not download k8s.io/kubernetes@v$K8S_VERSION (see the Go module proxy settings)"
    run_logged kubernetes "$log" go mod edit -go="$(sed -n 's/^go //p' "$gomod")"
    local godebug; godebug=$(sed -n 's/^godebug //p' "$gomod")
    [ -z "$godebug" ] || run_logged kubernetes "$log" go mod edit -godebug="$godebug"
    # Go ignores a dependency's replace lines, so map every staging module k/k replaces
    # (derived from this version's own go.mod) to its published v0.x.y release.
    local staging="0.${K8S_VERSION#1.}" m
    for m in $(sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*|\1|p' "$gomod"); do
      go mod edit -replace="$m=$m@v$staging"
    done
    run_logged kubernetes "$log" go get "k8s.io/kubernetes@v$K8S_VERSION"
    run_logged kubernetes "$log" go build -trimpath -tags=selinux,notest -ldflags "$(k8s_ldflags)" -o "$d/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  )
  progress_stop
  echo "testenv: built Kubernetes v$K8S_VERSION in $(duration $((SECONDS - start)))" >&2
}

# The version Kubernetes' own release builds stamp into its binaries.
k8s_ldflags() {
  local ldflags="-s -w" p minor; minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags="$ldflags -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ldflags="$ldflags -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$ldflags"
}

# kube-controller-manager-slowed: kube-controller-manager built from the same module, with
# every Deployment and ReplicaSet sync first sleeping $SWITCHYARD_SIMULATED_LATENCY (a Go
# duration; no sleep when unset), as a Switchyard reconcile does under its
# `--simulated-latency`. `make bench-capacity` compares the two at the same per-sync latency.
# The module is copied (hard links where the file system allows) and two files are changed:
# one line at the top of each sync function, and one file added per package. Go refuses an
# overlay of files in its module cache, so the build uses a replace of the copy instead.
# Not in `build`: only the benchmark needs it.
build_kcm_slowed() {
  local d; d=$(product_dir kubernetes "$K8S_VERSION")
  have_all "$d" kube-controller-manager-slowed && return 0
  local log="$d/build-slowed.log" src="$d/src" copy="$d/kubernetes-slowed" build="$d/src-slowed"
  : >"$log"
  echo "testenv: building kube-controller-manager-slowed (a few minutes; log: $log)" >&2
  local start=$SECONDS
  progress_start kube-controller-manager-slowed "$log"
  (
    cd "$src"
    local module; module=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)
    [ -d "$module" ] || die "k8s.io/kubernetes@v$K8S_VERSION is not in the module cache; run 'scripts/testenv.sh build'"
    rm -rf "$copy" "$build"
    cp -al "$module" "$copy" 2>/dev/null || cp -a "$module" "$copy"
    local pkg file signature
    while IFS='|' read -r pkg file signature; do
      local dir="$copy/pkg/controller/$pkg"
      [ "$(grep -cxF "$signature" "$dir/$file")" = 1 ] ||
        die "$module/pkg/controller/$pkg/$file no longer has one '$signature' to slow"
      chmod u+w "$dir"
      awk -v sig="$signature" '{ print } $0 == sig { print "\tswitchyardSimulatedLatency()" }' \
        "$dir/$file" >"$dir/$file.new"
      rm -f "$dir/$file"; mv "$dir/$file.new" "$dir/$file"
      cat >"$dir/switchyard_simulated_latency.go" <<GO
package $pkg

import (
	"os"
	"time"
)

// The sleep before each sync, from SWITCHYARD_SIMULATED_LATENCY (scripts/testenv.sh).
var switchyardLatency = func() time.Duration {
	value := os.Getenv("SWITCHYARD_SIMULATED_LATENCY")
	if value == "" {
		return 0
	}
	latency, err := time.ParseDuration(value)
	if err != nil {
		panic("SWITCHYARD_SIMULATED_LATENCY: " + err.Error())
	}
	return latency
}()

func switchyardSimulatedLatency() { time.Sleep(switchyardLatency) }
GO
    done <<SYNCS
replicaset|replica_set.go|func (rsc *ReplicaSetController) syncReplicaSet(ctx context.Context, key string) error {
deployment|deployment_controller.go|func (dc *DeploymentController) syncDeployment(ctx context.Context, key string) error {
SYNCS
    mkdir -p "$build"; cp go.mod go.sum "$build/"
    cd "$build"
    run_logged kube-controller-manager-slowed "$log" go mod edit -replace="k8s.io/kubernetes=$copy"
    run_logged kube-controller-manager-slowed "$log" go build -trimpath -tags=selinux,notest \
      -ldflags "$(k8s_ldflags)" -o "$d/bin/kube-controller-manager-slowed" k8s.io/kubernetes/cmd/kube-controller-manager
  )
  progress_stop
  echo "testenv: built kube-controller-manager-slowed in $(duration $((SECONDS - start)))" >&2
}

# e2e.test and ginkgo: Kubernetes' own end-to-end specs, built from the same module as the
# control plane (its test/e2e package, `go test -c`), and the ginkgo CLI that runs them in
# parallel, at the version k8s.io/kubernetes requires. Not in `build`: only `make e2e-specs`
# needs them (a few minutes when the Kubernetes build is cached, since most packages are
# shared with it).
build_e2e() {
  local d; d=$(product_dir kubernetes "$K8S_VERSION")
  have_all "$d" e2e.test ginkgo && return 0
  [ -f "$d/src/go.mod" ] || die "the Kubernetes build is missing; run 'scripts/testenv.sh build' first"
  local log="$d/build-e2e.log"
  : >"$log"
  echo "testenv: building Kubernetes' e2e.test and ginkgo (a few minutes; log: $log)" >&2
  local start=$SECONDS
  progress_start "e2e.test" "$log"
  (
    cd "$d/src"
    run_logged e2e "$log" go test -c -trimpath -tags=selinux,notest -ldflags "$(k8s_ldflags)" \
      -o "$d/bin/e2e.test" k8s.io/kubernetes/test/e2e
    run_logged e2e "$log" go build -trimpath -o "$d/bin/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
  )
  progress_stop
  echo "testenv: built e2e.test and ginkgo in $(duration $((SECONDS - start)))" >&2
}

build_etcd() {
  local d; d=$(product_dir etcd "$ETCD_VERSION")
  have_all "$d" etcd etcdctl && return 0
  local log="$d/build.log" src="$d/src"
  mkdir -p "$src" "$d/bin"; : >"$log"
  echo "testenv: building etcd v$ETCD_VERSION (log: $log)" >&2
  local start=$SECONDS
  progress_start "etcd v$ETCD_VERSION" "$log"
  (
    cd "$src"
    rm -f go.mod go.sum
    run_logged etcd "$log" go mod init switchyard.invalid/testenv/etcd
    # `go install go.etcd.io/etcd/server/v3@...` fails on the module's replace lines; its
    # require block already pins the sibling modules, so a wrapper module builds it.
    run_logged etcd "$log" go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" "go.etcd.io/etcd/etcdctl/v3@v$ETCD_VERSION"
    run_logged etcd "$log" go build -trimpath -ldflags "-s -w" -o "$d/bin/etcd" go.etcd.io/etcd/server/v3
    run_logged etcd "$log" go build -trimpath -ldflags "-s -w" -o "$d/bin/etcdctl" go.etcd.io/etcd/etcdctl/v3
  )
  progress_stop
  echo "testenv: built etcd v$ETCD_VERSION in $(duration $((SECONDS - start)))" >&2
}

build_go_install() { # <product> <version> <binary> <package@version>
  local d; d=$(product_dir "$1" "$2")
  have_all "$d" "$3" && return 0
  local log="$d/build.log"
  mkdir -p "$d/bin"; : >"$log"
  echo "testenv: building $1 v$2 (log: $log)" >&2
  local start=$SECONDS
  progress_start "$1 v$2" "$log"
  GOBIN="$d/bin" run_logged "$1" "$log" go install -trimpath -ldflags "-s -w" "$4"
  progress_stop
  echo "testenv: built $1 v$2 in $(duration $((SECONDS - start)))" >&2
}

# The collector is assembled from its Go modules by the collector builder: the OTLP receiver
# (the services export to it) and the file exporter (tests read what it wrote).
build_otelcol() {
  local d; d=$(product_dir otelcol "$OTELCOL_VERSION")
  have_all "$d" otelcol-switchyard && return 0
  local log="$d/build.log" src="$d/src"
  mkdir -p "$src" "$d/bin" "$d/builder"; : >"$log"
  echo "testenv: building the OpenTelemetry Collector v$OTELCOL_VERSION (log: $log)" >&2
  local start=$SECONDS
  progress_start "the OpenTelemetry Collector v$OTELCOL_VERSION" "$log"
  GOBIN="$d/builder" run_logged otelcol "$log" go install -trimpath "go.opentelemetry.io/collector/cmd/builder@v$OTELCOL_VERSION"
  cat >"$d/manifest.yaml" <<MANIFEST
dist:
  name: otelcol-switchyard
  description: OpenTelemetry Collector for the Switchyard tests (OTLP in, file out)
  output_path: $src
  version: $OTELCOL_VERSION
receivers:
  - gomod: go.opentelemetry.io/collector/receiver/otlpreceiver v$OTELCOL_VERSION
exporters:
  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter v$OTELCOL_VERSION
providers:
  - gomod: go.opentelemetry.io/collector/confmap/provider/envprovider v$OTELCOL_CORE_VERSION
  - gomod: go.opentelemetry.io/collector/confmap/provider/fileprovider v$OTELCOL_CORE_VERSION
  - gomod: go.opentelemetry.io/collector/confmap/provider/yamlprovider v$OTELCOL_CORE_VERSION
MANIFEST
  # The builder's own `go mod tidy` also resolves the components' test imports, and the file
  # exporter's tests import an encoding extension the module proxy refuses to serve; so the
  # builder only writes the sources and `go build` (with -mod=mod) fetches what it imports.
  run_logged otelcol "$log" "$d/builder/builder" --config="$d/manifest.yaml" --skip-get-modules --skip-compilation
  (
    cd "$src"
    rm -f go.mod go.sum
    run_logged otelcol "$log" go mod init switchyard.invalid/testenv/otelcol
    run_logged otelcol "$log" go mod edit -go=1.26.0
    run_logged otelcol "$log" go get \
      "go.opentelemetry.io/collector/otelcol@v$OTELCOL_VERSION" \
      "go.opentelemetry.io/collector/receiver/otlpreceiver@v$OTELCOL_VERSION" \
      "github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter@v$OTELCOL_VERSION" \
      "go.opentelemetry.io/collector/confmap/provider/envprovider@v$OTELCOL_CORE_VERSION" \
      "go.opentelemetry.io/collector/confmap/provider/fileprovider@v$OTELCOL_CORE_VERSION" \
      "go.opentelemetry.io/collector/confmap/provider/yamlprovider@v$OTELCOL_CORE_VERSION"
    run_logged otelcol "$log" go build -trimpath -ldflags "-s -w" -o "$d/bin/otelcol-switchyard" .
  )
  progress_stop
  echo "testenv: built the OpenTelemetry Collector v$OTELCOL_VERSION in $(duration $((SECONDS - start)))" >&2
}

# cert-manager's CRDs as its module ships them: deploy/crds holds plain YAML (controller-gen's
# output, no Helm template lines), the same schemas the Helm chart renders from
# deploy/charts/cert-manager/templates/crd-*.yaml. Both are kept: crds.yaml is what the tests
# install, chart/ lets a test check that its schemas are the chart's.
fetch_cert_manager_crds() {
  local d; d=$(product_dir cert-manager "$CERT_MANAGER_VERSION")
  [ -s "$d/crds.yaml" ] && [ -d "$d/chart" ] && return 0
  local log="$d/build.log"
  mkdir -p "$d"; : >"$log"
  echo "testenv: fetching cert-manager v$CERT_MANAGER_VERSION CRDs (log: $log)" >&2
  local module
  module=$(cd "$d" && go mod download -json "github.com/cert-manager/cert-manager@v$CERT_MANAGER_VERSION" 2>>"$log" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$module/deploy/crds" ] || die "could not download github.com/cert-manager/cert-manager@v$CERT_MANAGER_VERSION (see $log and the Go module proxy settings)"
  rm -rf "$d/crds" "$d/chart"; mkdir -p "$d/crds" "$d/chart"
  cp "$module"/deploy/crds/*.yaml "$d/crds/"
  cp "$module"/deploy/charts/cert-manager/templates/crd-*.yaml "$d/chart/"
  chmod -R u+w "$d/crds" "$d/chart"
  local f
  for f in "$d"/crds/*.yaml; do
    sed -n '/^---$/!p' "$f" | { echo "---"; cat; }
  done >"$d/crds.yaml.tmp"
  mv "$d/crds.yaml.tmp" "$d/crds.yaml"
}

# approver-policy's CertificateRequestPolicy CRD, as its module ships it (deploy/crds).
fetch_approver_policy_crds() {
  local d; d=$(product_dir approver-policy "$APPROVER_POLICY_VERSION")
  [ -s "$d/crds.yaml" ] && return 0
  local log="$d/build.log"
  mkdir -p "$d"; : >"$log"
  echo "testenv: fetching approver-policy v$APPROVER_POLICY_VERSION CRDs (log: $log)" >&2
  local module
  module=$(cd "$d" && go mod download -json "github.com/cert-manager/approver-policy@v$APPROVER_POLICY_VERSION" 2>>"$log" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$module/deploy/crds" ] || die "could not download github.com/cert-manager/approver-policy@v$APPROVER_POLICY_VERSION (see $log and the Go module proxy settings)"
  local f
  for f in "$module"/deploy/crds/*.yaml; do
    sed -n '/^---$/!p' "$f" | { echo "---"; cat; }
  done >"$d/crds.yaml.tmp"
  mv "$d/crds.yaml.tmp" "$d/crds.yaml"
}

# The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, as its module ships them
# (example/prometheus-operator-crd: controller-gen's output, what its bundle.yaml and
# kube-prometheus-stack install), in one multi-document crds.yaml.
fetch_prometheus_operator_crds() {
  local d; d=$(product_dir prometheus-operator "$PROMETHEUS_OPERATOR_VERSION")
  [ -s "$d/crds.yaml" ] && return 0
  local log="$d/build.log"
  mkdir -p "$d"; : >"$log"
  echo "testenv: fetching Prometheus Operator v$PROMETHEUS_OPERATOR_VERSION CRDs (log: $log)" >&2
  local module
  module=$(cd "$d" && go mod download -json "github.com/prometheus-operator/prometheus-operator@v$PROMETHEUS_OPERATOR_VERSION" 2>>"$log" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  local crds=$module/example/prometheus-operator-crd
  [ -d "$crds" ] || die "could not download github.com/prometheus-operator/prometheus-operator@v$PROMETHEUS_OPERATOR_VERSION (see $log and the Go module proxy settings)"
  local kind
  for kind in servicemonitors prometheusrules; do
    sed -n '/^---$/!p' "$crds/monitoring.coreos.com_$kind.yaml" | { echo "---"; cat; }
  done >"$d/crds.yaml.tmp"
  mv "$d/crds.yaml.tmp" "$d/crds.yaml"
}

# A Pod annotated with this is never made Ready: kwok plays a kubelet that cannot pull its
# image (crates/testenv's KWOK_IMAGE_PULL_FAILS names the same key).
KWOK_IMAGE_PULL_FAILS=kwok.switchyard.dev/image-pull-fails

# The start of a Stage named $1 for Pods not being deleted; the caller adds its own
# matchExpressions after it.
kwok_pod_stage_start() {
  cat <<STAGE
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: $1
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
STAGE
}

# The Stage for those Pods: Pending with an ImagePullBackOff container, as a kubelet reports
# an image it cannot pull; once (it sets startTime, which its selector wants unset).
kwok_image_pull_stage() {
  kwok_pod_stage_start pod-image-pull-fails
  cat <<STAGE
    - key: '.metadata.annotations["$KWOK_IMAGE_PULL_FAILS"]'
      operator: 'Exists'
    - key: '.status.startTime'
      operator: 'DoesNotExist'
  next:
    statusTemplate: |
      {{ \$now := Now }}
      conditions:
      - lastTransitionTime: {{ \$now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ \$now | Quote }}
        reason: ContainersNotReady
        status: "False"
        type: Ready
      - lastTransitionTime: {{ \$now | Quote }}
        reason: ContainersNotReady
        status: "False"
        type: ContainersReady
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          waiting:
            reason: ImagePullBackOff
      {{ end }}
      {{ with NodeIPsWith .spec.nodeName }}
      hostIP: {{ index . 0 | Quote }}
      {{ end }}
      phase: Pending
      startTime: {{ \$now | Quote }}
STAGE
}

# What a Pod's containers ask for decides how the Pod ends, as a kubelet running them would
# (docs/testing.md, "Pod outcomes"). A container's script is its command and args joined
# with spaces; in it, `exit N` is its exit code (0 without one) and every `sleep S` adds S
# seconds to its running time. A container runs forever when its image is the pause image or
# its script says `sleep infinity`. A Pod ends when it is Running, none of its containers
# runs forever, and it is a Job's or one of its scripts says `exit` or `sleep`; then, after
# its longest container's running time (KWOK_SHORT_RUN when none sleeps):
#   - restartPolicy Never: phase Succeeded when every exit code is 0, Failed otherwise, each
#     container terminated with its code (reason Completed or Error);
#   - restartPolicy OnFailure: Succeeded when every exit code is 0; otherwise its containers
#     are restarted (restartCount + 1, lastState terminated with the code), again and again;
#   - restartPolicy Always: its containers are restarted after every exit.
# Bump KWOK_STAGES_REVISION (and crates/testenv's KWOK_STAGES_REVISION) when this changes.
KWOK_STAGES_REVISION="switchyard-stages: 2"
KWOK_SHORT_RUN=1s

# The jq definitions the selectors and delays share (kwok evaluates them with gojq).
KWOK_JQ_DEFS='def script: ((.command // []) + (.args // [])) | map(tostring) | join(" ");
def code: ([script | match("(^|[;&|(\\s])exit\\s+([0-9]+)") | .captures[1].string | tonumber] | first) // 0;
def seconds: [script | match("(^|[^A-Za-z0-9_./-])sleep\\s+([0-9]+(\\.[0-9]+)?)"; "g") | .captures[1].string | tonumber] | add // 0;
def forever: (.image // "" | test("(^|/)pause(:|@|$)")) or (script | test("(^|[;&|(\\s])sleep\\s+infinity"));
def ends: (.spec.containers | any(forever) | not) and ((.metadata.ownerReferences // [] | any(.kind == "Job")) or (.spec.containers | any(script | test("(^|[;&|(\\s])(exit|sleep)\\s"))));
def failing: .spec.containers | any(code != 0);'

# The template piece that gives a container's script, exit code in Go templates (sprig).
KWOK_TPL_CODE='{{ $script := join " " (concat (default list $item.command) (default list $item.args)) }}
      {{ $exit := regexFind "(^|[;&|(\\s])exit\\s+[0-9]+" $script }}
      {{ $code := regexFind "[0-9]+$" $exit | default "0" | atoi }}'

# The head of a Stage for Running Pods for which the jq expression $2 (over the Pod, with
# KWOK_JQ_DEFS) is true, applied after the Pod's longest container's running time.
kwok_running_pod_stage_head() {
  local defs; defs=$(printf '%s\n' "$KWOK_JQ_DEFS" | sed 's/^/          /')
  kwok_pod_stage_start "$1"
  cat <<STAGE
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - jq:
        key: |
$defs
          $2
        operator: 'In'
        values: ['true']
  delay:
    durationFrom:
      jq:
        expression: |
$defs
          ([.spec.containers[] | seconds] | max) as \$s | if \$s > 0 then "\\(\$s)s" else "$KWOK_SHORT_RUN" end
STAGE
}

kwok_pod_outcome_stages() {
  echo "# $KWOK_STAGES_REVISION"
  kwok_running_pod_stage_head pod-outcome \
    'ends and ((.spec.restartPolicy == "Never") or (.spec.restartPolicy == "OnFailure" and (failing | not)))'
  cat <<STAGE
  next:
    statusTemplate: |
      {{ \$now := Now }}
      {{ \$root := . }}
      {{ \$failed := false }}
      containerStatuses:
      {{ range \$index, \$item := .spec.containers }}
      $KWOK_TPL_CODE
      {{ if ne \$code 0 }}{{ \$failed = true }}{{ end }}
      {{ \$started := \$now }}
      {{ with \$root.status.containerStatuses }}{{ with index . \$index }}{{ with .state.running }}{{ \$started = .startedAt }}{{ end }}{{ end }}{{ end }}
      - image: {{ \$item.image | Quote }}
        name: {{ \$item.name | Quote }}
        ready: false
        restartCount: {{ with \$root.status.containerStatuses }}{{ with index . \$index }}{{ .restartCount | default 0 }}{{ end }}{{ else }}0{{ end }}
        started: false
        state:
          terminated:
            exitCode: {{ \$code }}
            finishedAt: {{ \$now | Quote }}
            reason: {{ if eq \$code 0 }}Completed{{ else }}Error{{ end }}
            startedAt: {{ \$started | Quote }}
      {{ end }}
      conditions:
      - lastTransitionTime: {{ \$now | Quote }}
        reason: {{ if \$failed }}PodFailed{{ else }}PodCompleted{{ end }}
        status: "False"
        type: Ready
      - lastTransitionTime: {{ \$now | Quote }}
        reason: {{ if \$failed }}PodFailed{{ else }}PodCompleted{{ end }}
        status: "False"
        type: ContainersReady
      phase: {{ if \$failed }}Failed{{ else }}Succeeded{{ end }}
STAGE
  echo "---"
  kwok_running_pod_stage_head pod-container-restart \
    'ends and ((.spec.restartPolicy // "Always") == "Always" or (.spec.restartPolicy == "OnFailure" and failing))'
  cat <<STAGE
  next:
    statusTemplate: |
      {{ \$now := Now }}
      {{ \$root := . }}
      {{ \$always := eq (.spec.restartPolicy | default "Always") "Always" }}
      containerStatuses:
      {{ range \$index, \$item := .spec.containers }}
      $KWOK_TPL_CODE
      {{ \$restarts := 0 }}
      {{ \$started := \$now }}
      {{ with \$root.status.containerStatuses }}{{ with index . \$index }}{{ \$restarts = .restartCount | default 0 }}{{ with .state.running }}{{ \$started = .startedAt }}{{ end }}{{ end }}{{ end }}
      - image: {{ \$item.image | Quote }}
        name: {{ \$item.name | Quote }}
        ready: true
        started: true
      {{ if or \$always (ne \$code 0) }}
        restartCount: {{ add1 \$restarts }}
        lastState:
          terminated:
            exitCode: {{ \$code }}
            finishedAt: {{ \$now | Quote }}
            reason: {{ if eq \$code 0 }}Completed{{ else }}Error{{ end }}
            startedAt: {{ \$started | Quote }}
        state:
          running:
            startedAt: {{ \$now | Quote }}
      {{ else }}
        restartCount: {{ \$restarts }}
        state:
          running:
            startedAt: {{ \$started | Quote }}
      {{ end }}
      {{ end }}
STAGE
}

# kwok needs Stage objects to act as the kubelet. The node Stages, pod-ready and pod-delete
# ship inside its Go module; pod-ready is given one more expression so that it leaves the
# Pods of kwok_image_pull_stage alone. kwok's pod-complete (every Job Pod succeeds at once) is
# replaced by kwok_pod_outcome_stages.
write_kwok_stages() {
  local out=$1/kwok-stages.yaml
  [ -s "$out" ] && grep -qF "# $KWOK_STAGES_REVISION" "$out" && return 0
  local stages; stages="$(go env GOMODCACHE)/sigs.k8s.io/kwok@v$KWOK_VERSION/kustomize/stage"
  [ -d "$stages" ] || (cd "$(product_dir kwok "$KWOK_VERSION")" && go mod download "sigs.k8s.io/kwok@v$KWOK_VERSION" >/dev/null 2>&1) || true
  [ -d "$stages" ] || die "kwok stage definitions not found under $stages"
  local ready=$stages/pod/fast/pod-ready.yaml
  [ "$(grep -c '^    matchExpressions:$' "$ready")" = 1 ] ||
    die "kwok's pod-ready Stage ($ready) no longer has one matchExpressions list to extend"
  {
    cat "$stages/node/fast/node-initialize.yaml"
    echo "---"; cat "$stages/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml"
    echo "---"
    local line
    while IFS= read -r line; do
      printf '%s\n' "$line"
      if [ "$line" = "    matchExpressions:" ]; then
        printf "    - key: '.metadata.annotations[\"%s\"]'\n      operator: 'DoesNotExist'\n" "$KWOK_IMAGE_PULL_FAILS"
      fi
    done <"$ready"
    echo "---"; cat "$stages/pod/fast/pod-delete.yaml"
    echo "---"; kwok_image_pull_stage
    echo "---"; kwok_pod_outcome_stages
  } >"$out.tmp"
  mv "$out.tmp" "$out"
}

link_bin_dir() {
  local bin; bin=$(bin_dir); mkdir -p "$bin"
  local k e w z
  k=$(product_dir kubernetes "$K8S_VERSION"); e=$(product_dir etcd "$ETCD_VERSION")
  w=$(product_dir kwok "$KWOK_VERSION"); z=$(product_dir kustomize "$KUSTOMIZE_VERSION")
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do ln -sfn "$k/bin/$b" "$bin/$b"; done
  ln -sfn "$e/bin/etcd" "$bin/etcd"; ln -sfn "$e/bin/etcdctl" "$bin/etcdctl"
  ln -sfn "$w/bin/kwok" "$bin/kwok"; ln -sfn "$z/bin/kustomize" "$bin/kustomize"
  ln -sfn "$(product_dir crane "$CRANE_VERSION")/bin/crane" "$bin/crane"
  ln -sfn "$(product_dir cert-manager "$CERT_MANAGER_VERSION")" "$bin/cert-manager"
  ln -sfn "$(product_dir approver-policy "$APPROVER_POLICY_VERSION")" "$bin/approver-policy"
  ln -sfn "$(product_dir prometheus-operator "$PROMETHEUS_OPERATOR_VERSION")" "$bin/prometheus-operator"
  write_kwok_stages "$bin"
}

# The soak test runs a queue replica in a network namespace (`ip netns`, `ip link ... veth`)
# and cuts it from etcd with a blackhole route: iproute2 is all it needs. Installed from the
# distribution when missing and this runs as root; otherwise the soak names what is missing.
ensure_iproute2() {
  command -v ip >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "testenv: installing iproute2 (ip) for the soak's network namespace" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iproute2 >/dev/null ||
      { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iproute2 >/dev/null; } ||
      echo "testenv: could not install iproute2; the soak test will fail" >&2
  else
    echo "testenv: ip (iproute2) not found; the soak test needs it and root" >&2
  fi
}

cmd=${1:-build}
case "$cmd" in
  versions)
    echo "kubernetes v$K8S_VERSION"; echo "etcd v$ETCD_VERSION"
    echo "kwok v$KWOK_VERSION"; echo "kustomize v$KUSTOMIZE_VERSION"; echo "crane v$CRANE_VERSION"; echo "krew v$KREW_VERSION"
    echo "opentelemetry-collector v$OTELCOL_VERSION"; echo "cert-manager v$CERT_MANAGER_VERSION (CRDs)"
    echo "approver-policy v$APPROVER_POLICY_VERSION (CRDs)"
    echo "prometheus-operator v$PROMETHEUS_OPERATOR_VERSION (CRDs)" ;;
  bin-dir)
    check_go; bin_dir ;;
  build)
    check_go
    mkdir -p "$CACHE"
    # One build at a time per cache: `make test` and `make cluster-up` may race.
    exec 9>"$CACHE/.lock"; flock 9
    build_etcd
    build_go_install kwok "$KWOK_VERSION" kwok "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
    build_go_install kustomize "$KUSTOMIZE_VERSION" kustomize "sigs.k8s.io/kustomize/kustomize/v5@v$KUSTOMIZE_VERSION"
    build_go_install crane "$CRANE_VERSION" crane "github.com/google/go-containerregistry/cmd/crane@v$CRANE_VERSION"
    build_kubernetes
    fetch_cert_manager_crds
    fetch_approver_policy_crds
    fetch_prometheus_operator_crds
    ensure_iproute2
    link_bin_dir
    bin_dir ;;
  otelcol)
    check_go
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"; flock 9
    build_otelcol
    mkdir -p "$(bin_dir)"
    ln -sfn "$(product_dir otelcol "$OTELCOL_VERSION")/bin/otelcol-switchyard" "$(bin_dir)/otelcol-switchyard"
    bin_dir ;;
  kcm-slowed)
    check_go
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"; flock 9
    build_kcm_slowed
    ln -sfn "$(product_dir kubernetes "$K8S_VERSION")/bin/kube-controller-manager-slowed" "$(bin_dir)/kube-controller-manager-slowed"
    bin_dir ;;
  krew)
    check_go
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"; flock 9
    build_go_install krew "$KREW_VERSION" krew "sigs.k8s.io/krew/cmd/krew@v$KREW_VERSION"
    build_go_install krew "$KREW_VERSION" validate-krew-manifest "sigs.k8s.io/krew/cmd/validate-krew-manifest@v$KREW_VERSION"
    mkdir -p "$(bin_dir)"
    for b in krew validate-krew-manifest; do ln -sfn "$(product_dir krew "$KREW_VERSION")/bin/$b" "$(bin_dir)/$b"; done
    bin_dir ;;
  e2e)
    check_go
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"; flock 9
    build_e2e
    mkdir -p "$(bin_dir)"
    for b in e2e.test ginkgo; do ln -sfn "$(product_dir kubernetes "$K8S_VERSION")/bin/$b" "$(bin_dir)/$b"; done
    bin_dir ;;
  *) die "unknown command '$cmd' (expected build, otelcol, kcm-slowed, e2e, krew, bin-dir or versions)" ;;
esac
