#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, with clang, AddressSanitizer and UBSan, in build-fuzz/) and
# runs each for a while from the seed corpus. New inputs go to a scratch directory, not the tree.
# Exit 0 when no fuzzer found a crash; a crash leaves its input in build-fuzz/crashes/.
#
#   bash scripts/fuzz.sh                  # 30 s per target (the test command's short run)
#   bash scripts/fuzz.sh --seconds 1800   # a long run; prints each target's execution count
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=30
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fuzz: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
targets=(fuzz_wire_decoder fuzz_tcp_receive fuzz_control_decoder fuzz_negotiation_decoder
  fuzz_checkpoint_decoder fuzz_row_sparse_decoder)

# Without CUDA: the decoders never see device memory, and the sanitizers should not meet nvcc's
# objects.
CXX=clang++ CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_FUZZ=ON \
  -DDTRAIN_BUILD_TESTS=OFF -DDTRAIN_BUILD_BENCH=OFF -DDTRAIN_CUDA=OFF >/dev/null
# Quiet unless it fails: ninja prints compile and link errors on stdout.
ninja -C build-fuzz "${targets[@]}" >build-fuzz/build.log 2>&1 ||
  { echo "fuzz: building the fuzzers failed:" >&2; tail -n 40 build-fuzz/build.log >&2; exit 1; }

scratch=$(mktemp -d /tmp/dtrain-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
mkdir -p build-fuzz/crashes
rc=0
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  log=$scratch/$t.log
  if build-fuzz/fuzz/"$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix=build-fuzz/crashes/"$t"- "$scratch/$t" fuzz/corpus >"$log" 2>&1; then
    runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1 | cut -d' ' -f2)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    echo "fuzz: $t: ${runs:-?} inputs in ${seconds} s, no failure (coverage ${cov:-?} edges)"
  else
    echo "fuzz: $t FAILED; its input is in build-fuzz/crashes/:" >&2
    tail -n 40 "$log" >&2
    rc=1
  fi
done
exit "$rc"
