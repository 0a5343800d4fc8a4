// `--nproc N`: the CLI starts N copies of itself as the workers of one distributed run (Note
// [Distributed runs], sparsebit/core/distributed.h) and watches them: when one fails or dies,
// the others are stopped and the run fails with a message naming the worker's rank.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spdlog/fmt/fmt.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit::cli {
namespace {

std::vector<std::string> g_argv;
volatile sig_atomic_t g_stop_signal = 0;

void on_signal(int sig) { g_stop_signal = sig; }

/// A port no one listens on now (the store binds it a moment later).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error("--nproc: cannot open a socket to find a free port for the workers' rendezvous");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw Error("--nproc: cannot find a free local port for the workers' rendezvous; set MASTER_PORT");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
  }
  return "ended with status " + std::to_string(status);
}

}  // namespace

void remember_command_line(int argc, char** argv) { g_argv.assign(argv, argv + argc); }

std::optional<int> launch_workers(int nproc) {
  if (nproc <= 1 || std::getenv("WORLD_SIZE")) return std::nullopt;  // one process, or a worker already
  // A few workers per core still make progress (and test a distributed run on a small machine);
  // hundreds only thrash, each with its own copy of the model.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int most = std::max(8, 4 * cores);
  if (nproc > most)
    throw Error("--nproc " + std::to_string(nproc) + " is more workers than this machine's " + std::to_string(cores) +
                " cores can run (at most " + std::to_string(most) + "; on GPUs: one worker per GPU)");
  const char* port_env = std::getenv("MASTER_PORT");
  const std::string port = port_env && *port_env ? port_env : std::to_string(free_port());
  sparsebit::sdk::log_info(fmt::format("starting {} worker processes (rendezvous on 127.0.0.1:{})", nproc, port));
  std::vector<char*> args;
  for (auto& a : g_argv) args.push_back(a.data());
  args.push_back(nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);

  std::vector<pid_t> pids;
  const pid_t parent = ::getpid();
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) throw Error("--nproc: cannot start worker " + std::to_string(rank) + ": " + std::strerror(errno));
    if (pid == 0) {
      // A worker dies with the command that started it (SIGKILL included): it never goes on to
      // write outputs for a run its caller already saw fail. SIGTERM, so its temporaries go too.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) std::_Exit(128 + SIGTERM);  // the parent died before prctl
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      ::execv("/proc/self/exe", args.data());
      std::fprintf(stderr, "error: --nproc: cannot start worker %d: %s\n", rank, std::strerror(errno));
      std::_Exit(127);
    }
    pids.push_back(pid);
  }

  // Wait for every worker; the first failure stops the rest.
  std::string failure;
  std::size_t running = pids.size();
  auto stop_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) {
        ::kill(p, sig);
        ::kill(p, SIGCONT);  // a frozen worker handles the signal too
      }
  };
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      for (std::size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] != done) continue;
        pids[r] = -1;
        --running;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && failure.empty() && !g_stop_signal) {
          failure = "worker rank " + std::to_string(r) + " (pid " + std::to_string(done) + ") " +
                    describe_status(status) + "; the other workers were stopped and no output was written";
          stop_all(SIGTERM);
          deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        }
      }
      continue;
    }
    if (g_stop_signal && deadline == std::chrono::steady_clock::time_point::max()) {
      stop_all(g_stop_signal);
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
    if (std::chrono::steady_clock::now() > deadline) stop_all(SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (g_stop_signal) return 128 + g_stop_signal;
  if (!failure.empty()) {
    sparsebit::sdk::log_error(fmt::format("{}", failure));
    return 1;
  }
  return 0;
}

}  // namespace sparsebit::cli
