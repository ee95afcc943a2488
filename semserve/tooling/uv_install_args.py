"""pip's configured package sources as `uv pip install` flags, printed one per line.

`make setup` installs with uv (about 25 s here, where pip takes about
4 minutes for the same ~230 packages) and must find what pip would: the same indexes, local wheel
folders and constraints (this machine's torch wheel is one), which pip reads from its config files
and PIP_* variables and uv does not. Run with the venv's python before anything is installed: stdlib only.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

# pip's setting -> uv's flag; pip lists several values of one setting with spaces.
_FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def _exists(location: str) -> bool:
    """pip skips a local index or folder that is not there (with a warning); uv fails on it."""
    parsed = urlparse(location)
    if parsed.scheme in ("http", "https"):
        return True
    return Path(parsed.path if parsed.scheme == "file" else location).exists()


def uv_args(pip_config_list: str) -> list[str]:
    """`pip config list` output ("global.find-links='/opt/wheels'", ":env:.constraint='...'")
    as uv flags: each source once, in the order pip lists them; pip's choice of the best version
    across all sources (uv picks from the first index that has a package unless told)."""
    args: list[str] = []
    seen: set[tuple[str, str]] = set()
    native_tls = False
    for line in pip_config_list.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        setting = key.rsplit(".", 1)[-1]
        values = value.strip().strip("'\"").split()
        if setting == "cert":
            native_tls = True  # a CA bundle of the system's: uv reads the system's store then
        flag = _FLAGS.get(setting)
        for v in values if flag else []:
            if (flag, v) not in seen and _exists(v):
                seen.add((flag, v))
                args += [flag, v]
    return [*args, "--index-strategy", "unsafe-best-match", *(["--native-tls"] if native_tls else [])]


def main() -> None:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=False).stdout  # fmt: skip
    print("\n".join(uv_args(listed)))


if __name__ == "__main__":
    main()
