#pragma once
// Calls from the host into observer and quantizer plugins (quant_model.cpp, layerwise.cpp).

#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {

/// Runs one call into an observer or quantizer plugin; any failure becomes an Error naming the
/// quantized input, the plugin object and the call.
template <typename Fn>
auto plugin_call(const QuantSlot& s, bool observer, const char* call, Fn&& fn) -> decltype(fn()) {
  const std::string who = observer ? "observer '" + s.observer_name + "' (plugin '" + s.observer_plugin + "')"
                                   : "quantizer '" + s.quantizer_name + "' (plugin '" + s.quantizer_plugin + "')";
  try {
    return fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    throw Error(msg.find(s.tensor) != std::string::npos ? msg : s.where() + ": " + who + " " + call + ": " + msg);
  } catch (const c10::Error& e) {
    throw Error(s.where() + ": " + who + " failed in " + call + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw Error(s.where() + ": " + who + " failed in " + call + ": " + e.what());
  }
}

}  // namespace sparsebit
