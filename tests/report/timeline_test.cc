// timeline::Args (report/timeline.h): arguments rendered as JSON members that any text, however
// odd, cannot break out of.
#include "report/timeline.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace dtrain::timeline {
namespace {

TEST(TimelineArgs, RenderAsMembersOfAJsonObject) {
  EXPECT_EQ(Args().text(), "");
  const Args args = Args().Int("step", 3).Str("key", "w").Int("bytes", -1);
  EXPECT_EQ(args.text(), R"("step":3,"key":"w","bytes":-1)");
}

TEST(TimelineArgs, AnyTextStaysInsideItsString) {
  std::string odd = "quote\" backslash\\ newline\n tab\t nul";
  odd += '\0';
  odd += "\x01 end\"}]";
  const Args args = Args().Str("name", odd);
  const nlohmann::json parsed = nlohmann::json::parse("{" + args.text() + "}", nullptr, false);
  ASSERT_TRUE(parsed.is_object()) << args.text();
  ASSERT_EQ(parsed.size(), 1u);
  // Quotes and backslashes kept, control characters blanked.
  EXPECT_EQ(parsed["name"].get<std::string>(), "quote\" backslash\\ newline  tab  nul   end\"}]");
}

}  // namespace
}  // namespace dtrain::timeline
