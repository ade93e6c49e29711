# SamplingParams(bad_words=[...]) through the Python package (vLLM's API): the banned words' tokens (as given and with a
# leading space) are never generated where the unconstrained greedy output had them; a request with bad words gives the
# same tokens batched with others; wrong types are TypeErrors, bad values ValueErrors naming the field; bad_words
# survives pickling and shows in the repr.
import copy
import pickle

import pytest

from conftest import MODEL

import ssmserve  # installed by `pip install .` (scripts/test.sh does it)
from ssmserve import SamplingParams

PROMPTS = ["It is a truth universally acknowledged", "And the LORD said unto Moses,", "The"]
WORDS = ["am", "sure", "son", "the"]  # one token as given and with a leading space each: both variants banned


@pytest.fixture(scope="module")
def llm():
    return ssmserve.LLM(str(MODEL), max_num_seqs=8, threads=2)


def _contains(ids, seq):
    return any(ids[i:i + len(seq)] == seq for i in range(len(ids) - len(seq) + 1))


def test_bad_words_are_never_generated(llm):
    tok = llm.get_tokenizer()
    banned = [tok.encode(v) for w in WORDS for v in (w, " " + w)]
    assert all(len(s) == 1 for s in banned)
    plain = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ban = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, bad_words=WORDS)
    before = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, plain, use_tqdm=False)]
    after = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, ban, use_tqdm=False)]
    for b, a in zip(before, after):
        first = min(i for i, t in enumerate(b) if [t] in banned)  # the unconstrained output has a banned word
        assert a[:first] == b[:first] and a[first] != b[first]
        assert not any(_contains(a, s) for s in banned), tok.decode(a)
    # Batch invariance: next to unconstrained requests, each banned request gives its tokens alone.
    mixed = llm.generate(PROMPTS + PROMPTS, [ban] * 3 + [plain] * 3, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed] == after + before
    # A multi-word entry bans its token sequence only after its prefix: " I am" / "I am" keep " I".
    two = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24, bad_words=["I am"]), use_tqdm=False)
    ids = two[0].outputs[0].token_ids
    assert not _contains(ids, tok.encode(" I am")) and not _contains(ids, tok.encode("I am"))
    assert tok.encode(" I")[0] in ids


def test_bad_words_types_and_values():
    assert SamplingParams().bad_words == [] and SamplingParams(bad_words=None).bad_words == []
    assert SamplingParams(bad_words=("a", "b")).bad_words == ["a", "b"]
    for bad in ("word", [1], b"word", 3):
        with pytest.raises(TypeError, match="SamplingParams.bad_words must be a list of str"):
            SamplingParams(bad_words=bad)
    with pytest.raises(ValueError, match="bad_words cannot contain an empty string"):
        SamplingParams(bad_words=["ok", ""])
    with pytest.raises(ValueError, match="at most 128"):
        SamplingParams(bad_words=["w%d" % i for i in range(129)])


def test_a_word_that_tokenizes_to_nothing_is_refused_at_generate(llm):
    with pytest.raises(ValueError, match=r"bad_words\[1\] must tokenize to at least one token"):
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=2, bad_words=["am", "  "]), use_tqdm=False)
    assert llm.generate(PROMPTS[0], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids  # still serves


def test_bad_words_pickle_and_repr():
    p = SamplingParams(temperature=0, bad_words=["am", "I am"])
    for q in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p), p.clone()):
        assert q == p and q.bad_words == ["am", "I am"]
    assert SamplingParams(bad_words=["x"]) != SamplingParams()
    assert "bad_words=['am', 'I am']" in repr(p)
