#!/usr/bin/env bash
# tests/e2e/ckpt_crash.sh — a save killed at each point of its sequence
# leaves a checkpoint directory that resumes, with the losses of a run that
# was never interrupted (docs/checkpoints.md, Atomic saves).
#
# The crash is injected with the test-only XM_CKPT_CRASH=POINT
# (runtime/io/checkpoint.h: the process ends there with exit code 137,
# nothing cleaned up, as SIGKILL would leave it):
#   - a new step directory (step 2 saved beside step 1): model-written
#     (only the model file in D.tmp-P), written (D.tmp-P complete, not yet
#     in place), latest (D in place, `latest` still naming step 1);
#   - an existing directory saved again (step 1 re-saved at the end of a run
#     with nothing to train): written, exchanged (after RENAME_EXCHANGE,
#     the old checkpoint in D.tmp-P), and on the two-rename path
#     (XM_CKPT_RENAME_EXCHANGE=0) aside (D.old-P and D.tmp-P, no D) and
#     placed (D and D.old-P).
# After each crash the directory must hold the state the docs' table says,
# a resume must train step 2 with exactly the loss of the uninterrupted
# run, and a save of the same step again must leave no leftovers.
set -uo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1
unset XM_RANKS_PER_NODE XM_CKPT_CRASH XM_CKPT_RENAME_EXCHANGE
cd "$work" || exit 1
fails=0
fail() {
  echo "FAIL $*"
  fails=$((fails + 1))
}
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >text.txt
"$bin/xmoec" compile "$src/samples/tiny.json" -o out >compile.txt 2>&1 || { cat compile.txt; exit 1; }
train=(out/train --data text.txt --progress never --quiet)

# The uninterrupted reference, and the step-1 checkpoint every case starts from.
"${train[@]}" --steps 2 --log ref.jsonl >/dev/null 2>&1 || { echo "FAIL: the reference run"; exit 1; }
"${train[@]}" --steps 1 --ckpt-dir base >/dev/null 2>&1 || { echo "FAIL: the base checkpoint"; exit 1; }
ref=$(python3 -c 'import json,sys; print(repr([json.loads(l) for l in open("ref.jsonl")][1]["loss"]))')

# state DIR: the names in DIR, with pids replaced by P, sorted, one line.
state() { (cd "$1" && ls -A | sed -E 's/\.(tmp|old)-[0-9]+$/.\1-P/' | sort | tr '\n' ' '); }

# resume_ok NAME DIR: a resume trains step 2 with the reference's loss.
resume_ok() { # name dir
  local name=$1 dir=$2 out
  out=$("${train[@]}" --steps 2 --resume "$dir" --log "$name.jsonl" 2>&1)
  local rc=$?
  local got
  got=$(python3 -c 'import json,sys
rows=[json.loads(l) for l in open(sys.argv[1])]
print(repr(rows[-1]["loss"]) if rows and rows[-1]["step"] == 2 else "none")' "$name.jsonl" 2>/dev/null)
  if [[ $rc -ne 0 || "$got" != "$ref" ]]; then
    fail "$name: resume exit $rc, step-2 loss $got (want $ref)"
    tail -n 4 <<<"$out" | sed 's/^/    /'
    return 1
  fi
  echo "ok   $name: resumed, step 2 loss $got as uninterrupted${out:+ ($(grep -m1 -o 'reading .*save' <<<"$out"))}"
}

crash() { # name point dir [env...] -- the save that crashes
  local name=$1 point=$2 dir=$3 steps=$4
  shift 4
  env "$@" XM_CKPT_CRASH="$point" "${train[@]}" --steps "$steps" --resume "$dir" --ckpt-dir "$dir" \
    >"$name.crash.out" 2>&1
  local rc=$?
  [[ $rc -eq 137 ]] || { fail "$name: the save did not stop at '$point' (exit $rc)"; cat "$name.crash.out"; }
}

# ---- a new step directory -----------------------------------------------
for point in model-written written latest; do
  name="new-$point"
  cp -r base "$name"
  crash "$name" "$point" "$name" 2
  s=$(state "$name")
  case $point in
  model-written | written) want="latest step-000001 step-000002.tmp-P " ;;
  latest) want="latest latest.tmp step-000001 step-000002 " ;;
  esac
  [[ "$s" == "$want" ]] || fail "$name: left '$s', want '$want'"
  [[ "$(cat "$name/latest")" == step-000001 ]] || fail "$name: latest is $(cat "$name/latest")"
  resume_ok "$name" "$name"
done

# ---- an existing directory saved again ----------------------------------
cases=("written written" "exchanged exchanged" "aside aside XM_CKPT_RENAME_EXCHANGE=0"
  "placed placed XM_CKPT_RENAME_EXCHANGE=0" "written-2r written XM_CKPT_RENAME_EXCHANGE=0")
for c in "${cases[@]}"; do
  read -r tag point env <<<"$c"
  name="again-$tag"
  cp -r base "$name"
  crash "$name" "$point" "$name" 1 ${env:+$env}
  s=$(state "$name")
  case $point in
  written | exchanged) want="latest step-000001 step-000001.tmp-P " ;;
  aside) want="latest step-000001.old-P step-000001.tmp-P " ;;
  placed) want="latest step-000001 step-000001.old-P " ;;
  esac
  [[ "$s" == "$want" ]] || fail "$name: left '$s', want '$want'"
  resume_ok "$name" "$name"
  # The next save of the same step finishes or discards what the crash left.
  "${train[@]}" --steps 1 --resume "$name" --ckpt-dir "$name" >/dev/null 2>&1 ||
    fail "$name: the next save of step 1 failed"
  s=$(state "$name")
  [[ "$s" == "latest step-000001 " ]] || fail "$name: after the next save: '$s'"
done

if [[ $fails -ne 0 ]]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "every interrupted save resumes"
