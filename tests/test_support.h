#pragma once
// Shared helpers for the test suite: the registry of the shipped plugins, temporary folders,
// running the CLI.

#include <gtest/gtest.h>
#include <ftw.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <typeinfo>

#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/graph.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit::testing {

namespace fs = std::filesystem;

/// Keeps test output to what matters (set before any test runs).
inline const bool kQuietLogs = (sdk::set_log_level(sdk::LogLevel::kWarn), true);

/// The plugins built with this tree, loaded once (no environment, no config paths).
inline const Registry& shipped_registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    PluginSearch s;
    s.use_environment = false;
    reg->load(s);
    return reg;
  }();
  return *r;
}

/// A graph under construction: float input "x" of `shape`, output "y".
struct Builder {
  Graph g;
  explicit Builder(std::vector<std::int64_t> shape, std::int64_t opset = 17) {
    g.opset_imports[""] = opset;
    ValueInfo x;
    x.name = "x";
    x.elem_type = 1;
    x.has_shape = true;
    for (auto d : shape) x.shape.push_back(Dim{d, ""});
    g.inputs.push_back(x);
    ValueInfo y;
    y.name = "y";
    y.elem_type = 1;
    g.outputs.push_back(y);
  }
  Node* add(const std::string& name, const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
            std::map<std::string, Attribute> attrs = {}) {
    Node n;
    n.name = name;
    n.op_type = op;
    n.inputs = std::move(in);
    n.outputs = std::move(out);
    n.attributes = std::move(attrs);
    return g.append(std::move(n));
  }
  void constant(const std::string& name, at::Tensor t) { g.initializers[name] = std::move(t); }
};

/// A node for graphs built by hand in tests.
inline Node make_node(const std::string& name, const std::string& op, std::vector<std::string> in,
                      std::vector<std::string> out, std::map<std::string, Attribute> attributes = {}) {
  Node n;
  n.name = name;
  n.op_type = op;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.attributes = std::move(attributes);
  return n;
}

/// The optional role `Role` of a plugin's object (Note [Capabilities] in sparsebit/sdk/quantizer.h);
/// throws naming the role when the object has none, so the test fails there.
template <class Role, class T>
Role& role(const std::unique_ptr<T>& object) {
  auto* r = dynamic_cast<Role*>(object.get());
  if (!r) throw Error(std::string("the object has no role ") + typeid(Role).name());
  return *r;
}

inline std::string fixture_model() {
  return std::string(SPARSEBIT_SOURCE_DIR) + "/examples/fashion_mnist/fashion_mnist_cnn.onnx";
}
inline std::string source_path(const std::string& rel) { return std::string(SPARSEBIT_SOURCE_DIR) + "/" + rel; }

/// A fresh folder under the system temp dir, removed at scope exit.
/// Removes a folder and everything in it, quietly. POSIX nftw rather than
/// std::filesystem::remove_all: PyTorch's libtorch.so exports its own copy of remove_all, which
/// crashes on nested folders in the GPU builds linked against it.
inline void remove_tree(const fs::path& path) {
  ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("sparsebit_test_" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() { remove_tree(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

/// Runs `fn` and returns the sparsebit::Error's message; fails the test if none is thrown.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no sparsebit::Error was thrown";
  return {};
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult r{-1, ""};
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), static_cast<int>(buf.size()), p)) r.output += buf.data();
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline CommandResult run_cli(const std::string& args) {
  return run_command("SPARSEBIT_PLUGIN_PATH= " + std::string(SPARSEBIT_CLI) + " " + args);
}

/// Files in a folder whose names start with `prefix` (temporary outputs left behind?).
inline int count_files(const fs::path& dir) {
  int n = 0;
  for (auto& e : fs::directory_iterator(dir)) n += e.is_regular_file();
  return n;
}

}  // namespace sparsebit::testing
