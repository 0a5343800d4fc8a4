// libFuzzer target: image files as calibration data (stb_image behind the reader, whose header
// sizes are checked before the pixels are allocated), through every fit of [data].
#include "fuzz_support.h"
#include "sparsebit/core/data.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sparsebit::fuzz::quiet();
  const std::string path = sparsebit::fuzz::write_scratch(data, size, ".png");
  const sparsebit::ValueInfo input{"image", 1, true, {{-1, "batch"}, {3, ""}, {-1, "height"}, {-1, "width"}}, ""};
  for (const char* preset : {"imagenet", "paddleocr_rec", "paddleocr_det", "yolo"}) {
    try {
      const sparsebit::Config c =
          sparsebit::Config::from_string(std::string("[data]\npreset = \"") + preset + "\"\n", "fuzz.toml");
      sparsebit::read_image(path, *c.data, sparsebit::image_input(*c.data, input));
    } catch (const sparsebit::Error&) {
    }
  }
  return 0;
}
