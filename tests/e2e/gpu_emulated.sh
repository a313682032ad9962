#!/usr/bin/env bash
# tests/e2e/gpu_emulated.sh — a whole training step of GPU programs, run on
# the CPU emulation of the GPU, against the CPU program of the same spec.
#
# For each spec below and each GPU target (hip: wavefront 64 and the MFMA
# layouts; cuda: warp 32 and the mma.sync layouts), `xmoec compile --target T
# --no-build` writes program.c and kernels.hip; kernels.hip is compiled with
# the emulation flags of `xmoec compile --print-build-flags --target T
# --emulate`, and program.c is linked with tests/e2e/gpu_step_main.c (instead
# of out/main.c) and the emulated backend. The CPU program of the same spec
# is built the same way with the CPU backend. Both run micro and step once
# on the same parameters and tokens; tests/e2e/gpu_compare.py bounds the
# loss, the gradient norm and every gradient tensor (tolerances below, per
# precision). Env: XM_BINARY_DIR, XM_SOURCE_DIR; XM_KEEP=1 keeps the work
# folder.
set -euo pipefail

src=${XM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${XM_BINARY_DIR:-$src/build}
xmoec=$bin/xmoec
work=$(mktemp -d "${TMPDIR:-/tmp}/xm-gpu-emu.XXXXXX")
trap '[[ -n "${XM_KEEP:-}" ]] || rm -rf "$work"' EXIT

flags_of() { # target [--emulate] -> sets kcc kflags cc cflags libs
  local f
  f=$("$xmoec" compile --print-build-flags "$@")
  kcc=$(sed -n 's/^kernel_cc: //p' <<<"$f")
  read -r -a kflags <<<"$(sed -n 's/^kernel_flags: //p' <<<"$f")"
  cc=$(sed -n 's/^cc: //p' <<<"$f")
  read -r -a cflags <<<"$(sed -n 's/^cflags: //p' <<<"$f")"
  read -r -a libs <<<"$(sed -n 's/^libs: //p' <<<"$f")"
}

# Tolerances (relative; gpu_compare.py): the losses, and the gradient norm
# and each gradient tensor's relative L2 error. fp32: the GPU kernels sum in
# other orders than the CPU's, f32 both (measured: losses equal, gradients
# within 4e-6). bf16: GEMM results are rounded to bf16 on both sides, and a
# value that rounds the other way moves everything after it by a bf16 ulp
# (2^-8); routing and SwiGLU amplify that, so a tensor's bound is also 1.5
# times bf16's own error on it (the CPU bf16 program against the fp32 one
# of the same model, the spec without _bf16). Measured: losses within 5e-5,
# gradients at worst 0.45 of their bound.
tol_fp32=(1e-5 1e-4)
tol_bf16=(2e-3 2e-2)

declare -A specs
specs[tiny]=$(cat "$src/samples/tiny.json")
specs[tiny_bf16]=$(python3 -c '
import json, sys
s = json.load(open(sys.argv[1])); s["name"] = "tiny_bf16"
s.setdefault("training", {})["dtype"] = "bf16"
print(json.dumps(s))' "$src/samples/tiny.json")
base_model='"vocab": 64, "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 8,
            "first_k_dense": 1, "dense_ffn": 48'
training='"training": {"seq_len": 16, "micro_batch": 2, "global_batch": 2, "dtype": "fp32"}'
specs[sigmoid_groups_capacity]="{\"name\": \"sigmoid_groups_capacity\", \"model\": {$base_model},
  \"moe\": {\"experts\": 8, \"shared_experts\": 1, \"top_k\": 2, \"expert_ffn\": 16,
          \"scoring\": \"sigmoid\", \"n_group\": 4, \"topk_group\": 2, \"routed_scaling\": 2.5,
          \"aux_alpha\": 0.02, \"aux_free_gamma\": 0.001, \"capacity_factor\": 1.0}, $training}"
specs[gelu_topk1]="{\"name\": \"gelu_topk1\", \"model\": {$base_model, \"tied_embeddings\": true},
  \"moe\": {\"experts\": 4, \"top_k\": 1, \"expert_ffn\": 16, \"activation\": \"gelu\",
          \"norm_topk_prob\": false}, $training}"
specs[mla_yarn]="{\"name\": \"mla_yarn\", \"model\": {\"vocab\": 64, \"hidden\": 32, \"layers\": 2,
  \"heads\": 4, \"attention\": \"mla\", \"q_lora_rank\": 12, \"kv_lora_rank\": 8,
  \"qk_nope_head_dim\": 6, \"qk_rope_head_dim\": 4, \"v_head_dim\": 6, \"rope_interleave\": true,
  \"yarn_factor\": 4, \"yarn_original_max_position\": 8, \"yarn_mscale_all_dim\": 1,
  \"first_k_dense\": 1, \"dense_ffn\": 48, \"mtp_layers\": 1},
  \"moe\": {\"experts\": 8, \"shared_experts\": 1, \"top_k\": 2, \"expert_ffn\": 16,
          \"scoring\": \"sigmoid\", \"n_group\": 4, \"topk_group\": 2, \"aux_free_gamma\": 0.001},
  $training}"

# Qwen2-MoE's block: q/k/v biases, top-k weights not renormalised, a shared
# expert of its own width under the sigmoid shared_expert_gate (the per-row
# mul and its row-sum gradient, mul_rows and reduce_rows).
specs[shared_gate]="{\"name\": \"shared_gate\", \"model\": {$base_model, \"attention_bias\": true},
  \"moe\": {\"experts\": 4, \"shared_experts\": 1, \"shared_ffn\": 24, \"shared_expert_gate\": true,
          \"top_k\": 2, \"expert_ffn\": 16, \"norm_topk_prob\": false, \"aux_alpha\": 0.01},
  $training}"

# The sanitizer build runs the small models only (AddressSanitizer makes
# the emulated tiny sample take minutes per step); the release build runs all.
sanitize=0
grep -q '^XM_SANITIZE:BOOL=ON' "$bin/CMakeCache.txt" 2>/dev/null && sanitize=1
if ((sanitize)); then
  unset 'specs[tiny]' 'specs[tiny_bf16]'
  echo "gpu_emulated: sanitizer build: tiny, tiny_bf16 and the 4-rank run are left to the release build"
fi

flags_of --target cpu
cpu_cc=$cc
cpu_cflags=("${cflags[@]}")
cpu_libs=("${libs[@]}")

failed=()
for name in $(printf '%s\n' "${!specs[@]}" | sort); do
  dir=$work/$name
  mkdir -p "$dir"
  printf '%s\n' "${specs[$name]}" >"$dir/spec.json"
  tol=("${tol_fp32[@]}")
  baseline=()
  if [[ $name == *_bf16 ]]; then
    tol=("${tol_bf16[@]}")
    baseline=("$work/${name%_bf16}/cpu.bin")
  fi
  echo "=== $name"
  "$xmoec" compile "$dir/spec.json" -o "$dir/cpu" --no-build >"$dir/cpu.log" 2>&1 ||
    { cat "$dir/cpu.log"; failed+=("$name (compile cpu)"); continue; }
  "$cpu_cc" "${cpu_cflags[@]}" "$src/tests/e2e/gpu_step_main.c" "$dir/cpu/program.c" \
    -o "$dir/step_cpu" "${cpu_libs[@]}" >"$dir/build_cpu.log" 2>&1 ||
    { cat "$dir/build_cpu.log"; failed+=("$name (build cpu)"); continue; }
  OMP_NUM_THREADS=1 "$dir/step_cpu" "$dir/cpu.bin" >/dev/null
  for target in hip cuda; do
    out=$dir/$target
    "$xmoec" compile "$dir/spec.json" -o "$out" --target "$target" --no-build >"$dir/$target.log" 2>&1 ||
      { cat "$dir/$target.log"; failed+=("$name (compile $target)"); continue; }
    flags_of --target "$target" --emulate
    "$kcc" "${kflags[@]}" -c "$out/kernels.hip" -o "$out/kernels.o" >"$out/build.log" 2>&1 &&
      "$cc" "${cflags[@]}" "$src/tests/e2e/gpu_step_main.c" "$out/program.c" "$out/kernels.o" \
        -o "$out/step" "${libs[@]}" >>"$out/build.log" 2>&1 ||
      { cat "$out/build.log"; failed+=("$name (build $target emulated)"); continue; }
    start=$SECONDS
    "$out/step" "$out/step.bin" >/dev/null
    echo "--- $target (emulated, $((SECONDS - start)) s)"
    python3 "$src/tests/e2e/gpu_compare.py" "$dir/cpu.bin" "$out/step.bin" "${tol[@]}" \
      "${baseline[@]}" ||
      failed+=("$name ($target)")
  done
done

# Several ranks: the README's 4-rank layout of the tiny sample (2 nodes,
# TP+SSMB, EP 4, RBD) built with --target hip --emulate, whose collectives
# and RBD exchanges go through the host staging of backends the host cannot
# address, trained a few steps with out/train itself against the CPU
# program of the same layout: the same losses and gradient norms per step
# (measured: equal to 7 digits).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
steps=3
data=$work/english.txt
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"
layout=(--dp 2 --tp 2 --ssmb --ep 4 --rbd --ranks-per-node 2)
((sanitize)) || echo "=== tiny, 4 ranks (${layout[*]}), $steps steps"
if ((sanitize)); then
  :
elif "$xmoec" compile "$src/samples/tiny.json" -o "$work/l4/cpu" "${layout[@]}" >"$work/l4.log" 2>&1 &&
   "$xmoec" compile "$src/samples/tiny.json" -o "$work/l4/hip" --target hip --emulate "${layout[@]}" \
     >>"$work/l4.log" 2>&1; then
  for t in cpu hip; do
    OMP_NUM_THREADS=1 XM_RANKS_PER_NODE=2 timeout 900 mpirun -np 4 "$work/l4/$t/train" --data "$data" \
      --seed 7 --steps "$steps" --progress never --quiet --log "$work/l4/$t.jsonl" ||
      failed+=("4 ranks ($t run)")
  done
  python3 - "$work/l4/cpu.jsonl" "$work/l4/hip.jsonl" <<'PY' || failed+=("4 ranks (compare)")
import json, sys
cpu = [json.loads(l) for l in open(sys.argv[1])]
gpu = [json.loads(l) for l in open(sys.argv[2])]
bad = len(cpu) != len(gpu) or not cpu
for a, b in zip(cpu, gpu):
    for key in ("loss", "grad_norm"):
        rel = abs(a[key] - b[key]) / max(abs(a[key]), 1e-30)
        ok = rel <= 1e-5
        bad |= not ok
        print(f"{'ok  ' if ok else 'FAIL'} step {a['step']} {key:9s} cpu {a[key]:.7f} gpu {b[key]:.7f} rel {rel:.1e}")
sys.exit(1 if bad else 0)
PY
else
  cat "$work/l4.log"
  failed+=("4 ranks (compile)")
fi

# Checkpoints move between targets: the CPU program's step-2 checkpoint
# resumed by the emulated HIP program, and the HIP program's by the CPU one,
# give the step-3 loss of the CPU run that never stopped.
if ((!sanitize)); then
  echo "=== checkpoints across targets"
  r=$work/resume
  if "$xmoec" compile "$src/samples/tiny.json" -o "$r/cpu" >"$r.log" 2>&1 &&
     "$xmoec" compile "$src/samples/tiny.json" -o "$r/hip" --target hip --emulate >>"$r.log" 2>&1; then
    run() { "$r/$1/train" --data "$data" --seed 7 --progress never --quiet "${@:2}"; }
    run cpu --steps 2 --ckpt-dir "$r/ck_cpu" && run cpu --steps 3 --log "$r/cpu.jsonl" &&
      run hip --steps 3 --resume "$r/ck_cpu" --log "$r/hip_from_cpu.jsonl" &&
      run hip --steps 2 --ckpt-dir "$r/ck_hip" && run cpu --steps 3 --resume "$r/ck_hip" \
        --log "$r/cpu_from_hip.jsonl" || failed+=("checkpoints across targets (runs)")
    python3 - "$r"/cpu.jsonl "$r"/hip_from_cpu.jsonl "$r"/cpu_from_hip.jsonl <<'PY' ||
import json, sys
want = [json.loads(l) for l in open(sys.argv[1])][-1]["loss"]
bad = 0
for path in sys.argv[2:]:
    got = json.loads(open(path).readlines()[-1])["loss"]
    rel = abs(got - want) / want
    bad |= rel > 1e-5
    print(f"{'ok  ' if rel <= 1e-5 else 'FAIL'} {path.rsplit('/', 1)[1]}: step 3 loss {got:.7f}, uninterrupted CPU run {want:.7f}")
sys.exit(bad)
PY
      failed+=("checkpoints across targets")
  else
    cat "$r.log"
    failed+=("checkpoints across targets (compile)")
  fi
fi

if ((${#failed[@]})); then
  echo "gpu_emulated FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu_emulated passed: ${#specs[@]} specs x 2 emulated targets$( ((sanitize)) || echo ", and 4 ranks")"
