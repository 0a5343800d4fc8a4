// Logging for an application that embeds the library (sparsebit/sdk/log.h): every message, the
// core's and each plugin's, reaches the sink the application sets, at its level, and spdlog's
// default logger (the application's own) is left as it was.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/log.h"
#include "test_support.h"

namespace sparsebit {
namespace {

using sdk::LogLevel;

// Collects what the library sends; restores stderr and the tests' level when it ends.
class Collected {
 public:
  explicit Collected(LogLevel level) : was_(sdk::log_level()) {
    sdk::set_log_sink([this](LogLevel l, const std::string& m) {
      std::lock_guard lock(mutex_);
      lines_.emplace_back(l, m);
    });
    sdk::set_log_level(level);
  }
  ~Collected() {
    sdk::set_log_sink(nullptr);
    sdk::set_log_prefix("");
    sdk::set_log_level(was_);
  }
  std::vector<std::pair<LogLevel, std::string>> lines() {
    std::lock_guard lock(mutex_);
    return lines_;
  }
  bool has(LogLevel level, const std::string& part) {
    for (const auto& [l, m] : lines())
      if (l == level && m.find(part) != std::string::npos) return true;
    return false;
  }

 private:
  LogLevel was_;
  std::mutex mutex_;
  std::vector<std::pair<LogLevel, std::string>> lines_;
};

// A Relu at opset 11, which loading with min_opset 13 lifts and says so at info level.
std::string relu_at_opset_11() {
  Graph g;
  g.opset_imports[""] = 11;
  g.inputs.push_back(ValueInfo{"x", 1, true, {Dim{2, ""}}, ""});
  g.outputs.push_back(ValueInfo{"y", 1, true, {Dim{2, ""}}, ""});
  g.append(testing::make_node("relu", "Relu", {"x"}, {"y"}));
  return serialize_onnx(g, ModelMeta{});
}

TEST(Logging, TheApplicationsSinkReceivesTheCoresMessagesAtItsLevel) {
  ImportOptions options;
  options.min_opset = 13;
  options.registry = &testing::shipped_registry();
  {
    Collected log(LogLevel::kInfo);
    load_onnx_from_bytes(relu_at_opset_11(), "relu.onnx", options);
    EXPECT_TRUE(log.has(LogLevel::kInfo, "relu.onnx: lifted from opset 11 to 13")) << log.lines().size();
    sdk::log_warn("a plugin's warning");  // what a plugin calls
    EXPECT_TRUE(log.has(LogLevel::kWarn, "a plugin's warning"));
  }
  {
    Collected log(LogLevel::kWarn);  // info is below the level: not delivered, not even formatted
    EXPECT_FALSE(sdk::log_enabled(LogLevel::kInfo));
    EXPECT_TRUE(sdk::log_enabled(LogLevel::kError));
    load_onnx_from_bytes(relu_at_opset_11(), "relu.onnx", options);
    EXPECT_TRUE(log.lines().empty());
    sdk::set_log_prefix("[rank 1] ");
    sdk::log_error("stopped");
    ASSERT_EQ(log.lines().size(), 1u);
    EXPECT_EQ(log.lines()[0].second, "[rank 1] stopped");
  }
}

TEST(Logging, SpdlogsDefaultLoggerStaysTheApplications) {
  const auto before = spdlog::default_logger();
  const auto sinks_before = before->sinks();
  const auto level_before = before->level();
  const LogLevel was = sdk::log_level();
  sdk::log_to_stderr(LogLevel::kDebug);  // what the CLI and the Python module do
  escape_log_messages();
  sdk::set_log_level(was);
  EXPECT_EQ(spdlog::default_logger(), before);
  EXPECT_EQ(spdlog::default_logger()->sinks(), sinks_before);  // not wrapped for escaping
  EXPECT_EQ(spdlog::default_logger()->level(), level_before);
  EXPECT_NE(spdlog::get("sparsebit"), nullptr);  // the library's own, found by name
  EXPECT_NE(spdlog::get("sparsebit"), before);
}

}  // namespace
}  // namespace sparsebit
