// How quantizing a model end to end scales with its node count: import, build (conversion,
// passes, quantizer slots), calibration on 2 samples, and QDQ export, for graphs of about 1k,
// 10k and 100k nodes in three shapes: a chain of Relu, residual conv blocks (Conv -> Relu ->
// Conv -> Add -> Sigmoid) and attention-like blocks (MatMul -> Softmax -> MatMul -> Add). Prints
// microseconds per node for each phase and the ratio to the smallest size measured in the same
// run (1.0 = linear).
//
//   graph_scaling_bench [--sizes 1000,10000,100000] [--shapes chain,resnet,attention]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <sstream>

#include "sparsebit/core/config.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/log.h"

namespace sb = sparsebit;
using Clock = std::chrono::steady_clock;

namespace {

sb::Node make(const std::string& op, const std::string& name, std::vector<std::string> in,
              std::vector<std::string> out) {
  sb::Node n;
  n.op_type = op;
  n.name = name;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

sb::ValueInfo tensor(const std::string& name, std::vector<std::int64_t> dims) {
  sb::ValueInfo v{name, 1, true, {}, ""};
  for (auto d : dims) v.shape.push_back(sb::Dim{d, ""});
  return v;
}

/// A graph of about `nodes` nodes of `shape`, and its input's dims.
sb::Graph build(const std::string& shape, std::int64_t nodes, std::vector<std::int64_t>& dims) {
  sb::Graph g;
  g.opset_imports[""] = 17;
  at::manual_seed(0);
  std::string x = "x";
  if (shape == "chain") {
    dims = {1, 64};
    for (std::int64_t i = 0; i < nodes; ++i) {
      const std::string y = "relu" + std::to_string(i);
      g.append(make("Relu", "/relu" + std::to_string(i), {x}, {y}));
      x = y;
    }
  } else if (shape == "resnet") {
    dims = {1, 8, 4, 4};
    for (std::int64_t b = 0; b * 5 < nodes; ++b) {
      const std::string p = "/block" + std::to_string(b);
      auto conv = [&](const std::string& name, const std::string& in) {
        g.initializers[p + name + ".weight"] = at::randn({8, 8, 3, 3}) * 0.1;
        g.initializers[p + name + ".bias"] = at::randn({8}) * 0.1;
        sb::Node c = make("Conv", p + name, {in, p + name + ".weight", p + name + ".bias"}, {p + name + "_out"});
        c.attributes["pads"] = sb::Attribute::of_ints({1, 1, 1, 1});
        g.append(std::move(c));
        return p + name + "_out";
      };
      const std::string a = conv("/conv1", x);
      g.append(make("Relu", p + "/relu1", {a}, {p + "/relu1_out"}));
      const std::string c = conv("/conv2", p + "/relu1_out");
      g.append(make("Add", p + "/add", {c, x}, {p + "/add_out"}));
      g.append(make("Sigmoid", p + "/squash", {p + "/add_out"}, {p + "/out"}));  // bounded at any depth
      x = p + "/out";
    }
  } else {
    dims = {1, 4, 16};
    for (std::int64_t b = 0; b * 4 < nodes; ++b) {
      const std::string p = "/attn" + std::to_string(b);
      g.initializers[p + ".wq"] = at::randn({16, 16}) * 0.2;
      g.initializers[p + ".wv"] = at::randn({16, 16}) * 0.2;
      g.append(make("MatMul", p + "/q", {x, p + ".wq"}, {p + "/q_out"}));
      sb::Node sm = make("Softmax", p + "/softmax", {p + "/q_out"}, {p + "/att"});
      sm.attributes["axis"] = sb::Attribute::of_int(-1);
      g.append(std::move(sm));
      g.append(make("MatMul", p + "/v", {p + "/att", p + ".wv"}, {p + "/v_out"}));
      g.append(make("Add", p + "/residual", {p + "/v_out", x}, {p + "/out"}));
      x = p + "/out";
    }
  }
  g.inputs.push_back(tensor("x", dims));
  g.outputs.push_back(tensor(x, dims));
  return g;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Row {
  std::string shape;
  std::int64_t nodes;
  double import_s, build_s, calibrate_s, export_s;
  double total() const { return import_s + build_s + calibrate_s + export_s; }
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> sizes = {"1000", "10000", "100000"}, shapes = {"chain", "resnet", "attention"};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--sizes") sizes = split(argv[i + 1]);
    else if (a == "--shapes") shapes = split(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: graph_scaling_bench [--sizes N,N,...] [--shapes chain,resnet,attention]\n");
      return 2;
    }
  }
  sb::sdk::set_log_level(sb::sdk::LogLevel::kError);
  sb::Config config;
  config.backend = "onnxruntime";
  config.a.qscheme = "per-tensor-affine";
  config.calibration.batch_size = 1;
  sb::Registry registry;
  registry.load(config.plugins);
  const auto dir = std::filesystem::temp_directory_path() / "sparsebit_graph_scaling";
  std::filesystem::create_directories(dir);
  std::printf("W8A8 (onnxruntime), 2 calibration samples, %d LibTorch thread(s); microseconds per node\n\n",
              at::get_num_threads());
  std::printf("%-10s %8s %9s %9s %9s %9s %9s %10s %12s\n", "shape", "nodes", "import", "build", "calibrate", "export",
              "total", "total s", "vs smallest");
  for (const auto& shape : shapes) {
    double baseline = 0;
    for (const auto& size : sizes) {
      std::vector<std::int64_t> dims;
      const std::string path = (dir / (shape + "_" + size + ".onnx")).string();
      {
        sb::Graph g = build(shape, std::stoll(size), dims);
        sb::save_onnx(g, sb::ModelMeta{}, path);
      }
      Row r{shape, 0, 0, 0, 0, 0};
      auto t0 = Clock::now();
      sb::Model model = sb::load_onnx(path);
      r.import_s = seconds_since(t0);
      r.nodes = static_cast<std::int64_t>(model.graph.num_nodes());
      t0 = Clock::now();
      sb::QuantModel qm(std::move(model), config, registry);
      r.build_s = seconds_since(t0);
      t0 = Clock::now();
      {
        struct TwoSamples : sb::Dataset {
          std::vector<std::int64_t> dims;
          int left = 2;
          std::string describe() const override { return "2 random samples"; }
          std::optional<std::int64_t> num_samples() const override { return 2; }
          std::optional<sb::Batch> next() override {
            if (left-- <= 0) return std::nullopt;
            return sb::Batch{{at::randn(dims)}, "random", true};
          }
        } data;
        data.dims = dims;
        qm.calibrate(data);
      }
      r.calibrate_s = seconds_since(t0);
      t0 = Clock::now();
      const std::string bytes = qm.serialize();
      r.export_s = seconds_since(t0);
      std::filesystem::remove(path);
      const double per_node = 1e6 * r.total() / static_cast<double>(r.nodes);
      if (baseline == 0) baseline = per_node;
      auto us = [&](double s) { return 1e6 * s / static_cast<double>(r.nodes); };
      std::printf("%-10s %8lld %9.1f %9.1f %9.1f %9.1f %9.1f %10.2f %11.2fx\n", shape.c_str(),
                  static_cast<long long>(r.nodes), us(r.import_s), us(r.build_s), us(r.calibrate_s), us(r.export_s),
                  per_node, r.total(), per_node / baseline);
      std::fflush(stdout);
    }
  }
  return 0;
}
