#include "ssh_test_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "launcher/run/setup_command.h"

namespace dtrain::launcher::testing {
namespace {

constexpr char kNetnsPrefix[] = "dtrain-ssh-";
constexpr char kSshd[] = "/usr/sbin/sshd";
constexpr Duration kCommandTimeout{10000};

struct CommandResult {
  int code = -1;  // -1: timed out
  std::string output;
};

CommandResult Run(const std::vector<std::string>& argv) {
  SetupResult r = RunSetupCommands({argv}, kCommandTimeout).front();
  return {r.timed_out ? -1 : r.status.ShellCode(), r.output};
}

std::string Joined(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// Runs argv and throws if it fails: a step of building the cluster.
std::string MustRun(const std::vector<std::string>& argv) {
  CommandResult r = Run(argv);
  if (r.code != 0) {
    // Appending (not "literal" + string) avoids GCC 12's false -Wrestrict warning.
    std::string what = "`";
    what += Joined(argv) + "` failed (" + std::to_string(r.code) + "): " + r.output;
    throw std::runtime_error(what);
  }
  return r.output;
}

bool Executable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

std::string FindInPath(const std::string& name) {
  for (const char* dir :
       {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}) {
    std::string p = std::string(dir) + "/" + name;
    if (Executable(p)) return p;
  }
  return "";
}

std::string Base36(unsigned long v) {
  const char* digits = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string s;
  do {
    s.insert(s.begin(), digits[v % 36]);
    v /= 36;
  } while (v != 0);
  return s;
}

bool PidAlive(long pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (!l.empty()) out.push_back(l);
  }
  return out;
}

// The processes in the namespace; nullopt when it cannot be asked (it is gone).
std::optional<std::vector<pid_t>> PidsInNetns(const std::string& netns) {
  CommandResult r = Run({"ip", "netns", "pids", netns});
  if (r.code != 0) return std::nullopt;
  std::vector<pid_t> pids;
  for (const std::string& p : Lines(r.output)) pids.push_back(static_cast<pid_t>(std::stol(p)));
  return pids;
}

// SIGKILLs every process inside the namespace until none is left (bounded).
void KillEverythingIn(const std::string& netns) {
  PollUntil(
      [&] {
        std::optional<std::vector<pid_t>> pids = PidsInNetns(netns);
        if (pids) {
          for (pid_t p : *pids) ::kill(p, SIGKILL);
        }
        return !pids || pids->empty();
      },
      std::chrono::seconds(5));
}

// Namespaces and links of earlier runs whose process is gone (a crash skipped their destructor).
void RemoveLeftovers() {
  for (const std::string& line : Lines(Run({"ip", "netns", "list"}).output)) {
    const std::string name = line.substr(0, line.find(' '));
    if (name.rfind(kNetnsPrefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + sizeof(kNetnsPrefix) - 1, nullptr, 10);
    if (PidAlive(pid)) continue;
    KillEverythingIn(name);
    Run({"ip", "netns", "del", name});
  }
  // "3: dtb-<pid36>-<n36>: <...": bridges (veths go with their namespace).
  for (const std::string& line : Lines(Run({"ip", "-o", "link", "show"}).output)) {
    const size_t start = line.find(": ");
    if (start == std::string::npos) continue;
    std::string name = line.substr(start + 2, line.find(':', start + 2) - start - 2);
    name = name.substr(0, name.find('@'));
    if (name.rfind("dtb-", 0) != 0 && name.rfind("dtv-", 0) != 0) continue;
    const long pid = std::strtol(name.substr(4, name.find('-', 4) - 4).c_str(), nullptr, 36);
    if (!PidAlive(pid)) Run({"ip", "link", "del", name});
  }
}

// Whether anything listens at address:port yet.
bool Accepts(const std::string& address, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace

std::optional<std::string> SshTestCluster::WhyUnavailable() {
  if (::geteuid() != 0) return "network namespaces need root";
  if (FindInPath("ip").empty()) return "no `ip` command (iproute2)";
  if (!Executable(kSshd)) return std::string("no ") + kSshd + " (openssh-server)";
  if (FindInPath("ssh").empty() || FindInPath("ssh-keygen").empty()) {
    return "no ssh / ssh-keygen (openssh-client)";
  }
  const std::string probe = std::string(kNetnsPrefix) + std::to_string(::getpid()) + "-probe";
  CommandResult r = Run({"ip", "netns", "add", probe});
  if (r.code != 0) return "`ip netns add` is not allowed here: " + r.output;
  Run({"ip", "netns", "del", probe});
  return std::nullopt;
}

SshTestCluster::SshTestCluster(int num_hosts) {
  static int counter = 0;
  serial_ = ++counter;
  id_ = std::to_string(::getpid()) + "-" + std::to_string(serial_);
  bridge_ = "dtb-" + Base36(::getpid()) + "-" + Base36(serial_);
  try {
    Build(num_hosts);
  } catch (...) {
    TearDown();
    throw;
  }
}

SshTestCluster::~SshTestCluster() { TearDown(); }

void SshTestCluster::Build(int num_hosts) {
  RemoveLeftovers();
  // A /24 no route of this machine covers: `ip route get` leaves through a gateway ("via") or
  // finds no route at all.
  const unsigned long seed = static_cast<unsigned long>(::getpid()) * 31 + serial_;
  for (unsigned long k = seed;; ++k) {
    prefix_ = "10." + std::to_string(200 + k % 50) + "." + std::to_string((k / 50) % 256) + ".";
    CommandResult r = Run({"ip", "-4", "route", "get", prefix_ + "2"});
    if (r.code != 0 || r.output.find(" via ") != std::string::npos) break;
    if (k - seed > 100) throw std::runtime_error("no free 10.x.y.0/24 subnet for the test");
  }
  root_address_ = prefix_ + "1";

  const std::string dir = dir_.path().string();
  MustRun({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", dir + "/host_key"});
  MustRun({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", dir + "/client_key"});
  WriteText(dir + "/authorized_keys", ReadFile(dir + "/client_key.pub"));
  WriteText(dir + "/ssh_config",
            "Host *\n"
            "  User root\n"
            "  IdentityFile " +
                dir +
                "/client_key\n"
                "  IdentitiesOnly yes\n"
                "  UserKnownHostsFile /dev/null\n"
                "  StrictHostKeyChecking no\n"
                "  LogLevel ERROR\n");
  // sshd's privilege separation needs this directory; Debian creates it only when its service
  // starts.
  MustRun({"mkdir", "-p", "/run/sshd"});

  MustRun({"ip", "link", "add", bridge_, "type", "bridge"});
  bridge_made_ = true;
  MustRun({"ip", "addr", "add", root_address_ + "/24", "dev", bridge_});
  MustRun({"ip", "link", "set", bridge_, "up"});
  for (int i = 0; i < num_hosts; ++i) {
    const std::string netns = kNetnsPrefix + id_ + "-" + std::to_string(i);
    MustRun({"ip", "netns", "add", netns});
    hosts_.emplace_back();  // from here on TearDown removes it
    Host& h = hosts_.back();
    h.netns = netns;
    const std::string veth = "dtv-" + Base36(::getpid()) + "-" + Base36(serial_);
    h.veth_root = veth + "r" + std::to_string(i);
    const std::string veth_inside = veth + "h" + std::to_string(i);
    h.address = prefix_ + std::to_string(2 + i);
    MustRun({"ip", "link", "add", h.veth_root, "type", "veth", "peer", "name", veth_inside});
    MustRun({"ip", "link", "set", veth_inside, "netns", h.netns});
    // Inside, the veth takes the bridge's name (see interface_name()).
    h.veth_host = bridge_;
    MustRun({"ip", "-n", h.netns, "link", "set", veth_inside, "name", h.veth_host});
    MustRun({"ip", "link", "set", h.veth_root, "master", bridge_});
    MustRun({"ip", "link", "set", h.veth_root, "up"});
    MustRun({"ip", "-n", h.netns, "addr", "add", h.address + "/24", "dev", h.veth_host});
    MustRun({"ip", "-n", h.netns, "link", "set", h.veth_host, "up"});
    MustRun({"ip", "-n", h.netns, "link", "set", "lo", "up"});
    StartSshd(&h, i);
  }
}

void SshTestCluster::StartSshd(Host* host, int index) {
  const std::string dir = dir_.path().string();
  const std::string config = dir + "/sshd_config_" + std::to_string(index);
  WriteText(config, "ListenAddress " + host->address +
                        ":22\n"
                        "HostKey " +
                        dir +
                        "/host_key\n"
                        "PidFile none\n"
                        "AuthorizedKeysFile " +
                        dir +
                        "/authorized_keys\n"
                        "StrictModes no\n"
                        "PermitRootLogin prohibit-password\n"
                        "PasswordAuthentication no\n"
                        "KbdInteractiveAuthentication no\n"
                        "UsePAM no\n"
                        "UseDNS no\n"
                        "MaxStartups 100\n"
                        "MaxSessions 100\n"
                        "LogLevel ERROR\n");
  const std::string log = dir + "/sshd_" + std::to_string(index) + ".log";
  const std::string ip = FindInPath("ip");
  host->sshd = ::fork();
  if (host->sshd == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    // sshd wants an absolute path; -D: stay in the foreground (our child), -e: log to stderr.
    ::execl(ip.c_str(), "ip", "netns", "exec", host->netns.c_str(), kSshd, "-D", "-e", "-f",
            config.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const bool up = PollUntil(
      [&] {
        if (::waitpid(host->sshd, nullptr, WNOHANG) == host->sshd) {
          host->sshd = -1;
          return true;
        }
        return Accepts(host->address, 22);
      },
      std::chrono::seconds(10));
  if (!up || host->sshd < 0) {
    throw std::runtime_error("sshd in " + host->netns + " did not start: " + ReadFile(log));
  }
}

int SshTestCluster::RunIn(int i, const std::vector<std::string>& argv) const {
  std::vector<std::string> full = {"ip", "netns", "exec", hosts_[i].netns};
  full.insert(full.end(), argv.begin(), argv.end());
  return Run(full).code;
}

std::string SshTestCluster::WriteHostfile(int count) const {
  const size_t listed = count < 0 ? hosts_.size() : static_cast<size_t>(count);
  std::string text = "# made by SshTestCluster\n";
  for (size_t i = 0; i < listed && i < hosts_.size(); ++i) text += hosts_[i].address + "\n";
  const std::string path = dir_ / "hosts";
  WriteText(path, text);
  return path;
}

std::vector<pid_t> SshTestCluster::PidsOn(int i) const {
  return PidsInNetns(hosts_[i].netns).value_or(std::vector<pid_t>{});
}

void SshTestCluster::TearDown() {
  for (Host& h : hosts_) {
    KillEverythingIn(h.netns);
    if (h.sshd > 0) {
      ::kill(-h.sshd, SIGKILL);
      ::waitpid(h.sshd, nullptr, 0);  // SIGKILLed: returns at once
      h.sshd = -1;
    }
    Run({"ip", "netns", "del", h.netns});  // takes the veth pair with it
  }
  hosts_.clear();
  if (bridge_made_) Run({"ip", "link", "del", bridge_});
  bridge_made_ = false;
}

}  // namespace dtrain::launcher::testing
