// Owns the functions of the Python module ssmserve._ssmserve beside its Engine class (bindings.cpp): the SsmserveError
// exception and its translation of the engine's errors, set_log_level, resolve_model_path.
#pragma once
#include <pybind11/pybind11.h>

namespace ssmserve::python {

/// Registers SsmserveError (a ValueError: the engine's errors, their CLI flags respelt as LLM(...) keywords), the
/// engine argument check, the respelling logger, set_log_level(level) and resolve_model_path(model, revision) on `m`.
/// Called once from the module's init.
void bind_module_functions(pybind11::module_& m);

}  // namespace ssmserve::python
