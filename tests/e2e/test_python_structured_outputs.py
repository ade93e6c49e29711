# The Python package's structured outputs (vLLM's SamplingParams(structured_outputs=StructuredOutputsParams(...))):
# LLM.generate / stream / AsyncLLM with a choice, regex, JSON schema and EBNF grammar on the bundled tiny model, the
# constructor's checks (TypeError / ValueError naming the field), equality, pickling, repr and clone.
import asyncio
import copy
import json
import pickle
import re

import pytest

from conftest import MODEL

import ssmserve  # installed by `pip install .` (scripts/test.sh does it)
from ssmserve import LLM, SamplingParams
from ssmserve.sampling_params import StructuredOutputsParams

PROMPT = "And the LORD said unto Moses,"

needs_xgrammar = pytest.mark.skipif(not ssmserve.has_structured_outputs,
                                    reason="package built without structured outputs (xgrammar)")


@pytest.fixture(scope="module")
def llm():
    return LLM(str(MODEL), max_num_seqs=8, threads=2)


def texts(outs):
    return [c.text for o in outs for c in o.outputs]


@needs_xgrammar
def test_choice_greedy_and_sampled(llm):
    choices = ["yes", "no", "maybe so"]
    so = StructuredOutputsParams(choice=choices)
    greedy = SamplingParams(temperature=0, max_tokens=16, structured_outputs=so)
    outs = llm.generate([PROMPT, "Call me Ishmael."], greedy, use_tqdm=False)
    for o in outs:
        c = o.outputs[0]
        assert c.text in choices and c.finish_reason == "stop", (c.text, c.finish_reason)
    sampled = llm.generate(PROMPT, SamplingParams(temperature=1.0, seed=7, n=4, max_tokens=16, structured_outputs=so),
                           use_tqdm=False)
    assert all(t in choices for t in texts(sampled)), texts(sampled)
    # Unconstrained, the model says something else: the constraint is what made the outputs above.
    free = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0].outputs[0].text
    assert free not in choices


@needs_xgrammar
def test_regex(llm):
    pattern = r"[a-z]{3,6}@[a-z]{2,4}\.(com|org)"
    so = StructuredOutputsParams(regex=pattern)
    p = SamplingParams(temperature=0.8, seed=3, n=3, max_tokens=32, structured_outputs=so)
    for t in texts(llm.generate(PROMPT, p, use_tqdm=False)):
        assert re.fullmatch(pattern, t), t


@needs_xgrammar
def test_json_schema_dict_and_text(llm):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
              "required": ["name", "ok"]}
    for so in (StructuredOutputsParams(json=schema, disable_any_whitespace=True),
               StructuredOutputsParams(json=json.dumps(schema), disable_any_whitespace=True)):
        assert json.loads(so.json) == schema  # a dict is kept as its JSON text
        p = SamplingParams(temperature=0, max_tokens=64, structured_outputs=so)
        out = llm.generate(PROMPT, p, use_tqdm=False)[0]
        c = out.outputs[0]
        value = json.loads(c.text)
        assert set(value) == {"name", "ok"} and isinstance(value["name"], str) and len(value["name"]) <= 6
        # disable_any_whitespace: xgrammar's fixed separators (", " and ": ", as json.dumps), no other whitespace
        assert isinstance(value["ok"], bool) and c.text == json.dumps(value)
        assert c.finish_reason == "stop"


@needs_xgrammar
def test_json_object_is_an_object(llm):
    # A bias toward "[" (any temperature, any device) would start a JSON array: the constraint allows only an object.
    bracket = llm.get_tokenizer().encode("[")
    assert len(bracket) == 1
    p = SamplingParams(temperature=0, max_tokens=8, logit_bias={bracket[0]: 100},
                       structured_outputs=StructuredOutputsParams(json_object=True))
    text = llm.generate(PROMPT, p, use_tqdm=False)[0].outputs[0].text
    assert text.lstrip().startswith("{"), text


@needs_xgrammar
def test_grammar_stream_and_async(llm):
    so = StructuredOutputsParams(grammar='root ::= "ab" | "c" digit digit\ndigit ::= [0-9]')
    p = SamplingParams(temperature=0.7, seed=1, max_tokens=8, structured_outputs=so)
    text = llm.generate(PROMPT, p, use_tqdm=False)[0].outputs[0].text
    assert re.fullmatch(r"ab|c[0-9]{2}", text), text
    streamed = list(llm.stream(PROMPT, p))
    assert streamed[-1].finished and streamed[-1].outputs[0].text == text

    engine = ssmserve.AsyncLLM.from_engine_args(ssmserve.AsyncEngineArgs(model=str(MODEL), threads=2))

    async def run():
        last = None
        async for out in engine.generate(PROMPT, p, request_id="so-async"):
            last = out
        return last

    try:
        assert asyncio.run(run()).outputs[0].text == text
    finally:
        engine.shutdown()


@needs_xgrammar
def test_invalid_constraints_name_the_field(llm):
    for so, field in ((StructuredOutputsParams(json='{"type": "object", "properties": '), "structured_outputs.json"),
                      (StructuredOutputsParams(json={"type": "no-such-type"}), "structured_outputs.json"),
                      (StructuredOutputsParams(regex="(unclosed"), "structured_outputs.regex"),
                      (StructuredOutputsParams(grammar="root ::= undefined_rule"), "structured_outputs.grammar")):
        with pytest.raises(ssmserve.SsmserveError, match=re.escape(field)):
            llm.generate([PROMPT, PROMPT], [SamplingParams(max_tokens=4),
                                            SamplingParams(max_tokens=4, structured_outputs=so)], use_tqdm=False)
    # Nothing was left behind: the engine is idle and still serves.
    stats = llm.get_engine_stats()
    assert stats["num_running_requests"] == 0 and stats["num_waiting_requests"] == 0
    assert llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids


def test_constructor_checks():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json={"type": "string"}, regex="a+")
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match=r"structured_outputs\.choice"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match=r"structured_outputs\.choice\[1\]"):
        StructuredOutputsParams(choice=["a", ""])
    with pytest.raises(ValueError, match=r"structured_outputs\.regex"):
        StructuredOutputsParams(regex="")
    with pytest.raises(ValueError, match=r"structured_outputs\.json_object"):
        StructuredOutputsParams(json_object=False)
    with pytest.raises(ValueError, match=r"structured_outputs\.whitespace_pattern"):
        StructuredOutputsParams(json={"type": "string"}, whitespace_pattern=r"\s*")
    with pytest.raises(ValueError, match=r"structured_outputs\.json"):
        StructuredOutputsParams(json={"type": "number", "maximum": float("nan")})
    for kwargs, field in (({"choice": "yes"}, "choice"), ({"choice": ["a", 1]}, r"choice\[1\]"), ({"json": 5}, "json"),
                          ({"json": {"default": {1, 2}}}, "json"), ({"regex": b"a"}, "regex"),
                          ({"json_object": 1}, "json_object"), ({"regex": "a", "disable_any_whitespace": None},
                                                                "disable_any_whitespace")):
        with pytest.raises(TypeError, match=r"structured_outputs\." + field):
            StructuredOutputsParams(**kwargs)
    with pytest.raises(TypeError, match="unexpected keyword argument 'schema'"):
        StructuredOutputsParams(schema={})
    with pytest.raises(TypeError, match="SamplingParams.structured_outputs"):
        SamplingParams(structured_outputs={"json": {"type": "string"}})
    # Two constraints set after construction: SamplingParams checks the one it is given.
    so = StructuredOutputsParams(regex="a+")
    so.choice = ["a"]
    assert not so.all_constraints_none()
    with pytest.raises(ValueError, match="exactly one"):
        SamplingParams(structured_outputs=so)
    with pytest.raises(ValueError, match="exactly one"):
        so.validate()


def test_values_equality_pickle_repr_clone():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    so = StructuredOutputsParams(json=schema, disable_additional_properties=True)
    assert so.json == json.dumps(schema) and so.regex is None and so.choice is None and so.json_object is None
    assert so.disable_additional_properties and not so.disable_any_whitespace and so.whitespace_pattern is None
    assert StructuredOutputsParams(json_object=True).json_object is True
    assert StructuredOutputsParams(choice=("a", "b")).choice == ["a", "b"]
    assert StructuredOutputsParams(json=json.dumps(schema), disable_additional_properties=True) == so
    assert so != StructuredOutputsParams(json=schema) and so != "so"
    with pytest.raises(TypeError):
        hash(so)  # mutable, as vLLM's dataclass
    assert repr(so).startswith("StructuredOutputsParams(json='{") and "disable_additional_properties=True" in repr(so)
    for q in (pickle.loads(pickle.dumps(so)), copy.deepcopy(so), copy.copy(so)):
        assert q == so and q is not so and repr(q) == repr(so)

    p = SamplingParams(temperature=0, max_tokens=20, structured_outputs=StructuredOutputsParams(choice=["x", "y"]))
    assert isinstance(p.structured_outputs, StructuredOutputsParams) and p.structured_outputs.choice == ["x", "y"]
    assert "structured_outputs=StructuredOutputsParams(json=None, regex=None, choice=['x', 'y']" in repr(p)
    for q in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p), copy.copy(p), p.clone()):
        assert q == p and q is not p and repr(q) == repr(p) and type(q) is SamplingParams
    assert p != SamplingParams(temperature=0, max_tokens=20)
    assert p != SamplingParams(temperature=0, max_tokens=20, structured_outputs=StructuredOutputsParams(choice=["x"]))
    assert SamplingParams().structured_outputs is None and "structured_outputs=None" in repr(SamplingParams())
    # A read is a copy (as a list field's): dropping the params' constraint leaves it intact.
    held = p.structured_outputs
    p.structured_outputs = None
    assert held.choice == ["x", "y"] and p.structured_outputs is None
    p.structured_outputs = StructuredOutputsParams(regex="[0-9]+")
    assert p.structured_outputs.regex == "[0-9]+"
    from ssmserve import sampling_params

    assert sampling_params.SamplingParams is SamplingParams and set(sampling_params.__all__) == {
        "SamplingParams", "StructuredOutputsParams", "RequestOutputKind"}
