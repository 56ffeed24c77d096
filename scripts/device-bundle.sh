#!/usr/bin/env bash
# Packs a GPU build made here into one archive that a GPU machine without
# the Debian -dev packages can run: the executables (stripped), ctest's
# files, and every shared library they load apart from glibc and the CUDA
# driver, toolkit and NCCL (the GPU machine has its own). The paths inside
# stay absolute (ctest's files and the tests name the binaries by their
# build path), so device-check.sh links this build's source root to the
# checkout it runs in.
#
#   scripts/device-bundle.sh [BUILD_DIR] [OUT_DIR]
#     BUILD_DIR  a tree configured with -DRECPS_REQUIRE_CUDA=ON and built
#                (default build-gpu)
#     OUT_DIR    where bundle.tar.gz goes (default .device-bundle; add it to
#                .git/info/exclude and name it in the device tool's carry)
#
# Then, on the GPU machine: PREBUILT=OUT_DIR/bundle.tar.gz scripts/device-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=$(cd "${1:-build-gpu}" && pwd)
OUT_DIR=${2:-.device-bundle}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# Executables and ctest's files, at their paths under the build tree.
(cd "$BUILD_DIR" &&
   find . -type f \( -perm -u+x -o -name 'CTestTestfile.cmake' \
                     -o -name '*_tests.cmake' -o -name '*_include.cmake' \) \
     -not -path '*/CMakeFiles/*' -not -name '*.so*' -not -name '*.sh' \
     -print0 | tar --null -cf - -T -) | tar -xf - -C "$stage"
find "$stage" -type f -perm -u+x -exec strip --strip-unneeded {} + 2>/dev/null || true

# Shared libraries: what ldd resolves, less glibc, the driver and CUDA/NCCL.
mkdir -p "$stage/.bundle-lib"
find "$stage" -type f -perm -u+x -print0 |
  xargs -0 ldd 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libcudart|libcublas[^/]*|libnccl|libstdc\+\+|libgcc_s)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/.bundle-lib/"; done
echo "$BUILD_DIR" > "$stage/.bundle-build-dir"
git rev-parse HEAD > "$stage/.bundle-commit" 2>/dev/null || true

tar -czf "$OUT_DIR/bundle.tar.gz" -C "$stage" .
echo "bundle: $OUT_DIR/bundle.tar.gz ($(du -h "$OUT_DIR/bundle.tar.gz" | cut -f1))," \
     "$(find "$stage" -type f -perm -u+x -not -path '*/.bundle-lib/*' | wc -l) executables," \
     "$(ls "$stage/.bundle-lib" | wc -l) libraries, built at $BUILD_DIR"
