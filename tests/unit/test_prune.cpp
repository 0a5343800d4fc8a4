// Pruning (each sparser's own pattern is tested beside it, plugins/sparsers/*/tests): channel
// removal through residual Adds, Concat, BatchNormalization, depthwise convs and Flatten (the
// shrunk model computes the masked one, and the shrunk weights are exact slices of the
// originals), global scope, what pins channels, config errors, and fine-tuning that keeps the zeros.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "sparsebit/core/data.h"
#include "sparsebit/core/executor.h"
#include "sparsebit/core/prune.h"
#include "prune_testing.h"
#include "test_support.h"

namespace sparsebit {
namespace {

using testing::Builder;
using testing::run_prune;
using testing::sparse_config;

at::Tensor run(const Graph& g, const at::Tensor& x) {
  Executor ex(g, testing::shipped_registry());
  return ex.run({{"x", x}})[0];
}

Attribute ints(std::vector<std::int64_t> v) { return Attribute::of_ints(std::move(v)); }

TEST(Prune, GlobalScopeRanksAllLayersTogether) {
  Builder b({1, 4, 5, 5});
  at::manual_seed(2);
  b.constant("w1", at::randn({4, 4, 1, 1}) * 10);   // large: keeps most
  b.constant("w2", at::randn({4, 4, 1, 1}) * 0.1);  // small: loses most
  b.add("c1", "Conv", {"x", "w1"}, {"a"});
  b.add("c2", "Conv", {"a", "w2"}, {"y"});
  auto r = run_prune(b.g, "[sparse]\nratio = 0.5\nscope = \"global\"\n", {1, 4, 5, 5});
  const auto z1 = (r.pruned.graph.initializers.at("w1") == 0).sum().item<std::int64_t>();
  const auto z2 = (r.pruned.graph.initializers.at("w2") == 0).sum().item<std::int64_t>();
  EXPECT_EQ(z1 + z2, 16);
  EXPECT_GT(z2, z1);
  const at::Tensor all = at::cat({b.g.initializers.at("w1").flatten(), b.g.initializers.at("w2").flatten()}).abs();
  const double threshold = std::get<0>(all.kthvalue(16)).item<double>();
  EXPECT_EQ(z2, (b.g.initializers.at("w2").abs() <= threshold).sum().item<std::int64_t>());
}

// conv0 -> BN -> Relu = a; conv1(a) -> BN = b; Relu(a + b) -> GlobalAveragePool -> Flatten -> Gemm.
Builder residual_block() {
  Builder b({1, 4, 6, 6});
  at::manual_seed(4);
  b.constant("w0", at::randn({8, 4, 3, 3}));
  b.constant("b0", at::randn({8}));
  b.constant("w1", at::randn({8, 8, 3, 3}) * 0.3);
  for (const char* bn : {"bn0", "bn1"}) {
    b.constant(std::string(bn) + "_s", at::rand({8}) + 0.5);
    b.constant(std::string(bn) + "_b", at::randn({8}));
    b.constant(std::string(bn) + "_m", at::randn({8}) * 0.1);
    b.constant(std::string(bn) + "_v", at::rand({8}) + 0.5);
  }
  b.constant("fc", at::randn({3, 8}));
  b.constant("fc_b", at::randn({3}));
  const Attribute pad = ints({1, 1, 1, 1});
  b.add("conv0", "Conv", {"x", "w0", "b0"}, {"c0"}, {{"pads", pad}});
  b.add("bn0", "BatchNormalization", {"c0", "bn0_s", "bn0_b", "bn0_m", "bn0_v"}, {"n0"});
  b.add("relu0", "Relu", {"n0"}, {"a"});
  b.add("conv1", "Conv", {"a", "w1"}, {"c1"}, {{"pads", pad}});
  b.add("bn1", "BatchNormalization", {"c1", "bn1_s", "bn1_b", "bn1_m", "bn1_v"}, {"n1"});
  b.add("add", "Add", {"a", "n1"}, {"s"});
  b.add("relu1", "Relu", {"s"}, {"r"});
  b.add("pool", "GlobalAveragePool", {"r"}, {"p"});
  b.add("flat", "Flatten", {"p"}, {"f"});
  b.add("fc", "Gemm", {"f", "fc", "fc_b"}, {"y"}, {{"transB", Attribute::of_int(1)}});
  return b;
}

TEST(Prune, ResidualChannelsArePrunedAsOneGroupByTheirSummedNormalisedNorms) {
  Builder b = residual_block();
  auto r = run_prune(b.g, "[sparse]\nsparser = \"l1_structured\"\nratio = 0.5\n", {1, 4, 6, 6});
  EXPECT_EQ(r.channels_removed, 4);
  // Hand ranking: each conv's filter L1 norms over their mean, summed across the Add.
  auto norm = [&](const char* w) {
    at::Tensor n = b.g.initializers.at(w).abs().sum({1, 2, 3});
    return n / n.mean();
  };
  at::Tensor keep = std::get<0>(std::get<1>((norm("w0") + norm("w1")).topk(4)).sort());
  const auto& p = r.pruned.graph.initializers;
  const auto& o = b.g.initializers;
  EXPECT_TRUE(at::equal(p.at("w0"), o.at("w0").index_select(0, keep)));
  EXPECT_TRUE(at::equal(p.at("b0"), o.at("b0").index_select(0, keep)));
  EXPECT_TRUE(at::equal(p.at("w1"), o.at("w1").index_select(0, keep).index_select(1, keep)));
  for (const char* t : {"bn0_s", "bn0_b", "bn0_m", "bn0_v", "bn1_s", "bn1_v"})
    EXPECT_TRUE(at::equal(p.at(t), o.at(t).index_select(0, keep))) << t;
  EXPECT_TRUE(at::equal(p.at("fc"), o.at("fc").index_select(1, keep)));
  EXPECT_TRUE(at::equal(p.at("fc_b"), o.at("fc_b")));
  // The shrunk model computes the masked one.
  at::Tensor x = at::randn({3, 4, 6, 6});
  EXPECT_TRUE(at::allclose(run(r.pruned.graph, x), run(r.masked.graph, x), 1e-5, 1e-5));
  EXPECT_EQ(r.masked.graph.initializers.at("w0").sizes(), o.at("w0").sizes());
  EXPECT_LT(r.after.parameters, r.before.parameters);
}

TEST(Prune, RoundToKeepsAMultipleOfChannels) {
  // 8 channels at ratio 0.5 keep 4; round_to = 3 rounds that up to 6.
  auto r =
      run_prune(residual_block().g, "[sparse]\nsparser = \"l1_structured\"\nratio = 0.5\nround_to = 3\n", {1, 4, 6, 6});
  EXPECT_EQ(r.channels_removed, 2);
  EXPECT_EQ(r.pruned.graph.initializers.at("w0").size(0), 6);
}

TEST(Prune, SkippingOneLayerOfAResidualGroupKeepsTheWholeGroup) {
  Builder b = residual_block();
  auto r = run_prune(b.g, "[sparse]\nsparser = \"l1_structured\"\nratio = 0.5\nskip = [\"conv1\"]\n", {1, 4, 6, 6});
  EXPECT_EQ(r.channels_removed, 0);
  EXPECT_TRUE(at::equal(r.pruned.graph.initializers.at("w0"), b.g.initializers.at("w0")));
  EXPECT_FALSE(r.notes.empty());
}

TEST(Prune, ConcatDepthwiseAndFlattenFollowTheChannels) {
  // Two convs concatenated, a depthwise conv, Flatten over 2x2 positions, a MatMul.
  Builder b({1, 2, 2, 2});
  at::manual_seed(5);
  b.constant("wa", at::randn({4, 2, 1, 1}));
  b.constant("wb", at::randn({6, 2, 1, 1}));
  b.constant("wd", at::randn({10, 1, 3, 3}));
  b.constant("bd", at::randn({10}));
  b.constant("fc", at::randn({40, 5}));
  b.add("a", "Conv", {"x", "wa"}, {"ya"});
  b.add("b", "Conv", {"x", "wb"}, {"yb"});
  b.add("cat", "Concat", {"ya", "yb"}, {"c"}, {{"axis", Attribute::of_int(1)}});
  b.add("dw", "Conv", {"c", "wd", "bd"}, {"d"}, {{"group", Attribute::of_int(10)}, {"pads", ints({1, 1, 1, 1})}});
  b.add("flat", "Flatten", {"d"}, {"f"});
  b.add("fc", "MatMul", {"f", "fc"}, {"y"});
  auto r = run_prune(b.g, "[sparse]\nsparser = \"l1_structured\"\nratio = 0.5\n", {1, 2, 2, 2});
  EXPECT_EQ(r.channels_removed, 2 + 3);
  auto keep_of = [&](const char* w, std::int64_t k) {
    return std::get<0>(std::get<1>(b.g.initializers.at(w).abs().sum({1, 2, 3}).topk(k)).sort());
  };
  at::Tensor keep = at::cat({keep_of("wa", 2), keep_of("wb", 3) + 4});
  const auto& p = r.pruned.graph.initializers;
  EXPECT_TRUE(at::equal(p.at("wd"), b.g.initializers.at("wd").index_select(0, keep)));
  EXPECT_EQ(r.pruned.graph.find_node("dw")->attr_int("group", 0), 5);
  // Flatten puts channel c at features 4c .. 4c+3.
  at::Tensor rows = (keep.unsqueeze(1) * 4 + at::arange(4).unsqueeze(0)).flatten();
  EXPECT_TRUE(at::equal(p.at("fc"), b.g.initializers.at("fc").index_select(0, rows)));
  at::Tensor x = at::randn({2, 2, 2, 2});
  EXPECT_TRUE(at::allclose(run(r.pruned.graph, x), run(r.masked.graph, x), 1e-5, 1e-5));
}

TEST(Prune, UnknownChannelBehaviourPinsChannels) {
  Builder b({1, 4, 3, 3});
  b.constant("w", at::randn({6, 4, 1, 1}));
  b.add("conv", "Conv", {"x", "w"}, {"a"});
  b.add("softmax", "Softmax", {"a"}, {"y"}, {{"axis", Attribute::of_int(1)}});  // mixes channels
  auto r = run_prune(b.g, "[sparse]\nsparser = \"l1_structured\"\nratio = 0.5\n", {1, 4, 3, 3});
  EXPECT_EQ(r.channels_removed, 0);
  EXPECT_EQ(r.after.parameters, r.before.parameters);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("6 of 6 kept, held by node 'softmax' (Softmax)"), std::string::npos) << r.notes[0];
}

TEST(Prune, AWeightSharedByTwoLayersIsCopiedForEach) {
  // conv1 and conv2 read one initializer (directly and through an Identity, as exporters write
  // identical tensors); each gets its own slice.
  Builder b({1, 6, 3, 3});
  at::manual_seed(6);
  b.constant("w", at::randn({6, 6, 1, 1}));
  b.constant("w_out", at::randn({2, 6, 1, 1}));
  b.add("id", "Identity", {"w"}, {"w_copy"});
  b.add("conv1", "Conv", {"x", "w"}, {"a"});
  b.add("conv2", "Conv", {"a", "w_copy"}, {"c"});
  b.add("head", "Conv", {"c", "w_out"}, {"y"});
  auto r = run_prune(b.g, "[sparse]\nsparser = \"l1_structured\"\nratio = 0.5\n", {1, 6, 3, 3});
  EXPECT_EQ(r.channels_removed, 6);
  Graph& p = r.pruned.graph;
  const at::Tensor& w1 = p.initializers.at(p.find_node("conv1")->inputs[1]);
  const at::Tensor& w2 = p.initializers.at(p.find_node("conv2")->inputs[1]);
  EXPECT_EQ(w1.sizes(), (std::vector<std::int64_t>{3, 6, 1, 1}));
  EXPECT_EQ(w2.sizes(), (std::vector<std::int64_t>{3, 3, 1, 1}));
  EXPECT_EQ(r.after.parameters, 18 + 9 + 6);
  at::Tensor x = at::randn({2, 6, 3, 3});
  EXPECT_TRUE(at::allclose(run(r.pruned.graph, x), run(r.masked.graph, x), 1e-5, 1e-5));
}

TEST(Prune, SpecificRatiosApplyFirstMatchFirst) {
  Builder b({1, 4, 3, 3});
  b.constant("w1", at::randn({8, 4, 1, 1}));
  b.constant("w2", at::randn({8, 8, 1, 1}));
  b.add("head/conv", "Conv", {"x", "w1"}, {"a"});
  b.add("tail/conv", "Conv", {"a", "w2"}, {"y"});
  auto r = run_prune(b.g, R"([sparse]
ratio = 0.5
[[sparse.specific]]
nodes = ["head/*"]
ratio = 0.25
[[specific]]
nodes = "tail/*"
sparse = { ratio = 0 }
)",
                     {1, 4, 3, 3});
  EXPECT_EQ((r.pruned.graph.initializers.at("w1") == 0).sum().item<std::int64_t>(), 8);
  EXPECT_EQ((r.pruned.graph.initializers.at("w2") == 0).sum().item<std::int64_t>(), 0);
}

TEST(Prune, ConfigErrorsNameTheKeyAndTheFix) {
  Builder b({1, 4, 3, 3});
  b.constant("w", at::randn({8, 4, 1, 1}));
  b.add("conv", "Conv", {"x", "w"}, {"y"});
  auto error = [&](const std::string& toml) { return testing::error_of([&] { run_prune(b.g, toml, {1, 4, 3, 3}); }); };
  EXPECT_NE(error("[sparse]\nsparser = \"l1_structurd\"\n").find("did you mean 'l1_structured'"), std::string::npos);
  EXPECT_NE(error("[sparse]\nsparser = \"l1_unstructured\"\ngranularity = \"channel\"\n")
                .find("use sparser = \"l1_structured\""),
            std::string::npos);
  EXPECT_NE(error("[sparse]\nsparser = \"n_m\"\ngranularity = \"4:2\"\n").find("1 <= N < M"), std::string::npos);
  EXPECT_NE(error("[sparse]\nsparser = \"l1_structured\"\nscope = \"global\"\n").find("element sparser"),
            std::string::npos);
  EXPECT_NE(error("[sparse]\n[sparse.sparser_options]\nalpha = 1\n").find("sparse.sparser_options.alpha"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { sparse_config("[sparse]\nratio = 1.5\n"); }).find("test.toml: sparse.ratio must be"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { sparse_config("[sparse]\nratoi = 0.5\n"); }).find("did you mean 'ratio'"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              sparse_config("[[specific]]\nnodes = \"a\"\nsparse = { ratio = 0.5 }\n");
            }).find("needs a [sparse] table"),
            std::string::npos);
  EXPECT_NE(
      testing::error_of([] { prune(Model{}, sparse_config(""), testing::shipped_registry(), {}); }).find("no [sparse]"),
      std::string::npos);
}

TEST(Prune, BiasCompensationGivesTheRemovedChannelsMeanToTheNextBias) {
  // x [N, 4] -> Gemm (6 channels) -> Relu -> Gemm (3 outputs, bias b2).
  Builder b({-1, 4});
  b.g.inputs[0].shape[0] = Dim{-1, "batch"};
  at::manual_seed(8);
  b.constant("w1", at::randn({6, 4}));
  b.constant("b1", at::randn({6}));
  b.constant("w2", at::randn({3, 6}));
  b.constant("b2", at::randn({3}));
  const Attribute t = Attribute::of_int(1);
  b.add("fc1", "Gemm", {"x", "w1", "b1"}, {"h"}, {{"transB", t}});
  b.add("relu", "Relu", {"h"}, {"r"});
  b.add("fc2", "Gemm", {"r", "w2", "b2"}, {"y"}, {{"transB", t}});
  testing::TempDir dir;
  const at::Tensor x = at::randn({64, 4});
  write_npy(x, dir / "batch.npy");
  Config c = sparse_config("[sparse]\nsparser = \"l1_structured\"\nratio = 0.5\nbias_compensation = true\n");
  Model m{b.g.clone(), {}};
  auto data = open_dataset(dir.path().string(), m.graph.inputs);
  PruneResult r = prune(m, c, testing::shipped_registry(), {x.narrow(0, 0, 1)}, data.get());
  EXPECT_EQ(r.bias_compensated, 1);
  // By hand: the channels fc1 drops, their mean after the Relu, through w2.
  const auto& o = b.g.initializers;
  at::Tensor keep = std::get<0>(std::get<1>(o.at("w1").abs().sum(1).topk(3)).sort());
  at::Tensor drop = at::ones({6}, at::kBool).index_fill_(0, keep, false).nonzero().flatten();
  at::Tensor mean = at::relu(at::addmm(o.at("b1"), x, o.at("w1").t())).mean(0);
  at::Tensor expected = o.at("b2") + o.at("w2").index_select(1, drop).matmul(mean.index_select(0, drop));
  EXPECT_TRUE(at::allclose(r.pruned.graph.initializers.at("b2"), expected, 1e-6, 1e-6));
  // The mean output over the data is what the unpruned model gives.
  const at::Tensor y0 = run(b.g, x), y1 = run(r.pruned.graph, x);
  EXPECT_TRUE(at::allclose(y1.mean(0), y0.mean(0), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(y1, run(r.masked.graph, x), 1e-5, 1e-5));
}

TEST(Prune, BiasCompensationOfAConvUsesTheMeanUnderEachKernelTap) {
  // One padded 3x3 conv pruned unstructured: its output mean over the data stays exactly.
  Builder b({-1, 2, 5, 5});
  b.g.inputs[0].shape[0] = Dim{-1, "batch"};
  at::manual_seed(9);
  b.constant("w", at::randn({4, 2, 3, 3}));
  b.add("conv", "Conv", {"x", "w"}, {"y"}, {{"kernel_shape", ints({3, 3})}, {"pads", ints({1, 1, 1, 1})}});
  testing::TempDir dir;
  const at::Tensor x = at::rand({16, 2, 5, 5}) + 0.5;  // a non-zero mean, and borders that differ
  write_npy(x, dir / "batch.npy");
  Config c = sparse_config("[sparse]\nratio = 0.5\nbias_compensation = true\n");
  Model m{b.g.clone(), {}};
  auto data = open_dataset(dir.path().string(), m.graph.inputs);
  PruneResult r = prune(m, c, testing::shipped_registry(), {x.narrow(0, 0, 1)}, data.get());
  ASSERT_EQ(r.pruned.graph.find_node("conv")->inputs.size(), 3u);  // a bias was added
  const at::Tensor y0 = run(b.g, x), y1 = run(r.pruned.graph, x);
  EXPECT_TRUE(at::allclose(y1.mean({0, 2, 3}), y0.mean({0, 2, 3}), 1e-5, 1e-5));
}

// Exporters share identical constants through Identity nodes (torch writes every zero bias of
// EfficientNet's squeeze-excitation convs as Identity(one initializer)): both convs here read
// their weight and their bias that way. Element pruning prunes such a weight and gives each
// conv a bias of its own, so the two keep their output means separately.
TEST(Prune, BiasCompensationReachesBiasesSharedThroughIdentity) {
  Builder b({-1, 2, 5, 5});
  b.g.inputs[0].shape[0] = Dim{-1, "batch"};
  at::manual_seed(10);
  b.constant("w", at::randn({4, 2, 3, 3}));
  b.constant("w2", at::randn({4, 4, 1, 1}));
  b.constant("zero", at::zeros({4}));
  b.add("wid", "Identity", {"w"}, {"w_shared"});
  b.add("bid", "Identity", {"zero"}, {"bias"});
  b.add("conv", "Conv", {"x", "w_shared", "bias"}, {"c"},
        {{"kernel_shape", ints({3, 3})}, {"pads", ints({1, 1, 1, 1})}});
  b.add("conv2", "Conv", {"c", "w2", "bias"}, {"y"}, {{"kernel_shape", ints({1, 1})}});
  testing::TempDir dir;
  const at::Tensor x = at::rand({16, 2, 5, 5}) + 0.5;
  write_npy(x, dir / "batch.npy");
  Config c = sparse_config("[sparse]\nratio = 0.5\nbias_compensation = true\n");
  Model m{b.g.clone(), {}};
  auto data = open_dataset(dir.path().string(), m.graph.inputs);
  PruneResult r = prune(m, c, testing::shipped_registry(), {x.narrow(0, 0, 1)}, data.get());
  EXPECT_EQ(r.bias_compensated, 2);
  const Node* conv = r.pruned.graph.find_node("conv");
  const Node* conv2 = r.pruned.graph.find_node("conv2");
  ASSERT_TRUE(conv && conv2);
  EXPECT_NE(conv->inputs[2], conv2->inputs[2]) << "each conv compensates in a bias of its own";
  EXPECT_EQ(at::count_nonzero(r.pruned.graph.initializers.at(conv->inputs[1])).item<std::int64_t>(), 36);
  // The first conv's output mean stays exactly (the second reads the pruned first's output).
  Graph first = r.pruned.graph.clone(), original = b.g.clone();
  for (Graph* g : {&first, &original}) g->outputs[0].name = "c";
  const at::Tensor c0 = run(original, x), c1 = run(first, x);
  EXPECT_TRUE(at::allclose(c1.mean({0, 2, 3}), c0.mean({0, 2, 3}), 1e-5, 1e-5));
}

// A bias computed at run time (here the sum of two constants) cannot take the compensation:
// the layer is pruned and left uncompensated, not a crash.
TEST(Prune, BiasCompensationLeavesAComputedBiasAlone) {
  Builder b({-1, 2, 5, 5});
  b.g.inputs[0].shape[0] = Dim{-1, "batch"};
  at::manual_seed(11);
  b.constant("w", at::randn({4, 2, 3, 3}));
  b.constant("b1", at::randn({4}));
  b.constant("b2", at::randn({4}));
  b.add("bias", "Add", {"b1", "b2"}, {"b"});
  b.add("conv", "Conv", {"x", "w", "b"}, {"y"}, {{"kernel_shape", ints({3, 3})}, {"pads", ints({1, 1, 1, 1})}});
  testing::TempDir dir;
  const at::Tensor x = at::rand({8, 2, 5, 5}) + 0.5;
  write_npy(x, dir / "batch.npy");
  Config c = sparse_config("[sparse]\nratio = 0.5\nbias_compensation = true\n");
  Model m{b.g.clone(), {}};
  auto data = open_dataset(dir.path().string(), m.graph.inputs);
  PruneResult r = prune(m, c, testing::shipped_registry(), {x.narrow(0, 0, 1)}, data.get());
  EXPECT_EQ(r.bias_compensated, 0);
  EXPECT_EQ(at::count_nonzero(r.pruned.graph.initializers.at("w")).item<std::int64_t>(), 36);
  EXPECT_EQ(r.pruned.graph.find_node("conv")->inputs[2], "b");
}

TEST(Prune, FineTuningKeepsTheZerosAndLowersTheDistillationLoss) {
  Model teacher = load_onnx(testing::fixture_model());
  const std::string images = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";
  auto sample = sample_inputs(teacher.graph, images);
  PruneResult r = prune(teacher, sparse_config("[sparse]\nratio = 0.75\n"), testing::shipped_registry(), sample);
  Model student{r.pruned.graph.clone(), r.pruned.meta};
  QatConfig q;
  q.epochs = 2;
  q.count = 512;
  q.lr = 1e-3;
  auto open = [&] { return open_dataset(images, student.graph.inputs); };
  const auto losses = finetune(student, teacher, testing::shipped_registry(), open, q);
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_LT(losses[1], losses[0]);
  for (const auto& l : r.layers) {
    const at::Tensor before = r.pruned.graph.initializers.at(l.weight), after = student.graph.initializers.at(l.weight);
    EXPECT_TRUE(at::equal(before == 0, after == 0)) << l.weight;
    EXPECT_FALSE(at::equal(before, after)) << l.weight << " did not train";
  }
  // On held-out images the fine-tuned model is closer to the teacher than the pruned one.
  at::Tensor x =
      read_idx(std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz", 256).to(at::kFloat).div(255).unsqueeze(1);
  auto out = [&](const Graph& g) { return Executor(g, testing::shipped_registry()).run({{g.inputs[0].name, x}})[0]; };
  const at::Tensor t = out(teacher.graph);
  EXPECT_LT((out(student.graph) - t).pow(2).mean().item<double>(),
            (out(r.pruned.graph) - t).pow(2).mean().item<double>());
}

}  // namespace
}  // namespace sparsebit
