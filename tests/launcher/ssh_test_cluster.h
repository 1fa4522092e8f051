// A throwaway cluster of "hosts" for the ssh launcher's tests: network namespaces on one bridge,
// each running its own real sshd, reachable from the root namespace where the tests and the
// launcher run.
//
//   root namespace:  bridge dtb<id>, 10.A.B.1/24
//   host i:          namespace dtrain-ssh-<pid>-<n>-<i>, veth dtb<id> 10.A.B.(2+i)/24, lo, sshd :22
//
// The namespaces share the file system and the pid namespace with the test, so the binaries in
// the build directory run there at the same paths, and the test sees (and can kill) every remote
// process. Keys are made for the test (ssh-keygen); ssh_config() names a client configuration
// that logs in as root with them and trusts any host key.
//
// Ownership: the cluster owns everything it made. Its destructor kills every process inside each
// namespace (sshd and whatever a job left there), deletes the namespaces and the bridge. A run
// that crashed before its destructor leaves names with its pid; the next cluster removes those of
// pids that no longer exist. Every command it runs has a deadline.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "launch_test_support.h"

namespace dtrain::launcher::testing {

class SshTestCluster {
 public:
  // Why no cluster can be made here (not root, no `ip`, no sshd, `ip netns add` refused), or
  // nullopt when one can.
  static std::optional<std::string> WhyUnavailable();

  // Builds `num_hosts` hosts and waits until each one's sshd accepts connections. Throws
  // std::runtime_error naming the step that failed (after undoing what was made).
  explicit SshTestCluster(int num_hosts);
  ~SshTestCluster();
  SshTestCluster(const SshTestCluster&) = delete;
  SshTestCluster& operator=(const SshTestCluster&) = delete;

  int size() const { return static_cast<int>(hosts_.size()); }
  const std::string& address(int i) const { return hosts_[i].address; }  // 10.A.B.(2+i)
  const std::string& netns(int i) const { return hosts_[i].netns; }
  const std::string& root_address() const { return root_address_; }  // 10.A.B.1, on the bridge
  // The subnet's interface has this name here (the bridge) and on every host, so that one
  // --interface fits all.
  const std::string& interface_name() const { return bridge_; }
  // An address of the subnet that no host has.
  std::string unused_address() const { return prefix_ + "99"; }

  // A hostfile listing the first `count` hosts (all: -1) by address, one a line.
  std::string WriteHostfile(int count = -1) const;
  // The processes running in host `i`'s namespace (`ip netns pids`).
  std::vector<pid_t> PidsOn(int i) const;
  // For --ssh-opts: "-F <client config>".
  std::string ssh_opts() const { return "-F " + (dir_ / "ssh_config"); }

  // Runs argv inside host i's namespace (ip netns exec), up to 10 s; returns its exit code.
  int RunIn(int i, const std::vector<std::string>& argv) const;

 private:
  struct Host {
    std::string netns;
    std::string veth_root;  // the end in the root namespace, on the bridge
    std::string veth_host;  // the end inside the namespace
    std::string address;
    pid_t sshd = -1;
  };

  void Build(int num_hosts);
  void StartSshd(Host* host, int index);
  void TearDown();

  TempDir dir_;
  int serial_ = 0;      // clusters made by this process so far, this one included
  std::string id_;      // unique per cluster: <pid>-<serial>
  std::string bridge_;  // dtb<short id>
  std::string prefix_;  // "10.A.B."
  std::string root_address_;
  bool bridge_made_ = false;
  std::vector<Host> hosts_;
};

}  // namespace dtrain::launcher::testing
