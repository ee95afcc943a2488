"""Settings: flag beats env beats default; the README table lists every setting."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from predictors.config import PredictorSettings

ROOT = Path(__file__).resolve().parents[2]


def parse(argv: list[str]) -> PredictorSettings:
    parser = argparse.ArgumentParser()
    PredictorSettings.add_arguments(parser)
    return PredictorSettings.from_namespace(parser.parse_args(argv))


def test_defaults_run_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SEMSERVE_PREDICTOR_HTTP_PORT", "SEMSERVE_PREDICTOR_MODEL_NAME"):
        monkeypatch.delenv(var, raising=False)
    s = parse([])
    assert (s.model_name, s.host, s.http_port, s.grpc_port) == ("llm", "127.0.0.1", 8090, 8091)


def test_flag_beats_env_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMSERVE_PREDICTOR_HTTP_PORT", "9000")
    monkeypatch.setenv("SEMSERVE_PREDICTOR_ENFORCE_EAGER", "true")
    assert parse([]).http_port == 9000
    assert parse([]).enforce_eager is True
    assert parse(["--http-port", "9100"]).http_port == 9100
    assert parse(["--no-enforce-eager"]).enforce_eager is False


def test_bad_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMSERVE_PREDICTOR_ENFORCE_EAGER", "maybe")
    with pytest.raises(ValueError, match="SEMSERVE_PREDICTOR_ENFORCE_EAGER"):
        parse([])


@pytest.mark.parametrize(("var", "raw", "said"), [
    ("SEMSERVE_PREDICTOR_HTTP_PORT", "eighty", "expected an integer, got 'eighty'"),
    ("SEMSERVE_PREDICTOR_GPU_MEMORY_UTILIZATION", "most", "expected a number, got 'most'"),
])
def test_a_bad_number_in_an_env_var_is_a_setting_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, var: str, raw: str, said: str
) -> None:
    from semserve.config import SettingError

    monkeypatch.setenv(var, raw)
    with pytest.raises(SettingError, match=f"^{var}: {said}$"):
        parse([])


def test_a_settings_own_check_is_a_setting_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from semserve.config import SettingError

    monkeypatch.setenv("SEMSERVE_PREDICTOR_OPENAI_ROUTE_PREFIX", "/openai/v1")
    with pytest.raises(SettingError, match="give the part before /v1"):
        parse([])


def test_semserve_says_a_bad_setting_in_one_line_and_exits_2() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "SEMSERVE_CACHE_TTL_SECONDS": "a day"}
    done = subprocess.run([sys.executable, "-m", "semserve", "cache", "stats"], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 2
    said = "semserve cache: SEMSERVE_CACHE_TTL_SECONDS: expected an integer, got 'a day'"
    assert done.stderr.strip() == said


def test_readme_documents_every_predictor_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    for line in PredictorSettings.markdown_table().splitlines()[2:]:
        flag = line.split("|")[1].strip()
        assert flag in readme, f"README lacks {flag}"


def test_readme_documents_every_transformer_and_cache_setting() -> None:
    from cache.settings import CacheSettings, EmbedderSettings, VerifierSettings
    from transformers_svc.config import TransformerSettings

    readme = (ROOT / "README.md").read_text()
    for cls, prefix in ((TransformerSettings, ""), (CacheSettings, "cache-"),
                        (EmbedderSettings, "embed-"), (VerifierSettings, "verify-")):
        for line in cls.markdown_table(prefix).splitlines()[2:]:
            flag = line.split("|")[1].strip()
            assert flag in readme, f"README lacks {flag}"


def test_kserve_underscore_flags_are_accepted() -> None:
    from semserve.cli import build_parser

    args = build_parser().parse_args(
        ["transformer", "--model_name", "x", "--predictor_host", "p:81", "--http_port", "9", "--workers", "2"]
    )
    assert (args.model_name, args.predictor_host, args.http_port, args.workers) == ("x", "p:81", 9, 2)


def test_readme_tables_are_the_output_of_semserve_settings() -> None:
    from semserve.commands.settings import markdown

    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- settings:begin -->\n", 1)[1].split("<!-- settings:end -->", 1)[0]
    assert block == markdown(), "README settings are stale: paste the output of `semserve settings`"


def test_a_bad_flag_value_says_what_was_expected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["--http-port", "eighty"])
    assert "argument --http-port/--http_port: expected an integer, got 'eighty'" in capsys.readouterr().err
