// Owns the SamplingParams class's binding (declared in sampling_params.h): its fields listed once (SSM_SAMPLING_FIELDS)
// for the attributes, the pickle state and equality, plus the Python-only output_kind (a RequestOutputKind) and
// extra_args (a dict) bound by hand. structured_outputs holds a StructuredOutputsParams (structured_outputs.cpp, bound
// first).
#include "sampling_params.h"

#include <pybind11/stl.h>

#include <string>
#include <string_view>

namespace py = pybind11;

namespace ssmserve::python {
namespace {

/// ssmserve.sampling_params.RequestOutputKind (vLLM's enum; defined in Python).
py::object request_output_kind() { return py::module_::import("ssmserve.sampling_params").attr("RequestOutputKind"); }

/// `v` for messages: its repr (cut at 100 characters) and its type.
std::string describe(const py::handle& v) {
  return py::repr(v).cast<std::string>().substr(0, 100) + " (" +
         py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>() + ")";
}

/// output_kind from a RequestOutputKind member: its value. TypeError for anything else.
int output_kind_of(const py::handle& v) {
  if (!py::isinstance(v, request_output_kind()))
    throw py::type_error("SamplingParams.output_kind must be a RequestOutputKind (ssmserve.sampling_params), got " +
                         describe(v));
  return v.attr("value").cast<int>();
}

/// extra_args from None or a dict (kept as given). TypeError for anything else.
py::object extra_args_of(const py::handle& v) {
  if (v.is_none()) return py::object();
  if (!py::isinstance<py::dict>(v)) throw py::type_error("SamplingParams.extra_args must be None or a dict, got " + describe(v));
  return py::reinterpret_borrow<py::object>(v);
}

py::object extra_args_or_none(const PySamplingParams& p) { return p.extra_args ? p.extra_args : py::none(); }

}  // namespace

void check_python_fields(const PySamplingParams& p) {
  if (!p.detokenize && !p.stop.empty())  // vLLM's _verify_args
    throw py::value_error("stop strings are only supported when detokenize is True. Set detokenize=True to use stop.");
}

void bind_sampling_params(py::module_& m) {
  // Every field held by value, once: its attribute, its pickle state and its equality. bad_words_token_ids is the
  // engine's (derived from bad_words when a request is added, as vLLM's private _bad_words_token_ids): not bound.
  // output_kind and extra_args (Python objects on the Python side) are bound apart below.
#define SSM_SAMPLING_FIELDS(X)                                                                                        \
  X(n) X(temperature) X(top_p) X(top_k) X(min_p) X(seed) X(presence_penalty) X(frequency_penalty)                     \
  X(repetition_penalty) X(max_tokens) X(min_tokens) X(stop) X(stop_token_ids) X(ignore_eos) X(logprobs)               \
  X(prompt_logprobs) X(include_stop_str_in_output) X(skip_special_tokens) X(logit_bias) X(allowed_token_ids)          \
  X(bad_words) X(structured_outputs) X(detokenize)
  auto sampling_state = [](const PySamplingParams& p) {
    py::dict d;
#define SSM_GET(f) d[#f] = py::cast(p.f);
    SSM_SAMPLING_FIELDS(SSM_GET)
#undef SSM_GET
    d["output_kind"] = p.output_kind;  // the enum's value
    d["extra_args"] = extra_args_or_none(p);
    return d;
  };
  py::class_<PySamplingParams> sampling(m, "SamplingParams");
  sampling.def(py::init<>());
  // Read as a copy (as the list fields always were): a StructuredOutputsParams read from structured_outputs must not
  // point into the optional's storage, which setting structured_outputs = None frees.
#define SSM_FIELD(f)                                                                 \
  sampling.def_property(                                                             \
      #f, [](const PySamplingParams& p) { return p.f; },                             \
      [](PySamplingParams& p, const decltype(PySamplingParams::f)& v) { p.f = v; });
  SSM_SAMPLING_FIELDS(SSM_FIELD)
#undef SSM_FIELD
  sampling.def_property(
      "output_kind", [](const PySamplingParams& p) { return request_output_kind()(p.output_kind); },
      [](PySamplingParams& p, const py::object& v) { p.output_kind = output_kind_of(v); });
  // The dict itself (as vLLM's attribute), not a copy: vLLM's plugins read and write it.
  sampling.def_property(
      "extra_args", [](const PySamplingParams& p) { return extra_args_or_none(p); },
      [](PySamplingParams& p, const py::object& v) { p.extra_args = extra_args_of(v); });
  sampling
      .def("__eq__", [sampling_state](const PySamplingParams& a, const py::object& b) -> py::object {
        if (!py::isinstance<PySamplingParams>(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
        return py::bool_(sampling_state(a).equal(sampling_state(b.cast<const PySamplingParams&>())));
      })
      .attr("__hash__") = py::none();  // mutable, as vLLM's
  // pickle / copy.deepcopy (multiprocessing, Ray): a dict of every field; unknown or missing fields are a ValueError
  // (but a state pickled before output_kind / extra_args / detokenize existed gets their defaults).
  sampling.def(py::pickle(sampling_state, [](const py::dict& d) {
    PySamplingParams p;
    size_t known = 0;
#define SSM_SET(f)                                                            \
  if (d.contains(#f)) {                                                       \
    p.f = d[#f].cast<decltype(p.f)>();                                        \
    ++known;                                                                  \
  } else if (std::string_view(#f) != "detokenize") {                          \
    throw py::value_error("SamplingParams: pickle state lacks field '" #f "'"); \
  }
    SSM_SAMPLING_FIELDS(SSM_SET)
#undef SSM_SET
    if (d.contains("output_kind")) {
      const py::object k = d["output_kind"];
      p.output_kind = py::isinstance<py::int_>(k) ? k.cast<int>() : output_kind_of(k);
      if (p.output_kind < 0 || p.output_kind > 2) throw py::value_error("SamplingParams: bad output_kind in pickle state");
      ++known;
    }
    if (d.contains("extra_args")) {
      p.extra_args = extra_args_of(d["extra_args"]);
      ++known;
    }
    if (known != d.size()) throw py::value_error("SamplingParams: pickle state has unknown fields");
    return p;
  }));
  sampling
      .def(
          "validate",
          [](const PySamplingParams& p, int vocab_size) {
            p.validate(vocab_size);
            check_python_fields(p);
          },
          py::arg("vocab_size"))
      .def("clone", [](const PySamplingParams& p) { return p; }, "A copy (vLLM's SamplingParams.clone)")
      .def("__repr__", [](const PySamplingParams& p) {  // Python reprs of the values, as vLLM's repr shows them
        py::object none = py::none();
        auto opt = [&](const auto& o) -> py::object { return o ? py::cast(*o) : none; };
        return py::str("SamplingParams(n={!r}, temperature={!r}, top_p={!r}, top_k={!r}, min_p={!r}, seed={!r}, "
                       "presence_penalty={!r}, frequency_penalty={!r}, repetition_penalty={!r}, max_tokens={!r}, "
                       "min_tokens={!r}, stop={!r}, stop_token_ids={!r}, ignore_eos={!r}, logprobs={!r}, "
                       "prompt_logprobs={!r}, skip_special_tokens={!r}, logit_bias={!r}, bad_words={!r}, "
                       "structured_outputs={!r}, extra_args={!r})")
            .format(p.n, p.temperature, p.top_p, p.top_k, p.min_p, opt(p.seed), p.presence_penalty,
                    p.frequency_penalty, p.repetition_penalty, p.max_tokens, p.min_tokens, p.stop, p.stop_token_ids,
                    p.ignore_eos, opt(p.logprobs), opt(p.prompt_logprobs), p.skip_special_tokens, p.logit_bias,
                    p.bad_words, opt(p.structured_outputs), extra_args_or_none(p))
            .cast<std::string>();
      });
}

}  // namespace ssmserve::python
