#include "graph/run_isolated.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <exception>

namespace sparsebit {

std::string run_isolated(const onnx::ModelProto& proto, const std::function<onnx::ModelProto(onnx::ModelProto&)>& work,
                         int& status) {
  std::string input;
  if (!proto.SerializeToString(&input)) return "0the model cannot be re-serialized";
  int fds[2];
  if (pipe(fds) != 0) return "0cannot create a pipe";
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return "0cannot fork";
  }
  if (pid == 0) {  // child: work, write "1" + model or "0" + message, exit without cleanup
    close(fds[0]);
    // A crash here is reported by the parent; no inherited crash handler should run.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, SIG_DFL);
    std::string out;
    try {
      onnx::ModelProto m;
      m.ParseFromString(input);
      out = "1" + work(m).SerializeAsString();
    } catch (const std::exception& e) {
      out = std::string("0") + e.what();
    }
    for (std::size_t done = 0; done < out.size();) {
      const ssize_t n = write(fds[1], out.data() + done, out.size() - done);
      if (n <= 0) _exit(3);
      done += static_cast<std::size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string result;
  char buf[1 << 16];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) result.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) result.clear();
  return result;
}

}  // namespace sparsebit
