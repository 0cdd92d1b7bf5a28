#!/usr/bin/env bash
# Checks the alerts of ../alerts.yaml with promtool (Debian's `prometheus` package; see
# scripts/install-deps.sh): the PrometheusRule's spec is written out as a plain rule file,
# `promtool check rules` checks it, and `promtool test rules` runs every unit test in this
# directory against it.
#
#   tests/promtool.sh                 check the rules and run the unit tests
#   tests/promtool.sh --extract FILE  only write the plain rule file to FILE
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
alerts=$here/../alerts.yaml
# The name the unit tests' `rule_files:` give it.
RULES=switchyard-alerts.rules.yaml

# Everything under `spec:` of the PrometheusRule, two spaces less indented: a rule file.
extract() {
  grep -q '^spec:$' "$alerts" || { echo "promtool.sh: no top-level 'spec:' in $alerts" >&2; exit 1; }
  awk 'found { sub(/^  /, ""); print } /^spec:$/ { found = 1 }' "$alerts" >"$1"
}

if [ "${1:-}" = "--extract" ]; then
  [ -n "${2:-}" ] || { echo "usage: $0 --extract FILE" >&2; exit 2; }
  extract "$2"
  exit 0
fi

command -v promtool >/dev/null 2>&1 || {
  echo "promtool.sh: promtool not found: install Debian's prometheus package" \
    "(scripts/install-deps.sh, or: sudo apt-get install prometheus)" >&2
  exit 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
extract "$work/$RULES"
cp "$here"/*_test.yaml "$work/"
cd "$work"
promtool check rules "$RULES"
promtool test rules ./*_test.yaml
