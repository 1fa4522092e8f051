// The JSON of control messages comes off the network: every decoder must turn malformed or hostile
// text into a ProtocolError (never a crash, never a silently different value), and read back
// exactly what the encoder wrote.
#include "ps/node/control.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dtrain/common/error.h"

namespace dtrain::ps::control {
namespace {

using ::testing::HasSubstr;

// Text that is not a JSON object at all, for every decoder.
const std::vector<std::string> kNotAnObject = {
    "",
    " ",
    "null",
    "42",
    "\"text\"",
    "[]",
    "[{\"role\":\"worker\"}]",
    "{",
    "{\"role\":",
    "}{",
    std::string("{\"role\":\"worker\"\0\"}", 19),
    "{\"host\":\"\xff\xfe\"}",  // not UTF-8
    "\x89PNG\r\n\x1a\n\x00\x00\x00",
    "{'role': 'worker'}",
    "{\"a\":1} trailing",
    std::string(100000, '[') + std::string(100000, ']'),  // deep nesting
};

template <typename F>
void ExpectProtocolError(F&& decode, const std::string& text, const std::string& needle = "") {
  try {
    decode(text);
    ADD_FAILURE() << "accepted: " << text.substr(0, 200);
  } catch (const ProtocolError& e) {
    if (!needle.empty()) {
      EXPECT_THAT(e.what(), HasSubstr(needle)) << text.substr(0, 200);
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw something other than ProtocolError for " << text.substr(0, 200) << ": "
                  << e.what();
  }
}

// --- register ---

std::string Registration(const std::string& role, const std::string& host, const std::string& port,
                         const std::string& rank) {
  std::string j = "{";
  auto add = [&j](const char* name, const std::string& value) {
    if (value == "<absent>") return;
    if (j.size() > 1) j += ",";
    j.append("\"").append(name).append("\":").append(value);
  };
  add("role", role);
  add("host", host);
  add("port", port);
  add("rank", rank);
  return j + "}";
}

TEST(ControlRegistration, RoundTrips) {
  for (Role role : {Role::kScheduler, Role::kServer, Role::kWorker}) {
    control::Registration r{role, "10.1.2.3", 65535, 7};
    auto back = DecodeRegistration(EncodeRegistration(r));
    EXPECT_EQ(back.role, role);
    EXPECT_EQ(back.host, "10.1.2.3");
    EXPECT_EQ(back.port, 65535);
    EXPECT_EQ(back.requested_rank, 7);
  }
  auto r = DecodeRegistration(Registration("\"worker\"", "\"h\"", "1", "-1"));
  EXPECT_EQ(r.requested_rank, -1);
  EXPECT_EQ(r.port, 1);
}

TEST(ControlRegistration, RejectsWhatIsNotAnObject) {
  for (const auto& text : kNotAnObject) {
    ExpectProtocolError(DecodeRegistration, text, "malformed register message");
  }
}

TEST(ControlRegistration, RejectsMissingFields) {
  ExpectProtocolError(DecodeRegistration, Registration("<absent>", "\"h\"", "1", "0"), "'role'");
  ExpectProtocolError(DecodeRegistration, Registration("\"worker\"", "<absent>", "1", "0"),
                      "'host'");
  ExpectProtocolError(DecodeRegistration, Registration("\"worker\"", "\"h\"", "<absent>", "0"),
                      "'port'");
  ExpectProtocolError(DecodeRegistration, Registration("\"worker\"", "\"h\"", "1", "<absent>"),
                      "'rank'");
  ExpectProtocolError(DecodeRegistration, "{}", "lacks");
}

TEST(ControlRegistration, RejectsWrongTypesAndBadValues) {
  const std::string w = "\"worker\"", h = "\"host\"";
  const std::vector<std::string> bad = {
      // role
      Registration("5", h, "1", "0"),
      Registration("null", h, "1", "0"),
      Registration("[\"worker\"]", h, "1", "0"),
      Registration("\"master\"", h, "1", "0"),
      Registration("\"WORKER\"", h, "1", "0"),
      // host
      Registration(w, "12", "1", "0"),
      Registration(w, "\"\"", "1", "0"),
      Registration(w, "\"" + std::string(256, 'h') + "\"", "1", "0"),
      Registration(w, "{}", "1", "0"),
      // port: out of range, or not an integer
      Registration(w, h, "0", "0"),
      Registration(w, h, "-1", "0"),
      Registration(w, h, "65536", "0"),
      Registration(w, h, "70000", "0"),
      Registration(w, h, "4294967297", "0"),  // 2^32 + 1: must not wrap to 1
      Registration(w, h, "18446744073709551615", "0"),
      Registration(w, h, "\"4000\"", "0"),
      Registration(w, h, "4000.5", "0"),
      Registration(w, h, "4e3", "0"),
      Registration(w, h, "true", "0"),
      Registration(w, h, "null", "0"),
      // rank: huge, negative, or not an integer
      Registration(w, h, "1", "-2"),
      Registration(w, h, "1", "2097152"),
      Registration(w, h, "1", "4294967296"),
      Registration(w, h, "1", "1e300"),
      Registration(w, h, "1", "-9223372036854775808"),
      Registration(w, h, "1", "18446744073709551615"),
      Registration(w, h, "1", "0.5"),
      Registration(w, h, "1", "\"0\""),
      Registration(w, h, "1", "true"),
      Registration(w, h, "1", "[0]"),
  };
  for (const auto& text : bad) ExpectProtocolError(DecodeRegistration, text);
}

// --- node table ---

std::string Entry(const std::string& id, const std::string& role, const std::string& rank,
                  const std::string& host, const std::string& port) {
  return "{\"id\":" + id + ",\"role\":" + role + ",\"rank\":" + rank + ",\"host\":" + host +
         ",\"port\":" + port + "}";
}
std::string Table(const std::string& entries) { return "{\"nodes\":[" + entries + "]}"; }

TEST(ControlNodeTable, RoundTrips) {
  std::vector<NodeInfo> nodes = {{0, Role::kScheduler, 0, "10.0.0.1", 9000},
                                 {1, Role::kServer, 0, "10.0.0.2", 9001},
                                 {2, Role::kWorker, 0, "host-3", 9002},
                                 {3, Role::kWorker, 1, "inmem", 1}};
  auto back = DecodeNodeTable(EncodeNodeTable(nodes));
  ASSERT_EQ(back.size(), nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(back[i].id, nodes[i].id);
    EXPECT_EQ(back[i].role, nodes[i].role);
    EXPECT_EQ(back[i].rank, nodes[i].rank);
    EXPECT_EQ(back[i].host, nodes[i].host);
    EXPECT_EQ(back[i].port, nodes[i].port);
    EXPECT_EQ(back[i].Name(), nodes[i].Name());
  }
  EXPECT_TRUE(DecodeNodeTable(Table("")).empty());
}

TEST(ControlNodeTable, RejectsMalformedAndHostileTables) {
  for (const auto& text : kNotAnObject) {
    ExpectProtocolError(DecodeNodeTable, text, "malformed node-table message");
  }
  const std::string s = "\"server\"", h = "\"h\"";
  const std::vector<std::string> bad = {
      "{}",
      "{\"nodes\":{}}",
      "{\"nodes\":\"0,1\"}",
      "{\"nodes\":null}",
      Table("1"),
      Table("[]"),
      Table("{}"),
      Table("{\"id\":1,\"role\":\"server\",\"rank\":0,\"host\":\"h\"}"),  // no port
      // id
      Table(Entry("-1", s, "0", h, "1")),
      Table(Entry("4294967297", s, "0", h, "1")),  // 2^32 + 1: must not wrap to 1
      Table(Entry("\"1\"", s, "0", h, "1")),
      Table(Entry("1.5", s, "0", h, "1")),
      Table(Entry("true", s, "0", h, "1")),
      // role
      Table(Entry("1", "\"boss\"", "0", h, "1")),
      Table(Entry("1", "1", "0", h, "1")),
      // rank: huge, negative or not an integer
      Table(Entry("1", s, "-2", h, "1")),
      Table(Entry("1", s, "4294967296", h, "1")),  // 2^32: must not wrap to 0
      Table(Entry("1", s, "1099511627776", h, "1")),
      Table(Entry("1", s, "2097152", h, "1")),
      Table(Entry("1", s, "0.5", h, "1")),
      Table(Entry("1", s, "false", h, "1")),
      // host, port
      Table(Entry("1", s, "0", "7", "1")),
      Table(Entry("1", s, "0", h, "0")),
      Table(Entry("1", s, "0", h, "65536")),
      Table(Entry("1", s, "0", h, "65537.0")),
      Table(Entry("1", s, "0", h, "\"80\"")),
      // one good entry does not excuse a bad one
      Table(Entry("0", "\"scheduler\"", "0", h, "1") + "," + Entry("1", s, "0", h, "-5")),
  };
  for (const auto& text : bad) ExpectProtocolError(DecodeNodeTable, text);
}

// --- barrier ---

TEST(ControlBarrier, RoundTrips) {
  for (Group g : {Group::kWorkers, Group::kServers, Group::kAll}) {
    for (uint64_t seq : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}}) {
      const BarrierMessage back = DecodeBarrier(EncodeBarrier(g, seq));
      EXPECT_EQ(back.group, g);
      EXPECT_EQ(back.sequence, seq);
    }
  }
}

TEST(ControlBarrier, RejectsMalformedBarriers) {
  for (const auto& text : kNotAnObject) {
    ExpectProtocolError(DecodeBarrier, text, "malformed barrier message");
  }
  const std::vector<std::string> bad = {
      "{}",
      "{\"group\":1}",
      "{\"seq\":1}",
      "{\"group\":0,\"seq\":1}",
      "{\"group\":4,\"seq\":1}",
      "{\"group\":-1,\"seq\":1}",
      "{\"group\":4294967297,\"seq\":1}",  // 2^32 + 1: must not wrap to the workers' group
      "{\"group\":\"1\",\"seq\":1}",
      "{\"group\":1.5,\"seq\":1}",
      "{\"group\":true,\"seq\":1}",
      "{\"group\":1,\"seq\":-1}",  // must not wrap to 2^64 - 1
      "{\"group\":1,\"seq\":1.5}",
      "{\"group\":1,\"seq\":\"1\"}",
      "{\"group\":1,\"seq\":1e30}",
      "{\"group\":1,\"seq\":null}",
  };
  for (const auto& text : bad) ExpectProtocolError(DecodeBarrier, text);
}

// A setup barrier (Init's, SetOptimizer's) says so; a replacement learns how many the job
// completed (issue 63).
TEST(ControlBarrier, CarriesTheSetupFlag) {
  EXPECT_TRUE(DecodeBarrier(EncodeBarrier(Group::kWorkers, 3, true)).setup);
  EXPECT_FALSE(DecodeBarrier(EncodeBarrier(Group::kWorkers, 3)).setup);
  EXPECT_FALSE(DecodeBarrier("{\"group\":1,\"seq\":1}").setup);
  for (const char* text :
       {"{\"group\":1,\"seq\":1,\"setup\":1}", "{\"group\":1,\"seq\":1,\"setup\":\"true\"}",
        "{\"group\":1,\"seq\":1,\"setup\":null}"}) {
    ExpectProtocolError(DecodeBarrier, text, "bad 'setup'");
  }
}

TEST(ControlRejoin, RoundTripsAndRejectsMoreSetupBarriersThanBarriers) {
  const Rejoin back = DecodeRejoin(EncodeRejoin({7, 2, 3}));
  EXPECT_EQ(back.workers_barriers, 7u);
  EXPECT_EQ(back.all_barriers, 2u);
  EXPECT_EQ(back.setup_barriers, 3u);
  ExpectProtocolError(DecodeRejoin, "{\"workers\":2,\"all\":0,\"setup\":3}", "more setup");
  ExpectProtocolError(DecodeRejoin, "{\"workers\":2,\"all\":0}", "lacks 'setup'");
  ExpectProtocolError(DecodeRejoin, "{\"workers\":2,\"all\":0,\"setup\":-1}", "bad 'setup'");
}

// --- node failed ---

TEST(ControlFailure, RoundTrips) {
  Failure f{3, "worker 1 (10.0.0.2:4000)", "it crashed: \"quoted\" \n and more"};
  auto back = DecodeFailure(EncodeFailure(f));
  EXPECT_EQ(back.node, 3);
  EXPECT_EQ(back.name, f.name);
  EXPECT_EQ(back.reason, f.reason);
  EXPECT_EQ(DecodeFailure(EncodeFailure({transport::kNoNode, "n", ""})).node, transport::kNoNode);
}

TEST(ControlFailure, RejectsMalformedFailures) {
  for (const auto& text : kNotAnObject) {
    ExpectProtocolError(DecodeFailure, text, "malformed node-failed message");
  }
  const std::vector<std::string> bad = {
      "{}",
      "{\"node\":1,\"name\":\"n\"}",
      "{\"node\":1,\"reason\":\"r\"}",
      "{\"name\":\"n\",\"reason\":\"r\"}",
      "{\"node\":\"1\",\"name\":\"n\",\"reason\":\"r\"}",
      "{\"node\":1.5,\"name\":\"n\",\"reason\":\"r\"}",
      "{\"node\":4294967297,\"name\":\"n\",\"reason\":\"r\"}",  // must not wrap to 1
      "{\"node\":1,\"name\":5,\"reason\":\"r\"}",
      "{\"node\":1,\"name\":\"n\",\"reason\":null}",
      "{\"node\":1,\"name\":\"n\",\"reason\":[\"r\"]}",
  };
  for (const auto& text : bad) ExpectProtocolError(DecodeFailure, text);
}

}  // namespace
}  // namespace dtrain::ps::control
