// Parsing the flags of `dtrain launch`, in-process: no processes start here.
#include "launcher/plan/launch_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

namespace dtrain::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Args = std::vector<std::string>;

std::optional<std::string> FakeEnv(const char* name) {
  if (std::strcmp(name, "HOME") == 0) return std::string("/home/alice");
  return std::nullopt;
}

LaunchOptions Parse(const Args& args) {
  std::optional<LaunchOptions> o = ParseLaunchArgs(args, &FakeEnv);
  if (!o) throw std::runtime_error("help was printed");
  return *o;
}

std::string ErrorOf(const Args& args) {
  try {
    ParseLaunchArgs(args, &FakeEnv);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LaunchOptions, Defaults) {
  LaunchOptions o = Parse({"-n", "3", "--", "python", "train.py"});
  EXPECT_EQ(o.num_workers, 3);
  EXPECT_EQ(o.num_servers, 3);  // -s defaults to -n, as in launch.py
  EXPECT_EQ(o.launcher, LauncherKind::kLocal);
  EXPECT_EQ(o.kill_grace, Duration(3000));
  EXPECT_EQ(o.service_grace, Duration(30000));
  EXPECT_FALSE(o.output_dir.has_value());
  EXPECT_THAT(o.worker_command, ElementsAre("python", "train.py"));
}

TEST(LaunchOptions, EverythingAfterDoubleDashIsTheCommand) {
  LaunchOptions o = Parse({"-n", "2", "-s", "1", "--", "python", "-n", "5", "--", "x"});
  EXPECT_EQ(o.num_servers, 1);
  EXPECT_THAT(o.worker_command, ElementsAre("python", "-n", "5", "--", "x"));
}

TEST(LaunchOptions, CommandStartsAtTheFirstArgumentThatIsNotAFlag) {
  LaunchOptions o = Parse({"-n", "2", "--launcher", "local", "python", "train.py", "--kvstore",
                           "dist_sync", "-s", "9"});
  EXPECT_EQ(o.num_servers, 2);
  EXPECT_THAT(o.worker_command,
              ElementsAre("python", "train.py", "--kvstore", "dist_sync", "-s", "9"));
}

TEST(LaunchOptions, OneQuotedArgumentWithSpacesRunsInAShell) {
  EXPECT_THAT(Parse({"-n", "2", "python train.py --x 1"}).worker_command,
              ElementsAre("/bin/sh", "-c", "python train.py --x 1"));
  // Without spaces it is a program name.
  EXPECT_THAT(Parse({"-n", "2", "hostname"}).worker_command, ElementsAre("hostname"));
}

TEST(LaunchOptions, EnvFlags) {
  LaunchOptions o = Parse({"-n", "1", "--env", "A:1", "--env", "HOME", "--env-server", "B:x:y",
                           "--env-worker", "C:", "--env", "D:2", "cmd"});
  EXPECT_THAT(o.env_all,
              ElementsAre(EnvVar{"A", "1"}, EnvVar{"HOME", "/home/alice"}, EnvVar{"D", "2"}));
  EXPECT_THAT(o.env_server, ElementsAre(EnvVar{"B", "x:y"}));
  EXPECT_THAT(o.env_worker, ElementsAre(EnvVar{"C", ""}));
  EXPECT_THAT(o.worker_command, ElementsAre("cmd"));
}

TEST(LaunchOptions, AutotuneSetsHorovodsVariablesInTheWorkers) {
  LaunchOptions o =
      Parse({"-n", "2", "-s", "0", "--autotune", "--autotune-log-file", "/tmp/tune.csv", "cmd"});
  EXPECT_THAT(o.env_worker, ElementsAre(EnvVar{"HOROVOD_AUTOTUNE", "1"},
                                        EnvVar{"HOROVOD_AUTOTUNE_LOG", "/tmp/tune.csv"}));
  EXPECT_THAT(ErrorOf({"-n", "2", "--autotune-log-file", "/tmp/tune.csv", "cmd"}),
              HasSubstr("add --autotune"));
  EXPECT_THAT(
      ErrorOf({"-n", "2", "--autotune", "--autotune-log-file", "/nonexistent/dir/t.csv", "cmd"}),
      HasSubstr("no folder /nonexistent/dir"));
}

TEST(LaunchOptions, OtherFlags) {
  LaunchOptions o =
      Parse({"--num-workers=4", "--num-servers", "2", "--output-dir", "/tmp/x", "--kill-grace-ms",
             "10", "--service-grace-ms", "0", "--launcher", "ssh", "--", "cmd"});
  EXPECT_EQ(o.num_workers, 4);
  EXPECT_EQ(o.num_servers, 2);
  EXPECT_EQ(o.output_dir, "/tmp/x");
  EXPECT_EQ(o.kill_grace, Duration(10));
  EXPECT_EQ(o.service_grace, Duration(0));
  EXPECT_EQ(o.launcher, LauncherKind::kSsh);
}

TEST(LaunchOptions, SshFlagsAndAllreduce) {
  LaunchOptions o =
      Parse({"-n", "2", "-s", "0", "--launcher", "ssh", "-H", "hosts", "--sync-dst-dir", "/tmp/job",
             "--interface", "eth1", "--ssh-opts", "  -F ./cfg   -p 2222 ", "--", "cmd"});
  EXPECT_EQ(o.num_servers, 0);
  EXPECT_EQ(o.hostfile, "hosts");
  EXPECT_EQ(o.sync_dst_dir, "/tmp/job");
  EXPECT_EQ(o.interface, "eth1");
  EXPECT_THAT(o.ssh_options, ElementsAre("-F", "./cfg", "-p", "2222"));
  EXPECT_TRUE(Parse({"-n", "1", "cmd"}).ssh_options.empty());
}

TEST(LaunchOptions, Mistakes) {
  EXPECT_THAT(ErrorOf({"-n", "0", "cmd"}), HasSubstr("-n/--num-workers must be between 1"));
  EXPECT_THAT(ErrorOf({"-n", "1", "-s", "-1", "cmd"}), HasSubstr("-s/--num-servers"));
  EXPECT_THAT(ErrorOf({"cmd"}), HasSubstr("--num-workers is required"));
  EXPECT_THAT(ErrorOf({"-n", "1"}), HasSubstr("no command given"));
  EXPECT_THAT(ErrorOf({"-n", "1", "--"}), HasSubstr("no command given"));
  EXPECT_THAT(ErrorOf({"-n", "1", "  "}), HasSubstr("no command given"));
  EXPECT_THAT(ErrorOf({"-n", "1", "--launcher", "yarn", "cmd"}),
              HasSubstr("unknown launcher 'yarn'"));
  EXPECT_THAT(ErrorOf({"-n", "1", "--bogus", "cmd"}), HasSubstr("unknown option '--bogus'"));
  // Before the options after it, which CLI11 leaves unparsed: not "-n is required".
  EXPECT_THAT(ErrorOf({"--frobnicate", "x", "-n", "2", "cmd"}),
              HasSubstr("unknown option '--frobnicate'"));
  EXPECT_THAT(ErrorOf({"-n", "1", "--env", "NOT_SET_ANYWHERE", "cmd"}),
              HasSubstr("NOT_SET_ANYWHERE is not set"));
  EXPECT_THAT(ErrorOf({"-n", "1", "--env", "1BAD:x", "cmd"}), HasSubstr("not a valid variable"));
  EXPECT_THAT(ErrorOf({"-n", "1", "--env-worker", "DMLC_PS_ROOT_PORT:1", "cmd"}),
              HasSubstr("the launcher sets DMLC_PS_ROOT_PORT itself"));
  EXPECT_THAT(ErrorOf({"-n", "1", "--kill-grace-ms", "-5", "cmd"}), HasSubstr("--kill-grace-ms"));
  EXPECT_THAT(ErrorOf({"-n", "1", "--output-dir", "", "cmd"}), HasSubstr("--output-dir"));
}

TEST(LaunchOptions, HelpIsNotAnError) {
  ::testing::internal::CaptureStdout();
  EXPECT_FALSE(ParseLaunchArgs({"--help"}, &FakeEnv).has_value());
  EXPECT_THAT(::testing::internal::GetCapturedStdout(), HasSubstr("--num-workers"));
}

TEST(LaunchOptions, AnElasticJobTakesItsBoundsFromMinAndMaxNpOrFromN) {
  LaunchOptions o = Parse({"-s", "0", "--host-discovery-script", "./hosts.sh", "--min-np", "2",
                           "--max-np", "4", "--elastic-timeout", "30", "--", "python", "t.py"});
  EXPECT_EQ(*o.host_discovery_script, "./hosts.sh");
  EXPECT_EQ(o.min_np, 2);
  EXPECT_EQ(o.max_np, 4);
  EXPECT_EQ(o.elastic_timeout.count(), 30000);
  EXPECT_EQ(o.num_servers, 0);
  LaunchOptions n = Parse({"-n", "3", "-s", "0", "--host-discovery-script", "x", "--", "t"});
  EXPECT_EQ(n.min_np, 3);
  EXPECT_EQ(n.max_np, 3);
  EXPECT_EQ(n.elastic_timeout.count(), 600000);
}

TEST(LaunchOptions, ElasticFlagsThatCannotWorkAreRefused) {
  EXPECT_THAT(ErrorOf({"-n", "2", "--min-np", "1", "--", "t"}),
              HasSubstr("add --host-discovery-script"));
  EXPECT_THAT(ErrorOf({"-n", "2", "-s", "0", "--elastic-timeout", "5", "--", "t"}),
              HasSubstr("add --host-discovery-script"));
  EXPECT_THAT(ErrorOf({"--host-discovery-script", "x", "--", "t"}), HasSubstr("add -s 0"));
  EXPECT_THAT(ErrorOf({"-s", "0", "--host-discovery-script", "x", "--min-np", "3", "--max-np", "2",
                       "--", "t"}),
              HasSubstr("--min-np 3 is more than --max-np 2"));
  EXPECT_THAT(ErrorOf({"-s", "0", "--host-discovery-script", "", "--", "t"}),
              HasSubstr("must not be empty"));
  EXPECT_THAT(ErrorOf({"-s", "0", "--host-discovery-script", "x", "--launcher", "mpi", "--", "t"}),
              HasSubstr("--launcher mpi starts them through its own tool"));
  EXPECT_THAT(ErrorOf({"-s", "0", "--host-discovery-script", "x", "--launcher", "ssh", "-H", "h",
                       "--", "t"}),
              HasSubstr("the discovery script prints"));
  EXPECT_THAT(ErrorOf({"-s", "0", "--host-discovery-script", "x", "--launcher", "ssh",
                       "--sync-dst-dir", "/d", "--", "t"}),
              HasSubstr("cannot be copied before it starts"));
  EXPECT_EQ(*Parse({"-s", "0", "--host-discovery-script", "x", "--launcher", "ssh", "--", "t"})
                 .host_discovery_script,
            "x");
  EXPECT_THAT(
      ErrorOf({"-s", "0", "--host-discovery-script", "x", "--elastic-timeout", "0", "--", "t"}),
      HasSubstr("--elastic-timeout must be between"));
  EXPECT_THAT(ErrorOf({"-s", "0", "--", "t"}), HasSubstr("--num-workers is required"));
}

TEST(LaunchOptions, TheRayLauncherRunsElasticJobsOnly) {
  EXPECT_EQ(Parse({"-s", "0", "--launcher", "ray", "--host-discovery-script",
                   "python3 -m dtrain.ray.discover", "--", "t"})
                .launcher,
            LauncherKind::kRay);
  EXPECT_THAT(ErrorOf({"-n", "2", "-s", "0", "--launcher", "ray", "--", "t"}),
              HasSubstr("use dtrain.ray.RayExecutor"));
  EXPECT_THAT(ErrorOf({"-n", "2", "-s", "0", "--launcher", "rays", "--", "t"}),
              HasSubstr("(choose from local, ssh, mpi, slurm, sge, ray, spark, kubernetes)"));
}

TEST(LaunchOptions, TheSparkLauncherRunsElasticJobsOnly) {
  EXPECT_EQ(Parse({"-s", "0", "--launcher", "spark", "--host-discovery-script",
                   "python3 -m dtrain.spark.discover", "--", "t"})
                .launcher,
            LauncherKind::kSpark);
  EXPECT_THAT(ErrorOf({"-n", "2", "-s", "0", "--launcher", "spark", "--", "t"}),
              HasSubstr("use dtrain.spark.run"));
}

}  // namespace
}  // namespace dtrain::launcher
