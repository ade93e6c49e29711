// Owns the values that cross the Python API's boundary, as vLLM names them: prompts coming in (a str, token ids or a
// prompt dict -> Request), outputs going out (RequestOutput -> ssmserve.outputs' RequestOutput, CompletionOutput and
// RequestMetrics, with logprobs as list[dict[int, Logprob]]), the request times behind RequestMetrics, and the
// Logprob class of module ssmserve._ssmserve.
#pragma once
#include <pybind11/pybind11.h>

#include "engine/llm_engine.h"

namespace ssmserve::python {

/// vLLM's RequestMetrics of one request: wall-clock times in seconds since the epoch (time.time()), 0 = not yet.
struct Timing {
  double arrival_time = 0, first_token_time = 0, last_token_time = 0, finished_time = 0;
};

/// What a request's Python outputs carry (from its SamplingParams): logprobs (SamplingParams.logprobs set: each
/// CompletionOutput's logprobs and cumulative_logprob) and text (vLLM's detokenize: false leaves text and delta_text ""
/// and logprobs' decoded_token None).
struct OutputOptions {
  bool logprobs = false;
  bool detokenize = true;
};

/// Seconds since the epoch (Python's time.time()).
double now_s();

/// A prompt from Python: a str, a list of int token ids, or a dict with "prompt" (str) and/or "prompt_token_ids"
/// (list of int), vLLM's TextPrompt / TokensPrompt. Throws TypeError for anything else, or for token ids that are
/// not ints fitting in 32 bits; ValueError for an unknown or unsupported dict key, or text that is not valid Unicode.
Request to_request(const pybind11::handle& p);

/// The Python RequestOutput object (a plain class with vLLM's attribute names) of `o`. opts.logprobs: fill each
/// CompletionOutput's logprobs (list[dict[int, Logprob]], token texts decoded by eng's tokenizer unless
/// opts.detokenize is false) and cumulative_logprob, else None. timing: the request's times (RequestMetrics), or
/// nullptr for metrics=None.
pybind11::object to_py(const LLMEngine& eng, const RequestOutput& o, OutputOptions opts, const Timing* timing = nullptr);

/// Registers the Logprob class (vLLM's Logprob: logprob, rank, decoded_token (a str, or None); equality, hash,
/// pickle, repr) in `m`.
void bind_outputs(pybind11::module_& m);

}  // namespace ssmserve::python
