// The table of device kernels the quantization arithmetic dispatches to (Note [Device kernels]
// in kernels.h).

#include <c10/core/DeviceType.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "sparsebit/sdk/kernels.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

namespace {
struct KernelTable {
  std::mutex mutex;
  std::map<c10::DeviceType, std::shared_ptr<QuantKernels>> kernels;
};
KernelTable& kernel_table() {
  static auto* t = new KernelTable();  // outlives every static destructor that may quantize
  return *t;
}
std::atomic<bool>& kernels_on() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("SPARSEBIT_KERNELS");
    return !(v && std::string(v) == "0");
  }()};
  return on;
}
}  // namespace

QuantKernels* quant_kernels(c10::DeviceType device) {
  if (!kernels_on().load()) return nullptr;
  KernelTable& t = kernel_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.kernels.find(device);
  return it == t.kernels.end() ? nullptr : it->second.get();
}

MatMulNBitsKernels* matmul_nbits_kernels(c10::DeviceType device) {
  return dynamic_cast<MatMulNBitsKernels*>(quant_kernels(device));
}

void use_device_kernels(bool on) { kernels_on().store(on); }

void install_quant_kernels(c10::DeviceType device, std::shared_ptr<QuantKernels> kernels, const std::string& plugin) {
  KernelTable& t = kernel_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (!kernels) {
    t.kernels.erase(device);
    return;
  }
  sdk::log_debug(c10::DeviceTypeName(device) + " kernels from " + plugin + ": " + kernels->describe());
  t.kernels[device] = std::move(kernels);
}

}  // namespace sparsebit
