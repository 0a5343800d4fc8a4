// `sparsebit simplify`: run the simplify-stage passes and write the float model.

#include <cstdio>
#include <map>
#include <set>

#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/session.h"

#include "common.h"

namespace sparsebit::cli {
namespace {

std::map<std::string, int> op_histogram(const sb::Graph& g) {
  std::map<std::string, int> h;
  for (const auto* n : g.nodes()) ++h[(n->domain.empty() ? "" : n->domain + ":") + n->op_type];
  return h;
}

int cmd_simplify(const std::string& model_path, const std::string& config_path, const std::string& output) {
  check_distinct_paths({{"the model", model_path}, {"-c", config_path}}, {{"-o", output, true}});
  sb::AtomicFile out(output);
  const sb::Session session(config_path.empty() ? sb::Config() : sb::Config::from_file(config_path));
  sb::Model model = session.read(model_path, 13);
  const auto before = op_histogram(model.graph);
  const auto nodes_before = model.graph.num_nodes();
  session.simplify(model);
  const auto after = op_histogram(model.graph);
  out.write(sb::serialize_onnx(model.graph, model.meta));
  out.commit();
  std::printf("%s: %zu -> %zu nodes\n", output.c_str(), nodes_before, model.graph.num_nodes());
  std::set<std::string> ops;
  for (const auto& [op, n] : before) ops.insert(op);
  for (const auto& [op, n] : after) ops.insert(op);
  for (const auto& op : ops) {
    const int b = before.count(op) ? before.at(op) : 0, a = after.count(op) ? after.at(op) : 0;
    if (a != b) std::printf("  %-26s %5d -> %d\n", op.c_str(), b, a);
  }
  return 0;
}

}  // namespace

Command add_simplify(CLI::App& app) {
  struct Args {
    std::string model, config, output;
  };
  auto a = std::make_shared<Args>();
  auto* simplify = app.add_subcommand("simplify", "Run the simplify-stage passes and write the float model");
  simplify->add_option("model", a->model, "ONNX model")->required();
  simplify->add_option("-c,--config", a->config, "Config whose [schedule]/[passes]/[plugins] to use (default: all on)");
  simplify->add_option("-o,--output", a->output, "Output ONNX model")->required();
  return {simplify, [a] { return cmd_simplify(a->model, a->config, a->output); }};
}

}  // namespace sparsebit::cli
