#!/usr/bin/env bash
# The manifests `dtrain launch --launcher kubernetes --dry-run` prints, run as a cluster would run
# them, short of the cluster: every pod of every Indexed Job gets exactly its container's command
# and environment (fieldRefs resolved as the kubelet does: status.podIP to its host's address,
# the completion-index annotation to its index; secretKeyRef to the Secret's value) and nothing
# else, in one of two emulated hosts (network namespaces), the scheduler's Service name resolved
# to its pod as cluster DNS would. The main job (LeNet on Fashion-MNIST, 2 workers, 2 servers,
# dist_sync, 2 epochs) must reach the floor tests/integration/train_job_test.cc holds it to.
#
#   kubernetes_pods_test.sh BUILD_DIR
#
# Exit 77 (skipped) where namespaces cannot be made or PyYAML is missing.
set -euo pipefail

build=$1
skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root for ip netns"
command -v ip >/dev/null || skip "needs iproute2 (ip)"
python3 -c "import yaml" 2>/dev/null || skip "needs PyYAML (python3-yaml)"

source "$(dirname "$0")/../../scripts/netns.sh"
make_host_pair kp 80 kubernetes_pods ||
  skip "cannot create network namespaces joined by a veth pair here"

# The images' PATH: dtrain and dtrain-train as a pip install or scripts/install.sh puts them there.
pod_path=$build/src/tools:$build/src/train:/usr/local/bin:/usr/bin:/bin
name=kpjob
PATH=$pod_path "$build/src/tools/dtrain" launch --launcher kubernetes -n 2 -s 2 --image unused \
  --name "$name" --dry-run -- dtrain-train --dataset fashion-mnist --network lenet \
  --kvstore dist_sync --epochs 2 --log-interval 0 >"$logs/job.yaml"

# One line per pod: HOST NAME COMMAND (the command a shell string: env -i, its variables, argv).
python3 - "$logs/job.yaml" "$addr_a" "$addr_b" "$pod_path" >"$logs/pods" <<'PY'
import shlex
import sys

import yaml

docs = list(yaml.safe_load_all(open(sys.argv[1])))
secrets = {d["metadata"]["name"]: d["stringData"] for d in docs if d["kind"] == "Secret"}
hosts = [("a", sys.argv[2]), ("b", sys.argv[3])]
for job in (d for d in docs if d["kind"] == "Job"):
    role = job["metadata"]["labels"]["dtrain.role"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    for index in range(job["spec"]["completions"]):
        host, ip = hosts[0] if role == "scheduler" else hosts[index % 2]
        env = []
        for e in container["env"]:
            source = e.get("valueFrom", {})
            if "value" in e:
                value = e["value"]
            elif "secretKeyRef" in source:
                value = secrets[source["secretKeyRef"]["name"]][source["secretKeyRef"]["key"]]
            elif source["fieldRef"]["fieldPath"] == "status.podIP":
                value = ip
            elif "job-completion-index" in source["fieldRef"]["fieldPath"]:
                value = str(index)
            else:
                sys.exit("kubernetes_pods_test: a variable the kubelet would fill unknown here: %s" % e)
            env.append("%s=%s" % (e["name"], value))
        argv = ["env", "-i", "PATH=" + sys.argv[4], *env, *container["command"]]
        print(host, "%s-%d" % (role, index), shlex.join(argv))
PY
grep -q "^a scheduler-0 " "$logs/pods" || { cat "$logs/pods"; exit 1; }

# The Service: its name resolves to the scheduler's pod in every pod.
service=$(python3 -c "import sys, yaml; print([d for d in yaml.safe_load_all(open(sys.argv[1])) if d['kind'] == 'Service'][0]['metadata']['name'])" "$logs/job.yaml")
for ns in "$a" "$b"; do
  mkdir -p "/etc/netns/$ns"  # deleted with the namespaces (delete_netns)
  printf '127.0.0.1 localhost\n%s %s\n' "$addr_a" "$service" >"/etc/netns/$ns/hosts"
done

pids=()
names=()
while read -r host pod command; do
  ns=$a
  [[ $host == a ]] || ns=$b
  ip netns exec "$ns" timeout 600 bash -c "$command" >"$logs/$pod.log" 2>&1 &
  pids+=($!)
  names+=("$pod")
done <"$logs/pods"
wait_for_named_pids
echo "kubernetes_pods: exit codes ${codes[*]}"

fail() {
  echo "kubernetes_pods_test: $*" >&2
  for f in "$logs"/*.log; do echo "--- $(basename "$f")"; tail -n 15 "$f"; done >&2
  exit 1
}
[[ ${#codes[@]} -eq 5 ]] || fail "expected 5 pods (a scheduler, 2 servers, 2 workers): ${codes[*]}"
for c in "${codes[@]}"; do [[ ${c#*=} == 0 ]] || fail "$c (every pod must exit 0)"; done
accuracy=$(grep -o 'Test_acc[= :]*[0-9.]*' "$logs/worker-0.log" | tail -1 | grep -o '[0-9.]*$')
[[ -n $accuracy ]] || fail "worker 0 printed no Test_acc"
awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.86) }' || fail "Test_acc $accuracy under 0.86"
echo "kubernetes_pods: the manifests' pods trained the 2x2 main job to Test_acc $accuracy"
