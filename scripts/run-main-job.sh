#!/usr/bin/env bash
# Sets up (installs what running needs: `scripts/install.sh run`, no test packages, no tests), then
# runs the main job: LeNet on Fashion-MNIST with 2 workers and 2 servers (dist_sync) on this
# machine, started with one `dtrain launch` command. Extra arguments go to dtrain-train (e.g.
# --epochs 5). Each phase's time is printed at the end (packages, configure, build, install,
# training).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/phases.sh
bash scripts/install.sh run
echo "run-main-job: set up in $SECONDS s; training starts"
rc=0
phase "training" dtrain launch -n 2 -s 2 --launcher local -- \
  dtrain-train --dataset fashion-mnist --network lenet --kvstore dist_sync "$@" || rc=$?
phase_summary
exit "$rc"
