#!/usr/bin/env bash
# tests/backend/emu_kernels.sh — builds the conformance suite on the emulated
# GPU for one kernel file of runtime/gpu/kernels alone and runs entries of
# it: the loop of someone writing GPU kernels (the ctests backend_emu_amd and
# backend_emu_nv build every file together).
#
# Usage: bash tests/backend/emu_kernels.sh FILE ENTRIES [amd|nv|both]
#   FILE     a kernel file, e.g. runtime/gpu/kernels/moe.cuh
#   ENTRIES  conformance entries, comma-separated, e.g. permute,gather_rows
# Environment: XM_EMU_SCHEDULE (forward, reverse, random[:seed]) is passed
# on; CXX, CC and OUT (the build folder, default /tmp/xm_emu_<file>) too.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
file=${1:?usage: emu_kernels.sh FILE ENTRIES [amd|nv|both]}
entries=${2:?usage: emu_kernels.sh FILE ENTRIES [amd|nv|both]}
which=${3:-both}
[[ -f "$root/$file" ]] || { echo "emu_kernels: no file $file under $root" >&2; exit 2; }
name=$(basename "$file" .cuh)
out=${OUT:-/tmp/xm_emu_$name}
mkdir -p "$out"
CXX=${CXX:-g++}
CC=${CC:-gcc}
flags=(-O1 -g -fopenmp -I"$root" -Wall -Wextra)
for t in amd nv; do
  [[ "$which" == both || "$which" == "$t" ]] || continue
  amd=0
  [[ $t == amd ]] && amd=1
  cat > "$out/table_$t.cpp" <<EOT
#define XM_G_BUILD_TABLE 1
#define XM_G_ONLY "$file"
#include "runtime/gpu/table.cuh"
xm_stream_t xm_g_table_stream;
xm_rt_kernels_t xm_g_table;
extern "C" const xm_rt_kernels_t *xm_rt_emu_kernel_table(void) { return &xm_g_table; }
EOT
  $CXX -std=c++17 "${flags[@]}" -DXM_EMU_AMD=$amd -c "$out/table_$t.cpp" -o "$out/table_$t.o"
  stale=1
  if [[ -f "$out/common.stamp" ]]; then
    stale=$(find "$root/runtime/emu" "$root/tests/backend" "$root/runtime/abi" -newer "$out/common.stamp" \
            -type f | head -1 | wc -l)
  fi
  ((stale == 0)) || {
    $CXX -std=c++17 "${flags[@]}" -c "$root/runtime/emu/emu.cpp" -o "$out/emu.o"
    for c in runtime/emu/backend.c tests/backend/test_emu_backend.c tests/backend/conformance.c \
             tests/backend/reference.c; do
      $CC -std=gnu11 "${flags[@]}" -c "$root/$c" -o "$out/$(basename "$c" .c).o"
    done
    touch "$out/common.stamp"
  }
  $CXX -fopenmp "$out/table_$t.o" "$out/emu.o" "$out/backend.o" "$out/test_emu_backend.o" \
       "$out/conformance.o" "$out/reference.o" -lm -o "$out/conformance_$t"
  echo "== $t ($out/conformance_$t $entries)"
  "$out/conformance_$t" "$entries"
done
