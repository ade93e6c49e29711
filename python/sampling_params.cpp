// Owns the SamplingParams class's binding (declared in sampling_params.h): its fields listed once (SSM_SAMPLING_FIELDS)
// for the attributes, the pickle state and equality. structured_outputs holds a StructuredOutputsParams
// (structured_outputs.cpp, bound first).
#include "sampling_params.h"

#include <pybind11/stl.h>

#include <string>

#include "engine/sampling_params.h"

namespace py = pybind11;

namespace ssmserve::python {

void bind_sampling_params(py::module_& m) {
  // Every field of SamplingParams, once: its attribute, its pickle state and its equality. bad_words_token_ids is the
  // engine's (derived from bad_words when a request is added, as vLLM's private _bad_words_token_ids): not bound.
#define SSM_SAMPLING_FIELDS(X)                                                                                        \
  X(n) X(temperature) X(top_p) X(top_k) X(min_p) X(seed) X(presence_penalty) X(frequency_penalty)                     \
  X(repetition_penalty) X(max_tokens) X(min_tokens) X(stop) X(stop_token_ids) X(ignore_eos) X(logprobs)               \
  X(prompt_logprobs) X(include_stop_str_in_output) X(skip_special_tokens) X(logit_bias) X(allowed_token_ids)          \
  X(bad_words) X(structured_outputs)
  auto sampling_state = [](const SamplingParams& p) {
    py::dict d;
#define SSM_GET(f) d[#f] = py::cast(p.f);
    SSM_SAMPLING_FIELDS(SSM_GET)
#undef SSM_GET
    return d;
  };
  py::class_<SamplingParams> sampling(m, "SamplingParams");
  sampling.def(py::init<>());
  // Read as a copy (as the list fields always were): a StructuredOutputsParams read from structured_outputs must not
  // point into the optional's storage, which setting structured_outputs = None frees.
#define SSM_FIELD(f)                                                                 \
  sampling.def_property(                                                             \
      #f, [](const SamplingParams& p) { return p.f; },                               \
      [](SamplingParams& p, const decltype(SamplingParams::f)& v) { p.f = v; });
  SSM_SAMPLING_FIELDS(SSM_FIELD)
#undef SSM_FIELD
  sampling
      .def("__eq__", [sampling_state](const SamplingParams& a, const py::object& b) -> py::object {
        if (!py::isinstance<SamplingParams>(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
        return py::bool_(sampling_state(a).equal(sampling_state(b.cast<const SamplingParams&>())));
      })
      .attr("__hash__") = py::none();  // mutable, as vLLM's
  // pickle / copy.deepcopy (multiprocessing, Ray): a dict of every field; unknown or missing fields are a ValueError.
  sampling.def(py::pickle(sampling_state, [](const py::dict& d) {
    SamplingParams p;
    size_t known = 0;
#define SSM_SET(f)                                                            \
  if (d.contains(#f)) {                                                       \
    p.f = d[#f].cast<decltype(p.f)>();                                        \
    ++known;                                                                  \
  } else {                                                                    \
    throw py::value_error("SamplingParams: pickle state lacks field '" #f "'"); \
  }
    SSM_SAMPLING_FIELDS(SSM_SET)
#undef SSM_SET
    if (known != d.size()) throw py::value_error("SamplingParams: pickle state has unknown fields");
    return p;
  }));
  sampling
      .def("validate", &SamplingParams::validate, py::arg("vocab_size"))
      .def("clone", [](const SamplingParams& p) { return p; }, "A copy (vLLM's SamplingParams.clone)")
      .def("__repr__", [](const SamplingParams& p) {  // Python reprs of the values, as vLLM's repr shows them
        py::object none = py::none();
        auto opt = [&](const auto& o) -> py::object { return o ? py::cast(*o) : none; };
        return py::str("SamplingParams(n={!r}, temperature={!r}, top_p={!r}, top_k={!r}, min_p={!r}, seed={!r}, "
                       "presence_penalty={!r}, frequency_penalty={!r}, repetition_penalty={!r}, max_tokens={!r}, "
                       "min_tokens={!r}, stop={!r}, stop_token_ids={!r}, ignore_eos={!r}, logprobs={!r}, "
                       "prompt_logprobs={!r}, skip_special_tokens={!r}, logit_bias={!r}, bad_words={!r}, "
                       "structured_outputs={!r})")
            .format(p.n, p.temperature, p.top_p, p.top_k, p.min_p, opt(p.seed), p.presence_penalty,
                    p.frequency_penalty, p.repetition_penalty, p.max_tokens, p.min_tokens, p.stop, p.stop_token_ids,
                    p.ignore_eos, opt(p.logprobs), opt(p.prompt_logprobs), p.skip_special_tokens, p.logit_bias,
                    p.bad_words, opt(p.structured_outputs))
            .cast<std::string>();
      });
}

}  // namespace ssmserve::python
