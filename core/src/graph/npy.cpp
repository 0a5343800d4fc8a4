// .npy files: reading (whole or mapped) and writing NumPy's format (data.cpp reads the datasets).

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "base/limits.h"
#include "base/mapped_file.h"
#include "graph/npy.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/data.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit {

namespace {
struct NpyLayout {
  std::vector<std::int64_t> shape;
  at::ScalarType dtype;
  std::uint64_t data_start = 0;
};

/// The fields of a .npy header: numpy writes a Python dict literal of exactly these three keys,
/// and its own reader refuses anything else (a key twice or missing, another key, a fortran_order
/// that is not True or False), so this does too.
struct NpyHeaderFields {
  std::string descr, shape;  ///< shape: what lies between the tuple's parentheses
  bool fortran_order = false;
};

NpyHeaderFields parse_npy_header(const std::string& h, const std::string& path) {
  auto fail = [&](const std::string& why) -> Error {
    return Error(path + ": .npy header " + why + " (header: " + printable(h, 120) + "); the file is corrupt");
  };
  std::size_t i = 0;
  auto space = [&] {
    while (i < h.size() && (h[i] == ' ' || h[i] == '\t' || h[i] == '\n')) ++i;
  };
  auto quoted = [&]() -> std::string {
    if (i >= h.size() || (h[i] != '\'' && h[i] != '"'))
      throw fail("expects a quoted string at offset " + std::to_string(i));
    const char q = h[i++];
    const std::size_t end = h.find(q, i);
    if (end == std::string::npos) throw fail("has a string that is never closed");
    std::string v = h.substr(i, end - i);
    i = end + 1;
    return v;
  };
  NpyHeaderFields f;
  std::set<std::string> seen;
  space();
  if (i >= h.size() || h[i++] != '{') throw fail("is not a dict");
  for (;;) {
    space();
    if (i < h.size() && h[i] == '}') break;
    const std::string key = quoted();
    if (!seen.insert(key).second) throw fail("has '" + printable(key, 40) + "' twice");
    space();
    if (i >= h.size() || h[i++] != ':') throw fail("lacks ':' after '" + printable(key, 40) + "'");
    space();
    if (key == "descr") {
      f.descr = quoted();
    } else if (key == "fortran_order") {
      if (h.compare(i, 4, "True") == 0) f.fortran_order = true, i += 4;
      else if (h.compare(i, 5, "False") == 0) i += 5;
      else throw fail("has a fortran_order that is neither True nor False");
    } else if (key == "shape") {
      if (i >= h.size() || h[i] != '(') throw fail("has a shape that is not a tuple");
      const std::size_t end = h.find(')', i);
      if (end == std::string::npos) throw fail("has a shape tuple that is never closed");
      f.shape = h.substr(i + 1, end - i - 1);
      i = end + 1;
    } else {
      throw fail("has the key '" + printable(key, 40) + "', not one of descr, fortran_order, shape");
    }
    space();
    if (i < h.size() && h[i] == ',') ++i;
    else if (i >= h.size() || h[i] != '}') throw fail("lacks ',' or '}' after '" + printable(key, 40) + "'");
  }
  ++i;  // the '}'
  space();
  if (i != h.size()) throw fail("has more after its dict");
  for (const char* k : {"descr", "fortran_order", "shape"})
    if (!seen.count(k)) throw fail(std::string("has no '") + k + "'");
  return f;
}

/// The header of a .npy file, checked against the file's size; `in` is left at the data.
NpyLayout read_npy_header(std::ifstream& in, const std::string& path) {
  if (!in) throw Error(path + ": cannot be opened");
  char magic[8];
  in.read(magic, 8);
  if (in.gcount() != 8 || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw Error(path + ": not a .npy file (bad magic)");
  std::uint32_t header_len = 0;
  if (magic[6] < 1 || magic[6] > 3 || magic[7] != 0) {
    throw Error(path + ": .npy format version " + std::to_string(int(static_cast<unsigned char>(magic[6]))) + "." +
                std::to_string(int(static_cast<unsigned char>(magic[7]))) + " is not one of 1.0, 2.0, 3.0");
  }
  if (magic[6] == 1) {
    unsigned char b[2];
    in.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    in.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (std::uint32_t(b[3]) << 24);
  }
  if (!in || header_len > 1u << 20) throw Error(path + ": corrupt .npy header");
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  if (!in) throw Error(path + ": truncated .npy header");

  const NpyHeaderFields fields = parse_npy_header(header, path);
  const std::string descr = fields.descr;
  if (fields.fortran_order)
    throw Error(path + ": Fortran-ordered arrays are not supported; save with numpy.ascontiguousarray");
  // The shape is a Python tuple of non-negative integers: "()", "(5,)", "(4, 1, 28, 28)".
  std::vector<std::int64_t> shape;
  const std::string dims = fields.shape;
  std::stringstream items(dims);
  std::vector<std::string> parts;
  for (std::string item; std::getline(items, item, ',');) parts.push_back(item);
  if (!dims.empty() && dims.back() == ',') parts.emplace_back();
  for (std::size_t i = 0; i < parts.size(); ++i) {
    std::string d = parts[i];
    d.erase(0, d.find_first_not_of(" \t"));
    d.erase(d.find_last_not_of(" \t") + 1);
    const bool last = i + 1 == parts.size();
    if (d.empty() && last && i > 0) break;      // the trailing comma of "(5,)"
    if (d.empty() && parts.size() == 1) break;  // "()"
    if (d.empty() || d.size() > 15 || d.find_first_not_of("0123456789") != std::string::npos) {
      throw Error(path + ": .npy shape (" + printable(dims, 80) + ") has '" + printable(d, 40) +
                  "', not a non-negative integer dimension; the file is corrupt");
    }
    shape.push_back(std::stoll(d));
  }

  static const std::map<std::string, at::ScalarType> types = {
      {"<f4", at::kFloat}, {"<f8", at::kDouble}, {"<f2", at::kHalf}, {"|u1", at::kByte}, {"|i1", at::kChar},
      {"<i2", at::kShort}, {"<i4", at::kInt},    {"<i8", at::kLong}, {"|b1", at::kBool}};
  auto t = types.find(descr);
  if (t == types.end())
    throw Error(path + ": unsupported .npy dtype '" + descr + "' (use little-endian numeric types)");
  // The declared size must be there before it is allocated.
  const std::int64_t numel = limits::checked_numel(shape, c10::elementSize(t->second), path);
  const auto bytes = static_cast<std::uint64_t>(numel) * c10::elementSize(t->second);
  const auto data_start = static_cast<std::uint64_t>(in.tellg());
  std::error_code ec;
  const auto file_size = static_cast<std::uint64_t>(std::filesystem::file_size(path, ec));
  if (ec || file_size < data_start || file_size - data_start < bytes)
    throw Error(path + ": truncated .npy data (expected " + std::to_string(bytes) + " bytes)");
  return {shape, t->second, data_start};
}
}  // namespace

at::Tensor read_npy(const std::string& path) {
  note_file_read(path);  // Note [Files a run read]
  std::ifstream in(path, std::ios::binary);
  const NpyLayout layout = read_npy_header(in, path);
  at::Tensor out = at::empty(layout.shape, at::TensorOptions().dtype(layout.dtype));
  in.read(static_cast<char*>(out.data_ptr()), static_cast<std::streamsize>(out.nbytes()));
  if (static_cast<std::size_t>(in.gcount()) != out.nbytes())
    throw Error(path + ": truncated .npy data (expected " + std::to_string(out.nbytes()) + " bytes)");
  return out;
}

at::Tensor map_npy(const std::string& path) {
  note_file_read(path);
  std::ifstream in(path, std::ios::binary);
  const NpyLayout layout = read_npy_header(in, path);
  const std::int64_t numel = c10::multiply_integers(layout.shape);
  if (numel * static_cast<std::int64_t>(c10::elementSize(layout.dtype)) >= (std::int64_t{1} << 20)) {
    at::Tensor mapped = map_tensor(path, static_cast<std::int64_t>(layout.data_start), layout.shape, layout.dtype);
    if (mapped.defined()) return mapped;
  }
  return read_npy(path);
}

void write_npy(const at::Tensor& t_in, const std::string& path) {
  at::Tensor t = t_in.detach().to(at::kCPU).contiguous();
  static const std::map<at::ScalarType, std::string> types = {
      {at::kFloat, "<f4"}, {at::kDouble, "<f8"}, {at::kHalf, "<f2"}, {at::kByte, "|u1"}, {at::kChar, "|i1"},
      {at::kShort, "<i2"}, {at::kInt, "<i4"},    {at::kLong, "<i8"}, {at::kBool, "|b1"}};
  auto it = types.find(t.scalar_type());
  if (it == types.end()) throw Error("cannot write dtype " + std::string(c10::toString(t.scalar_type())) + " to .npy");
  std::string shape;
  for (auto d : t.sizes()) shape += std::to_string(d) + ", ";
  if (t.dim() > 1) shape.erase(shape.size() - 2);
  std::string header = "{'descr': '" + it->second + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string bytes("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  bytes.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

}  // namespace sparsebit
