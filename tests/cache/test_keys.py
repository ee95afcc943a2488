"""Keys and fingerprints: pure functions, no Redis."""

from __future__ import annotations

import re

import pytest

from cache import keys
from cache.keys import CacheRequest, SamplingKey
from cache.schema import SCHEMA_VERSION, IndexSchema
from semserve.sampling import SamplingOptions

from .conftest import chat

HOSTILE = ["*", "|", "{", "}", "@", "-", " ", "a b", '"', "'", "\\", "\\}", "ü", "租户", "\x00", "a\x00b",
           "}|@tenant:{*", "-@tenant:{acme}", "acme ", " acme", "ACME", "\ud800", "*" * 500]  # fmt: skip


def test_normalize_text() -> None:
    assert keys.normalize_text("  What  is\tthe\n\ncapital?  ") == "what is the capital?"
    assert keys.normalize_text("ｗｈａｔ\u3000is\u00a0it") == "what is it"  # NFKC + unicode spaces
    assert keys.normalize_text("zero\u200bwidth") == "zerowidth"
    # Case and punctuation are kept: they can change the answer.
    assert keys.normalize_text("US") != keys.normalize_text("us")
    assert keys.normalize_text("2-3") != keys.normalize_text("23")


def test_exact_key_ignores_whitespace_and_sentence_case_only() -> None:
    assert keys.exact_key(chat("hello  world")) == keys.exact_key(chat(" hello world\n"))
    # A capital starting the message is sentence case, not meaning ...
    assert keys.exact_key(chat("hello world")) == keys.exact_key(chat("Hello world"))
    assert keys.normalize_text("Why is the sky blue?") == keys.normalize_text("why is the sky blue?")
    # ... any other case difference is kept: acronyms, a lone "I", later words.
    assert keys.exact_key(chat("hello world")) != keys.exact_key(chat("hello World"))
    assert keys.normalize_text("US rates") != keys.normalize_text("us rates")
    assert keys.normalize_text("I am") != keys.normalize_text("i am")


def test_fingerprint_excludes_last_message_and_tenant() -> None:
    assert keys.fingerprint(chat("a")) == keys.fingerprint(chat("completely different"))
    assert keys.fingerprint(chat("a", tenant="x")) == keys.fingerprint(chat("a", tenant="y"))
    assert keys.exact_key(chat("a", tenant="x")) != keys.exact_key(chat("a", tenant="y"))


@pytest.mark.parametrize(
    "change",
    [
        {"sampling": SamplingKey(temperature=0.7)},
        {"sampling": SamplingKey(max_tokens=16)},
        {"sampling": SamplingKey(top_p=0.9)},
        {"sampling": SamplingKey(top_k=5)},
        {"sampling": SamplingKey(stop=["\n"])},
        {"sampling": SamplingKey(seed=1)},
        {"sampling": SamplingKey(ignore_eos=True)},
        {"sampling": SamplingKey(extra={"repetition_penalty": 1.1})},
        {"context": {"system": "You are a pirate."}},
        {"context": {"history": [{"role": "user", "content": "hi"}]}},
        {"model": "other-model"},
        {"model_revision": "abc123"},
        {"kind": "completion"},
    ],
)
def test_everything_but_the_prompt_changes_the_fingerprint(change: dict) -> None:
    base = chat("q")
    other = chat(change.pop("prompt", "q"), **change)
    assert keys.fingerprint(base) != keys.fingerprint(other)
    assert keys.exact_key(base) != keys.exact_key(other)


def test_fingerprint_canonical_forms() -> None:
    a = chat("q", context={"b": 1, "a": [1, 2]}, sampling=SamplingKey(temperature=1, stop=["y", "x"]))
    b = chat(
        "q", context={"a": [1, 2], "b": 1}, sampling=SamplingKey(temperature=1.0, stop=("x", "y", "x"))
    )
    assert keys.fingerprint(a) == keys.fingerprint(b)
    assert keys.fingerprint(chat("q", sampling=SamplingKey(stop="x"))) == keys.fingerprint(
        chat("q", sampling=SamplingKey(stop=["x"]))
    )
    assert keys.fingerprint(chat("q", sampling=SamplingKey(stop=[]))) == keys.fingerprint(chat("q"))
    # A different schema version never shares a fingerprint.
    assert keys.fingerprint(a, schema_version=SCHEMA_VERSION + 1) != keys.fingerprint(a)


def test_invalid_requests_are_rejected() -> None:
    with pytest.raises(ValueError):
        CacheRequest(tenant="", model="m", kind="chat", prompt="x")
    with pytest.raises(ValueError):
        CacheRequest(tenant="t", model="m", kind="embeddings", prompt="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        keys.fingerprint(chat("q", sampling=SamplingKey(temperature=float("nan"))))
    with pytest.raises(TypeError):
        keys.fingerprint(chat("q", context={"x": object()}))


def test_hostile_tenant_tags_are_plain_hex_and_distinct() -> None:
    tags = [keys.tenant_tag(t) for t in HOSTILE]
    assert all(re.fullmatch(r"[0-9a-f]{64}", t) for t in tags)
    assert len(set(tags)) == len(HOSTILE)
    # Tenant and model tags live in different domains.
    assert keys.tenant_tag("x") != keys.model_tag("x")
    for t in HOSTILE:
        assert keys.exact_key(chat("q", tenant=t)) != keys.exact_key(chat("q", tenant="acme"))


def test_schema_names_are_versioned() -> None:
    v1, v2 = IndexSchema("prod", version=1), IndexSchema("prod", version=2)
    assert v1.index_name == "semserve:v1:prod" and v2.index_name == "semserve:v2:prod"
    assert not v2.entry_prefix.startswith(v1.entry_prefix) and not v1.entry_prefix.startswith(v2.entry_prefix)
    for bad in ["", "a:b", "a b", "*", "x" * 100]:
        with pytest.raises(ValueError):
            IndexSchema(bad)


def test_sampling_from_mapping() -> None:
    opts = {"max_tokens": 16, "temperature": 0, "top_p": 1.0, "top_k": -1, "seed": None,
            "stop": ["x"], "ignore_eos": False}  # fmt: skip
    a = SamplingKey.from_mapping(opts)
    assert a == SamplingKey(max_tokens=16, temperature=0, top_p=1.0, top_k=-1, stop=("x",))
    b = SamplingKey.from_mapping({**opts, "repetition_penalty": 1.2})
    assert b.extra == {"repetition_penalty": 1.2}
    assert keys.fingerprint(chat("q", sampling=a)) != keys.fingerprint(chat("q", sampling=b))
    # An adjustment at its default keys as if absent: answers stored before it existed stay found.
    assert SamplingKey.from_mapping({**opts, "repetition_penalty": 1.0, "min_tokens": 0}) == a
    # How an answer is reported or delivered is no part of it.
    assert SamplingKey.from_mapping({**opts, "logprobs": 2, "stream_interval": 8}) == a


def test_a_stream_interval_keys_as_none() -> None:
    plain = SamplingOptions(max_tokens=16, temperature=0)
    chunked = SamplingOptions(max_tokens=16, temperature=0, stream_interval=8)
    assert SamplingKey.from_options(chunked) == SamplingKey.from_options(plain)
    assert SamplingKey.from_mapping(chunked.to_dict()) == SamplingKey.from_options(plain)


def test_adjusted_options_key_apart_and_defaults_key_as_before() -> None:
    plain = SamplingOptions(max_tokens=16, temperature=0)
    assert SamplingKey.from_options(plain).extra is None
    fingerprints = {keys.fingerprint(chat("q", sampling=SamplingKey.from_options(o))) for o in (
        plain,
        SamplingOptions(max_tokens=16, temperature=0, presence_penalty=0.5),
        SamplingOptions(max_tokens=16, temperature=0, frequency_penalty=0.5),
        SamplingOptions(max_tokens=16, temperature=0, repetition_penalty=1.3),
        SamplingOptions(max_tokens=16, temperature=0, min_p=0.1),
        SamplingOptions(max_tokens=16, temperature=0, min_tokens=4),
    )}  # fmt: skip
    assert len(fingerprints) == 6


@pytest.mark.parametrize(
    "change",
    [
        {"tenant": "other"},
        {"model": "other"},
        {"model_revision": "r2"},
        {"kind": "completion"},
        {"context": {"system": "be brief"}},
        {"sampling": SamplingKey(temperature=0.5)},
        {"epoch": 1},
    ],
)
def test_scope_tag_changes_with_tenant_and_everything_in_the_fingerprint(change: dict) -> None:
    base = chat("q", model_revision="r1")
    fields = {"tenant": base.tenant, "model": base.model, "kind": base.kind, "prompt": base.prompt,
              "model_revision": base.model_revision} | change  # fmt: skip
    assert keys.scope_tag(CacheRequest(**fields)) != keys.scope_tag(base)


def test_scope_tag_ignores_the_prompt_and_follows_the_schema_version() -> None:
    assert keys.scope_tag(chat("a")) == keys.scope_tag(chat("something else entirely"))
    assert keys.scope_tag(chat("a"), schema_version=99) != keys.scope_tag(chat("a"))
    req = chat("a", model="m2")
    assert keys.scope_tag(req) == keys.scope_tag_from_fingerprint(req.tenant, keys.fingerprint(req))


def test_hostile_scope_tags_are_plain_hex_distinct_and_in_their_own_domain() -> None:
    scopes = [keys.scope_tag(chat("q", tenant=t, model=t)) for t in HOSTILE]
    assert all(re.fullmatch(r"[0-9a-f]{64}", s) for s in scopes)
    assert len(set(scopes)) == len(HOSTILE)
    # A scope digest never equals the tenant tag, model tag or fingerprint it is built from.
    req = chat("q")
    assert keys.scope_tag(req) not in {keys.tenant_tag(req.tenant), keys.model_tag(req.model),
                                       keys.fingerprint(req)}  # fmt: skip
    # The tenant and fingerprint are JSON-framed: moving characters between them changes the digest.
    assert keys.scope_tag_from_fingerprint("ab", "c") != keys.scope_tag_from_fingerprint("a", "bc")


def test_the_key_of_a_plain_request_is_the_one_stored_entries_carry() -> None:
    # Written before the adjustments (penalties, min_p, min_tokens) existed: an entry persisted by
    # an earlier version is still found. A change here empties every deployed cache.
    sampling = SamplingKey.from_options(SamplingOptions(max_tokens=32, temperature=0))
    req = CacheRequest("tenant-a", "llm", "chat", "What is the capital of France?", sampling=sampling)
    assert keys.exact_key(req) == "de148e9f355b230c0adc2a86c4b6c16435a8c4a7e01dbf393f2561017cbe6d11"
