#!/usr/bin/env bash
# Scaling across hosts on an emulated cluster: H hosts are network namespaces on one bridge, each
# with a real sshd, a hostname of its own (cbh0, cbh1, ...) and its link shaped with tc (token
# bucket, both directions) to --link-mbit.
# Each case is one job started by dtrain's own launcher over ssh, its workers running
# bench/step_bench (real layer shapes of --model scaled by --scale, compute emulated by sleeping
# --compute-ms per step). One JSON line per case:
#   mode, workers, servers, link_mbit, model, compute_ms, step_ms, bound_ms, samples_per_s,
#   efficiency, cpu_busy (this machine's CPU busy share during the case)
# Modes, for N in --workers:
#   wire                 the links themselves (bench/link_probe.py): each of N hosts sends a TCP
#                        stream to the next for 3 s; achieved_mbit is the slowest receiver's rate,
#                        the physical bound (one line, N >= 2)
#   dist_sync_colocated  S = N servers, one server and one worker per host (N hosts)
#   dist_sync_1server    one server on a host of its own (N + 1 hosts)
#   dist_sync_separate   S = N servers on hosts of their own (2N hosts)
#   dist_sync_2to1       S = 2N servers on hosts of their own (3N hosts; the seed's 2:1 case)
#   horovod_gloo         allreduce over Gloo (-s 0, N hosts)
#   horovod_mpi          allreduce over Open MPI (TCP), started by dtrain launch --launcher mpi
#                        (mpirun reaching the hosts through the same ssh; N hosts)
#   ddp                  PyTorch DistributedDataParallel over gloo on the same emulated step
#                        (bench/ddp_step.py; N hosts)
#   hvd_step_dtrain      Horovod's API from Python (DistributedOptimizer, bench/hvd_step.py) on
#                        the same step: dtrain's, over Gloo (dtrain launch -s 0; N hosts)
#   hvd_step_horovod     the same script on real Horovod 0.28.1 over Gloo (horovodrun --gloo, its
#                        ssh through this cluster's; bench/horovod_venv.sh builds it; N hosts)
#   hvd_step_dtrain_mpi, hvd_step_horovod_mpi   the same two over Open MPI (TCP; mpirun)
#   hvd_allreduce_dtrain, hvd_allreduce_horovod, and their _mpi   bench/horovod_rank.py's allreduce
#                        loop (--allreduce-kb sizes, --steps calls each) instead of the step: one
#                        line per size with median_ms and link_ms, a ring's bytes through a link
#                        (2 (N-1)/N of the tensor) at --link-mbit; wire_ms at the rate the `wire`
#                        mode reached, when it ran first
#   hvd_mnist_dtrain, hvd_mnist_horovod, and their _mpi   real training, not emulated: the
#                        MNIST example (examples/python/horovod_mnist.py, Fashion-MNIST, batch 32 a
#                        rank; for Horovod only its import line switched), --mnist-batches batches
#                        of one epoch and the test set, with every threshold at its default (the
#                        model is real, not scaled); samples_per_s sums the ranks' rates, and
#                        test_acc is the ranks' average. The CPU of this one machine bounds these
#   train_lenet          real training, not emulated: dtrain-train, LeNet on Fashion-MNIST, one
#   train_mlp            epoch (--train-batch per worker), dist_sync with S = N, a server on each
#                        worker's host; prints samples_per_s (all workers) and test_acc. The CPU
#                        of this one machine, shared by every host, bounds these
# bound_ms is step_bench's: the larger of the compute and the bytes through the busiest link at
# the link's rate (bench/step_bench.cc says how, per layout). ideal_ms (colocated and allreduce
# modes) is bench/ideal_step.py's: the step on an ideal network with priority. Unlike bound_ms it
# counts that backward produces last the gradients the next forward needs first. fair_ms is the
# same model's step with no priority on the links (every layer in flight an equal share): where
# compute and communication are about equal, measured steps come near it, not ideal_ms. batch_ms
# (allreduce modes) is the same model's step for the allreduce engine: whole fused batches at the
# fusion threshold, one at a time, no interruption, nothing else lost.
# The size thresholds that decide how keys are placed and cut scale with the model, so that the
# scaled model is placed as the full one would be: MXNET_KVSTORE_BIGARRAY_BOUND (10^6 elements),
# DTRAIN_PARTITION_BYTES (512 KiB) and DTRAIN_CHUNK_BYTES (4 MiB), each times --scale; so do the
# allreduce modes' DTRAIN_MPI_RING_BYTES (1 MiB) and HOROVOD_FUSION_THRESHOLD, from 10 MiB (not
# Horovod's 64 MiB: a smaller fusion buffer lets the first layers' gradients overtake the backlog
# sooner; docs/performance.md).
#
#   bash bench/cluster_bench.sh                  # every mode, N = 1 2 4 8 (needs root)
#   bash bench/cluster_bench.sh --quick          # N = 1 2 4: dist_sync_colocated, horovod_gloo, ddp
#   bash bench/cluster_bench.sh --workers "2 4" --modes horovod_gloo --link-mbit 500
#   bash bench/cluster_bench.sh --no-overlap --env DTRAIN_TCP_NOTSENT_LOWAT:0   # A/B a feature
# --env NAME:VALUE (repeatable) goes to every process of every job; --sysctl NAME=VALUE
# (repeatable) is set in every host's namespace (net.* settings are per namespace);
# --ranks-per-host R puts R workers on each host in the allreduce modes (horovod_gloo, horovod_mpi,
# ddp: N / R hosts, for N a multiple of R), as with several accelerators a machine; dtrain's Gloo
# ranks of one host then share memory and only one per host uses the link (host_groups.h); the
# other modes keep one worker a host. bound_ms counts the hosts, not the workers.
# --no-overlap makes each step wait for all of its values before the next forward (step_bench
# --no-overlap); --queue-ms sets the tc queue of each link (100 ms).
# --tcp-sndbuf BYTES|auto sets DTRAIN_TCP_SNDBUF for every job (0: the kernel's autotuning); the
# default, auto, is dtrain's: each connection to another host sizes its send buffer from its own
# rate and round trip (docs/performance.md: short tc queues, so that priority works). Each line
# says which (tcp_sndbuf).
#
# Everything it makes (namespaces, bridge, sshds, jobs) is removed on every exit path, Ctrl-C
# included.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
workers_list="1 2 4 8"
modes="wire dist_sync_colocated dist_sync_1server dist_sync_separate dist_sync_2to1 horovod_gloo horovod_mpi
  ddp train_lenet train_mlp"
link_mbit=200
queue_ms=100
model=resnet50
scale=0.1
compute_ms=200
steps=5
allreduce_kb=4,1024,16384
mnist_batches=300
wire_mbit=""  # the wire mode's slowest receiver, once it has run
train_batch=64
extra_env=()
sysctls=()
overlap=--overlap
tcp_sndbuf=auto
ranks_per_host=1
while (($#)); do
  case "$1" in
    --quick) workers_list="1 2 4"; modes="wire dist_sync_colocated horovod_gloo ddp"; shift ;;
    --workers) workers_list=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --link-mbit) link_mbit=$2; shift 2 ;;
    --queue-ms) queue_ms=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --scale) scale=$2; shift 2 ;;
    --compute-ms) compute_ms=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --allreduce-kb) allreduce_kb=$2; shift 2 ;;
    --mnist-batches) mnist_batches=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --env) extra_env+=(--env "$2"); shift 2 ;;
    --sysctl) sysctls+=("$2"); shift 2 ;;
    --train-batch) train_batch=$2; shift 2 ;;
    --no-overlap) overlap=--no-overlap; shift ;;
    --tcp-sndbuf) tcp_sndbuf=$2; shift 2 ;;
    --ranks-per-host) ranks_per_host=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cluster_bench: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "cluster_bench: needs root (ip netns, tc, sshd)" >&2; exit 2; }
for tool in ip tc ssh ssh-keygen /usr/sbin/sshd; do
  command -v "$tool" >/dev/null || { echo "cluster_bench: $tool is missing" >&2; exit 2; }
done
[[ $build == /* ]] || build=$PWD/$build
dtrain=$build/src/tools/dtrain
step_bench=$build/bench/step_bench
for bin in "$dtrain" "$step_bench"; do
  [[ -x $bin ]] || { echo "cluster_bench: $bin is missing: bash scripts/build.sh" >&2; exit 2; }
done

max_hosts=0
for n in $workers_list; do
  hosts_for_n=$((2 * n))
  [[ " $modes " == *" dist_sync_2to1 "* ]] && hosts_for_n=$((3 * n))
  ((hosts_for_n > max_hosts)) && max_hosts=$hosts_for_n
done
[[ $ranks_per_host =~ ^[1-9][0-9]*$ ]] || { echo "cluster_bench: --ranks-per-host takes a positive number" >&2; exit 2; }
[[ $tcp_sndbuf =~ ^([0-9]+|auto)$ ]] || { echo "cluster_bench: --tcp-sndbuf takes bytes or auto" >&2; exit 2; }
scaled() { awk -v v="$1" -v s="$scale" -v least="$2" 'BEGIN { x = int(v * s); print (x < least ? least : x) }'; }
thresholds=(--env "MXNET_KVSTORE_BIGARRAY_BOUND:$(scaled 1000000 1)"
  --env "DTRAIN_PARTITION_BYTES:$(scaled 524288 4096)" --env "DTRAIN_CHUNK_BYTES:$(scaled 4194304 4096)"
  --env "HOROVOD_FUSION_THRESHOLD:$(scaled 10485760 4096)"
  --env "DTRAIN_MPI_RING_BYTES:$(scaled 1048576 4096)")
link_env=(--env "DTRAIN_TCP_SNDBUF:$tcp_sndbuf")  # every job, training included
fusion_bytes=$(scaled 10485760 4096)  # batch_ms's: the threshold the allreduce modes run with
for setting in ${extra_env[@]+"${extra_env[@]}"}; do
  [[ $setting == HOROVOD_FUSION_THRESHOLD:* ]] && fusion_bytes=${setting#*:}
done

tag=$$
bridge=dcb$tag
dir=$(mktemp -d /tmp/cluster_bench.XXXXXX)
hosts=()
sshd_pids=()
source "scripts/netns.sh"
job_pid=""
cleanup() {
  trap '' INT TERM  # a second signal (a group's Ctrl-C reaches us twice) must not cut it short
  if [[ -n $job_pid ]]; then  # a job under way: dtrain launch tears it down on SIGTERM
    kill -TERM "$job_pid" 2>/dev/null || true
    wait "$job_pid" 2>/dev/null || true
  fi
  for p in "${sshd_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  delete_netns "${hosts[@]}"
  ip link del "$bridge" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the cluster ---
ssh-keygen -q -t ed25519 -N "" -f "$dir/host_key"
ssh-keygen -q -t ed25519 -N "" -f "$dir/client_key"
cp "$dir/client_key.pub" "$dir/authorized_keys"
cat >"$dir/ssh_config" <<EOF
Host *
  User root
  IdentityFile $dir/client_key
  IdentitiesOnly yes
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
  LogLevel ERROR
EOF
mkdir -p /run/sshd
ip link add "$bridge" type bridge
ip addr add 10.253.0.1/16 dev "$bridge"
ip link set "$bridge" up
shape() {  # NS DEV: DEV's egress to the link rate
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "${link_mbit}mbit" burst 256kb \
    latency "${queue_ms}ms"
}
for ((i = 0; i < max_hosts; i++)); do
  ns=dcb-$tag-$i
  address=10.253.1.$((i + 2))
  ip netns add "$ns"
  hosts+=("$ns")
  ip link add "dcb${tag}r$i" type veth peer name "dcb${tag}h$i"
  ip link set "dcb${tag}h$i" netns "$ns"
  # Inside, the link takes the bridge's name, so that one --interface fits the scheduler (here, on
  # the bridge) and every host.
  ip -n "$ns" link set "dcb${tag}h$i" name "$bridge"
  ip link set "dcb${tag}r$i" master "$bridge"
  ip link set "dcb${tag}r$i" up
  ip -n "$ns" addr add "$address/16" dev "$bridge"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$bridge" up
  # Both directions of the host's link: its own egress, and the bridge's egress toward it.
  shape "$ns" "$bridge"
  for setting in ${sysctls[@]+"${sysctls[@]}"}; do ip netns exec "$ns" sysctl -qw "$setting"; done
  tc qdisc replace dev "dcb${tag}r$i" root tbf rate "${link_mbit}mbit" burst 256kb \
    latency "${queue_ms}ms"
  cat >"$dir/sshd_$i" <<EOF
ListenAddress $address:22
HostKey $dir/host_key
PidFile none
AuthorizedKeysFile $dir/authorized_keys
StrictModes no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
MaxStartups 100
MaxSessions 100
LogLevel ERROR
EOF
  # Each host has a name of its own that resolves to its address, as real hosts have: Horovod's
  # Gloo contexts for process sets find their address from the hostname, not HOROVOD_GLOO_IFACE,
  # and this machine's name resolves to 127.0.0.1. `ip netns exec` mounts /etc/netns/NS/hosts
  # over /etc/hosts (deleted with the namespace, delete_netns); the name is set in a UTS namespace.
  mkdir -p "/etc/netns/$ns"
  { echo "127.0.0.1 localhost"; for ((j = 0; j < max_hosts; j++)); do
    echo "10.253.1.$((j + 2)) cbh$j"; done; } >"/etc/netns/$ns/hosts"
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$1" && exec /usr/sbin/sshd -D -e -f "$2"' \
    _ "cbh$i" "$dir/sshd_$i" >"$dir/sshd_$i.log" 2>&1 &
  sshd_pids+=($!)
done
for ((i = 0; i < max_hosts; i++)); do  # every sshd answers, or the bench stops here
  for _ in $(seq 50); do
    ssh -F "$dir/ssh_config" -o ConnectTimeout=2 "10.253.1.$((i + 2))" true 2>/dev/null && break
    sleep 0.2
  done
  ssh -F "$dir/ssh_config" -o ConnectTimeout=2 "10.253.1.$((i + 2))" true ||
    { echo "cluster_bench: sshd on host $i does not answer" >&2; cat "$dir/sshd_$i.log" >&2; exit 1; }
done

# ssh with this cluster's config, for horovodrun (which runs `ssh` from PATH).
mkdir -p "$dir/bin"
printf '#!/bin/sh\nexec /usr/bin/ssh -F %s "$@"\n' "$dir/ssh_config" >"$dir/bin/ssh"
chmod +x "$dir/bin/ssh"
horovod_python=""
if [[ " $modes " =~ \ hvd_(step|allreduce|mnist)_horovod ]]; then
  code=0
  horovod_python=$(bash bench/horovod_venv.sh | tail -n 1) || code=$?
  if ((code == 77)); then
    echo "cluster_bench: real Horovod skipped: PyPI cannot be reached to build it" >&2
    modes=$(tr ' ' '\n' <<<"$modes" | grep -Ev '^hvd_(step|allreduce|mnist)_horovod' | tr '\n' ' ')
  elif ((code != 0)); then
    exit 1
  fi
fi

# --- the cases ---
cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
cpu_busy_since() {  # BUSY0 TOTAL0 (cpu_ticks at the start): this machine's busy share since then
  local busy total
  read -r busy total < <(cpu_ticks)
  awk -v b=$((busy - $1)) -v t=$((total - $2)) 'BEGIN { printf "%.2f", t ? b / t : 0 }'
}
# SECONDS OUT LOG COMMAND...: runs COMMAND under a deadline, stdout to OUT and stderr to LOG. In the
# background, waited for: bash runs a signal's trap only between commands, and `wait` is one it
# interrupts, so a Ctrl-C stops the job at once (cleanup) instead of after it ends.
run_job() {
  local seconds=$1 out=$2 log=$3 rc=0
  shift 3
  timeout "$seconds" "$@" >"$out" 2>"$log" &
  job_pid=$!
  wait "$job_pid" || rc=$?
  job_pid=""
  return "$rc"
}
use_hosts() {  # N [SLOTS]: the job's hostfile lists the first N hosts, SLOTS workers each
  local i slots=${2:-1}
  : >"$dir/hostfile"
  for ((i = 0; i < $1; i++)); do
    echo "10.253.1.$((i + 2))$( ((slots > 1)) && echo ":$slots")" >>"$dir/hostfile"
  done
}
run_case() {  # MODE N
  local mode=$1 n=$2 s layout hosts_needed kvstore per_host=1
  case $mode in
    dist_sync_colocated) s=$n; layout=colocated; hosts_needed=$n; kvstore=dist_sync ;;
    dist_sync_1server) s=1; layout=separate; hosts_needed=$((n + 1)); kvstore=dist_sync ;;
    dist_sync_separate) s=$n; layout=separate; hosts_needed=$((2 * n)); kvstore=dist_sync ;;
    dist_sync_2to1) s=$((2 * n)); layout=separate; hosts_needed=$((3 * n)); kvstore=dist_sync ;;
    horovod_gloo | horovod_mpi | ddp | hvd_step_* | hvd_allreduce_* | hvd_mnist_*)
      s=0; layout=ring; kvstore=horovod; per_host=$ranks_per_host
      if ((n % per_host)); then
        echo "cluster_bench: $mode with $n workers skipped: not a multiple of --ranks-per-host" >&2
        return 0
      fi
      hosts_needed=$((n / per_host)) ;;
    *) echo "cluster_bench: unknown mode $mode" >&2; exit 2 ;;
  esac
  use_hosts "$hosts_needed" "$per_host"
  read -r busy0 total0 < <(cpu_ticks)
  local out step=(--model "$model" --scale "$scale" --compute-ms "$compute_ms" --steps "$steps"
    --warmup 1 --link-mbit "$link_mbit" --ranks-per-host "$per_host")
  local tuned=("${thresholds[@]}") fusion=$fusion_bytes
  if [[ $mode == ddp ]]; then
    step=(python3 "$PWD/bench/ddp_step.py" --step-bench "$step_bench" "${step[@]}")
  elif [[ $mode == hvd_mnist_* ]]; then
    local script=$PWD/examples/python/horovod_mnist.py python=python3
    if [[ $mode == hvd_mnist_horovod* ]]; then
      script=$dir/horovod_mnist_real_horovod.py python=$horovod_python
      # Its module beside it (fashion_mnist) found from where the copy is.
      sed -e 's/^import dtrain.torch as hvd$/import horovod.torch as hvd/' \
        -e "/^from fashion_mnist/i import sys; sys.path.insert(0, \"$PWD/examples/python\")" \
        examples/python/horovod_mnist.py >"$script"
    fi
    step=("$python" "$script" --epochs 1 --max-batches "$mnist_batches"
      --log-interval "$((mnist_batches < 50 ? mnist_batches : 50))")
    # The real model: every threshold at its default. One thread of torch and of OpenBLAS a rank
    # (the example sets torch's; OpenBLAS's idle threads spin in sched_yield, which took 40% of
    # this machine's CPU from two ranks), as bench/horovod_bench.py runs it on one host.
    tuned=(--env OMP_NUM_THREADS:1 --env OPENBLAS_NUM_THREADS:1) fusion=$((64 << 20))
  elif [[ $mode == hvd_allreduce_* ]]; then
    local impl=${mode#hvd_allreduce_} python=python3
    impl=${impl%_mpi}
    [[ $impl == horovod ]] && python=$horovod_python
    step=("$python" "$PWD/bench/horovod_rank.py" --impl "$impl" allreduce --sizes-kb "$allreduce_kb"
      --iterations "$steps" --transport "$([[ $mode == *_mpi ]] && echo mpi || echo gloo)")
  elif [[ $mode == hvd_step_horovod* ]]; then
    step=("$horovod_python" "$PWD/bench/hvd_step.py" --impl horovod --step-bench "$step_bench"
      "${step[@]}")
  elif [[ $mode == hvd_step_dtrain* ]]; then
    step=(python3 "$PWD/bench/hvd_step.py" --impl dtrain --step-bench "$step_bench" "${step[@]}")
  else
    step=("$step_bench" --kvstore "$kvstore" --layout "$layout" "$overlap" "${step[@]}")
  fi
  local launcher=(--launcher ssh --ssh-opts "-F $dir/ssh_config" --env DTRAIN_COLLECTIVES:gloo
    ${tuned[@]+"${tuned[@]}"} "${link_env[@]}" ${extra_env[@]+"${extra_env[@]}"})
  if [[ $mode == *_mpi ]]; then
    launcher=(--launcher mpi ${tuned[@]+"${tuned[@]}"} "${link_env[@]}"
      ${extra_env[@]+"${extra_env[@]}"})
    # mpirun starts its daemons over our ssh and keeps its own traffic on the bridge.
    export OMPI_MCA_plm_rsh_agent="ssh -F $dir/ssh_config" OMPI_MCA_btl_tcp_if_include=$bridge
    export OMPI_MCA_oob_tcp_if_include=$bridge OMPI_MCA_btl=self,tcp
  fi
  local job=("$dtrain" launch -n "$n" -s "$s" "${launcher[@]}" -H "$dir/hostfile"
    --interface "$bridge" --no-summary)
  [[ $mode == hvd_*_dtrain* ]] && job+=(--env "PYTHONPATH:$build/python")
  job+=(--)
  if [[ $mode == hvd_*_horovod ]]; then
    # horovodrun reaches the hosts with `ssh`: ours, with this cluster's config.
    job=(env PATH="$dir/bin:$PATH" HOROVOD_FUSION_THRESHOLD="$fusion" OMP_NUM_THREADS=1
      OPENBLAS_NUM_THREADS=1
      "$(dirname "$horovod_python")/horovodrun" --gloo -np "$n" -H "$(horovod_hosts "$n" "$per_host")"
      --network-interface "$bridge")
  elif [[ $mode == hvd_*_horovod_mpi ]]; then
    job=(mpirun -np "$n" -H "$(horovod_hosts "$n" "$per_host")" --bind-to none --allow-run-as-root
      -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 -x HOROVOD_FUSION_THRESHOLD="$fusion")
  fi
  run_job 600 "$dir/case.out" "$dir/case.log" "${job[@]}" "${step[@]}" || {
    echo "cluster_bench: $mode with $n workers failed:" >&2
    tail -n 20 "$dir/case.log" >&2
    return 1
  }
  local cpu
  cpu=$(cpu_busy_since "$busy0" "$total0")
  out=$(cat "$dir/case.out")
  if [[ $mode == hvd_mnist_* ]]; then
    python3 - "$mode" "$n" "$cpu" "$link_mbit" "$dir/case.out" <<'PY'
import json, re, sys
mode, n, cpu, link, path = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
text = open(path).read()
speeds = re.findall(r"Speed: ([\d.]+) samples/sec", text)
acc = re.findall(r"Test_acc ([\d.]+)", text)
if len(speeds) < n or not acc:
    sys.exit("cluster_bench: %s printed no speed or accuracy:\n%s" % (mode, text[-2000:]))
last = [float(s) for s in speeds[-n:]]  # every rank's last line: its rate over the whole run
print(json.dumps(dict(case=mode, workers=n, link_mbit=link, samples_per_s=round(sum(last), 1),
                      samples_per_s_rank=round(sum(last) / n, 1), test_acc=float(acc[-1]),
                      cpu_busy=cpu)))
PY
    return 0
  fi
  if [[ $mode == hvd_allreduce_* ]]; then
    grep -o '{"impl".*}' <<<"$out" | python3 -c '
import json, sys
mode, n, cpu, link, wire = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]
for line in sys.stdin:
    d = json.loads(line)
    bits = 2 * (n - 1) / n * d["kb"] * 1024 * 8  # through each link, a ring allreduce
    row = dict(case=mode, workers=n, link_mbit=link, kb=d["kb"], median_ms=d["median_ms"],
               link_ms=round(bits / (link * 1e6) * 1e3, 3))
    row["link_efficiency"] = round(row["link_ms"] / d["median_ms"], 3)
    if wire:  # the same at the rate a TCP stream reached (the wire mode, run before)
        row.update(wire_mbit=float(wire), wire_ms=round(bits / (float(wire) * 1e6) * 1e3, 3))
    row["cpu_busy"] = float(cpu)
    print(json.dumps(row))
' "$mode" "$n" "$cpu" "$link_mbit" "$wire_mbit"
    return 0
  fi
  # The ideal schedule's step (bench/ideal_step.py) where its model holds: a server on every
  # worker's host, or ring allreduce, one worker a host.
  local ideal=""
  if [[ $layout != separate ]] && ((per_host == 1)); then
    ideal=$(python3 bench/ideal_step.py --workers "$n" --link-mbit "$link_mbit" \
      --compute-ms "$compute_ms" --model "$model" --scale "$scale" --build "$build" \
      --fusion-bytes "$fusion_bytes" |
      python3 -c 'import json, sys; d = json.load(sys.stdin)
print("\"ideal_ms\":%s,\"fair_ms\":%s," % (d["ideal_ms"], d["fair_ms"]), end="")
print("\"batch_ms\":%s," % d["batch_ms"] if sys.argv[1] == "ring" else "")' "$layout")
  fi
  grep -o '{"bound_ms".*}\|{.*"mode".*}' <<<"$out" | tail -n 1 |
    sed "s/{\"/{\"case\":\"$mode\",\"cpu_busy\":$cpu,\"tcp_sndbuf\":\"$tcp_sndbuf\",$ideal\"/"
}

horovod_hosts() {  # N SLOTS: the first N / SLOTS hosts as Horovod's and mpirun's -H takes them
  local i list=()
  for ((i = 0; i < $1 / $2; i++)); do list+=("10.253.1.$((i + 2)):$2"); done
  (IFS=,; echo "${list[*]}")
}

run_train() {  # NETWORK N: one epoch of real training; rank 0's epoch time and test accuracy
  local network=$1 n=$2 out
  use_hosts "$n"
  read -r busy0 total0 < <(cpu_ticks)
  run_job 900 "$dir/case.out" "$dir/case.log" "$dtrain" launch -n "$n" -s "$n" --launcher ssh \
    --ssh-opts "-F $dir/ssh_config" -H "$dir/hostfile" --interface "$bridge" --no-summary \
    "${link_env[@]}" ${extra_env[@]+"${extra_env[@]}"} -- \
    "$build/src/train/dtrain-train" --dataset fashion-mnist \
    --network "$network" --kvstore dist_sync --epochs 1 --batch-size "$train_batch" --threads 1 || {
    echo "cluster_bench: train_$network with $n workers failed:" >&2
    tail -n 20 "$dir/case.log" >&2
    return 1
  }
  local cost acc speed cpu
  out=$(cat "$dir/case.out")
  cost=$(grep -o '^\[worker 0\] Epoch\[0\] Time cost=[0-9.]*' <<<"$out" | sed 's/.*=//')
  speed=$(grep -o '^\[worker 0\] Epoch\[0\] Time cost=.*(\([0-9.]*\) samples' <<<"$out" |
    sed 's/.*(\([0-9.]*\) samples/\1/')
  acc=$(grep -o '^\[worker 0\] Epoch 0: Test_acc [0-9.]*' <<<"$out" | sed 's/.* //')
  cpu=$(cpu_busy_since "$busy0" "$total0")
  echo "{\"case\":\"train_$network\",\"workers\":$n,\"servers\":$n,\"link_mbit\":$link_mbit,\"model\":\"$network\",\"batch\":$train_batch,\"epoch_s\":$cost,\"samples_per_s\":$(awk -v s="$speed" -v n="$n" 'BEGIN { printf "%.1f", s * n }'),\"test_acc\":$acc,\"cpu_busy\":$cpu,\"tcp_sndbuf\":\"$tcp_sndbuf\"}"
}

run_wire() {  # N: every host streams to the next at once; the slowest receiver's rate
  local n=$1 i rates=() pids=()
  for ((i = 0; i < n; i++)); do
    ip netns exec "${hosts[i]}" python3 bench/link_probe.py --listen 5201 --seconds 3 \
      >"$dir/wire_$i" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    ip netns exec "${hosts[i]}" python3 bench/link_probe.py --seconds 3 \
      --send "10.253.1.$(((i + 1) % n + 2)):5201" >/dev/null 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  for ((i = 0; i < n; i++)); do rates+=("$(cat "$dir/wire_$i")"); done
  wire_mbit=$(printf '%s\n' "${rates[@]}" | sort -g | awk 'NR == 1 { printf "%.1f", $1 }')
  printf '%s\n' "${rates[@]}" | awk -v n="$n" -v link="$link_mbit" '
    { if (NR == 1 || $1 < min) min = $1; sum += $1 }
    END { printf "{\"case\":\"wire\",\"workers\":%d,\"link_mbit\":%s,\"achieved_mbit\":%.1f,\"mean_mbit\":%.1f,\"link_efficiency\":%.3f}\n", n, link, min, sum / NR, min / link }'
}

for mode in $modes; do
  if [[ $mode == wire ]]; then
    for n in $workers_list; do ((n >= 2)) && { run_wire "$n"; break; }; done
    continue
  fi
  if [[ $mode == train_* ]]; then
    for n in $workers_list; do run_train "${mode#train_}" "$n"; done
    continue
  fi
  for n in $workers_list; do
    [[ $mode == dist_sync_1server && $n -eq 1 ]] && continue  # the same as colocated at N = 1
    run_case "$mode" "$n"
  done
done
