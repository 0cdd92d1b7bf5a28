#!/usr/bin/env bash
# Installs what the tests need besides Rust and Go (the control plane is built from Go modules
# by scripts/testenv.sh): cargo-deny from crates.io, and the distribution packages below, only
# what is missing, with apt-get, as root or through sudo. `.ci/run` calls it before
# `make test`; on a machine of your own, run it once.
#
#   prometheus       Debian's prometheus package: `prometheus` and `promtool`, for the alerts'
#                    unit tests and the Prometheus that tests/monitoring.rs starts
#   chromium         a headless browser, and `chromedriver` (chromium-driver) to drive it over
#   chromium-driver  WebDriver: tests/plugin.rs loads the elector's console in it
set -euo pipefail

# cargo-deny (`make deny`, part of `make test`), from crates.io, at a pinned version.
CARGO_DENY_VERSION=0.19.0
if ! cargo deny --version 2>/dev/null | grep -qx "cargo-deny $CARGO_DENY_VERSION"; then
  echo "install-deps: installing cargo-deny $CARGO_DENY_VERSION (cargo install, a few minutes)" >&2
  cargo install --locked --quiet cargo-deny --version "$CARGO_DENY_VERSION"
fi

# <command> <package>: the command that must be on PATH, and the package that brings it.
NEEDED=(
  "promtool prometheus"
  "prometheus prometheus"
  "chromium chromium"
  "chromedriver chromium-driver"
)

missing=()
for pair in "${NEEDED[@]}"; do
  read -r command package <<<"$pair"
  command -v "$command" >/dev/null 2>&1 && continue
  [[ " ${missing[*]} " == *" $package "* ]] || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

command -v apt-get >/dev/null 2>&1 || {
  echo "install-deps: missing ${missing[*]}, and no apt-get here: install the package(s) with your distribution's tools" >&2
  exit 1
}
sudo=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 || {
    echo "install-deps: missing ${missing[*]}: run as root, or install sudo (apt-get install ${missing[*]})" >&2
    exit 1
  }
  sudo=(sudo)
fi

echo "install-deps: installing ${missing[*]} (apt-get)" >&2
install() { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; }
install >/dev/null || { "${sudo[@]}" apt-get update >/dev/null && install >/dev/null; }

# The package enables a prometheus service on :9090; the tests start their own on free ports.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  "${sudo[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

for pair in "${NEEDED[@]}"; do
  read -r command package <<<"$pair"
  command -v "$command" >/dev/null 2>&1 || { echo "install-deps: $package installed, but $command is not on PATH" >&2; exit 1; }
done
