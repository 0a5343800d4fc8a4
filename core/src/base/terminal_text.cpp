// Text from models, configs and paths on its way to the terminal and into text files
// (sparsebit/core/config.h: displayed, escape_log_messages).

#include <spdlog/sinks/sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "sparsebit/core/config.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

std::string displayed(const std::string& text, bool keep_lines) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    // The length of a well-formed UTF-8 sequence starting here (RFC 3629), 0 if none.
    std::size_t len = c < 0x80                   ? 1
                      : (c >= 0xc2 && c <= 0xdf) ? 2
                      : (c >= 0xe0 && c <= 0xef) ? 3
                      : (c >= 0xf0 && c <= 0xf4) ? 4
                                                 : 0;
    if (len > 1) {
      if (i + len > text.size()) len = 0;
      for (std::size_t k = 1; k < len; ++k)
        if ((static_cast<unsigned char>(text[i + k]) & 0xc0) != 0x80) len = 0;
      if (len == 3) {  // no overlong forms, no surrogates
        const auto d = static_cast<unsigned char>(text[i + 1]);
        if ((c == 0xe0 && d < 0xa0) || (c == 0xed && d > 0x9f)) len = 0;
      } else if (len == 4) {
        const auto d = static_cast<unsigned char>(text[i + 1]);
        if ((c == 0xf0 && d < 0x90) || (c == 0xf4 && d > 0x8f)) len = 0;
      }
    }
    if (len == 1) {
      out += keep_lines && (c == '\n' || c == '\t') ? std::string(1, static_cast<char>(c))
                                                    : printable(std::string(1, static_cast<char>(c)), 1);
      ++i;
    } else if (len == 0) {
      out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
      ++i;
    } else {
      out.append(text, i, len);
      i += len;
    }
  }
  return out;
}

namespace {

/// Every message of the host and of every plugin passes through displayed() on its way to the
/// sink it wraps: a node name holding ESC or CR, echoed in a warning, cannot steer the terminal.
class EscapingSink final : public spdlog::sinks::sink {
 public:
  explicit EscapingSink(std::shared_ptr<spdlog::sinks::sink> inner) : inner_(std::move(inner)) {}
  void log(const spdlog::details::log_msg& msg) override {
    const std::string safe = displayed(std::string(msg.payload.data(), msg.payload.size()), true);
    spdlog::details::log_msg copy(msg);
    copy.payload = spdlog::string_view_t(safe.data(), safe.size());
    inner_->log(copy);
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override { inner_->set_formatter(std::move(f)); }

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_;
};

}  // namespace

void escape_log_messages() {
  sdk::log_level();  // makes sure the library's stderr logger exists
  const auto logger = spdlog::get("sparsebit");
  if (!logger) return;
  for (auto& sink : logger->sinks())
    if (!std::dynamic_pointer_cast<EscapingSink>(sink)) sink = std::make_shared<EscapingSink>(sink);
}

}  // namespace sparsebit
