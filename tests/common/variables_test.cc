// The one table of variables (common/config/variables.cc) against the README's, and the reader's
// refusal of names outside it: a variable cannot be read without being documented.
#include "common/config/variables.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "common/config/env_reader.h"

namespace dtrain {
namespace {

// The names in the first column of the README's table of variables (rows "| `NAME` ... |").
std::set<std::string> ReadmeVariables() {
  std::ifstream in(std::string(DTRAIN_SOURCE_DIR) + "/README.md");
  std::set<std::string> names;
  const std::regex name("`([A-Z][A-Za-z0-9_]+)`");  // Open MPI's are mixed case
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    const std::string first_cell = line.substr(1, line.find('|', 1) - 1);
    for (std::sregex_iterator it(first_cell.begin(), first_cell.end(), name), end; it != end;
         ++it) {
      names.insert((*it)[1]);
    }
  }
  return names;
}

TEST(Variables, TheReadmeTableListsExactlyTheVariablesRead) {
  const std::set<std::string> documented = ReadmeVariables();
  ASSERT_FALSE(documented.empty()) << "no table of variables found in README.md";
  std::set<std::string> read;
  for (const Variable& v : Variables()) read.insert(std::string(v.name));
  for (const std::string& name : read) {
    EXPECT_TRUE(documented.count(name)) << name << " is read but not in the README's table";
  }
  for (const std::string& name : documented) {
    EXPECT_TRUE(read.count(name)) << name << " is in the README's table but never read";
  }
}

TEST(Variables, TheReaderRefusesANameOutsideTheTable) {
  EnvReader reader(MapEnvironment({{"DTRAIN_NO_SUCH_THING", "1"}}));
  EXPECT_THROW(reader.Text("DTRAIN_NO_SUCH_THING"), std::logic_error);
  EXPECT_NO_THROW(reader.Text("DTRAIN_IO_THREADS"));
}

}  // namespace
}  // namespace dtrain
