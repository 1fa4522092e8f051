// Parsing `dtrain launch -H FILE`: hosts, slots, comments, and errors that name file:line.
#include "launcher/plan/hostfile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "launch_test_support.h"
#include "launcher/plan/launch_options.h"

namespace dtrain::launcher {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Names(const std::vector<HostEntry>& hosts) {
  std::vector<std::string> out;
  for (const HostEntry& h : hosts) out.push_back(h.host + "/" + std::to_string(h.slots));
  return out;
}

std::string ErrorOf(const std::string& text) {
  try {
    ParseHostfile(text, "hosts.txt");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Hostfile, NamesAddressesSlotsAndComments) {
  const std::string text =
      "# the cluster\n"
      "node-a\n"
      "\n"
      "   10.0.0.2:4   # trailing comment\n"
      "\t# indented comment\n"
      "user@node-c.example.com\r\n"
      "fe80::1\n"
      "[::1]:2\n"
      "[2001:db8::5]\n"
      "node-a\n";
  EXPECT_THAT(Names(ParseHostfile(text, "h")),
              ::testing::ElementsAre("node-a/1", "10.0.0.2/4", "user@node-c.example.com/1",
                                     "fe80::1/1", "::1/2", "2001:db8::5/1", "node-a/1"));
}

TEST(Hostfile, NoFinalNewline) {
  EXPECT_THAT(Names(ParseHostfile("a\nb:3", "h")), ::testing::ElementsAre("a/1", "b/3"));
}

TEST(Hostfile, ErrorsNameFileAndLine) {
  EXPECT_THAT(ErrorOf("a\n\nb:0\n"), HasSubstr("hosts.txt:3: bad slot count '0'"));
  EXPECT_THAT(ErrorOf("a:x"), HasSubstr("hosts.txt:1: bad slot count 'x'"));
  EXPECT_THAT(ErrorOf("a:"), HasSubstr("hosts.txt:1: bad slot count ''"));
  EXPECT_THAT(ErrorOf("a:-2"), HasSubstr("hosts.txt:1: bad slot count '-2'"));
  EXPECT_THAT(ErrorOf("a:2x"), HasSubstr("hosts.txt:1: bad slot count '2x'"));
  EXPECT_THAT(ErrorOf("a:99999999999"), HasSubstr("bad slot count"));
  EXPECT_THAT(ErrorOf("# c\nnode slots=4\n"),
              HasSubstr("hosts.txt:2: 'node slots=4' is not a host"));
  EXPECT_THAT(ErrorOf(":4"), HasSubstr("hosts.txt:1: ':4' has no host name"));
  EXPECT_THAT(ErrorOf("[::1"), HasSubstr("hosts.txt:1: '[::1' is not a host"));
  EXPECT_THAT(ErrorOf("[::1]4"), HasSubstr("hosts.txt:1: '[::1]4' is not a host"));
  EXPECT_THAT(ErrorOf("[]:4"), HasSubstr("is not a host"));
}

TEST(Hostfile, EmptyFileIsAnError) {
  EXPECT_THAT(ErrorOf(""), HasSubstr("hosts.txt: no hosts"));
  EXPECT_THAT(ErrorOf("# only\n\n   \n"), HasSubstr("hosts.txt: no hosts"));
}

TEST(Hostfile, ReadsAFile) {
  testing::TempDir dir;
  const std::string path = dir / "hosts";
  std::ofstream(path) << "h1\nh2:2\n";
  EXPECT_THAT(Names(ReadHostfile(path)), ::testing::ElementsAre("h1/1", "h2/2"));
}

TEST(Hostfile, UnreadableFileNamesIt) {
  testing::TempDir dir;
  try {
    ReadHostfile(dir / "missing");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("-H/--hostfile " + (dir / "missing") + ": cannot read it"));
  }
}

}  // namespace
}  // namespace dtrain::launcher
