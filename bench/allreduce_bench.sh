#!/usr/bin/env bash
# Allreduce: plain MPI_Allreduce and plain Gloo (every algorithm; dtrain's default, shared memory
# between the ranks of one host, and the same over loopback TCP) against the dtrain engine on
# each, 4 KB .. 256 MB, plus 100 x 64 KB tensors through the engine vs 100 plain calls. Prints the
# JSON lines as they come, then a table with the engine/plain ratios.
#
#   bash bench/allreduce_bench.sh                  # 2 ranks
#   bash bench/allreduce_bench.sh -n 4             # 4 ranks
#   bash bench/allreduce_bench.sh --max-mb 64      # extra flags go to allreduce_bench
#   BUILD_DIR=build-coll bash bench/allreduce_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
ranks=2
if [[ ${1:-} == -n ]]; then ranks=$2; shift 2; fi
[[ -x $build/bench/allreduce_bench ]] || ninja -C "$build" allreduce_bench
bench=$build/bench/allreduce_bench
results=$(mktemp)
trap 'rm -f "$results"' EXIT

# MPI: mpirun as in tests/collectives (root in a container, more ranks than cores). Shared memory
# copies large messages once through CMA where the container allows it (ptrace); else vader
# falls back to two copies, which is slower: probe, and turn CMA off only if it fails.
mpi() { mpirun --allow-run-as-root --oversubscribe -np "$ranks" "$@"; }
if ! DTRAIN_COLLECTIVES=mpi mpi "$bench" --phases mpi_allreduce --min-kb 4096 --max-mb 4 \
  --repeats 1 --seconds-per-case 0.01 >/dev/null 2>&1; then
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
fi
DTRAIN_COLLECTIVES=mpi mpi "$bench" "$@" | tee -a "$results"
# The same over TCP only, the transport Gloo has (no shared memory).
DTRAIN_COLLECTIVES=mpi mpi --mca btl tcp,self "$bench" --phases mpi_allreduce --label tcp "$@" |
  tee -a "$results"

# Gloo: N processes, rank 0 hosts the rendezvous. Only rank 0 prints results.
gloo() {
  local port pids=() status=0
  port=$("$bench" --free-port)
  for ((r = 1; r < ranks; r++)); do
    DTRAIN_COLLECTIVES=gloo DTRAIN_NODE_RANK=$r DMLC_NUM_WORKER=$ranks DMLC_PS_ROOT_URI=127.0.0.1 \
      DMLC_PS_ROOT_PORT=$port "$bench" "$@" &
    pids+=($!)
  done
  DTRAIN_COLLECTIVES=gloo DTRAIN_NODE_RANK=0 DMLC_NUM_WORKER=$ranks DMLC_PS_ROOT_URI=127.0.0.1 \
    DMLC_PS_ROOT_PORT=$port "$bench" "$@" || status=$?
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  return $status
}
for algorithm in ring ring_chunked halving_doubling bcube; do
  DTRAIN_GLOO_ALGORITHM=$algorithm gloo --phases plain "$@" | tee -a "$results"
done
# Every rank on this host: dtrain's gloo backend exchanges through shared memory by default
# (src/collectives/gloo/shm_group.h); the same over gloo's loopback TCP, labelled "tcp".
gloo --phases plain,engine,fusion "$@" | tee -a "$results"
DTRAIN_GLOO_SHM=0 gloo --phases plain,engine,fusion --label tcp "$@" | tee -a "$results"

"$bench" --table "$results"
