// TEMPORARY stub until the parameter-server core lands: the services idle until terminated.
#include "ps/roles.h"

#include <chrono>
#include <thread>

namespace dtrain::ps {

int RunScheduler(const Config&) {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}
int RunServer(const Config&) {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}
void RunRoleFromEnvironmentIfService() {}

}  // namespace dtrain::ps
