#include "sparsebit/core/data.h"

#include "base/limits.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "base/mapped_file.h"
#include "graph/npy.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// IDX (MNIST format)

namespace {

// A gzip (or plain: zlib reads those transparently) file closed on every way out, throws included.
struct GzClose {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzClose>;

GzFile open_gz(const std::string& path) {
  note_file_read(path);
  return GzFile(gzopen(path.c_str(), "rb"));
}

}  // namespace

at::Tensor read_idx(const std::string& path, std::int64_t max_items) {
  GzFile file = open_gz(path);
  if (!file) throw Error(path + ": cannot be opened");
  gzFile f = file.get();
  auto read = [&](void* dst, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30));
      int r = gzread(f, static_cast<char*>(dst) + got, chunk);
      if (r <= 0) return got;
      got += static_cast<std::size_t>(r);
    }
    return got;
  };
  unsigned char head[4];
  if (read(head, 4) != 4 || head[0] != 0 || head[1] != 0) throw Error(path + ": not an IDX file (bad magic number)");
  static const std::map<int, at::ScalarType> types = {{0x08, at::kByte}, {0x09, at::kChar},  {0x0B, at::kShort},
                                                      {0x0C, at::kInt},  {0x0D, at::kFloat}, {0x0E, at::kDouble}};
  auto t = types.find(head[2]);
  const int ndim = head[3];
  if (t == types.end() || ndim < 1) throw Error(path + ": unsupported IDX element type or rank");
  std::vector<std::int64_t> shape;
  for (int i = 0; i < ndim; ++i) {
    unsigned char b[4];
    if (read(b, 4) != 4) throw Error(path + ": truncated IDX header");
    shape.push_back((std::int64_t(b[0]) << 24) | (b[1] << 16) | (b[2] << 8) | b[3]);
  }
  if (max_items > 0) shape[0] = std::min(shape[0], max_items);
  const std::size_t elem = c10::elementSize(t->second);
  const std::int64_t numel = limits::checked_numel(shape, elem, path);
  // Gzip hides the payload size: read what is there in chunks (so a lying header costs no more
  // memory than the data), then check it is all there.
  const std::size_t bytes = static_cast<std::size_t>(numel) * elem;
  std::string data;
  std::string chunk(std::min<std::size_t>(bytes, 1 << 24), '\0');
  while (data.size() < bytes) {
    const std::size_t want = std::min(chunk.size(), bytes - data.size());
    const std::size_t got = read(chunk.data(), want);
    data.append(chunk.data(), got);
    if (got < want) break;
  }
  file.reset();
  if (data.size() != bytes) throw Error(path + ": truncated IDX data (expected " + std::to_string(bytes) + " bytes)");
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(t->second));
  if (bytes > 0) std::memcpy(out.data_ptr(), data.data(), bytes);
  // IDX stores multi-byte values big-endian.
  if (out.element_size() > 1) {
    auto* p = static_cast<unsigned char*>(out.data_ptr());
    const std::size_t es = out.element_size();
    for (std::size_t i = 0; i < out.nbytes(); i += es) std::reverse(p + i, p + i + es);
  }
  return out;
}

at::Tensor read_labels(const std::string& path) {
  at::Tensor labels = read_idx(path);
  if (labels.dim() != 1 && !(labels.dim() == 2 && labels.size(1) == 1))
    throw Error(path + ": is not a label file: it holds an array of shape " + c10::str(labels.sizes()) +
                "; labels are one integer per sample (an IDX file of rank 1)");
  return labels.to(at::kLong).reshape({-1});
}

// ---------------------------------------------------------------------------------------------
// Datasets

namespace {

bool is_idx(const std::string& path) {
  GzFile f = open_gz(path);
  if (!f) return false;
  unsigned char head[4];
  const int n = gzread(f.get(), head, 4);
  return n == 4 && head[0] == 0 && head[1] == 0 && head[2] >= 0x08 && head[2] <= 0x0E && head[3] >= 1 && head[3] <= 8;
}

class NpyDataset final : public Dataset {
 public:
  NpyDataset(std::vector<fs::path> files, std::string folder) : files_(std::move(files)), folder_(std::move(folder)) {}
  std::string describe() const override { return std::to_string(files_.size()) + " .npy file(s) in " + folder_; }
  std::optional<std::int64_t> num_samples() const override { return std::nullopt; }
  std::optional<Batch> next() override {
    if (pos_ >= files_.size()) return std::nullopt;
    const auto& f = files_[pos_++];
    return Batch{{map_npy(f.string())}, f.string()};
  }

 private:
  std::vector<fs::path> files_;
  std::string folder_;
  std::size_t pos_ = 0;
};

class TestLayoutDataset final : public Dataset {
 public:
  TestLayoutDataset(std::vector<fs::path> sets, const std::vector<ValueInfo>& inputs)
      : sets_(std::move(sets)), inputs_(inputs) {}
  std::string describe() const override { return std::to_string(sets_.size()) + " ONNX test-data set(s)"; }
  std::optional<std::int64_t> num_samples() const override { return std::nullopt; }
  std::optional<Batch> next() override {
    if (pos_ >= sets_.size()) return std::nullopt;
    const fs::path& dir = sets_[pos_++];
    Batch b;
    b.source = dir.string();
    b.inputs.resize(inputs_.size());
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      fs::path file = dir / ("input_" + std::to_string(i) + ".pb");
      if (!fs::exists(file)) {
        throw Error(dir.string() + ": missing " + file.filename().string() + " for model input '" + inputs_[i].name +
                    "' (the model has " + std::to_string(inputs_.size()) + " inputs)");
      }
      std::string name;
      at::Tensor t = load_tensor_pb(file.string(), &name);
      // A named tensor goes to the input of that name; otherwise by position.
      std::size_t slot = i;
      if (!name.empty()) {
        auto it = std::find_if(inputs_.begin(), inputs_.end(), [&](const ValueInfo& v) { return v.name == name; });
        if (it == inputs_.end())
          throw Error(file.string() + ": tensor is named '" + name + "', but the model has no input of that name");
        slot = static_cast<std::size_t>(it - inputs_.begin());
      }
      b.inputs[slot] = t;
    }
    return b;
  }

 private:
  std::vector<fs::path> sets_;
  std::vector<ValueInfo> inputs_;
  std::size_t pos_ = 0;
};

// Streams an IDX file in chunks, so only the samples used are read and decompressed.
class IdxDataset final : public Dataset {
 public:
  explicit IdxDataset(std::string path) : path_(std::move(path)) {
    file_ = open_gz(path_);
    if (!file_) throw Error(path_ + ": cannot be opened");
    unsigned char head[4];
    if (gzread(file_.get(), head, 4) != 4) throw Error(path_ + ": truncated IDX header");
    if (head[2] != 0x08) throw Error(path_ + ": IDX data for calibration must be unsigned bytes (images)");
    if (head[0] != 0 || head[1] != 0 || head[3] < 1)
      throw Error(path_ + ": not an IDX file (bad magic number or no dimensions)");
    for (int i = 0; i < head[3]; ++i) {
      unsigned char b[4];
      if (gzread(file_.get(), b, 4) != 4) throw Error(path_ + ": truncated IDX header");
      shape_.push_back((std::int64_t(b[0]) << 24) | (b[1] << 16) | (b[2] << 8) | b[3]);
    }
    // The declared sizes are checked before anything is allocated for them: one record of up to
    // 1024 samples must fit in memory, and a plain file must hold every declared byte.
    std::vector<std::int64_t> record = shape_;
    record[0] = std::min<std::int64_t>(record[0], 1024);
    limits::checked_numel(record, 1, path_ + ": the IDX header");
    const std::int64_t total = limits::checked_numel(shape_, 1, path_ + ": the IDX header");
    std::error_code ec;
    const auto size = fs::file_size(path_, ec);
    const auto header = 4 + 4 * static_cast<std::uint64_t>(shape_.size());
    if (gzdirect(file_.get()) && !ec && size - header < static_cast<std::uint64_t>(total)) {
      throw Error(path_ + ": the IDX header declares " + std::to_string(total) + " bytes of data, the file holds " +
                  std::to_string(size - header) + "; it is truncated or corrupt");
    }
  }
  std::string describe() const override { return "IDX file " + path_; }
  std::optional<std::int64_t> num_samples() const override { return shape_.empty() ? 0 : shape_[0]; }
  std::optional<Batch> next() override {
    const std::int64_t left = shape_[0] - read_;
    if (left <= 0) return std::nullopt;
    std::vector<std::int64_t> shape = shape_;
    shape[0] = std::min<std::int64_t>(left, 1024);
    at::Tensor raw = at::empty(shape, at::TensorOptions().dtype(at::kByte));
    const auto want = static_cast<unsigned>(raw.nbytes());
    if (gzread(file_.get(), raw.data_ptr(), want) != static_cast<int>(want))
      throw Error(path_ + ": truncated IDX data after " + std::to_string(read_) + " samples");
    read_ += shape[0];
    return Batch{{raw.to(at::kFloat).div_(255.0f)}, path_, true};
  }

 private:
  std::string path_;
  GzFile file_;
  std::vector<std::int64_t> shape_;
  std::int64_t read_ = 0;
};

}  // namespace

DataSource::DataSource(std::string path) : path_(std::move(path)) {}
DataSource::DataSource(const char* path) : path_(path ? path : "") {}
DataSource::DataSource(std::string name, DatasetOpener opener) : name_(std::move(name)), opener_(std::move(opener)) {}

std::string DataSource::name() const { return opener_ ? "<" + name_ + ">" : path_; }

std::string DataSource::identity() const {
  if (opener_ || path_.empty()) return name();
  std::error_code ec;
  const fs::path absolute = fs::absolute(path_, ec);
  return ec ? path_ : absolute.string();
}

std::unique_ptr<Dataset> DataSource::open(const std::vector<ValueInfo>& inputs) const {
  if (!opener_) return open_dataset(path_, inputs, images_.get());
  if (inputs.empty()) throw Error("the model has no inputs to feed " + name() + " to");
  auto data = opener_(inputs);
  if (!data) throw Error(name() + ": the data source opened no dataset");
  return data;
}

DataSource DataSource::with_images(const std::optional<DataConfig>& images) const {
  DataSource d = *this;
  if (images && !opener_ && !images_) d.images_ = std::make_shared<const DataConfig>(*images);
  return d;
}

namespace {

std::unique_ptr<Dataset> open_images(std::vector<std::string> files, const std::string& where,
                                     const std::vector<ValueInfo>& inputs, const DataConfig* images) {
  if (!images)
    throw Error(where +
                " holds images, and the config has no [data] table saying how the model takes them: add one, "
                "e.g. [data] preset = \"imagenet\" (presets: imagenet, paddleocr_rec, paddleocr_det, yolo), "
                "or fit, resize, center_crop, channels, mean, std (README: --calib DATA)");
  if (inputs.size() != 1)
    throw Error(where + ": images serve single-input models; this model has " + std::to_string(inputs.size()) +
                " inputs: use the ONNX test-data layout");
  std::sort(files.begin(), files.end());
  return std::make_unique<ImageDataset>(std::move(files), where, *images, image_input(*images, inputs[0]));
}

}  // namespace

std::unique_ptr<Dataset> open_dataset(const std::string& path, const std::vector<ValueInfo>& inputs,
                                      const DataConfig* images) {
  if (path.empty()) throw Error("no data given: pass a folder of samples, an ONNX test-data folder or an IDX file");
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw Error(
        "calibration data " + path + ": " +
        (ec && ec != std::errc::no_such_file_or_directory ? ec.message() : std::string("no such file or folder")));
  if (!fs::is_regular_file(path, ec) && !fs::is_directory(path, ec))
    throw Error("calibration data " + path + ": is a device, pipe or socket, not a file or folder of samples");
  if (inputs.empty()) throw Error("the model has no inputs to feed calibration data to");
  if (fs::is_regular_file(path, ec)) {
    if (fs::path(path).extension() == ".npy") {
      if (inputs.size() != 1)
        throw Error(path + ": .npy data serves single-input models; this model has " + std::to_string(inputs.size()) +
                    " inputs: use the ONNX test-data layout");
      return std::make_unique<NpyDataset>(std::vector<fs::path>{path}, fs::path(path).parent_path().string());
    }
    if (is_image_file(path)) return open_images({path}, path, inputs, images);
    if (is_idx(path)) {
      if (inputs.size() != 1)
        throw Error(path + ": IDX data serves single-input models; this model has " + std::to_string(inputs.size()) +
                    " inputs");
      return std::make_unique<IdxDataset>(path);
    }
    throw Error(path +
                ": not a calibration format (expected a folder of .npy files or images, an ONNX test-data folder, "
                "a .npy file, an image or an IDX file)");
  }
  std::vector<fs::path> npy, sets;
  std::vector<std::string> pictures;
  bool has_pb = false;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && e.path().extension() == ".npy") npy.push_back(e.path());
    else if (e.is_directory() && name.rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
    else if (e.is_regular_file() && name.rfind("input_", 0) == 0 && e.path().extension() == ".pb") has_pb = true;
    else if (e.is_regular_file() && is_image_file(name)) pictures.push_back(e.path().string());
  }
  if (!sets.empty()) {
    std::sort(sets.begin(), sets.end());
    return std::make_unique<TestLayoutDataset>(sets, inputs);
  }
  if (has_pb) return std::make_unique<TestLayoutDataset>(std::vector<fs::path>{path}, inputs);
  if (!npy.empty()) {
    if (inputs.size() != 1)
      throw Error(path + ": a folder of .npy files serves single-input models; this model has " +
                  std::to_string(inputs.size()) +
                  " inputs: use the ONNX test-data layout (test_data_set_*/input_<i>.pb)");
    std::sort(npy.begin(), npy.end());
    return std::make_unique<NpyDataset>(npy, path);
  }
  if (!pictures.empty()) return open_images(std::move(pictures), path, inputs, images);
  throw Error("calibration folder " + path +
              " is empty: it holds no .npy files, no images and no test_data_set_* folders");
}

}  // namespace sparsebit
