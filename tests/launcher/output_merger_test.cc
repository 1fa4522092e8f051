// Line splitting and prefixed merging, on temporary files instead of a terminal.
#include "launcher/run/output_merger.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

namespace dtrain::launcher {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Split(LineSplitter& s, const std::vector<std::string>& pieces,
                               bool finish = true) {
  std::vector<std::string> lines;
  auto emit = [&](std::string_view l) { lines.emplace_back(l); };
  for (const std::string& p : pieces) s.Append(p, emit);
  if (finish) s.Finish(emit);
  return lines;
}

TEST(LineSplitter, JoinsPiecesIntoLines) {
  LineSplitter s;
  EXPECT_THAT(Split(s, {"ab", "c\nde", "f\n\ng", "h"}), ElementsAre("abc", "def", "", "gh"));
  EXPECT_EQ(s.pending_bytes(), 0u);
}

TEST(LineSplitter, KeepsAnIncompleteLineUntilFinish) {
  LineSplitter s;
  EXPECT_THAT(Split(s, {"one\ntw", "o"}, false), ElementsAre("one"));
  EXPECT_EQ(s.pending_bytes(), 3u);
  EXPECT_THAT(Split(s, {}), ElementsAre("two"));
}

TEST(LineSplitter, CutsLongLinesTheSameWayHoweverTheyArrive) {
  const std::string line(10, 'x');
  LineSplitter whole(4), bytewise(4);
  EXPECT_THAT(Split(whole, {line + "\n"}), ElementsAre("xxxx", "xxxx", "xx"));
  std::vector<std::string> bytes(line.size(), "x");
  bytes.push_back("\n");
  EXPECT_THAT(Split(bytewise, bytes), ElementsAre("xxxx", "xxxx", "xx"));
}

TEST(LineSplitter, ALineOfExactlyTheLimitIsNotFollowedByAnEmptyOne) {
  LineSplitter s(4);
  EXPECT_THAT(Split(s, {"abcd", "\n", "ef\n"}), ElementsAre("abcd", "ef"));
}

// A temporary file standing in for a terminal or a log.
class TempFile {
 public:
  TempFile() : file_(std::tmpfile()) {}
  ~TempFile() { std::fclose(file_); }
  int fd() const { return fileno(file_); }
  std::string Contents() const {
    std::string out;
    char buf[4096];
    for (off_t off = 0;;) {
      ssize_t n = ::pread(fd(), buf, sizeof(buf), off);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
      off += n;
    }
    return out;
  }

 private:
  FILE* file_;
};

TEST(OutputMerger, InterleavesWholePrefixedLines) {
  TempFile out, err, log0;
  OutputMerger m(out.fd(), err.fd());
  auto w0 = m.AddStream("[worker 0] ", false, log0.fd());
  auto w1 = m.AddStream("[worker 1] ", false, -1);
  auto e0 = m.AddStream("[worker 0] ", true, log0.fd());
  m.Write(w0, "hel");
  m.Write(w1, "other\nhalf");
  m.Write(w0, "lo\nworld");
  m.Write(e0, "oops\n");
  m.LauncherLine("dtrain launch: note");
  m.Close(w0);
  m.Close(w1);
  m.Close(w1);  // idempotent
  m.Write(w1, "ignored after close\n");
  EXPECT_EQ(out.Contents(),
            "[worker 1] other\n[worker 0] hello\n[worker 0] world\n[worker 1] half\n");
  EXPECT_EQ(err.Contents(), "[worker 0] oops\ndtrain launch: note\n");
  EXPECT_EQ(log0.Contents(), "hello\noops\nworld\n");
}

TEST(OutputMerger, SkipsADescriptorThatFails) {
  TempFile err;
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[0]);  // nobody reads: writes fail with EPIPE (SIGPIPE is ignored below)
  auto old = std::signal(SIGPIPE, SIG_IGN);
  OutputMerger m(pipe_fds[1], err.fd());
  auto s = m.AddStream("[worker 0] ", false, -1);
  m.Write(s, "lost\n");
  m.Write(s, "lost too\n");
  std::signal(SIGPIPE, old);
  ::close(pipe_fds[1]);
  // One warning, not one per line.
  std::string e = err.Contents();
  EXPECT_NE(e.find("cannot write output"), std::string::npos) << e;
  EXPECT_EQ(e.find("cannot write output"), e.rfind("cannot write output")) << e;
}

}  // namespace
}  // namespace dtrain::launcher
