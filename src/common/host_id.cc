#include "common/host_id.h"

#include <unistd.h>

#include <fstream>

namespace dtrain {
namespace {

std::string ReadLink(const char* path) {
  char buf[256];
  ssize_t n = readlink(path, buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string("?");
}

}  // namespace

const std::string& HostId() {
  static const std::string id = [] {
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::string boot_id;
    boot >> boot_id;
    std::string s =
        boot_id + "/" + ReadLink("/proc/self/ns/net") + "/" + ReadLink("/proc/self/ns/pid");
    for (char& c : s) {
      if (c == ' ' || c == '\n') c = '_';
    }
    return s;
  }();
  return id;
}

}  // namespace dtrain
