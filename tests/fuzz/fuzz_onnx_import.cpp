// libFuzzer target: the ONNX importer (protobuf parsing, opset conversion, schema checks,
// tensor decoding, graph validation) on arbitrary bytes.
#include "fuzz_support.h"
#include "sparsebit/core/onnx_io.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sparsebit::fuzz::quiet();
  try {
    sparsebit::load_onnx_from_bytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz.onnx");
  } catch (const sparsebit::Error&) {
  }
  return 0;
}
