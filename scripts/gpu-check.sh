#!/usr/bin/env bash
# The GPU checks in one command, for a machine with one or more GPUs, a CUDA build of PyTorch 2 in
# its python3, nvcc, CMake and ninja, and no package registry (run scripts/gpu-deps.sh beforehand
# where there is one, and bring its folder):
#
#   bash scripts/gpu-check.sh DEPS_DIR OUT_DIR
#
# Builds what the GPU tests need against that python3's torch, on every core, into build-gpu/;
# runs the CUDA unit tests (ctest label gpu), the Python GPU tests (tests/python/test_gpu.py), the
# pushpull benchmark (bench/gpu_pushpull.py), the device store on two replicas
# (bench/gpu_device_store.py) and ResNet-18 training against plain PyTorch and DDP
# (bench/gpu_train_bench.py); writes OUT_DIR/gpu-check.log (everything) and
# OUT_DIR/results.jsonl (one JSON line per step: what ran, its exit code, seconds, and the
# benchmark's figures). Exits non-zero if any step failed.
#
# GPU_TRAIN_JOBS=plain,dtrain_local,... picks the training benchmark's jobs (bench/gpu_train_bench.py
# --jobs); GPU_CHECK_TESTS=0 leaves the tests out (a benchmark-only run on a machine lent briefly),
# GPU_CHECK_BENCH=0 the benchmarks (a tests-only run).
#
# Time on 16 cores: build about 100 s, the tests about 5 minutes (40 in test_gpu.py; 28 took 146-174
# s on 2026-11-28; bounded at 420 s), the benchmarks about 5 minutes: together they may pass a lent
# machine's 10-minute limit on one command, so run a tests-only and a benchmark-only call there.
set -uo pipefail
cd "$(dirname "$0")/.."
deps=$(realpath "${1:?usage: gpu-check.sh DEPS_DIR OUT_DIR}")
[ -d "$deps/debs" ] || { echo "gpu-check: $1 holds no debs/ (make it with scripts/gpu-deps.sh \
here, and carry it to the GPU machine)" >&2; exit 2; }
out=$(realpath -m "${2:?usage: gpu-check.sh DEPS_DIR OUT_DIR}")
mkdir -p "$out"
log=$out/gpu-check.log
results=$out/results.jsonl
: >"$results"
exec > >(tee -a "$log") 2>&1
failed=0

step() {  # step NAME COMMAND...: runs it, records its exit code and time
  local name=$1 start rc
  shift
  echo "=== $name: $*"
  start=$(date +%s.%N)
  "$@"
  rc=$?
  awk -v n="$name" -v rc="$rc" -v s="$start" -v e="$(date +%s.%N)" \
    'BEGIN { printf "{\"step\": \"%s\", \"rc\": %d, \"seconds\": %.1f}\n", n, rc, e - s }' \
    >>"$results"
  [ "$rc" -eq 0 ] || failed=1
  return "$rc"
}

python=$(command -v python3)
echo "=== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
nproc
"$python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__,
  "cuda", torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else "-")'
nvcc --version | tail -1

# The dependencies, unpacked into a private root; Gloo's CMake files name /usr absolutely.
root=$deps/root
if [ ! -d "$root" ]; then
  mkdir -p "$root"
  for deb in "$deps"/debs/*.deb; do dpkg-deb -x "$deb" "$root" || exit 1; done
  sed -i "s|\"/usr/lib/libgloo|\"\${_IMPORT_PREFIX}/lib/libgloo|" "$root"/usr/share/cmake/Gloo/GlooTargets-*.cmake
fi
libs=$root/usr/lib:$root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LIBRARY_PATH=$libs${LIBRARY_PATH:+:$LIBRARY_PATH}  # the linker's -lgloo

# zlib1g-dev's libz.so points at the runtime package's file, which the machine has itself; its
# libz.a (not position-independent) must not be picked instead.
zlib=$(ls /usr/lib/x86_64-linux-gnu/libz.so.1 /lib/x86_64-linux-gnu/libz.so.1 2>/dev/null | head -1)
rm -f "$root/usr/lib/x86_64-linux-gnu/libz.a"
ln -sf "$zlib" "$root/usr/lib/x86_64-linux-gnu/libz.so"
# The extension must use the libstdc++ that python and torch load. A toolchain that links its own
# into the extension statically (the /opt/gcc of the GPU machines we know) leaves two copies of the
# iostreams in one process, and the first ostringstream crashes: prefer the system's g++, and
# otherwise link the system's libstdc++ ahead of the toolchain's.
link_flags=()
if [ -x /usr/bin/g++ ]; then
  export CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
else
  libstdcxx=$(ls /usr/lib/x86_64-linux-gnu/libstdc++.so.6 2>/dev/null)
  [ -n "$libstdcxx" ] && link_flags=(-DCMAKE_SHARED_LINKER_FLAGS="$libstdcxx"
    -DCMAKE_MODULE_LINKER_FLAGS="$libstdcxx" -DCMAKE_EXE_LINKER_FLAGS="$libstdcxx")
fi
echo "C++ compiler: ${CXX:-default} ${link_flags[*]}"
configure() {
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$python" \
    -DCMAKE_PREFIX_PATH="$root/usr" -DOPENSSL_ROOT_DIR="$root/usr" \
    -DZLIB_INCLUDE_DIR="$root/usr/include" -DZLIB_LIBRARY="$zlib" -DZLIB_LIBRARY_RELEASE="$zlib" \
    -DCMAKE_CUDA_ARCHITECTURES=native -DDTRAIN_CUDA=ON -DDTRAIN_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_RPATH="$root/usr/lib;$root/usr/lib/x86_64-linux-gnu" "${link_flags[@]}"
}
build() {
  ninja -C build-gpu -j "$(nproc)" dtrain_python dtrain dtrain-train dtrain-horovod-example \
    dtrain_cuda_tests
}
step configure configure && step build build || { echo "gpu-check: the build failed"; exit 1; }

export DTRAIN_BUILD_DIR=$PWD/build-gpu PYTHONPATH=$PWD/build-gpu/python
tests=${GPU_CHECK_TESTS:-1}
[ "$tests" = 0 ] || step cuda_unit_tests build-gpu/tests/dtrain_cuda_tests
# Every step is bounded, so that the whole check fits a machine lent for minutes.
bench=${GPU_CHECK_BENCH:-1}
bench_out=$out/gpu_pushpull.jsonl
[ "$bench" = 0 ] || step gpu_pushpull_bench timeout 60 bash -c "build-gpu/src/tools/dtrain launch -n 1 -s 1 -- \
  '$python' bench/gpu_pushpull.py | grep -o '{.*' >'$bench_out'"
cat "$bench_out" >>"$results" 2>/dev/null
# The same key with 2-bit compression: the CUDA tensor's compressed on the GPU.
[ "$bench" = 0 ] || step gpu_pushpull_2bit_bench timeout 60 bash -c "build-gpu/src/tools/dtrain launch -n 1 -s 1 -- \
  '$python' bench/gpu_pushpull.py --compression 2bit | grep -o '{.*' >'$bench_out.2bit'"
cat "$bench_out.2bit" >>"$results" 2>/dev/null
# The device store on two CUDA replicas, against torch's own sum on the GPU (no job needed).
[ "$bench" = 0 ] || step gpu_device_store_bench timeout 60 \
  bash -c "'$python' bench/gpu_device_store.py | grep -o '{.*' >'$out/gpu_device_store.jsonl'"
cat "$out/gpu_device_store.jsonl" >>"$results" 2>/dev/null
train_out=$out/gpu_train.jsonl
[ "$bench" = 0 ] || step gpu_train_bench timeout 240 bash -c "'$python' bench/gpu_train_bench.py --build build-gpu --timeout 70 \
  ${GPU_TRAIN_JOBS:+--jobs $GPU_TRAIN_JOBS} >'$train_out'"
cat "$train_out" >>"$results" 2>/dev/null
[ "$tests" = 0 ] || (cd tests/python && step python_gpu_tests timeout 420 "$python" -m pytest -q -rs -p no:cacheprovider \
  test_gpu.py) || failed=1
echo "=== results"
cat "$results"
exit "$failed"
