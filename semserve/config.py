"""One typed place per service for configuration: each dataclass field is a CLI flag, an env var and a
row of the README's settings table, with one default that runs locally.

    @dataclass
    class PredictorSettings(ServerSettings):
        ENV_PREFIX: ClassVar[str] = "SEMSERVE_PREDICTOR_"
        max_model_len: int = setting(2048, "Context length the engine admits.")

gives `--max-model-len` and `SEMSERVE_PREDICTOR_MAX_MODEL_LEN` (and, from ServerSettings, every field
both services have, e.g. `--http-port` and `SEMSERVE_PREDICTOR_HTTP_PORT`). Precedence: flag, then env
var, then default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SettingError(ValueError):
    """A setting whose value cannot be used; the message names its env var or field. `semserve`
    prints it as one line and exits 2, as argparse does for a bad flag."""


def setting(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    secret: bool = False,
) -> Any:
    """Declare a setting. `secret` ones have no flag (env or files only) and are never shown."""
    return dataclasses.field(
        default=default, metadata={"help": help, "choices": choices, "secret": secret}
    )


def _base_type(tp: Any) -> tuple[type, bool]:
    """(concrete type, optional?) for annotations like `int`, `Path | None`, `str`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _convert(raw: str, tp: type) -> Any:
    """`raw` (a flag's or env var's text) as `tp`; a ValueError says what was expected."""
    if tp is bool:
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"expected a boolean (true/false), got {raw!r}")
    if tp is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
    if tp is float:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"expected a number, got {raw!r}") from None
    if tp is Path:
        return Path(raw).expanduser()
    return raw


def _flag_type(tp: type) -> Callable[[str], Any]:
    """argparse's `type` for a flag of type `tp`: argparse prints the message after the flag."""

    def convert(raw: str) -> Any:
        try:
            return _convert(raw, tp)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


@dataclasses.dataclass
class Settings:
    ENV_PREFIX: ClassVar[str] = "SEMSERVE_"

    @classmethod
    def flag(cls, f: dataclasses.Field[Any], prefix: str = "") -> str:
        return "--" + prefix + f.name.replace("_", "-")

    @classmethod
    def env_name(cls, f: dataclasses.Field[Any]) -> str:
        return cls.ENV_PREFIX + f.name.upper()

    @classmethod
    def _fields(cls) -> list[dataclasses.Field[Any]]:
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            f.type = hints[f.name]
            out.append(f)
        return out

    @classmethod
    def _env_default(cls, f: dataclasses.Field[Any]) -> Any:
        tp, _ = _base_type(f.type)
        raw = os.environ.get(cls.env_name(f))
        if raw is None or raw == "":
            return f.default
        try:
            return _convert(raw, tp)
        except ValueError as exc:
            raise SettingError(f"{cls.env_name(f)}: {exc}") from None

    @classmethod
    def add_arguments(
        cls,
        parser: argparse.ArgumentParser,
        flag_prefix: str = "",
        only: tuple[str, ...] | None = None,
    ) -> None:
        """`flag_prefix` (e.g. "cache-") keeps several settings classes apart in one parser.
        `only` names the fields a command uses: its --help lists no flag that would change nothing
        (the others still come from env vars and defaults in `from_namespace`)."""
        group = parser.add_argument_group(f"{cls.__name__} (env {cls.ENV_PREFIX}*)")
        dest_prefix = flag_prefix.replace("-", "_")
        fields = cls._fields()
        if only is not None:
            unknown = set(only) - {f.name for f in fields}
            if unknown:
                raise ValueError(f"{cls.__name__} has no settings {sorted(unknown)}")
            fields = [f for f in fields if f.name in only]
        for f in fields:
            tp, _ = _base_type(f.type)
            meta = f.metadata
            if meta.get("secret"):
                # No flag at all: a value on the command line is readable by every local user in
                # `ps` and /proc/<pid>/cmdline, and ends up in shell history. Secrets come from the
                # environment (a Kubernetes Secret) or from files; argparse rejects the flag.
                continue
            kwargs: dict[str, Any] = {
                "dest": dest_prefix + f.name,
                "default": argparse.SUPPRESS,
                "help": f"{meta['help']} [env {cls.env_name(f)}; default {f.default!r}]",
            }
            if tp is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["type"] = _flag_type(tp)
                kwargs["metavar"] = tp.__name__.upper()
                if meta.get("choices"):
                    kwargs["choices"] = meta["choices"]
                    kwargs.pop("metavar")
            names = [cls.flag(f, flag_prefix)]
            if "_" in f.name and not flag_prefix:
                # KServe's controller appends `--model_name x --predictor_host y --http_port n`
                # to a transformer's args: accept its underscore spelling too.
                names.append("--" + f.name)
            group.add_argument(*names, **kwargs)

    @classmethod
    def redefault(cls, name: str, default: Any) -> Any:
        """Field `name` of this class with another default and the same help, for a subclass:
        `http_port: int = ServerSettings.redefault("http_port", 8090)`."""
        base = {f.name: f for f in dataclasses.fields(cls)}[name]
        return dataclasses.field(default=default, metadata=base.metadata)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace | None = None, flag_prefix: str = "") -> Self:
        given = vars(ns) if ns is not None else {}
        dest_prefix = flag_prefix.replace("-", "_")
        values: dict[str, Any] = {}
        for f in cls._fields():
            dest = dest_prefix + f.name
            values[f.name] = given[dest] if dest in given else cls._env_default(f)
            choices = f.metadata.get("choices")
            if choices and values[f.name] not in choices:
                raise SettingError(f"{cls.env_name(f)}: {values[f.name]!r} is not one of {choices}")
        try:
            return cls(**values)
        except SettingError:
            raise
        except ValueError as exc:  # a check of the settings' own (__post_init__)
            raise SettingError(str(exc)) from None

    @classmethod
    def from_env(cls) -> Self:
        return cls.from_namespace(None)

    @classmethod
    def markdown_table(cls, flag_prefix: str = "") -> str:
        rows = ["| flag | env | default | meaning |", "| --- | --- | --- | --- |"]
        for f in cls._fields():
            secret = f.metadata.get("secret")
            default = "" if secret else f"`{f.default}`"
            # Secrets have no flag (see add_arguments): the env var is the only way in.
            flag = "(env only)" if secret else f"`{cls.flag(f, flag_prefix)}`"
            rows.append(f"| {flag} | `{cls.env_name(f)}` | {default} | {f.metadata['help']} |")
        return "\n".join(rows)

    def public_dict(self) -> dict[str, Any]:
        """Values safe to log: secrets are masked."""
        out = {}
        for f in self._fields():
            value = getattr(self, f.name)
            out[f.name] = "***" if f.metadata.get("secret") and value else value
        return out


@dataclasses.dataclass
class OpenAIRouteSettings(Settings):
    """The OpenAI HTTP layer's settings, shared by both services (each inherits them under its own
    env prefix, e.g. SEMSERVE_PREDICTOR_OPENAI_ROUTE_PREFIX)."""

    openai_route_prefix: str = setting(
        "/openai",
        "Path before /v1 of the OpenAI routes (KServe's KSERVE_OPENAI_ROUTE_PREFIX): clients use "
        "base URL http://HOST:PORT<prefix>/v1. `/`: the routes at /v1/... as vLLM serves them.",
    )
    cors_allowed_origins: str = setting(
        "",
        "Comma-separated origins browsers may call from (CORS), e.g. http://localhost:3000, or *. "
        "Empty: no CORS headers (browsers refuse cross-origin calls).",
    )

    def __post_init__(self) -> None:
        prefix = self.openai_route_prefix.strip().rstrip("/")
        if prefix and not prefix.startswith("/"):
            prefix = "/" + prefix
        if prefix.endswith("/v1") or any(c in prefix for c in "{}?# "):
            raise ValueError(
                f"openai_route_prefix {self.openai_route_prefix!r}: give the part before /v1, "
                "a plain path such as /openai (or empty)"
            )
        self.openai_route_prefix = prefix

    @property
    def cors_origins(self) -> list[str]:
        return [o.strip().rstrip("/") for o in self.cors_allowed_origins.split(",") if o.strip()]


@dataclasses.dataclass
class ServerSettings(OpenAIRouteSettings):
    """What every server of ours has (see semserve/serving/app_builder.py). A service adds its own
    settings and redeclares a field only for a default of its own (`redefault`)."""

    model_name: str = setting(
        "llm",
        "Model name clients use in v2 paths and the OpenAI `model` field; the transformer's must "
        "equal the predictor's (KServe sets it).",
    )
    host: str = setting("127.0.0.1", "Address to bind (0.0.0.0 in a container).")
    # KServe's own ports, which the transformer keeps: an InferenceService's traffic goes to it.
    http_port: int = setting(
        8080, "HTTP port: v2 REST, OpenAI routes, /metrics (and the transformer's admin routes)."
    )
    grpc_port: int = setting(8081, "gRPC port: v2 GRPCInferenceService (0 disables gRPC).")
    max_body_bytes: int = setting(4 * 1024 * 1024, "Largest request body accepted; larger gets 413.")
    max_header_bytes: int = setting(
        64 * 1024, "Largest HTTP request head (request line + headers) accepted; larger gets 431."
    )
    max_batch_size: int = setting(64, "Most prompts one v2 request may carry (text_input shape [B]).")
    default_max_tokens: int = setting(128, "max_tokens when a request gives none.")
    stream_interval: int = setting(
        1,
        "Least new tokens in each streamed chunk after the first; the last comes with the finish "
        "reason. A request's `stream_interval` (vLLM's field) may raise it, never lower it. The "
        "predictor's is vLLM's --stream-interval; the transformer also asks its predictor for its "
        "own. Fewer, larger chunks cost less CPU per token (gRPC messages, SSE events). 1: each "
        "token as it comes.",
    )
    grace_period_s: float = setting(30.0, "On SIGTERM, how long in-flight requests may take to finish.")
    log_level: str = setting("info", "Log level.", choices=("debug", "info", "warning", "error"))
    v2_fast_path: bool = setting(
        True,
        "Answer v2 REST infer for the served model in semserve's own route (semserve/v2/rest_infer.py) "
        "instead of KServe's: the same answers, less stack; anything it does not parse completely "
        "goes to KServe's route.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval {self.stream_interval}: must be >= 1 (1: each token)")
