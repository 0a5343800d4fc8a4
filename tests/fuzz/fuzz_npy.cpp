// libFuzzer target: the .npy calibration-data reader.
#include "fuzz_support.h"
#include "sparsebit/core/data.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sparsebit::fuzz::quiet();
  const std::string path = sparsebit::fuzz::write_scratch(data, size, ".npy");
  try {
    sparsebit::read_npy(path);
  } catch (const sparsebit::Error&) {
  }
  try {  // as calibration data: conformed to a model input with symbolic dims
    const std::vector<sparsebit::ValueInfo> inputs = {{"x", 1, true, {{-1, "batch"}, {-1, "length"}}, ""}};
    auto dataset = sparsebit::open_dataset(path, inputs);
    sparsebit::Batcher batches(*dataset, inputs, 4, 16);
    while (batches.next()) {
    }
  } catch (const sparsebit::Error&) {
  }
  return 0;
}
