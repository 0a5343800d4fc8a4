#pragma once
// What the executor keeps per control-flow node (If, Loop, Scan), shared by executor.cpp, which
// builds it, and control_flow.cpp, which runs the node.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sparsebit/core/executor.h"

namespace sparsebit {

struct Executor::ControlFlow {
  std::map<std::string, std::unique_ptr<Executor>> bodies;  ///< attribute name -> executor
  std::vector<std::string> implicit;                        ///< enclosing values the bodies read
  std::size_t first = 0, last = 0;                          ///< flat numbers of the nested nodes
};

}  // namespace sparsebit
