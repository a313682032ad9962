#!/usr/bin/env bash
# tests/e2e/blas_core.sh — out/train runs the OpenBLAS kernels the CPU
# supports without the user knowing about OPENBLAS_CORETYPE
# (runtime/driver/blas_core.h), and its banner says which kernels run:
#
# * an OpenBLAS that detects less than the CPU has (XM_BLAS_TEST_DETECTED
#   stands in for the Xeons Debian's 0.3.21 takes for Prescott): the program
#   re-executes itself with the oldest core of the CPU's level, and that is
#   what the library then runs (the JSON summary's blas_core);
# * the user's OPENBLAS_CORETYPE always wins, even a slower one;
# * started plainly, the kernels are at least the CPU's level.
set -uo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
unset OPENBLAS_CORETYPE XM_NO_REEXEC XM_BLAS_DETECTED
fails=0
fail() {
  echo "FAIL $*"
  fails=$((fails + 1))
}
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$work/text.txt"
"$bin/xmoec" compile "$src/samples/tiny.json" -o "$work/out" >"$work/compile.txt" 2>&1 ||
  { cat "$work/compile.txt"; exit 1; }

flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
if has avx512f && has avx512bw && has avx512dq && has avx512vl; then
  want=SkylakeX level=4
elif has avx2 && has fma; then
  want=Haswell level=3
else
  want="" level=1
fi
echo "CPU level $level, expected pick ${want:-none}"

# run NAME ENV...: one training step; the banner to NAME.err, the summary to NAME.json.
run() {
  local name=$1
  shift
  env "$@" "$work/out/train" --data "$work/text.txt" --steps 1 --progress never --json \
    >"$work/$name.json" 2>"$work/$name.err" || { fail "$name: exit $?"; cat "$work/$name.err"; }
  grep 'BLAS: ' "$work/$name.err" || fail "$name: no BLAS line in the banner"
}
core_of() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["blas_core"])' "$1"; }

if [[ -n "$want" ]]; then
  run detected XM_BLAS_TEST_DETECTED=Prescott
  got=$(core_of "$work/detected.json")
  [[ "${got,,}" == "${want,,}" ]] || fail "detected Prescott: runs $got, want $want"
  grep -q "BLAS: OpenBLAS .*kernels $got (chosen by the program: OpenBLAS detected Prescott" \
    "$work/detected.err" || fail "detected Prescott: the banner does not say who chose $got"
fi

run user OPENBLAS_CORETYPE=Prescott XM_BLAS_TEST_DETECTED=Prescott
got=$(core_of "$work/user.json")
[[ "${got,,}" == prescott ]] || fail "OPENBLAS_CORETYPE=Prescott: runs $got"
grep -q "kernels $got (OPENBLAS_CORETYPE=Prescott)" "$work/user.err" ||
  fail "OPENBLAS_CORETYPE=Prescott: the banner does not credit the user's setting"

run plain
got=$(core_of "$work/plain.json")
case "${got,,}" in
skylakex | cooperlake | sapphirerapids) have=4 ;;
haswell | zen | excavator) have=3 ;;
prescott | core2 | penryn | nehalem | dunnington | atom | unknown) have=1 ;;
*) have=4 ;;
esac
[[ $have -ge $level ]] || fail "started plainly: OpenBLAS runs $got below the CPU's level $level"

[[ $fails -eq 0 ]] && echo "blas_core: all checks passed"
exit $((fails > 0))
