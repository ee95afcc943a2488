"""bench/gpu_kit.py: a site cut into parts comes back whole, and a missing or damaged part is named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_kit
from bench.gpu_kit import KitError, Manifest

ROOT = Path(__file__).resolve().parents[2]


def _site(root: Path) -> Path:
    site = root / "site"
    (site / "vllm" / "vllm_flash_attn").mkdir(parents=True)
    (site / "vllm" / "third_party" / "deep_gemm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("VERSION = '0.25.0'\n")
    # Incompressible bytes, so that the archive needs several parts of 64 KiB.
    (site / "vllm" / "_C.abi3.so").write_bytes(os.urandom(300_000))
    (site / "vllm" / "vllm_flash_attn" / "_vllm_fa2_C.abi3.so").write_bytes(b"fa2")
    (site / "vllm" / "vllm_flash_attn" / "_vllm_fa3_C.abi3.so").write_bytes(b"fa3")
    for tag in ("310", "311", "312", "313", "314"):
        deep_gemm = site / "vllm" / "third_party" / "deep_gemm"
        (deep_gemm / f"_C.cpython-{tag}-x86_64-linux-gnu.so").write_bytes(b"x")
    (site / "kserve").mkdir()
    (site / "kserve" / "__init__.py").write_text("")
    (site / "kserve" / "__pycache__").mkdir()
    (site / "kserve" / "__pycache__" / "x.pyc").write_bytes(b"pyc")
    (site / "vllm" / "vllm-rs").write_bytes(b"rust frontend")
    for name in ("lib/libxgrammar.a", "libxgrammar_bindings.so"):
        (site / "xgrammar" / name).parent.mkdir(parents=True, exist_ok=True)
        (site / "xgrammar" / name).write_bytes(b"x")
    for name in ("tekken_240911.json", "tekken_240718.json"):
        (site / "mistral_common" / "data").mkdir(parents=True, exist_ok=True)
        (site / "mistral_common" / "data" / name).write_text("{}")
    for name in ("client/api.py", "aio/client/api.py"):
        (site / "kubernetes" / name).parent.mkdir(parents=True, exist_ok=True)
        (site / "kubernetes" / name).write_text("")
    return site


def _tree(site: Path) -> dict[str, bytes]:
    return {str(p.relative_to(site)): p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()}


def _send(kit: Path, store: Path, manifest: Manifest, names: list[str]) -> list[str]:
    """One device call: the repo copy there holds the manifest and only the named parts."""
    there = store.parent / "repo-kit"
    if there.exists():
        subprocess.run(["rm", "-rf", str(there)], check=True)
    (there / "parts").mkdir(parents=True)
    (there / "MANIFEST.json").write_bytes((kit / "MANIFEST.json").read_bytes())
    for name in names:
        (there / "parts" / name).mkdir()
        (there / "parts" / name / "kit.part").write_bytes((kit / "parts" / name / "kit.part").read_bytes())
    return gpu_kit.receive(there, store)


def test_prune_keeps_what_hopper_loads(tmp_path: Path) -> None:
    site = _site(tmp_path)
    removed = gpu_kit.prune(site)
    assert "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" in removed
    assert (site / "vllm" / "vllm_flash_attn" / "_vllm_fa3_C.abi3.so").exists()
    deep = sorted(p.name for p in (site / "vllm" / "third_party" / "deep_gemm").iterdir())
    assert deep == ["_C.cpython-312-x86_64-linux-gnu.so"]  # the lent machines run Python 3.12
    assert not (site / "kserve" / "__pycache__").exists()
    assert {"vllm/vllm-rs", "xgrammar/lib/libxgrammar.a", "kubernetes/aio"} <= set(removed)
    assert not list((site / "mistral_common" / "data").iterdir())
    # What vLLM and KServe import stays.
    assert (site / "xgrammar" / "libxgrammar_bindings.so").exists()
    assert (site / "kubernetes" / "client" / "api.py").exists()


def test_parts_sent_over_several_calls_unpack_to_the_same_site(tmp_path: Path) -> None:
    site = _site(tmp_path)
    kit, store = tmp_path / "kit", tmp_path / "store"
    manifest = gpu_kit.pack(site, kit, 64 * 1024, "pins")
    assert len(manifest.parts) >= 4
    sizes = [p.size for p in manifest.parts]
    assert max(sizes) <= 64 * 1024 and max(sizes) - min(sizes) < len(sizes)  # even: no call for a sliver
    assert sorted(q.name for q in (kit / "parts").iterdir()) == [p.name for p in manifest.parts]
    assert Manifest.from_json((kit / "MANIFEST.json").read_text()) == manifest
    names = [p.name for p in manifest.parts]

    assert _send(kit, store, manifest, names[:2]) == names[2:]
    with pytest.raises(KitError, match=f"parts not received yet: {', '.join(names[2:])}"):
        gpu_kit.install(store)
    assert _send(kit, store, manifest, names[2:]) == []
    unpacked = gpu_kit.install(store)
    assert _tree(unpacked) == _tree(site)


def test_parts_leave_room_for_the_working_tree_in_one_call() -> None:
    assert gpu_kit.part_limit(8 << 20) == gpu_kit.PART_MIB << 20
    assert gpu_kit.part_limit(20 << 20) == (64 - 20 - 2) << 20
    with pytest.raises(KitError, match="working tree \\(60 MiB\\) leaves no room"):
        gpu_kit.part_limit(60 << 20)


def test_a_damaged_part_is_named_and_nothing_is_left_half_installed(tmp_path: Path) -> None:
    site = _site(tmp_path)
    kit, store = tmp_path / "kit", tmp_path / "store"
    manifest = gpu_kit.pack(site, kit, 64 * 1024)
    _send(kit, store, manifest, [p.name for p in manifest.parts])
    second = store / "parts" / f"{manifest.parts[1].name}.part"
    data = bytearray(second.read_bytes())
    data[100] ^= 0xFF
    second.write_bytes(bytes(data))
    with pytest.raises(KitError, match=f"part {manifest.parts[1].name} is damaged"):
        gpu_kit.install(store)
    assert not (store / "site").exists()
    second.write_bytes(second.read_bytes()[:-1])
    with pytest.raises(KitError, match=f"part {manifest.parts[1].name} is .* bytes"):
        gpu_kit.install(store)


def test_device_calls_carry_one_part_each_and_end_with_the_checks(tmp_path: Path) -> None:
    manifest = gpu_kit.pack(_site(tmp_path), tmp_path / "kit", 64 * 1024)
    calls = gpu_kit.device_calls(manifest)
    assert len(calls) == len(manifest.parts) + 1
    for part, call in zip(manifest.parts, calls, strict=False):
        assert f'".gpukit/parts/{part.name}"' in call and "gpu_kit receive" in call
    assert "setsid nohup bash bench/gpu-check.sh model" in calls[0]  # the model is written meanwhile
    assert "gpu_kit install && bash bench/gpu-check.sh sleep" in calls[-2]
    assert "gpu-check.sh bench" in calls[-1] and "carry" not in calls[-1]
    assert "gpu-check.sh sleep" not in "".join(calls[:-2])


def test_the_device_steps_need_only_the_standard_library() -> None:
    # The lent machine runs `python3 -m bench.gpu_kit` before anything is installed there.
    code = (
        "import sys; before = set(sys.modules); import bench.gpu_kit; "
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in "
        "sys.stdlib_module_names | {'bench', 'semserve'} and not m.startswith('_')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = "import sys, bench.gpu_kit; print(sorted(m for m in sys.modules if m.startswith('semserve')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['semserve', 'semserve.files']"


def test_receive_without_a_manifest_says_so(tmp_path: Path) -> None:
    code = (
        "import sys, pathlib; from bench import gpu_kit; "
        f"gpu_kit.KIT = pathlib.Path({str(tmp_path)!r}); sys.exit(gpu_kit.main(['receive']))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2
    assert "gpu_kit receive:" in out.stderr and "MANIFEST.json" in out.stderr


def test_the_pins_leave_torch_and_cuda_to_the_image() -> None:
    pins = dict(
        line.split("==")
        for line in gpu_kit.PINS.read_text().splitlines()
        if line and not line.startswith("#")
    )
    # vLLM 0.25.0 is the release built against torch==2.11.0, what the lent image has (cu130);
    # carrying torch or CUDA libraries would not fit the calls, and would shadow the image's own.
    assert pins["vllm"] == "0.25.0" and pins["kserve"] == "0.21.0"
    assert not [name for name in pins if name.startswith(("torch", "nvidia-", "cuda-", "triton"))]


def test_the_wheel_of_each_pin_is_chosen_and_a_missing_one_is_named(tmp_path: Path) -> None:
    pins_file = tmp_path / "pins.txt"
    pins_file.write_text("# comment\nopenai-harmony==0.0.8\nvllm==0.25.0\n")
    pins = gpu_kit.read_pins(pins_file)
    assert pins == {"openai-harmony": "0.0.8", "vllm": "0.25.0"}
    wheels = [tmp_path / n for n in ("vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                                     "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl",  # an earlier pin's
                                     "openai_harmony-0.0.8-cp38-abi3-manylinux_2_17_x86_64.whl")]  # fmt: skip
    assert [w.name for w in gpu_kit.select_wheels(wheels, pins)] == [wheels[2].name, wheels[0].name]
    with pytest.raises(KitError, match=r"no wheel downloaded for openai-harmony==0\.0\.8"):
        gpu_kit.select_wheels(wheels[:2], pins)
