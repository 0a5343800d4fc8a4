#include "sparsebit/sdk/data_parallel.h"

#include <utility>

namespace sparsebit::sdk {

namespace {
// Set by the host between epochs, read by ops during the step: never concurrently.
int g_processes = 1;
std::function<at::Tensor(const at::Tensor&)> g_sum;
}  // namespace

int training_processes() { return g_processes; }

at::Tensor sum_over_processes(const at::Tensor& t) { return g_processes > 1 && g_sum ? g_sum(t) : t; }

void set_process_sum(int processes, std::function<at::Tensor(const at::Tensor&)> sum) {
  g_processes = sum ? processes : 1;
  g_sum = std::move(sum);
}

}  // namespace sparsebit::sdk
