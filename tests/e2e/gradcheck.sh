#!/usr/bin/env bash
# tests/e2e/gradcheck.sh — finite-difference check of compiled training
# programs: autodiff + codegen + CPU kernels, end to end.
#
# For each small spec below (one per architecture feature), `xmoec compile
# --no-build` generates program.c, which is compiled together with
# tests/e2e/gradcheck_main.c (instead of out/main.c) using the flags of
# `xmoec compile --print-build-flags`, and run. gradcheck_main.c documents
# the error measure and how routing flips are handled. Any failure fails
# the test. Env: XM_BINARY_DIR (build folder), XM_SOURCE_DIR (sources).
set -euo pipefail

src=${XM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${XM_BINARY_DIR:-$src/build}
xmoec=$bin/xmoec
work=$(mktemp -d "${TMPDIR:-/tmp}/xm-gradcheck.XXXXXX")
trap 'rm -rf "$work"' EXIT
# One thread: the forward pass must round identically between evaluations.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

flags=$("$xmoec" compile --print-build-flags)
cc=$(sed -n 's/^cc: //p' <<<"$flags")
read -r -a cflags <<<"$(sed -n 's/^cflags: //p' <<<"$flags")"
read -r -a libs <<<"$(sed -n 's/^libs: //p' <<<"$flags")"

# name and the JSON of each spec; the common parts are filled in below.
base_model='"vocab": 32, "hidden": 16, "layers": 2, "heads": 2, "kv_heads": 1, "head_dim": 8,
            "first_k_dense": 1, "dense_ffn": 24'
training='"training": {"seq_len": 8, "micro_batch": 2, "global_batch": 2, "dtype": "fp32"}'
declare -A specs
specs[swiglu_softmax_shared_aux]="{\"model\": {$base_model},
  \"moe\": {\"experts\": 4, \"shared_experts\": 1, \"top_k\": 2, \"expert_ffn\": 8,
          \"aux_alpha\": 0.05}, $training}"
specs[gelu]="{\"model\": {$base_model},
  \"moe\": {\"experts\": 4, \"top_k\": 2, \"expert_ffn\": 8, \"activation\": \"gelu\",
          \"norm_topk_prob\": false}, $training}"
specs[sigmoid_groups]="{\"model\": {$base_model},
  \"moe\": {\"experts\": 8, \"top_k\": 2, \"expert_ffn\": 8, \"scoring\": \"sigmoid\",
          \"n_group\": 4, \"topk_group\": 2, \"routed_scaling\": 2.5, \"aux_alpha\": 0.02,
          \"aux_free_gamma\": 0.001}, $training}"
specs[tied_embeddings]="{\"model\": {$base_model, \"tied_embeddings\": true},
  \"moe\": {\"experts\": 4, \"top_k\": 1, \"expert_ffn\": 8, \"norm_topk_prob\": false},
  $training}"
specs[qk_norm_head]="{\"model\": {$base_model, \"qk_norm\": \"head\"},
  \"moe\": {\"experts\": 4, \"top_k\": 2, \"expert_ffn\": 8}, $training}"
specs[qk_norm_full]="{\"model\": {$base_model, \"qk_norm\": \"full\"},
  \"moe\": {\"experts\": 4, \"top_k\": 2, \"expert_ffn\": 8}, $training}"
specs[attention_bias]="{\"model\": {$base_model, \"attention_bias\": true},
  \"moe\": {\"experts\": 4, \"shared_experts\": 1, \"top_k\": 2, \"expert_ffn\": 8},
  $training}"
# Qwen2-MoE's block: the shared expert (its own width) under the sigmoid
# shared_expert_gate, q/k/v biases, top-k weights not renormalised.
specs[shared_expert_gate]="{\"model\": {$base_model, \"attention_bias\": true},
  \"moe\": {\"experts\": 4, \"shared_experts\": 1, \"shared_ffn\": 12,
          \"shared_expert_gate\": true, \"top_k\": 2, \"expert_ffn\": 8,
          \"norm_topk_prob\": false, \"aux_alpha\": 0.01}, $training}"
specs[capacity]="{\"model\": {$base_model},
  \"moe\": {\"experts\": 4, \"top_k\": 2, \"expert_ffn\": 8, \"capacity_factor\": 1.0,
          \"aux_alpha\": 0.01}, $training}"
mla_model='"vocab": 32, "hidden": 16, "layers": 2, "heads": 2, "attention": "mla",
            "kv_lora_rank": 6, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4,
            "v_head_dim": 6, "first_k_dense": 1, "dense_ffn": 24'
specs[mla_q_lora_yarn]="{\"model\": {$mla_model, \"q_lora_rank\": 6, \"rope_interleave\": true,
  \"yarn_factor\": 4, \"yarn_original_max_position\": 4, \"yarn_mscale_all_dim\": 1},
  \"moe\": {\"experts\": 4, \"top_k\": 2, \"expert_ffn\": 8}, $training}"
specs[mla_q_proj]="{\"model\": {$mla_model},
  \"moe\": {\"experts\": 4, \"shared_experts\": 1, \"top_k\": 2, \"expert_ffn\": 8}, $training}"
# Two chained MTP modules. Every expert chosen (top_k = experts): no
# routing decision to flip under the finite-difference steps of the
# modules' MoE blocks; a loss weight of 20 lifts the second module's
# attention gradients above the fp32 noise of the loss.
specs[mtp_two_modules]="{\"model\": {$base_model, \"mtp_layers\": 2},
  \"moe\": {\"experts\": 4, \"top_k\": 4, \"expert_ffn\": 8, \"aux_alpha\": 0.02},
  \"training\": {\"seq_len\": 8, \"micro_batch\": 2, \"global_batch\": 2, \"dtype\": \"fp32\",
                \"mtp_loss_weight\": 20}}"
specs[dense_only]="{\"model\": {\"vocab\": 32, \"hidden\": 16, \"layers\": 2, \"heads\": 2,
  \"head_dim\": 8, \"dense_ffn\": 24}, $training}"

failed=()
for name in $(printf '%s\n' "${!specs[@]}" | sort); do
  dir=$work/$name
  mkdir -p "$dir"
  printf '%s\n' "${specs[$name]}" | sed "1s/^{/{\"name\": \"$name\", /" >"$dir/spec.json"
  echo "=== $name"
  if ! "$xmoec" compile "$dir/spec.json" -o "$dir/out" --no-build >"$dir/compile.log" 2>&1; then
    cat "$dir/compile.log"
    failed+=("$name (compile)")
    continue
  fi
  if ! "$cc" "${cflags[@]}" "$src/tests/e2e/gradcheck_main.c" "$dir/out/program.c" \
       -o "$dir/gradcheck" "${libs[@]}" >"$dir/build.log" 2>&1; then
    cat "$dir/build.log"
    failed+=("$name (build)")
    continue
  fi
  if ! "$dir/gradcheck" "$@"; then
    failed+=("$name")
  fi
done

if ((${#failed[@]})); then
  echo "gradcheck FAILED: ${failed[*]}"
  exit 1
fi
echo "gradcheck passed: ${#specs[@]} models"
