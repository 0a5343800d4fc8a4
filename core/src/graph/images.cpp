// Image files as model input (Note [Image data]): decoded by stb_image, resized, cropped and
// normalized with ATen's ops, in float from the decoded bytes to the sample.

#include <ATen/ATen.h>
#include <stb_image.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "base/limits.h"
#include "base/log.h"
#include "sparsebit/core/data.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t kMaxImageFileBytes = std::uint64_t{1} << 30;

std::vector<unsigned char> read_file(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) throw Error(path + ": cannot be read: " + ec.message());
  if (size > kMaxImageFileBytes)
    throw Error(path + ": " + std::to_string(size) + " bytes is larger than an image may be (1 GiB)");
  std::vector<unsigned char> bytes(size);
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
    throw Error(path + ": cannot be read");
  return bytes;
}

std::uint32_t little_endian(const std::vector<unsigned char>& b, std::size_t at, int len) {
  std::uint32_t v = 0;
  for (int i = len - 1; i >= 0; --i) v = v << 8 | (at + i < b.size() ? b[at + i] : 0);
  return v;
}

/// Refuses a header that claims more pixels than the file's bytes can encode. The decoder would
/// allocate them first and, for JPEG, pad a truncated stream with zeros: a file of a few bytes
/// could cost gigabytes and turn into a blank image. Bounds: an uncompressed BMP (the only kind
/// stb_image reads) holds every padded row; a JPEG spends at least one bit per 8x8 block of its
/// full-resolution component (the DC code); a PNG's deflate stream expands at most 1032 times, to
/// at most 8 one-bit pixels per byte.
void check_size_against_file(const std::vector<unsigned char>& b, int w, int h, const std::string& path) {
  const auto pixels = static_cast<std::uint64_t>(w) * static_cast<std::uint64_t>(h);
  std::uint64_t needed = 0;  // bytes the claimed size needs at the least
  if (b[0] == 'B') {
    const bool core_header = little_endian(b, 14, 4) == 12;  // OS/2 BITMAPCOREHEADER
    const std::uint64_t bits = little_endian(b, core_header ? 24 : 28, 2);
    needed = (static_cast<std::uint64_t>(w) * bits + 31) / 32 * 4 * static_cast<std::uint64_t>(h);
  } else if (b[0] == 0xff) {
    needed = pixels / 512;
  } else {
    needed = pixels / (1032 * 8);
  }
  if (needed > b.size()) {
    throw Error(path + ": its header claims " + std::to_string(w) + " x " + std::to_string(h) + " pixels, which need " +
                std::to_string(needed) + " bytes or more, but the file has " + std::to_string(b.size()) +
                "; it is truncated or corrupt");
  }
}

/// Pixels as a float [1, C, H, W] tensor of 0..255 values; C = 1 only for a grey image read as GRAY.
at::Tensor decode(const std::string& path, bool gray) {
  const std::vector<unsigned char> bytes = read_file(path);
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw Error(path + ": too large to decode");
  // Only the three formats are handed to the decoder: stb_image would otherwise pick any of its
  // other decoders (GIF, PSD, HDR, PIC...) from the content, whatever the file's name says.
  const auto starts = [&](const char* magic, std::size_t len) {
    return bytes.size() >= len && std::memcmp(bytes.data(), magic, len) == 0;
  };
  if (!starts("\x89PNG\r\n\x1a\n", 8) && !starts("\xff\xd8\xff", 3) && !starts("BM", 2))
    throw Error(path + ": not a JPEG, PNG or BMP image (its first bytes are none of theirs)");
  const int n = static_cast<int>(bytes.size());
  int w = 0, h = 0, comp = 0;
  if (!stbi_info_from_memory(bytes.data(), n, &w, &h, &comp))
    throw Error(path + ": not an image stb_image decodes (" + std::string(stbi_failure_reason()) + ")");
  // The header's size is checked before the pixels are allocated: a small file may claim a huge image.
  limits::checked_numel({h, w, 3}, sizeof(float), path + ": the image header");
  check_size_against_file(bytes, w, h, path);
  const int want = gray && comp <= 2 ? 1 : 3;
  const std::unique_ptr<unsigned char, void (*)(void*)> pixels(
      stbi_load_from_memory(bytes.data(), n, &w, &h, &comp, want), stbi_image_free);
  if (!pixels) throw Error(path + ": cannot be decoded (" + std::string(stbi_failure_reason()) + ")");
  // A header may say one size and the decoder return another (a BMP with two headers): every fit
  // below divides by the decoded sides.
  if (w <= 0 || h <= 0)
    throw Error(path + ": decodes to " + std::to_string(w) + " x " + std::to_string(h) +
                " pixels; an image needs at least one row and one column");
  at::Tensor t = at::from_blob(pixels.get(), {h, w, want}, at::kByte).to(at::kFloat).permute({2, 0, 1}).unsqueeze(0);
  if (gray && want == 3)  // ITU-R 601 luma, as PIL's and torchvision's grey conversions
    t = (t.select(1, 0) * 0.299f + t.select(1, 1) * 0.587f + t.select(1, 2) * 0.114f).unsqueeze(1);
  return t.contiguous();
}

at::Tensor resized(const at::Tensor& x, std::int64_t h, std::int64_t w, bool antialias) {
  if (x.size(2) == h && x.size(3) == w) return x;
  return antialias ? at::_upsample_bilinear2d_aa(x, {h, w}, false) : at::upsample_bilinear2d(x, {h, w}, false);
}

std::int64_t round_half_even(double v) { return static_cast<std::int64_t>(std::nearbyint(v)); }

/// Pads [1, C, H, W] by (left, right, top, bottom) with `value`.
at::Tensor padded(const at::Tensor& x, std::int64_t left, std::int64_t right, std::int64_t top, std::int64_t bottom,
                  double value) {
  if (left == 0 && right == 0 && top == 0 && bottom == 0) return x;
  return at::constant_pad_nd(x, {left, right, top, bottom}, value);
}

at::Tensor fit(const at::Tensor& x, const DataConfig& d, const std::vector<std::int64_t>& model_hw) {
  const std::int64_t h = x.size(2), w = x.size(3);
  const auto& r = d.resize;
  if (d.fit.empty()) return model_hw.empty() ? x : resized(x, model_hw[0], model_hw[1], d.antialias);
  if (d.fit == "exact") return resized(x, r[0], r[1], d.antialias);
  if (d.fit == "shorter") {  // torchvision: the longer side is truncated, not rounded
    const std::int64_t shorter = std::min(h, w), longer = std::max(h, w);
    const auto other = static_cast<std::int64_t>(static_cast<double>(r[0]) * static_cast<double>(longer) /
                                                 static_cast<double>(shorter));
    return h <= w ? resized(x, r[0], std::max<std::int64_t>(other, 1), d.antialias)
                  : resized(x, std::max<std::int64_t>(other, 1), r[0], d.antialias);
  }
  if (d.fit == "height") {  // PaddleOCR's recognizer: width ceil(H * w / h), at most W, then padded to W
    const double ratio = static_cast<double>(w) / static_cast<double>(h);
    const std::int64_t width =
        std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(static_cast<double>(r[0]) * ratio)), 1, r[1]);
    return padded(resized(x, r[0], width, d.antialias), 0, r[1] - width, 0, 0, d.pad_value);
  }
  if (d.fit == "longer") {  // PaddleOCR's detector: shrunk to the limit, sides rounded to the multiple
    const double ratio = std::max(h, w) > r[0] ? static_cast<double>(r[0]) / static_cast<double>(std::max(h, w)) : 1.0;
    auto side = [&](std::int64_t s) {
      const auto scaled = static_cast<std::int64_t>(static_cast<double>(s) * ratio);
      return std::max(round_half_even(static_cast<double>(scaled) / static_cast<double>(d.multiple)) * d.multiple,
                      d.multiple);
    };
    return resized(x, side(h), side(w), d.antialias);
  }
  // letterbox (YOLO): scaled to fit, centred, the margin split with the odd pixel below and right
  const double scale =
      std::min(static_cast<double>(r[0]) / static_cast<double>(h), static_cast<double>(r[1]) / static_cast<double>(w));
  const std::int64_t nh = std::clamp<std::int64_t>(round_half_even(static_cast<double>(h) * scale), 1, r[0]);
  const std::int64_t nw = std::clamp<std::int64_t>(round_half_even(static_cast<double>(w) * scale), 1, r[1]);
  const double dh = static_cast<double>(r[0] - nh) / 2, dw = static_cast<double>(r[1] - nw) / 2;
  const std::int64_t top = round_half_even(dh - 0.1), left = round_half_even(dw - 0.1);
  return padded(resized(x, nh, nw, d.antialias), left, r[1] - nw - left, top, r[0] - nh - top, d.pad_value);
}

/// torchvision's CenterCrop: offsets rounded half to even, an image smaller than the crop padded with 0.
at::Tensor center_cropped(at::Tensor x, const std::vector<std::int64_t>& crop) {
  if (crop.empty()) return x;
  const std::int64_t ch = crop[0], cw = crop[1];
  if (x.size(2) < ch || x.size(3) < cw) {
    const std::int64_t ph = std::max<std::int64_t>(ch - x.size(2), 0), pw = std::max<std::int64_t>(cw - x.size(3), 0);
    x = padded(x, pw / 2, (pw + 1) / 2, ph / 2, (ph + 1) / 2, 0);
  }
  const std::int64_t top = round_half_even(static_cast<double>(x.size(2) - ch) / 2.0);
  const std::int64_t left = round_half_even(static_cast<double>(x.size(3) - cw) / 2.0);
  return x.slice(2, top, top + ch).slice(3, left, left + cw);
}

at::Tensor per_channel(const std::vector<double>& v, std::int64_t channels) {
  std::vector<float> f(static_cast<std::size_t>(channels));
  for (std::int64_t c = 0; c < channels; ++c) f[c] = static_cast<float>(v.size() == 1 ? v[0] : v[c]);
  return at::tensor(f).view({1, channels, 1, 1});
}

}  // namespace

bool is_image_file(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".bmp";
}

ImageInput image_input(const DataConfig& data, const ValueInfo& input) {
  ImageInput in;
  const auto dim = [&](std::size_t i) -> std::int64_t {
    return input.has_shape && input.shape.size() == 4 ? input.shape[i].value : -1;
  };
  if (input.has_shape && input.shape.size() != 4)
    throw Error("[data] makes images into [N, C, H, W] or [N, H, W, C] samples; the model's input '" + input.name +
                "' has rank " + std::to_string(input.shape.size()));
  in.nhwc =
      data.layout == "NHWC" || (data.layout == "auto" && !(dim(1) == 1 || dim(1) == 3) && (dim(3) == 1 || dim(3) == 3));
  const std::int64_t channels = data.channels == "GRAY" ? 1 : 3;
  const std::int64_t declared = dim(in.nhwc ? 3 : 1);
  if (declared > 0 && declared != channels)
    throw Error("[data] channels = \"" + data.channels + "\" gives " + std::to_string(channels) +
                " channel(s); the model's input '" + input.name + "' takes " + std::to_string(declared) +
                (declared == 1 ? ": set channels = \"GRAY\"" : ": set channels = \"RGB\" or \"BGR\""));
  const std::int64_t h = dim(in.nhwc ? 1 : 2), w = dim(in.nhwc ? 2 : 3);
  if (data.fit.empty() && h > 0 && w > 0) in.model_hw = {h, w};
  return in;
}

at::Tensor read_image(const std::string& path, const DataConfig& data, const ImageInput& input) {
  at::Tensor x = decode(path, data.channels == "GRAY");
  x = center_cropped(fit(x, data, input.model_hw), data.center_crop);
  if (data.channels == "BGR") x = x.flip(1);
  const std::int64_t c = x.size(1);
  // Divided by 1/scale: pixels / 255 bit for bit as torchvision's to_tensor and the IDX reader.
  x = (x / (1.0 / data.scale) - per_channel(data.mean, c)) / per_channel(data.std, c);
  if (input.nhwc) x = x.permute({0, 2, 3, 1});
  return x.contiguous();
}

ImageDataset::ImageDataset(std::vector<std::string> files, std::string folder, DataConfig data, ImageInput input)
    : files_(std::move(files)), folder_(std::move(folder)), data_(std::move(data)), input_(std::move(input)) {}

std::string ImageDataset::describe() const {
  return std::to_string(files_.size()) + " image(s) in " + folder_ +
         (data_.preset.empty() ? "" : " (preset " + data_.preset + ")");
}

std::optional<Batch> ImageDataset::next() {
  while (pos_ < files_.size()) {
    const std::string& f = files_[pos_++];
    try {
      return Batch{{read_image(f, data_, input_)}, f, true};
    } catch (const Error& e) {
      if (data_.undecodable != "skip")
        throw Error(std::string(e.what()) + " (set [data] undecodable = \"skip\" to leave such files out)");
      logs::warn("skipping {}", e.what());
      ++skipped_;
    }
  }
  if (skipped_ == files_.size())
    throw Error(folder_ + ": none of its " + std::to_string(files_.size()) + " image(s) could be decoded");
  return std::nullopt;
}

}  // namespace sparsebit
