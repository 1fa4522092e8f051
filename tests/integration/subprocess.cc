#include "subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace dtrain::testing {

Subprocess::Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env,
                       const std::string& log_path)
    : log_path_(log_path) {
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    setpgid(0, 0);
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    // Hermetic: only the job variables the test gives reach the child.
    std::vector<std::string> inherited;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry(*e);
      for (const char* prefix : {"DMLC_", "PS_", "MXNET_", "DTRAIN_"}) {
        if (entry.rfind(prefix, 0) == 0) inherited.push_back(entry.substr(0, entry.find('=')));
      }
    }
    for (const auto& name : inherited) unsetenv(name.c_str());
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  setpgid(pid_, pid_);
}

Subprocess::~Subprocess() {
  if (!exit_code_) {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  // Grandchildren in the group, if any, go too.
  kill(-pid_, SIGKILL);
}

std::optional<int> Subprocess::Wait(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!exit_code_) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

bool Subprocess::Running() { return !Wait(0).has_value(); }

void Subprocess::Kill(int signal) {
  if (!exit_code_) kill(pid_, signal);
}

std::string Subprocess::Output() const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "dtrain-test-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string BinaryPath(const std::string& relative) {
  return std::string(DTRAIN_BINARY_DIR) + "/" + relative;
}

}  // namespace dtrain::testing
