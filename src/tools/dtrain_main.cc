// The dtrain command: `dtrain launch ...`, `dtrain scheduler`, `dtrain server`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "common/config.h"
#include "common/error.h"
#include "common/logging.h"
#include "launcher/launch_command.h"
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
