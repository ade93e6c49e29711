// Owns the binding of SamplingParams (module ssmserve._ssmserve): every field as a read-write attribute (read as a
// copy), equality, pickle / deepcopy state, validate, clone and vLLM's repr. The checks of the values live in the engine
// (SamplingParams::validate); the package's ssmserve.SamplingParams (ssmserve/sampling_params.py) subclasses
// this class and checks its keyword arguments. The bound class is PySamplingParams: the engine's fields plus vLLM's
// fields that only the Python API reads (detokenize, output_kind, extra_args).
#pragma once
#include <pybind11/pybind11.h>

#include "engine/sampling_params.h"

namespace ssmserve::python {

/// The Python SamplingParams: the engine's SamplingParams plus vLLM's fields the engine never reads. The binding adds
/// a request with the engine part alone (a sliced copy); the rest decides what its Python outputs carry.
/// extra_args holds a Python object: copy or destroy a PySamplingParams only with the GIL held.
struct PySamplingParams : SamplingParams {
  /// vLLM's detokenize: false leaves the outputs' text "" and their logprobs' decoded_token None (token ids only).
  bool detokenize = true;
  /// vLLM's RequestOutputKind (ssmserve.sampling_params): 0 CUMULATIVE, 1 DELTA, 2 FINAL_ONLY. AsyncLLM.generate
  /// honours it; LLM.generate ignores it (as vLLM's LLM).
  int output_kind = 0;
  /// vLLM's extra_args: a dict, stored and returned as given; null = None.
  pybind11::object extra_args;
};

/// Throws ValueError for a combination of the Python-only fields and the rest that vLLM refuses (stop strings without
/// detokenize: they are matched on the text).
void check_python_fields(const PySamplingParams& p);

/// Registers the SamplingParams class in `m`. Pickle state is a dict of every field; a state with a missing or
/// unknown field is a ValueError.
void bind_sampling_params(pybind11::module_& m);

}  // namespace ssmserve::python
