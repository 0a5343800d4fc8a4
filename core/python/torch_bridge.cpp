// Tensors between the Python torch and the linked LibTorch (torch_bridge.h).
//
// Note [One LibTorch]
// A torch.Tensor is an at::Tensor of the LibTorch its torch package was built with. When that is
// the LibTorch this package links (Debian's python3-torch beside libtorch-dev, or a build of the
// package against the torch in use), both sides hold the same tensor: forward() can take the
// user's tensors and give back outputs whose autograd history runs through the C++ quantizers,
// and parameters() hands torch.optim the very tensors the executor computes with. torch's
// Python class registry lives in libtorch_python: it is set in our copy only when the imported
// torch loaded that same library, which is how a different build (a pip wheel beside a
// system LibTorch) is told apart; with one, tensors still cross as copies (numpy, DLPack) for
// inference, and training from Python is refused with the reason.

#include "torch_bridge.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/version.h>

#include "sparsebit/sdk/error.h"

namespace sparsebit::python {

bool linked_torch_imported() {
  py::module_::import("torch");
  return THPVariableClass != nullptr;
}

void require_linked_torch(const std::string& what) {
  if (linked_torch_imported()) return;
  py::module_ torch = py::module_::import("torch");
  throw Error(what + " trains through the quantizers from Python, which needs the torch imported here (" +
              py::str(torch.attr("__version__")).cast<std::string>() + " from " +
              py::str(torch.attr("__file__")).cast<std::string>() + ") to be the LibTorch this package links (" +
              TORCH_VERSION +
              "); they differ. Use the torch of the same build (on Debian: python3-torch from "
              "/usr/bin/python3), or train with `sparsebit qat` / sparsebit.qat()");
}

py::object to_torch(const at::Tensor& t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(t)); }

std::optional<at::Tensor> torch_tensor_of(py::handle obj) {
  if (THPVariableClass == nullptr || !THPVariable_Check(obj.ptr())) return std::nullopt;
  return THPVariable_Unpack(obj.ptr());
}

}  // namespace sparsebit::python
