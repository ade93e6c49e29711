// Owns the binding of SamplingParams (module ssmserve._ssmserve): every field as a read-write attribute (read as a
// copy), equality, pickle / deepcopy state, validate, clone and vLLM's repr. The checks of the values live in the engine
// (SamplingParams::validate); the package's ssmserve.SamplingParams (ssmserve/sampling_params.py) subclasses
// this class and checks its keyword arguments.
#pragma once
#include <pybind11/pybind11.h>

namespace ssmserve::python {

/// Registers the SamplingParams class in `m`. Pickle state is a dict of every field; a state with a missing or
/// unknown field is a ValueError.
void bind_sampling_params(pybind11::module_& m);

}  // namespace ssmserve::python
