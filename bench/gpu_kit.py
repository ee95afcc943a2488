"""The Python packages bench/gpu-check.sh needs, carried to a lent GPU machine in parts.

That machine reaches no package registry, and one device call carries at most 64 MiB with the
working tree. Its image has torch 2.11.0+cu130 but no vLLM or KServe (../.library/device/KINDS.md).
So the kit is built here and sent over a few calls:

    python -m bench.gpu_kit build             # here: wheels of bench/gpu-kit.txt -> .gpukit/parts/NN
    python3 -m bench.gpu_kit receive          # there, once per call: keep the parts that came
    python3 -m bench.gpu_kit install          # there, once all came: unpack to /tmp/semserve-kit/site

`build` installs the pinned wheels (cp312, manylinux x86_64, no dependencies) into one site folder,
drops what a Hopper GPU never loads, and cuts one xz archive of it into numbered parts with their
SHA-256 in .gpukit/MANIFEST.json. `build` prints the device calls to make. The device side needs the
standard library only; bench/gpu-check.sh puts the unpacked site first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

from semserve.files import file_sha256  # standard library only, as the device side needs

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "bench" / "gpu-kit.txt"
KIT = ROOT / ".gpukit"
DEVICE = Path("/tmp/semserve-kit")
# A device call carries 64 MiB with the working tree (~8 MiB now): parts leave room for both.
PART_MIB = 52
# The lent machines' Python (KINDS.md: 3.12.3) and every manylinux tag pip may need to match.
PLATFORMS = ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_26_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux_2_5_x86_64",
             "manylinux1_x86_64")  # fmt: skip
# Never loaded by the check on an H100/H200 (since stop 37, one device call fewer to carry):
# FlashAttention 2 (vLLM picks FA3 on compute capability 9.x and imports FA2 inside try), DeepGEMM's
# builds for other Python versions, xgrammar's static library (for C++ builds against it), vLLM's
# optional Rust frontend (only with VLLM_RUST_FRONTEND_PATH), the vocabularies of Mistral's own
# tokenizers and the asyncio Kubernetes client (KServe imports the plain one).
PRUNE = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so",
         "xgrammar/lib/libxgrammar.a", "vllm/vllm-rs", "mistral_common/data/tekken_*.json", "kubernetes/aio",
         "**/__pycache__")  # fmt: skip


class KitError(Exception):
    """A kit that cannot be built or unpacked; the text says which part or step."""


@dataclass(frozen=True)
class Part:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    pins_sha256: str
    archive_sha256: str
    site_bytes: int
    parts: tuple[Part, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        parts = tuple(Part(**p) for p in raw.pop("parts"))
        return cls(parts=parts, **raw)


def part_dir(root: Path, index: int) -> Path:
    """Part N's own folder, so that one call's `carry` can name it alone."""
    return root / "parts" / f"{index:02d}"


def prune(site: Path, patterns: tuple[str, ...] = PRUNE) -> list[str]:
    """Removes what a Hopper GPU never loads; returns the paths removed, relative to the site."""
    removed = []
    for pattern in patterns:
        for path in sorted(site.glob(pattern)):
            removed.append(str(path.relative_to(site)))
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return removed


def _site_bytes(site: Path) -> int:
    return sum(p.stat().st_size for p in site.rglob("*") if p.is_file())


def _write_archive(site: Path, dest: Path) -> None:
    """The site as one xz-compressed tar (xz's threads where installed, else lzma's one)."""
    if shutil.which("xz") and shutil.which("tar"):
        with dest.open("wb") as out:
            tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
            xz = subprocess.run(["xz", "-T0", "-6", "-c"], stdin=tar.stdout, stdout=out)
        if xz.returncode != 0 or tar.wait() != 0:
            raise KitError(f"tar | xz of {site} failed")
        return
    with tarfile.open(dest, mode="w:xz") as tf:
        tf.add(site, arcname=".")


def pack(site: Path, out: Path, max_part_bytes: int, pins_sha256: str = "") -> Manifest:
    """Cuts the site's archive into the fewest parts of at most `max_part_bytes`, of even size (each
    part is one device call), under out/parts/NN/kit.part."""
    shutil.rmtree(out / "parts", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    archive = out / "kit.tar.xz"
    _write_archive(site, archive)
    total = archive.stat().st_size
    count = max(1, -(-total // max_part_bytes))
    size = -(-total // count)
    parts: list[Part] = []
    with archive.open("rb") as f:
        for index in range(1, count + 1):
            data = f.read(size)
            folder = part_dir(out, index)
            folder.mkdir(parents=True)
            (folder / "kit.part").write_bytes(data)
            parts.append(Part(f"{index:02d}", len(data), hashlib.sha256(data).hexdigest()))
    manifest = Manifest(pins_sha256, file_sha256(archive), _site_bytes(site), tuple(parts))
    archive.unlink()
    (out / "MANIFEST.json").write_text(manifest.to_json())
    return manifest


def part_limit(tree_bytes: int, carry_limit: int = 64 << 20, margin: int = 2 << 20) -> int:
    """The largest part that travels beside the working tree in one call, at most PART_MIB."""
    room = carry_limit - tree_bytes - margin
    if room < 8 << 20:
        raise KitError(f"the working tree ({tree_bytes >> 20} MiB) leaves no room for kit parts")
    return min(PART_MIB << 20, room)


def _tree_bytes() -> int:
    """What travels with every device call: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True)  # fmt: skip
    return sum((ROOT / name).stat().st_size for name in out.stdout.decode().split("\0")
               if name and (ROOT / name).is_file())  # fmt: skip


def receive(repo_kit: Path, store: Path) -> list[str]:
    """Copies the parts this call brought (repo_kit/parts/NN) into the store; returns those missing."""
    manifest = Manifest.from_json((repo_kit / "MANIFEST.json").read_text())
    (store / "parts").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(repo_kit / "MANIFEST.json", store / "MANIFEST.json")
    for part in manifest.parts:
        src = repo_kit / "parts" / part.name / "kit.part"
        dst = store / "parts" / f"{part.name}.part"
        if src.is_file() and not (dst.is_file() and dst.stat().st_size == part.size):
            shutil.copyfile(src, dst)
    return [p.name for p in manifest.parts if not (store / "parts" / f"{p.name}.part").is_file()]


class _Joined(io.RawIOBase):
    """The parts read back to back as one file."""

    def __init__(self, files: list[Path]) -> None:
        self._files = list(files)
        self._file: io.BufferedReader | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while True:
            if self._file is None:
                if not self._files:
                    return 0
                self._file = self._files.pop(0).open("rb")
            n = self._file.readinto(buffer)
            if n:
                return n
            self._file.close()
            self._file = None


def install(store: Path) -> Path:
    """Checks every part's size and SHA-256, then unpacks them into store/site; returns the site."""
    manifest = Manifest.from_json((store / "MANIFEST.json").read_text())
    missing = [p.name for p in manifest.parts if not (store / "parts" / f"{p.name}.part").is_file()]
    if missing:
        raise KitError(f"parts not received yet: {', '.join(missing)} of {len(manifest.parts)}")
    files = [store / "parts" / f"{p.name}.part" for p in manifest.parts]
    for part, path in zip(manifest.parts, files, strict=True):
        if path.stat().st_size != part.size:
            raise KitError(f"part {part.name} is {path.stat().st_size} bytes, MANIFEST.json says {part.size}")
        if file_sha256(path) != part.sha256:
            raise KitError(f"part {part.name} is damaged (SHA-256 differs from MANIFEST.json)")
    site = store / "site"
    staging = store / "site.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with io.BufferedReader(_Joined(files), 1 << 20) as joined:
        with tarfile.open(fileobj=joined, mode="r|xz") as tf:
            tf.extractall(staging, filter="data")
    shutil.rmtree(site, ignore_errors=True)
    staging.rename(site)
    return site


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line."""
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[_canonical(name)] = version.strip()
    return pins


def select_wheels(wheels: list[Path], pins: dict[str, str]) -> list[Path]:
    """The one wheel of each pin among those downloaded (a folder kept between builds also holds
    wheels of earlier pins, and two versions of a package would break the install)."""
    chosen = {}
    for wheel in wheels:
        name, version = wheel.name.split("-")[:2]
        if pins.get(_canonical(name)) == version:
            chosen[_canonical(name)] = wheel
    missing = sorted(set(pins) - set(chosen))
    if missing:
        raise KitError(f"no wheel downloaded for {', '.join(f'{n}=={pins[n]}' for n in missing)}")
    return sorted(chosen.values())


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def build(out: Path, max_part_bytes: int) -> Manifest:
    wheels, site = out / "wheels", out / "site"
    target = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
              *(a for p in PLATFORMS for a in ("--platform", p))]  # fmt: skip
    print(f"==> wheels of {PINS.name} into {wheels}", flush=True)
    _pip("download", "-q", "--no-deps", *target, "-d", str(wheels), "-r", str(PINS))
    found = select_wheels(list(wheels.glob("*.whl")), read_pins(PINS))
    print(f"==> {len(found)} wheels installed into {site}", flush=True)
    shutil.rmtree(site, ignore_errors=True)
    _pip("install", "-q", "--no-deps", "--no-index", "--no-compile", *target, "--target", str(site),
         *map(str, sorted(found)))  # fmt: skip
    removed = prune(site)
    print(f"==> pruned {len(removed)} paths; packing {_site_bytes(site) >> 20} MiB (xz, a few minutes)",
          flush=True)  # fmt: skip
    manifest = pack(site, out, max_part_bytes, file_sha256(PINS))
    print(f"==> {len(manifest.parts)} parts of {manifest.parts[0].size / 2**20:.1f} MiB in {out / 'parts'}")
    return manifest


def device_calls(manifest: Manifest) -> list[str]:
    """The device calls, in order: one per part; the first also starts writing the random model in
    the background, the last unpacks the kit and checks the sleep tier; then the benchmark alone."""
    calls = []
    for i, part in enumerate(manifest.parts, 1):
        carry = f'[".gpukit/MANIFEST.json", ".gpukit/parts/{part.name}"]'
        command = "python3 -m bench.gpu_kit receive"
        if i == 1:
            background = "setsid nohup bash bench/gpu-check.sh model >/tmp/semserve-model.log 2>&1 </dev/null"
            command += f" && ({background} &)"
        if i == len(manifest.parts):
            command += " && python3 -m bench.gpu_kit install && bash bench/gpu-check.sh sleep"
        calls.append(f"run(carry={carry}, command={command!r}, timeout_s=600)")
    calls.append("run(command='bash bench/gpu-check.sh bench', timeout_s=600)")
    return calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="here: wheels -> site -> xz parts in .gpukit/")
    b.add_argument("--part-mib", type=int, default=PART_MIB)
    sub.add_parser("receive", help="there: keep this call's parts in /tmp/semserve-kit")
    sub.add_parser("calls", help="here: print the device calls for the kit in .gpukit/")
    sub.add_parser("install", help="there: unpack all parts into /tmp/semserve-kit/site")
    args = p.parse_args(argv)
    try:
        if args.step == "build":
            limit = part_limit(_tree_bytes())
            manifest = build(KIT, min(limit, args.part_mib << 20))
            print("device calls, one after another (the machine stays warm 30 s between calls):")
            print("\n".join(device_calls(manifest)))
        elif args.step == "calls":
            print("\n".join(device_calls(Manifest.from_json((KIT / "MANIFEST.json").read_text()))))
        elif args.step == "receive":
            missing = receive(KIT, DEVICE)
            print(f"kit parts still to come: {', '.join(missing) or 'none'}", flush=True)
        else:
            print(f"kit unpacked: {install(DEVICE)}", flush=True)
    except (KitError, FileNotFoundError) as exc:
        print(f"gpu_kit {args.step}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
