// libFuzzer target: the IDX (MNIST-format, plain or gzip) readers: labels (read_idx) and images
// streamed as calibration data (the dataset, whose header sizes are checked before allocating).
#include "fuzz_support.h"
#include "sparsebit/core/data.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sparsebit::fuzz::quiet();
  const std::string path = sparsebit::fuzz::write_scratch(data, size, ".idx");
  try {
    sparsebit::read_idx(path, 0);
  } catch (const sparsebit::Error&) {
  }
  try {
    const std::vector<sparsebit::ValueInfo> inputs = {
        {"image", 1, true, {{-1, "batch"}, {1, ""}, {-1, "height"}, {-1, "width"}}, ""}};
    auto dataset = sparsebit::open_dataset(path, inputs);
    sparsebit::Batcher batches(*dataset, inputs, 4, 16);
    while (batches.next()) {
    }
  } catch (const sparsebit::Error&) {
  }
  return 0;
}
