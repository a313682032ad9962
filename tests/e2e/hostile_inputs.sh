#!/usr/bin/env bash
# tests/e2e/hostile_inputs.sh — special files, files over their limit and
# inputs that change under the program, against every reader.
#
# Table-driven: each case runs one command under a timeout and requires its
# exit code (2 for bad input, 1 for a run ended by a changed input; never a
# hang, which the timeout turns into 124, and never a signal, >= 128) and a
# message naming the path. Readers: xmoec check / compile / ir / plan
# (specs, HF configs, clusters, routing files), opt (IR and MLIR text, from
# a file and from stdin), inspect (the out/ folder's files), out/train
# (data files in each format, checkpoints). Special files: a directory, a
# FIFO (must not be waited on), a character device (/dev/zero, endless),
# a sparse file over the size limit. Changing inputs: a token file truncated
# while training runs, and one rewritten in place with ids outside the
# vocabulary and its modification time put back. Outputs: stdout, the log,
# the traffic and trace files on a full disk (/dev/full), an unwritable
# --ckpt-dir found before the first step, a checkpoint save over the
# file-size limit (the previous checkpoint survives).
set -uo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
xmoec="$bin/xmoec"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1 XM_RANKS_PER_NODE=1
cd "$work" || exit 1
fails=0

mkdir dir
mkfifo fifo
truncate -s 65M big.json
truncate -s 1025M big.xir
printf '\x1f\x8b\x08\x00not really gzip' >data.gz
head -c 4000 /dev/urandom >junk.bin
{ printf 'text, then a NUL\0 and more'; } >junk.txt

# expect NAME RC PATTERN COMMAND...: the command's exit code is RC and its
# stderr+stdout match PATTERN (grep -E).
expect() {
  local name=$1 want=$2 pattern=$3
  shift 3
  local out rc
  out=$(timeout 60 "$@" 2>&1 </dev/null)
  rc=$?
  if [[ $rc -ne $want ]] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL $name: exit $rc (want $want), output:"
    tail -n 5 <<<"$out" | sed 's/^/    /'
    fails=$((fails + 1))
  else
    echo "ok   $name: exit $rc: $(grep -E -m1 -- "$pattern" <<<"$out" | cut -c1-150)"
  fi
}

for kind in dir fifo /dev/zero big.json; do
  case $kind in
  dir) why="is a directory" ;;
  big.json) why="larger than the limit of 64 MiB" ;;
  *) why="not a regular file" ;;
  esac
  expect "check $kind" 2 "$kind: .*$why" "$xmoec" check "$kind"
  expect "compile $kind" 2 "$kind: .*$why" "$xmoec" compile "$kind" -o "$work/o" --no-build
  expect "ir $kind" 2 "$kind: .*$why" "$xmoec" ir "$kind"
  expect "plan --cluster $kind" 2 "$kind: .*$why" "$xmoec" plan "$src/samples/tiny.json" --cluster "$kind"
  expect "check --cluster $kind" 2 "$kind: .*$why" "$xmoec" check "$src/samples/tiny.json" --cluster "$kind"
  expect "plan --routing $kind" 2 "$kind: .*$why" "$xmoec" plan "$src/samples/tiny.json" \
    --cluster "$src/samples/clusters/h200-8.json" --routing "$kind"
done
for kind in dir fifo /dev/zero big.xir; do
  case $kind in
  dir) why="is a directory" ;;
  big.xir) why="larger than the limit of 1024 MiB" ;;
  *) why="not a regular file" ;;
  esac
  expect "opt $kind" 2 "$kind: .*$why" "$xmoec" opt "$kind" --pipeline=canonicalize
done
expect "opt - (endless stdin)" 2 "<stdin>: .*larger than the limit of 1024 MiB" \
  bash -c "'$xmoec' opt - --pipeline=canonicalize </dev/zero"

# inspect: the out/ folder's files replaced by special files.
"$xmoec" compile "$src/samples/tiny.json" -o out >/dev/null 2>&1 || { echo "FAIL: compile tiny"; exit 1; }
for f in manifest.json model.xir; do
  cp -r out "in_$f"
  rm "in_$f/$f"
  mkfifo "in_$f/$f"
  expect "inspect with $f a FIFO" 2 "$f: .*not a regular file" "$xmoec" inspect "in_$f"
done

# out/train: data files.
python3 - <<'EOF'
import random, struct
random.seed(1)
n = 200000
ids = [random.randrange(256) for _ in range(n)]
open("tokens.tok", "wb").write(b"XMTOKENS" + struct.pack("<II", 1, 2) + struct.pack("<%dH" % n, *ids))
EOF
train=(out/train --steps 1 --progress never --quiet)
expect "train --data dir" 2 "dir: error: is a directory" "${train[@]}" --data dir
expect "train --data fifo" 2 "fifo: error: not a regular file" "${train[@]}" --data fifo
expect "train --data /dev/zero" 2 "/dev/zero: error: not a regular file" "${train[@]}" --data /dev/zero
expect "train --data gzip" 2 "data.gz: .*gzip file" "${train[@]}" --data data.gz
expect "train --data .bin without .idx" 2 "junk.bin: .*without its .idx" "${train[@]}" --data junk.bin
expect "train --data binary" 2 "junk.txt: error: offset 16: not text" "${train[@]}" --data junk.txt

# out/train: checkpoints whose files are special.
out/train --data tokens.tok --steps 1 --progress never --quiet --ckpt-dir ck >/dev/null 2>&1 ||
  { echo "FAIL: the checkpoint to break"; exit 1; }
step=$(cat ck/latest)
cp -r ck ck_latest && rm ck_latest/latest && mkfifo ck_latest/latest
expect "resume: latest a FIFO" 2 "latest: .*not a regular file" \
  "${train[@]}" --data tokens.tok --resume ck_latest
cp -r ck ck_model && rm "ck_model/$step/model.safetensors" && mkfifo "ck_model/$step/model.safetensors"
expect "resume: model.safetensors a FIFO" 2 "model.safetensors: .*not a regular file" \
  "${train[@]}" --data tokens.tok --resume ck_model

# A NaN in a weight and an infinity in an Adam moment are named at load.
for f in model optimizer; do
  cp -r ck "nan_$f"
  python3 - "nan_$f/$step/$f.safetensors" <<'EOF'
import json, struct, sys
path = sys.argv[1]
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
name = sorted(k for k in hdr if k != "__metadata__" and hdr[k]["dtype"] == "F32")[0]
a, _ = hdr[name]["data_offsets"]
struct.pack_into("<f", raw, 8 + n + a + 4, float("nan") if "model" in path else float("inf"))
open(path, "wb").write(raw)
print(name, file=open(path + ".name", "w"))
EOF
  tname=$(cat "nan_$f/$step/$f.safetensors.name")
  rm "nan_$f/$step/$f.safetensors.name"
  expect "resume: a non-finite value in $f.safetensors" 2 \
    "$f.safetensors: error: $tname: tensor \"$tname\" holds a NaN or an infinity \(element 1\)" \
    "${train[@]}" --data tokens.tok --resume "nan_$f"
done

# Changing data while training runs: wait for the first step in the log,
# then change the file; the run must end with the data's message, exit 1.
change_during_run() { # name how
  local name=$1 how=$2
  cp tokens.tok live.tok
  rm -f live.jsonl
  out/train --data live.tok --steps 100000 --progress never --log live.jsonl >live.out 2>&1 &
  local pid=$!
  for _ in $(seq 1 300); do [[ -s live.jsonl ]] && break; sleep 0.1; done
  case $how in
  truncate) truncate -s 5000 live.tok ;;
  rewrite)
    # ids 65535 everywhere, the size and the modification time kept
    python3 - <<'EOF'
import os
st = os.stat("live.tok")
with open("live.tok", "r+b") as f:
    f.seek(16)
    f.write(b"\xff" * (st.st_size - 16))
os.utime("live.tok", ns=(st.st_atime_ns, st.st_mtime_ns))
EOF
    ;;
  esac
  local rc=0
  timeout 60 tail --pid=$pid -f /dev/null || rc=124
  wait $pid
  local prc=$?
  [[ $rc -eq 0 ]] && rc=$prc
  local pattern
  [[ $how == truncate ]] && pattern="live.tok: the data changed while the program was reading it"
  [[ $how == rewrite ]] && pattern="live.tok: offset [0-9]+: token id outside the vocabulary"
  if [[ $rc -ne 1 ]] || ! grep -qE "$pattern" live.out; then
    echo "FAIL $name: exit $rc (want 1), output:"
    tail -n 5 live.out | sed 's/^/    /'
    fails=$((fails + 1))
  else
    echo "ok   $name: exit $rc: $(grep -E -m1 "$pattern" live.out | cut -c1-150)"
  fi
}
change_during_run "data truncated during training" truncate
change_during_run "data rewritten in place during training" rewrite

# Outputs: every write checked, a failed one ends the program with a
# message and a non-zero exit code (never 0, never a signal), and output
# paths are checked before the first step.
expect "xmoec check >/dev/full" 1 "cannot write to stdout: No space left" \
  bash -c "'$xmoec' check '$src/samples/tiny.json' >/dev/full"
expect "xmoec compile -o unwritable" 2 "/proc/xmoec-nope" \
  "$xmoec" compile "$src/samples/tiny.json" -o /proc/xmoec-nope/out --no-build
expect "train --log /dev/full" 2 "/dev/full: cannot write the log: No space left" \
  "${train[@]}" --data tokens.tok --log /dev/full
expect "train --json >/dev/full" 2 "cannot write the summary to stdout" \
  bash -c "out/train --data tokens.tok --steps 1 --progress never --quiet --json >/dev/full"
"$xmoec" compile "$src/samples/tiny.json" -o out2 --dp 2 --ep 2 >/dev/null 2>&1 ||
  { echo "FAIL: compile tiny for 2 ranks"; exit 1; }
expect "train --traffic /dev/full (2 ranks)" 2 "/dev/full: cannot write the traffic file" \
  mpirun --oversubscribe -np 2 out2/train --data tokens.tok --steps 1 --progress never --quiet \
  --traffic /dev/full
expect "train --trace /dev/full" 2 "/dev/full: cannot write the trace" \
  "${train[@]}" --data tokens.tok --trace /dev/full
expect "train --ckpt-dir unwritable, before the first step" 2 \
  "/proc/xmoec-nope: cannot create the directory" \
  out/train --data tokens.tok --steps 3 --progress never --log early.jsonl \
  --ckpt-dir /proc/xmoec-nope/ck
if [[ -s early.jsonl ]]; then
  echo "FAIL --ckpt-dir unwritable: steps were trained before the error"
  fails=$((fails + 1))
fi
# A checkpoint save over the file-size limit (ulimit -f, 20 MB): exit 2 with
# the message, no SIGXFSZ, and the previous checkpoint survives as latest.
out/train --data tokens.tok --steps 1 --progress never --quiet --ckpt-dir ck_keep >/dev/null 2>&1 ||
  { echo "FAIL: the checkpoint to keep"; fails=$((fails + 1)); }
expect "save over the file-size limit" 2 "write failed: File too large" \
  bash -c "ulimit -f 20000; out/train --data tokens.tok --steps 2 --progress never --quiet \
    --resume ck_keep --ckpt-dir ck_keep"
if [[ "$(cat ck_keep/latest 2>/dev/null)" != step-000001 ]] || ls -d ck_keep/*.tmp* >/dev/null 2>&1; then
  echo "FAIL the previous checkpoint: latest is '$(cat ck_keep/latest 2>/dev/null)', left: $(ls ck_keep)"
  fails=$((fails + 1))
else
  expect "the previous checkpoint resumes" 0 "nothing to train" \
    out/train --data tokens.tok --steps 1 --progress never --resume ck_keep
fi

if [[ $fails -ne 0 ]]; then
  echo "$fails case(s) failed"
  exit 1
fi
echo "all hostile-input cases passed"
