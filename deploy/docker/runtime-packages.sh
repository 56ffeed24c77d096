#!/usr/bin/env bash
# Prints the Debian packages that hold the shared libraries the given
# binaries load (ldd), one per line, sorted: what the runtime image installs.
# Used by the Dockerfile's build stage and by tests/deploy (which checks the
# result covers every library). Fails when a library belongs to no package
# (a locally built one would then be missing from the image).
set -euo pipefail
(($# > 0)) || { echo "usage: $0 BINARY..." >&2; exit 2; }
# The CUDA toolkit's libraries (cudart) come with the CUDA variant's
# nvidia/cuda runtime base image; the CPU image's build (RECPS_CUDA=OFF)
# links none of them.
mapfile -t libs < <(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// && $3 !~ /^\/usr\/local\/cuda/ {print $3}' | sort -u)
# dpkg knows a library by the path it installed, which may be the
# /lib <-> /usr/lib alias of the path ldd printed, or the link's target.
candidates=()
for lib in "${libs[@]}"; do
  candidates+=("$lib" "$(readlink -f "$lib")" "/usr$lib" "${lib#/usr}")
done
# One dpkg call ("pkg[:arch][, pkg]: path" per path it knows; misses go
# to stderr).
owners=$(dpkg -S "${candidates[@]}" 2>/dev/null || true)
status=0
pkgs=()
for lib in "${libs[@]}"; do
  pkg=""
  for path in "$lib" "$(readlink -f "$lib")" "/usr$lib" "${lib#/usr}"; do
    pkg=$(awk -v p="$path" '{ f = $0; sub(/^[^\/]*: \//, "/", f); if (f == p) { sub(/[:,].*/, ""); print; exit } }' \
          <<< "$owners")
    [[ -n $pkg ]] && break
  done
  if [[ -z $pkg ]]; then
    echo "runtime-packages: no package holds $lib" >&2
    status=1
  else
    pkgs+=("$pkg")
  fi
done
printf '%s\n' "${pkgs[@]}" | sort -u
exit "$status"
