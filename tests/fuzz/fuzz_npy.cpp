// libFuzzer target: the .npy calibration-data reader.
#include "fuzz_support.h"
#include "sparsebit/core/data.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sparsebit::fuzz::quiet();
  try {
    sparsebit::read_npy(sparsebit::fuzz::write_scratch(data, size, ".npy"));
  } catch (const sparsebit::Error&) {
  }
  return 0;
}
