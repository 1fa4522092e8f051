"""`cmake --install` gives users what they build on, used from scratch directories outside the
tree: a C++ project with find_package(dtrain) linking dtrain::kvstore, dtrain::collectives and
dtrain::train; the Python package and the dtrain command from the install prefix; and, when
scripts/install.sh has installed dtrain system-wide, `python3 -c "import dtrain"` and `dtrain`
on PATH from a new environment with no PYTHONPATH."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import BUILD, INSTALLED, PYTHON, REPO

pytestmark = pytest.mark.skipif(INSTALLED, reason="checks `cmake --install` of the build tree; "
                                "this run tests a pip-installed dtrain (test_package.py)")

CMAKE_PROJECT = """
cmake_minimum_required(VERSION 3.22)
project(uses_dtrain CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(dtrain REQUIRED)
add_executable(kv_app kv_app.cc)
target_link_libraries(kv_app PRIVATE dtrain::kvstore dtrain::collectives)
add_executable(train_app train_app.cc)
target_link_libraries(train_app PRIVATE dtrain::train)
add_executable(readme_app readme_app.cc)
target_link_libraries(readme_app PRIVATE dtrain::kvstore)
"""


def readme_app():
    """README.md's C++ snippet ("## From C++") as a program: its lines as they are, inside a main
    that gives the arrays it names values and checks the pulled weight, so a README that no longer
    compiles or trains fails here. Two workers' pushes of 0.25 + 0.75, SGD at 0.1 on the servers:
    the weight 1 becomes 1 - 0.1 x 2 = 0.8."""
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    section = readme[readme.index("## From C++"):]
    snippet = section[section.index("```cpp\n") + 7:section.index("```\n", 7)]
    includes = [line for line in snippet.splitlines() if line.startswith("#include")]
    body = [line for line in snippet.splitlines() if not line.startswith("#include")]
    assert includes and "dtrain::Initialize();" in body, snippet
    return "\n".join(includes + [
        "#include <cmath>",
        "#include <cstdio>",
        "#include <vector>",
        "int main() {",
        "  dtrain::Array weight = dtrain::Array::FromFloats(std::vector<float>(4, 1.0f));",
        "  dtrain::Array grad_device0 = dtrain::Array::FromFloats(std::vector<float>(4, 0.25f));",
        "  dtrain::Array grad_device1 = dtrain::Array::FromFloats(std::vector<float>(4, 0.75f));",
    ] + body + [
        "  const float w = weight.floats()[3];",
        "  std::printf(\"readme_app worker %d of %d: weight %g\\n\", kv->rank(), kv->num_workers(), w);",
        "  return std::fabs(w - (1.0f - 0.1f * kv->num_workers())) < 1e-6f ? 0 : 1;",
        "}", ""])

KV_APP = r"""
#include <dtrain/collectives/collectives.h>
#include <dtrain/kvstore/kvstore.h>
#include <cstdio>

int main() {
  auto kv = dtrain::KVStore::Create("local");
  kv->Init(3, dtrain::Array::FromFloats(std::vector<float>{1, 2, 3}));
  dtrain::Array a = dtrain::Array::FromFloats(std::vector<float>{1, 1, 1});
  dtrain::Array b = dtrain::Array::FromFloats(std::vector<float>{2, 2, 2});
  kv->Push(3, {a, b});
  dtrain::Array out(dtrain::Shape{3});
  kv->Pull(3, {out}).Wait();
  std::printf("kv_app %g %g %g collectives initialised: %d\n", out.floats()[0], out.floats()[1],
              out.floats()[2], dtrain::collectives::IsInitialized());
  return out.floats()[0] == 3 && out.floats()[2] == 3 ? 0 : 1;
}
"""

TRAIN_APP = r"""
#include <dtrain/train/data/dataset.h>
#include <dtrain/train/models/network.h>
#include <cstdio>

int main() {
  auto net = dtrain::train::MakeNetwork("mlp", {1, 28, 28}, 10);
  dtrain::train::SplitSampler sampler(100, 4, 1, 0);
  std::printf("train_app %zu parameters, part of %lld\n", net->parameters().size(),
              static_cast<long long>(sampler.size()));
  return sampler.size() == 25 ? 0 : 1;
}
"""

PY_WORKER = textwrap.dedent("""
    import torch, dtrain
    kv = dtrain.kv.create("dist_sync")
    kv.init("w", torch.zeros(4))
    out = torch.empty(4)
    kv.pushpull("w", torch.ones(4), out=out).wait()
    assert out.tolist() == [kv.num_workers] * 4, out
    print("installed package OK rank", kv.rank, dtrain.__file__)
""")


def run(argv, cwd, env=None, timeout=600):
    p = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    assert p.returncode == 0, "%s exited %d:\n%s" % (" ".join(argv), p.returncode, p.stdout)
    return p.stdout


def site_dir(prefix):
    return os.path.join(prefix, "lib", "python%d.%d" % sys.version_info[:2], "dist-packages")


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("prefix"))
    run(["cmake", "--install", BUILD, "--prefix", prefix], cwd=prefix)
    return prefix


@pytest.fixture(scope="module")
def cpp_project(prefix, tmp_path_factory):
    """A C++ project of a user's, built against the installed package with its headers alone."""
    root = tmp_path_factory.mktemp("cpp_project")
    src = root / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(CMAKE_PROJECT)
    (src / "kv_app.cc").write_text(KV_APP)
    (src / "train_app.cc").write_text(TRAIN_APP)
    (src / "readme_app.cc").write_text(readme_app())
    build = str(root / "build")
    run(["cmake", "-S", str(src), "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         "-DCMAKE_PREFIX_PATH=" + prefix], cwd=str(root))
    run(["cmake", "--build", build], cwd=str(root), timeout=900)
    return build


def test_cpp_project_finds_and_links_dtrain(cpp_project, tmp_path):
    assert "kv_app 3 3 3" in run([os.path.join(cpp_project, "kv_app")], cwd=str(tmp_path))
    assert "train_app 6 parameters, part of 25" in run([os.path.join(cpp_project, "train_app")],
                                                       cwd=str(tmp_path))


def test_readme_cpp_snippet_trains_in_a_job(prefix, cpp_project, tmp_path):
    env = {"PATH": os.path.join(prefix, "bin") + os.pathsep + "/usr/bin:/bin",
           "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    out = run([os.path.join(prefix, "bin", "dtrain"), "launch", "-n", "2", "-s", "1", "--",
               os.path.join(cpp_project, "readme_app")], cwd=str(tmp_path), env=env, timeout=120)
    assert out.count("of 2: weight 0.8") == 2, out


def test_only_the_public_headers_are_installed(prefix):
    """include/dtrain is the public API: exactly its headers are installed, nothing from src/."""
    source = os.path.join(REPO, "include")

    def headers(root):
        found = set()
        for folder, _, files in os.walk(os.path.join(root, "dtrain")):
            found |= {os.path.relpath(os.path.join(folder, f), root) for f in files}
        return found
    installed = headers(os.path.join(prefix, "include"))
    assert installed == headers(source), installed ^ headers(source)
    assert "dtrain/kvstore/kvstore.h" in installed
    assert not any("transport" in h or "ps/" in h for h in installed), installed


def test_installed_commands_and_package_run_a_job(prefix, tmp_path):
    (tmp_path / "job.py").write_text(PY_WORKER)
    env = {"PATH": os.path.join(prefix, "bin") + os.pathsep + "/usr/bin:/bin",
           "HOME": str(tmp_path), "PYTHONPATH": site_dir(prefix), "OMP_NUM_THREADS": "1"}
    out = run([os.path.join(prefix, "bin", "dtrain"), "launch", "-n", "2", "-s", "1", "--",
               PYTHON, "job.py"], cwd=str(tmp_path), env=env, timeout=120)
    assert out.count("installed package OK") == 2, out
    assert site_dir(prefix) in out, out  # the installed copy, not the build's


def test_system_install_from_a_new_shell(tmp_path):
    if not os.path.exists("/usr/local/lib/cmake/dtrain/dtrainConfig.cmake"):
        pytest.skip("dtrain is not installed system-wide (scripts/install.sh installs it)")
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": str(tmp_path)}
    assert shutil.which("dtrain", path=env["PATH"]), "dtrain is not on PATH"
    out = run(["bash", "-c", "python3 -c 'import dtrain, dtrain.torch; print(dtrain.__file__)'"],
              cwd=str(tmp_path), env=env)
    assert "/usr/local/lib/" in out, out
    installed = os.path.join(os.path.dirname(out.strip().splitlines()[-1]))
    built = os.path.join(BUILD, "python", "dtrain")
    for name in os.listdir(built):
        if name.endswith(".py"):
            with open(os.path.join(built, name), "rb") as a, open(os.path.join(installed, name), "rb") as b:
                same = a.read() == b.read()
        elif name.endswith(".so"):  # the install rewrites its RPATH: compare the linker's build id
            same = build_id(os.path.join(built, name)) == build_id(os.path.join(installed, name))
        else:
            continue
        assert same, "the installed %s is not this build's: rerun scripts/install.sh" % name


def build_id(path):
    out = run(["readelf", "-n", path], cwd="/")
    ids = [line.split(":", 1)[1].strip() for line in out.splitlines() if "Build ID" in line]
    assert ids, "no build id in %s" % path
    return ids[0]
