// Every environment variable dtrain reads, in one table. EnvReader refuses to read a name that is
// not here, and a test checks the README's table of variables against this one, so a variable
// cannot be added without being documented.
#pragma once

#include <span>
#include <string_view>

namespace dtrain {

struct Variable {
  std::string_view name;
  // Set by a launcher (dtrain launch, mpirun), not by users: documented in the table all the same.
  bool set_by_launcher = false;
};

std::span<const Variable> Variables();
bool IsKnownVariable(std::string_view name);

}  // namespace dtrain
