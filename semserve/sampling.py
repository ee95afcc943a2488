"""Sampling options every protocol maps onto, validated once with errors that name the field."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from semserve.errors import BadRequest


@dataclass(frozen=True)
class SamplingOptions:
    """The options, each named as vLLM's SamplingParams names it (the predictor passes them by name)."""

    max_tokens: int = 128
    temperature: float = 1.0  # the OpenAI and vLLM default; caching needs an explicit 0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    # vLLM's, as its OpenAI server takes them (the last three are its extensions of OpenAI's API).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    # vLLM's extensions that shape the text: token ids that end a generation besides EOS, the stop
    # string kept in the text, special tokens (e.g. <|im_end|>) left in it.
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # vLLM's structured outputs (StructuredOutputsParams): one constraint, as canonical JSON, e.g.
    # {"json": {schema}}, {"regex": "..."}, {"choice": [...]}, {"grammar": "..."}, {"json_object": true}.
    structured_outputs: str | None = None
    # OpenAI's logit_bias: (token id, bias in [-100, 100]) pairs, by token id.
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    # How many most likely tokens to report beside each generated one (0: its own logprob only);
    # None: no logprobs. Not part of any cache key: requests for logprobs bypass the cache.
    logprobs: int | None = None
    # The same for each prompt token (vLLM's prompt_logprobs; what completions' echo with logprobs
    # reports); None: none. Not part of any cache key either: such requests bypass the cache.
    prompt_logprobs: int | None = None
    # vLLM's stream_interval: a streamed answer's chunks after the first carry at least this many
    # tokens (semserve/stream_interval.py); None: the server's --stream-interval. How the answer
    # is delivered, not what it is: part of no cache key.
    stream_interval: int | None = None

    @property
    def reports_logprobs(self) -> bool:
        """Whether the answer reports logprobs (its own or its prompt's): no cache entry keeps them."""
        return self.logprobs is not None or self.prompt_logprobs is not None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        d["stop_token_ids"] = list(self.stop_token_ids)
        d["logit_bias"] = [list(pair) for pair in self.logit_bias]
        return d

    def for_choice(self, index: int) -> SamplingOptions:
        """The options of choice `index` of a request for several (OpenAI's `n`): a seed becomes
        seed + index, as vLLM's parallel sampling seeds its children, so seeded choices differ and
        each stays reproducible (and cacheable) on its own; unseeded ones are unchanged."""
        if self.seed is None or index == 0:
            return self
        return replace(self, seed=(self.seed + index) % 2**63)

    def adjustments(self) -> dict[str, Adjustment]:
        """The options of ADJUSTMENT_DEFAULTS set away from their defaults: what a cache key must
        add to the first seven (an answer stored before they existed keys as it did). JSON-able:
        token ids as a list."""
        set_now = {k: getattr(self, k) for k in ADJUSTMENT_DEFAULTS}
        return {k: _jsonable(v) for k, v in set_now.items() if v != ADJUSTMENT_DEFAULTS[k]}


def _jsonable(value: Any) -> Any:
    # Tuples as lists, as JSON (and to_dict) has them.
    return [_jsonable(v) for v in value] if isinstance(value, tuple) else value


Adjustment = float | int | bool | str | tuple[Any, ...] | list[Any] | None
ADJUSTMENT_DEFAULTS: dict[str, Adjustment] = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "min_tokens": 0,
    "stop_token_ids": (),
    "include_stop_str_in_output": False,
    "skip_special_tokens": True,
    "structured_outputs": None,
    "logit_bias": (),
}
SAMPLING_KEYS = (
    "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos", *ADJUSTMENT_DEFAULTS,
    "logprobs", "prompt_logprobs", "stream_interval",
)
_INTEGERS = ("max_tokens", "top_k", "seed", "min_tokens", "logprobs", "prompt_logprobs", "stream_interval")
# vLLM's default --max-logprobs, and OpenAI's limit.
MAX_LOGPROBS = 20
_FLOATS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
_BOOLEANS = ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens")
# Tokens per streamed chunk: past any max_tokens, it is the first chunk and then the whole rest.
MAX_STREAM_INTERVAL = 2**31 - 1
# vLLM takes any number; more than this many is a client bug, not a stop condition.
MAX_STOP_TOKEN_IDS = 256


def _number(name: str, value: Any, kind: type) -> Any:
    # bool is an int subclass in Python; `"temperature": true` is a client bug, not 1.0.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, str):
            try:
                value = kind(value)
            except ValueError:
                raise BadRequest(f"{name} must be a number, got {value!r}", name) from None
        else:
            raise BadRequest(f"{name} must be a number, got {type(value).__name__}", name)
    if kind is int:
        if isinstance(value, float):
            if not value.is_integer():
                raise BadRequest(f"{name} must be an integer, got {value}", name)
            value = int(value)
        return value
    try:
        value = float(value)
    except OverflowError:  # an int beyond the float range, e.g. `"top_p": 10**400` in JSON
        raise BadRequest(f"{name} must be finite", name) from None
    if not math.isfinite(value):
        raise BadRequest(f"{name} must be finite", name)
    return value


def parse_sampling(params: dict[str, Any], defaults: SamplingOptions | None = None) -> SamplingOptions:
    """Validate a dict of sampling parameters (unknown keys are ignored by the caller's choice)."""
    base = defaults or SamplingOptions()
    values = base.to_dict()
    for key in SAMPLING_KEYS:
        if key not in params or params[key] is None:
            continue
        raw = params[key]
        if key in _INTEGERS:
            values[key] = _number(key, raw, int)
        elif key in _FLOATS:
            values[key] = _number(key, raw, float)
        elif key in _BOOLEANS:
            if isinstance(raw, str) and raw.lower() in ("true", "false"):
                raw = raw.lower() == "true"
            if not isinstance(raw, bool):
                raise BadRequest(f"{key} must be a boolean", key)
            values[key] = raw
        elif key == "structured_outputs":
            values[key] = structured_outputs(raw)
        elif key == "logit_bias":
            values[key] = logit_bias(raw)
        elif key == "stop_token_ids":
            raw = _decoded(key, raw)
            ints = isinstance(raw, (list, tuple)) and all(type(t) is int for t in raw)  # bool is no id
            if not ints:
                raise BadRequest("stop_token_ids must be a list of integers", key)
            if len(raw) > MAX_STOP_TOKEN_IDS:
                raise BadRequest(f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids", key)
            if any(t < 0 for t in raw):
                raise BadRequest("stop_token_ids must not be negative", key)
            values[key] = raw
        elif key == "stop":
            if isinstance(raw, str):
                raw = [raw]
            if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
                raise BadRequest("stop must be a string or a list of strings", key)
            if len(raw) > 16:
                raise BadRequest("stop may hold at most 16 strings", key)
            if any(s == "" for s in raw):
                raise BadRequest("stop strings must not be empty", key)
            try:
                "".join(raw).encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate from JSON ("\ud800")
                raise BadRequest("stop strings must be valid UTF-8", key) from None
            values[key] = raw
    values["stop"] = tuple(values["stop"])
    values["stop_token_ids"] = tuple(values["stop_token_ids"])
    values["logit_bias"] = tuple(tuple(pair) for pair in values["logit_bias"])
    opts = SamplingOptions(**values)
    check(opts)
    return opts


def _decoded(name: str, raw: Any) -> Any:
    """A value that v2 parameters (scalars) carry as JSON in a string, decoded; others as they are."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        raise BadRequest(f"{name} is not valid JSON", name) from None


MAX_LOGIT_BIAS = 1024  # token ids per request; more is a client bug


def logit_bias(raw: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's {token id (a string in JSON): bias} (or [id, bias] pairs, as to_dict writes them)
    as (id, bias) pairs by id; biases in OpenAI's [-100, 100]."""
    name = "logit_bias"
    raw = _decoded(name, raw)
    pairs = list(raw.items()) if isinstance(raw, dict) else raw
    pair = (list, tuple)
    if not isinstance(pairs, pair) or any(not isinstance(p, pair) or len(p) != 2 for p in pairs):
        raise BadRequest(f"{name} must map token ids to biases", name)
    if len(pairs) > MAX_LOGIT_BIAS:
        raise BadRequest(f"{name} may hold at most {MAX_LOGIT_BIAS} token ids", name)
    biases: dict[int, float] = {}
    for token, bias in pairs:
        if type(token) is int and token >= 0:
            token_id = token
        elif isinstance(token, str) and token.isascii() and token.isdigit() and len(token) <= 18:
            token_id = int(token)
        else:
            raise BadRequest(f"{name} keys must be token ids (non-negative integers), got {token!r}", name)
        try:
            value = _number(f"{name}[{token}]", bias, float)
        except BadRequest as exc:
            raise BadRequest(exc.message, name) from None
        if not -100 <= value <= 100:
            raise BadRequest(f"{name}[{token}] must be in [-100, 100], got {value}", name)
        biases[token_id] = value
    return tuple(sorted(biases.items()))


# vLLM's StructuredOutputsParams: the constraints (exactly one) and the options beside them.
STRUCTURED_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object")
_STRUCTURED_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")


def structured_outputs(raw: Any) -> str:
    """One structured-outputs constraint (a dict, or its JSON in a string as v2 parameters carry
    it) as canonical JSON: the same constraint keys the cache alike however it was written."""
    name = "structured_outputs"
    raw = _decoded(name, raw)
    if not isinstance(raw, dict):
        raise BadRequest(f"{name} must be an object with one of {', '.join(STRUCTURED_CONSTRAINTS)}", name)
    unknown = sorted(set(raw) - set(STRUCTURED_CONSTRAINTS) - set(_STRUCTURED_OPTIONS))
    if unknown:
        raise BadRequest(f"{name} does not take {', '.join(unknown)}", name)
    constraints = [k for k in STRUCTURED_CONSTRAINTS if raw.get(k) not in (None, False)]
    if len(constraints) != 1:
        raise BadRequest(f"{name} must set exactly one of {', '.join(STRUCTURED_CONSTRAINTS)}", name)
    [kind] = constraints
    value = raw[kind]
    if kind == "json" and isinstance(value, str):
        try:
            value = json.loads(value)  # a schema in a string, as vLLM also takes it
        except json.JSONDecodeError:
            raise BadRequest(f"{name}.json is not a valid JSON schema", name) from None
    valid = {"json": isinstance(value, dict), "regex": isinstance(value, str) and value != "",
             "choice": isinstance(value, list) and value != [] and all(isinstance(c, str) for c in value),
             "grammar": isinstance(value, str) and value != "", "json_object": value is True}  # fmt: skip
    if not valid[kind]:
        raise BadRequest(f"{name}.{kind} is not a valid {kind} constraint", name)
    options = {k: raw[k] for k in _STRUCTURED_OPTIONS if raw.get(k) is not None}
    return json.dumps({kind: value, **options}, sort_keys=True, separators=(",", ":"))


def check(opts: SamplingOptions) -> None:
    if opts.max_tokens <= 0:
        raise BadRequest(f"max_tokens must be > 0, got {opts.max_tokens}", "max_tokens")
    if not 0 <= opts.temperature <= 2:  # OpenAI's range, and vLLM's
        raise BadRequest(f"temperature must be in [0, 2], got {opts.temperature}", "temperature")
    if not 0 < opts.top_p <= 1:
        raise BadRequest(f"top_p must be in (0, 1], got {opts.top_p}", "top_p")
    if opts.top_k == 0 or opts.top_k < -1:
        raise BadRequest(f"top_k must be -1 (off) or >= 1, got {opts.top_k}", "top_k")
    if opts.seed is not None and not 0 <= opts.seed < 2**63:
        raise BadRequest("seed must be a non-negative 64-bit integer", "seed")
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2 <= getattr(opts, name) <= 2:
            raise BadRequest(f"{name} must be in [-2, 2], got {getattr(opts, name)}", name)
    if not opts.repetition_penalty > 0:
        name = "repetition_penalty"
        raise BadRequest(f"{name} must be > 0, got {opts.repetition_penalty}", name)
    if not 0 <= opts.min_p <= 1:
        raise BadRequest(f"min_p must be in [0, 1], got {opts.min_p}", "min_p")
    if opts.logprobs is not None and not 0 <= opts.logprobs <= MAX_LOGPROBS:
        raise BadRequest(f"logprobs must be in [0, {MAX_LOGPROBS}], got {opts.logprobs}", "logprobs")
    if opts.prompt_logprobs is not None and not 0 <= opts.prompt_logprobs <= MAX_LOGPROBS:
        name = "prompt_logprobs"
        raise BadRequest(f"{name} must be in [0, {MAX_LOGPROBS}], got {opts.prompt_logprobs}", name)
    if opts.stream_interval is not None and not 1 <= opts.stream_interval <= MAX_STREAM_INTERVAL:
        name = "stream_interval"
        raise BadRequest(f"{name} must be in [1, {MAX_STREAM_INTERVAL}], got {opts.stream_interval}", name)
    if not 0 <= opts.min_tokens <= opts.max_tokens:
        raise BadRequest(
            f"min_tokens must be in [0, max_tokens ({opts.max_tokens})], got {opts.min_tokens}", "min_tokens"
        )
