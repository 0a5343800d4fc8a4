// Joining a run over several processes: the rendezvous store and the check that every process
// runs the same job (Note [Same job on every rank] in pipeline/pipeline.cpp).

#include "dist/rendezvous.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "sparsebit/core/atomic_file.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/version.h"

namespace sparsebit::dist_detail {

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

std::string first_line(const std::exception& e, std::size_t max) {
  std::string cause = e.what();
  if (auto nl = cause.find('\n'); nl != std::string::npos) cause.resize(nl);
  return cause.substr(0, max);
}

namespace {

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
}  // namespace

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
}  // namespace sparsebit::dist_detail
