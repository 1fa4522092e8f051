// The dtrain command: `dtrain launch ...`, `dtrain scheduler`, `dtrain server`, `dtrain plot ...`.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "common/config/env_reader.h"
#include "common/logging.h"
#include "dtrain/common/error.h"
#include "launcher/run/launch_command.h"
#include "launcher/run/process_group.h"
#include "ps/roles.h"

namespace {

// `dtrain scheduler` / `dtrain server`: the role comes from the subcommand, everything else from
// the DMLC_* variables, as for any other node.
int RunService(dtrain::Role role) {
  dtrain::Config config = dtrain::Config::FromEnvironment();
  if (config.role && *config.role != role) {
    throw dtrain::ConfigError(std::string("DMLC_ROLE=") + dtrain::RoleName(*config.role) +
                              " contradicts `dtrain " + dtrain::RoleName(role) + "`");
  }
  config.role = role;
  config.RequireDistributed(std::string("`dtrain ") + dtrain::RoleName(role) + "` was run");
  return role == dtrain::Role::kScheduler ? dtrain::ps::RunScheduler(config)
                                          : dtrain::ps::RunServer(config);
}

// The interpreter that has the dtrain package: $DTRAIN_PYTHON, which the `pip install`ed entry
// point sets to its own interpreter (a wheel is built once and installed into any environment),
// else the one this program was built with.
std::string PackagePython() {
  return dtrain::EnvReader(dtrain::ProcessEnvironment())
      .Text("DTRAIN_PYTHON")
      .value_or(DTRAIN_PYTHON);
}

// `dtrain plot ...` and `dtrain launch --launcher kubernetes ...` run in the Python package
// (dtrain/plot.py with matplotlib; dtrain/kubernetes with PyYAML and Kubernetes' own client). In a
// build tree the package sits beside this program's folder; installed, the interpreter finds it.
[[noreturn]] void RunPythonModule(const std::string& module, const std::string& what,
                                  const std::vector<std::string>& args) {
  const std::string python = PackagePython();
  std::vector<std::string> argv = {python, "-m", module};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::filesystem::path self = dtrain::launcher::SelfExecutablePath();
  const std::filesystem::path build_tree =
      self.parent_path().parent_path().parent_path() / "python";
  if (std::filesystem::exists(build_tree / "dtrain" / "__init__.py")) {
    // Raw read: the user's PYTHONPATH is not dtrain's, only handed on with the package in front.
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = build_tree.string() + (old ? ":" + std::string(old) : "");
    ::setenv("PYTHONPATH", path.c_str(), 1);
  }
  std::vector<char*> raw;
  for (auto& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  ::execv(raw[0], raw.data());
  std::fprintf(stderr, "%s: cannot run %s: %s\n", what.c_str(), python.c_str(),
               std::strerror(errno));
  std::exit(1);
}

// `dtrain launch ... --launcher kubernetes ...` (or --launcher=kubernetes) before any `--`: the
// arguments after `launch` without that option, for dtrain.kubernetes; nullopt otherwise.
std::optional<std::vector<std::string>> KubernetesLaunch(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "launch") return std::nullopt;
  std::vector<std::string> rest;
  bool kubernetes = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      rest.insert(rest.end(), argv + i, argv + argc);
      break;
    }
    if (a == "--launcher=kubernetes" ||
        (a == "--launcher" && i + 1 < argc && std::string(argv[i + 1]) == "kubernetes")) {
      kubernetes = true;
      if (a == "--launcher") ++i;
      continue;
    }
    rest.push_back(a);
  }
  if (!kubernetes) return std::nullopt;
  return rest;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain: distributed data-parallel training (parameter servers, allreduce)"};
  app.require_subcommand(1);
  int exit_code = 0;
  dtrain::launcher::AddLaunchCommand(app, &exit_code);
  app.add_subcommand("scheduler", "run the job's scheduler (configured by DMLC_* variables)")
      ->callback([&] { exit_code = RunService(dtrain::Role::kScheduler); });
  app.add_subcommand("server", "run one parameter server (configured by DMLC_* variables)")
      ->callback([&] { exit_code = RunService(dtrain::Role::kServer); });
  CLI::App* plot = app.add_subcommand(
      "plot", "draw accuracy, loss and samples/s from training logs (dtrain plot --help)");
  plot->prefix_command();
  plot->set_help_flag();
  plot->callback([plot] { RunPythonModule("dtrain.plot", "dtrain plot", plot->remaining()); });
  if (auto args = KubernetesLaunch(argc, argv)) {
    RunPythonModule("dtrain.kubernetes", "dtrain launch --launcher kubernetes", *args);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;  // usage errors exit 2, as the launcher's own do
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "dtrain: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain: internal error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
