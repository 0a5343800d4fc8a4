// Calls from Python into the pipeline (calls.h).

#include "calls.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <mutex>

#include "sparsebit/sdk/log.h"

namespace sparsebit::python {
namespace {

/// The Python exception a callback raised during the current call. Not per thread: a data
/// loader may be called from the thread that reads batches ahead (sparsebit::Prefetcher).
std::mutex parked_mutex;
std::unique_ptr<py::error_already_set> parked_error;

// Note [Forked after a run]
// GNU OpenMP keeps its worker threads across parallel regions and cannot start them again in a
// child of fork(): the child's next parallel region waits forever for threads that do not exist
// there. A child forked after this process computed on several threads therefore computes on
// one, and says so once; with one thread OpenMP starts no workers.
std::atomic<bool> ran_on_threads{false};
std::atomic<bool> forked_after_threads{false};

}  // namespace

[[noreturn]] void park_and_unwind(py::error_already_set& e) {
  {
    std::lock_guard<std::mutex> lock(parked_mutex);
    if (!parked_error) parked_error = std::make_unique<py::error_already_set>(std::move(e));
  }
  throw PythonRaised();
}

void on_fork_child() noexcept {
  if (ran_on_threads.load()) forked_after_threads.store(true);
}

void stay_on_one_thread_if_forked() {
  if (!forked_after_threads.load() || at::get_num_threads() == 1) return;
  at::set_num_threads(1);
  static std::once_flag said;
  std::call_once(said, [] {
    sdk::log_warn(
        "this process was forked after sparsebit computed on several threads, which OpenMP cannot start again "
        "in a child of fork(): it runs on one thread; start worker processes with multiprocessing's 'spawn' or "
        "'forkserver' method to use every core");
  });
}

void begin_call() {
  stay_on_one_thread_if_forked();
  if (at::get_num_threads() > 1) ran_on_threads.store(true);
  std::lock_guard<std::mutex> lock(parked_mutex);
  parked_error.reset();
}

std::unique_ptr<py::error_already_set> take_parked() {
  std::lock_guard<std::mutex> lock(parked_mutex);
  return std::move(parked_error);
}

/// With the GIL held: raises KeyboardInterrupt (parked) when Ctrl-C was pressed.
void check_signals() {
  if (PyErr_CheckSignals() != 0) {
    py::error_already_set e;
    park_and_unwind(e);
  }
}

ProgressFn progress_of(const py::object& fn) {
  auto ref = fn.is_none() ? nullptr : std::make_shared<PyRef>(fn);
  return [ref](std::int64_t done, std::int64_t total) {
    py::gil_scoped_acquire gil;
    try {
      check_signals();
      if (ref)
        py::reinterpret_borrow<py::object>(ref->get())(done, total >= 0 ? py::int_(total) : py::object(py::none()));
    } catch (py::error_already_set& e) {
      park_and_unwind(e);
    }
  };
}

StepProgressFn step_progress_of(const py::object& fn) {
  auto ref = fn.is_none() ? nullptr : std::make_shared<PyRef>(fn);
  return [ref](const std::string& step, std::int64_t done, std::int64_t total, const std::string&) {
    py::gil_scoped_acquire gil;
    try {
      check_signals();
      if (ref && !step.empty())
        py::reinterpret_borrow<py::object>(ref->get())(step, done,
                                                       total >= 0 ? py::int_(total) : py::object(py::none()));
    } catch (py::error_already_set& e) {
      park_and_unwind(e);
    }
  };
}

py::object json_loads(const std::string& text) { return py::module_::import("json").attr("loads")(text); }

}  // namespace sparsebit::python
