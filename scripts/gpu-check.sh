#!/usr/bin/env bash
# scripts/gpu-check.sh — the checks that need an NVIDIA GPU, as one script
# that runs in a few minutes on a GPU machine that has only the working tree,
# nvcc (/usr/local/cuda or CUDA_HOME), a C compiler and, for the baseline,
# python3 with PyTorch (docs/benchmarks.md, GPU).
#
#   bash scripts/gpu-check.sh --prepare   on a machine with xmoec's toolchain
#                                         (after `bash scripts/test.sh` or a
#                                         build in build/): writes gpu-check/
#   bash scripts/gpu-check.sh [DIR]       on the GPU machine, from the repo root
#                                         with gpu-check/ beside it: writes the
#                                         results to DIR (default $OUT, else
#                                         gpu-check/out)
#
# --prepare writes gpu-check/ (ignored by git; carry it to the GPU machine):
# the tiny sample compiled for --target cuda (out/train, built here with nvcc
# for sm_90) with the shared libraries it needs that a CUDA image may lack
# (Open MPI with its plugins and orted, cJSON), the English training text, and
# the CPU program's loss curve over the same 100 steps.
#
# On the GPU machine, in order (each phase's result goes to DIR/summary.txt):
#   1. env:          nvidia-smi, nvcc --version (into summary.txt)
#   2. conformance:  every kernel of runtime/abi/kernels.def through the CUDA
#                    backend against the CPU reference (tests/backend), built
#                    from source with nvcc; the largest error per kernel is in
#                    DIR/conformance.txt; then `cuobjdump --dump-sass` counts
#                    the tensor-core instructions (HMMA) of the kernels
#   3. train:        the tiny sample, 100 steps on one GPU, against the CPU
#                    loss curve (every step within 2% of it, the last 10
#                    steps' mean within 1%)
#   4. bench:        bash bench/gpu_moe.sh DIR (the fused MoE GEMMs against
#                    cuBLAS, the MoE layer against PyTorch eager)
# Exit status: 0 when every phase that ran passed.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1
prep=$root/gpu-check
steps=100

# ---- --prepare ---------------------------------------------------------------
if [[ "${1:-}" == "--prepare" ]]; then
  set -e
  xmoec=${XMOEC:-$root/build/xmoec}
  [[ -x "$xmoec" ]] || { echo "gpu-check: $xmoec is not built (bash scripts/test.sh --quick)"; exit 2; }
  if [[ -z "$("$xmoec" compile --print-build-flags --target cuda | sed -n 's/^libs: //p')" ]]; then
    echo "gpu-check: this build of xmoec has no CUDA backend (nvcc was not found at configure time)"
    exit 2
  fi
  rm -rf "$prep"
  mkdir -p "$prep/lib"
  echo "gpu-check: compiling the tiny sample for --target cuda"
  "$xmoec" compile samples/tiny.json -o "$prep/tiny-cuda" --target cuda >"$prep/compile.log"
  "$xmoec" compile samples/tiny.json -o "$prep/tiny-cpu" >>"$prep/compile.log"
  for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$prep/english.txt"
  echo "gpu-check: the CPU loss curve ($steps steps)"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$prep/tiny-cpu/train" \
    --data "$prep/english.txt" --steps "$steps" --seed 7 --progress never --quiet \
    --log "$prep/cpu.jsonl"
  # The libraries a CUDA image may lack: all but the C and C++ runtimes.
  ldd "$prep/tiny-cuda/train" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libstdc++.so*|libgcc_s.so*|ld-linux*) ;;
      *) cp -L "$lib" "$prep/lib/" ;;
    esac
  done
  mpilib=$(dirname "$(ldd "$prep/tiny-cuda/train" | awk '/libmpi.so/ {print $3}')")
  [[ -d "$mpilib/openmpi" ]] && cp -rL "$mpilib/openmpi" "$prep/openmpi"
  mkdir -p "$prep/bin"
  for b in orted opal_wrapper; do
    p=$(command -v "$b" || true)
    [[ -n "$p" ]] && cp -L "$p" "$prep/bin/"
  done
  [[ -d /usr/share/openmpi ]] && cp -rL /usr/share/openmpi "$prep/share-openmpi"
  rm -rf "$prep/tiny-cpu"
  du -sh "$prep"
  echo "gpu-check: prepared $prep; on the GPU machine: bash scripts/gpu-check.sh [DIR]"
  exit 0
fi

# ---- on the GPU machine -----------------------------------------------------------
out=${1:-${OUT:-$prep/out}}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
failed=0
say() { echo "$*" | tee -a "$summary"; }
cuda=${CUDA_HOME:-/usr/local/cuda}
nvcc=$cuda/bin/nvcc
[[ -x "$nvcc" ]] || nvcc=$(command -v nvcc || true)
arch=${XM_GPU_ARCH:-sm_90}
# Build products stay out of DIR: a device runner may bring back only a few
# small files (DIR gets summary.txt, conformance.txt, train.txt, gpu.jsonl,
# bench.txt and bench/*.json).
build=${TMPDIR:-/tmp}/xm-gpu-check-build
rm -rf "$build"
mkdir -p "$build"

# 1. env
{
  date -u
  nvidia-smi 2>&1 | head -20
  "$nvcc" --version 2>&1 | tail -2
} >>"$summary" 2>&1
say "env: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
if [[ -z "$nvcc" ]]; then
  say "FAIL: no nvcc (looked in $cuda/bin and PATH)"
  exit 1
fi

# 2. conformance of every kernel through the CUDA backend
start=$SECONDS
if "$nvcc" -std=c++17 -O3 -arch="$arch" -I"$root" -c runtime/cuda/table.cu -o "$build/table.o" \
     >"$build/conformance-build.log" 2>&1 &&
   "$nvcc" -std=c++17 -O3 -arch="$arch" -I"$root" -DXM_CUDA_FILL_ONLY -c runtime/cuda/table.cu \
     -o "$build/fill.o" >>"$build/conformance-build.log" 2>&1 &&
   for c in runtime/cuda/backend.c tests/backend/test_cuda_backend.c tests/backend/conformance.c \
            tests/backend/reference.c; do
     cc -std=gnu11 -O2 -I"$root" -I"$cuda/include" -c "$c" -o "$build/$(basename "$c" .c).o" || exit 1
   done >>"$build/conformance-build.log" 2>&1 &&
   "$nvcc" -arch="$arch" "$build"/table.o "$build"/fill.o "$build"/backend.o "$build"/test_cuda_backend.o \
     "$build"/conformance.o "$build"/reference.o -o "$build/conformance" -lm \
     >>"$build/conformance-build.log" 2>&1; then
  "$build/conformance" >"$out/conformance.txt" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]]; then
    say "ok conformance: $(tail -1 "$out/conformance.txt") ($((SECONDS - start)) s)"
  elif [[ $rc -eq 77 ]]; then
    say "FAIL conformance: $(head -1 "$out/conformance.txt")"
    failed=1
  else
    say "FAIL conformance (exit $rc): $(grep -c '^FAIL' "$out/conformance.txt") failing entries (conformance.txt)"
    grep '^FAIL' "$out/conformance.txt" | head -5 | tee -a "$summary"
    failed=1
  fi
  if command -v cuobjdump >/dev/null 2>&1; then
    hmma=$(cuobjdump --dump-sass "$build/table.o" 2>/dev/null | grep -c 'HMMA' || true)
    say "sass: $hmma HMMA instructions in the kernels (tensor cores)"
  fi
else
  say "FAIL conformance: the build failed (build/conformance-build.log)"
  tail -20 "$build/conformance-build.log"
  failed=1
fi

# 3. the tiny sample trained on one GPU against the CPU loss curve
if [[ -x "$prep/tiny-cuda/train" && -f "$prep/cpu.jsonl" ]]; then
  start=$SECONDS
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
  export LD_LIBRARY_PATH="$prep/lib:$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [[ -d "$prep/openmpi" ]] && export OMPI_MCA_mca_base_component_path="$prep/openmpi/lib/openmpi3"
  [[ -d "$prep/bin" ]] && export PATH="$prep/bin:$PATH"
  [[ -d "$prep/share-openmpi" ]] && export OPAL_PKGDATADIR="$prep/share-openmpi"
  "$prep/tiny-cuda/train" --data "$prep/english.txt" --steps "$steps" --seed 7 --progress never \
    --log "$out/gpu.jsonl" >"$out/train.txt" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]]; then
    say "FAIL train: out/train exited $rc (train.txt): $(tail -2 "$out/train.txt" | tr '\n' ' ')"
    failed=1
  elif python3 - "$prep/cpu.jsonl" "$out/gpu.jsonl" >>"$out/train.txt" <<'PY'
import json, sys
cpu = [json.loads(l) for l in open(sys.argv[1])]
gpu = [json.loads(l) for l in open(sys.argv[2])]
worst = max(abs(g["loss"] - c["loss"]) / c["loss"] for c, g in zip(cpu, gpu))
tail_c = sum(c["loss"] for c in cpu[-10:]) / 10
tail_g = sum(g["loss"] for g in gpu[-10:]) / 10
rate = [g.get("tokens_per_s", 0) for g in gpu[5:]]
for c, g in zip(cpu, gpu):
    print(f"step {c['step']:4d} cpu {c['loss']:.5f} gpu {g['loss']:.5f}")
print(f"steps {len(gpu)}; worst step difference {worst:.2%}; last-10 mean cpu {tail_c:.4f} gpu {tail_g:.4f} "
      f"({abs(tail_g - tail_c) / tail_c:.2%}); {sum(rate) / max(len(rate), 1):.0f} tokens/s on the GPU")
ok = len(gpu) == len(cpu) and worst <= 0.02 and abs(tail_g - tail_c) / tail_c <= 0.01
sys.exit(0 if ok else 1)
PY
  then
    say "ok train: $(tail -1 "$out/train.txt") ($((SECONDS - start)) s)"
  else
    say "FAIL train: $(tail -1 "$out/train.txt") (train.txt)"
    failed=1
  fi
else
  say "SKIPPED train: no $prep (run bash scripts/gpu-check.sh --prepare on the build machine and carry gpu-check/)"
fi

# 4. the MoE GEMM benchmark
if [[ -f bench/gpu_moe.sh ]]; then
  if bash bench/gpu_moe.sh "$out/bench" >"$out/bench.txt" 2>&1; then
    say "ok bench: bench/gpu_moe.sh (bench.txt)"
    tail -30 "$out/bench.txt" | tee -a "$summary"
  else
    say "FAIL bench: bench/gpu_moe.sh (bench.txt): $(tail -3 "$out/bench.txt" | tr '\n' ' ')"
    failed=1
  fi
fi

say "gpu-check: $([[ $failed -eq 0 ]] && echo passed || echo FAILED); results in $out"
exit $failed
