// Runs over several processes (Note [Distributed runs], sparsebit/core/distributed.h).

#include "sparsebit/core/distributed.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
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

#include "sparsebit/core/atomic_file.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/version.h"

namespace sparsebit {

namespace {

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

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

// A list of tensors as bytes: count, then per tensor its dtype, rank, sizes and contiguous data.
std::string pack(const std::vector<at::Tensor>& tensors) {
  std::string out;
  auto put = [&out](const void* p, std::size_t n) { out.append(static_cast<const char*>(p), n); };
  const std::int64_t count = static_cast<std::int64_t>(tensors.size());
  put(&count, sizeof count);
  for (const auto& t0 : tensors) {
    const at::Tensor t = t0.detach().to(at::kCPU).contiguous();
    const std::int64_t dtype = static_cast<std::int64_t>(t.scalar_type()), dims = t.dim();
    put(&dtype, sizeof dtype);
    put(&dims, sizeof dims);
    for (auto d : t.sizes()) put(&d, sizeof d);
    put(t.data_ptr(), t.numel() * t.element_size());
  }
  return out;
}

std::vector<at::Tensor> unpack(const std::uint8_t* p, std::size_t n) {
  std::size_t at_ = 0;
  auto get = [&](void* dst, std::size_t len) {
    if (at_ + len > n) throw Error("internal: a gathered state is truncated");
    std::memcpy(dst, p + at_, len);
    at_ += len;
  };
  std::int64_t count = 0;
  get(&count, sizeof count);
  std::vector<at::Tensor> out;
  for (std::int64_t i = 0; i < count; ++i) {
    std::int64_t dtype = 0, dims = 0;
    get(&dtype, sizeof dtype);
    get(&dims, sizeof dims);
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(dims));
    for (auto& d : sizes) get(&d, sizeof d);
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(dtype)));
    get(t.data_ptr(), t.numel() * t.element_size());
    out.push_back(t);
  }
  return out;
}

std::string first_line(const std::exception& e, std::size_t max = 200) {
  std::string cause = e.what();
  if (auto nl = cause.find('\n'); nl != std::string::npos) cause.resize(nl);
  return cause.substr(0, max);
}

std::string endpoint(const DistributedSettings& s) { return s.master_addr + ":" + std::to_string(s.master_port); }

// LibTorch's client retries a name that does not resolve once a second, warning each time,
// until the timeout: one line now instead.
void check_master_addr_resolves(const DistributedSettings& s) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  const auto deadline = std::chrono::steady_clock::now() + s.timeout;
  for (;;) {
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(s.master_addr.c_str(), nullptr, &hints, &found);
    if (found) ::freeaddrinfo(found);
    if (rc == 0) return;
    if (rc != EAI_AGAIN || std::chrono::steady_clock::now() > deadline)
      throw Error("MASTER_ADDR='" + printable(s.master_addr) + "' does not resolve to an address (" +
                  ::gai_strerror(rc) + "): set it to rank 0's host name or IP address");
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

// What the rendezvous of one rank found, handed from its thread.
struct Joined {
  c10::intrusive_ptr<c10d::Store> store;
  std::vector<std::string> jobs;  // every rank's job description, in rank order
};

std::string describe_job(const JobDescription& job) {
  std::string out = std::string("sparsebit\t") + SPARSEBIT_FP_TORCH + "/" + std::to_string(sdk::kSdkVersionMajor) +
                    "." + std::to_string(sdk::kSdkVersionMinor) + "\n";
  for (const auto& [name, value] : job) out += name + "\t" + value + "\n";
  return out;
}

std::map<std::string, std::string> fields_of(const std::string& description) {
  std::map<std::string, std::string> out;
  std::istringstream in(description);
  for (std::string line; std::getline(in, line);) {
    const auto tab = line.find('\t');
    out[line.substr(0, tab)] = tab == std::string::npos ? "" : line.substr(tab + 1);
  }
  return out;
}

// Every rank checks every rank against rank 0, so all of them stop with the same message.
void check_same_job(const std::vector<std::string>& jobs) {
  const auto root = fields_of(jobs[0]);
  std::string differences;
  for (std::size_t r = 1; r < jobs.size(); ++r) {
    if (jobs[r] == jobs[0]) continue;
    const auto theirs = fields_of(jobs[r]);
    std::set<std::string> names;
    for (const auto& [k, v] : root) names.insert(k);
    for (const auto& [k, v] : theirs) names.insert(k);
    for (const auto& name : names) {
      const auto a = root.find(name);
      const auto b = theirs.find(name);
      const std::string mine = a == root.end() ? "(none)" : a->second, other = b == theirs.end() ? "(none)" : b->second;
      if (mine != other)
        differences += (differences.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + "'s " + name +
                       " is " + printable(other).substr(0, 160) + ", rank 0's " + printable(mine).substr(0, 160);
    }
  }
  if (!differences.empty())
    throw Error("distributed run: the ranks were not given the same job (" + differences +
                "): start every rank with the same command, model, config and data");
}

// std::terminate's message while a rank joins: LibTorch's store client reads on a thread of its
// own and ends the process when the port answers with bytes it cannot parse.
std::string g_join_failure;
void join_terminated() {
  remove_temporary_files();
  const std::string line = "error: " + g_join_failure + "\n";
  [[maybe_unused]] auto n = ::write(2, line.data(), line.size());
  std::_Exit(1);
}

/// Opens the store (rank 0 serves it), waits until every rank has joined and returns it, after
/// checking that every rank runs the same job. Runs on a thread of its own: a port that accepts
/// connections but never answers blocks LibTorch's client with no timeout of its own.
c10::intrusive_ptr<c10d::Store> rendezvous(const DistributedSettings& s, const JobDescription& job) {
  check_master_addr_resolves(s);
  const std::string who = "rank " + std::to_string(s.rank);
  const std::string wrong_port = "is MASTER_PORT rank 0's port, and is rank 0 a sparsebit of the same version?";
  g_join_failure = who + ": the rendezvous store at " + endpoint(s) +
                   " answered with bytes that are not a rendezvous store's: " + wrong_port + " No output was written.";
  // Restored however the join ends: a process that goes on after a failed join (Python) keeps
  // its own handler.
  struct TerminateWhileJoining {
    std::terminate_handler previous = std::set_terminate(join_terminated);
    ~TerminateWhileJoining() { std::set_terminate(previous); }
  } joining;
  auto promise = std::make_shared<std::promise<Joined>>();
  auto future = promise->get_future();
  const std::string mine = describe_job(job);
  std::thread([promise, s, mine] {
    try {
      const auto deadline = std::chrono::steady_clock::now() + s.timeout;
      c10d::TCPStoreOptions opts;
      opts.port = static_cast<std::uint16_t>(s.master_port);
      opts.isServer = s.rank == 0;
      opts.numWorkers = static_cast<std::size_t>(s.world_size);
      opts.waitWorkers = false;
      opts.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(s.timeout);
      Joined j;
      try {
        j.store = c10::make_intrusive<c10d::TCPStore>(s.master_addr, opts);
      } catch (const std::exception& e) {
        throw Error(s.rank == 0 ? "rank 0 cannot open the rendezvous store on port " + std::to_string(s.master_port) +
                                      " (MASTER_PORT): " + first_line(e) + "; choose a free port"
                                : "rank " + std::to_string(s.rank) + " cannot reach rank 0's rendezvous store at " +
                                      endpoint(s) + " within " + std::to_string(s.timeout.count()) +
                                      " s (MASTER_ADDR, MASTER_PORT): " + first_line(e));
      }
      auto key = [](const std::string& what, int rank) { return "sparsebit/" + what + "/" + std::to_string(rank); };
      j.store->set(key("job", s.rank), bytes_of(mine));
      j.store->set(key("joined", s.rank), bytes_of("1"));
      j.store->add("sparsebit/joined", 1);
      while (j.store->add("sparsebit/joined", 0) < s.world_size) {
        if (std::chrono::steady_clock::now() > deadline) {
          std::string missing;
          for (int r = 0; r < s.world_size; ++r)
            if (!j.store->check({key("joined", r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          throw Error("distributed run: rank(s) " + missing + " of " + std::to_string(s.world_size) +
                      " did not join within " + std::to_string(s.timeout.count()) + " s (store at " + endpoint(s) +
                      ", SPARSEBIT_DIST_TIMEOUT sets the wait)");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      for (int r = 0; r < s.world_size; ++r) j.jobs.push_back(string_of(j.store->get(key("job", r))));
      // Rank 0 holds the store: it stays until every rank has read the others' jobs.
      j.store->set(key("compared", s.rank), bytes_of("1"));
      if (s.rank == 0) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        for (int r = 1; r < s.world_size; ++r)
          while (!j.store->check({key("compared", r)}) && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      promise->set_value(std::move(j));
    } catch (const Error&) {
      promise->set_exception(std::current_exception());
    } catch (const std::exception& e) {
      promise->set_exception(
          std::make_exception_ptr(Error("rank " + std::to_string(s.rank) + ": the rendezvous with the store at " +
                                        endpoint(s) + " failed: " + first_line(e) +
                                        "; is MASTER_PORT rank 0's port, and is rank 0 a sparsebit of the same "
                                        "version?")));
    }
  }).detach();
  if (future.wait_for(s.timeout + std::chrono::seconds(15)) != std::future_status::ready)
    throw Error(who + ": the rendezvous store at " + endpoint(s) + " accepted the connection but has not answered in " +
                std::to_string(s.timeout.count() + 15) +
                " s: another program may be listening on MASTER_PORT, or rank 0 is frozen");
  Joined joined = future.get();  // rethrows the rendezvous' error
  check_same_job(joined.jobs);
  return joined.store;
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
    spdlog::error("{}", message);
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
    spdlog::warn("this LibTorch has no NCCL: CUDA tensors are exchanged through Gloo (slower)");
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
  spdlog::default_logger()->set_pattern(prefix + "%^%l%$: %v");
  // The other ranks run the same steps on the same model and would repeat rank 0's messages:
  // they report only errors, unless -v.
  if (settings->rank != 0 && spdlog::get_level() > spdlog::level::debug) spdlog::set_level(spdlog::level::err);
  spdlog::info("joined a run of {} processes (store at {}:{}, timeout {} s)", settings->world_size,
               settings->master_addr, settings->master_port, settings->timeout.count());
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
