#!/usr/bin/env bash
# Run pytest node ids N times in a row and count passes and failures; stop at the first hang and show its output.
#
#   scripts/repeat_tests.sh N [-t SECONDS] [-l LOGDIR] -- PYTEST ARGS...
#   scripts/repeat_tests.sh 20 -- tests/train/test_training.py -k two_ranks
#
# A run is a hang when it outlives -t seconds (default 900; it is then killed) or when its output reports a timeout
# (the test harness gives up after 300 s and says "did not finish within"). Failures that are not hangs are counted
# and the loop goes on. Every run's output is kept in LOGDIR (default: a new folder under /tmp).
# Exit status: 0 all passed, 1 some failed, 2 stopped at a hang.
set -u

usage() { echo "usage: $0 N [-t SECONDS] [-l LOGDIR] -- PYTEST ARGS..." >&2; exit 64; }
[ $# -ge 1 ] || usage
n=$1; shift
case $n in ''|*[!0-9]*) usage ;; esac
limit=900
logdir=""
while [ $# -gt 0 ]; do
  case $1 in
    -t) limit=$2; shift 2 ;;
    -l) logdir=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[ $# -ge 1 ] || usage
[ -n "$logdir" ] || logdir=$(mktemp -d /tmp/repeat_tests.XXXXXX)
mkdir -p "$logdir"
python=${PYTHON:-python}

passed=0; failed=0
for i in $(seq 1 "$n"); do
  log="$logdir/run$i.log"
  start=$(date +%s)
  timeout -k 30 "$limit" "$python" -m pytest -q -p no:cacheprovider "$@" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  if [ $rc -eq 124 ] || [ $rc -eq 137 ] || grep -qE "did not finish within|condition not reached within" "$log"; then
    echo "run $i/$n: HANG after ${secs} s (rc $rc); output ($log):"
    tail -n 80 "$log"
    echo "passed $passed, failed $failed, hung 1 of $i runs (stopped at the hang)"
    exit 2
  elif [ $rc -eq 0 ]; then
    passed=$((passed + 1))
    echo "run $i/$n: pass in ${secs} s ($(tail -n 1 "$log"))"
  else
    failed=$((failed + 1))
    echo "run $i/$n: FAIL (rc $rc) in ${secs} s; output: $log"
    grep -E "^(FAILED|ERROR)" "$log" | head -n 5
  fi
done
echo "passed $passed, failed $failed of $n runs (logs: $logdir)"
[ $failed -eq 0 ]
