#!/usr/bin/env bash
# A 2x2 dist_sync job across two emulated hosts (network namespaces A and B joined by a veth pair)
# while the link between them misbehaves. The workers are kv_check_worker soaks: every round's pull
# must be exactly the sum of every worker's push, or the worker fails.
#
#   link_faults_test.sh CASE BUILD_DIR
#
# CASE:
#   lossy      2% of packets dropped and 2% sent twice, both ways, all run long (nftables: this
#              kernel has no netem, so no reordering or delay): every round exact.
#   link-down  the link down for 2 s mid-run, then up: TCP retransmits, the job ends exact.
#   reset      every TCP connection between the hosts reset (ss -K) mid-run, from B and then from
#              A: PS_RESEND (on by default) re-establishes each and resends what was not
#              received, so the job ends exact, every push applied once.
#   reset-noresend  the same with PS_RESEND=0: every process exits non-zero, naming a peer,
#              promptly.
#   blackhole  the link silently drops everything mid-run, heartbeats set to 60 s: the links' own
#              liveness (DTRAIN_LINK_TIMEOUT_MS=3000) and the resend window
#              (DTRAIN_RESEND_WINDOW_MS=3000) fail the job, naming a peer on the other host, long
#              before the heartbeat or the request timeout.
#   send-buffer  no fault: with DTRAIN_TCP_SNDBUF=32768 the connections a node dials to the other
#              host have 32 KiB send buffers (ss -tm mid-run) and those within its host keep the
#              kernel's; every round exact.
#   send-buffer-auto  no fault, the link shaped to 100 Mbit/s (tc tbf), DTRAIN_TCP_SNDBUF unset
#              (auto): the tuner (transport/tcp/send_buffer_tuner.h) keeps the connections a node
#              dials to the other host near the 32 KiB floor (ss -tm mid-run), 2 ms at this rate
#              being less; those within its host keep the kernel's; every round exact.
#   killed     server 1 killed (SIGKILL) mid-run, with a resend window longer than the processes'
#              120 s limit: a member whose process is gone is lost at once (its connections close,
#              and nothing listens at its address), so the others fail naming it, never waiting
#              out the window.
#
# Layout: the scheduler, server 0 and worker 0 on A (10.254.78.1); server 1 and worker 1 on B.
# Prints one JSON line with what it measured. Exit 77 (skipped) where namespaces cannot be made.
# Everything runs inside the two namespaces, which are deleted (with what runs there) on every
# exit path.
set -euo pipefail

case_name=$1
build=$2
dtrain=$build/src/tools/dtrain
worker_bin=$build/tests/programs/kv_check_worker

skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root for ip netns and tc"
command -v ip >/dev/null && command -v ss >/dev/null || skip "needs iproute2 (ip, ss)"
command -v nft >/dev/null || skip "needs nftables (nft)"

source "$(dirname "$0")/../../scripts/netns.sh"
make_host_pair lf 78 link_faults ||
  skip "cannot create network namespaces joined by a veth pair here"

# In NS, nft STATEMENTS applied to every packet NS sends to PEER.
on_the_way_to() {
  local ns=$1 peer=$2 r
  shift 2
  {
    printf 'table ip link_faults {\n  chain out {\n    type filter hook output priority 0;\n'
    for r in "$@"; do printf '    ip daddr %s %s\n' "$peer" "$r"; done
    printf '  }\n}\n'
  } | ip netns exec "$ns" nft -f -
}
both_ways() {  # STATEMENTS...: on both hosts, toward the other
  on_the_way_to "$a" "$addr_b" "$@"
  on_the_way_to "$b" "$addr_a" "$@"
}

rounds=1500
extra_env=()
case $case_name in
  lossy)
    rounds=800
    both_ways "numgen random mod 100 < 2 drop" "numgen random mod 100 < 2 dup to ip daddr" ;;
  link-down | reset) rounds=4000 ;;
  send-buffer)
    rounds=4000
    extra_env=(DTRAIN_TCP_SNDBUF=32768) ;;
  send-buffer-auto)
    command -v tc >/dev/null || skip "needs tc (iproute2)"
    shape_host_pair 100mbit ||
      skip "tc cannot shape a link here (sch_tbf)"
    rounds=400
    extra_env=(PS_VERBOSE=1) ;;
  reset-noresend)
    rounds=4000
    extra_env=(PS_RESEND=0) ;;
  blackhole)
    rounds=100000
    extra_env=(PS_HEARTBEAT_TIMEOUT=60000 DTRAIN_LINK_TIMEOUT_MS=3000 DTRAIN_RESEND_WINDOW_MS=3000) ;;
  killed)
    rounds=100000
    extra_env=(DTRAIN_RESEND_WINDOW_MS=200000) ;;
  *) echo "link_faults_test: unknown case $case_name" >&2; exit 2 ;;
esac

port=$((20000 + RANDOM % 20000))
job_env=(DMLC_PS_ROOT_URI=$addr_a DMLC_PS_ROOT_PORT=$port DMLC_NUM_SERVER=2 DMLC_NUM_WORKER=2
         DTRAIN_JOB_SECRET=link-faults-test-secret-0123456789 "${extra_env[@]}")
pids=()
names=()
start() {  # NS HOST ROLE RANK NAME CMD...
  local ns=$1 host=$2 role=$3 rank=$4 name=$5
  shift 5
  ip netns exec "$ns" env "${job_env[@]}" DMLC_ROLE="$role" DMLC_NODE_HOST="$host" \
    DTRAIN_NODE_RANK="$rank" OMP_NUM_THREADS=1 timeout 120 "$@" >"$logs/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
}
soak=("$worker_bin" --scenario sync --rounds "$rounds" --sizes 1,1000,100000)
start "$a" "$addr_a" scheduler 0 scheduler "$dtrain" scheduler
start "$a" "$addr_a" server 0 server0 "$dtrain" server
start "$b" "$addr_b" server 1 server1 "$dtrain" server
start "$a" "$addr_a" worker 0 worker0 "${soak[@]}"
start "$b" "$addr_b" worker 1 worker1 "${soak[@]}"

# The fault, once the job trains (it starts in well under a second on loopback-fast links).
started=$(date +%s.%N)
fault_at=
if [[ $case_name != lossy ]]; then
  sleep 1.5
  fault_at=$(date +%s.%N)
  case $case_name in
    link-down)
      ip -n "$b" link set "$veth_b" down
      sleep 2
      ip -n "$b" link set "$veth_b" up ;;
    reset)
      ip netns exec "$b" ss -K dst "$addr_a" >/dev/null 2>&1
      sleep 0.5
      ip netns exec "$a" ss -K dst "$addr_b" >/dev/null 2>&1 ;;
    reset-noresend) ip netns exec "$b" ss -K dst "$addr_a" >/dev/null 2>&1 ;;
    send-buffer | send-buffer-auto)
      ip netns exec "$a" ss -tlnH >"$logs/listening"
      ip netns exec "$a" ss -tmnH state established >"$logs/sockets" ;;
    blackhole) both_ways "drop" ;;
    killed)
      for p in $(ip netns pids "$b"); do
        [[ $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) == *"/dtrain server"* ]] && kill -9 "$p"
      done ;;
  esac
fi

wait_for_named_pids
ended=$(date +%s.%N)
since_fault=$(awk -v a="${fault_at:-$started}" -v b="$ended" 'BEGIN { printf "%.1f", b - a }')
printf '{"test":"link_faults","case":"%s","rounds":%s,"exit_codes":"%s","seconds_after_fault":%s}\n' \
  "$case_name" "$rounds" "${codes[*]}" "$since_fault"

show_logs() { for f in "$logs"/*.log; do echo "--- $(basename "$f")"; tail -n 15 "$f"; done; }
fail() {
  echo "link_faults_test $case_name: $*" >&2
  show_logs >&2
  exit 1
}
[[ -z ${LINK_FAULTS_SHOW_LOGS:-} ]] || show_logs
case $case_name in
  lossy | link-down | reset | send-buffer | send-buffer-auto)
    for c in "${codes[@]}"; do [[ ${c#*=} == 0 ]] || fail "$c (every process must exit 0)"; done
    for w in worker0 worker1; do
      grep -q "sync OK" "$logs/$w.log" || fail "$w did not report every round exact"
    done
    if [[ $case_name == reset ]]; then
      # grep reading the files itself: `cat | grep -q` fails under pipefail when grep stops at the
      # first match while cat still writes (SIGPIPE), which made this check flaky.
      grep -q "re-established the connection" "$logs"/*.log ||
        fail "no connection was re-established: did the resets reach the job?"
    fi
    if [[ $case_name == send-buffer-auto ]]; then
      # The sockets A's nodes dialed to B (local port not one A listens on) carry their data: each
      # must stay near the floor, 2 ms of 100 Mbit/s being 25 KB (the token bucket's 256 KB burst
      # made a connection look up to 3x faster than the link; autotuning gives megabytes).
      awk -v other="$addr_b" '
        FNR == NR { port = $4; sub(/.*:/, "", port); listening[port] = 1; next }
        /^[0-9]/ { peer = $4; sub(/:[0-9]+$/, "", peer)
                   port = $3; sub(/.*:/, "", port); dialed = !(port in listening); next }
        /skmem/ && peer == other && dialed {
          n++; match($0, /,tb[0-9]+,/); tb = substr($0, RSTART + 3, RLENGTH - 4) + 0
          at_floor += tb == 32768; over += tb > 131072 }
        END { printf "dialed to the other host: %d sockets, %d at the floor, %d over 128 KiB\n", n, at_floor, over
              exit !(n > 0 && at_floor > 0 && over == 0) }' "$logs/listening" "$logs/sockets" ||
        fail "DTRAIN_TCP_SNDBUF=auto: a dialed connection to the other host is not near the 32 KiB floor: $(cat "$logs/sockets")"
    fi
    if [[ $case_name == send-buffer || $case_name == send-buffer-auto ]]; then
      # ss prints each socket's line, then its memory (skmem: ... tb = send buffer) on the next.
      awk -v other="$addr_b" '
        /^[0-9]/ { peer = $4; sub(/:[0-9]+$/, "", peer); next }
        /skmem/ { capped = index($0, ",tb32768,") > 0
                  if (peer == other) { to_other++; capped_other += capped } else { within += capped } }
        END { printf "to the other host: %d sockets, %d capped; within: %d capped\n", to_other, capped_other, within
              exit !(capped_other > 0 && within == 0) }' "$logs/sockets" ||
        fail "DTRAIN_TCP_SNDBUF: no capped connection to the other host, or one capped within A: $(cat "$logs/sockets")"
    fi ;;
  reset-noresend | blackhole | killed)
    for i in "${!codes[@]}"; do
      c=${codes[$i]}
      [[ ${names[$i]} == server1 && $case_name == killed ]] && continue  # the one killed
      [[ ${c#*=} != 0 ]] || fail "$c: every process must fail loudly"
      [[ ${c#*=} != 124 ]] || fail "$c: hung until the test's timeout"
      # Every process says which member it lost, by role and rank and address.
      grep -Eq "(scheduler|server [01]|worker [01]) \(10\.254\.78\.[12]:[0-9]+\)" \
        "$logs/${names[$i]}.log" || fail "${names[$i]} does not name the member it lost"
    done ;;
esac
exit 0
