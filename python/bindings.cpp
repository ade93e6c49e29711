// Owns the Python module ssmserve._ssmserve and its engine: the Engine class behind ssmserve.LLM (the offline engine
// API with vLLM's names, and the request queue of AsyncLLM's engine loop: add_async / step_async), and the module's
// setup (the "cuda" backend). The engine runs with the GIL released (generate, each step of a stream or of the async
// loop), so other Python threads (and the asyncio event loop) keep running. Prompts and outputs are converted in
// outputs.cpp, SamplingParams is bound in sampling_params.cpp (its structured_outputs' StructuredOutputsParams in
// structured_outputs.cpp), LLM(...)'s keywords are checked in engine_args.cpp, and the module's functions
// (SsmserveError, set_log_level, resolve_model_path) are in module_functions.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/spdlog.h>

#include <cxxabi.h>

#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "core/error.h"
#include "engine_args.h"
#include "log_sink.h"
#include "module_functions.h"
#include "gil_release.h"
#include "outputs.h"
#include "sampling_params.h"
#include "structured_outputs.h"
#include "engine/generation_defaults.h"
#include "engine/llm_engine.h"
#include "chat/chat_template.h"
#include "config/hf_hub_cache.h"
#include "tokenizer/tokenizer.h"
#ifdef SSMSERVE_HAVE_CUDA
#include "runtime/cuda_mamba.h"  // SSMSERVE_PYTHON_CUDA=ON: the "cuda" device
#endif

namespace py = pybind11;
using namespace ssmserve;
using ssmserve::python::check_engine_args;
using ssmserve::python::GivenKeywords;
using ssmserve::python::bind_module_functions;
using ssmserve::python::bind_outputs;
using ssmserve::python::bind_sampling_params;
using ssmserve::python::bind_structured_outputs;
using ssmserve::python::GilRelease;
using ssmserve::python::make_config;
using ssmserve::python::check_python_fields;
using ssmserve::python::now_s;
using ssmserve::python::OutputOptions;
using ssmserve::python::PySamplingParams;
using ssmserve::python::python_message;
using ssmserve::python::Timing;
using ssmserve::python::to_py;
using ssmserve::python::to_request;

namespace {

/// What the Python outputs of a request with params `p` carry.
OutputOptions output_options(const PySamplingParams& p) { return {p.logprobs.has_value(), p.detokenize}; }

/// A token string as Python text: UTF-8, with bytes that are not (a tekken token's raw bytes) kept as lone surrogates
/// (surrogateescape), so distinct tokens stay distinct and token_bytes() turns the text back into them.
py::str token_text(const std::string& token) {
  PyObject* s = PyUnicode_DecodeUTF8(token.data(), static_cast<Py_ssize_t>(token.size()), "surrogateescape");
  if (s == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

/// The bytes of token text (token_text's inverse).
std::string token_bytes(const py::str& text) {
  PyObject* b = PyUnicode_AsEncodedString(text.ptr(), "utf-8", "surrogateescape");
  if (b == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::bytes>(b).cast<std::string>();
}

/// The engine behind ssmserve.LLM. Thread-safe: every use of the engine holds mu_ (taken with the GIL released),
/// one engine step at a time, so generate() / stream() calls from several Python threads batch together in the
/// engine; each step's outputs are filed by request id (stream requests queue every output, generate requests
/// keep their final one) so no caller loses another's results.
class PyLLM {
 public:
  explicit PyLLM(EngineConfig cfg) {
    template_dir_ = cfg.tokenizer.empty() ? cfg.model : cfg.tokenizer;
    GilRelease release;
    // The model's default sampling params (generation_config / override_generation_config), checked before the
    // weights load; logged as vLLM's LLM does.
    defaults_ = GenerationDefaults::load(cfg.model, cfg.generation_config, cfg.override_generation_config);
    if (!defaults_.empty()) spdlog::warn("{}", defaults_.notice("LLM(..., generation_config=\"vllm\")"));
    llm_ = std::make_unique<LLM>(std::move(cfg));
  }

  /// LLM.get_default_sampling_params' fields: the model's default sampling params as vLLM's dict of them
  /// (repetition_penalty, temperature, top_k, top_p, min_p, max_tokens; only those set), for SamplingParams(**d).
  py::dict default_sampling_params() const {
    py::dict d;
    if (defaults_.repetition_penalty) d["repetition_penalty"] = *defaults_.repetition_penalty;
    if (defaults_.temperature) d["temperature"] = *defaults_.temperature;
    if (defaults_.top_k) d["top_k"] = *defaults_.top_k;
    if (defaults_.top_p) d["top_p"] = *defaults_.top_p;
    if (defaults_.min_p) d["min_p"] = *defaults_.min_p;
    if (defaults_.max_tokens) d["max_tokens"] = *defaults_.max_tokens;
    return d;
  }

  /// The engine's tokenizer (LLM.get_tokenizer): Error when the engine has none (dummy weights without one).
  const Tokenizer& tokenizer() const {
    const Tokenizer* t = llm_->engine().tokenizer();
    SSM_CHECK(t, "this engine has no tokenizer (dummy weights without tokenizer.json; pass tokenizer=DIR)");
    return *t;
  }
  /// Token ids of `text` (as the engine encodes prompts: with the tokenizer's special tokens, e.g. BOS, unless
  /// add_special_tokens is false, as for chat prompts whose template writes them).
  std::vector<int> encode(const std::string& text, bool add_special_tokens) const {
    return tokenizer().encode(text, add_special_tokens);
  }
  /// Text of `ids` (Tokenizer.decode). Ids the tokenizer does not know decode to nothing, as Hugging Face's fast
  /// tokenizers: the padded rows of an embedding that sampling may pick.
  std::string decode(const std::vector<int>& ids, bool skip_special_tokens) const {
    const Tokenizer& t = tokenizer();
    std::vector<int> known;
    known.reserve(ids.size());
    for (int id : ids)
      if (t.has_id(id)) known.push_back(id);
    return t.decode(known, skip_special_tokens);
  }
  /// The vocabulary string of `id`, or None when the tokenizer does not know it.
  std::optional<std::string> id_to_token(int id) const {
    const Tokenizer& t = tokenizer();
    if (!t.has_id(id)) return std::nullopt;
    return t.id_to_token(id);
  }
  int vocab_size() const { return tokenizer().vocab_size(); }
  std::vector<int> eos_token_ids() const { return llm_->engine().model_config().eos_token_ids; }
  /// The id of a token string (added tokens first, then the vocabulary, as Hugging Face's), or None.
  std::optional<int> token_to_id(const py::str& token) const { return tokenizer().token_to_id(token_bytes(token)); }
  /// Hugging Face's get_vocab(): every token string (added tokens included) -> its id.
  py::dict vocab() const {
    const Tokenizer& t = tokenizer();
    py::dict d;
    for (int id = 0; id < t.vocab_size(); ++id)
      if (t.has_id(id)) d[token_text(t.id_to_token(id))] = id;
    return d;
  }
  /// Hugging Face's convert_tokens_to_string: the text of token strings, as decode() gives it for their ids (special
  /// tokens kept); a string that is no token contributes nothing.
  std::string tokens_to_string(const std::vector<py::str>& tokens) const {
    const Tokenizer& t = tokenizer();
    std::vector<int> ids;
    ids.reserve(tokens.size());
    for (const py::str& token : tokens)
      if (const auto id = t.token_to_id(token_bytes(token))) ids.push_back(*id);
    return t.decode(ids, false);
  }
  /// The folder of the tokenizer (tokenizer.json, tokenizer_config.json, the chat template), as the caller named it.
  std::string tokenizer_dir() const { return template_dir_.string(); }
  /// The transformers tokenizer class the tokenizer was loaded as ("" for tokenizer.json's own pipeline, SentencePiece
  /// and tekken files): what decides its default special tokens.
  std::string tokenizer_class() const { return tokenizer().tokenizer_class(); }
  /// The source of the checkpoint's (default) chat template, as chat() renders with it (Hugging Face's
  /// tokenizer.chat_template), or None when the checkpoint has none (chat() then uses ssmserve's plain default).
  /// Throws Error for a template file that cannot be read or parsed.
  std::optional<std::string> chat_template_source() {
    std::call_once(default_template_once_, [&] { default_template_ = server::ChatTemplate::load(template_dir_); });
    if (default_template_->is_default()) return std::nullopt;
    return default_template_->source();
  }
  /// LLM.reset_prefix_cache (LLMEngine::reset_prefix_cache): drops every cached prefix; false, changing nothing, while
  /// any request (of any thread, or of the AsyncLLM loop) is unfinished.
  bool reset_prefix_cache() {
    GilRelease release;
    std::lock_guard<std::mutex> lock(mu_);
    return llm_->engine().reset_prefix_cache();
  }

  /// LLM.chat's prompt text: `messages_json` (a JSON list of {"role", "content"} messages) rendered with the
  /// checkpoint's chat template (tokenizer_config.json, else ssmserve's plain default), or with `chat_template`
  /// (Jinja source, or the path of a file holding it) when given. Throws Error for malformed JSON or a template
  /// that fails to parse or render.
  /// kwargs_json: chat_template_kwargs (a JSON object of extra template variables, e.g. {"enable_thinking":
  /// false}); tools_json: a JSON list of tool schemas or "" (the template sees tools = none); content_format: vLLM's
  /// chat_template_content_format ("auto", "string" or "openai"; see server::normalize_chat_content).
  std::string render_chat(const std::string& messages_json, bool add_generation_prompt,
                          const std::optional<std::string>& chat_template, bool continue_final_message,
                          const std::string& kwargs_json, const std::string& tools_json,
                          const std::string& content_format) {
    auto parse = [](const std::string& text, const char* what) {
      try {
        return nlohmann::ordered_json::parse(text);
      } catch (const nlohmann::json::exception& e) {
        fail("{} are not valid JSON text (lone surrogates?): {}", what, e.what());
      }
    };
    nlohmann::ordered_json messages = parse(messages_json, "chat messages");
    // Assistant tool-call arguments reach the template as objects, as the server's (and vLLM's) chat gives them.
    if (const auto bad = server::parse_tool_call_arguments(messages))
      fail("a tool call's function.arguments is not valid JSON: {}", *bad);
    server::ChatTemplateInputs in;
    in.add_generation_prompt = add_generation_prompt;
    in.continue_final_message = continue_final_message;
    in.content_format = server::parse_chat_content_format(content_format, "chat_template_content_format");
    if (!kwargs_json.empty()) in.kwargs = parse(kwargs_json, "chat_template_kwargs");
    SSM_CHECK(in.kwargs.is_object(), "chat_template_kwargs must be a dict of template variables");
    if (!tools_json.empty()) in.tools = parse(tools_json, "tools");
    if (!chat_template) {
      // Loaded once: chat() runs without the GIL, so several threads may get here first together.
      std::call_once(default_template_once_, [&] { default_template_ = server::ChatTemplate::load(template_dir_); });
      return default_template_->apply(messages, in);
    }
    std::error_code ec;
    if (chat_template->size() < 4096 && chat_template->find('\n') == std::string::npos &&
        std::filesystem::is_regular_file(*chat_template, ec))
      return server::ChatTemplate::load(template_dir_, *chat_template).apply(messages, in);
    // Template source: the checkpoint's bos / eos strings, as the file and `serve --chat-template` forms get them
    // (its own chat template is not parsed: a broken one must not stop a caller who brings theirs).
    const auto [bos, eos] = server::ChatTemplate::special_tokens(template_dir_);
    return server::ChatTemplate::from_source(*chat_template, bos, eos).apply(messages, in);
  }

  /// Runs every prompt to the end; n > 1 becomes n engine requests (seed + i when seeded) merged into one output
  /// with outputs[i].index = i, as vLLM returns them. params: one SamplingParams per prompt (read in place: they hold
  /// Python objects). progress: None, or a callable called (with the GIL) with the number of this call's engine
  /// requests that finished since its previous call (the tqdm bar).
  py::list generate(const py::list& prompts, const py::list& params, const py::object& progress) {
    SSM_CHECK(params.size() == prompts.size(), "generate: {} prompts but {} sampling params", prompts.size(), params.size());
    std::vector<Request> reqs;
    std::vector<std::pair<size_t, int>> slot;  // [engine request] -> (prompt, choice)
    std::vector<OutputOptions> opts(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const PySamplingParams& p = params[i].cast<const PySamplingParams&>();
      SSM_CHECK(p.n >= 1 && p.n <= 1024, "n must be in [1, 1024] (got {})", p.n);
      check_python_fields(p);
      opts[i] = output_options(p);
      const Request base = to_request(prompts[i]);
      for (int c = 0; c < p.n; ++c) {
        reqs.push_back(base);
        reqs.back().params = static_cast<const SamplingParams&>(p);  // the engine's part
        reqs.back().params.n = 1;
        if (p.seed) reqs.back().params.seed = *p.seed + static_cast<uint64_t>(c);
        slot.emplace_back(i, c);
      }
    }
    std::vector<RequestOutput> outs(reqs.size());
    std::vector<Timing> timings(reqs.size());
    auto finished_count = std::make_shared<size_t>(0);  // this call's requests finished so far (under mu_)
    size_t reported = 0;
    {
      GilRelease release;
      std::vector<std::string> ids;
      {
        std::lock_guard<std::mutex> lock(mu_);
        LLMEngine& eng = llm_->engine();
        for (auto& r : reqs) {
          r.request_id = std::to_string(next_id_++);
          const std::string id = r.request_id;
          try {
            eng.add_request(std::move(r));
          } catch (abi::__forced_unwind&) {
            throw;
          } catch (...) {  // all or nothing: drop the ones already added
            for (const auto& added : ids) {
              eng.abort_request(added);
              batch_ids_.erase(added);
              timing_.erase(added);
            }
            throw;
          }
          batch_ids_[id] = finished_count;
          timing_[id].arrival_time = now_s();
          ids.push_back(id);
        }
      }
      size_t done = 0;
      try {
        while (done < ids.size()) {
          size_t now_finished = 0;
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (auto it = finished_.find(ids[done]); it != finished_.end()) {
              outs[done] = std::move(it->second);
              finished_.erase(it);
              timings[done] = timing_[ids[done]];
              timing_.erase(ids[done]);
              ++done;
              continue;
            }
            SSM_CHECK(llm_->engine().has_unfinished_requests(), "generate: request {} was lost by the engine", ids[done]);
            step_locked();
            now_finished = *finished_count;
          }
          check_signals(release, progress, now_finished - reported);
          reported = now_finished;
        }
      } catch (abi::__forced_unwind&) {  // Python is exiting and ends this (daemon) thread: let the unwind through
        throw;
      } catch (...) {  // the engine failed, or Ctrl-C: drop this call's requests still running
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t k = done; k < ids.size(); ++k) {
          if (batch_ids_.erase(ids[k])) llm_->engine().abort_request(ids[k]);
          finished_.erase(ids[k]);
          timing_.erase(ids[k]);
        }
        throw;
      }
    }
    if (!progress.is_none() && reqs.size() > reported) progress(reqs.size() - reported);
    std::vector<RequestOutput> merged(prompts.size());
    std::vector<Timing> merged_timing(prompts.size());
    for (size_t k = 0; k < outs.size(); ++k) {
      const auto [p, c] = slot[k];
      if (c == 0) {
        merged[p] = std::move(outs[k]);
        merged[p].outputs.resize(1);
        merged_timing[p] = timings[k];
      } else {
        merged[p].outputs.push_back(std::move(outs[k].outputs.at(0)));
        merged_timing[p].finished_time = std::max(merged_timing[p].finished_time, timings[k].finished_time);
        merged_timing[p].last_token_time = std::max(merged_timing[p].last_token_time, timings[k].last_token_time);
      }
      merged[p].outputs.back().index = c;
    }
    py::list result;
    for (size_t i = 0; i < merged.size(); ++i)
      result.append(to_py(llm_->engine(), merged[i], opts[i], &merged_timing[i]));
    return result;
  }

  /// Adds one request and returns its id; next_output() then yields its outputs.
  std::string add(const py::handle& prompt, const PySamplingParams& params) {
    check_python_fields(params);
    Request r = to_request(prompt);
    r.params = static_cast<const SamplingParams&>(params);
    const OutputOptions opts = output_options(params);
    GilRelease release;
    std::lock_guard<std::mutex> lock(mu_);
    r.request_id = std::to_string(next_id_++);
    const std::string id = r.request_id;
    llm_->engine().add_request(std::move(r));
    streams_[id] = opts;
    timing_[id].arrival_time = now_s();
    return id;
  }
  /// Runs engine steps (GIL released) until `id` has a new output; returns it, or None once it finished earlier.
  py::object next_output(const std::string& id) {
    std::optional<RequestOutput> out;
    OutputOptions opts;
    Timing timing;
    {
      GilRelease release;
      while (!out) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = pending_.find(id);
          if (it != pending_.end() && !it->second.empty()) {
            out = std::move(it->second.front().first);
            timing = it->second.front().second;
            it->second.pop_front();
            opts = streams_[id];
            if (out->finished) {
              pending_.erase(it);
              streams_.erase(id);
              timing_.erase(id);
            }
            break;
          }
          if (!llm_->engine().has_unfinished_requests() || !streams_.count(id)) break;
          step_locked();
        }
        check_signals(release);
      }
    }
    if (!out) return py::none();
    return to_py(llm_->engine(), *out, opts, &timing);
  }
  /// Aborts a request of add() or add_async() (no-op when unknown or finished): its engine state is freed at once.
  void abort(const std::string& id) {
    GilRelease release;
    std::lock_guard<std::mutex> lock(mu_);
    llm_->engine().abort_request(id);
    pending_.erase(id);
    streams_.erase(id);
    async_ids_.erase(id);
    timing_.erase(id);
  }

  /// AsyncLLM: adds a request under the caller's `request_id` (unique among running ones, else a ValueError); its
  /// outputs come out of step_async().
  void add_async(const py::handle& prompt, const PySamplingParams& params, const std::string& request_id) {
    check_python_fields(params);
    Request r = to_request(prompt);
    r.params = static_cast<const SamplingParams&>(params);
    r.request_id = request_id;
    const OutputOptions opts = output_options(params);
    GilRelease release;
    std::lock_guard<std::mutex> lock(mu_);
    SSM_CHECK(!async_ids_.count(request_id) && !streams_.count(request_id) && !batch_ids_.count(request_id),
              "request_id '{}' is already running", request_id);
    llm_->engine().add_request(std::move(r));
    async_ids_[request_id] = opts;
    timing_[request_id].arrival_time = now_s();
  }
  /// AsyncLLM's engine loop: one engine step (GIL released) when any request is unfinished; returns the
  /// add_async() requests' outputs (cumulative RequestOutputs, the last one of each with finished=True).
  py::list step_async() {
    std::vector<std::pair<RequestOutput, Timing>> outs;
    std::vector<OutputOptions> want;
    {
      GilRelease release;
      std::lock_guard<std::mutex> lock(mu_);
      if (async_out_.empty() && llm_->engine().has_unfinished_requests()) step_locked();
      outs.swap(async_out_);
      for (const auto& [o, t] : outs) {
        auto it = async_ids_.find(o.request_id);
        want.push_back(it != async_ids_.end() ? it->second : OutputOptions{});
        if (o.finished && it != async_ids_.end()) {
          async_ids_.erase(it);
          timing_.erase(o.request_id);
        }
      }
    }
    py::list result;
    for (size_t i = 0; i < outs.size(); ++i) result.append(to_py(llm_->engine(), outs[i].first, want[i], &outs[i].second));
    return result;
  }
  bool has_unfinished() {
    GilRelease release;
    std::lock_guard<std::mutex> lock(mu_);
    return llm_->engine().has_unfinished_requests();
  }
  /// The engine's pool and request counters, and how many requests this binding still tracks (all zero / all
  /// blocks free once every request finished or was aborted).
  py::dict stats() {
    int running, waiting, free_blocks, blocks, cached;
    size_t tracked, timing;
    {
      GilRelease release;
      std::lock_guard<std::mutex> lock(mu_);
      const LLMEngine& e = llm_->engine();
      running = e.num_running_requests();
      waiting = e.num_waiting_requests();
      free_blocks = e.num_free_blocks();
      blocks = e.num_state_blocks();
      cached = e.num_cached_blocks();
      tracked = pending_.size() + streams_.size() + async_ids_.size() + batch_ids_.size() + finished_.size() + async_out_.size();
      timing = timing_.size();
    }
    py::dict d;
    d["num_running_requests"] = running;
    d["num_waiting_requests"] = waiting;
    d["num_free_blocks"] = free_blocks;      // blocks a new request could get: free + cached unheld ones
    d["num_state_blocks"] = blocks;          // the pool, incl. the null block
    d["num_cached_blocks"] = cached;
    d["num_tracked_requests"] = tracked;     // the binding's per-request queues and maps
    d["num_timed_requests"] = timing;
    return d;
  }

 private:
  /// Between engine steps (GIL released, mu_ not held): runs Python's signal handlers, so Ctrl-C interrupts a
  /// long generate() / stream step loop (KeyboardInterrupt; the caller's requests are aborted), and reports
  /// `newly_finished` requests to `progress` (a callable, or None) when non-zero.
  /// `unlocked`: the caller's GIL release, taken back for the checks (at interpreter finalization this ends a daemon
  /// thread: see GilRelease).
  static void check_signals(GilRelease& unlocked, const py::object& progress = py::object(), size_t newly_finished = 0) {
    unlocked.with_gil([&] {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (newly_finished > 0 && progress && !progress.is_none()) progress(newly_finished);
    });
  }

  /// One engine step (mu_ held); files its outputs for the callers waiting on them and stamps their times.
  void step_locked() {
    auto outs = llm_->engine().step();
    const double now = now_s();
    for (auto& o : outs) {
      Timing* t = nullptr;
      if (auto it = timing_.find(o.request_id); it != timing_.end()) {
        t = &it->second;
        if (!o.outputs.empty() && !o.outputs[0].token_ids.empty()) {
          if (t->first_token_time == 0) t->first_token_time = now;
          t->last_token_time = now;
        }
        if (o.finished) t->finished_time = now;
      }
      const Timing snap = t ? *t : Timing{};
      if (streams_.count(o.request_id)) {
        pending_[o.request_id].emplace_back(std::move(o), snap);
      } else if (async_ids_.count(o.request_id)) {
        async_out_.emplace_back(std::move(o), snap);
      } else if (o.finished) {
        if (auto it = batch_ids_.find(o.request_id); it != batch_ids_.end()) {
          ++*it->second;
          batch_ids_.erase(it);
          const std::string id = o.request_id;
          finished_[id] = std::move(o);
        }
      }
    }
  }

  std::unique_ptr<LLM> llm_;
  GenerationDefaults defaults_;                        // the model's default sampling params (default_sampling_params)
  std::filesystem::path template_dir_;                 // where tokenizer_config.json (the chat template) lives
  std::optional<server::ChatTemplate> default_template_;  // loaded on the first chat() (once: default_template_once_)
  std::once_flag default_template_once_;
  std::mutex mu_;  // guards everything below and every use of llm_'s engine
  long long next_id_ = 0;
  std::map<std::string, std::deque<std::pair<RequestOutput, Timing>>> pending_;  // stream outputs not yet read
  std::map<std::string, OutputOptions> streams_;               // stream request id -> what its outputs carry
  std::map<std::string, OutputOptions> async_ids_;             // add_async request id -> what its outputs carry
  std::vector<std::pair<RequestOutput, Timing>> async_out_;    // add_async outputs not yet taken by step_async
  std::map<std::string, std::shared_ptr<size_t>> batch_ids_;  // generate() requests still running -> call's count
  std::map<std::string, RequestOutput> finished_;              // generate() requests' final outputs
  std::map<std::string, Timing> timing_;                       // every running request's times
};

}  // namespace

PYBIND11_MODULE(_ssmserve, m) {
  m.doc() = "ssmserve C++ engine bindings (use the ssmserve package)";
#ifdef SSMSERVE_HAVE_CUDA
  cuda::register_cuda_backend();  // as the CLI does at start: device="cuda" / "auto" can pick the GPU runners
#endif
  m.attr("has_cuda") =
#ifdef SSMSERVE_HAVE_CUDA
      true;
#else
      false;
#endif
  bind_module_functions(m);  // SsmserveError, set_log_level, resolve_model_path (module_functions.cpp)
  bind_outputs(m);
  bind_structured_outputs(m);  // before SamplingParams, whose structured_outputs holds one
  bind_sampling_params(m);

  py::class_<PyLLM>(m, "Engine")
      .def(py::init([](const std::string& model, const py::kwargs& kw) {
             GivenKeywords given;
             EngineConfig cfg = make_config(model, kw, given);
             try {
               // As `serve`: a model without a context limit gets one, so that max_tokens=None ends.
               cfg.max_model_len_without_limit = kDefaultMaxModelLenWithoutLimit;
               return std::make_unique<PyLLM>(std::move(cfg));
             } catch (const Error& e) {  // name the keywords as the caller spelt them (num_threads, ...)
               throw Error(python_message(e.what(), given));
             }
           }),
           py::arg("model"))
      .def("generate", &PyLLM::generate, py::arg("prompts"), py::arg("params"), py::arg("progress") = py::none())
      .def("add", &PyLLM::add)
      .def("next_output", &PyLLM::next_output)
      .def("abort", &PyLLM::abort)
      .def("add_async", &PyLLM::add_async, py::arg("prompt"), py::arg("params"), py::arg("request_id"))
      .def("step_async", &PyLLM::step_async)
      .def("has_unfinished", &PyLLM::has_unfinished)
      .def("stats", &PyLLM::stats)
      .def("encode", &PyLLM::encode, py::arg("text"), py::arg("add_special_tokens") = true,
           py::call_guard<GilRelease>())
      .def("decode", &PyLLM::decode, py::arg("ids"), py::arg("skip_special_tokens") = false,
           py::call_guard<GilRelease>())
      .def("id_to_token", &PyLLM::id_to_token, py::arg("id"))
      .def("vocab_size", &PyLLM::vocab_size)
      .def("eos_token_ids", &PyLLM::eos_token_ids)
      .def("token_to_id", &PyLLM::token_to_id, py::arg("token"))
      .def("vocab", &PyLLM::vocab)
      .def("tokens_to_string", &PyLLM::tokens_to_string, py::arg("tokens"))
      .def("tokenizer_dir", &PyLLM::tokenizer_dir)
      .def("tokenizer_class", &PyLLM::tokenizer_class)
      .def("chat_template_source", &PyLLM::chat_template_source, py::call_guard<GilRelease>())
      .def("reset_prefix_cache", &PyLLM::reset_prefix_cache)
      .def("default_sampling_params", &PyLLM::default_sampling_params)
      .def("render_chat", &PyLLM::render_chat, py::arg("messages_json"), py::arg("add_generation_prompt"),
           py::arg("chat_template"), py::arg("continue_final_message") = false, py::arg("kwargs_json") = "",
           py::arg("tools_json") = "", py::arg("content_format") = "auto", py::call_guard<GilRelease>());
}
