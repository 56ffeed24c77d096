#!/usr/bin/env bash
# scripts/device-check.sh with PREBUILT= replaces an earlier unpacked bundle
# at the bundle's build path, and must never delete a real build tree that
# sits there (the machine that made the bundle has one at that very path:
# an earlier version deleted it). Run from the repository root.
set -uo pipefail
root=$(pwd -P)
tree="$root/build-prebuilt-test-$$"
work=$(mktemp -d)
trap 'rm -rf "$tree" "$work"' EXIT

# A "real" build tree at the bundle's path, and a bundle that points there.
mkdir -p "$tree/bin" && echo keep > "$tree/CMakeCache.txt"
mkdir -p "$work/bundle" && echo "$tree" > "$work/bundle/.bundle-build-dir"
tar -czf "$work/bundle.tar.gz" -C "$work/bundle" .

out=$(PREBUILT="$work/bundle.tar.gz" bash scripts/device-check.sh "$work/results" 2>&1)
rc=$?
fail=0
if [[ $rc == 0 ]]; then echo "FAIL: device-check.sh exited 0"; fail=1; fi
if ! grep -q "is a build tree, not a bundle" <<< "$out"; then
  echo "FAIL: no refusal naming the build tree in:"; echo "$out"; fail=1
fi
if [[ ! -e $tree/CMakeCache.txt ]]; then
  echo "FAIL: the build tree at $tree was deleted"; fail=1
fi
[[ $fail == 0 ]] && echo "PASS: a real build tree at the bundle's path is left alone"
exit $fail
