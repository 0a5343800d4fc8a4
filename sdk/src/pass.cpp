// The host's handler for release_initializer (pass.h), one per thread: a host sets it around
// the passes it runs.

#include <functional>
#include <string>
#include <utility>

#include "sparsebit/sdk/pass.h"

namespace sparsebit {
namespace {
std::function<void(Graph&, const std::string&)>& handler() {
  thread_local std::function<void(Graph&, const std::string&)> h;
  return h;
}
}  // namespace

void release_initializer(Graph& graph, const std::string& name) {
  if (const auto& h = handler()) h(graph, name);
}

ReleaseHandler::ReleaseHandler(std::function<void(Graph&, const std::string&)> h)
    : previous_(std::exchange(handler(), std::move(h))) {}

ReleaseHandler::~ReleaseHandler() { handler() = std::move(previous_); }

}  // namespace sparsebit
