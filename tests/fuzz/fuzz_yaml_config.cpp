// libFuzzer target: the original toolkit's YAML configs (Note [YAML configs]) on arbitrary text.
#include "fuzz_support.h"
#include "sparsebit/core/config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sparsebit::fuzz::quiet();
  try {
    const std::string text(reinterpret_cast<const char*>(data), size);
    sparsebit::Config::from_string(sparsebit::yaml_config_to_toml(text, "fuzz.yaml"), "fuzz.yaml");
  } catch (const sparsebit::Error&) {
  }
  return 0;
}
