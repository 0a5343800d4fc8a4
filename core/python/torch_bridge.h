#pragma once
// Tensors between the Python torch and the LibTorch the package links (torch_bridge.cpp): the
// same at::Tensor on both sides, autograd history included, so a Python training loop can
// backpropagate through the C++ quantizers (Note [One LibTorch]).

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>

namespace sparsebit::python {

namespace py = pybind11;

/// Imports torch and checks that it runs on the LibTorch this package links; throws an Error
/// that says which build each side has and what to do otherwise. `what` names the call.
void require_linked_torch(const std::string& what);
/// Whether the torch imported in this process (if any) is the linked LibTorch.
bool linked_torch_imported();
/// A tensor as a torch.Tensor sharing it (autograd history and requires_grad included).
py::object to_torch(const at::Tensor& t);
/// The at::Tensor behind a torch.Tensor of the linked build, or nullopt for anything else.
std::optional<at::Tensor> torch_tensor_of(py::handle obj);

}  // namespace sparsebit::python
