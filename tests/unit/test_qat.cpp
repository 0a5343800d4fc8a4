// Quantization-aware training: gradients reach every trainable tensor, one optimiser step lowers
// the distillation loss, training changes the exported model, an interrupted run resumes from
// its checkpoint to exactly the uninterrupted result, and the loss functions against hand values.

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/optim/adam.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cmath>
#include <set>
#include <sstream>

#include "sparsebit/core/fused_adam.h"
#include "sparsebit/core/qat.h"
#include "sparsebit/core/quant_model.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

const std::string kImages = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";

Config w4a4_lsq(int train_count) {
  Config c = Config::from_file(testing::source_path("configs/w4a4_lsq.toml"));
  c.calibration.count = 128;
  c.qat.count = train_count;
  c.qat.batch_size = 32;
  c.plugins.use_environment = false;
  return c;
}

struct QatSetup {
  Model float_model = load_onnx(testing::fixture_model());
  Executor teacher{float_model.graph, testing::shipped_registry()};
  QuantModel student;
  explicit QatSetup(const Config& c) : student(load_onnx(testing::fixture_model()), c, testing::shipped_registry()) {
    auto calib = open_dataset(kImages, student.graph().inputs);
    student.init_qat(*calib);
  }
  std::function<std::unique_ptr<Dataset>()> train_data() const {
    return [this] { return open_dataset(kImages, student.graph().inputs); };
  }
};

at::Tensor images(std::int64_t n) { return read_idx(kImages, n).to(at::kFloat).div(255).unsqueeze(1); }

TEST(Qat, OneStepLowersTheLossAndEveryParameterGetsAGradient) {
  const Config c = w4a4_lsq(64);
  QatSetup s(c);
  const auto named = s.student.named_parameters();
  std::size_t weights = 0, quantizer_params = 0;
  for (const auto& [name, t] : named) {
    EXPECT_TRUE(t.requires_grad()) << name;
    (name.rfind("weight ", 0) == 0 ? weights : quantizer_params)++;
  }
  EXPECT_EQ(weights, 14u);           // 7 weighted layers: weight and bias each
  EXPECT_GE(quantizer_params, 14u);  // an LSQ scale per quantized weight and activation
  const at::Tensor x = images(64);
  std::map<std::string, at::Tensor> feeds{{s.student.graph().inputs[0].name, x}};
  const auto target = [&] {
    c10::NoGradGuard g;
    return s.teacher.run(feeds);
  }();
  torch::optim::Adam adam(s.student.parameters(), torch::optim::AdamOptions(c.qat.lr));
  at::Tensor loss0 = distillation_loss(s.student.forward({x}), target, "mse", 1);
  adam.zero_grad();
  loss0.backward();
  for (const auto& [name, t] : named) {
    ASSERT_TRUE(t.grad().defined()) << name;
    EXPECT_GT(t.grad().abs().sum().item<double>(), 0) << name;
  }
  adam.step();
  const double loss1 = distillation_loss(s.student.forward({x}), target, "mse", 1).item<double>();
  std::printf("distillation loss %.5f -> %.5f after one Adam step (lr %g)\n", loss0.item<double>(), loss1, c.qat.lr);
  EXPECT_LT(loss1, loss0.item<double>());
}

TEST(Qat, DistillationLossesMatchTheirDefinitions) {
  const at::Tensor s = at::tensor({1.0f, 2.0f, 0.5f, 0.0f, -1.0f, 1.0f}).reshape({2, 3});
  const at::Tensor t = at::tensor({1.5f, 2.0f, 0.0f, 0.0f, 0.0f, 1.0f}).reshape({2, 3});
  EXPECT_NEAR(distillation_loss({s}, {t}, "mse", 1).item<double>(), (0.25 + 0.25 + 1.0) / 6, 1e-7);
  // KL(q || p) per row with p = softmax(s / T), q = softmax(t / T), batch mean, times T^2.
  const double T = 2;
  double kl = 0;
  for (int r = 0; r < 2; ++r) {
    double zs = 0, zt = 0;
    for (int c = 0; c < 3; ++c) {
      zs += std::exp(s[r][c].item<double>() / T);
      zt += std::exp(t[r][c].item<double>() / T);
    }
    for (int c = 0; c < 3; ++c) {
      const double p = std::exp(s[r][c].item<double>() / T) / zs, q = std::exp(t[r][c].item<double>() / T) / zt;
      kl += q * std::log(q / p);
    }
  }
  EXPECT_NEAR(distillation_loss({s}, {t}, "kl", T).item<double>(), kl / 2 * T * T, 1e-6);
  EXPECT_NE(testing::error_of([&] { distillation_loss({s}, {t.narrow(1, 0, 2)}, "mse", 1); }).find("shape"),
            std::string::npos);
}

TEST(Qat, ResumingFromACheckpointEndsWhereAnUninterruptedRunEnds) {
  testing::TempDir dir;
  const Config c = w4a4_lsq(96);
  auto run = [&](int epochs, const std::string& checkpoint) {
    Config ce = c;
    ce.qat.epochs = epochs;
    auto s = std::make_unique<QatSetup>(ce);
    QatResult r = distill(s->student, s->teacher, s->train_data(), {ce.qat, checkpoint, "fingerprint"});
    return std::make_pair(std::move(s), r);
  };
  auto [straight, r_straight] = run(2, dir / "a.ckpt");
  EXPECT_EQ(r_straight.resumed_after, 0);
  ASSERT_EQ(r_straight.epochs.size(), 2u);
  EXPECT_EQ(r_straight.epochs[1].samples, 96);
  auto [first, r_first] = run(1, dir / "b.ckpt");  // "interrupted" after one epoch
  auto [resumed, r_resumed] = run(2, dir / "b.ckpt");
  EXPECT_EQ(r_resumed.resumed_after, 1);
  ASSERT_EQ(r_resumed.epochs.size(), 1u);
  EXPECT_EQ(r_resumed.epochs[0].loss, r_straight.epochs[1].loss);
  const auto a = straight->student.named_parameters(), b = resumed->student.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
  EXPECT_EQ(straight->student.serialize(), resumed->student.serialize());
  // Training changed what export writes.
  QatSetup untrained(c);
  EXPECT_NE(untrained.student.serialize(), straight->student.serialize());
  // Another run's checkpoint is refused, naming the way out.
  QatSetup other(c);
  const std::string msg = testing::error_of([&] {
    distill(other.student, other.teacher, other.train_data(), {c.qat, dir / "b.ckpt", "another run"});
  });
  EXPECT_NE(msg.find("--restart"), std::string::npos) << msg;
  // A byte of a saved weight changed after writing: refused, not resumed into a wrong model.
  std::string bytes = testing::read_text(dir / "b.ckpt");
  const at::Tensor w = b[0].second.detach().contiguous();
  const std::string raw(static_cast<const char*>(w.data_ptr()), std::min<std::size_t>(16, w.nbytes()));
  const std::size_t at = bytes.find(raw);
  ASSERT_NE(at, std::string::npos) << "the weight's bytes are not stored as they are";
  bytes[at + 3] = static_cast<char>(bytes[at + 3] ^ 0x40);
  testing::write_text(dir / "c.ckpt", bytes);
  QatSetup again(c);
  const std::string changed = testing::error_of([&] {
    distill(again.student, again.teacher, again.train_data(), {c.qat, dir / "c.ckpt", "fingerprint"});
  });
  EXPECT_NE(changed.find("contents changed since it was written"), std::string::npos) << changed;
  // A checkpoint that is a FIFO is refused, not waited on.
  ASSERT_EQ(::mkfifo((dir / "fifo.ckpt").c_str(), 0600), 0);
  const std::string fifo = testing::error_of([&] {
    distill(again.student, again.teacher, again.train_data(), {c.qat, dir / "fifo.ckpt", "fingerprint"});
  });
  EXPECT_NE(fifo.find("not a file"), std::string::npos) << fifo;
}

// Fresh leaf tensors with the values of `start`, for optimizers compared side by side.
std::vector<at::Tensor> trainable_copies(const std::vector<at::Tensor>& start) {
  std::vector<at::Tensor> p;
  for (const auto& t : start) p.push_back(t.clone().set_requires_grad(true));
  return p;
}

// Note [Fused Adam]: the same parameters and state as torch::optim::Adam to the bit, with weight
// decay, a tensor that misses a step (its own step count) and a saved state loaded into Adam.
TEST(Qat, FusedAdamStepsExactlyAsAdam) {
  for (double decay : {0.0, 0.01}) {
    at::manual_seed(4);
    const std::vector<at::Tensor> start{at::randn({7, 3}), at::randn({5}), at::randn({2, 2, 3})};
    auto make = [&] { return trainable_copies(start); };
    auto a = make(), b = make();
    const auto options = torch::optim::AdamOptions(1e-2).weight_decay(decay);
    torch::optim::Adam plain(a, options);
    FusedAdam fused(b, options);
    for (int step = 0; step < 6; ++step) {
      at::manual_seed(100 + step);
      std::vector<at::Tensor> g{at::randn({7, 3}), at::randn({5}), at::randn({2, 2, 3})};
      plain.zero_grad();
      fused.zero_grad();
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (i == 1 && step == 2) {  // no gradient this step
          a[i].mutable_grad() = at::Tensor();
          b[i].mutable_grad() = at::Tensor();
          continue;
        }
        a[i].mutable_grad() = g[i].clone();
        b[i].mutable_grad() = g[i].clone();
      }
      plain.step();
      fused.step();
      for (std::size_t i = 0; i < a.size(); ++i)
        ASSERT_TRUE(at::equal(a[i], b[i])) << "decay " << decay << ", step " << step << ", tensor " << i;
    }
    // Its state is Adam's: saved by one, loaded by the other, the next steps agree.
    torch::serialize::OutputArchive saved;
    fused.save(saved);
    std::ostringstream bytes;
    saved.save_to(bytes);
    std::istringstream in(bytes.str());
    torch::serialize::InputArchive loaded;
    loaded.load_from(in);
    auto c = make();
    for (std::size_t i = 0; i < c.size(); ++i) c[i].detach().copy_(b[i].detach());
    torch::optim::Adam restored(c, options);
    restored.load(loaded);
    for (std::size_t i = 0; i < c.size(); ++i) {
      b[i].mutable_grad() = at::ones_like(b[i]);
      c[i].mutable_grad() = at::ones_like(c[i]);
    }
    fused.step();
    restored.step();
    for (std::size_t i = 0; i < c.size(); ++i) EXPECT_TRUE(at::equal(b[i], c[i])) << "restored tensor " << i;
  }
}

// Counting steps on the device (what a CUDA graph records) keeps Adam's arithmetic: after a
// host-counted start, six more steps agree with torch::optim::Adam to rounding, and the count
// written back is what Adam's state holds.
TEST(Qat, FusedAdamCountingStepsOnTheDeviceStaysAdam) {
  for (double decay : {0.0, 0.01}) {
    at::manual_seed(5);
    const std::vector<at::Tensor> start{at::randn({7, 3}), at::randn({5}), at::randn({2, 2, 3})};
    auto make = [&] { return trainable_copies(start); };
    auto a = make(), b = make();
    const auto options = torch::optim::AdamOptions(1e-2).weight_decay(decay);
    torch::optim::Adam plain(a, options);
    FusedAdam fused(b, options);
    for (int step = 0; step < 8; ++step) {
      if (step == 2) ASSERT_TRUE(fused.count_steps_on_device());
      at::manual_seed(200 + step);
      for (std::size_t i = 0; i < a.size(); ++i) {
        const at::Tensor g = at::randn(a[i].sizes());
        a[i].mutable_grad() = g.clone();
        b[i].mutable_grad() = g.clone();
      }
      plain.step();
      fused.step();
      for (std::size_t i = 0; i < a.size(); ++i) {
        const double diff = (a[i] - b[i]).abs().max().item<double>();
        ASSERT_LE(diff, 1e-6) << "decay " << decay << ", step " << step << ", tensor " << i;
        if (step < 2) ASSERT_TRUE(at::equal(a[i], b[i]));
      }
    }
    EXPECT_TRUE(fused.counts_steps_on_device());
    fused.sync_steps();
    ASSERT_EQ(fused.state().size(), b.size());
    for (const auto& [key, st] : fused.state()) EXPECT_EQ(static_cast<torch::optim::AdamParamState&>(*st).step(), 8);
  }
  // Parameters at different steps cannot share a count: the host keeps counting.
  std::vector<at::Tensor> p{at::zeros({2}).set_requires_grad(true), at::zeros({3}).set_requires_grad(true)};
  FusedAdam adam(p, torch::optim::AdamOptions(1e-3));
  p[0].mutable_grad() = at::ones({2});
  adam.step();
  EXPECT_FALSE(adam.count_steps_on_device());
  EXPECT_FALSE(adam.counts_steps_on_device());
}

// [qat] cache_teacher: the teacher runs in epoch 1 only and the losses are bit for bit those of
// a run that asks it every epoch; data that change between epochs are an error naming the key.
TEST(Qat, CachedTeacherOutputsGiveTheSameLossesAndNoticeChangingData) {
  Config c = w4a4_lsq(96);
  c.qat.epochs = 3;
  auto losses = [&](bool cache) {
    Config cc = c;
    cc.qat.cache_teacher = cache;
    QatSetup s(cc);
    std::vector<double> out;
    for (const auto& e : distill(s.student, s.teacher, s.train_data(), {cc.qat, "", ""}).epochs) out.push_back(e.loss);
    return out;
  };
  const auto plain = losses(false), cached = losses(true);
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(plain, cached);
  EXPECT_GT(plain[0], plain[2]);

  Config cc = c;
  cc.qat.cache_teacher = true;
  QatSetup s(cc);
  int opened = 0;
  auto changing = [&]() -> std::unique_ptr<Dataset> {
    // Epoch 2 reads other images: the first 96 of them shifted by one sample.
    auto data = open_dataset(kImages, s.student.graph().inputs);
    if (++opened == 2) (void)data->next();
    return data;
  };
  const std::string msg = testing::error_of([&] { distill(s.student, s.teacher, changing, {cc.qat, "", ""}); });
  EXPECT_NE(msg.find("cache_teacher"), std::string::npos) << msg;
  EXPECT_NE(msg.find("epoch 2"), std::string::npos) << msg;
}

// x -> Conv -> BatchNormalization -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> y, with
// BatchNormalization kept (fuse_bn = false): its scale and bias train, train() uses batch
// statistics and updates the running ones as PyTorch does, and export folds it into the conv.
TEST(Qat, BatchNormTrainsUpdatesItsStatisticsAndFoldsAtExport) {
  at::manual_seed(31);
  testing::Builder b({8, 3, 8, 8});
  b.constant("w", at::randn({6, 3, 3, 3}) * 0.3);
  b.constant("cb", at::randn({6}) * 0.1);
  b.constant("gamma", at::rand({6}) + 0.5);
  b.constant("beta", at::randn({6}) * 0.1);
  b.constant("mean", at::randn({6}) * 0.1);
  b.constant("var", at::rand({6}) + 0.5);
  b.constant("w2", at::randn({4, 6}) * 0.5);
  b.constant("b2", at::zeros({4}));
  b.add("conv", "Conv", {"x", "w", "cb"}, {"c"}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
  b.add("bn", "BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"n"},
        {{"momentum", Attribute::of_float(0.9)}});
  b.add("relu", "Relu", {"n"}, {"r"});
  b.add("gap", "GlobalAveragePool", {"r"}, {"p"});
  b.add("flatten", "Flatten", {"p"}, {"f"});
  b.add("fc", "Gemm", {"f", "w2", "b2"}, {"y"}, {{"transB", Attribute::of_int(1)}});
  const Config c = Config::from_string(
      "backend = \"virtual\"\n[w]\nqscheme = \"per-channel-symmetric\"\nbits = 4\nquantizer = \"lsq\"\n"
      "[a]\nqscheme = \"per-tensor-affine\"\nquantizer = \"lsq\"\n[schedule]\nfuse_bn = "
      "false\n[calibration]\nbatch_size = 8\n",
      "bn.toml");
  QuantModel qm(Model{b.g.clone(), ModelMeta{}}, c, testing::shipped_registry());
  testing::TempDir dir;
  write_npy(at::rand({16, 3, 8, 8}), dir / "calib.npy");
  auto calib = open_dataset(dir / "calib.npy", qm.graph().inputs);
  qm.init_qat(*calib);
  EXPECT_TRUE(qm.training());
  std::set<std::string> names;
  for (const auto& [name, t] : qm.named_parameters()) names.insert(name);
  EXPECT_TRUE(names.count("weight gamma") && names.count("weight beta")) << "BN scale and bias train";
  auto states = qm.named_states();
  ASSERT_EQ(states.size(), 2u);
  const at::Tensor mean0 = states[0].second.detach().clone(), var0 = states[1].second.detach().clone();

  // Training mode: normalize with the batch's statistics, update the running ones.
  const at::Tensor x = at::randn({8, 3, 8, 8}) + 0.5;
  at::Tensor seen;
  qm.forward({x}, [&](const std::string& name, const at::Tensor& v) {
    if (name == "c") seen = v.detach().clone();
  });
  ASSERT_TRUE(seen.defined());
  const at::Tensor bmean = seen.mean({0, 2, 3}), bvar = seen.var({0, 2, 3}, /*unbiased=*/true);
  EXPECT_TRUE(at::allclose(states[0].second, 0.9 * mean0 + 0.1 * bmean, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(states[1].second, 0.9 * var0 + 0.1 * bvar, 1e-5, 1e-6));

  // One step moves BN's scale; eval() then uses the running statistics and leaves them alone.
  torch::optim::Adam adam(qm.parameters(), torch::optim::AdamOptions(1e-2));
  const at::Tensor gamma0 = qm.executor().constants().at("gamma").detach().clone();
  qm.forward({x})[0].pow(2).sum().backward();
  adam.step();
  EXPECT_FALSE(at::equal(qm.executor().constants().at("gamma"), gamma0));
  qm.eval();
  const at::Tensor mean1 = states[0].second.detach().clone();
  const at::Tensor simulated = qm.forward({x})[0].detach();
  EXPECT_TRUE(at::equal(states[0].second, mean1));

  // Export folds BN into the conv's weight scales and bias; the result computes the simulation.
  Graph g = qm.export_graph();
  for (const Node* n : g.nodes()) EXPECT_NE(n->op_type, "BatchNormalization");
  Executor exported(g, testing::shipped_registry());
  const at::Tensor deployed = exported.run({{"x", x}})[0];
  // Equal in exact arithmetic (same integers, scales times k); float rounding aside. The step's
  // learning rate drives some LSQ scales below the minimum: simulation clamps them as export does.
  EXPECT_TRUE(at::allclose(deployed, simulated, 1e-5, 1e-6)) << (deployed - simulated).abs().max().item<double>();
}

// The same fold after a Gemm (alpha and beta set): k goes into B's per-channel scales, the
// shift into C divided by beta; the export computes the simulation, and with a per-tensor weight
// (no scale per channel to take k) the BatchNormalization stays.
TEST(Qat, BatchNormAfterAGemmFoldsAtExportToo) {
  at::manual_seed(37);
  for (const char* qscheme : {"per-channel-symmetric", "per-tensor-symmetric"}) {
    testing::Builder b({8, 5});
    b.constant("w", at::randn({6, 5}) * 0.5);
    b.constant("c", at::randn({6}) * 0.1);
    b.constant("gamma", at::rand({6}) + 0.5);
    b.constant("beta", at::randn({6}) * 0.1);
    b.constant("mean", at::randn({6}) * 0.1);
    b.constant("var", at::rand({6}) + 0.5);
    b.add("fc", "Gemm", {"x", "w", "c"}, {"h"},
          {{"transB", Attribute::of_int(1)}, {"alpha", Attribute::of_float(2.0)}, {"beta", Attribute::of_float(0.5)}});
    b.add("bn", "BatchNormalization", {"h", "gamma", "beta", "mean", "var"}, {"y"});
    const Config c = Config::from_string(std::string("backend = \"virtual\"\n[w]\nqscheme = \"") + qscheme +
                                             "\"\n[a]\nqscheme = \"per-tensor-affine\"\n[schedule]\nfuse_bn = "
                                             "false\n[calibration]\nbatch_size = 8\n",
                                         "bn.toml");
    QuantModel qm(Model{b.g.clone(), ModelMeta{}}, c, testing::shipped_registry());
    testing::TempDir dir;
    write_npy(at::randn({16, 5}), dir / "calib.npy");
    auto calib = open_dataset(dir / "calib.npy", qm.graph().inputs);
    qm.calibrate(*calib);
    qm.set_quant(true, true);
    const at::Tensor x = at::randn({8, 5});
    const at::Tensor simulated = qm.forward({x})[0].detach();
    Graph g = qm.export_graph();
    std::size_t batchnorms = 0;
    for (const Node* n : g.nodes()) batchnorms += n->op_type == "BatchNormalization";
    EXPECT_EQ(batchnorms, std::string(qscheme) == "per-channel-symmetric" ? 0u : 1u) << qscheme;
    const at::Tensor deployed = Executor(g, testing::shipped_registry()).run({{"x", x}})[0];
    EXPECT_TRUE(at::allclose(deployed, simulated, 1e-5, 1e-5))
        << qscheme << ": " << (deployed - simulated).abs().max().item<double>();
  }
}

}  // namespace
}  // namespace sparsebit
