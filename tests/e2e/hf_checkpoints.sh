#!/usr/bin/env bash
# tests/e2e/hf_checkpoints.sh — Hugging Face checkpoints both ways.
#
# tests/e2e/hf_layouts.py writes a small random checkpoint of each
# architecture xmoec exports (Mixtral in BF16, one file; Qwen3-MoE in F16,
# 3 shards with tied embeddings; OLMoE in F32 with YaRN; DeepSeek-V3 in
# BF16, 3 shards, with an MTP layer and its stored copies; Qwen2-MoE in F32,
# 2 shards) exactly as transformers lays it out, and the xmoec spec of the
# same model with a training section. For each architecture:
#   - `xmoec check` counts the same parameters for the HF config.json and
#     for the spec, and `xmoec compile` of the config.json writes the same
#     config.json (all but max_position_embeddings, the trained length) as
#     the program compiled from the spec (an HF config sets no training
#     fields: seq_len 4096, bf16; the spec sets small fp32 ones);
#   - `out/train --init-from` loads the checkpoint; the first step's loss
#     equals tests/e2e/torch_ref.py's on the same tensors and windows
#     (relative difference <= 1e-5);
#   - the checkpoint it saves (--steps 0) holds the same tensors, names,
#     shapes and values (BF16 and F16 converted exactly to the F32 it saves)
#     and a config.json with every architecture key of the source, equal
#     (hf_layouts.py, NOT_COMPARED, lists the few keys that are not the
#     model's); loading that one again gives the same first loss.
# Qwen2-MoE's shared-expert gate cannot be trained yet (ir/model.c refuses
# it): its compile must fail with that message and only the parts above that
# need no program run (the count); once the gate trains, its full check runs.
# Then refusals, each exit code 2 with the tensor or key named: a renamed
# tensor, a wrong shape, a missing and an extra tensor, an F64 tensor, a
# NaN, a different num_experts_per_tok, model_type and rope_theta, an MTP
# copy that is not a copy; --init-from with --resume. And two layouts of
# two ranks (Mixtral dp 2 x ep 2, Qwen3-MoE tp 2) load the same checkpoints
# with the same first loss as one rank.
set -euo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export XM_NO_REEXEC=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
fail() { echo "hf_checkpoints: FAIL: $*" >&2; exit 1; }

data="$work/text.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"
"$py" "$src/tests/e2e/hf_layouts.py" write "$work"

# The first step's loss of a --log file.
first_loss() { "$py" -c "import json,sys; print(repr(json.loads(open(sys.argv[1]).readline())['loss']))" "$1"; }

# Parameter counts of `xmoec check --json`.
counts() {
  "$bin/xmoec" check --json "$1" 2>/dev/null |
    "$py" -c "import json,sys; d=json.load(sys.stdin); print({k: v for k, v in d.items() if k.startswith('params_')})"
}

trained=()
for arch in mixtral qwen3_moe olmoe deepseek_v3 qwen2_moe; do
  d="$work/$arch"
  [[ "$(counts "$d/hf/config.json")" == "$(counts "$d/spec.json")" ]] ||
    fail "$arch: xmoec check counts differ: config.json $(counts "$d/hf/config.json"), spec $(counts "$d/spec.json")"
  "$bin/xmoec" compile "$d/spec.json" -o "$d/prog" >"$d/compile.out" 2>"$d/compile.err" ||
    { cat "$d/compile.err"; fail "$arch: compile failed"; }
  # The exported config.json reads back without a warning (transformers'
  # derived keys and xmoec's own are known to the importer).
  "$bin/xmoec" check "$d/prog/config.json" >/dev/null 2>"$d/check.err" ||
    { cat "$d/check.err"; fail "$arch: xmoec check of the exported config.json failed"; }
  [[ ! -s "$d/check.err" ]] || { cat "$d/check.err"; fail "$arch: the exported config.json warns"; }
  "$bin/xmoec" compile "$d/hf/config.json" -o "$d/hfprog" --no-build >/dev/null 2>"$d/hfcompile.err" ||
    { cat "$d/hfcompile.err"; fail "$arch: xmoec compile of its config.json failed"; }
  "$py" - "$d/prog/config.json" "$d/hfprog/config.json" "$arch" <<'PY' || exit 1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["model_type"] == sys.argv[3], a["model_type"]
skip = {"max_position_embeddings", "_name_or_path"}
diff = sorted(k for k in set(a) | set(b) if k not in skip and a.get(k) != b.get(k))
if diff:
    sys.exit(f"{sys.argv[3]}: config.json from the spec and from the HF config differ in {diff}")
PY
  "$d/prog/train" --data "$data" --init-from "$d/hf" --steps 1 --log "$d/log.jsonl" \
    --progress never --quiet 2>"$d/train.err" || { cat "$d/train.err"; fail "$arch: --init-from failed"; }
  "$d/prog/train" --data "$data" --init-from "$d/hf" --steps 0 --ckpt-dir "$d/c0" \
    --progress never --quiet || fail "$arch: saving the loaded checkpoint failed"
  # Our own export loads back (F32, no MTP copies) with the same first loss.
  "$d/prog/train" --data "$data" --init-from "$d/c0/step-000000" --steps 1 --log "$d/log_back.jsonl" \
    --progress never --quiet || fail "$arch: --init-from of the saved checkpoint failed"
  [[ "$(first_loss "$d/log.jsonl")" == "$(first_loss "$d/log_back.jsonl")" ]] ||
    fail "$arch: the saved checkpoint gives loss $(first_loss "$d/log_back.jsonl"), the source $(first_loss "$d/log.jsonl")"
  trained+=("$arch")
done

# The reference losses, one PyTorch process for every architecture.
"$py" "$src/tests/e2e/hf_layouts.py" loss "$work" "$data" "${trained[@]}" >"$work/ref.json"
"$py" - "$work" "${trained[@]}" <<'PY' || exit 1
import json, os, sys
work, archs = sys.argv[1], sys.argv[2:]
ref = json.load(open(os.path.join(work, "ref.json")))
ok = True
for a in archs:
    log = json.loads(open(os.path.join(work, a, "log.jsonl")).readline())
    r = ref[a]
    rel = abs(log["loss"] - r["loss"]) / abs(r["loss"])
    rel_ce = abs(log["ce_loss"] - r["ce"]) / abs(r["ce"])
    good = rel <= 1e-5 and rel_ce <= 1e-5
    ok = ok and good
    print(f"{a}: first loss ours {log['loss']:.7f} torch {r['loss']:.7f} (rel {rel:.1e}), "
          f"ce rel {rel_ce:.1e}{'' if good else '  FAIL (> 1e-5)'}")
sys.exit(0 if ok else 1)
PY

# Tensor for tensor, and config.json key for key, against the source.
pairs=()
for arch in "${trained[@]}"; do pairs+=("$work/$arch/hf" "$work/$arch/c0/step-000000"); done
"$py" "$src/tests/e2e/hf_layouts.py" compare "${pairs[@]}" || fail "a saved checkpoint differs from its source"

# Refusals: exit code 2 and the tensor or key named.
refuse() {
  local prog=$1 case=$2 want=$3
  local rc=0
  "$prog" --data "$data" --init-from "$work/bad/$case" --steps 1 --progress never --quiet \
    2>"$work/bad/$case.err" || rc=$?
  [[ $rc == 2 ]] || { cat "$work/bad/$case.err"; fail "$case: exit code $rc, expected 2"; }
  grep -qF -- "$want" "$work/bad/$case.err" ||
    { cat "$work/bad/$case.err"; fail "$case: no message with: $want"; }
}
mix="$work/mixtral/prog/train"
refuse "$mix" renamed 'missing tensor "model.layers.1.block_sparse_moe.experts.2.w3.weight"'
refuse "$mix" renamed 'unexpected tensor "model.layers.1.block_sparse_moe.experts.2.w4.weight"'
refuse "$mix" shape 'tensor "model.layers.0.self_attn.k_proj.weight" has shape [8, 32], the program expects [16, 32]'
refuse "$mix" missing 'missing tensor "model.norm.weight"'
refuse "$mix" extra 'unexpected tensor "lm_head.bias"'
refuse "$mix" f64 'tensor "model.layers.1.post_attention_layernorm.weight" has dtype F64, which --init-from does not read'
refuse "$mix" nan 'tensor "model.layers.0.block_sparse_moe.gate.weight" holds a NaN or an infinity (element 0)'
refuse "$mix" config '/num_experts_per_tok: is 3 in the checkpoint, 2 in the compiled program'
refuse "$mix" model_type '/model_type: is "qwen3_moe" in the checkpoint, "mixtral" in the compiled program'
refuse "$mix" rope '/rope_theta: is 10000 in the checkpoint, 1000000 in the compiled program'
refuse "$work/deepseek_v3/prog/train" mtp_copy \
  'tensor "model.layers.2.embed_tokens.weight" should be a copy of "model.embed_tokens.weight"'
rc=0
"$mix" --data "$data" --init-from "$work/mixtral/hf" --resume "$work/mixtral/c0" 2>"$work/both.err" || rc=$?
[[ $rc == 2 ]] && grep -q -- '--init-from: cannot be combined with --resume' "$work/both.err" ||
  { cat "$work/both.err"; fail "--init-from with --resume: exit code $rc"; }
echo "refusals: 11 broken checkpoints and --init-from with --resume exit 2 with the tensor or key named"

# Two ranks: expert parallelism (Mixtral, 2 experts per rank) and tensor
# parallelism (Qwen3-MoE, heads and the q/k norms split) give the first
# loss of one rank.
two_ranks() {
  local arch=$1
  shift
  local d="$work/$arch"
  "$bin/xmoec" compile "$d/spec.json" "$@" -o "$d/prog2" >/dev/null 2>"$d/compile2.err" ||
    { cat "$d/compile2.err"; fail "$arch $*: compile failed"; }
  mpirun -np 2 "$d/prog2/train" --data "$data" --init-from "$d/hf" --steps 1 --log "$d/log2.jsonl" \
    --progress never --quiet || fail "$arch $*: --init-from on 2 ranks failed"
  "$py" - "$d/log.jsonl" "$d/log2.jsonl" "$arch $*" <<'PY' || exit 1
import json, sys
one, two = (json.loads(open(p).readline())["loss"] for p in sys.argv[1:3])
rel = abs(one - two) / abs(one)
print(f"{sys.argv[3]}: first loss 2 ranks {two:.7f}, 1 rank {one:.7f} (rel {rel:.1e})")
sys.exit(0 if rel <= 1e-6 else 1)
PY
}
two_ranks mixtral --dp 2 --ep 2
two_ranks qwen3_moe --tp 2
echo "hf_checkpoints: ok"
