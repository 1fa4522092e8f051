// placeholder: being written
#include "launcher/launch_command.h"
namespace dtrain::launcher {
void AddLaunchCommand(CLI::App& app, int* exit_code) { app.add_subcommand("launch", "start a job"); }
}  // namespace dtrain::launcher
