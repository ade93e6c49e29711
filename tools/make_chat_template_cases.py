#!/usr/bin/env python3
"""Writes tests/data/chat_templates.jsonl: chat templates rendered by Python's Jinja2 exactly as transformers'
apply_chat_template renders them (trim_blocks, lstrip_blocks, loopcontrols, raise_exception, tojson with
ensure_ascii=False). tests/unit/test_server_jinja.cpp checks ssmserve's Jinja engine against these outputs."""
import json
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATES = {
    "default": "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
               "{% if add_generation_prompt %}Assistant:{% endif %}",
    "chatml": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    "llama2": "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
              "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
              "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
              "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
              "{% else %}{% set content = message['content'] %}{% endif %}"
              "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
              "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
    "zephyr": "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n"
              "{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
              "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
              "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}",
    "namespace_and_filters": "{%- set ns = namespace(found=false, n=0) -%}\n"
              "{%- for m in messages -%}\n  {%- if m.role == 'system' %}{% set ns.found = true %}{% endif -%}\n"
              "  {%- set ns.n = ns.n + m.content | length -%}\n{%- endfor -%}\n"
              "sys={{ ns.found }} chars={{ ns.n }} roles={{ messages | map(attribute='role') | join(',') }}\n"
              "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} user / {{ messages | length }}\n"
              "{{ messages[-1] | tojson }}\n{{ {'a': [1, 2.5, none, true], 'b': 'x\"y'} | tojson }}\n"
              "{% for k, v in {'x': 1, 'y': 'z'}.items() %}{{ k }}={{ v }}{{ ',' if not loop.last }}{% endfor %}\n"
              "{{ 'A b C' | lower | title }} {{ '  pad  ' | trim }}|{{ 'abc'[::-1] }}|{{ 'abc'[1:] }}|{{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 3 }} {{ 1 / 2 }}\n"
              "{{ [1, 2] + [3] }} {{ none }} {{ true }} {{ 3.0 }} {{ 'x' ~ 1 }} {{ 'q' in 'quiet' }} {{ 5 is divisibleby 5 }}\n"
              "{{ undefined_var | default('dflt') }} {{ messages[0].get('name', 'anon') }} {{ 'a,b,c'.split(',') }}",
    "loop_controls": "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}"
                     "{% if loop.index > 3 %}{% break %}{% endif %}[{{ loop.index }}/{{ loop.length }} {{ m.role }}]"
                     "{% else %}empty{% endfor %}\n{% macro wrap(text, tag='b') %}<{{ tag }}>{{ text }}</{{ tag }}>{% endmacro %}"
                     "{{ wrap('hi') }}{{ wrap('yo', tag='i') }}\n    {% if true %}\n        indented\n    {% endif %}\nend",
}

MESSAGES = [
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there"},
     {"role": "assistant", "content": " Hi! "}, {"role": "user", "content": "Naïve café ✓ \"quotes\""}],
    [{"role": "user", "content": "One"}],
]


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    out = Path(__file__).resolve().parents[1] / "tests" / "data" / "chat_templates.jsonl"
    with out.open("w") as f:
        for name, source in TEMPLATES.items():
            for i, messages in enumerate(MESSAGES):
                for gen in (True, False):
                    ctx = {"messages": messages, "add_generation_prompt": gen, "bos_token": "<s>", "eos_token": "</s>"}
                    try:
                        expected, error = env.from_string(source).render(**ctx), None
                    except jinja2.exceptions.TemplateError as e:
                        expected, error = None, str(e)
                    f.write(json.dumps({"name": f"{name}/{i}/{gen}", "template": source, "context": ctx,
                                        "expected": expected, "error": error}, ensure_ascii=False) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
