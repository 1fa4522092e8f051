#include "launcher/run/remote_command.h"

#include <algorithm>
#include <sstream>

namespace dtrain::launcher {
namespace {

constexpr int kConnectTimeoutS = 10;
constexpr int kServerAliveIntervalS = 5;
constexpr int kServerAliveCountMax = 3;

bool IsPlainShellChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("_-./:=@%+,").find(c) != std::string_view::npos;
}

// The guard (see the header). $1... is the process's argv. Written with double quotes only, so
// that quoting it for the login shell stays readable in `ps` and in error messages.
//  - the process starts before the trap, so it keeps the default SIGTERM action;
//  - it gets stdin from /dev/null, so only the watcher reads the session's stdin (fd 3);
//  - the watcher ignores SIGTERM (inherited trap) so that its own kill -TERM 0 does not stop it
//    before the SIGKILL; its output goes to /dev/null so it never keeps the session open;
//  - `wait` returns the process's code, or 128 + signal, and the guard exits with it.
std::string Guard(int grace_s, bool secret_on_stdin) {
  // `read` takes the first line only (sh reads a pipe byte by byte), leaving EOF for the watcher.
  const std::string secret = secret_on_stdin ? "IFS= read -r DTRAIN_JOB_SECRET || { echo "
                                               "\"dtrain-remote: no job secret on stdin\" >&2; "
                                               "exit 1; }; export DTRAIN_JOB_SECRET; "
                                             : "";
  return secret +
         "exec 3<&0 </dev/null; \"$@\" 3<&- & job=$!; trap \"\" TERM; "
         "(cat <&3; kill -TERM 0; sleep " +
         std::to_string(grace_s) + "; kill -KILL 0) >/dev/null 2>&1 & exec 3<&-; wait $job";
}

}  // namespace

std::string ShellQuote(const std::string& word) {
  if (!word.empty() && std::all_of(word.begin(), word.end(), IsPlainShellChar)) return word;
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string ShellJoin(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) {
    if (!out.empty()) out += ' ';
    out += ShellQuote(w);
  }
  return out;
}

std::string RemoteScript(const std::string& dir, const std::vector<EnvVar>& env,
                         const std::vector<std::string>& argv, Duration kill_grace,
                         bool secret_on_stdin) {
  const int64_t grace_ms = std::max<int64_t>(kill_grace.count(), 1);
  const int grace_s = static_cast<int>((grace_ms + 999) / 1000);
  std::vector<std::string> words = {"exec", "env"};
  for (const auto& [name, value] : env) words.push_back(name + "=" + value);
  for (const std::string& w : {std::string("/bin/sh"), std::string("-c"),
                               Guard(grace_s, secret_on_stdin), std::string("dtrain-remote")}) {
    words.push_back(w);
  }
  words.insert(words.end(), argv.begin(), argv.end());
  return "cd " + ShellQuote(dir) + " && " + ShellJoin(words);
}

std::vector<std::string> DefaultSshOptions() {
  return {"-T",
          "-o",
          "BatchMode=yes",
          "-o",
          "ConnectTimeout=" + std::to_string(kConnectTimeoutS),
          "-o",
          "ServerAliveInterval=" + std::to_string(kServerAliveIntervalS),
          "-o",
          "ServerAliveCountMax=" + std::to_string(kServerAliveCountMax)};
}

std::vector<std::string> SshCommand(const std::vector<std::string>& user_options,
                                    const std::string& host, const std::string& script) {
  std::vector<std::string> argv = {"ssh"};
  argv.insert(argv.end(), user_options.begin(), user_options.end());
  for (const std::string& o : DefaultSshOptions()) argv.push_back(o);
  // `--`: a host that starts with '-' is a host, not an option.
  for (const std::string& w : {std::string("--"), host, script}) argv.push_back(w);
  return argv;
}

std::vector<std::string> SshConfigQuery(const std::vector<std::string>& user_options,
                                        const std::string& host) {
  std::vector<std::string> argv = {"ssh", "-G"};
  argv.insert(argv.end(), user_options.begin(), user_options.end());
  argv.push_back("--");
  argv.push_back(host);
  return argv;
}

std::string HostnameFromSshConfig(const std::string& ssh_g_output) {
  std::istringstream in(ssh_g_output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("hostname ", 0) == 0) return line.substr(9);
  }
  return "";
}

std::vector<std::string> RsyncCommand(const std::vector<std::string>& user_options,
                                      const std::string& src_dir, const std::string& host,
                                      const std::string& dst_dir, Duration stall_timeout) {
  // rsync splits -e itself and understands shell quoting.
  std::vector<std::string> ssh = {"ssh"};
  ssh.insert(ssh.end(), user_options.begin(), user_options.end());
  for (const std::string& o : DefaultSshOptions()) ssh.push_back(o);
  const int64_t timeout_s = std::max<int64_t>((stall_timeout.count() + 999) / 1000, 1);
  // An IPv6 address needs brackets before rsync's HOST:PATH colon.
  const std::string remote_host = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::string src = src_dir;
  if (src.empty() || src.back() != '/') src += '/';  // the contents, not the directory itself
  return {"rsync", "-a", "--timeout=" + std::to_string(timeout_s), "-e", ShellJoin(ssh),
          // rsync creates only the last component of the destination.
          "--rsync-path=mkdir -p " + ShellQuote(dst_dir) + " && rsync", "--", src,
          remote_host + ":" + dst_dir};
}

}  // namespace dtrain::launcher
