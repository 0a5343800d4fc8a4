// libFuzzer target: the IDX (MNIST-format, plain or gzip) calibration-data reader.
#include "fuzz_support.h"
#include "sparsebit/core/data.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sparsebit::fuzz::quiet();
  try {
    sparsebit::read_idx(sparsebit::fuzz::write_scratch(data, size, ".idx"), 0);
  } catch (const sparsebit::Error&) {
  }
  return 0;
}
