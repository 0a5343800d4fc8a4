// Untrusted files: crafted models and data files that lie about their sizes or point outside
// their folder must be refused with a message naming the tensor or file, before any large
// allocation. Also replays every fuzzer finding kept under tests/fuzz/regressions/.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>

#include "sparsebit/core/config.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

namespace fs = std::filesystem;

using testing::error_of;

/// y = x + w, with w an external-data initializer described by `external`.
onnx::ModelProto model_with_external(const std::vector<std::pair<std::string, std::string>>& external,
                                     std::vector<std::int64_t> dims = {4}) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  auto* x = g->add_input();
  x->set_name("x");
  x->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  g->add_output()->set_name("y");
  g->mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  for (auto d : dims) w->add_dims(d);
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  for (const auto& [k, v] : external) {
    auto* e = w->add_external_data();
    e->set_key(k);
    e->set_value(v);
  }
  auto* n = g->add_node();
  n->set_op_type("Add");
  n->add_input("x");
  n->add_input("w");
  n->add_output("y");
  return m;
}

std::string save(const onnx::ModelProto& m, const std::string& path) {
  std::ofstream(path, std::ios::binary) << m.SerializeAsString();
  return path;
}

class Untrusted : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(work_ / "model");
    const float values[4] = {1, 2, 3, 4};
    std::ofstream(work_ / "model/weights.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(values), sizeof values);
    std::ofstream(work_ / "secret.bin", std::ios::binary).write(reinterpret_cast<const char*>(values), sizeof values);
  }
  testing::TempDir work_;
};

TEST_F(Untrusted, ExternalDataLoadsAndIsConfinedToTheModelFolder) {
  Model ok = load_onnx(save(model_with_external({{"location", "weights.bin"}}), work_ / "model/ok.onnx"));
  EXPECT_TRUE(at::equal(ok.graph.initializers.at("w"), at::tensor({1.f, 2.f, 3.f, 4.f})));

  for (const std::string& location :
       {work_ / "secret.bin", std::string("../secret.bin"), std::string("sub/../../secret.bin")}) {
    auto msg = error_of([&] {
      load_onnx(save(model_with_external({{"location", location}}), work_ / "model/bad.onnx"));
    });
    EXPECT_NE(msg.find("initializer 'w'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("inside the model's folder"), std::string::npos) << msg;
  }
  fs::create_symlink(work_ / "secret.bin", work_ / "model/link.bin");
  auto msg = error_of([&] {
    load_onnx(save(model_with_external({{"location", "link.bin"}}), work_ / "model/bad.onnx"));
  });
  EXPECT_NE(msg.find("outside the model's folder"), std::string::npos) << msg;
}

TEST_F(Untrusted, ExternalDataSizesOffsetsAndChecksumsAreChecked) {
  auto load = [&](std::vector<std::pair<std::string, std::string>> ext, std::vector<std::int64_t> dims = {4}) {
    return error_of([&] { load_onnx(save(model_with_external(ext, dims), work_ / "model/bad.onnx")); });
  };
  EXPECT_NE(load({{"location", "weights.bin"}, {"offset", "8"}}).find("shorter than offset 8"), std::string::npos);
  EXPECT_NE(load({{"location", "weights.bin"}, {"length", "-5"}}).find("not a non-negative integer"),
            std::string::npos);
  EXPECT_NE(load({{"location", "weights.bin"}, {"offset", "12abc"}}).find("not a non-negative integer"),
            std::string::npos);
  EXPECT_NE(load({{"location", "weights.bin"}, {"offset", "9223372036854775807"}}).find("beyond any file"),
            std::string::npos);
  fs::create_directories(work_ / "model/folder.bin");
  EXPECT_NE(load({{"location", "folder.bin"}}).find("is a folder, not a file"), std::string::npos);
  ASSERT_EQ(::mkfifo((work_ / "model/pipe.bin").c_str(), 0600), 0);
  EXPECT_NE(load({{"location", "pipe.bin"}}).find("a device, pipe or socket"), std::string::npos);
  EXPECT_NE(load({{"location", "missing.bin"}}).find("does not exist"), std::string::npos);
  EXPECT_NE(load({{"location", "weights.bin"}, {"length", "8"}}).find("does not match its shape"), std::string::npos);
  EXPECT_NE(load({{"location", "weights.bin"}}, {1 << 20, 1 << 20, 1 << 10}).find("more than this machine's memory"),
            std::string::npos);
  EXPECT_NE(load({{"location", "weights.bin"}}, {INT64_MAX, 4}).find("overflows"), std::string::npos);
  EXPECT_NE(load({{"location", "weights.bin"}, {"checksum", std::string(40, '0')}}).find("SHA-1"), std::string::npos);
  // The right checksum (sha1 of the whole file, as the ONNX spec defines it) loads.
  Model ok = load_onnx(
      save(model_with_external({{"location", "weights.bin"}, {"checksum", "c26df9440df999ae7d765499acd5ca855709702f"}}),
           work_ / "model/sum.onnx"));
  EXPECT_EQ(ok.graph.initializers.at("w").numel(), 4);
}

TEST_F(Untrusted, NpyAndIdxHeadersThatLieAboutTheirSizeAreRefusedBeforeAllocating) {
  // A valid header declaring 10^12 floats over 16 bytes of data.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000), }";
  header += std::string(64 - (10 + header.size() + 1) % 64, ' ') + "\n";
  std::string npy = std::string("\x93NUMPY\x01\x00", 8);
  npy += static_cast<char>(header.size() & 0xFF);
  npy += static_cast<char>(header.size() >> 8);
  npy += header + std::string(16, '\0');
  testing::write_text(work_ / "bomb.npy", npy);
  auto msg = error_of([&] { read_npy(work_ / "bomb.npy"); });
  EXPECT_NE(msg.find("bomb.npy"), std::string::npos) << msg;
  EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("memory") != std::string::npos) << msg;

  // IDX: uint8, 3 dims of 65536 x 65536 x 65536 over no data.
  std::string idx("\x00\x00\x08\x03", 4);
  for (int i = 0; i < 3; ++i) idx += std::string("\x00\x01\x00\x00", 4);
  testing::write_text(work_ / "bomb.idx", idx);
  msg = error_of([&] { read_idx(work_ / "bomb.idx"); });
  EXPECT_NE(msg.find("bomb.idx"), std::string::npos) << msg;
  // A smaller lie (fits in memory, data missing) is a truncation error.
  std::string small("\x00\x00\x08\x01\x00\x10\x00\x00", 8);
  testing::write_text(work_ / "short.idx", small + "abc");
  msg = error_of([&] { read_idx(work_ / "short.idx"); });
  EXPECT_NE(msg.find("truncated IDX data"), std::string::npos) << msg;
}

TEST_F(Untrusted, ImageHeadersThatClaimMorePixelsThanTheFileHoldsAreRefused) {
  const auto le32 = [](std::uint32_t v) {
    return std::string{static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 24)};
  };
  // An uncompressed 24-bit BMP header for 4000 x 4000 pixels (48 MB of rows) and no rows.
  std::string bmp = "BM" + le32(54) + le32(0) + le32(54) + le32(40) + le32(4000) + le32(4000);
  bmp += std::string("\x01\x00\x18\x00", 4) + le32(0) + le32(0) + le32(0) + le32(0) + le32(0) + le32(0);
  // A baseline JPEG frame header for 20000 x 20000 pixels and no scan: stb_image would pad it with zeros.
  const std::string jpeg("\xff\xd8\xff\xc0\x00\x11\x08\x4e\x20\x4e\x20\x03\x01\x22\x00\x02\x11\x00\x03\x11\x00", 21);
  const ValueInfo input{"image", 1, true, {{-1, "batch"}, {3, ""}, {-1, "height"}, {-1, "width"}}, ""};
  const Config c = Config::from_string("[data]\npreset = \"imagenet\"\n", "preset.toml");
  for (const auto& [file, bytes, pixels] :
       {std::tuple{"tall.bmp", bmp, "4000 x 4000"}, std::tuple{"huge.jpg", jpeg, "20000 x 20000"}}) {
    testing::write_text(work_ / file, bytes);
    const std::string path = work_ / file;  // a structured binding cannot be captured before C++20
    const std::string name = file;
    const auto msg = error_of([&] { read_image(path, *c.data, image_input(*c.data, input)); });
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    EXPECT_NE(msg.find(pixels), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated or corrupt"), std::string::npos) << msg;
  }
}

TEST_F(Untrusted, AnImageThatDecodesToNoPixelsIsRefusedBeforeItIsFitted) {
  // A BMP whose header stb_image sizes one way and decodes another: a zero-width image, which the
  // fits would divide by.
  const std::string path = testing::source_path("tests/fuzz/regressions/image/ubsan-bmp-decodes-to-zero-columns");
  const ValueInfo input{"image", 1, true, {{-1, "batch"}, {3, ""}, {-1, "height"}, {-1, "width"}}, ""};
  for (const char* preset : {"imagenet", "paddleocr_rec", "paddleocr_det", "yolo"}) {
    const Config c = Config::from_string(std::string("[data]\npreset = \"") + preset + "\"\n", "preset.toml");
    const auto msg = error_of([&] { read_image(path, *c.data, image_input(*c.data, input)); });
    EXPECT_NE(msg.find("ubsan-bmp-decodes-to-zero-columns"), std::string::npos) << preset << ": " << msg;
    EXPECT_NE(msg.find("at least one row and one column"), std::string::npos) << preset << ": " << msg;
  }
}

TEST_F(Untrusted, TensorDimsThatOverflowOrAreNegative) {
  onnx::TensorProto t;
  t.set_data_type(onnx::TensorProto::FLOAT);
  t.add_dims(-3);
  std::ofstream(work_ / "neg.pb", std::ios::binary) << t.SerializeAsString();
  EXPECT_NE(error_of([&] { load_tensor_pb(work_ / "neg.pb"); }).find("negative dimension"), std::string::npos);
  onnx::TensorProto u;
  u.set_data_type(onnx::TensorProto::UINT16);
  u.add_dims(INT64_MAX / 2);
  u.add_dims(4);
  std::ofstream(work_ / "big.pb", std::ios::binary) << u.SerializeAsString();
  EXPECT_NE(error_of([&] { load_tensor_pb(work_ / "big.pb"); }).find("overflows"), std::string::npos);
}

TEST(UntrustedModels, NestingBombsAndDuplicateValueNames) {
  // Subgraph attributes nested 200 deep: protobuf's recursion limit (100) stops the parser, and
  // the message says that nesting, not corruption, is the cause; 800 deep (2,400 message levels)
  // is beyond the deeper limit the diagnosis parses with, and reads as not a model.
  for (const int levels : {200, 800}) {
    onnx::ModelProto m = model_with_external({});
    m.mutable_graph()->clear_initializer();
    onnx::GraphProto* g = m.mutable_graph();
    for (int depth = 0; depth < levels; ++depth) {
      auto* n = g->add_node();
      n->set_op_type("If");
      auto* a = n->add_attribute();
      a->set_name("then_branch");
      a->set_type(onnx::AttributeProto::GRAPH);
      g = a->mutable_g();
    }
    auto msg = error_of([&] { load_onnx_from_bytes(m.SerializeAsString(), "nested.onnx"); });
    EXPECT_NE(msg.find("nested.onnx"), std::string::npos) << msg;
    EXPECT_NE(
        msg.find(levels == 200 ? "nests If/Loop/Scan bodies deeper than protobuf reads" : "not a valid ONNX model"),
        std::string::npos)
        << msg;
  }

  // Two nodes writing the same tensor.
  onnx::ModelProto d = model_with_external({});
  d.mutable_graph()->clear_initializer();
  auto* n0 = d.mutable_graph()->mutable_node(0);
  n0->set_input(1, "x");
  auto* n1 = d.mutable_graph()->add_node();
  n1->set_op_type("Relu");
  n1->set_name("second_writer");
  n1->add_input("x");
  n1->add_output("y");
  auto msg = error_of([&] { load_onnx_from_bytes(d.SerializeAsString(), "dup.onnx"); });
  EXPECT_NE(msg.find("'y' is defined twice"), std::string::npos) << msg;
  EXPECT_NE(msg.find("second_writer"), std::string::npos) << msg;
}

// What the idx fuzz target does: read the file as labels, then stream it as calibration images
// (under AddressSanitizer a file handle left open on a refused header is a reported leak).
void replay_idx(const std::string& path) {
  try {
    read_idx(path);
  } catch (const Error&) {
  }
  const std::vector<ValueInfo> inputs = {{"image", 1, true, {{-1, "batch"}, {1, ""}, {-1, "h"}, {-1, "w"}}, ""}};
  auto dataset = open_dataset(path, inputs);
  Batcher batches(*dataset, inputs, 4, 16);
  while (batches.next()) {
  }
}

// Every file under tests/fuzz/regressions/<target>/ once made that fuzz target fail; each must
// now end in a result or a sparsebit::Error.
TEST(FuzzRegressions, EveryKeptFindingIsHandled) {
  const fs::path root = testing::source_path("tests/fuzz/regressions");
  int replayed = 0;
  if (!fs::is_directory(root)) GTEST_SKIP() << "no findings kept";
  for (const auto& dir : fs::directory_iterator(root)) {
    const std::string target = dir.path().filename().string();
    for (const auto& f : fs::directory_iterator(dir.path())) {
      const std::string path = f.path().string();
      std::ifstream in(path, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      try {
        if (target == "onnx_import") load_onnx_from_bytes(bytes, path);
        else if (target == "config") Config::from_string(bytes, path);
        else if (target == "yaml_config") Config::from_string(yaml_config_to_toml(bytes, path), path);
        else if (target == "npy") read_npy(path);
        else if (target == "idx") replay_idx(path);
        else if (target == "tensor_pb") load_tensor_pb(path);
        else if (target == "image") {
          const Config c = Config::from_string("[data]\npreset = \"imagenet\"\n", "preset.toml");
          const ValueInfo input{"image", 1, true, {{-1, "batch"}, {3, ""}, {-1, "height"}, {-1, "width"}}, ""};
          read_image(path, *c.data, image_input(*c.data, input));
        } else ADD_FAILURE() << "unknown fuzz target folder " << target;
      } catch (const Error&) {
      }
      ++replayed;
    }
  }
  std::printf("replayed %d fuzzer findings\n", replayed);
}

}  // namespace
}  // namespace sparsebit
