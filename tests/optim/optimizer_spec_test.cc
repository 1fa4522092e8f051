// OptimizerSpec's JSON form (it travels to the servers) and CreateOptimizer's checks: every bad
// spec is an InvalidArgument that says what is wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/common/error.h"
#include "optim/optimizer.h"
#include "support/invalid_argument_from.h"

namespace dtrain {
namespace {

using test_support::InvalidArgumentFrom;
using ::testing::HasSubstr;

std::string FromJsonError(const std::string& json) {
  return InvalidArgumentFrom([&] { OptimizerSpec::FromJson(json); });
}

std::string CreateError(OptimizerSpec spec) {
  return InvalidArgumentFrom([&] { CreateOptimizer(spec); });
}

// ---- JSON ----

TEST(OptimizerSpecTest, JsonRoundTripKeepsEveryBit) {
  OptimizerSpec spec{"sgd",
                     {{"learning_rate", 0.1},
                      {"momentum", 1.0 / 3.0},
                      {"wd", 1e-7},
                      {"rescale_grad", 1.0 / 256},
                      {"clip_gradient", -1},
                      {"nesterov", 1}}};
  const OptimizerSpec back = OptimizerSpec::FromJson(spec.ToJson());
  EXPECT_EQ(back.name, spec.name);
  EXPECT_EQ(back.params, spec.params);  // doubles compared exactly
}

TEST(OptimizerSpecTest, JsonRoundTripKeepsTheSchedule) {
  const OptimizerSpec spec{"adam", {{"learning_rate", 0.01}, {"lr_max_update", 100}}, "cosine"};
  const std::string json = spec.ToJson();
  EXPECT_THAT(json, HasSubstr(R"("lr_scheduler":"cosine")"));
  const OptimizerSpec back = OptimizerSpec::FromJson(json);
  EXPECT_EQ(back.name, "adam");
  EXPECT_EQ(back.params, spec.params);
  EXPECT_EQ(back.lr_scheduler, "cosine");
}

TEST(OptimizerSpecTest, NoScheduleWritesNoScheduleField) {
  // Specs without a schedule read exactly as before schedules existed.
  EXPECT_EQ(OptimizerSpec({"sgd", {{"wd", 0.5}}}).ToJson(),
            R"({"name":"sgd","params":{"wd":0.5}})");
  EXPECT_EQ(OptimizerSpec::FromJson(R"({"name": "sgd", "params": {}})").lr_scheduler, "");
  EXPECT_EQ(
      OptimizerSpec::FromJson(R"({"name": "sgd", "params": {}, "lr_scheduler": ""})").lr_scheduler,
      "");
}

TEST(OptimizerSpecTest, NonStringScheduleIsRefused) {
  for (const std::string value : {"1", "null", "true", R"(["step"])", R"({"kind": "step"})"}) {
    SCOPED_TRACE(value);
    EXPECT_THAT(FromJsonError(R"({"name": "sgd", "params": {}, "lr_scheduler": )" + value + "}"),
                HasSubstr("\"lr_scheduler\" must be a string"));
  }
}

TEST(OptimizerSpecTest, JsonRoundTripWithoutParams) {
  const OptimizerSpec back = OptimizerSpec::FromJson(OptimizerSpec{"SGD", {}}.ToJson());
  EXPECT_EQ(back.name, "SGD");
  EXPECT_TRUE(back.params.empty());
}

TEST(OptimizerSpecTest, ReadsHandWrittenJson) {
  const OptimizerSpec spec = OptimizerSpec::FromJson(
      R"( { "params": {"learning_rate": 1, "momentum": 9e-1}, "name": "sgd" } )");
  EXPECT_EQ(spec.name, "sgd");
  EXPECT_EQ(spec.params.at("learning_rate"), 1.0);
  EXPECT_EQ(spec.params.at("momentum"), 0.9);
}

TEST(OptimizerSpecTest, MalformedTextIsRefused) {
  const std::vector<std::string> texts = {
      "",
      "{",
      "not json",
      R"({"name": "sgd", "params": {}} trailing)",
      R"({"name": "sgd", "params": {"wd": 0.1,}})",
      std::string("{\"name\": \"s\xff\", \"params\": {}}"),  // not UTF-8
      std::string("{\"name\": \"sgd\"\0, \"params\": {}}", 30)};
  for (const std::string& text : texts) {
    SCOPED_TRACE(text);
    EXPECT_THAT(FromJsonError(text), HasSubstr("not valid JSON"));
  }
}

TEST(OptimizerSpecTest, WrongShapesAreRefused) {
  EXPECT_THAT(FromJsonError("[]"), HasSubstr("expected a JSON object, got array"));
  EXPECT_THAT(FromJsonError("null"), HasSubstr("expected a JSON object, got null"));
  EXPECT_THAT(FromJsonError("42"), HasSubstr("expected a JSON object, got number"));
  EXPECT_THAT(FromJsonError(R"("sgd")"), HasSubstr("expected a JSON object, got string"));
  EXPECT_THAT(FromJsonError(R"({"params": {}})"), HasSubstr("\"name\" must be a non-empty string"));
  EXPECT_THAT(FromJsonError(R"({"name": 3, "params": {}})"), HasSubstr("\"name\""));
  EXPECT_THAT(FromJsonError(R"({"name": "", "params": {}})"), HasSubstr("\"name\""));
  EXPECT_THAT(FromJsonError(R"({"name": "sgd"})"), HasSubstr("\"params\" must be an object"));
  EXPECT_THAT(FromJsonError(R"({"name": "sgd", "params": [1, 2]})"),
              HasSubstr("\"params\" must be an object"));
  EXPECT_THAT(FromJsonError(R"({"name": "sgd", "params": {}, "lr": 0.1})"),
              HasSubstr("unexpected field 'lr'"));
}

TEST(OptimizerSpecTest, NonNumericParametersAreRefused) {
  for (const std::string value : {R"("0.1")", "true", "null", "[0.1]", R"({"v": 0.1})"}) {
    SCOPED_TRACE(value);
    EXPECT_THAT(FromJsonError(R"({"name": "sgd", "params": {"learning_rate": )" + value + "}}"),
                HasSubstr("parameter 'learning_rate' of optimizer 'sgd' must be a number"));
  }
}

TEST(OptimizerSpecTest, HugeAndDeepTextIsRefusedWithoutCrashing) {
  EXPECT_THAT(FromJsonError(std::string(1 << 20, ' ')), HasSubstr("more than"));
  const std::string deep = std::string(30000, '[') + std::string(30000, ']');
  EXPECT_THAT(FromJsonError(deep), HasSubstr("expected a JSON object"));
}

TEST(OptimizerSpecTest, ToJsonRefusesWhatJsonCannotCarry) {
  OptimizerSpec nan{"sgd", {{"learning_rate", std::numeric_limits<double>::quiet_NaN()}}};
  EXPECT_THAT(InvalidArgumentFrom([&] { nan.ToJson(); }), HasSubstr("learning_rate"));
  OptimizerSpec inf{"sgd", {{"wd", std::numeric_limits<double>::infinity()}}};
  EXPECT_THAT(InvalidArgumentFrom([&] { inf.ToJson(); }), HasSubstr("wd"));
  OptimizerSpec bad_utf8{"s\xff", {}};
  EXPECT_THAT(InvalidArgumentFrom([&] { bad_utf8.ToJson(); }), HasSubstr("cannot be written"));
}

// ---- CreateOptimizer ----

TEST(CreateOptimizerTest, NameIsCaseInsensitive) {
  for (const char* name : {"sgd", "SGD", "Sgd"}) {
    auto opt = CreateOptimizer({name, {{"learning_rate", 0.5}}});
    ASSERT_NE(opt, nullptr);
    EXPECT_EQ(opt->spec().name, name);
    EXPECT_EQ(opt->learning_rate(), 0.5);
  }
}

TEST(CreateOptimizerTest, UnknownOptimizerListsTheKnownOnes) {
  const std::string message = CreateError({"adamw", {}});
  EXPECT_THAT(message, HasSubstr("unknown optimizer 'adamw'"));
  EXPECT_THAT(message, HasSubstr("known optimizers: sgd, nag, adam, adagrad, rmsprop"));
}

TEST(CreateOptimizerTest, EveryRegisteredNameBuildsWithMxnetsDefaultRate) {
  const std::pair<const char*, double> cases[] = {
      {"sgd", 0.01}, {"NAG", 0.01}, {"Adam", 0.001}, {"adagrad", 0.01}, {"RMSProp", 0.001}};
  for (const auto& [name, rate] : cases) {
    SCOPED_TRACE(name);
    auto opt = CreateOptimizer({name, {}});
    ASSERT_NE(opt, nullptr);
    EXPECT_EQ(opt->learning_rate(), rate);
    EXPECT_EQ(opt->spec().name, name);
  }
}

TEST(CreateOptimizerTest, NagIsSgdWithNesterovMomentum) {
  auto nag = CreateOptimizer({"nag", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 0.01}}});
  auto sgd = CreateOptimizer(
      {"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 0.01}, {"nesterov", 1}}});
  std::vector<float> a{1.f, -2.f}, b = a;
  for (int i = 0; i < 4; ++i) {
    const std::vector<float> g{0.5f * static_cast<float>(i), 1.f};
    nag->Update(0, a, g);
    sgd->Update(0, b, g);
  }
  EXPECT_EQ(a, b);
  EXPECT_THAT(CreateError({"nag", {{"nesterov", 1}}}), HasSubstr("no parameter 'nesterov'"));
}

TEST(CreateOptimizerTest, EveryOptimizerAcceptsTheLearningRateAndScheduleParameters) {
  for (const char* name : {"sgd", "nag", "adam", "adagrad", "rmsprop"}) {
    SCOPED_TRACE(name);
    const std::string message = CreateError({name, {{"lr", 0.1}}});
    EXPECT_THAT(message, HasSubstr("no parameter 'lr'"));
    EXPECT_THAT(message, HasSubstr("learning_rate"));
    EXPECT_THAT(message, HasSubstr("lr_step"));
    EXPECT_THAT(message, HasSubstr("lr_max_update"));
    EXPECT_NO_THROW(CreateOptimizer({name, {{"learning_rate", 0.1}, {"lr_step", 10}}, "step"}));
  }
}

TEST(CreateOptimizerTest, UnknownParameterIsNamedWithTheAcceptedOnes) {
  const std::string message = CreateError({"sgd", {{"lr", 0.1}}});
  EXPECT_THAT(message, HasSubstr("no parameter 'lr'"));
  EXPECT_THAT(message, HasSubstr("learning_rate, momentum, wd, rescale_grad, clip_gradient, "
                                 "nesterov"));
}

TEST(CreateOptimizerTest, BadValuesAreNamed) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const struct {
    const char* param;
    double value;
    const char* must;
  } cases[] = {
      {"learning_rate", -0.1, "be >= 0"}, {"learning_rate", nan, "finite"},
      {"learning_rate", inf, "finite"},   {"learning_rate", 1e300, "finite float32"},
      {"momentum", 1.0, "be in [0, 1)"},  {"momentum", 1.5, "be in [0, 1)"},
      {"momentum", -0.1, "be in [0, 1)"}, {"wd", -1e-4, "be >= 0"},
      {"rescale_grad", 0, "be > 0"},      {"rescale_grad", -1, "be > 0"},
      {"clip_gradient", nan, "finite"},   {"nesterov", 2, "be 0 or 1"},
      {"nesterov", 0.5, "be 0 or 1"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.param) + " = " + std::to_string(c.value));
    const std::string message = CreateError({"sgd", {{c.param, c.value}}});
    EXPECT_THAT(message, HasSubstr(std::string(c.param) + " = "));
    EXPECT_THAT(message, HasSubstr(c.must));
  }
}

TEST(CreateOptimizerTest, EdgeValuesAreAccepted) {
  EXPECT_NO_THROW(CreateOptimizer({"sgd", {{"learning_rate", 0}, {"momentum", 0}, {"wd", 0}}}));
  EXPECT_NO_THROW(CreateOptimizer({"sgd", {{"momentum", 0.999}, {"nesterov", 0}}}));
  EXPECT_NO_THROW(CreateOptimizer({"sgd", {{"clip_gradient", -1}, {"rescale_grad", 1e-6}}}));
}

TEST(CreateOptimizerTest, SpecFromTheWireBuildsTheSameOptimizer) {
  const OptimizerSpec spec{"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 1e-3}}};
  auto here = CreateOptimizer(spec);
  auto there = CreateOptimizer(OptimizerSpec::FromJson(spec.ToJson()));
  std::vector<float> a{1.f, -1.f, 0.5f}, b = a;
  const std::vector<float> g{0.3f, 0.2f, -0.7f};
  for (int i = 0; i < 3; ++i) {
    here->Update(0, a, g);
    there->Update(0, b, g);
  }
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace dtrain
