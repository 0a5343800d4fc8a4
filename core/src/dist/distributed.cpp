// Runs over several processes (Note [Distributed runs], sparsebit/core/distributed.h).

#include "sparsebit/core/distributed.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(SPARSEBIT_WITH_NCCL)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL  // the header declares the process group only with it
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <dlfcn.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "base/log.h"
#include "dist/rendezvous.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/version.h"

namespace sparsebit {

namespace {

using dist_detail::bytes_of;
using dist_detail::endpoint;
using dist_detail::first_line;
using dist_detail::pack;
using dist_detail::rendezvous;
using dist_detail::string_of;
using dist_detail::unpack;

// LibTorch 2 split the process group into a front and per-device backends; both expose the
// collectives this file calls.
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

int env_int(const char* name, int fallback, int low, int high) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno || *end || x < low || x > high)
    throw Error(std::string("environment variable ") + name + "='" + std::string(v).substr(0, 40) +
                "' is not a whole number from " + std::to_string(low) + " to " + std::to_string(high));
  return static_cast<int>(x);
}

Distributed* g_current = nullptr;
std::unique_ptr<Distributed> g_owned;

}  // namespace

std::optional<DistributedSettings> DistributedSettings::from_env() {
  const int world = env_int("WORLD_SIZE", 1, 1, 1 << 16);
  if (world <= 1) return std::nullopt;
  DistributedSettings s;
  s.world_size = world;
  if (!std::getenv("RANK")) throw Error("WORLD_SIZE=" + std::to_string(world) + " is set but RANK is not");
  s.rank = env_int("RANK", 0, 0, world - 1);
  s.local_rank = env_int("LOCAL_RANK", s.rank, 0, 1 << 16);
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) s.master_addr = a;
  s.master_port = env_int("MASTER_PORT", 29500, 1, 65535);
  s.timeout = std::chrono::seconds(env_int("SPARSEBIT_DIST_TIMEOUT", 300, 1, 7 * 24 * 3600));
  return s;
}

struct Distributed::Impl {
  DistributedSettings s;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<Backend> gloo, nccl;
#if defined(SPARSEBIT_WITH_NCCL) && defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl_group;  // shut down explicitly (LibTorch 2 asks for it)
#endif
  std::int64_t seq = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  struct Started {
    std::int64_t seq;
    std::string what;
    std::chrono::steady_clock::time_point since;
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::deque<Started> in_flight;  // oldest first; guarded by mu
  std::thread watchdog;

  std::string key(const std::string& what, int rank) const { return "sparsebit/" + what + "/" + std::to_string(rank); }
  std::string where() const { return s.master_addr + ":" + std::to_string(s.master_port); }

  std::int64_t beats(int r) { return store->add(key("beat", r), 0); }

  /// Who is to blame for a collective that failed or waits too long.
  std::string culprit(std::int64_t my_seq) {
    try {
      for (int r = 0; r < s.world_size; ++r)
        if (r != s.rank && store->check({key("failed", r)}))
          return "rank " + std::to_string(r) + " failed: " + string_of(store->get(key("failed", r)));
      std::vector<std::int64_t> before(static_cast<std::size_t>(s.world_size));
      for (int r = 0; r < s.world_size; ++r) before[static_cast<std::size_t>(r)] = beats(r);
      std::this_thread::sleep_for(std::chrono::milliseconds(3500));
      std::string stale;
      for (int r = 0; r < s.world_size; ++r)
        if (r != s.rank && beats(r) == before[static_cast<std::size_t>(r)])
          stale += (stale.empty() ? "rank " : ", rank ") + std::to_string(r);
      if (!stale.empty()) return stale + " stopped responding (killed, or frozen)";
      std::string behind;
      for (int r = 0; r < s.world_size; ++r) {
        if (r == s.rank) continue;
        std::string at = store->check({key("at", r)}) ? string_of(store->get(key("at", r))) : "0\tnothing";
        const auto tab = at.find('\t');
        const std::int64_t their = std::stoll(at.substr(0, tab));
        if (their < my_seq)
          behind += (behind.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
                    " has not reached it (it is at collective #" + std::to_string(their) + ", " + at.substr(tab + 1) +
                    ")";
      }
      return behind;
    } catch (const std::exception&) {
      if (s.rank != 0) return "rank 0 is gone (it holds the rendezvous store at " + where() + ")";
      return "";
    }
  }

  [[noreturn]] void die(const std::string& message) {
    logs::error("{}", message);
    remove_temporary_files();
    try {
      store->set(key("seen", s.rank), bytes_of("1"));
    } catch (...) {
    }
    std::_Exit(1);
  }

  void watch() {
    int tick = 0;
    std::unique_lock<std::mutex> lock(mu);
    while (!cv.wait_for(lock, std::chrono::seconds(1), [this] { return stopping; })) {
      lock.unlock();
      try {
        store->add(key("beat", s.rank), 1);
        if (++tick % 2 == 0)
          for (int r = 0; r < s.world_size; ++r)
            if (r != s.rank && store->check({key("failed", r)}))
              die("rank " + std::to_string(r) + " failed: " + string_of(store->get(key("failed", r))) +
                  "; stopping rank " + std::to_string(s.rank));
      } catch (const std::exception&) {
        // The store may close at the very end of a run; a collective that cannot finish is
        // reported below or by the collective itself.
      }
      lock.lock();
      // Gloo reports its own timeout; this catches collectives that block elsewhere (NCCL).
      if (!in_flight.empty() &&
          std::chrono::steady_clock::now() - in_flight.front().since > s.timeout + std::chrono::seconds(15)) {
        const std::int64_t seq_now = in_flight.front().seq;
        const std::string what = in_flight.front().what;
        lock.unlock();
        const std::string who = culprit(seq_now);
        die("collective #" + std::to_string(seq_now) + " (" + what + ") waited more than " +
            std::to_string(s.timeout.count()) + " s" + (who.empty() ? "" : ": " + who) + "; stopping rank " +
            std::to_string(s.rank));
      }
    }
  }

  [[noreturn]] void failed(std::int64_t n, const std::string& what, const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      in_flight.clear();
    }
    const std::string who = culprit(n);
    std::string cause = e.what();
    if (auto nl = cause.find('\n'); nl != std::string::npos) cause.resize(nl);
    throw Error("distributed run: collective #" + std::to_string(n) + " (" + what + ") failed on rank " +
                std::to_string(s.rank) + ": " + (who.empty() ? cause.substr(0, 300) : who));
  }

  /// Numbers the collective `launch` starts, records it for the others, and keeps its work
  /// until finish() waits for it. Every process starts the same collectives in the same order.
  template <class Launch>
  void start(const std::string& what, Launch&& launch) {
    const std::int64_t n = ++seq;
    c10::InferenceMode normal_tensors(false);  // the backends update buffers in place on their threads
    try {
      store->set(key("at", s.rank), bytes_of(std::to_string(n) + "\t" + what));
    } catch (const std::exception&) {
      throw Error("distributed run: rank 0 is gone (it holds the rendezvous store at " + where() + ") before " + what);
    }
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = launch();
    } catch (const std::exception& e) {
      failed(n, what, e);
    }
    std::lock_guard<std::mutex> lock(mu);
    in_flight.push_back({n, what, std::chrono::steady_clock::now(), work});
  }

  /// Waits for every started collective, oldest first.
  void finish() {
    for (;;) {
      Started next;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (in_flight.empty()) return;
        next = in_flight.front();
      }
      try {
        next.work->wait();
      } catch (const std::exception& e) {
        failed(next.seq, next.what, e);
      }
      std::lock_guard<std::mutex> lock(mu);
      in_flight.pop_front();
    }
  }

  template <class Launch>
  void collective(const std::string& what, Launch&& launch) {
    start(what, std::forward<Launch>(launch));
    finish();
  }

  Backend& group_for(const at::Tensor& t) {
    if (t.is_cuda() && nccl) return *nccl;
    return *gloo;
  }
};

Distributed::Distributed(const DistributedSettings& settings, const std::string& device, const JobDescription& job)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.s = settings;
  const auto timeout_ms = std::chrono::duration_cast<std::chrono::milliseconds>(settings.timeout);
  m.store = rendezvous(settings, job);
  auto gloo_opts = c10d::ProcessGroupGloo::Options::create(timeout_ms);
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    gloo_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  else if (settings.master_addr == "127.0.0.1" || settings.master_addr == "localhost")
    gloo_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else gloo_opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  m.gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", m.store),
                                                       settings.rank, settings.world_size, gloo_opts);
  if (at::Device(device).is_cuda()) {
#if defined(SPARSEBIT_WITH_NCCL)
    auto nccl_opts = c10d::ProcessGroupNCCL::Options::create();
    // Longer than ours: the watchdog names the rank before NCCL's own aborts the process.
    nccl_opts->timeout = timeout_ms + std::chrono::seconds(120);
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", m.store),
                                                            settings.rank, settings.world_size, nccl_opts);
    m.nccl = nccl;
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
    m.nccl_group = nccl;
#endif
#else
    logs::warn("this LibTorch has no NCCL: CUDA tensors are exchanged through Gloo (slower)");
#endif
  }
  m.watchdog = std::thread([&m] { m.watch(); });
}

Distributed::~Distributed() {
  Impl& m = *impl_;
  try {
    m.store->set(m.key("done", m.s.rank), bytes_of("1"));
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopping = true;
  }
  m.cv.notify_all();
  if (m.watchdog.joinable()) m.watchdog.join();
#if defined(SPARSEBIT_WITH_NCCL) && defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
  try {
    if (m.nccl_group) m.nccl_group->shutdown();
  } catch (...) {
  }
#endif
  if (m.s.rank != 0) return;
  // The store lives here: wait (briefly) until every rank is done with it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  try {
    for (int r = 1; r < m.s.world_size; ++r)
      while (!m.store->check({m.key("done", r)}) && !m.store->check({m.key("seen", r)}) &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } catch (...) {
  }
}

int Distributed::rank() const { return impl_->s.rank; }
int Distributed::world_size() const { return impl_->s.world_size; }
const DistributedSettings& Distributed::settings() const { return impl_->s; }

void Distributed::all_reduce_sum(std::vector<at::Tensor>& tensors, const std::string& what) {
  if (tensors.empty()) return;
  c10::InferenceMode normal_tensors(false);
  // One flat buffer per dtype and device: one collective for many small tensors.
  std::vector<bool> done(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (done[i]) continue;
    std::vector<std::size_t> group;
    for (std::size_t j = i; j < tensors.size(); ++j)
      if (!done[j] && tensors[j].scalar_type() == tensors[i].scalar_type() &&
          tensors[j].device() == tensors[i].device()) {
        group.push_back(j);
        done[j] = true;
      }
    std::vector<at::Tensor> flat_parts;
    for (auto j : group) flat_parts.push_back(tensors[j].detach().reshape({-1}));
    std::vector<at::Tensor> buffer{at::cat(flat_parts)};
    impl_->collective(what, [&] { return impl_->group_for(buffer[0]).allreduce(buffer); });
    std::int64_t offset = 0;
    for (auto j : group) {
      const std::int64_t n = tensors[j].numel();
      tensors[j].detach().copy_(buffer[0].narrow(0, offset, n).view_as(tensors[j]));
      offset += n;
    }
  }
}

void Distributed::start_sum(const at::Tensor& flat, const std::string& what) {
  std::vector<at::Tensor> buffer{flat};
  impl_->start(what, [&] { return impl_->group_for(flat).allreduce(buffer); });
}

void Distributed::finish_sums() { impl_->finish(); }

namespace {

// The sum over the processes as an autograd op: the gradient of each process's input is the
// sum of every process's gradient of the result (Note [Batch statistics over processes]).
struct SumOverProcesses : torch::autograd::Function<SumOverProcesses> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& t, Distributed* group,
                            const std::string& what) {
    ctx->saved_data["what"] = what;
    ctx->saved_data["group"] = reinterpret_cast<std::int64_t>(group);
    std::vector<at::Tensor> sum{t.detach().clone()};
    group->all_reduce_sum(sum, what);
    return sum[0];
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<Distributed*>(ctx->saved_data["group"].toInt());
    std::vector<at::Tensor> sum{grads[0].defined() ? grads[0].detach().clone() : at::Tensor()};
    if (!sum[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    group->all_reduce_sum(sum, "gradient of " + ctx->saved_data["what"].toStringRef());
    return {sum[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor Distributed::sum_with_gradient(const at::Tensor& t, const std::string& what) {
  return SumOverProcesses::apply(t, this, what);
}

std::vector<std::vector<at::Tensor>> Distributed::all_gather(const std::vector<at::Tensor>& mine,
                                                             const std::string& what) {
  c10::InferenceMode normal_tensors(false);
  const std::string bytes = pack(mine);
  const int w = impl_->s.world_size;
  std::vector<at::Tensor> len{at::tensor({static_cast<std::int64_t>(bytes.size())}, at::kLong)};
  std::vector<std::vector<at::Tensor>> lens(1);
  for (int r = 0; r < w; ++r) lens[0].push_back(at::empty({1}, at::kLong));
  impl_->collective(what + " (sizes)", [&] { return impl_->gloo->allgather(lens, len); });
  std::int64_t longest = 0;
  for (const auto& l : lens[0]) longest = std::max(longest, l.item<std::int64_t>());
  std::vector<at::Tensor> data{at::zeros({longest}, at::kByte)};
  std::memcpy(data[0].data_ptr(), bytes.data(), bytes.size());
  std::vector<std::vector<at::Tensor>> all(1);
  for (int r = 0; r < w; ++r) all[0].push_back(at::empty({longest}, at::kByte));
  impl_->collective(what, [&] { return impl_->gloo->allgather(all, data); });
  std::vector<std::vector<at::Tensor>> out;
  for (int r = 0; r < w; ++r)
    out.push_back(unpack(all[0][static_cast<std::size_t>(r)].data_ptr<std::uint8_t>(),
                         static_cast<std::size_t>(lens[0][static_cast<std::size_t>(r)].item<std::int64_t>())));
  return out;
}

void Distributed::barrier(const std::string& what) {
  std::vector<at::Tensor> one{at::ones({1}, at::kFloat)};
  impl_->collective(what, [&] { return impl_->gloo->allreduce(one); });
}

void Distributed::report_failure(const std::string& message) noexcept {
  Impl& m = *impl_;
  try {
    m.store->set(m.key("failed", m.s.rank), bytes_of(message.substr(0, 400)));
    if (m.s.rank != 0) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (int r = 1; r < m.s.world_size; ++r)
      while (!m.store->check({m.key("seen", r)}) && !m.store->check({m.key("done", r)}) &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } catch (...) {
  }
}

ThreadChoice choose_threads(int requested) {
  ThreadChoice c;
  c.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  c.threads = requested > 0 ? requested : c.cores;
  if (const char* local = std::getenv("LOCAL_WORLD_SIZE"); local && requested <= 0 && std::atoi(local) > 1)
    c.threads = std::max(1, c.cores / std::atoi(local));
  c.capped = c.threads > c.cores;
  c.threads = std::min(c.threads, c.cores);
  return c;
}

bool use_one_blas_thread() {
  if (std::getenv("OPENBLAS_NUM_THREADS")) return false;
  using SetThreads = void (*)(int);
  auto* set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (!set) return false;
  set(1);
  return true;
}

Distributed* distributed() { return g_current; }

Distributed* init_distributed(const std::string& device, const std::function<JobDescription()>& describe_job) {
  if (g_current) return g_current;
  const auto settings = DistributedSettings::from_env();
  if (!settings) return nullptr;
  if (at::Device(device).is_cuda() && !at::Device(device).has_index()) {
    const int visible = static_cast<int>(at::detail::getCUDAHooks().getNumGPUs());
    if (visible > 1)
      c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(
          at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(settings->local_rank % visible)));
  }
  g_owned = std::make_unique<Distributed>(*settings, device, describe_job ? describe_job() : JobDescription{});
  g_current = g_owned.get();
  const std::string prefix = "[rank " + std::to_string(settings->rank) + "] ";
  sdk::set_log_prefix(prefix);
  // The other ranks run the same steps on the same model and would repeat rank 0's messages:
  // they report only errors, unless -v.
  if (settings->rank != 0 && !logs::debug_enabled()) sdk::set_log_level(sdk::LogLevel::kError);
  logs::info("joined a run of {} processes (store at {}:{}, timeout {} s)", settings->world_size, settings->master_addr,
             settings->master_port, settings->timeout.count());
  return g_current;
}

void shutdown_distributed() {
  g_current = nullptr;
  g_owned.reset();
}

bool writes_outputs() { return !g_current || g_current->is_root(); }

void report_distributed_failure(const std::string& message) noexcept {
  if (g_current) g_current->report_failure(message);
}

}  // namespace sparsebit
