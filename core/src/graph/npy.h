#pragma once
// The .npy reading the datasets share with read_npy (npy.cpp).

#include <ATen/core/Tensor.h>

#include <string>

namespace sparsebit {

/// read_npy, with the data of files of 1 MiB or more mapped instead of read (Note [Mapped
/// weights]): a batch's pages are read when first touched, so samples a process skips or
/// another process takes are never read (Note [Distributed runs]).
at::Tensor map_npy(const std::string& path);

}  // namespace sparsebit
