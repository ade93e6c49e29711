// Owns the offline API LLM (see llm_engine.h) and host_greedy_steps, the host form of a model's multi-step greedy
// decode.
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/llm_engine.h"

namespace ssmserve {

void host_greedy_steps(CausalLM& model, const ForwardBatch& batch, StateCache& cache, int num_top, int steps,
                       std::vector<float>& logits, std::vector<float>& scratch, std::vector<GreedyPick>& out) {
  const size_t n = batch.logits_indices.size();
  const int V = model.config().vocab_size;
  ForwardBatch b = batch;
  SamplingParams greedy;
  greedy.temperature = 0.0;
  greedy.logprobs = num_top;
  RequestRng rng(std::optional<uint64_t>(0));  // unused by greedy picks
  logits.resize(n * static_cast<size_t>(V));
  out.assign(static_cast<size_t>(steps) * n, GreedyPick{});
  for (int j = 0; j < steps; ++j) {
    model.forward(b, cache, logits.data());
    for (size_t i = 0; i < n; ++i) {
      std::span<const float> row(logits.data() + i * static_cast<size_t>(V), static_cast<size_t>(V));
      const SampleResult s = sample_token(row, greedy, {}, {}, {}, rng, scratch);
      GreedyPick& g = out[static_cast<size_t>(j) * n + i];
      g.token = s.token;
      g.logprob = s.logprob;
      g.sampled_rank = s.rank;
      for (const auto& t : s.top) g.top.emplace_back(t.id, t.logprob);
      b.input_ids[static_cast<size_t>(b.logits_indices[i])] = s.token;  // the next step's input of that row
    }
  }
}

std::vector<RequestOutput> LLM::run(std::vector<Request> reqs) {
  std::map<std::string, size_t> index;
  for (auto& r : reqs) {
    r.request_id = "llm-" + std::to_string(next_id_++);
    index[r.request_id] = index.size();
    engine_.add_request(std::move(r));
  }
  std::vector<RequestOutput> results(index.size());
  while (engine_.has_unfinished_requests())
    for (auto& o : engine_.step())
      if (o.finished) results[index.at(o.request_id)] = std::move(o);
  return results;
}

std::vector<RequestOutput> LLM::generate(const std::vector<std::string>& prompts, const SamplingParams& params) {
  return generate(prompts, std::vector<SamplingParams>(prompts.size(), params));
}

std::vector<RequestOutput> LLM::generate(const std::vector<std::string>& prompts, const std::vector<SamplingParams>& params) {
  SSM_CHECK(prompts.size() == params.size(), "LLM::generate: {} prompts but {} sampling params", prompts.size(), params.size());
  std::vector<Request> reqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) reqs[i].prompt = prompts[i], reqs[i].params = params[i];
  return run(std::move(reqs));
}

std::vector<RequestOutput> LLM::generate_ids(const std::vector<std::vector<int>>& prompts, const SamplingParams& params) {
  std::vector<Request> reqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) reqs[i].prompt_token_ids = prompts[i], reqs[i].params = params;
  return run(std::move(reqs));
}

}  // namespace ssmserve
