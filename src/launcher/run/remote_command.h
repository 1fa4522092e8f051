// The local commands that run a job's process on another host through ssh, and copy the working
// directory there with rsync. Pure functions of their arguments: a test checks every word.
//
// A remote process must not outlive the job. sshd gives a session without a terminal no signal
// when the connection drops, so the remote side runs the process under a guard (a few lines of
// POSIX sh, nothing to install): the process runs in the background of the guard, in the session's
// process group (sshd makes each session a new one), while the guard reads the session's stdin. The
// launcher holds the write end of every ssh client's stdin open and never writes, so EOF there
// means the launcher closed it (the job is stopping), the launcher died, or the ssh client or
// its connection died. At EOF the guard sends SIGTERM to the whole remote group, and SIGKILL after
// the kill grace. When the process ends by itself, the guard exits with its code (128 + signal
// for a signal), which ssh passes on as its own exit code (255 is ssh's own failure), and what
// it left behind in the group is stopped the same way once the session closes.
#pragma once

#include <string>
#include <vector>

#include "dtrain/common/deadline.h"
#include "launcher/plan/launch_options.h"

namespace dtrain::launcher {

// `word` as one word for a POSIX shell: unchanged when it only has characters no shell treats
// specially, else in single quotes with each ' written as '\''. "" becomes ''.
std::string ShellQuote(const std::string& word);

// Words joined by spaces, each quoted.
std::string ShellJoin(const std::vector<std::string>& words);

// The script the remote login shell runs for one process:
//   cd DIR && exec env NAME=VALUE... /bin/sh -c GUARD dtrain-remote ARGV...
// `kill_grace`: how long the guard waits between SIGTERM and SIGKILL (rounded up to seconds).
// `secret_on_stdin`: the guard first reads one line from the session's stdin into
// DTRAIN_JOB_SECRET (exported to the process), so that the secret is on no command line, here or
// there (the launcher writes it: ProcessSpec::stdin_preamble).
std::string RemoteScript(const std::string& dir, const std::vector<EnvVar>& env,
                         const std::vector<std::string>& argv, Duration kill_grace,
                         bool secret_on_stdin = false);

// The ssh client's argv for `host` (as written in the hostfile, e.g. "alice@node-a"):
//   ssh USER_OPTIONS... -T -o BatchMode=yes -o ConnectTimeout=S -o ServerAliveInterval=5
//       -o ServerAliveCountMax=3 -- HOST SCRIPT
// The user's options come first because ssh keeps the first value it sees for each option, so
// the user can override ours (e.g. -o ConnectTimeout=60). BatchMode: never prompt (no terminal).
// ServerAlive*: a host that vanishes ends its ssh client within ~15 s, which stops the job.
std::vector<std::string> SshCommand(const std::vector<std::string>& user_options,
                                    const std::string& host, const std::string& script);

// `ssh -G USER_OPTIONS... -- HOST`: prints the configuration ssh would use for HOST (its
// `hostname` line resolves aliases and drops user@), without connecting.
std::vector<std::string> SshConfigQuery(const std::vector<std::string>& user_options,
                                        const std::string& host);

// The `hostname` value in `ssh -G` output; empty if there is none.
std::string HostnameFromSshConfig(const std::string& ssh_g_output);

// rsync -a of `src_dir`'s contents into HOST:DST_DIR (created with its parents), over the same
// ssh options. rsync's --timeout ends a transfer that makes no progress for `stall_timeout`.
std::vector<std::string> RsyncCommand(const std::vector<std::string>& user_options,
                                      const std::string& src_dir, const std::string& host,
                                      const std::string& dst_dir, Duration stall_timeout);

// The options of the ssh commands above, without the user's: also used to build rsync's -e.
std::vector<std::string> DefaultSshOptions();

}  // namespace dtrain::launcher
