#!/usr/bin/env bash
# tests/e2e/gpu_compile.sh — the GPU targets build: `xmoec compile --target
# hip` and `--target cuda` build out/train (out/kernels.hip compiled by hipcc
# for gfx90a and by nvcc for sm_90, linked with the HIP / CUDA backend) for
# every sample model on one rank and for the multi-rank layouts the README
# shows (the tiny sample on 4 ranks as 2 nodes with SSMB and RBD;
# xmoe-small on 8 ranks, dp 8 ep 8). Without a GPU, each built program must
# say that it has no device and exit 1 (the tiny one is run to check).
# A target whose compiler or backend this build lacks is skipped, and the
# skip is printed; so is the whole test in the sanitizer build (the GPU
# compilers do not instrument their code). Env: XM_BINARY_DIR, XM_SOURCE_DIR.
set -euo pipefail

src=${XM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${XM_BINARY_DIR:-$src/build}
xmoec=$bin/xmoec
work=$(mktemp -d "${TMPDIR:-/tmp}/xm-gpu-compile.XXXXXX")
trap 'rm -rf "$work"' EXIT

if "$xmoec" compile --print-build-flags | grep -q -- '-fsanitize'; then
  echo "gpu_compile: skipped in the sanitizer build (the release build runs it)"
  exit 0
fi

builds=()
for spec in "$src"/samples/*.json; do
  builds+=("$(basename "$spec" .json)|$spec|")
done
builds+=("tiny-4-ranks|$src/samples/tiny.json|--dp 2 --tp 2 --ssmb --ep 4 --rbd --ranks-per-node 2")
builds+=("xmoe-small-8-ranks|$src/samples/xmoe-small.json|--dp 8 --ep 8")

failed=()
built=0
for target in hip cuda; do
  flags=$("$xmoec" compile --print-build-flags --target "$target")
  kcc=$(sed -n 's/^kernel_cc: //p' <<<"$flags")
  libs=$(sed -n 's/^libs: //p' <<<"$flags")
  if [[ -z "$libs" ]]; then
    echo "gpu_compile: SKIPPED --target $target: this build has no $target backend (its compiler or runtime was not found at configure time)"
    continue
  fi
  if ! command -v "$kcc" >/dev/null 2>&1; then
    echo "gpu_compile: SKIPPED --target $target: $kcc not found"
    continue
  fi
  for b in "${builds[@]}"; do
    IFS='|' read -r name spec layout <<<"$b"
    out=$work/$target/$name
    start=$SECONDS
    # shellcheck disable=SC2086
    if ! "$xmoec" compile "$spec" -o "$out" --target "$target" $layout >"$work/log" 2>&1; then
      tail -30 "$work/log"
      failed+=("$target $name")
      continue
    fi
    kernels=$(grep -c '^extern "C"' "$out/kernels.hip")
    echo "ok --target $target $name: $kernels kernel specialisations, out/train built ($((SECONDS - start)) s)"
    built=$((built + 1))
    if [[ $name == tiny ]]; then
      set +e
      msg=$("$out/train" --data "$spec" --steps 1 2>&1)
      rc=$?
      set -e
      if [[ $rc -ne 1 ]] || ! grep -q "backend cannot start: no .* device" <<<"$msg"; then
        echo "FAIL --target $target: out/train without a GPU exited $rc: $msg"
        failed+=("$target $name (run without a GPU)")
      else
        echo "ok --target $target: without a GPU out/train says: ${msg##*error: }"
      fi
    fi
  done
done

if ((${#failed[@]})); then
  echo "gpu_compile FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu_compile passed: $built programs built"
