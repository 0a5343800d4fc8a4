#pragma once
// Calls from Python into the pipeline (Note [Python calls] in module.cpp): the GIL released while
// C++ runs, Python exceptions parked while C++ unwinds, Ctrl-C, references to Python objects that
// any thread may drop.

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "sparsebit/core/session.h"
#include "sparsebit/sdk/error.h"

namespace sparsebit::python {

namespace py = pybind11;

/// Thrown through C++ in place of a parked Python exception.
struct PythonRaised : Error {
  PythonRaised() : Error("interrupted by a Python exception") {}
};

/// Parks `e` (the first one of the call wins) and unwinds C++ with PythonRaised.
[[noreturn]] void park_and_unwind(py::error_already_set& e);

/// For pthread_atfork (Note [Forked after a run]).
void on_fork_child() noexcept;
void stay_on_one_thread_if_forked();

/// Before a call: forgets any parked exception, notes whether this process computes on threads.
void begin_call();
/// The exception a callback parked during the call, if any.
std::unique_ptr<py::error_already_set> take_parked();

/// Runs `f` without the GIL; a Python exception parked meanwhile is raised as itself.
template <class F>
auto without_gil(F&& f) -> decltype(f()) {
  begin_call();
  try {
    py::gil_scoped_release released;
    return f();
  } catch (...) {
    if (auto e = take_parked()) throw py::error_already_set(std::move(*e));
    throw;
  }
}

/// With the GIL held: raises KeyboardInterrupt (parked) when Ctrl-C was pressed.
void check_signals();

/// A reference to a Python object that C++ may drop on any thread.
struct PyRef {
  PyObject* object;
  explicit PyRef(py::handle h) : object(h.inc_ref().ptr()) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    Py_DECREF(object);
  }
  py::handle get() const { return object; }
};

/// Progress callbacks into Python, called with the GIL (Note [Python calls]): progress(done,
/// total) and the pipeline's progress(step, done, total); None calls nothing.
ProgressFn progress_of(const py::object& fn);
StepProgressFn step_progress_of(const py::object& fn);

/// A report's JSON text as Python objects.
py::object json_loads(const std::string& text);

}  // namespace sparsebit::python
