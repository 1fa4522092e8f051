// What one timeline span (report/timeline.h) costs the thread that records it, in nanoseconds:
// off (DTRAIN_TIMELINE unset) and on, with the arguments a kvstore span carries. The recording
// thread's cost only: sending the events to the launcher happens on the reports' thread.
// Prints one JSON line:
//   {"bench":"timeline_span","enabled":true,"spans":..,"ns_per_span":..}
//
//   build/bench/timeline_span_bench [--spans 1000000]
//   DTRAIN_TIMELINE=/tmp/t.json build/bench/timeline_span_bench
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "report/timeline.h"

int main(int argc, char** argv) {
  CLI::App app{"timeline span cost"};
  int64_t spans = 1000000;
  app.add_option("--spans", spans, "spans to record")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  namespace timeline = dtrain::timeline;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < spans; ++i) {
    timeline::Span span(
        "push", "kvstore",
        timeline::Enabled() ? timeline::Args().Int("key", i).Int("bytes", 4096) : timeline::Args());
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s\n", nlohmann::json{{"bench", "timeline_span"},
                                     {"enabled", timeline::Enabled()},
                                     {"spans", spans},
                                     {"ns_per_span", ns / static_cast<double>(spans)}}
                          .dump()
                          .c_str());
}
