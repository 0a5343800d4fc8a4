// Values between Python and the pipeline (convert.h).

#include "convert.h"

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <toml++/toml.h>

#include <memory>
#include <optional>

#include "calls.h"
#include "sparsebit/core/session.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::python {

// ---------------------------------------------------------------------------------------------
// numpy, DLPack and __array__ in; numpy out

/// The numpy dtype of an ONNX element type, where numpy has one.
std::optional<std::string> numpy_dtype_of(std::int32_t onnx_type) {
  switch (onnx_type) {
    case 1: return "float32";
    case 2: return "uint8";
    case 3: return "int8";
    case 4: return "uint16";
    case 5: return "int16";
    case 6: return "int32";
    case 7: return "int64";
    case 9: return "bool";
    case 10: return "float16";
    case 11: return "float64";
    case 12: return "uint32";
    case 13: return "uint64";
    default: return std::nullopt;
  }
}

std::string dtype_name(const py::dtype& dt) { return py::str(py::handle(dt)).cast<std::string>(); }

at::ScalarType scalar_type_of(const py::dtype& dt, const std::string& what) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'f' && size == 4) return at::kFloat;
  if (kind == 'f' && size == 8) return at::kDouble;
  if (kind == 'f' && size == 2) return at::kHalf;
  if (kind == 'i' && size == 8) return at::kLong;
  if (kind == 'i' && size == 4) return at::kInt;
  if (kind == 'i' && size == 2) return at::kShort;
  if (kind == 'i' && size == 1) return at::kChar;
  if (kind == 'u' && size == 1) return at::kByte;
  if (kind == 'b') return at::kBool;
  throw Error(what + ": numpy dtype " + dtype_name(dt) + " has no tensor equivalent");
}

/// A C-ordered numpy array as a tensor over the same memory, keeping the array alive.
at::Tensor tensor_over(const py::array& a, const std::string& what) {
  const at::ScalarType st = scalar_type_of(a.dtype(), what);
  std::vector<std::int64_t> sizes(a.shape(), a.shape() + a.ndim());
  auto* ref = new PyRef(a);
  return at::from_blob(
      const_cast<void*>(a.data()), sizes, [ref](void*) { delete ref; }, at::TensorOptions().dtype(st));
}

/// One value the user's data yielded, as the model input `input` takes it: numpy arrays of the
/// input's dtype and C order are used in place; other numeric arrays are converted once;
/// objects with __dlpack__ (torch, cupy, jax) come in through DLPack, anything else through
/// numpy.asarray (which takes __array__).
at::Tensor to_tensor(py::handle value, const ValueInfo& input, const std::string& where) {
  const std::string what = where + ", input '" + input.name + "'";
  const auto want = numpy_dtype_of(input.elem_type);
  py::module_ np = py::module_::import("numpy");
  if (!py::isinstance<py::array>(value) && py::hasattr(value, "__dlpack__")) {
    py::object source = py::reinterpret_borrow<py::object>(value);
    // A tensor that requires grad cannot be exported by DLPack; calibration needs its values only.
    if (py::hasattr(source, "requires_grad") && py::bool_(source.attr("requires_grad")) &&
        py::hasattr(source, "detach"))
      source = source.attr("detach")();
    py::object capsule = source.attr("__dlpack__")();
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (!managed) throw py::error_already_set();
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");  // ATen owns it now
    at::Tensor t = at::fromDLPack(managed);
    if (t.is_complex()) throw Error(what + ": complex values cannot feed a model input");
    if (want) {
      const at::ScalarType st = scalar_type_of(py::dtype(*want), what);
      if (t.scalar_type() != st) t = t.to(st);
    }
    return t.contiguous();
  }
  py::object arr = np.attr("asarray")(value);
  py::array a = arr.cast<py::array>();
  const char kind = a.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b')
    throw Error(what + ": numpy dtype " + dtype_name(a.dtype()) +
                " is not numeric (object, complex, string or record arrays cannot feed a model); pass " +
                (want ? *want : std::string("numeric")) + " arrays");
  if (want && dtype_name(a.dtype()) != *want) a = np.attr("asarray")(a, *want).cast<py::array>();
  if (!(a.flags() & py::array::c_style)) a = np.attr("ascontiguousarray")(a).cast<py::array>();
  return tensor_over(a, what);
}

/// The model inputs of one yielded item: an array (single-input models), a dict name -> array,
/// or a tuple/list with one array per input in the model's order.
std::vector<at::Tensor> inputs_of(py::handle item, const std::vector<ValueInfo>& inputs, const std::string& where) {
  std::vector<at::Tensor> out;
  if (py::isinstance<py::dict>(item)) {
    py::dict d = py::reinterpret_borrow<py::dict>(item);
    std::vector<std::string> names;
    for (const auto& v : inputs) names.push_back(v.name);
    for (auto kv : d) {
      const std::string key = py::str(kv.first).cast<std::string>();
      if (std::find(names.begin(), names.end(), key) == names.end()) {
        const std::string near = nearest(key, names);
        std::string listed;
        for (const auto& n : names) listed += (listed.empty() ? "'" : ", '") + printable(n, 80) + "'";
        throw Error(where + ": '" + printable(key, 80) + "' is not an input of the model (its inputs: " + listed + ")" +
                    (near.empty() ? "" : "; did you mean '" + near + "'?"));
      }
    }
    for (const auto& v : inputs) {
      if (!d.contains(v.name))
        throw Error(where + ": no value for the model input '" + v.name + "' (give every input by name)");
      out.push_back(to_tensor(d[py::str(v.name)], v, where));
    }
    return out;
  }
  if (py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) {
    py::sequence s = py::reinterpret_borrow<py::sequence>(item);
    if (s.size() != inputs.size())
      throw Error(where + ": a sequence of " + std::to_string(s.size()) + " values for a model with " +
                  std::to_string(inputs.size()) +
                  " input(s); yield the inputs only (e.g. `(x for x, label in loader)`), or a dict "
                  "name -> array");
    for (std::size_t i = 0; i < inputs.size(); ++i) out.push_back(to_tensor(s[i], inputs[i], where));
    return out;
  }
  if (inputs.size() != 1)
    throw Error(where + ": the model has " + std::to_string(inputs.size()) +
                " inputs; yield a dict name -> array (or a tuple in input order)");
  out.push_back(to_tensor(item, inputs[0], where));
  return out;
}

/// A tensor as a numpy array over the same memory (the array keeps the tensor alive).
py::array to_numpy(at::Tensor t) {
  t = t.detach().to(at::kCPU).contiguous();
  if (t.scalar_type() == at::kBFloat16) t = t.to(at::kFloat);
  std::string dtype;
  switch (t.scalar_type()) {
    case at::kFloat: dtype = "float32"; break;
    case at::kDouble: dtype = "float64"; break;
    case at::kHalf: dtype = "float16"; break;
    case at::kLong: dtype = "int64"; break;
    case at::kInt: dtype = "int32"; break;
    case at::kShort: dtype = "int16"; break;
    case at::kChar: dtype = "int8"; break;
    case at::kByte: dtype = "uint8"; break;
    case at::kBool: dtype = "bool"; break;
    default: throw Error(std::string("an output of type ") + c10::toString(t.scalar_type()) + " has no numpy dtype");
  }
  auto* owner = new at::Tensor(t);
  py::capsule base(owner, [](void* p) { delete static_cast<at::Tensor*>(p); });
  std::vector<py::ssize_t> shape(t.sizes().begin(), t.sizes().end()), strides;
  for (auto s : t.strides()) strides.push_back(s * static_cast<py::ssize_t>(t.element_size()));
  return py::array(py::dtype(dtype), shape, strides, t.data_ptr(), base);
}

// ---------------------------------------------------------------------------------------------
// Python iterables as datasets

/// A Python iterable read as a Dataset. Each open calls iter() on it (or calls it, when it is a
/// function that returns an iterable); a one-shot iterator (a generator) can be read once.
struct PyDataSource {
  std::shared_ptr<PyRef> object;
  std::string label;
  std::shared_ptr<int> opened = std::make_shared<int>(0);
};

class PyDataset final : public Dataset {
 public:
  PyDataset(const PyDataSource& src, const std::vector<ValueInfo>& inputs) : src_(src), inputs_(inputs) {
    py::gil_scoped_acquire gil;
    try {
      py::handle o = src.object->get();
      py::object iterable = py::reinterpret_borrow<py::object>(o);
      const bool factory = !py::hasattr(o, "__iter__") && PyCallable_Check(o.ptr());
      if (factory) iterable = iterable();
      py::iterator it = py::iter(iterable);
      // An iterator is its own iter(): reading it a second time would find it spent.
      if (!factory && it.ptr() == iterable.ptr() && (*src.opened)++ > 0)
        throw Error(src.label +
                    " is a one-shot iterator (a generator) and this step reads the data again; pass a list, "
                    "or a function that returns a new iterator, e.g. `lambda: make_batches()`");
      iterator_ = std::make_shared<PyRef>(it);
    } catch (py::error_already_set& e) {
      park_and_unwind(e);
    }
  }
  std::string describe() const override { return src_.label; }
  std::optional<std::int64_t> num_samples() const override { return std::nullopt; }
  std::optional<Batch> next() override {
    py::gil_scoped_acquire gil;
    try {
      check_signals();
      PyObject* item = PyIter_Next(iterator_->get().ptr());
      if (!item) {
        if (PyErr_Occurred()) throw py::error_already_set();
        return std::nullopt;
      }
      py::object held = py::reinterpret_steal<py::object>(item);
      const std::string where = src_.label + " item " + std::to_string(read_++);
      Batch b;
      b.inputs = inputs_of(held, inputs_, where);
      b.source = where;
      return b;
    } catch (py::error_already_set& e) {
      park_and_unwind(e);
    }
  }

 private:
  PyDataSource src_;
  std::vector<ValueInfo> inputs_;
  std::shared_ptr<PyRef> iterator_;
  std::int64_t read_ = 0;
};

std::string path_of(py::handle p) {
  py::module_ os = py::module_::import("os");
  const std::string bytes = os.attr("fsencode")(p).cast<py::bytes>();
  if (bytes.find('\0') != std::string::npos)
    throw Error("path " + printable(bytes) + " contains a NUL character, which no file name can hold");
  return bytes;
}

bool is_path(py::handle p) {
  py::module_ os = py::module_::import("os");
  return py::isinstance<py::str>(p) || py::isinstance<py::bytes>(p) || py::isinstance(p, os.attr("PathLike"));
}

DataSource data_source(py::handle data, const std::string& label) {
  if (data.is_none()) return {};
  if (is_path(data)) return DataSource(path_of(data));
  // One dict is one item (name -> array), not an iterable of its keys.
  py::object items =
      py::isinstance<py::dict>(data) ? py::object(py::make_tuple(data)) : py::reinterpret_borrow<py::object>(data);
  PyDataSource src{std::make_shared<PyRef>(items), label};
  return DataSource(label,
                    [src](const std::vector<ValueInfo>& inputs) { return std::make_unique<PyDataset>(src, inputs); });
}

// ---------------------------------------------------------------------------------------------
// Config from a dict

// A config is at most 3 tables deep; deeper means a mistake, or a dict or list that contains
// itself, which would recurse until the stack ran out.
constexpr int kMaxConfigDepth = 32;

toml::array toml_array(py::handle list, const std::string& key, int depth);

void put(toml::table& t, const std::string& key, py::handle v, const std::string& path, int depth);

std::string utf8_of(py::handle s, const std::string& what) {
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(s.ptr(), &size);
  if (!text) {
    PyErr_Clear();
    throw Error("config dict: " + printable(what, 120) + " is not valid Unicode text (it holds a lone surrogate)");
  }
  return std::string(text, static_cast<std::size_t>(size));
}

std::int64_t int64_of(py::handle v, const std::string& path) {
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow || (x == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    throw Error("config dict: " + printable(path, 120) + " = " + py::repr(v).cast<std::string>().substr(0, 40) +
                " is outside the 64-bit integer range");
  }
  return x;
}

void check_depth(const std::string& path, int depth) {
  if (depth > kMaxConfigDepth)
    throw Error("config dict: " + printable(path, 120) + " is nested more than " + std::to_string(kMaxConfigDepth) +
                " levels deep (does a dict or list contain itself?)");
}

toml::table toml_table(py::handle dict, const std::string& path, int depth) {
  check_depth(path, depth);
  toml::table t;
  for (auto kv : py::reinterpret_borrow<py::dict>(dict)) {
    if (!py::isinstance<py::str>(kv.first))
      throw Error("config dict: key " + py::repr(kv.first).cast<std::string>() +
                  (path.empty() ? "" : " in " + printable(path, 120)) + " is not a string");
    const std::string key = utf8_of(kv.first, "a key" + (path.empty() ? "" : " in " + path));
    put(t, key, kv.second, path.empty() ? key : path + "." + key, depth);
  }
  return t;
}

toml::array toml_array(py::handle list, const std::string& key, int depth) {
  check_depth(key, depth);
  toml::array a;
  for (auto v : py::reinterpret_borrow<py::sequence>(list)) {
    toml::table holder;
    put(holder, "v", v, key + "[]", depth);
    a.push_back(std::move(*holder.get("v")));
  }
  return a;
}

void put(toml::table& t, const std::string& key, py::handle v, const std::string& path, int depth) {
  if (py::isinstance<py::bool_>(v)) t.insert(key, v.cast<bool>());
  else if (py::isinstance<py::int_>(v)) t.insert(key, int64_of(v, path));
  else if (py::isinstance<py::float_>(v)) t.insert(key, v.cast<double>());
  else if (py::isinstance<py::str>(v)) t.insert(key, utf8_of(v, path));
  else if (PyIndex_Check(v.ptr()))
    t.insert(key, int64_of(py::int_(py::reinterpret_borrow<py::object>(v)), path));  // numpy integers
  else if (py::hasattr(v, "__float__") && !py::hasattr(v, "__len__"))
    t.insert(key, py::float_(py::reinterpret_borrow<py::object>(v)).cast<double>());
  else if (py::isinstance<py::dict>(v)) t.insert(key, toml_table(v, path, depth + 1));
  else if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) t.insert(key, toml_array(v, path, depth + 1));
  else
    throw Error("config dict: " + printable(path, 120) + " = " + printable(py::repr(v).cast<std::string>(), 80) +
                " has no TOML equivalent (use str, int, float, bool, list or dict)");
}

Config config_from_dict(const py::dict& d) {
  std::ostringstream text;
  text << toml_table(d, "", 0);
  return Config::from_string(text.str(), "<config dict>");
}

/// A config argument: a Config, a dict of the TOML's keys, or a path to a TOML file.
Config config_of(py::handle c) {
  if (py::isinstance<Config>(c)) return c.cast<Config>();
  if (py::isinstance<py::dict>(c)) return config_from_dict(c.cast<py::dict>());
  return Config::from_file(path_of(c));
}

// ---------------------------------------------------------------------------------------------
// Model and QuantModel

}  // namespace sparsebit::python
