#pragma once
// Note [Mapped weights]
// Large tensors of external data are not read into the heap: the data file is mapped
// (private, copy-on-write: a pass that scales a weight in place changes our copy only) and the
// tensor points into the mapping, which lives as long as any tensor does. Pages are read when a
// layer first touches them and, being clean file pages, can be given back with page_out() once
// the layer is done (layerwise calibration, export): a model is then held about one layer at a
// time instead of all at once. page_out() is a hint (MADV_PAGEOUT): pages a pass wrote stay,
// nothing is lost, and on a kernel without it nothing happens. The file must not be truncated
// while the run lasts (Sparsebit's own outputs replace files by rename, which is safe).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <memory>

#include "sparsebit/sdk/export.h"

namespace sparsebit {

/// A tensor of `shape` and `dtype` on bytes [offset, offset + nbytes) of `file`, or an undefined
/// tensor where mapping does not apply (offset not aligned to the element size, or mmap failed).
at::Tensor map_tensor(const std::filesystem::path& file, std::int64_t offset, at::IntArrayRef shape,
                      at::ScalarType dtype);

/// Note [Spilled weights]
/// A weight a pass wrote lives in the heap, beside the mapped one it replaced, so a pass that
/// rewrites every layer of a large model would hold a second copy of it. spill() writes such a
/// tensor to an unnamed file in the temporary folder and returns it mapped from there: its pages
/// are then file pages as a mapped weight's are, outside the process's resident memory until
/// read, and page_out() gives them back. The file disappears with the last tensor on it. Where
/// the file cannot be written (no space), the heap tensor is returned unchanged.
SPARSEBIT_API at::Tensor spill(const at::Tensor& t);  // exported for its test

/// Whether `t`'s bytes lie in a mapping (map_tensor or spill).
SPARSEBIT_API bool is_mapped(const at::Tensor& t);

/// Gives the whole pages under a mapped tensor's bytes back to the system (Note [Mapped
/// weights]); other tensors are left alone.
void page_out(const at::Tensor& t);

}  // namespace sparsebit
