#!/usr/bin/env python3
"""Renders the published chat templates of the supported families with transformers' apply_chat_template and writes
the expected strings, for tests/unit/test_chat_families.cpp.

Run: /work/venv-tok/bin/python tools/make_chat_template_family_cases.py   (venv: see make_tokenizer_configs_expected.py)

Templates (tests/data/tokenizers/chat/*.jinja, as published; found with the search tool):
  qwen3.jinja             Qwen3 (hermes-style JSON tool calls, reasoning_content, enable_thinking)
                          (ggml-org/llama.cpp models/templates/Qwen-Qwen3-0.6B.jinja)
  qwen3_next_instruct.jinja / qwen3_next_thinking.jinja
                          Qwen3-Next-80B-A3B-Instruct / -Thinking (hermes JSON tool calls; content lists read as '';
                          Thinking: always-open <think> generation prompt, reasoning kept after the last query). Their
                          checkpoints ship the template inside tokenizer_config.json, so no file hash is published; the
                          best-sourced copies found are the "chat_template" values of the Qwen3-Next-Instruct and
                          Qwen3-Next-Thinking entries of xorbitsai/inference xinference/model/llm/llm_family.json
                          (commit b9734447dbd07d117232f3ae91955e3b0ea7b60b), which registers them for those checkpoints;
                          the Thinking text equals the Qwen3-*-Thinking-2507 template as quoted elsewhere.
  qwen3_coder_xml.jinja   the XML tool-call format of Qwen3-Coder (macros, |items, loop.previtem/nextitem)
                          (vllm-project/vllm examples/tool_chat_template_qwen3coder.jinja)
  qwen3_5.jinja           Qwen3.5 (image / video content items, XML tool calls, reasoning, enable_thinking): the
                          chat_template.jinja of the Qwen/Qwen3.5-* checkpoints, 7756 bytes, SHA-256
                          a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715 (the hash pinned for
                          Qwen/Qwen3.5-4B, -9B and -35B-A3B by several public projects; the text as quoted from
                          mlx-community/Qwen3.5-35B-A3B-4bit/chat_template.jinja, matched to that hash byte for byte)
  qwen3_6.jinja           Qwen3.6 (Qwen3.5's plus preserve_thinking and tojson for every non-string argument): the
                          chat_template.jinja of Qwen/Qwen3.6-27B (revision 6a9e13bd6fc8f0983b9b99948120bc37f49c13e9),
                          7764 bytes, SHA-256 e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259
                          (the same hash pinned for Qwen3.6-35B-A3B; text matched to it byte for byte)
  granite4.jinja          Granite-4.0-H (tools, documents, content lists, namespaces)
                          (as quoted in the Berkeley function-calling leaderboard's Granite-4 handler)
  nemotron_nano_v2.jinja  Nemotron-H Nano v2 (/think and /no_think, tool calls, continue_final_message)
                          (ggml-org/llama.cpp models/templates/NVIDIA-Nemotron-Nano-v2.jinja)
  nemotron3_nano.jinja    NVIDIA-Nemotron-3-Nano-30B-A3B (differs from Nano v2: Qwen3-Coder-style XML tools and tool
                          calls, reasoning_content, enable_thinking / truncate_history_thinking kwargs, <think></think>
                          on history turns): ggml-org/llama.cpp models/templates/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja
                          as of llama.cpp commit c15395f73c42805d9609a55749a1d4b5b2251379 (LF line endings; the file
                          added in c05aa69f32ee87b2019a1b39979d89302c2d6b7b had CRLF), 10504 bytes, SHA-256
                          ab7813c3abdd9cb655905a410728b26c7884eca45ddfab8d9f931553485a7862 (read from the
                          Raudbjorn/ggml-llama.cpp mirror)
  nemotron3_nano_crlf.jinja the same template as first added to llama.cpp (commit c05aa69f32ee87b2019a1b39979d89302c2d6b7b),
                          CRLF line endings, 10708 bytes, SHA-256
                          650b9d301337fd103f9014f6f6ae89b46660ae92e4421d95bd3157115e5b02ce: Jinja2 reads CRLF as LF, so
                          its renders equal nemotron3_nano's (checks that ssmserve's lexer does the same)
  falcon_h1.jinja         Falcon-H1-*-Instruct (tiiuae; ChatML, hermes-style tool list, bos_token first): the
                          "chat_template" of the Falcon-H1 tokenizer_config.json, as quoted by the Hub pages of
                          onnx-internal-testing/tiny-random-FalconH1ForCausalLM/tokenizer_config.json and
                          NexVeridian/Falcon-H1-7B-Instruct-8bit/chat_template.jinja (identical text). The pages collapse
                          leading indentation, so the 4-space indentation here is a reconstruction (every indented line
                          starts with {{- or {%-, so renders do not depend on it) and no hash is pinned.
  jamba.jinja             AI21-Jamba-Mini-1.7 (and 1.5; macros, namespace, tools / documents / knobs, citations,
                          macro values called with *args): the tokenizer.chat_template metadata of
                          bartowski/ai21labs_AI21-Jamba-Mini-1.7-GGUF as extracted byte for byte by r-rojo/rampipe
                          tests/fixtures/jamba_mini_1_7_chat_template.jinja (commit
                          3c7722e3161b0b15312e3d78b203df4955cba762), 9632 bytes, SHA-256
                          62d5a4d1d662a1c8d3f48077c4307e5e0f5502b63830dbd40f467d14a26146bf
  minimax_text_01.jinja   MiniMaxAI/MiniMax-Text-01 (content lists only, 'function' role, {% generation %} blocks):
                          the "chat_template" of its tokenizer_config.json at Hub commit 7466de1 ("Guide document for
                          function calling (#32)"), quoted in full (one line, JSON-escaped) by the Hub page of that file;
                          no hash is pinned.
Not covered: Bamba (ibm-ai-platform/Bamba-9B-v2 and ibm-fms/Bamba-9B* are base models; no chat_template found in their
model cards or tokenizer_config.json pages) and Mamba-Codestral-7B-v0.1 (Mistral tokenizer v3 through mistral_common,
tokenizer.model.v3 / params.json; no Jinja template found in the repo pages or Mistral's docs).

Expected strings last generated with transformers 5.24.0, Jinja2 3.1.6, tokenizers 0.23.3 (the earlier families'
cases came out byte-identical under these versions).

Each case renders through AutoTokenizer.from_pretrained of a folder holding tests/data/tokenizers/bytelevel_llama3's
tokenizer.json and a tokenizer_config.json with the template and bos/eos tokens, exactly as a checkpoint ships it.
Output: tests/data/tokenizers/chat/cases.jsonl, one case a line: {"template", "messages", "tools", "documents",
"kwargs", "add_generation_prompt", "continue_final_message", "expected"} ("expected" null when transformers raises).
"""
import copy
import hashlib
import json
import pathlib
import tempfile

from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "tokenizers"
CHAT = DATA / "chat"
TEMPLATES = ["qwen3", "qwen3_coder_xml", "granite4", "nemotron_nano_v2", "qwen3_5", "qwen3_6", "qwen3_next_instruct",
             "qwen3_next_thinking", "falcon_h1", "jamba", "minimax_text_01", "nemotron3_nano",
             "nemotron3_nano_crlf"]
QWEN35 = {"qwen3_5", "qwen3_6"}  # templates that also get the Qwen3.5-only conversations and variants
# Published templates whose exact bytes are pinned (a stray edit, e.g. an added final newline, changes renders).
SHA256 = {"qwen3_5": "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
          "qwen3_6": "e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259",
          "jamba": "62d5a4d1d662a1c8d3f48077c4307e5e0f5502b63830dbd40f467d14a26146bf",
          "nemotron3_nano": "ab7813c3abdd9cb655905a410728b26c7884eca45ddfab8d9f931553485a7862",
          "nemotron3_nano_crlf": "650b9d301337fd103f9014f6f6ae89b46660ae92e4421d95bd3157115e5b02ce"}
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
# Qwen3.5 / 3.6 only: image / video items, tool arguments of every JSON type, multi-turn reasoning with tool rounds,
# tool results given as a user message, and the conversations these templates refuse (expected null).
IMAGE = {"type": "image", "image": "file:///duck.png"}
CALLS_TYPED = {"role": "assistant", "content": None, "reasoning_content": "  Need both.\n", "tool_calls": [
    {"type": "function", "function": {"name": "search", "arguments": {
        "query": "line one\nline two", "filters": ["a", "b"], "opts": {"deep": True, "n": 3}, "exact": False,
        "limit": 10, "score": 0.5, "missing": None, "empty": ""}}},
    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {}}},
    {"name": "get_weather", "arguments": {"city": "Rome"}}]}
QWEN35_CONVERSATIONS = [
    ("vision", [{"role": "system", "content": [{"type": "text", "text": "  Describe media.  "}]},
                {"role": "user", "content": [IMAGE, {"type": "text", "text": "What is this?"},
                                             {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                                             {"type": "video", "video": "file:///v.mp4"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "A duck."}]},
                {"role": "user", "content": [{"image": "file:///b.png"}, {"type": "text", "text": "And this?"},
                                             {"type": "video"}]}]),
    ("reasoning_tool_rounds", [SYSTEM, USER1, REASONED, USER2, CALLS_TYPED, TOOL1, TOOL2,
                               {"role": "assistant", "content": "<think>\n  Compare.  \n</think>\n\n  Both mild.  ",
                                "tool_calls": [{"type": "function", "function": {"name": "search",
                                                                                   "arguments": {"query": "x"}}}]},
                               {"role": "tool", "content": [{"type": "text", "text": "ok"}]},
                               {"role": "assistant", "content": "Done", "reasoning_content": ""}]),
    ("tool_response_as_user", [USER2, CALLS_ONLY, {"role": "user", "content": "<tool_response>\n42\n</tool_response>"},
                               {"role": "assistant", "content": "It is 42.", "reasoning_content": "Read it."}]),
    ("no_user_query", [SYSTEM, {"role": "user", "content": "<tool_response>x</tool_response>"}]),
    ("system_not_first", [USER1, SYSTEM]),
    ("image_in_system", [{"role": "system", "content": [IMAGE]}, USER1]),
    ("unknown_item", [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}]}]),
    ("unknown_role", [USER1, {"role": "developer", "content": "x"}]),
    ("empty", []),
    ("odd_content", [{"role": "tool", "content": "early"}, {"role": "user", "content": None},
                     {"role": "assistant", "content": "<think>unclosed", "tool_calls": [
                         {"type": "function", "function": {"name": "search"}}]},
                     {"role": "user", "content": []}]),
    ("content_strings", [{"role": "user", "content": ["an image", "text"]}]),
    ("content_mapping", [{"role": "user", "content": {"type": "text", "text": "x"}}]),
    ("content_number", [{"role": "user", "content": 42}]),
]
QWEN35_VARIANTS = [
    dict(add_generation_prompt=True, kwargs={"enable_thinking": True}),
    dict(add_generation_prompt=True, kwargs={"preserve_thinking": True, "enable_thinking": False}),
    dict(add_generation_prompt=True, tools=TOOLS, kwargs={"add_vision_id": True, "preserve_thinking": False}),
    dict(add_generation_prompt=True, kwargs={"enable_thinking": 0, "preserve_thinking": 1, "add_vision_id": "yes"}),
]
# Conversations / variants for one template only (the shapes those templates read: MiniMax's content lists and
# 'function' role, Jamba's names, citations and knobs, Nemotron-3's truncate_history_thinking).
def _text(t):
    return [{"type": "text", "text": t}]


LIST_CONVERSATIONS = [
    ("content_lists", [{"role": "system", "content": _text("You are terse.")},
                       {"role": "user", "content": _text("Weather in Z\u00fcrich?") + [{"type": "image"}]},
                       {"role": "assistant", "content": _text("Checking.") + [{"type": "image"}] + _text(" Done.")},
                       {"role": "function", "name": "get_weather", "content": _text("{\"temp\": 21}")},
                       {"role": "user", "content": _text("Thanks")}]),
    ("content_lists_no_system", [{"role": "user", "content": _text("Hi")},
                                 {"role": "assistant", "content": []},
                                 {"role": "user", "content": _text("Again")}]),
]
JAMBA_CONVERSATIONS = [
    ("names_citations", [SYSTEM, {"role": "user", "name": "ann", "content": "Which bird quacks?"},
                         {"role": "assistant", "content": "Ducks.", "citations": [{"document_id": 0}, {"document_id": 1}]},
                         {"role": "user", "content": "And honks?"}]),
]
EXTRA_CONVERSATIONS = {"minimax_text_01": LIST_CONVERSATIONS, "jamba": JAMBA_CONVERSATIONS + LIST_CONVERSATIONS,
                       "falcon_h1": LIST_CONVERSATIONS, "nemotron3_nano": LIST_CONVERSATIONS,
                       "nemotron3_nano_crlf": LIST_CONVERSATIONS}
EXTRA_VARIANTS = {
    "jamba": [dict(add_generation_prompt=True, documents=DOCS,
                   kwargs={"knobs": {"is_set": True, "citation_mode": "fast", "response_format": "json_object"}}),
              dict(add_generation_prompt=True, kwargs={"knobs": {"is_set": True, "citation_mode": "off"},
                                                        "generation_preamble": " Sure:", "role_to_predict": "tool"}),
              dict(add_generation_prompt=False, tools=TOOLS, kwargs={"default_system_message": "Be nice.",
                                                                      "bom_str": "<B>", "eom_str": "<E>"})],
    "nemotron3_nano": [dict(add_generation_prompt=True, tools=TOOLS, kwargs={"truncate_history_thinking": False}),
                       dict(add_generation_prompt=True, kwargs={"enable_thinking": False,
                                                                "truncate_history_thinking": True})],
}
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
            if name in SHA256:
                got = hashlib.sha256((CHAT / f"{name}.jinja").read_bytes()).hexdigest()
                assert got == SHA256[name], f"{name}.jinja is not the published text (sha256 {got})"
            tok = tokenizer_with((CHAT / f"{name}.jinja").read_bytes().decode())  # bytes as published (CRLF kept)
            qwen35 = name in QWEN35
            for conv_name, messages in (CONVERSATIONS + (QWEN35_CONVERSATIONS if qwen35 else []) +
                                        EXTRA_CONVERSATIONS.get(name, [])):
                for v in VARIANTS + (QWEN35_VARIANTS if qwen35 else []) + EXTRA_VARIANTS.get(name, []):
                    if v.get("continue_final_message") and (not messages or messages[-1]["role"] != "assistant"):
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
