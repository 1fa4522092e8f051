#!/usr/bin/env bash
# Horovod's example (examples/python/horovod_mnist.py, dtrain.torch) under Kubeflow MPIJob's
# contract, short of the cluster: the worker pods run sshd as the operator's examples do, the
# launcher pod runs `mpirun` with exactly the environment the MPI operator gives it
# (kubeflow/mpi-operator, pkg/controller/mpi_job_controller.go, v2beta1: the hostfile named by
# OMPI_MCA_orte_default_hostfile, one line "<job>-worker-<i>.<job>-worker.<namespace>.svc slots=N"
# per worker; OMPI_MCA_orte_keep_fqdn_hostnames=true, OMPI_MCA_orte_set_default_slots,
# OMPI_MCA_plm_rsh_args with "-o ConnectionAttempts=10"; K_MPI_JOB_ROLE=launcher; the ssh key
# pair from the job's Secret, here a fresh key and a client config beside it), and Open MPI
# starts the ranks through ssh on the workers. Two emulated hosts (network namespaces): the
# launcher and worker 0 on A, worker 1 on B, the workers' Service names resolved as cluster DNS
# would. Two ranks must train to the example's Test_acc line and exit 0.
#
#   mpijob_test.sh BUILD_DIR
#
# Exit 77 (skipped) where namespaces cannot be made or Open MPI or sshd is missing.
set -euo pipefail

build=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root for ip netns"
command -v ip >/dev/null || skip "needs iproute2 (ip)"
command -v mpirun >/dev/null || skip "needs Open MPI (mpirun)"
[[ -x /usr/sbin/sshd ]] || skip "needs sshd (openssh-server)"

source "$(dirname "$0")/../../scripts/netns.sh"
make_host_pair mj 81 mpijob || skip "cannot create network namespaces joined by a veth pair here"

job=mj namespace=default
worker_name() { echo "$job-worker-$1.$job-worker.$namespace.svc"; }
for ns in "$a" "$b"; do
  mkdir -p "/etc/netns/$ns"  # deleted with the namespaces (delete_netns)
  printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "$addr_a" "$(worker_name 0)" \
    "$addr_b" "$(worker_name 1)" >"/etc/netns/$ns/hosts"
done

# The job's ssh Secret: a key pair, the public half authorized on the workers.
ssh-keygen -q -t ed25519 -N "" -f "$logs/id_ed25519"
ssh-keygen -q -t ed25519 -N "" -f "$logs/host_key"
cp "$logs/id_ed25519.pub" "$logs/authorized_keys"
mkdir -p /run/sshd  # sshd's privilege separation directory
pids=()
names=()
for i in 0 1; do
  ns=$a addr=$addr_a
  ((i == 0)) || ns=$b addr=$addr_b
  printf '%s\n' "ListenAddress $addr" "HostKey $logs/host_key" "PidFile none" \
    "AuthorizedKeysFile $logs/authorized_keys" "StrictModes no" \
    "PermitRootLogin prohibit-password" "PasswordAuthentication no" "UsePAM no" "UseDNS no" \
    "LogLevel ERROR" >"$logs/sshd_config_$i"
  # The worker pod's command in the operator's examples: sshd in the foreground.
  ip netns exec "$ns" /usr/sbin/sshd -D -e -f "$logs/sshd_config_$i" >"$logs/sshd-$i.log" 2>&1 &
  sshd_pids+=($!)
done
cleanup_sshd() { kill "${sshd_pids[@]}" 2>/dev/null || true; }
trap 'cleanup_sshd; trap "" INT TERM; delete_netns "$a" "$b"; rm -rf "$logs"' EXIT

slots=1
for i in 0 1; do echo "$(worker_name "$i") slots=$slots"; done >"$logs/hostfile"
ssh_args="-o ConnectionAttempts=10 -i $logs/id_ed25519 -o IdentitiesOnly=yes"
ssh_args+=" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
# The image's environment (dtrain from the build, as a pip install would put it on the path) and
# the launcher pod's, as the operator sets it; mpirun forwards what the ranks need with -x.
export PATH=$build/src/tools:$build/src/train:/usr/local/bin:/usr/bin:/bin
export PYTHONPATH=$build/python OMP_NUM_THREADS=1
launcher_env=(OMPI_MCA_orte_default_hostfile="$logs/hostfile" OMPI_MCA_orte_keep_fqdn_hostnames=true
              OMPI_MCA_orte_set_default_slots=$slots OMPI_MCA_plm_rsh_args="$ssh_args"
              K_MPI_JOB_ROLE=launcher OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
for i in 0 1; do
  ip netns exec "$a" timeout 20 \
    bash -c "until ssh $ssh_args $(worker_name "$i") true; do sleep 0.2; done" || {
    cat "$logs"/sshd-*.log >&2
    echo "mpijob_test: worker $i's sshd does not answer" >&2
    exit 1
  }
done
# One rank per worker pod: each reports its pod's address.
where=$(ip netns exec "$a" env "${launcher_env[@]}" timeout 60 mpirun -np 2 --bind-to none \
  sh -c "ip -o -4 addr show scope global | awk '{print \$4}'" | sort | tr '\n' ' ')
[[ $where == "$addr_a/24 $addr_b/24 " ]] ||
  { echo "mpijob_test: the ranks ran at '$where', not one on each worker" >&2; exit 1; }

code=0
ip netns exec "$a" env "${launcher_env[@]}" timeout 600 \
  mpirun -np 2 --bind-to none -x PATH -x PYTHONPATH -x OMP_NUM_THREADS \
  /usr/bin/python3 "$repo/examples/python/horovod_mnist.py" --epochs 1 --max-batches 300 \
  --log-interval 0 >"$logs/launcher.log" 2>&1 || code=$?
fail() {
  echo "mpijob_test: $*" >&2
  tail -n 30 "$logs/launcher.log" >&2
  exit 1
}
((code == 0)) || fail "mpirun exited with $code"
grep -q "Epoch 0: Test_acc" "$logs/launcher.log" || fail "no Test_acc line from rank 0"
# Only rank 0 prints it: two lines would be two jobs of one rank each.
[[ $(grep -c "Test_acc" "$logs/launcher.log") == 1 ]] || fail "the ranks did not form one job of 2"
echo "mpijob: $(grep "Test_acc" "$logs/launcher.log" | tail -1) over ssh to both workers"
