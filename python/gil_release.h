// Owns GilRelease: releasing the GIL around engine work in the Python bindings (bindings.cpp) so that it survives
// interpreter finalization (a daemon thread inside the engine while Python exits).
#pragma once
#include <Python.h>

#include <cxxabi.h>

#include <chrono>
#include <exception>
#include <thread>

namespace ssmserve::python {

/// True once CPython began ending this thread (pthread_exit at interpreter finalization: a daemon thread that takes
/// the GIL back while Python exits); the forced unwind (abi::__forced_unwind) is then under way.
inline thread_local bool t_thread_exiting = false;

/// True once the interpreter is finalizing (Python is exiting).
inline bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

/// Releases the GIL for its scope, as py::gil_scoped_release, for code that may meet interpreter finalization:
/// CPython ends a daemon thread that takes the GIL back while Python exits with pthread_exit, whose forced unwind
/// must pass through to the thread's start. So the destructor may itself exit the thread (noexcept(false): never
/// std::terminate), and nothing takes the GIL back while that unwind is under way (a second pthread_exit inside it
/// would terminate the process).
class GilRelease {
 public:
  GilRelease() : state_(PyEval_SaveThread()) {}
  ~GilRelease() noexcept(false) {
    if (t_thread_exiting) return;
    if (std::uncaught_exceptions() > 0 && python_finalizing()) {
      // An engine error is under way while Python exits: taking the GIL back would end the thread inside this
      // unwind (std::terminate), so the thread waits for the process to end (as CPython 3.14 parks such threads).
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
    restore();
  }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

  /// Runs f() with the GIL held, then releases it again. May end the thread (forced unwind) at finalization.
  template <class F>
  void with_gil(F&& f) {
    restore();
    struct Release {
      PyThreadState*& state;
      ~Release() {
        if (!t_thread_exiting) state = PyEval_SaveThread();
      }
    } release{state_};
    try {
      f();
    } catch (abi::__forced_unwind&) {  // Python code in f() took the GIL back during finalization
      t_thread_exiting = true;
      throw;
    }
  }

 private:
  void restore() {
    try {
      PyEval_RestoreThread(state_);
    } catch (abi::__forced_unwind&) {
      t_thread_exiting = true;
      throw;
    }
  }
  PyThreadState* state_;
};

}  // namespace ssmserve::python
