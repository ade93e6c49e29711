// Owns the conversions between Python values and the engine's requests and outputs (declared in outputs.h): prompts
// in, RequestOutput / CompletionOutput / RequestMetrics / Logprob out, and the Logprob class's binding.
#include "outputs.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace py = pybind11;

namespace ssmserve::python {
namespace {

/// vLLM's Logprob: one candidate token's log-probability, its rank in the distribution, and its text (None when the
/// request's SamplingParams.detokenize is false).
struct Logprob {
  float logprob = 0.0f;
  int rank = 0;
  std::optional<std::string> decoded_token;
};

/// A prompt from Python: a string, a list of token ids, or {"prompt": str} / {"prompt_token_ids": [int]}, with an
/// optional "cache_salt" (vLLM's: a non-empty str; Request::cache_salt).
Request to_request_unchecked(const py::handle& p) {
  Request r;
  if (py::isinstance<py::str>(p)) {
    r.prompt = p.cast<std::string>();
  } else if (py::isinstance<py::dict>(p)) {
    auto d = p.cast<py::dict>();
    for (auto item : d) {  // vLLM's TextPrompt / TokensPrompt keys: unknown ones are a mistake, not to be ignored
      const py::handle key = item.first;
      const std::string name = py::isinstance<py::str>(key) ? key.cast<std::string>() : py::repr(key).cast<std::string>();
      if (name == "prompt" || name == "prompt_token_ids") continue;
      if (name == "cache_salt") {
        if (item.second.is_none()) continue;
        if (!py::isinstance<py::str>(item.second) || item.second.cast<std::string>().empty())
          throw py::value_error("cache_salt must be a non-empty str");
        r.cache_salt = item.second.cast<std::string>();
        continue;
      }
      static const std::set<std::string> unsupported = {"multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids",
                                                        "prompt_embeds", "token_type_ids"};
      if (unsupported.count(name) && item.second.is_none()) continue;  // vLLM's "not given"
      if (unsupported.count(name))
        throw py::value_error("prompt key '" + name + "' is not supported by ssmserve (a prompt dict takes \"prompt\" "
                              "and/or \"prompt_token_ids\")");
      throw py::value_error("unknown prompt key '" + name.substr(0, 100) + "' (a prompt dict takes \"prompt\" and/or "
                            "\"prompt_token_ids\")");
    }
    if (d.contains("prompt_token_ids")) {
      r.prompt_token_ids = d["prompt_token_ids"].cast<std::vector<int>>();
      if (d.contains("prompt")) r.prompt = d["prompt"].cast<std::string>();  // the text those ids came from (outputs)
    } else if (d.contains("prompt")) {
      r.prompt = d["prompt"].cast<std::string>();
    } else throw py::value_error("a prompt dict needs \"prompt\" or \"prompt_token_ids\"");
  } else {
    r.prompt_token_ids = p.cast<std::vector<int>>();
  }
  return r;
}

/// Python-facing output: the C++ RequestOutput with logprobs as vLLM's list[dict[int, Logprob]]; each token's text
/// decoded when `detokenize`, else None.
py::object logprobs_to_py(const LLMEngine& eng, const std::vector<std::vector<TokenLogprob>>& lps, bool detokenize) {
  py::list out;
  const Tokenizer* tok = eng.tokenizer();
  for (const auto& entry : lps) {
    py::dict d;
    for (const TokenLogprob& e : entry) {  // the engine's ranks (TokenLogprob::rank): the sampled / prompt token's
      const int ids[1] = {e.id};           // vocabulary rank, a top entry's position
      std::optional<std::string> text;
      if (detokenize) text = tok ? tok->decode(ids) : std::string();
      d[py::int_(e.id)] = Logprob{e.logprob, e.rank, std::move(text)};
    }
    out.append(d);
  }
  return out;
}

/// prompt_logprobs as vLLM's list[dict[int, Logprob] | None]: None for the first prompt token, else the prompt
/// token (first, with its vocabulary rank) and the top-k (ranks 1..k).
py::object prompt_logprobs_to_py(const LLMEngine& eng, const RequestOutput& o, bool detokenize) {
  std::vector<std::vector<TokenLogprob>> entries;
  py::list out;
  for (size_t t = 0; t < o.prompt_logprobs.size(); ++t) {
    if (!o.prompt_logprobs[t] || t >= o.prompt_token_ids.size()) {
      out.append(py::none());
      continue;
    }
    std::vector<TokenLogprob> e{
        TokenLogprob{o.prompt_token_ids[t], o.prompt_logprobs[t]->token_logprob, o.prompt_logprobs[t]->rank}};
    for (size_t j = 0; j < o.prompt_logprobs[t]->top.size(); ++j) {
      const TokenLogprob& top = o.prompt_logprobs[t]->top[j];
      if (top.id != o.prompt_token_ids[t]) e.push_back({top.id, top.logprob, static_cast<int>(j) + 1});
    }
    out.append(logprobs_to_py(eng, {e}, detokenize)[py::int_(0)]);
  }
  return out;
}

/// The Python RequestMetrics (ssmserve.outputs) of `t`, for an output with `num_generation_tokens` tokens.
py::object metrics_to_py(const Timing& t, size_t num_generation_tokens) {
  py::module_ m = py::module_::import("ssmserve.outputs");
  auto opt = [](double v) -> py::object { return v > 0 ? py::object(py::float_(v)) : py::none(); };
  return m.attr("RequestMetrics")(py::arg("arrival_time") = t.arrival_time, py::arg("first_token_time") = opt(t.first_token_time),
                                  py::arg("last_token_time") = opt(t.last_token_time), py::arg("finished_time") = opt(t.finished_time),
                                  py::arg("num_generation_tokens") = num_generation_tokens);
}

}  // namespace

/// A prompt from Python (see to_request_unchecked). Throws TypeError for anything else, or for token ids that are
/// not ints fitting in 32 bits.
Request to_request(const py::handle& p) {
  try {
    return to_request_unchecked(p);
  } catch (const py::cast_error&) {
    const bool text = py::isinstance<py::str>(p) || (py::isinstance<py::dict>(p) && p.cast<py::dict>().contains("prompt") &&
                                                     py::isinstance<py::str>(p.cast<py::dict>()["prompt"]));
    if (text) throw py::value_error("the prompt is not valid Unicode (it cannot be encoded as UTF-8: a lone surrogate?)");
    throw py::type_error("a prompt must be a str, a list of int token ids, or a dict with \"prompt\" (str) or "
                         "\"prompt_token_ids\" (list of int); got " + py::repr(p).cast<std::string>().substr(0, 200));
  }
}

/// Seconds since the epoch (Python's time.time()).
double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// The Python RequestOutput object (a plain class with vLLM's attribute names).
py::object to_py(const LLMEngine& eng, const RequestOutput& o, OutputOptions opts, const Timing* timing) {
  py::module_ m = py::module_::import("ssmserve.outputs");
  py::list outputs;
  for (const auto& c : o.outputs) {
    py::object finish = c.finish_reason == FinishReason::None ? py::none() : py::object(py::str(std::string(finish_reason_name(c.finish_reason))));
    py::object stop = !c.stop_reason.empty() ? py::object(py::str(c.stop_reason))
                      : c.stop_reason_token ? py::object(py::int_(*c.stop_reason_token)) : py::none();
    py::object cumulative = py::none();  // vLLM's cumulative_logprob: the sampled tokens' logprobs summed
    if (opts.logprobs) {
      double sum = 0.0;
      for (const auto& entry : c.logprobs)
        if (!entry.empty()) sum += entry[0].logprob;
      cumulative = py::float_(sum);
    }
    py::object lps = opts.logprobs ? logprobs_to_py(eng, c.logprobs, opts.detokenize) : py::none();
    outputs.append(m.attr("CompletionOutput")(c.index, opts.detokenize ? c.text : std::string(), c.token_ids, lps,
                                              finish, stop, py::arg("cumulative_logprob") = cumulative));
  }
  py::object prompt_lps = o.prompt_logprobs.empty() ? py::none() : prompt_logprobs_to_py(eng, o, opts.detokenize);
  py::object metrics = timing ? metrics_to_py(*timing, o.outputs.empty() ? 0 : o.outputs[0].token_ids.size()) : py::none();
  return m.attr("RequestOutput")(o.request_id, o.prompt, o.prompt_token_ids, outputs, o.finished,
                                 opts.detokenize ? o.delta_text : std::string(),
                                 py::arg("prompt_logprobs") = prompt_lps, py::arg("num_cached_tokens") = o.num_cached_tokens,
                                 py::arg("metrics") = metrics);
}

void bind_outputs(py::module_& m) {
  py::class_<Logprob>(m, "Logprob")
      // Arguments checked here (TypeError naming the argument, not pybind11's signature dump): logprob a real
      // number (not a str), rank a 32-bit int (not a bool), decoded_token a str or None.
      .def(py::init([](const py::object& logprob, const py::object& rank, const py::object& decoded_token) {
             auto type_name = [](const py::handle& v) { return py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>(); };
             auto bad = [&](const char* arg, const char* want, const py::handle& v) {
               return py::type_error(std::string("Logprob() ") + arg + " must be " + want + ", got " +
                                     py::repr(v).cast<std::string>().substr(0, 100) + " (" + type_name(v) + ")");
             };
             if (py::isinstance<py::str>(logprob) || py::isinstance<py::bytes>(logprob)) throw bad("logprob", "a float", logprob);
             float lp = 0;
             try {
               lp = logprob.cast<float>();
             } catch (const py::cast_error&) {
               throw bad("logprob", "a float", logprob);
             }
             if (py::isinstance<py::bool_>(rank)) throw bad("rank", "an int", rank);
             int r = 0;
             try {
               r = rank.cast<int>();
             } catch (const py::cast_error&) {
               throw bad("rank", "an int in 32 bits", rank);
             }
             if (decoded_token.is_none()) return Logprob{lp, r, std::nullopt};
             if (!py::isinstance<py::str>(decoded_token)) throw bad("decoded_token", "a str or None", decoded_token);
             return Logprob{lp, r, decoded_token.cast<std::string>()};
           }),
           py::arg("logprob"), py::arg("rank") = 0, py::arg("decoded_token") = "")
      .def_readonly("logprob", &Logprob::logprob)
      .def_readonly("rank", &Logprob::rank)
      .def_readonly("decoded_token", &Logprob::decoded_token)
      .def("__eq__", [](const Logprob& a, const py::object& b) -> py::object {
        if (!py::isinstance<Logprob>(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
        const auto& o = b.cast<const Logprob&>();
        return py::bool_(a.logprob == o.logprob && a.rank == o.rank && a.decoded_token == o.decoded_token);
      })
      .def("__hash__", [](const Logprob& l) { return py::hash(py::make_tuple(l.logprob, l.rank, l.decoded_token)); })
      // pickle / copy.deepcopy (multiprocessing, Ray): the three fields.
      .def(py::pickle([](const Logprob& l) { return py::make_tuple(l.logprob, l.rank, l.decoded_token); },
                      [](const py::tuple& t) {
                        if (t.size() != 3) throw py::value_error("Logprob: bad pickle state (want 3 fields)");
                        return Logprob{t[0].cast<float>(), t[1].cast<int>(), t[2].cast<std::optional<std::string>>()};
                      }))
      .def("__repr__", [](const Logprob& l) {
        return "Logprob(logprob=" + std::to_string(l.logprob) + ", rank=" + std::to_string(l.rank) + ", decoded_token=" +
               py::repr(py::cast(l.decoded_token)).cast<std::string>() + ")";
      });
}

}  // namespace ssmserve::python
