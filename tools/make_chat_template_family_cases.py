#!/usr/bin/env python3
"""Renders the published chat templates of the supported families with transformers' apply_chat_template and writes
the expected strings, for tests/unit/test_chat_families.cpp.

Run: /work/venv-tok/bin/python tools/make_chat_template_family_cases.py   (venv: see make_tokenizer_configs_expected.py)

Templates (tests/data/tokenizers/chat/*.jinja, as published; found with the search tool):
  qwen3.jinja             Qwen3 / Qwen3-Next (hermes-style JSON tool calls, reasoning_content, enable_thinking)
                          (ggml-org/llama.cpp models/templates/Qwen-Qwen3-0.6B.jinja)
  qwen3_coder_xml.jinja   the XML tool-call format of Qwen3-Coder / Qwen3.5 (macros, |items, loop.previtem/nextitem)
                          (vllm-project/vllm examples/tool_chat_template_qwen3coder.jinja)
  granite4.jinja          Granite-4.0-H (tools, documents, content lists, namespaces)
                          (as quoted in the Berkeley function-calling leaderboard's Granite-4 handler)
  nemotron_nano_v2.jinja  Nemotron-H Nano v2 (/think and /no_think, tool calls, continue_final_message)
                          (ggml-org/llama.cpp models/templates/NVIDIA-Nemotron-Nano-v2.jinja)

Each case renders through AutoTokenizer.from_pretrained of a folder holding tests/data/tokenizers/bytelevel_llama3's
tokenizer.json and a tokenizer_config.json with the template and bos/eos tokens, exactly as a checkpoint ships it.
Output: tests/data/tokenizers/chat/cases.jsonl, one case a line: {"template", "messages", "tools", "documents",
"kwargs", "add_generation_prompt", "continue_final_message", "expected"} ("expected" null when transformers raises).
"""
import copy
import json
import pathlib
import tempfile

from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "tokenizers"
CHAT = DATA / "chat"
TEMPLATES = ["qwen3", "qwen3_coder_xml", "granite4", "nemotron_nano_v2"]
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "  Current weather for a city.\n",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web \"quickly\".",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                          "filters": {"type": "array", "items": {"type": "string"}}}}}},
]
DOCS = [{"title": "Ducks", "text": "Ducks quack.\nThey swim."}, {"title": "Geese", "text": "Geese honk \u2014 loudly."}]

SYSTEM = {"role": "system", "content": "You are terse. /no_think"}
USER1 = {"role": "user", "content": "Hi there! \u00bfQu\u00e9 tal? \U0001F600"}
ASSIST1 = {"role": "assistant", "content": "Hello. How can I help?"}
USER2 = {"role": "user", "content": "What's the weather in Z\u00fcrich and Paris? /think"}
CALLS = {"role": "assistant", "content": "Let me check.", "tool_calls": [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Z\u00fcrich", "days": 2}}},
    {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}
CALLS_ONLY = {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "search", "arguments": {"query": "ducks", "filters": ["a", "b"]}}}]}
TOOL1 = {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}
TOOL2 = {"role": "tool", "content": "{\"temp\": 17}"}
FINAL = {"role": "assistant", "content": "<think>\nZ\u00fcrich 21, Paris 17.\n</think>\n\nZ\u00fcrich is 21\u00b0C, Paris 17\u00b0C."}
REASONED = {"role": "assistant", "content": "Done.", "reasoning_content": "The user asked; I answered."}
USER3 = {"role": "user", "content": "Thanks"}
CONT = {"role": "assistant", "content": "The answer is"}

CONVERSATIONS = [
    ("single_user", [USER1]),
    ("system_multi_turn", [SYSTEM, USER1, ASSIST1, USER2]),
    ("tools_round_trip", [SYSTEM, USER2, CALLS, TOOL1, TOOL2, FINAL, USER3]),
    ("tool_calls_last", [USER2, CALLS_ONLY]),
    ("reasoning_field", [USER1, REASONED, USER3, FINAL]),
    ("no_system_tools", [USER2, CALLS, TOOL1]),
    ("continue_assistant", [USER1, CONT]),
    ("content_list", [{"role": "system", "content": [{"type": "text", "text": "Be brief."},
                                                   {"type": "text", "text": "Be kind."}]},
                      {"role": "user", "content": [{"type": "text", "text": "One"}, {"type": "text", "text": "Two"}]}]),
]
VARIANTS = [
    dict(add_generation_prompt=True),
    dict(add_generation_prompt=False),
    dict(add_generation_prompt=True, tools=TOOLS),
    dict(add_generation_prompt=True, kwargs={"enable_thinking": False}),
    dict(add_generation_prompt=True, tools=TOOLS, documents=DOCS, kwargs={"enable_thinking": True}),
    dict(add_generation_prompt=False, continue_final_message=True),
]


def tokenizer_with(template):
    d = tempfile.mkdtemp()
    (pathlib.Path(d) / "tokenizer.json").write_text((DATA / "bytelevel_llama3" / "tokenizer.json").read_text())
    (pathlib.Path(d) / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "chat_template": template}))
    return AutoTokenizer.from_pretrained(d)


def main():
    with open(CHAT / "cases.jsonl", "w") as f:
        n = errors = 0
        for name in TEMPLATES:
            tok = tokenizer_with((CHAT / f"{name}.jinja").read_text())
            for conv_name, messages in CONVERSATIONS:
                for v in VARIANTS:
                    if v.get("continue_final_message") and messages[-1]["role"] != "assistant":
                        continue
                    case = {"template": name, "conversation": conv_name, "messages": messages,
                            "tools": v.get("tools"), "documents": v.get("documents"), "kwargs": v.get("kwargs", {}),
                            "add_generation_prompt": v["add_generation_prompt"],
                            "continue_final_message": v.get("continue_final_message", False)}
                    try:
                        case["expected"] = tok.apply_chat_template(
                            copy.deepcopy(messages), tools=case["tools"], documents=case["documents"],
                            add_generation_prompt=case["add_generation_prompt"],
                            continue_final_message=case["continue_final_message"], tokenize=False, **case["kwargs"])
                    except Exception:  # noqa: BLE001 - the C++ side must raise too
                        case["expected"] = None
                        errors += 1
                    f.write(json.dumps(case, ensure_ascii=False) + "\n")
                    n += 1
    print(f"wrote {n} cases ({errors} raise) to {CHAT / 'cases.jsonl'}")


if __name__ == "__main__":
    main()
