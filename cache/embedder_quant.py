"""Block-wise int8 weights for the embedder's ONNX model (backend `onnx-int8-block`).

Every MatMul with a constant 2-D weight becomes ONNX Runtime's MatMulNBits: 8-bit weights with one
scale per block of 32 input rows, and `accuracy_level` 4, which has the CPU kernel quantize the
activations to int8 per token row and block as it goes. So, unlike `onnx-int8` (one activation
scale per batch), a prompt's vector does not depend on what it was batched with, and the finer
scales keep it within cosine ~0.9994 of fp32 with every MatMul quantized (bench/embedder.py).

The quantized file is written once beside the prepared fp32 file it comes from (atomically, like the
export) and rebuilt when that file is newer. Making it needs the `onnx` package (the `export`
extra, as the export itself): `semserve embedder prepare --embed-backend onnx-int8-block` at image
build time; a runtime with only onnxruntime then just loads it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from cache.embedder_export import PreparedOnnx
from semserve.logs import get_logger

log = get_logger("semserve.cache.embedder")

BLOCK = 32  # input rows per weight scale: 32 measured best for accuracy, within noise for speed
ACCURACY_LEVEL = 4  # int8 activations (per row and block) in the CPU kernel
SUFFIX = ".int8block.onnx"


def block_int8_path(source: Path) -> Path:
    return source.with_name(source.name.removesuffix(".onnx") + SUFFIX)


def prepare_block_int8(source: Path) -> PreparedOnnx:
    """The block-int8 file made from the prepared fp32 `source`, quantized first if missing or
    older than `source` (then `reused` is False)."""
    target = block_int8_path(source)
    if target.exists() and target.stat().st_mtime >= source.stat().st_mtime:
        return PreparedOnnx(target, reused=True)
    try:
        _write(source, target)
    except OSError as e:
        # A read-only image or volume: quantize into a private temporary directory instead.
        target = Path(tempfile.mkdtemp(prefix="semserve-embedder-")) / target.name
        log.warning("embedder_quant_dir_unwritable", path=str(source.parent), error=str(e), using=str(target))
        _write(source, target)
    return PreparedOnnx(target, reused=False)


def _write(source: Path, target: Path) -> None:
    try:
        import onnx
    except ImportError as e:
        raise RuntimeError(
            f"no block-int8 embedder at {target} and no `onnx` package to make one: run `semserve "
            "embedder prepare --embed-backend onnx-int8-block` where the `export` extra is installed"
        ) from e
    log.info("embedder_onnx_quantize", source=str(source), path=str(target), block=BLOCK)
    model = quantize_block_int8(onnx.load(str(source)))
    tmp = target.with_name(f"{target.stem}.tmp{os.getpid()}.onnx")
    onnx.save(model, str(tmp))
    tmp.replace(target)  # atomic: concurrent processes never read a half-written file


def quantize_block_int8(model: Any, block: int = BLOCK) -> Any:
    """`model` (an onnx.ModelProto) with every MatMul of a constant 2-D float32 weight replaced by
    MatMulNBits (8 bits, symmetric, `block` rows per scale). Modified in place and returned."""
    import onnx
    from onnx import numpy_helper
    from onnxruntime.capi._pybind_state import quantize_matmul_8bits

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    nodes = []
    for node in graph.node:
        w = weights.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or len(w.dims) != 2 or w.data_type != onnx.TensorProto.FLOAT:
            nodes.append(node)
            continue
        fp32 = numpy_helper.to_array(w)
        rows, cols = fp32.shape  # K, N
        k_blocks = (rows + block - 1) // block
        padded = np.zeros((k_blocks * block, cols), dtype=np.float32)
        padded[:rows] = fp32
        packed = np.zeros((cols, k_blocks, block), dtype=np.uint8)
        scales = np.zeros((cols, k_blocks), dtype=np.float32)
        zero_points = np.zeros((cols, k_blocks), dtype=np.uint8)  # unused: symmetric
        quantize_matmul_8bits(packed, padded, scales, zero_points, block, cols, k_blocks * block, True)
        q_name, s_name = f"{w.name}_q8b", f"{w.name}_q8b_scales"
        graph.initializer.extend(
            [numpy_helper.from_array(packed, q_name), numpy_helper.from_array(scales, s_name)]
        )
        nodes.append(onnx.helper.make_node(
            "MatMulNBits", [node.input[0], q_name, s_name], list(node.output), name=f"{node.name}_q8b",
            domain="com.microsoft", K=rows, N=cols, bits=8, block_size=block, accuracy_level=ACCURACY_LEVEL,
        ))  # fmt: skip
        uses[w.name] -= 1
    del graph.node[:]
    graph.node.extend(nodes)
    unused = [t for t in graph.initializer if t.name in uses and uses[t.name] == 0 and t.name in weights]
    for t in unused:
        graph.initializer.remove(t)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return model
