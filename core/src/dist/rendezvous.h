#pragma once
// Joining a run over several processes (rendezvous.cpp), and the small helpers distributed.cpp
// shares with it: bytes on the wire.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "sparsebit/core/distributed.h"

namespace sparsebit::dist_detail {

inline std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string string_of(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }
inline std::string endpoint(const DistributedSettings& s) {
  return s.master_addr + ":" + std::to_string(s.master_port);
}
/// A list of tensors as bytes: count, then per tensor its dtype, rank, sizes and contiguous data.
std::string pack(const std::vector<at::Tensor>& tensors);
/// The tensors `pack` wrote into `n` bytes at `p`.
std::vector<at::Tensor> unpack(const std::uint8_t* p, std::size_t n);
/// The first line of an exception's message, at most `max` bytes.
std::string first_line(const std::exception& e, std::size_t max = 200);

/// Joins the run's store (rank 0 serves it) within the settings' timeout, and checks that every
/// rank describes the same job; a rank that cannot join ends with one line naming the cause.
c10::intrusive_ptr<c10d::Store> rendezvous(const DistributedSettings& s, const JobDescription& job);

}  // namespace sparsebit::dist_detail
