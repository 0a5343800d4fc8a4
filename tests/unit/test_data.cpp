// Calibration data: the three layouts, batching, and the errors for data that does not fit.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <fstream>

#include "sparsebit/core/data.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::TempDir;

std::vector<ValueInfo> image_input() {
  ValueInfo v;
  v.name = "image";
  v.elem_type = 1;
  v.has_shape = true;
  v.shape = {{-1, "batch"}, {1, ""}, {28, ""}, {28, ""}};
  return {v};
}

std::string expect_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

std::int64_t drain(Dataset& d, const std::vector<ValueInfo>& in, std::int64_t batch, std::int64_t limit,
                   std::vector<std::int64_t>* sizes = nullptr) {
  Batcher b(d, in, batch, limit);
  std::int64_t n = 0;
  while (auto x = b.next()) {
    n += x->inputs[0].size(0);
    if (sizes) sizes->push_back(x->inputs[0].size(0));
  }
  return n;
}

TEST(Data, NpyRoundTripAndSingleSamplesAndBatches) {
  testing::TempDir dir;
  at::Tensor batch = at::rand({5, 1, 28, 28});
  write_npy(batch, dir / "a_batch.npy");
  write_npy(at::rand({1, 28, 28}), dir / "b_sample.npy");
  EXPECT_TRUE(at::equal(read_npy(dir / "a_batch.npy"), batch));
  auto d = open_dataset(dir.path().string(), image_input());
  std::vector<std::int64_t> sizes;
  EXPECT_EQ(drain(*d, image_input(), 4, 0, &sizes), 6);
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{4, 2}));
}

// Note [Distributed runs]: batches sliced between processes or skipped. Records of 3 samples
// in batches of 8 (so batches span records and records span batches, some of them mapped):
// the slices of every process joined are the whole batch, a skipped batch is counted but
// neither joined nor checked, and a NaN is reported by the process whose slice holds it, with
// its index in its record.
TEST(Data, BatchesAreSlicedAndSkippedWithoutReadingOtherProcessesSamples) {
  testing::TempDir dir;
  at::manual_seed(8);
  std::vector<at::Tensor> records;
  for (int r = 0; r < 7; ++r) {
    records.push_back(at::rand({r == 3 ? 400 : 3, 1, 28, 28}));  // 400 samples: 1.2 MiB, mapped
    write_npy(records.back(), dir / ("r" + std::to_string(r) + ".npy"));
  }
  const at::Tensor all = at::cat(records, 0);
  for (int parts : {1, 2, 3}) {
    std::vector<std::unique_ptr<Dataset>> data;
    std::vector<std::unique_ptr<Batcher>> batchers;
    for (int p = 0; p < parts; ++p) {
      data.push_back(open_dataset(dir.path().string(), image_input()));
      batchers.push_back(std::make_unique<Batcher>(*data.back(), image_input(), 8, 0));
    }
    std::int64_t at_row = 0;
    int whole = 0;
    for (std::int64_t index = 0;; ++index) {
      std::vector<at::Tensor> slices;
      std::optional<Batch> b;
      for (int p = 0; p < parts; ++p) {
        b = batchers[static_cast<std::size_t>(p)]->next(BatchShare{p, parts, false});
        if (!b) break;
        if (b->rows < parts) {  // fewer samples than processes: whole to each
          EXPECT_FALSE(b->sliced);
          EXPECT_EQ(b->first, 0);
          EXPECT_EQ(b->held, b->rows);
          if (p == 0) slices.push_back(b->inputs[0]);
          ++whole;
          continue;
        }
        EXPECT_EQ(b->sliced, parts > 1);
        EXPECT_EQ(b->first, b->rows * p / parts);
        if (b->held > 0) slices.push_back(b->inputs[0]);
      }
      if (!b) break;
      EXPECT_TRUE(at::equal(at::cat(slices, 0), all.narrow(0, at_row, b->rows))) << "batch " << index;
      at_row += b->rows;
    }
    EXPECT_EQ(at_row, all.size(0));
    EXPECT_EQ(whole, parts == 3 ? 3 : 0);  // the last batch holds 418 % 8 = 2 samples
  }
  // Skipped: counted, nothing held. A NaN in sample 5 of record 3 is the second slice's.
  at::Tensor bad = records[3].clone();
  bad[5][0][1][1] = NAN;
  write_npy(bad, dir / "r3.npy");
  auto d = open_dataset(dir.path().string(), image_input());
  Batcher skipper(*d, image_input(), 8, 0);
  std::int64_t counted = 0;
  while (auto b = skipper.next(BatchShare{0, 1, true})) {
    EXPECT_TRUE(b->inputs.empty());
    counted += b->rows;
  }
  EXPECT_EQ(counted, all.size(0));
  auto d1 = open_dataset(dir.path().string(), image_input()), d2 = open_dataset(dir.path().string(), image_input());
  Batcher first_half(*d1, image_input(), 8, 0), second(*d2, image_input(), 8, 0);
  // Batch 1 holds samples 8..15: record 3's samples 0..6; its second half (12..15) holds sample 5.
  ASSERT_TRUE(first_half.next());
  ASSERT_TRUE(second.next());
  EXPECT_NO_THROW(first_half.next(BatchShare{0, 2, false}));
  const std::string e = expect_error([&] { second.next(BatchShare{1, 2, false}); });
  EXPECT_NE(e.find("r3.npy"), std::string::npos) << e;
  EXPECT_NE(e.find("first bad sample: 5"), std::string::npos) << e;
}

// Note [Data sources]: an application's opener is opened afresh by each step, under its name;
// sources are values, so two with one name never see each other's data, and a path source
// opens the files.
TEST(Data, DataSourcesOpenAfreshAndStayApart) {
  struct Counting final : Dataset {
    int left;
    explicit Counting(int n) : left(n) {}
    std::string describe() const override { return "counting"; }
    std::optional<std::int64_t> num_samples() const override { return std::nullopt; }
    std::optional<Batch> next() override {
      if (left-- <= 0) return std::nullopt;
      return Batch{{at::ones({1, 28, 28})}, "counting"};
    }
  };
  int opened = 0;
  const DataSource data("in memory", [&](const std::vector<ValueInfo>& in) {
    EXPECT_EQ(in.size(), 1u);
    ++opened;
    return std::make_unique<Counting>(3);
  });
  const DataSource twin("in memory", [](const std::vector<ValueInfo>&) { return std::make_unique<Counting>(1); });
  EXPECT_EQ(data.name(), "<in memory>");
  EXPECT_EQ(data.identity(), "<in memory>");
  EXPECT_EQ(data.path(), "");
  EXPECT_EQ(drain(*data.open(image_input()), image_input(), 2, 0), 3);
  EXPECT_EQ(drain(*data.open(image_input()), image_input(), 2, 0), 3);
  EXPECT_EQ(drain(*twin.open(image_input()), image_input(), 2, 0), 1);
  EXPECT_EQ(opened, 2);
  // A name that looks like one never reaches another source: it is a path.
  EXPECT_NE(expect_error([&] { DataSource("<in memory>").open(image_input()); }).find("no such file"),
            std::string::npos);
  EXPECT_NE(expect_error([&] { data.open({}); }).find("<in memory>"), std::string::npos);
  EXPECT_NE(expect_error([&] { DataSource().open(image_input()); }).find("no data given"), std::string::npos);

  testing::TempDir dir;
  write_npy(at::rand({2, 1, 28, 28}), dir / "a.npy");
  const DataSource files(dir.path().string());
  EXPECT_EQ(files.path(), dir.path().string());
  EXPECT_EQ(files.name(), dir.path().string());
  EXPECT_EQ(drain(*files.open(image_input()), image_input(), 4, 0), 2);
}

// A model exported with a fixed batch of one: a batch of 4 asked for becomes batches of one
// sample, also from a file that holds several.
TEST(Data, FixedBatchDimensionCapsTheBatchSize) {
  testing::TempDir dir;
  write_npy(at::rand({3, 1, 28, 28}), dir / "a.npy");
  write_npy(at::rand({1, 28, 28}), dir / "b.npy");
  std::vector<ValueInfo> in = image_input();
  in[0].shape[0] = {1, ""};
  auto d = open_dataset(dir.path().string(), in);
  std::vector<std::int64_t> sizes;
  EXPECT_EQ(drain(*d, in, 4, 0, &sizes), 4);
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{1, 1, 1, 1}));
}

// Writes an int64 or float tensor as an onnx.TensorProto file.
void write_pb(const at::Tensor& t, const fs::path& path) {
  onnx::TensorProto p;
  for (auto d : t.sizes()) p.add_dims(d);
  at::Tensor flat = t.reshape({-1}).contiguous();
  if (t.scalar_type() == at::kLong) {
    p.set_data_type(onnx::TensorProto::INT64);
    for (std::int64_t i = 0; i < flat.numel(); ++i) p.add_int64_data(flat[i].item<std::int64_t>());
  } else {
    p.set_data_type(onnx::TensorProto::FLOAT);
    for (std::int64_t i = 0; i < flat.numel(); ++i) p.add_float_data(flat[i].item<float>());
  }
  std::ofstream(path, std::ios::binary) << p.SerializeAsString();
}

// A model input declared 0-d (a voice-activity detector's sample rate): each record's value
// passes as it is, one sample per batch, whatever its position among the inputs.
TEST(Data, ScalarInputsPassAsTheyAreOneSamplePerBatch) {
  testing::TempDir dir;
  for (int i = 0; i < 3; ++i) {
    const fs::path set = dir / ("test_data_set_" + std::to_string(i));
    fs::create_directories(set);
    write_pb(at::full({}, 8000 * (i + 1), at::kLong), set / "input_0.pb");
    write_pb(at::full({1, 4}, static_cast<float>(i)), set / "input_1.pb");
  }
  std::vector<ValueInfo> in{{"sr", 7, true, {}, ""}, {"x", 1, true, {{-1, "n"}, {4, ""}}, ""}};
  auto d = open_dataset(dir.path().string(), in);
  Batcher b(*d, in, 32, 0);
  std::vector<std::int64_t> rates;
  while (auto x = b.next()) {
    EXPECT_EQ(x->inputs[0].dim(), 0);
    EXPECT_EQ(x->rows, 1);
    EXPECT_EQ(x->inputs[1].sizes(), (std::vector<std::int64_t>{1, 4}));
    rates.push_back(x->inputs[0].item<std::int64_t>());
  }
  EXPECT_EQ(rates, (std::vector<std::int64_t>{8000, 16000, 24000}));
  write_pb(at::full({2}, 1, at::kLong), dir.path() / "test_data_set_0" / "input_0.pb");
  auto bad = open_dataset(dir.path().string(), in);
  EXPECT_NE(expect_error([&] { Batcher(*bad, in, 4, 0).next(); }).find("the model input is a scalar (0-d)"),
            std::string::npos);
}

// A recurrent state [layers, batch, hidden] beside a batch-first input (a voice-activity
// detector's h and c): the batch is not dim 0 of every input, so each record is one batch, as it is.
TEST(Data, StateInputsBatchedAlongAnotherAxisTakeWholeRecords) {
  testing::TempDir dir;
  for (int i = 0; i < 3; ++i) {
    const fs::path set = dir / ("test_data_set_" + std::to_string(i));
    fs::create_directories(set);
    write_pb(at::full({3, 16}, static_cast<float>(i)), set / "input_0.pb");
    write_pb(at::full({2, 3, 8}, static_cast<float>(-i)), set / "input_1.pb");
  }
  std::vector<ValueInfo> in{{"x", 1, true, {{-1, "batch"}, {-1, "samples"}}, ""},
                            {"h", 1, true, {{2, ""}, {-1, "batch"}, {8, ""}}, ""}};
  auto d = open_dataset(dir.path().string(), in);
  Batcher b(*d, in, 32, 0);
  int records = 0;
  while (auto x = b.next()) {
    EXPECT_EQ(x->rows, 3);
    EXPECT_EQ(x->inputs[0].sizes(), (std::vector<std::int64_t>{3, 16}));
    EXPECT_EQ(x->inputs[1].sizes(), (std::vector<std::int64_t>{2, 3, 8}));
    EXPECT_EQ(x->inputs[1][0][0][0].item<float>(), -static_cast<float>(records));
    ++records;
  }
  EXPECT_EQ(records, 3);
  EXPECT_EQ(b.samples_delivered(), 9);
}

// Text lines of different widths, one per file, for a model with a symbolic width: a batch
// holds samples of one width only, and every sample is delivered once, in order.
TEST(Data, SamplesOfDifferentSizesNeverShareABatch) {
  testing::TempDir dir;
  const std::vector<std::int64_t> widths = {12, 12, 20, 20, 20, 12, 16};
  for (std::size_t i = 0; i < widths.size(); ++i)
    write_npy(at::full({1, 8, widths[i]}, static_cast<float>(i)), dir / ("line" + std::to_string(i) + ".npy"));
  ValueInfo v{"x", 1, true, {{-1, "batch"}, {1, ""}, {8, ""}, {-1, "width"}}, ""};
  auto d = open_dataset(dir.path().string(), {v});
  Batcher b(*d, {v}, 2, 0);
  std::vector<std::pair<std::int64_t, std::int64_t>> batches;  // (samples, width)
  std::vector<float> order;
  while (auto x = b.next()) {
    const at::Tensor& t = x->inputs[0];
    batches.emplace_back(t.size(0), t.size(3));
    for (std::int64_t k = 0; k < t.size(0); ++k) order.push_back(t[k][0][0][0].item<float>());
  }
  EXPECT_EQ(batches, (std::vector<std::pair<std::int64_t, std::int64_t>>{{2, 12}, {2, 20}, {1, 20}, {1, 12}, {1, 16}}));
  EXPECT_EQ(order, (std::vector<float>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(Data, IdxFileStreamsAndIsScaledToUnitRange) {
  const std::string images = std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz";
  auto d = open_dataset(images, image_input());
  Batcher b(*d, image_input(), 64, 100);
  auto first = b.next();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->inputs[0].sizes(), (std::vector<std::int64_t>{64, 1, 28, 28}));
  EXPECT_GE(first->inputs[0].min().item<float>(), 0.0f);
  EXPECT_LE(first->inputs[0].max().item<float>(), 1.0f);
  at::Tensor raw = read_idx(images, 1);
  EXPECT_TRUE(at::allclose(first->inputs[0][0].reshape({28, 28}), raw[0].to(at::kFloat) / 255));
  EXPECT_EQ(b.next()->inputs[0].size(0), 36);  // limit 100
  EXPECT_FALSE(b.next());
}

TEST(Data, OnnxTestLayoutFeedsInputsByName) {
  testing::TempDir dir;
  ValueInfo a{"a", 1, true, {{-1, ""}, {3, ""}}, ""}, b{"b", 7, true, {{-1, ""}}, ""};
  for (int set = 0; set < 2; ++set) {
    auto sd = dir.path() / ("test_data_set_" + std::to_string(set));
    fs::create_directories(sd);
    // input_0.pb is named "b": it must reach input b whatever its position.
    onnx::TensorProto p;
    p.set_name("b");
    p.add_dims(2);
    p.set_data_type(7);
    p.add_int64_data(set);
    p.add_int64_data(10 + set);
    std::ofstream(sd / "input_0.pb", std::ios::binary) << p.SerializeAsString();
    onnx::TensorProto q;
    q.set_name("a");
    q.add_dims(2);
    q.add_dims(3);
    q.set_data_type(1);
    for (int i = 0; i < 6; ++i) q.add_float_data(float(i));
    std::ofstream(sd / "input_1.pb", std::ios::binary) << q.SerializeAsString();
  }
  auto d = open_dataset(dir.path().string(), {a, b});
  Batcher batcher(*d, {a, b}, 10, 0);
  auto x = batcher.next();
  ASSERT_TRUE(x);
  EXPECT_EQ(x->inputs[0].sizes(), (std::vector<std::int64_t>{4, 3}));
  EXPECT_EQ(x->inputs[1][3].item<std::int64_t>(), 11);
}

TEST(Data, MismatchedShapeTypeEmptyAndNanAreClearErrors) {
  testing::TempDir dir;
  write_npy(at::rand({2, 1, 32, 32}), dir / "wrong_shape.npy");
  std::string e =
      expect_error([&] { drain(*open_dataset(dir / "wrong_shape.npy", image_input()), image_input(), 8, 0); });
  EXPECT_NE(e.find("wrong_shape.npy"), std::string::npos) << e;
  EXPECT_NE(e.find("needs 28"), std::string::npos) << e;

  write_npy(at::rand({2, 1, 28, 28}).to(at::kDouble), dir / "double.npy");
  e = expect_error([&] { drain(*open_dataset(dir / "double.npy", image_input()), image_input(), 8, 0); });
  EXPECT_NE(e.find("data is double, the model input is float"), std::string::npos) << e;

  at::Tensor bad = at::rand({3, 1, 28, 28});
  bad[2][0][5][5] = NAN;
  write_npy(bad, dir / "nan.npy");
  e = expect_error([&] { drain(*open_dataset(dir / "nan.npy", image_input()), image_input(), 8, 0); });
  EXPECT_NE(e.find("NaN or Inf"), std::string::npos) << e;
  EXPECT_NE(e.find("first bad sample: 2"), std::string::npos) << e;

  testing::TempDir empty;
  e = expect_error([&] { open_dataset(empty.path().string(), image_input()); });
  EXPECT_NE(e.find("is empty"), std::string::npos) << e;

  testing::write_text(dir / "notes.txt", "hello");
  e = expect_error([&] { open_dataset(dir / "notes.txt", image_input()); });
  EXPECT_NE(e.find("not a calibration format"), std::string::npos) << e;
}

// A record of no samples among others is skipped (and named in a warning), not joined.
TEST(Data, RecordsOfNoSamplesAreSkipped) {
  TempDir dir;
  write_npy(at::rand({0, 1, 28, 28}), dir / "a_empty.npy");
  write_npy(at::rand({3, 1, 28, 28}), dir / "b.npy");
  write_npy(at::rand({0, 1, 28, 28}), dir / "c_empty.npy");
  auto data = open_dataset(dir.path().string(), image_input());
  std::vector<std::int64_t> sizes;
  EXPECT_EQ(drain(*data, image_input(), 8, 0, &sizes), 3);
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{3}));
}

// Note [Image data]: what the reader refuses, before any pixel is allocated, and the config's words.
TEST(Data, ImagesNeedADataTableAndHugeOrBrokenOnesAreRefusedByName) {
  TempDir dir;
  // A PNG header declaring 16 million x 16 million pixels, in 33 bytes.
  std::string png("\x89PNG\r\n\x1a\n", 8);
  png += std::string("\0\0\0\x0dIHDR", 8) + std::string("\x00\xff\xff\xff\x00\xff\xff\xff\x08\x02\x00\x00\x00", 13);
  png += std::string("\0\0\0\0", 4);
  std::ofstream(dir / "huge.png", std::ios::binary) << png;
  std::ofstream(dir / "text.jpg", std::ios::binary) << "just words";
  ValueInfo rgb = image_input()[0];
  rgb.shape[1] = {3, ""};
  const std::string missing = error_of([&] { open_dataset(dir.path().string(), {rgb}); });
  EXPECT_NE(missing.find("no [data] table"), std::string::npos) << missing;
  EXPECT_NE(missing.find("preset = \"imagenet\""), std::string::npos) << missing;
  const Config c = Config::from_string("[data]\npreset = \"imagenet\"\n", "data.toml");
  for (const char* name : {"huge.png", "text.jpg"}) {
    const std::string e = error_of([&] { read_image(dir / name, *c.data, image_input(*c.data, rgb)); });
    EXPECT_NE(e.find(name), std::string::npos) << e;
  }
  const std::string gray = error_of([&] { image_input(*c.data, image_input()[0]); });
  EXPECT_NE(gray.find("channels = \"GRAY\""), std::string::npos) << gray;
  const Config skip = Config::from_string("[data]\npreset = \"imagenet\"\nundecodable = \"skip\"\n", "data.toml");
  auto data = open_dataset(dir.path().string(), {rgb}, &*skip.data);
  const std::string none = error_of([&] { drain(*data, {rgb}, 4, 0); });
  EXPECT_NE(none.find("none of its 2 image(s) could be decoded"), std::string::npos) << none;
}

TEST(Data, DataTableKeysAreCheckedAndPresetsFillTheRest) {
  const Config rec = Config::from_string("[data]\npreset = \"paddleocr_rec\"\nresize = [32, 100]\n", "d.toml");
  EXPECT_EQ(rec.data->fit, "height");
  EXPECT_EQ(rec.data->resize, (std::vector<std::int64_t>{32, 100}));
  EXPECT_EQ(rec.data->channels, "BGR");
  const Config own = Config::from_string("[data]\nresize = 96\ncenter_crop = 80\n", "d.toml");
  EXPECT_EQ(own.data->fit, "shorter");
  EXPECT_EQ(own.data->center_crop, (std::vector<std::int64_t>{80, 80}));
  const std::pair<const char*, const char*> bad[] = {
      {"[data]\nmean = [0.1, 0.2]\n", "mean has 2 values for 3 channel(s)"},
      {"[data]\nstd = 0\n", "std must not hold 0"},
      {"[data]\nfit = \"exact\"\n", "needs resize"},
      {"[data]\nfit = \"longer\"\nresize = [3, 4]\n", "is one side (N)"},
      {"[data]\nresize = 0\n", "sizes 1 to 65536"},
      {"[data]\nchannels = \"RGBA\"\n", "must be one of RGB, BGR, GRAY"},
      {"[data]\nlayuot = \"NHWC\"\n", "did you mean 'layout'"},
      {"[data]\nscale = 0\n", "scale must not be 0"}};
  for (const auto& entry : bad) {
    const std::string e = error_of([&] { Config::from_string(entry.first, "d.toml"); });
    EXPECT_NE(e.find(entry.second), std::string::npos) << entry.first << " -> " << e;
  }
}

}  // namespace
}  // namespace sparsebit
