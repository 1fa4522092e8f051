// The ssh and rsync command lines, the shell quoting, and the remote guard, run here by a real
// /bin/sh in place of the remote login shell (no ssh needed).
#include "launcher/run/remote_command.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch_test_support.h"

namespace dtrain::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::PollUntil;
using testing::ReadFile;
using testing::TempDir;

// A /bin/sh -c SCRIPT started with its stdin a pipe we hold, stdout+stderr into a file, in a
// process group of its own (as sshd makes one per session). Killed with its group on every path.
class ShellRun {
 public:
  explicit ShellRun(const std::string& script) {
    int in[2];
    if (::pipe2(in, O_CLOEXEC) != 0) std::abort();
    const std::string out_path = dir_ / "out";
    int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::dup2(in[0], 0);
      ::dup2(out, 1);
      ::dup2(out, 2);
      ::execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
    ::close(in[0]);
    ::close(out);
    stdin_write_ = in[1];
  }
  ~ShellRun() {
    CloseStdin();
    ::kill(-pid_, SIGKILL);
    if (!reaped_) ::waitpid(pid_, nullptr, 0);
  }
  void WriteStdin(const std::string& bytes) {
    ASSERT_EQ(::write(stdin_write_, bytes.data(), bytes.size()),
              static_cast<ssize_t>(bytes.size()));
  }
  void CloseStdin() {
    if (stdin_write_ >= 0) ::close(stdin_write_);
    stdin_write_ = -1;
  }
  // The exit code as a shell reports it; -1 if it did not exit within the timeout.
  int Wait(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    int status = 0;
    bool done = PollUntil([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, timeout);
    if (!done) return -1;
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // Whether any process of the session's group is left.
  bool GroupAlive() const { return ::kill(-pid_, 0) == 0; }
  std::string Output() const { return ReadFile(dir_ / "out"); }
  const TempDir& dir() const { return dir_; }

 private:
  TempDir dir_;
  pid_t pid_ = -1;
  int stdin_write_ = -1;
  bool reaped_ = false;
};

TEST(ShellQuote, PlainWordsStayReadable) {
  EXPECT_EQ(ShellQuote("abc-1.2_x/y:z=w@h%+,"), "abc-1.2_x/y:z=w@h%+,");
  EXPECT_EQ(ShellQuote(""), "''");
  EXPECT_EQ(ShellQuote("a b"), "'a b'");
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  EXPECT_EQ(ShellJoin({"a", "b c", ""}), "a 'b c' ''");
}

// Whatever the bytes, the shell gives back exactly the word.
TEST(ShellQuote, RoundTripsThroughARealShell) {
  const std::vector<std::string> words = {
      "plain", "",     "two words", "it's",      "'",     "''", "\"double\"", "$HOME", "`id`",
      "$(id)", "a\\b", "tab\there", "new\nline", "*",     "?",  "~",          "#hash", "semi;colon",
      "&&",    "|",    "<>",        "!bang",     "{a,b}", "-n", "ünïcödé",    "a=b c"};
  ShellRun run("printf '%s\\0' " + ShellJoin(words));
  ASSERT_EQ(run.Wait(), 0) << run.Output();
  std::vector<std::string> got;
  const std::string out = run.Output();
  size_t start = 0;
  for (size_t end; (end = out.find('\0', start)) != std::string::npos; start = end + 1) {
    got.push_back(out.substr(start, end - start));
  }
  EXPECT_EQ(got, words);
}

// The job secret reaches the remote process through the session's stdin, never the script (which is
// on the ssh command line here and the shell's there), and the guard still watches stdin after it.
TEST(RemoteScript, TheSecretComesThroughStdinAndIsOnNoCommandLine) {
  TempDir dir;
  const std::string script =
      RemoteScript(dir.path(), {{"DMLC_ROLE", "worker"}},
                   {"/bin/sh", "-c", "echo \"secret=$DTRAIN_JOB_SECRET\"; exit 7"},
                   std::chrono::milliseconds(1000), /*secret_on_stdin=*/true);
  EXPECT_THAT(script, ::testing::Not(HasSubstr("s3cret")));
  ShellRun run(script);
  run.WriteStdin("s3cret-of-the-job-0123\n");
  EXPECT_EQ(run.Wait(), 7) << run.Output();
  EXPECT_THAT(run.Output(), HasSubstr("secret=s3cret-of-the-job-0123"));

  // No secret arrives (the launcher stopped first): the guard says so and starts nothing.
  ShellRun none(script);
  none.CloseStdin();
  EXPECT_EQ(none.Wait(), 1);
  EXPECT_THAT(none.Output(), HasSubstr("no job secret on stdin"));
  EXPECT_THAT(none.Output(), ::testing::Not(HasSubstr("secret=")));
}

TEST(SshCommand, UserOptionsFirstThenOursThenHostAndScript) {
  EXPECT_THAT(SshCommand({"-F", "cfg", "-p", "2222"}, "alice@node-a", "cd / && exec true"),
              ElementsAre("ssh", "-F", "cfg", "-p", "2222", "-T", "-o", "BatchMode=yes", "-o",
                          "ConnectTimeout=10", "-o", "ServerAliveInterval=5", "-o",
                          "ServerAliveCountMax=3", "--", "alice@node-a", "cd / && exec true"));
  EXPECT_THAT(SshConfigQuery({"-F", "cfg"}, "h"), ElementsAre("ssh", "-G", "-F", "cfg", "--", "h"));
}

TEST(SshCommand, HostnameFromSshG) {
  EXPECT_EQ(HostnameFromSshConfig("user root\nhostname 10.0.0.2\nport 22\n"), "10.0.0.2");
  EXPECT_EQ(HostnameFromSshConfig("user root\n"), "");
}

TEST(RsyncCommand, CopiesTheContentsOverTheSameSsh) {
  EXPECT_THAT(
      RsyncCommand({"-F", "my cfg"}, "/home/u/job", "node-a", "/tmp/dst dir", Duration(60000)),
      ElementsAre("rsync", "-a", "--timeout=60", "-e",
                  "ssh -F 'my cfg' -T -o BatchMode=yes -o ConnectTimeout=10 -o "
                  "ServerAliveInterval=5 -o ServerAliveCountMax=3",
                  "--rsync-path=mkdir -p '/tmp/dst dir' && rsync", "--", "/home/u/job/",
                  "node-a:/tmp/dst dir"));
  EXPECT_EQ(RsyncCommand({}, "/a/", "fe80::1", "/d", Duration(1)).back(), "[fe80::1]:/d");
}

TEST(RemoteScript, RunsInTheDirectoryWithTheVariablesAndPassesTheExitCode) {
  TempDir work;
  const std::string script = RemoteScript(
      work.path().string(),
      {{"DMLC_ROLE", "worker"}, {"ODD", "it's a $VALUE"}, {"ODD", "later wins"}},
      {"/bin/sh", "-c", "pwd; echo \"$DMLC_ROLE|$ODD|$1\"; exit 7", "sh", "x y"}, Duration(1000));
  EXPECT_THAT(script, HasSubstr("cd " + work.path().string() + " && exec env"));
  ShellRun run(script);
  EXPECT_EQ(run.Wait(), 7) << run.Output();
  EXPECT_EQ(run.Output(), work.path().string() + "\nworker|later wins|x y\n");
}

TEST(RemoteScript, MissingDirectoryFails) {
  ShellRun run(RemoteScript("/nonexistent/dir", {}, {"true"}, Duration(1000)));
  EXPECT_NE(run.Wait(), 0);
  EXPECT_THAT(run.Output(), HasSubstr("/nonexistent/dir"));
}

TEST(RemoteScript, ASignalBecomes128PlusIt) {
  ShellRun run(RemoteScript("/", {}, {"/bin/sh", "-c", "kill -9 $$"}, Duration(1000)));
  EXPECT_EQ(run.Wait(), 137) << run.Output();
}

// EOF on stdin (the launcher or the connection went away): the process and its children get
// SIGTERM, and whatever ignores it SIGKILL after the grace.
TEST(RemoteScript, EofOnStdinStopsTheWholeGroup) {
  TempDir work;
  const std::string pids = work / "pids";
  ShellRun run(RemoteScript(
      "/", {},
      {"/bin/sh", "-c",
       "sh -c 'trap \"\" TERM; sleep 1000' & sleep 1000 & echo $$ $! >> " + pids + "; wait"},
      Duration(1000)));
  ASSERT_TRUE(PollUntil([&] { return ReadFile(pids).size() > 2; }, std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(run.GroupAlive());
  run.CloseStdin();
  EXPECT_EQ(run.Wait(), 128 + SIGTERM) << run.Output();
  // The TERM-ignoring child goes at the SIGKILL, one grace later.
  EXPECT_TRUE(PollUntil([&] { return !run.GroupAlive(); }, std::chrono::seconds(20)));
}

// A process that ends by itself is not waited on by the guard's watcher: the guard exits at once.
TEST(RemoteScript, ExitsWhenTheProcessEndsWhileStdinStaysOpen) {
  ShellRun run(RemoteScript("/", {}, {"/bin/sh", "-c", "echo done"}, Duration(1000)));
  EXPECT_EQ(run.Wait(), 0);
  EXPECT_EQ(run.Output(), "done\n");
  // The watcher goes once the session's stdin closes, as when sshd ends the session.
  run.CloseStdin();
  EXPECT_TRUE(PollUntil([&] { return !run.GroupAlive(); }, std::chrono::seconds(20)));
}

}  // namespace
}  // namespace dtrain::launcher
