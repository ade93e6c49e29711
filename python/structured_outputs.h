// Owns the binding of StructuredOutputsParams (module ssmserve._ssmserve; the package exports it as
// ssmserve.sampling_params.StructuredOutputsParams, as vLLM's vllm.sampling_params): vLLM's keyword constructor with
// its argument types (TypeError / ValueError naming the field), the attributes, equality, pickle / deepcopy state and
// repr. The constraint's own checks (exactly one kind, non-empty) are the engine's
// (StructuredOutputsParams::validate); a schema / regex / grammar is compiled, and refused when invalid, when a request
// with it is added.
#pragma once
#include <pybind11/pybind11.h>

namespace ssmserve::python {

/// Registers the StructuredOutputsParams class and `has_structured_outputs` (bool: this build includes xgrammar) in
/// `m`. Must run before bind_sampling_params (SamplingParams.structured_outputs holds one). Pickle state is a dict of
/// every field; a state with a missing or unknown field is a ValueError.
void bind_structured_outputs(pybind11::module_& m);

}  // namespace ssmserve::python
