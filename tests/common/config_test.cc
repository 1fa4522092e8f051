// Config::FromEnvironment: every variable parsed, every bad value named with its value.
#include "common/config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <thread>

#include "dtrain/common/error.h"

namespace dtrain {
namespace {

using Env = std::map<std::string, std::string>;

Config Parse(const Env& env) { return Config::FromEnvironment(MapEnvironment(env)); }

// What a launched node sees: enough for a distributed role.
Env DistributedEnv(const std::string& role = "worker") {
  return {{"DMLC_ROLE", role},
          {"DMLC_PS_ROOT_URI", "10.0.0.1"},
          {"DMLC_PS_ROOT_PORT", "9091"},
          {"DMLC_NUM_SERVER", "2"},
          {"DMLC_NUM_WORKER", "3"}};
}

// Expects a ConfigError whose message contains every one of `needles`.
void ExpectConfigError(const Env& env, std::initializer_list<std::string> needles) {
  try {
    Parse(env);
    ADD_FAILURE() << "no ConfigError; expected one mentioning " << *needles.begin();
  } catch (const ConfigError& e) {
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "'" << e.what() << "' does not mention '" << needle << "'";
    }
  }
}

TEST(ConfigTest, DefaultsWithAnEmptyEnvironment) {
  const Config c = Parse({});
  EXPECT_FALSE(c.distributed());
  EXPECT_FALSE(c.role.has_value());
  EXPECT_EQ(c.scheduler_host, "");
  EXPECT_EQ(c.scheduler_port, 0);
  EXPECT_EQ(c.num_servers, 0);
  EXPECT_EQ(c.num_workers, 0);
  EXPECT_EQ(c.interface, "");
  EXPECT_EQ(c.node_host, "");
  EXPECT_EQ(c.node_port, 0);
  EXPECT_EQ(c.verbose, 0);
  EXPECT_TRUE(c.resend);
  EXPECT_EQ(c.resend_window, Duration(10000));
  EXPECT_EQ(c.resend_timeout, Duration(1000));
  EXPECT_EQ(c.heartbeat_interval, Duration(1000));
  EXPECT_EQ(c.heartbeat_timeout, Duration(15000));
  EXPECT_EQ(c.bigarray_bound, 1000000);
  EXPECT_EQ(c.reduction_threads, 4);
  EXPECT_EQ(c.connect_timeout, Duration(30000));
  EXPECT_EQ(c.start_timeout, Duration(120000));
  EXPECT_EQ(c.request_timeout, Duration(600000));
  EXPECT_EQ(c.failure_exit_grace, Duration(10000));
  const int half_the_cores =
      std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 4);
  EXPECT_EQ(c.streams_per_peer, half_the_cores);
  EXPECT_EQ(c.io_threads, half_the_cores);
  EXPECT_EQ(c.chunk_bytes, size_t{4} << 20);
  EXPECT_EQ(c.max_message_bytes, size_t{1} << 32);
}

TEST(ConfigTest, EmptyValueCountsAsUnset) {
  const Config c = Parse({{"DMLC_ROLE", ""}, {"PS_VERBOSE", ""}, {"DMLC_NUM_SERVER", ""}});
  EXPECT_FALSE(c.distributed());
  EXPECT_EQ(c.verbose, 0);
  EXPECT_EQ(c.num_servers, 0);
}

TEST(ConfigTest, AJobSecretThatIsSetMustBeLongEnoughEvenEmpty) {
  // NAME= means unset elsewhere; for the secret it would silently admit anybody.
  ExpectConfigError({{"DTRAIN_JOB_SECRET", ""}},
                    {"DTRAIN_JOB_SECRET is set but empty", "unset it"});
  ExpectConfigError({{"DTRAIN_JOB_SECRET", "short"}}, {"DTRAIN_JOB_SECRET is too short (5"});
  EXPECT_EQ(Parse({}).job_secret, "");
  EXPECT_EQ(Parse({{"DTRAIN_JOB_SECRET", "sixteen-chars-ok"}}).job_secret, "sixteen-chars-ok");
}

TEST(ConfigTest, TheTimelineIsDtrainsElseHorovodsAndEmptyIsUnset) {
  EXPECT_EQ(Parse({}).timeline_path, "");
  EXPECT_EQ(Parse({{"HOROVOD_TIMELINE", "/tmp/h.json"}}).timeline_path, "/tmp/h.json");
  EXPECT_EQ(Parse({{"DTRAIN_TIMELINE", "/tmp/d.json"}, {"HOROVOD_TIMELINE", "/tmp/h.json"}})
                .timeline_path,
            "/tmp/d.json");
  EXPECT_EQ(Parse({{"DTRAIN_TIMELINE", ""}, {"HOROVOD_TIMELINE", "/tmp/h.json"}}).timeline_path,
            "/tmp/h.json");
  // The one rule, which `dtrain launch` applies too (to know what to merge).
  EXPECT_EQ(TimelinePathFromEnvironment(EnvReader(
                MapEnvironment({{"DTRAIN_TIMELINE", ""}, {"HOROVOD_TIMELINE", "/tmp/h.json"}}))),
            "/tmp/h.json");
}

TEST(ConfigTest, AnEmptyRestartWaitOrCheckpointDirIsUnset) {
  const Config c = Parse({{"DTRAIN_RESTART_WAIT_MS", ""}, {"DTRAIN_CHECKPOINT_DIR", ""}});
  EXPECT_EQ(c.restart_wait, Duration(0));
  EXPECT_EQ(c.checkpoint_dir, "");
  EXPECT_FALSE(c.ServersReplaceable());
}

TEST(ConfigTest, JobSecretFromEnvironmentIsConfigsRule) {
  EXPECT_EQ(JobSecretFromEnvironment(EnvReader(MapEnvironment({}))), "");
  EXPECT_EQ(JobSecretFromEnvironment(
                EnvReader(MapEnvironment({{"DTRAIN_JOB_SECRET", "sixteen-chars-ok"}}))),
            "sixteen-chars-ok");
  EXPECT_THROW(JobSecretFromEnvironment(EnvReader(MapEnvironment({{"DTRAIN_JOB_SECRET", ""}}))),
               ConfigError);
}

TEST(ConfigTest, JobLayoutVariables) {
  Env env = DistributedEnv("server");
  env["DMLC_INTERFACE"] = "eth1";
  env["DMLC_NODE_HOST"] = "10.0.0.7";
  env["DMLC_NODE_PORT"] = "7000";
  const Config c = Parse(env);
  ASSERT_TRUE(c.distributed());
  EXPECT_EQ(*c.role, Role::kServer);
  EXPECT_EQ(c.scheduler_host, "10.0.0.1");
  EXPECT_EQ(c.scheduler_port, 9091);
  EXPECT_EQ(c.num_servers, 2);
  EXPECT_EQ(c.num_workers, 3);
  EXPECT_EQ(c.interface, "eth1");
  EXPECT_EQ(c.node_host, "10.0.0.7");
  EXPECT_EQ(c.node_port, 7000);
}

TEST(ConfigTest, EveryRoleIsParsed) {
  EXPECT_EQ(*Parse(DistributedEnv("scheduler")).role, Role::kScheduler);
  EXPECT_EQ(*Parse(DistributedEnv("server")).role, Role::kServer);
  EXPECT_EQ(*Parse(DistributedEnv("worker")).role, Role::kWorker);
  EXPECT_STREQ(RoleName(Role::kScheduler), "scheduler");
  EXPECT_STREQ(RoleName(Role::kServer), "server");
  EXPECT_STREQ(RoleName(Role::kWorker), "worker");
}

// One integer variable: a valid value, where it lands, and its bounds.
struct IntegerVar {
  std::string name;
  int64_t min;
  int64_t max;
  std::function<int64_t(const Config&)> get;
};

std::vector<IntegerVar> IntegerVars() {
  auto ms = [](Duration Config::*field) {
    return [field](const Config& c) { return static_cast<int64_t>((c.*field).count()); };
  };
  const int64_t kMaxMs = int64_t{1} << 40;
  return {
      {"DMLC_PS_ROOT_PORT", 1, 65535, [](const Config& c) { return int64_t{c.scheduler_port}; }},
      {"DMLC_NUM_SERVER", 0, 1 << 16, [](const Config& c) { return int64_t{c.num_servers}; }},
      {"DMLC_NUM_WORKER", 0, 1 << 16, [](const Config& c) { return int64_t{c.num_workers}; }},
      {"DMLC_NODE_PORT", 0, 65535, [](const Config& c) { return int64_t{c.node_port}; }},
      {"DTRAIN_LOCAL_WORKERS", 1, 1 << 20,
       [](const Config& c) { return int64_t{c.local_workers}; }},
      {"PS_VERBOSE", 0, 2, [](const Config& c) { return int64_t{c.verbose}; }},
      {"PS_RESEND_TIMEOUT", 1, kMaxMs, ms(&Config::resend_timeout)},
      {"DTRAIN_RESEND_WINDOW_MS", 1, kMaxMs, ms(&Config::resend_window)},
      {"PS_HEARTBEAT_INTERVAL", 1, kMaxMs, ms(&Config::heartbeat_interval)},
      {"PS_HEARTBEAT_TIMEOUT", 1, kMaxMs, ms(&Config::heartbeat_timeout)},
      {"MXNET_KVSTORE_BIGARRAY_BOUND", 1, std::numeric_limits<int64_t>::max(),
       [](const Config& c) { return c.bigarray_bound; }},
      {"MXNET_KVSTORE_REDUCTION_NTHREADS", 1, 256,
       [](const Config& c) { return int64_t{c.reduction_threads}; }},
      {"DTRAIN_CONNECT_TIMEOUT_MS", 1, kMaxMs, ms(&Config::connect_timeout)},
      {"DTRAIN_START_TIMEOUT_MS", 1, kMaxMs, ms(&Config::start_timeout)},
      {"DTRAIN_REQUEST_TIMEOUT_MS", 1, kMaxMs, ms(&Config::request_timeout)},
      {"DTRAIN_FAILURE_EXIT_MS", 0, kMaxMs, ms(&Config::failure_exit_grace)},
      {"DTRAIN_STREAMS_PER_PEER", 1, 16,
       [](const Config& c) { return int64_t{c.streams_per_peer}; }},
      {"DTRAIN_IO_THREADS", 1, 64, [](const Config& c) { return int64_t{c.io_threads}; }},
      {"DTRAIN_APPLY_THREADS", 0, 64, [](const Config& c) { return int64_t{c.apply_threads}; }},
      {"DTRAIN_CHUNK_BYTES", 4096, int64_t{1} << 40,
       [](const Config& c) { return static_cast<int64_t>(c.chunk_bytes); }},
      {"DTRAIN_MAX_MESSAGE_BYTES", 1 << 20, int64_t{1} << 40,
       [](const Config& c) { return static_cast<int64_t>(c.max_message_bytes); }},
      {"DTRAIN_TCP_NOTSENT_LOWAT", 0, int64_t{1} << 30,
       [](const Config& c) { return static_cast<int64_t>(c.tcp_notsent_lowat); }},
      {"DTRAIN_TCP_SNDBUF", 0, int64_t{1} << 30,
       [](const Config& c) { return static_cast<int64_t>(c.tcp_send_buffer); }},
  };
}

TEST(ConfigTest, EveryIntegerVariableIsParsedWithinItsBounds) {
  for (const IntegerVar& var : IntegerVars()) {
    SCOPED_TRACE(var.name);
    for (int64_t value : {var.min, var.max, var.min + (var.max - var.min) / 3}) {
      const Config c = Parse({{var.name, std::to_string(value)}});
      EXPECT_EQ(var.get(c), value);
    }
  }
}

TEST(ConfigTest, NonIntegersAreRejectedNamingVariableAndValue) {
  for (const IntegerVar& var : IntegerVars()) {
    SCOPED_TRACE(var.name);
    for (std::string bad : {"abc", "12x", "1.5", "0x10", "--1"}) {
      ExpectConfigError({{var.name, bad}}, {var.name, bad, "not an integer"});
    }
  }
}

TEST(ConfigTest, OutOfRangeValuesAreRejectedNamingVariableAndValue) {
  for (const IntegerVar& var : IntegerVars()) {
    SCOPED_TRACE(var.name);
    const std::string below = std::to_string(var.min - 1);
    ExpectConfigError({{var.name, below}}, {var.name, below, "out of range"});
    if (var.max < std::numeric_limits<int64_t>::max()) {
      const std::string above = std::to_string(var.max + 1);
      ExpectConfigError({{var.name, above}}, {var.name, above, "out of range"});
    }
    // Too big for any integer type: still a ConfigError naming the variable and the value.
    const std::string huge = "99999999999999999999999";
    ExpectConfigError({{var.name, huge}}, {var.name, huge});
  }
}

TEST(ConfigTest, ResendIsABoolean) {
  for (std::string yes : {"1", "true", "TRUE", "yes"})
    EXPECT_TRUE(Parse({{"PS_RESEND", yes}}).resend);
  for (std::string no : {"0", "false", "FALSE", "no"})
    EXPECT_FALSE(Parse({{"PS_RESEND", no}}).resend);
  ExpectConfigError({{"PS_RESEND", "maybe"}}, {"PS_RESEND", "maybe", "boolean"});
}

TEST(ConfigTest, UnknownRoleIsRejected) {
  Env env = DistributedEnv();
  env["DMLC_ROLE"] = "master";
  ExpectConfigError(env, {"DMLC_ROLE", "master", "scheduler, server, worker"});
  env["DMLC_ROLE"] = "Worker";  // case matters, as in ps-lite
  ExpectConfigError(env, {"DMLC_ROLE", "Worker"});
}

TEST(ConfigTest, EachRequiredVariableIsNamedWhenMissing) {
  for (std::string role : {"scheduler", "server", "worker"}) {
    for (std::string missing :
         {"DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"}) {
      SCOPED_TRACE(role + " without " + missing);
      Env env = DistributedEnv(role);
      env.erase(missing);
      ExpectConfigError(env, {missing, "DMLC_ROLE=" + role});
      env[missing] = "";  // set but empty: the same as unset
      ExpectConfigError(env, {missing});
    }
  }
}

TEST(ConfigTest, AJobNeedsAServerAndAWorker) {
  for (std::string role : {"scheduler", "server"}) {
    Env env = DistributedEnv(role);
    env["DMLC_NUM_SERVER"] = "0";
    ExpectConfigError(env, {"DMLC_NUM_SERVER", "at least one server"});
  }
  Env env = DistributedEnv();
  env["DMLC_NUM_WORKER"] = "0";
  ExpectConfigError(env, {"DMLC_NUM_WORKER", "at least one worker"});
}

// DTRAIN_TCP_LOCAL_CONGESTION: an algorithm's name as the kernel spells it, or "system".
TEST(ConfigTest, TheLocalCongestionControlIsAnAlgorithmsName) {
  EXPECT_EQ(Parse({}).tcp_local_congestion, "cubic");
  EXPECT_EQ(Parse({{"DTRAIN_TCP_LOCAL_CONGESTION", "reno"}}).tcp_local_congestion, "reno");
  EXPECT_EQ(Parse({{"DTRAIN_TCP_LOCAL_CONGESTION", "system"}}).tcp_local_congestion, "system");
  for (std::string bad : {"Cubic", "cubic reno", "a_name_far_too_long", "bbr;rm"}) {
    ExpectConfigError({{"DTRAIN_TCP_LOCAL_CONGESTION", bad}},
                      {"DTRAIN_TCP_LOCAL_CONGESTION", bad, "congestion control"});
  }
}

TEST(ConfigTest, TheSendBufferIsAutoZeroOrBytes) {
  EXPECT_EQ(Parse({}).tcp_send_buffer, Config::kAdaptiveSendBuffer);
  EXPECT_EQ(Parse({{"DTRAIN_TCP_SNDBUF", "auto"}}).tcp_send_buffer, Config::kAdaptiveSendBuffer);
  EXPECT_EQ(Parse({{"DTRAIN_TCP_SNDBUF", "0"}}).tcp_send_buffer, 0u);
  EXPECT_EQ(Parse({{"DTRAIN_TCP_SNDBUF", "32768"}}).tcp_send_buffer, 32768u);
  EXPECT_THAT(Parse({}).Describe(), ::testing::HasSubstr("DTRAIN_TCP_SNDBUF=auto"));
  for (std::string bad : {"Auto", "automatic"}) {
    ExpectConfigError({{"DTRAIN_TCP_SNDBUF", bad}}, {"DTRAIN_TCP_SNDBUF", bad, "nor auto"});
  }
  ExpectConfigError({{"DTRAIN_TCP_SNDBUF", "32k"}}, {"DTRAIN_TCP_SNDBUF", "32k", "integer"});
}

// `dtrain launch -s 0` starts an allreduce job: workers with DMLC_NUM_SERVER=0 are valid nodes,
// but a parameter-server kvstore in such a job is refused, pointing at the horovod kvstore.
TEST(ConfigTest, AnAllreduceWorkerNeedsNoServers) {
  Env env = DistributedEnv();
  env["DMLC_NUM_SERVER"] = "0";
  const Config c = Parse(env);
  EXPECT_EQ(c.num_servers, 0);
  try {
    c.RequireDistributed("kvstore type 'dist_sync' was created");
    ADD_FAILURE() << "a dist kvstore accepted a job without servers";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("--kvstore horovod"));
  }
}

TEST(ConfigTest, WithoutARoleNothingElseIsRequired) {
  const Config c = Parse({{"DMLC_NUM_WORKER", "4"}});
  EXPECT_FALSE(c.distributed());
  EXPECT_EQ(c.num_workers, 4);
}

TEST(ConfigTest, RequireDistributedNamesTheRole) {
  const Config c = Parse({});
  try {
    c.RequireDistributed("kvstore type dist_sync");
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("DMLC_ROLE"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("dist_sync"), std::string::npos);
  }
  EXPECT_NO_THROW(Parse(DistributedEnv()).RequireDistributed("test"));
}

TEST(ConfigTest, DescribeListsTheValuesInEffect) {
  const std::string text = Parse(DistributedEnv("scheduler")).Describe();
  for (std::string expected :
       {"DMLC_ROLE=scheduler", "DMLC_PS_ROOT_URI=10.0.0.1", "DMLC_PS_ROOT_PORT=9091",
        "DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=3", "DTRAIN_CONNECT_TIMEOUT_MS=30000"}) {
    EXPECT_NE(text.find(expected), std::string::npos) << text;
  }
}

TEST(ConfigTest, ProcessEnvironmentReadsTheProcess) {
  ::setenv("DTRAIN_CONFIG_TEST_ONLY", "42", 1);
  EXPECT_EQ(ProcessEnvironment()("DTRAIN_CONFIG_TEST_ONLY"), std::optional<std::string>("42"));
  ::unsetenv("DTRAIN_CONFIG_TEST_ONLY");
  EXPECT_EQ(ProcessEnvironment()("DTRAIN_CONFIG_TEST_ONLY"), std::nullopt);
}

TEST(ConfigTest, LocalWorkersComeFromDtrainLaunchElseFromHorovodrunMpirunOrTorchrun) {
  EXPECT_EQ(Parse({}).local_workers, 1);
  EXPECT_EQ(
      Parse({{"DTRAIN_LOCAL_WORKERS", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}).local_workers, 2);
  EXPECT_EQ(Parse({{"HOROVOD_LOCAL_SIZE", "5"}, {"LOCAL_WORLD_SIZE", "4"}}).local_workers, 5);
  EXPECT_EQ(Parse({{"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}).local_workers, 3);
  EXPECT_EQ(Parse({{"LOCAL_WORLD_SIZE", "4"}}).local_workers, 4);
  // Others' values are passed over when they are no positive count, as `import dtrain` does.
  EXPECT_EQ(Parse({{"HOROVOD_LOCAL_SIZE", "x"}, {"LOCAL_WORLD_SIZE", "0"}}).local_workers, 1);
  ExpectConfigError({{"DTRAIN_LOCAL_WORKERS", "0"}}, {"DTRAIN_LOCAL_WORKERS", "0"});
}

}  // namespace
}  // namespace dtrain
