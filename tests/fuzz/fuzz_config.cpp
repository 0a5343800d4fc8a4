// libFuzzer target: the TOML config loader on arbitrary text.
#include "fuzz_support.h"
#include "sparsebit/core/config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sparsebit::fuzz::quiet();
  try {
    sparsebit::Config::from_string(std::string(reinterpret_cast<const char*>(data), size), "fuzz.toml");
  } catch (const sparsebit::Error&) {
  }
  return 0;
}
