// `dtrain launch`: starts a whole job with one command.
#pragma once

#include <CLI/CLI.hpp>

namespace dtrain::launcher {

// Adds the `launch` subcommand to `app`; when it is chosen, the callback runs the job and stores
// the job's exit code in *exit_code.
void AddLaunchCommand(CLI::App& app, int* exit_code);

}  // namespace dtrain::launcher
