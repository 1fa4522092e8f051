// Helpers for the tests of the cluster backends (mpi, slurm, sge): what a FrontEndParser passed
// on, finding programs, and what every backend's launch tests check alike.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "launch_test_support.h"
#include "launcher/plan/cluster_tools/cluster_tool_plan.h"
#include "launcher/plan/local_address.h"
#include "launcher/watch/cluster_tool_job.h"

namespace dtrain::launcher::testing {

// Everything a parser passed on, joined per task and stream, plus the tool's lines in order.
struct ParsedOutput {
  std::map<int, std::string> task_out;
  std::map<int, std::string> task_err;
  std::vector<std::string> tool_lines;
  std::vector<TaskFailure> failures;

  FrontEndParser::Sink Sink() {
    FrontEndParser::Sink sink;
    sink.task_output = [this](int task, bool to_stderr, std::string_view bytes) {
      (to_stderr ? task_err : task_out)[task].append(bytes);
    };
    sink.tool_line = [this](std::string_view line, bool) { tool_lines.emplace_back(line); };
    sink.task_failure = [this](const TaskFailure& f) { failures.push_back(f); };
    return sink;
  }
};

// Feeds `data` to the parser one byte at a time (the worst split a pipe can produce), then ends
// the stream.
inline ParsedOutput FeedBytewise(FrontEndParser& parser, const std::string& data,
                                 bool from_stderr) {
  ParsedOutput out;
  FrontEndParser::Sink sink = out.Sink();
  for (char c : data) parser.Feed(std::string_view(&c, 1), from_stderr, sink);
  parser.Finish(from_stderr, sink);
  return out;
}

inline ParsedOutput FeedWhole(FrontEndParser& parser, const std::string& data, bool from_stderr) {
  ParsedOutput out;
  FrontEndParser::Sink sink = out.Sink();
  parser.Feed(data, from_stderr, sink);
  parser.Finish(from_stderr, sink);
  return out;
}

// A built test program, e.g. "tests/programs/kv_check_worker"; empty when it was not built.
inline std::string BuiltProgram(const std::string& relative) {
  const std::string path = std::string(DTRAIN_BINARY_DIR) + "/" + relative;
  return FindProgram(path).value_or("");
}

// Declares `var`, kv_check_worker's path, or skips the test when it was not built.
#define REQUIRE_KV_CHECK_WORKER(var)                                      \
  const std::string var = BuiltProgram("tests/programs/kv_check_worker"); \
  if (var.empty()) GTEST_SKIP() << "kv_check_worker is not built (ninja kv_check_worker)"

// The launcher's end-of-job summary names `node` as the job's cause from the scheduler's
// structured failure record (launcher/status/job_status.h), which no log line can forge.
inline ::testing::Matcher<const std::string&> CauseReportedByScheduler(const std::string& node) {
  return ::testing::ContainsRegex("dtrain launch:   the job's cause: " + node +
                                  " failed: [^\n]* \\(reported by the scheduler\\)\n");
}

// The launcher's stdout after kv_check_worker --scenario sync ran as two workers.
inline ::testing::Matcher<const std::string&> TwoWorkersSynced() {
  return ::testing::AllOf(::testing::HasSubstr("[worker 0] sync OK: rank 0 of 2"),
                          ::testing::HasSubstr("[worker 1] sync OK: rank 1 of 2"));
}

// `dtrain launch --launcher LAUNCHER` where PATH does not find `program`: a usage error (exit 2)
// that names the program, before anything starts.
inline void ExpectMissingProgramIsAUsageError(const std::string& launcher,
                                              const std::string& program) {
  LaunchProcess launch({"--launcher", launcher, "-n", "2", "--", "true"}, {},
                       "PATH=/nonexistent; export PATH");
  LaunchResult r = launch.Wait();
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, ::testing::HasSubstr("--launcher " + launcher + " needs " + program +
                                          ", which is not in PATH"));
  EXPECT_THAT(r.err, ::testing::Not(::testing::HasSubstr("starting")));
}

}  // namespace dtrain::launcher::testing
