#!/usr/bin/env python3
"""Write the ONNX graphs of all-MiniLM-L6-v2 from the model folder's safetensors, without a model hub.

Three steps, each reproducible from the same inputs:
1. `model_raw.onnx`: the BERT encoder written op by op with `onnx.helper` (standard ONNX ops, opset 17),
   in the shape `torch.onnx.export` gives a Hugging Face `BertModel`, so ONNX Runtime's fusion patterns
   recognise it. Inputs `input_ids`, `attention_mask`, `token_type_ids` (int64, [batch, sequence]); output
   `last_hidden_state` (float32, [batch, sequence, 384]). Pooling and normalisation stay in ragstream.
2. `model_fp32.onnx`: ONNX Runtime's BERT optimizer (`onnxruntime.transformers.optimizer`, 12 heads,
   hidden size 384) fuses attention, skip layer norms, GELU and the embedding layer norm.
3. `model_int8.onnx`: `onnxruntime.quantization.quantize_dynamic` of the fused graph, int8 weights per
   output channel (QInt8), activations quantised at run time.

The script checks that the fused and the int8 graphs agree with the raw one on a few inputs and prints the
worst cosine of each. Needs `numpy`, `onnx` and `onnxruntime` (installed by deploy/scripts/install/onnx.sh).

Usage: export_onnx.py MODEL_DIR   (writes the three graphs into MODEL_DIR)
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
HEADS = 12


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The safetensors format: an 8-byte little-endian header length, a JSON header, raw tensors."""
    dtypes = {"F32": np.float32, "I64": np.int64}
    with path.open("rb") as file:
        header_length = struct.unpack("<Q", file.read(8))[0]
        header = json.loads(file.read(header_length))
        data = file.read()
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        array = np.frombuffer(data[start:end], dtype=dtypes[entry["dtype"]])
        tensors[name] = array.reshape(entry["shape"]).copy()
    return tensors


class Graph:
    """Collects nodes and initializers; names are unique by construction."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0

    def constant(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, inputs: list[str], **attributes) -> str:
        self.count += 1
        output = f"{op_type.lower()}_{self.count}"
        self.nodes.append(
            helper.make_node(op_type, inputs, [output], name=f"{op_type}_{self.count}", **attributes)
        )
        return output

    def linear(self, x: str, weight: np.ndarray, bias: np.ndarray, name: str) -> str:
        """torch's Linear as exported: MatMul by the transposed weight, then Add of the bias."""
        w = self.constant(f"{name}.weight_t", np.ascontiguousarray(weight.T))
        b = self.constant(f"{name}.bias", bias)
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def layer_norm(self, x: str, weight: np.ndarray, bias: np.ndarray, name: str, eps: float) -> str:
        w = self.constant(f"{name}.weight", weight)
        b = self.constant(f"{name}.bias", bias)
        return self.op("LayerNormalization", [x, w, b], axis=-1, epsilon=eps)


def build(tensors: dict[str, np.ndarray], config: dict) -> onnx.ModelProto:
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_size = hidden // heads
    eps = float(config["layer_norm_eps"])
    g = Graph()
    shape_heads = g.constant("shape_heads", np.array([0, 0, heads, head_size], dtype=np.int64))
    shape_hidden = g.constant("shape_hidden", np.array([0, 0, hidden], dtype=np.int64))
    one = g.constant("one", np.array(1.0, dtype=np.float32))
    mask_floor = g.constant("mask_floor", np.array(np.finfo(np.float32).min, dtype=np.float32))
    scale = g.constant("scale", np.array(np.sqrt(head_size), dtype=np.float32))
    sqrt2 = g.constant("sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
    half = g.constant("half", np.array(0.5, dtype=np.float32))

    # Embeddings: word + position + token type, then layer norm.
    prefix = "embeddings"
    words = g.op("Gather", [g.constant("word_embeddings", tensors[f"{prefix}.word_embeddings.weight"]), "input_ids"])
    position_table = g.constant("position_ids", tensors[f"{prefix}.position_ids"])
    sequence = g.op("Gather", [g.op("Shape", ["input_ids"]), g.constant("axis1", np.array(1, dtype=np.int64))])
    position_ids = g.op(
        "Slice",
        [
            position_table,
            g.constant("zero_1d", np.array([0], dtype=np.int64)),
            g.op("Unsqueeze", [sequence, g.constant("axes0", np.array([0], dtype=np.int64))]),
            g.constant("axes1", np.array([1], dtype=np.int64)),
        ],
    )
    positions = g.op(
        "Gather",
        [g.constant("position_embeddings", tensors[f"{prefix}.position_embeddings.weight"]), position_ids],
    )
    types = g.op(
        "Gather",
        [g.constant("token_type_embeddings", tensors[f"{prefix}.token_type_embeddings.weight"]), "token_type_ids"],
    )
    x = g.op("Add", [g.op("Add", [words, types]), positions])
    x = g.layer_norm(x, tensors[f"{prefix}.LayerNorm.weight"], tensors[f"{prefix}.LayerNorm.bias"], f"{prefix}.LayerNorm", eps)

    # The additive attention mask: 0 where a token is real, the float minimum where it is padding.
    extended = g.op("Unsqueeze", ["attention_mask", g.constant("axes1_mask", np.array([1], dtype=np.int64))])
    extended = g.op("Unsqueeze", [extended, g.constant("axes2_mask", np.array([2], dtype=np.int64))])
    extended = g.op("Cast", [extended], to=TensorProto.FLOAT)
    additive = g.op("Mul", [g.op("Sub", [one, extended]), mask_floor])

    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}"
        t = lambda suffix: tensors[f"{p}.{suffix}"]  # noqa: E731
        q = g.linear(x, t("attention.self.query.weight"), t("attention.self.query.bias"), f"{p}.query")
        k = g.linear(x, t("attention.self.key.weight"), t("attention.self.key.bias"), f"{p}.key")
        v = g.linear(x, t("attention.self.value.weight"), t("attention.self.value.bias"), f"{p}.value")
        q = g.op("Transpose", [g.op("Reshape", [q, shape_heads])], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [k, shape_heads])], perm=[0, 2, 3, 1])
        v = g.op("Transpose", [g.op("Reshape", [v, shape_heads])], perm=[0, 2, 1, 3])
        scores = g.op("Add", [g.op("Div", [g.op("MatMul", [q, k]), scale]), additive])
        probabilities = g.op("Softmax", [scores], axis=-1)
        context = g.op("Transpose", [g.op("MatMul", [probabilities, v])], perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, shape_hidden])
        attended = g.linear(context, t("attention.output.dense.weight"), t("attention.output.dense.bias"), f"{p}.attention_out")
        x = g.layer_norm(
            g.op("Add", [attended, x]),
            t("attention.output.LayerNorm.weight"),
            t("attention.output.LayerNorm.bias"),
            f"{p}.attention_norm",
            eps,
        )
        inner = g.linear(x, t("intermediate.dense.weight"), t("intermediate.dense.bias"), f"{p}.intermediate")
        # GELU as torch exports it: x * 0.5 * (1 + erf(x / sqrt 2)).
        gelu = g.op("Mul", [g.op("Mul", [inner, g.op("Add", [g.op("Erf", [g.op("Div", [inner, sqrt2])]), one])]), half])
        out = g.linear(gelu, t("output.dense.weight"), t("output.dense.bias"), f"{p}.output")
        x = g.layer_norm(g.op("Add", [out, x]), t("output.LayerNorm.weight"), t("output.LayerNorm.bias"), f"{p}.output_norm", eps)

    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    dims = ["batch", "sequence"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, dims) for n in ("input_ids", "attention_mask", "token_type_ids")]
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, dims + [hidden])]
    graph = helper.make_graph(g.nodes, "all-MiniLM-L6-v2", inputs, outputs, g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="pytorch")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def pooled(session, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    hidden = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
    summed = (hidden * mask[:, :, None]).sum(axis=1)
    vectors = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    directory = Path(sys.argv[1])
    config = json.loads((directory / "config.json").read_text())
    if config["num_attention_heads"] != HEADS:
        raise SystemExit(f"expected {HEADS} heads, the config has {config['num_attention_heads']}")
    tensors = read_safetensors(directory / "model.safetensors")
    raw_path, fp32_path, int8_path = (directory / n for n in ("model_raw.onnx", "model_fp32.onnx", "model_int8.onnx"))
    onnx.save(build(tensors, config), raw_path)

    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(str(raw_path), model_type="bert", num_heads=HEADS, hidden_size=config["hidden_size"], opt_level=0)
    fused = optimized.get_fused_operator_statistics()
    print(f"export-onnx: fused operators {json.dumps({k: v for k, v in fused.items() if v})}", file=sys.stderr)
    if fused.get("Attention", 0) != config["num_hidden_layers"]:
        raise SystemExit(f"attention fused in {fused.get('Attention', 0)} of {config['num_hidden_layers']} layers")
    optimized.save_model_to_file(str(fp32_path))
    quantize_dynamic(
        str(fp32_path),
        str(int8_path),
        per_channel=True,
        weight_type=QuantType.QInt8,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )

    # Agreement with the raw graph on random word pieces, padding included.
    rng = np.random.default_rng(7)
    ids = rng.integers(1000, config["vocab_size"], size=(4, 40), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 25:] = 0
    mask[3, 9:] = 0
    ids[mask == 0] = 0
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    reference = pooled(ort.InferenceSession(str(raw_path), options, providers=["CPUExecutionProvider"]), ids, mask)
    for path, floor in ((fp32_path, 0.9999), (int8_path, 0.95)):
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        worst = float((pooled(session, ids, mask) * reference).sum(axis=1).min())
        print(f"export-onnx: {path.name} worst cosine vs the raw graph {worst:.6f}", file=sys.stderr)
        if worst < floor:
            raise SystemExit(f"{path.name} disagrees with the raw graph (cosine {worst:.6f} < {floor})")
    raw_path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
