#pragma once
/// \file
/// Runs spread over several processes, on one host or several (docs/DISTRIBUTED.md), on
/// LibTorch's c10d: a TCPStore for the rendezvous, ProcessGroupGloo for CPU tensors and
/// ProcessGroupNCCL for CUDA tensors where LibTorch has it.
///
/// Note [Distributed runs]
/// Every process runs the same pipeline on the same model and config and makes the same
/// decisions; only the data is divided. Calibration: process r takes batches r, r + W, r + 2W,
/// ... of the one batch sequence a single process would see (so every batch is computed exactly
/// as it would be alone), and observers merge their states in rank order (Note [Distributed
/// observers], observer.h); the parameters then equal one process's (bit for bit for minmax).
/// Layerwise modes cache each process's batches and merge at every layer (GPTQ's Hessians
/// too). QAT: each global batch is cut into W slices, each process backpropagates its slice
/// weighted by its share of the samples, and gradients are summed, so a step equals one
/// process's step on the whole batch up to summation order. Only rank 0 writes files; every
/// process logs with its rank.
///
/// Failures: each collective is numbered; before it, a process records its number and name in
/// the store, and a watchdog thread beats there every second. A process that fails records its
/// message; one whose collective fails or waits longer than the timeout names the rank that
/// failed, stopped beating (killed or frozen) or never reached the collective, removes its
/// temporary files and exits with status 1. Rank 0 holds the store. At the rendezvous every rank
/// compares its job with rank 0's (Note [Same job on every rank], pipeline.cpp), and a port that
/// answers garbage or nothing ends in one line rather than a crash or a wait without end.
///
///     sparsebit::init_distributed("cpu");          // from RANK, WORLD_SIZE, MASTER_ADDR, ...
///     if (auto* d = sparsebit::distributed()) ...  // null: one process

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sparsebit/sdk/export.h"

namespace sparsebit {

struct SPARSEBIT_API DistributedSettings {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// How long a process waits for the others at a collective or at the rendezvous.
  std::chrono::seconds timeout{300};
  /// From RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and SPARSEBIT_DIST_TIMEOUT
  /// (seconds); nullopt when WORLD_SIZE is unset or 1. Malformed values are an error naming
  /// the variable.
  static std::optional<DistributedSettings> from_env();
};

/// What a rank was asked to do, as (name, value) pairs ("model", "calibration count", ...):
/// every rank must be given the same, and the rendezvous names the names whose values differ.
using JobDescription = std::vector<std::pair<std::string, std::string>>;

class SPARSEBIT_API Distributed {
 public:
  /// Joins the group: waits until every rank has reached the store and checks that every rank
  /// describes the same `job` (and runs the same sparsebit), then builds the process groups.
  /// `device` is the run's device ("cpu", "cuda", "cuda:N").
  Distributed(const DistributedSettings& settings, const std::string& device, const JobDescription& job = {});
  ~Distributed();
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;

  int rank() const;
  int world_size() const;
  bool is_root() const { return rank() == 0; }
  const DistributedSettings& settings() const;

  /// Sums `tensors` in place over all processes (all on the CPU, or all on the run's GPU).
  void all_reduce_sum(std::vector<at::Tensor>& tensors, const std::string& what);
  /// Starts summing `flat` in place over all processes and returns at once; finish_sums()
  /// waits for every sum started so far (gradient buckets during backward). Every process
  /// starts the same sums in the same order.
  void start_sum(const at::Tensor& flat, const std::string& what);
  void finish_sums();
  /// The sum of `t` over all processes as a differentiable op: in backward, each process's
  /// gradient is the sum of every process's gradient of the result.
  at::Tensor sum_with_gradient(const at::Tensor& t, const std::string& what);
  /// Every process's `mine`, in rank order (any dtypes and devices; returned on the CPU).
  std::vector<std::vector<at::Tensor>> all_gather(const std::vector<at::Tensor>& mine, const std::string& what);
  /// Waits for every process.
  void barrier(const std::string& what);
  /// Records that this process is failing with `message`, for the others to report; rank 0
  /// waits a few seconds for them to read it (the store lives in its process).
  void report_failure(const std::string& message) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// This process's group, or null in a single-process run.
SPARSEBIT_API Distributed* distributed();
/// Joins the group the environment describes, once per process; a no-op returning null when
/// WORLD_SIZE is unset or 1. Logs carry the rank from then on. With `device` "cuda" and several
/// GPUs visible, GPU LOCAL_RANK becomes this process's current one (what "cuda" means).
/// `describe_job` is called only when there is a group to join (it may read whole files).
SPARSEBIT_API Distributed* init_distributed(const std::string& device,
                                            const std::function<JobDescription()>& describe_job = nullptr);
/// Leaves the group (at the end of a run; the CLI calls it before exiting).
SPARSEBIT_API void shutdown_distributed();
/// Whether this process writes the outputs (rank 0, or a single process).
SPARSEBIT_API bool writes_outputs();
/// Records a failure for the other processes (no-op in a single-process run).
SPARSEBIT_API void report_distributed_failure(const std::string& message) noexcept;

/// Note [Threads per process]
/// The LibTorch threads one process uses: `requested` when positive, at most the machine's
/// cores (more only cost time); otherwise all cores, shared out among the workers of this host
/// when LOCAL_WORLD_SIZE (set by --nproc and by torchrun) says there are several. The command's
/// --threads and Python's set_threads() and import both take it from here, so a worker gets the
/// same share whichever host started it.
struct ThreadChoice {
  int threads = 1;
  int cores = 1;
  bool capped = false;  ///< `requested` was more than the cores
};
SPARSEBIT_API ThreadChoice choose_threads(int requested);

/// Note [One thread pool]
/// Debian's LibTorch multiplies matrices with the system's BLAS. OpenBLAS's pthread build keeps a
/// second pool of threads beside ATen's OpenMP one, and each pool spins for a while after its
/// work, on the cores the other then waits for. On the 2-core machine of bench/RESULTS.md the
/// weight-only passes, made of many small products, ran 2.5x-3.5x slower with both pools busy
/// (nanoGPT's layout: AWQ 7.4 s -> 1.6 s, GPTQ 2.5 s -> 0.9 s with one BLAS thread; a 43 M
/// decoder: AWQ 147 s -> 112 s, GPTQ 43 s -> 36 s), and convolution networks ran no slower
/// (ResNet-18, PP-OCRv4's recognizer). This gives OpenBLAS one thread, leaving the parallel
/// work to ATen's, unless OPENBLAS_NUM_THREADS chooses; true when it did. The `sparsebit`
/// command calls it; the library leaves it to the application, whose thread pools they are (a
/// LibTorch on MKL, as PyTorch's own, has no OpenBLAS: nothing changes). Products split over
/// other thread counts round otherwise, so a program that compares its numbers with the
/// command's calls it too. One large product then runs on one core: code whose time is in a few
/// of them splits them over ATen's threads (AWQ's search does).
SPARSEBIT_API bool use_one_blas_thread();

}  // namespace sparsebit
