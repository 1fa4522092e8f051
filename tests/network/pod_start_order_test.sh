#!/usr/bin/env bash
# A 2-worker, 1-server dist_sync job started under Kubeflow MXJob's contract, its scheduler's pod
# last: the environment kubeflow/training-operator gives each pod (pkg/controller.v1/mxnet/pod.go,
# SetClusterSpec: MX_CONFIG's JSON, and from it DMLC_PS_ROOT_PORT, DMLC_PS_ROOT_URI as the
# scheduler Service's bare name, DMLC_NUM_SERVER, DMLC_NUM_WORKER, DMLC_ROLE,
# DMLC_USE_KUBERNETES=1, DMLC_WORKER_ID for workers; no DMLC_NODE_HOST), the job secret as a
# Secret would put it there, and names resolved as cluster DNS resolves a headless Service's:
# only once its pod is Ready.
#
#   pod_start_order_test.sh CASE BUILD_DIR
#
# CASE: mxjob (every variable the operator sets) or mx-config-only (MX_CONFIG alone, as a pod
# template that drops the plain variables would give: dtrain reads the layout from the JSON), each
# with kv_check_worker's 200 exact rounds; mxjob-python: every variable, and the workers run MXNet's
# kvstore checks through the Python API (tests/python/programs/kv_worker.py dist_sync: init, push,
# pull, pushpull, big arrays split across servers, exact values).
#
# Two emulated hosts (network namespaces): the server's and the workers' pods on B, whose hosts
# file (/etc/netns/B/hosts, which `ip netns exec` mounts over /etc/hosts) does not know the
# scheduler's name; 4 s later the scheduler starts on A and its name is added to B's hosts file.
# The server and workers must keep retrying the name (one log line each), then train: every
# round exact, every process exit 0. Exit 77 (skipped) where namespaces cannot be made.
set -euo pipefail

case_name=$1
build=$2
[[ $case_name == mxjob || $case_name == mx-config-only || $case_name == mxjob-python ]] ||
  { echo "pod_start_order_test: unknown case $case_name" >&2; exit 2; }
dtrain=$build/src/tools/dtrain
worker_bin=$build/tests/programs/kv_check_worker

skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root for ip netns"
command -v ip >/dev/null || skip "needs iproute2 (ip)"

source "$(dirname "$0")/../../scripts/netns.sh"
make_host_pair po 79 pod_start_order ||
  skip "cannot create network namespaces joined by a veth pair here"
mkdir -p "/etc/netns/$a" "/etc/netns/$b"  # deleted with the namespaces (delete_netns)
scheduler_name=mxjob-demo-scheduler-0
printf '127.0.0.1 localhost\n%s %s\n' "$addr_a" "$scheduler_name" >"/etc/netns/$a/hosts"
printf '127.0.0.1 localhost\n' >"/etc/netns/$b/hosts"
# Names come from the hosts files only, so that an unknown one is "no such name" at once, as
# cluster DNS answers for a pod that is not Ready (NXDOMAIN), not a resolver that times out.
printf 'hosts: files\n' | tee "/etc/netns/$a/nsswitch.conf" >"/etc/netns/$b/nsswitch.conf"
if ip netns exec "$b" getent hosts "$scheduler_name" >/dev/null; then
  skip "the scheduler's name resolves in B before its hosts file has it (a DNS server answers?)"
fi

port=$((20000 + RANDOM % 20000))
mx_config() {  # TYPE INDEX: the JSON the operator writes for that replica (its field order)
  local url=mxjob-demo
  printf '{"cluster":{"scheduler":[{"url":"%s-scheduler-0","port":%d}],' "$url" "$port"
  printf '"server":[{"url":"%s-server-0","port":%d}],' "$url" "$port"
  printf '"worker":[{"url":"%s-worker-0","port":%d},{"url":"%s-worker-1","port":%d}]},' \
    "$url" "$port" "$url" "$port"
  printf '"labels":{"scheduler":"","server":"","worker":""},"task":{"type":"%s","index":%d}}' \
    "$1" "$2"
}
pids=()
names=()
start() {  # NS TYPE INDEX NAME CMD...
  local ns=$1 type=$2 index=$3 name=$4 pod_env
  shift 4
  pod_env=(MX_CONFIG="$(mx_config "$type" "$index")"
           DTRAIN_JOB_SECRET=pod-start-order-test-secret-0123456789)
  if [[ $case_name != mx-config-only ]]; then
    pod_env+=(DMLC_PS_ROOT_PORT=$port DMLC_PS_ROOT_URI=$scheduler_name DMLC_NUM_SERVER=1
              DMLC_NUM_WORKER=2 DMLC_ROLE=$type DMLC_USE_KUBERNETES=1)
    [[ $type != worker ]] || pod_env+=(DMLC_WORKER_ID=$index)
  fi
  ip netns exec "$ns" env -i PATH="$PATH" PYTHONPATH="$build/python" "${pod_env[@]}" OMP_NUM_THREADS=1 \
    timeout 120 "$@" >"$logs/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
}
soak=("$worker_bin" --scenario sync --rounds 200 --sizes 1,1000,100000)
[[ $case_name != mxjob-python ]] ||
  soak=(/usr/bin/python3 "$(dirname "$0")/../python/programs/kv_worker.py" dist_sync)
start "$b" server 0 server0 "$dtrain" server
start "$b" worker 0 worker0 "${soak[@]}"
start "$b" worker 1 worker1 "${soak[@]}"
sleep 4  # the scheduler's pod is still Pending: its name does not resolve on B
start "$a" scheduler 0 scheduler "$dtrain" scheduler
printf '%s %s\n' "$addr_a" "$scheduler_name" >>"/etc/netns/$b/hosts"  # Ready: DNS answers

wait_for_named_pids
echo "pod_start_order $case_name: exit codes ${codes[*]}"
fail() {
  echo "pod_start_order_test $case_name: $*" >&2
  for f in "$logs"/*.log; do echo "--- $(basename "$f")"; tail -n 15 "$f"; done >&2
  exit 1
}
for c in "${codes[@]}"; do [[ ${c#*=} == 0 ]] || fail "$c (every process must exit 0)"; done
for w in worker0 worker1; do
  grep -q "sync OK\|kv_worker OK rank" "$logs/$w.log" || fail "$w did not report every check exact"
  grep -q "cannot resolve '$scheduler_name'.*retrying" "$logs/$w.log" ||
    fail "$w never met the unresolvable name: the test did not test the start order"
done
echo "pod_start_order $case_name: the server and workers waited for the scheduler's name, then trained"
