#!/usr/bin/env bash
# Fails if a control-plane process started by the tests is still running, a Prometheus the
# monitoring tests started (its storage is in a switchyard-prometheus-* directory), or a
# Chromium that chromedriver started for tests/plugin.rs (--enable-automation). A cluster a
# person started with `make cluster-up` (its arguments name the cluster directory) is not
# counted.
set -euo pipefail
cache=${SWITCHYARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard/testenv}
cluster=${SWITCHYARD_CLUSTER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard/cluster}

left() {
  { pgrep -af -- "$cache/" | grep -vF -- "$cluster"; pgrep -af -- "--storage.tsdb.path=.*/switchyard-prometheus-"; pgrep -af -- "chromium.*--enable-automation"; } || true
}

# Processes get SIGTERM and a grace period before SIGKILL; allow for it.
for _ in $(seq 1 50); do
  [ -z "$(left)" ] && { echo "no control-plane process left running"; exit 0; }
  sleep 0.2
done
echo "control-plane processes left running after the tests:" >&2
left >&2
exit 1
