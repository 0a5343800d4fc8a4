// libFuzzer target: the ONNX-tensor (.pb) calibration-data reader.
#include "fuzz_support.h"
#include "sparsebit/core/onnx_io.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sparsebit::fuzz::quiet();
  try {
    sparsebit::load_tensor_pb(sparsebit::fuzz::write_scratch(data, size, ".pb"));
  } catch (const sparsebit::Error&) {
  }
  return 0;
}
