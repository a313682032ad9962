#!/usr/bin/env bash
# scripts/test.sh — the test command of xmoec (README.md: `bash scripts/test.sh`).
#
# Phases, each timed and reported in a summary at the end:
#   setup          scripts/setup.sh (Debian packages; quiet when present)
#   release        gcc, RelWithDebInfo, -Werror, in build/; then ctest
#   sanitize       clang-19 with AddressSanitizer + UBSan and the libFuzzer
#                  harnesses (XM_SANITIZE=ON, XM_FUZZ=ON) in build-san/; then
#                  ctest, which also runs each fuzzer over its seed corpus
# A failing phase does not stop the later ones (a sanitizer report is worth
# having even when a release test fails); the exit status is non-zero if
# anything failed. Paths are relative to the repository that holds this
# script, so it runs from any directory and from a fresh clone.
#
# Options: --quick      release build and tests only
#          --no-setup   skip scripts/setup.sh
# Environment: XM_JOBS (parallel jobs, default 2).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1

quick=0
setup=1
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --no-setup) setup=0 ;;
    -h|--help)
      sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0 ;;
    *) echo "test.sh: unknown option '$arg' (use --quick, --no-setup)" >&2; exit 2 ;;
  esac
done
jobs=${XM_JOBS:-2}

# LeakSanitizer: leaks that live in third-party global state (Open MPI's
# runtime) are suppressed by the library's entry points (tests/lsan.supp); a
# leak in xmoec's own code is never suppressed. The MPI tests need full
# malloc stacks for the suppressions to match (Open MPI is built without
# frame pointers), which is slow, so only they (test_mpi_*, and the e2e_*
# scripts that start mpirun) get the slow unwinder.
lsan_base="suppressions=$root/tests/lsan.supp:print_suppressions=0"
export LSAN_OPTIONS="$lsan_base"
# Open MPI as root on a small box (ctest sets these for its tests too).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader

summary=()
failed=0
log_dir="$root/build-logs"
mkdir -p "$log_dir"

# run_phase NAME COMMAND...: runs a phase, records its status and time.
run_phase() {
  local name=$1
  shift
  echo
  echo "=== $name: $*"
  local start=$SECONDS
  "$@"
  local rc=$?
  local secs=$((SECONDS - start))
  local what="ok"
  if [[ $rc -ne 0 ]]; then
    what="FAILED (exit $rc)"
    failed=1
  fi
  summary+=("$(printf '%-18s %-18s %4ds' "$name" "$what" "$secs")")
  return $rc
}

# failed_tests DIR: names of the tests that failed in the last ctest run.
failed_tests() {
  local f="$1/Testing/Temporary/LastTestsFailed.log"
  [[ -s "$f" ]] && cut -d: -f2- "$f" | tr '\n' ' '
}

# build_*: exit 3 when cmake cannot configure (no tests to run then), else
# the build's status.
build_release() {
  CC=gcc CXX=g++ cmake -S "$root" -B "$root/build" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXM_WERROR=ON >"$log_dir/release-cmake.log" 2>&1 \
    || { cat "$log_dir/release-cmake.log"; return 3; }
  cmake --build "$root/build" -j "$jobs" -- -k
}

build_sanitize() {
  CC=clang-19 CXX=clang++-19 cmake -S "$root" -B "$root/build-san" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXM_WERROR=ON -DXM_SANITIZE=ON -DXM_FUZZ=ON \
    >"$log_dir/san-cmake.log" 2>&1 \
    || { cat "$log_dir/san-cmake.log"; return 3; }
  cmake --build "$root/build-san" -j "$jobs" -- -k
}

run_ctest() {
  (cd "$1" && ctest --output-on-failure -j "$jobs")
}

# The sanitizer tests in two runs: tests that start MPI with the slow
# unwinder, the rest without. ctest keeps only the last run's failures in LastTestsFailed.log,
# so they are collected after each run.
san_failures=""
mpi_tests='^(test_mpi_|test_mpi4_|e2e_)'
run_san_ctest() {
  local rc=0
  (cd "$root/build-san" && ctest --output-on-failure -j "$jobs" -E "$mpi_tests") || rc=1
  [[ $rc -ne 0 ]] && san_failures+=$(failed_tests "$root/build-san")
  (cd "$root/build-san" &&
     LSAN_OPTIONS="$lsan_base:fast_unwind_on_malloc=0" \
       ctest --output-on-failure -j "$jobs" -R "$mpi_tests" --no-tests=ignore) || {
    rc=1
    san_failures+=$(failed_tests "$root/build-san")
  }
  return $rc
}

total_start=$SECONDS
if [[ $setup -eq 1 ]]; then
  run_phase setup bash "$root/scripts/setup.sh"
fi

# A build that fails part-way still runs the tests of what did build (make
# -k): the summary then names every failing test, not only the first error.
release_failures=""
run_phase release-build build_release
if [[ $? -ne 3 ]]; then
  run_phase release-test run_ctest "$root/build" || release_failures=$(failed_tests "$root/build")
fi

if [[ $quick -eq 0 ]]; then
  run_phase sanitize-build build_sanitize
  if [[ $? -ne 3 ]]; then
    run_phase sanitize-test run_san_ctest
  fi
fi

echo
echo "=== summary ($((SECONDS - total_start))s)"
for line in "${summary[@]}"; do echo "  $line"; done
[[ -n "$release_failures" ]] && echo "  release failures:  $release_failures"
[[ -n "$san_failures" ]] && echo "  sanitize failures: $san_failures"
if [[ $failed -ne 0 ]]; then
  echo "test.sh: FAILED"
  exit 1
fi
echo "test.sh: all passed"
