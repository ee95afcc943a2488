"""`make setup` hands uv the package sources pip is configured with (semserve/tooling/uv_install_args.py)."""

from __future__ import annotations

from pathlib import Path

from semserve.tooling.uv_install_args import uv_args


def test_pips_sources_become_uv_flags_once_each_in_pips_order(tmp_path: Path) -> None:
    wheels, constraints = tmp_path / "wheels", tmp_path / "constraints.txt"
    wheels.mkdir()
    constraints.write_text("torch<=2.14.1\n")
    listed = "\n".join([
        f"global.constraint='{constraints}'",
        f"global.extra-index-url='file://{tmp_path} https://example.org/simple'",
        f"global.find-links='{wheels}'",
        "global.cert='/etc/ssl/certs/ca-certificates.crt'",
        f":env:.find-links='{wheels}'",  # PIP_FIND_LINKS, the same folder again
        ":env:.default-timeout='180'",
    ])  # fmt: skip
    assert uv_args(listed) == [
        "--constraint", str(constraints),
        "--extra-index-url", f"file://{tmp_path}", "--extra-index-url", "https://example.org/simple",
        "--find-links", str(wheels),
        "--index-strategy", "unsafe-best-match", "--native-tls",
    ]  # fmt: skip


def test_a_local_source_that_is_not_there_is_left_out_as_pip_ignores_it(tmp_path: Path) -> None:
    listed = f"global.find-links='{tmp_path / 'gone'}'\nglobal.extra-index-url='file:///no/such/simple'"
    assert uv_args(listed) == ["--index-strategy", "unsafe-best-match"]


def test_no_config_still_picks_the_best_version_across_sources() -> None:
    assert uv_args("") == ["--index-strategy", "unsafe-best-match"]
