"""The models bench/suite/journey_corpus.py builds from code: onnx.helper graphs with seeded numpy weights,
initialised as frameworks initialise them (untrained); each passes onnx.checker.check_model(full_check=True)
through tests/models.py's `make`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.paths import test_models


def make(graph, **kwargs) -> onnx.ModelProto:
    """tests/models.py's make: the model, checked in full."""
    return test_models().make(graph, **kwargs)


def _vi(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


class _Weights:
    """Seeded initializers, initialised as frameworks do (uniform +-1/sqrt(fan_in), He for ReLU)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.tensors: list[onnx.TensorProto] = []

    def add(self, name: str, values) -> str:
        array = np.asarray(values)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        self.tensors.append(numpy_helper.from_array(array, name))
        return name

    def uniform(self, name: str, shape: tuple[int, ...], fan_in: int) -> str:
        bound = 1 / np.sqrt(fan_in)
        return self.add(name, self.rng.uniform(-bound, bound, shape))

    def he(self, name: str, shape: tuple[int, ...], fan_in: int) -> str:
        return self.add(name, self.rng.standard_normal(shape) * np.sqrt(2 / fan_in))

    def normal(self, name: str, shape: tuple[int, ...], scale: float) -> str:
        return self.add(name, self.rng.standard_normal(shape) * scale)


def _gelu_erf(x: str, out: str, prefix: str, w: _Weights) -> list[onnx.NodeProto]:
    """GELU written out with Erf, as torch.onnx exports nn.GELU() below opset 20."""
    if "gelu.sqrt2" not in [t.name for t in w.tensors]:
        w.add("gelu.sqrt2", np.array(np.sqrt(2.0), np.float32))
        w.add("gelu.one", np.array(1.0, np.float32))
        w.add("gelu.half", np.array(0.5, np.float32))
    return [
        helper.make_node("Div", [x, "gelu.sqrt2"], [f"{prefix}.d"], name=f"{prefix}/div"),
        helper.make_node("Erf", [f"{prefix}.d"], [f"{prefix}.e"], name=f"{prefix}/erf"),
        helper.make_node("Add", [f"{prefix}.e", "gelu.one"], [f"{prefix}.a"], name=f"{prefix}/add"),
        helper.make_node("Mul", [x, f"{prefix}.a"], [f"{prefix}.m"], name=f"{prefix}/mul"),
        helper.make_node("Mul", [f"{prefix}.m", "gelu.half"], [out], name=f"{prefix}/half"),
    ]


def lstm_keywords(hidden: int = 64, features: int = 40, keywords: int = 8) -> onnx.ModelProto:
    """A keyword spotter: log band energies (batch 1, frames, 40) -> ONNX LSTM -> last hidden
    state -> Gemm -> keyword logits. Dynamic "frames"."""
    w = _Weights(21)
    bias = np.zeros((1, 8 * hidden), np.float32)
    bias[0, hidden:2 * hidden] = 1.0  # forget gate (ONNX order i, o, f, c) opens at the start, as trained LSTMs do
    nodes = [
        helper.make_node("Transpose", ["features"], ["time_major"], perm=[1, 0, 2], name="to_time_major"),
        helper.make_node(
            "LSTM",
            [
                "time_major",
                w.uniform("lstm.W", (1, 4 * hidden, features), hidden),
                w.uniform("lstm.R", (1, 4 * hidden, hidden), hidden),
                w.add("lstm.B", bias),
            ],
            ["", "last_hidden"],
            hidden_size=hidden,
            name="lstm",
        ),
        helper.make_node(
            "Reshape", ["last_hidden", w.add("flat_shape", np.array([1, hidden], np.int64))], ["h"], name="flatten"
        ),
        helper.make_node(
            "Gemm",
            ["h", w.he("head.w", (keywords, hidden), hidden), w.add("head.b", np.zeros(keywords))],
            ["logits"],
            transB=1,
            name="head",
        ),
    ]
    graph = helper.make_graph(nodes, "lstm_keywords", [_vi("features", TensorProto.FLOAT, [1, "frames", features])],
                              [_vi("logits", TensorProto.FLOAT, [1, keywords])], w.tensors)
    return make(graph)


def gru_tagger(hidden: int = 48, features: int = 40, tags: int = 4) -> onnx.ModelProto:
    """A frame tagger: log band energies -> ONNX GRU (linear_before_reset, as PyTorch exports it)
    -> a tag per frame (frames, 4). Dynamic "frames"."""
    w = _Weights(22)
    nodes = [
        helper.make_node("Transpose", ["features"], ["time_major"], perm=[1, 0, 2], name="to_time_major"),
        helper.make_node(
            "GRU",
            [
                "time_major",
                w.uniform("gru.W", (1, 3 * hidden, features), hidden),
                w.uniform("gru.R", (1, 3 * hidden, hidden), hidden),
                w.uniform("gru.B", (1, 6 * hidden), hidden),
            ],
            ["all_hidden"],
            hidden_size=hidden,
            linear_before_reset=1,
            name="gru",
        ),
        helper.make_node(
            "Squeeze", ["all_hidden", w.add("axes12", np.array([1, 2], np.int64))], ["per_frame"], name="squeeze"
        ),
        helper.make_node("MatMul", ["per_frame", w.he("tag.w", (hidden, tags), hidden)], ["tag_mm"], name="tag"),
        helper.make_node("Add", ["tag_mm", w.add("tag.b", np.zeros(tags))], ["tags"], name="tag_bias"),
    ]
    graph = helper.make_graph(nodes, "gru_tagger", [_vi("features", TensorProto.FLOAT, [1, "frames", features])],
                              [_vi("tags", TensorProto.FLOAT, ["frames", tags])], w.tensors)
    return make(graph)


BERT_VOCAB, GPT_VOCAB = 1000, 512


def _attention(w: _Weights, p: str, x: str, hidden: int, heads: int, mask: str) -> list[onnx.NodeProto]:
    """Multi-head self-attention as exporters write it: Q/K/V MatMuls, Reshape to heads, scaled
    scores plus an additive mask, Softmax, context, output projection."""
    head = hidden // heads
    split = w.add(f"{p}.split_shape", np.array([0, 0, heads, head], np.int64))
    merge = w.add(f"{p}.merge_shape", np.array([0, 0, hidden], np.int64))
    scale = w.add(f"{p}.scale", np.array(1 / np.sqrt(head), np.float32))
    nodes = []
    for proj in ("q", "k", "v"):
        nodes += [
            helper.make_node(
                "MatMul",
                [x, w.uniform(f"{p}.{proj}.w", (hidden, hidden), hidden)],
                [f"{p}.{proj}mm"],
                name=f"{p}/{proj}",
            ),
            helper.make_node(
                "Add",
                [f"{p}.{proj}mm", w.uniform(f"{p}.{proj}.b", (hidden,), hidden)],
                [f"{p}.{proj}b"],
                name=f"{p}/{proj}_bias",
            ),
            helper.make_node("Reshape", [f"{p}.{proj}b", split], [f"{p}.{proj}h"], name=f"{p}/{proj}_heads"),
        ]
    nodes += [
        helper.make_node("Transpose", [f"{p}.qh"], [f"{p}.qt"], perm=[0, 2, 1, 3], name=f"{p}/q_t"),
        helper.make_node("Transpose", [f"{p}.kh"], [f"{p}.kt"], perm=[0, 2, 3, 1], name=f"{p}/k_t"),
        helper.make_node("Transpose", [f"{p}.vh"], [f"{p}.vt"], perm=[0, 2, 1, 3], name=f"{p}/v_t"),
        helper.make_node("MatMul", [f"{p}.qt", f"{p}.kt"], [f"{p}.s"], name=f"{p}/qk"),
        helper.make_node("Mul", [f"{p}.s", scale], [f"{p}.ss"], name=f"{p}/scale"),
        helper.make_node("Add", [f"{p}.ss", mask], [f"{p}.sm"], name=f"{p}/mask"),
        helper.make_node("Softmax", [f"{p}.sm"], [f"{p}.a"], axis=-1, name=f"{p}/softmax"),
        helper.make_node("MatMul", [f"{p}.a", f"{p}.vt"], [f"{p}.c"], name=f"{p}/attend"),
        helper.make_node("Transpose", [f"{p}.c"], [f"{p}.ct"], perm=[0, 2, 1, 3], name=f"{p}/c_t"),
        helper.make_node("Reshape", [f"{p}.ct", merge], [f"{p}.cm"], name=f"{p}/merge_heads"),
        helper.make_node(
            "MatMul", [f"{p}.cm", w.uniform(f"{p}.o.w", (hidden, hidden), hidden)], [f"{p}.om"], name=f"{p}/o"
        ),
        helper.make_node(
            "Add", [f"{p}.om", w.uniform(f"{p}.o.b", (hidden,), hidden)], [f"{p}.out"], name=f"{p}/o_bias"
        ),
    ]
    return nodes


def _layer_norm(w: _Weights, x: str, out: str, name: str, hidden: int, written_out: bool) -> list[onnx.NodeProto]:
    scale = w.add(f"{name}.w", 1 + 0.1 * w.rng.standard_normal(hidden))
    shift = w.add(f"{name}.b", 0.1 * w.rng.standard_normal(hidden))
    if not written_out:
        return [helper.make_node("LayerNormalization", [x, scale, shift], [out], axis=-1, epsilon=1e-5, name=name)]
    eps = w.add(f"{name}.eps", np.array(1e-5, np.float32))
    two = w.add(f"{name}.two", np.array(2.0, np.float32))
    return [  # as opset < 17 exports write it (GPT-2 from transformers)
        helper.make_node("ReduceMean", [x], [f"{name}.mu"], axes=[-1], name=f"{name}/mean"),
        helper.make_node("Sub", [x, f"{name}.mu"], [f"{name}.d"], name=f"{name}/sub"),
        helper.make_node("Pow", [f"{name}.d", two], [f"{name}.d2"], name=f"{name}/pow"),
        helper.make_node("ReduceMean", [f"{name}.d2"], [f"{name}.var"], axes=[-1], name=f"{name}/var"),
        helper.make_node("Add", [f"{name}.var", eps], [f"{name}.ve"], name=f"{name}/add_eps"),
        helper.make_node("Sqrt", [f"{name}.ve"], [f"{name}.sd"], name=f"{name}/sqrt"),
        helper.make_node("Div", [f"{name}.d", f"{name}.sd"], [f"{name}.n"], name=f"{name}/div"),
        helper.make_node("Mul", [f"{name}.n", scale], [f"{name}.nw"], name=f"{name}/scale"),
        helper.make_node("Add", [f"{name}.nw", shift], [out], name=f"{name}/shift"),
    ]


def _positions(w: _Weights, ids: str, max_len: int) -> list[onnx.NodeProto]:
    """position ids 0..seq-1: a constant buffer sliced by the input's length (Shape -> Gather ->
    Slice), as BERT and GPT-2 exports read their position_ids buffer."""
    w.add("pos.buffer", np.arange(max_len, dtype=np.int64)[None])
    w.add("pos.zero", np.array([0], np.int64))
    w.add("pos.one", np.array([1], np.int64))
    return [
        helper.make_node("Shape", [ids], ["ids.shape"], name="ids_shape"),
        helper.make_node("Gather", ["ids.shape", "pos.one"], ["ids.len"], axis=0, name="ids_len"),
        helper.make_node(
            "Slice", ["pos.buffer", "pos.zero", "ids.len", "pos.one"], ["position_ids"], name="position_ids"
        ),
    ]


def bert_tiny(hidden: int = 64, heads: int = 2, layers: int = 2, ffn: int = 128, labels: int = 3,
              max_len: int = 64) -> onnx.ModelProto:
    """A BERT-tiny-like sentence classifier: word and position embeddings (Gather), an additive
    attention mask from attention_mask, `layers` post-norm encoder blocks (LayerNormalization,
    multi-head attention, GELU via Erf), the [CLS] pooler (Tanh) and a classifier. Dynamic
    "batch" and "sequence"."""
    w = _Weights(23)
    w.add("word_embeddings", w.rng.standard_normal((BERT_VOCAB, hidden)) * 0.5)
    w.add("position_embeddings", w.rng.standard_normal((max_len, hidden)) * 0.2)
    w.add("mask.one", np.array(1.0, np.float32))
    w.add("mask.big", np.array(-10000.0, np.float32))
    w.add("mask.axes", np.array([1, 2], np.int64))
    nodes = [
        helper.make_node("Gather", ["word_embeddings", "input_ids"], ["words"], name="word_lookup"),
        *_positions(w, "input_ids", max_len),
        helper.make_node("Gather", ["position_embeddings", "position_ids"], ["positions"], name="position_lookup"),
        helper.make_node("Add", ["words", "positions"], ["embedded"], name="embed_sum"),
        *_layer_norm(w, "embedded", "h0", "embed_norm", hidden, written_out=False),
        helper.make_node("Cast", ["attention_mask"], ["mask.f"], to=TensorProto.FLOAT, name="mask_cast"),
        helper.make_node("Sub", ["mask.one", "mask.f"], ["mask.inv"], name="mask_invert"),
        helper.make_node("Mul", ["mask.inv", "mask.big"], ["mask.add"], name="mask_scale"),
        helper.make_node("Unsqueeze", ["mask.add", "mask.axes"], ["mask"], name="mask_heads"),
    ]
    stream = "h0"
    for i in range(layers):
        p = f"layer{i}"
        nodes += _attention(w, f"{p}.attn", stream, hidden, heads, "mask")
        nodes += [helper.make_node("Add", [stream, f"{p}.attn.out"], [f"{p}.r1"], name=f"{p}/residual1")]
        nodes += _layer_norm(w, f"{p}.r1", f"{p}.n1", f"{p}/norm1", hidden, written_out=False)
        nodes += [
            helper.make_node(
                "MatMul", [f"{p}.n1", w.uniform(f"{p}.ffn1.w", (hidden, ffn), hidden)], [f"{p}.f1m"], name=f"{p}/ffn1"
            ),
            helper.make_node(
                "Add", [f"{p}.f1m", w.uniform(f"{p}.ffn1.b", (ffn,), hidden)], [f"{p}.f1"], name=f"{p}/ffn1_bias"
            ),
            *_gelu_erf(f"{p}.f1", f"{p}.g", f"{p}/gelu", w),
            helper.make_node(
                "MatMul", [f"{p}.g", w.uniform(f"{p}.ffn2.w", (ffn, hidden), ffn)], [f"{p}.f2m"], name=f"{p}/ffn2"
            ),
            helper.make_node(
                "Add", [f"{p}.f2m", w.uniform(f"{p}.ffn2.b", (hidden,), ffn)], [f"{p}.f2"], name=f"{p}/ffn2_bias"
            ),
            helper.make_node("Add", [f"{p}.n1", f"{p}.f2"], [f"{p}.r2"], name=f"{p}/residual2"),
        ]
        nodes += _layer_norm(w, f"{p}.r2", f"{p}.out", f"{p}/norm2", hidden, written_out=False)
        stream = f"{p}.out"
    nodes += [
        helper.make_node(
            "Gather", [stream, w.add("cls.index", np.array(0, np.int64))], ["cls"], axis=1, name="cls_token"
        ),
        helper.make_node(
            "Gemm",
            ["cls", w.uniform("pooler.w", (hidden, hidden), hidden), w.add("pooler.b", np.zeros(hidden))],
            ["pooled_mm"],
            name="pooler",
        ),
        helper.make_node("Tanh", ["pooled_mm"], ["pooled"], name="pooler_tanh"),
        helper.make_node(
            "Gemm",
            ["pooled", w.he("classifier.w", (hidden, labels), hidden), w.add("classifier.b", np.zeros(labels))],
            ["logits"],
            name="classifier",
        ),
    ]
    graph = helper.make_graph(nodes, "bert_tiny",
                              [_vi("input_ids", TensorProto.INT64, ["batch", "sequence"]),
                               _vi("attention_mask", TensorProto.INT64, ["batch", "sequence"])],
                              [_vi("logits", TensorProto.FLOAT, ["batch", labels])], w.tensors)
    return make(graph)


def gpt2_tiny(
    hidden: int = 64, heads: int = 2, layers: int = 2, max_len: int = 64, name: str = "gpt2_tiny"
) -> onnx.ModelProto:
    """A GPT-2-tiny-like decoder: token and position embeddings, a causal mask that is a constant
    (0 on and below the diagonal, -10000 above; sliced to the sequence, no Where, no Trilu),
    `layers` pre-norm blocks with written-out LayerNorm and GELU's tanh form, logits through the
    tied (transposed) token embedding. Dynamic "batch" and "sequence"."""
    w = _Weights(24)
    embedding = w.rng.standard_normal((GPT_VOCAB, hidden)).astype(np.float32) * 0.5
    w.add("wte", embedding)
    w.add("wte.T", embedding.T.copy())
    w.add("wpe", w.rng.standard_normal((max_len, hidden)) * 0.1)
    causal = np.triu(np.full((max_len, max_len), -10000.0, np.float32), k=1)
    w.add("causal.buffer", causal[None, None])
    w.add("causal.axes", np.array([2, 3], np.int64))
    w.add("gelu.c", np.array(np.sqrt(2 / np.pi), np.float32))
    w.add("gelu.k", np.array(0.044715, np.float32))
    w.add("gelu.three", np.array(3.0, np.float32))
    w.add("gelu.1", np.array(1.0, np.float32))
    w.add("gelu.h", np.array(0.5, np.float32))
    nodes = [
        helper.make_node("Gather", ["wte", "input_ids"], ["tokens"], name="token_lookup"),
        *_positions(w, "input_ids", max_len),
        helper.make_node("Gather", ["wpe", "position_ids"], ["positions"], name="position_lookup"),
        helper.make_node("Add", ["tokens", "positions"], ["h0"], name="embed_sum"),
        helper.make_node("Concat", ["ids.len", "ids.len"], ["causal.ends"], axis=0, name="causal_ends"),
        helper.make_node("Concat", ["pos.zero", "pos.zero"], ["causal.starts"], axis=0, name="causal_starts"),
        helper.make_node(
            "Slice", ["causal.buffer", "causal.starts", "causal.ends", "causal.axes"], ["causal"], name="causal_mask"
        ),
    ]
    stream = "h0"
    for i in range(layers):
        p = f"h{i}"
        nodes += _layer_norm(w, stream, f"{p}.ln1", f"{p}/ln_1", hidden, written_out=True)
        nodes += _attention(w, f"{p}.attn", f"{p}.ln1", hidden, heads, "causal")
        nodes += [helper.make_node("Add", [stream, f"{p}.attn.out"], [f"{p}.r1"], name=f"{p}/residual1")]
        nodes += _layer_norm(w, f"{p}.r1", f"{p}.ln2", f"{p}/ln_2", hidden, written_out=True)
        x = f"{p}.fc"
        nodes += [
            helper.make_node(
                "MatMul",
                [f"{p}.ln2", w.uniform(f"{p}.fc.w", (hidden, 4 * hidden), hidden)],
                [f"{p}.fcm"],
                name=f"{p}/c_fc",
            ),
            helper.make_node(
                "Add", [f"{p}.fcm", w.uniform(f"{p}.fc.b", (4 * hidden,), hidden)], [x], name=f"{p}/c_fc_bias"
            ),
            # gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            helper.make_node("Pow", [x, "gelu.three"], [f"{p}.x3"], name=f"{p}/gelu_pow"),
            helper.make_node("Mul", [f"{p}.x3", "gelu.k"], [f"{p}.kx3"], name=f"{p}/gelu_mul_k"),
            helper.make_node("Add", [x, f"{p}.kx3"], [f"{p}.inner"], name=f"{p}/gelu_add"),
            helper.make_node("Mul", [f"{p}.inner", "gelu.c"], [f"{p}.scaled"], name=f"{p}/gelu_mul_c"),
            helper.make_node("Tanh", [f"{p}.scaled"], [f"{p}.t"], name=f"{p}/gelu_tanh"),
            helper.make_node("Add", [f"{p}.t", "gelu.1"], [f"{p}.t1"], name=f"{p}/gelu_add1"),
            helper.make_node("Mul", [x, f"{p}.t1"], [f"{p}.xt"], name=f"{p}/gelu_mul_x"),
            helper.make_node("Mul", [f"{p}.xt", "gelu.h"], [f"{p}.g"], name=f"{p}/gelu_half"),
            helper.make_node(
                "MatMul",
                [f"{p}.g", w.uniform(f"{p}.proj.w", (4 * hidden, hidden), 4 * hidden)],
                [f"{p}.pm"],
                name=f"{p}/c_proj",
            ),
            helper.make_node(
                "Add",
                [f"{p}.pm", w.uniform(f"{p}.proj.b", (hidden,), 4 * hidden)],
                [f"{p}.mlp"],
                name=f"{p}/c_proj_bias",
            ),
            helper.make_node("Add", [f"{p}.r1", f"{p}.mlp"], [f"{p}.out"], name=f"{p}/residual2"),
        ]
        stream = f"{p}.out"
    nodes += _layer_norm(w, stream, "final", "ln_f", hidden, written_out=True)
    nodes += [helper.make_node("MatMul", ["final", "wte.T"], ["logits"], name="lm_head")]
    graph = helper.make_graph(nodes, name, [_vi("input_ids", TensorProto.INT64, ["batch", "sequence"])],
                              [_vi("logits", TensorProto.FLOAT, ["batch", "sequence", GPT_VOCAB])], w.tensors)
    return make(graph)


def gpt2_medium_slice() -> onnx.ModelProto:
    """Two blocks of a decoder of GPT-2 medium's width (hidden 1024, 16 heads, MLP 4096), built as
    gpt2_tiny (its vocabulary of 512): 105 MB of float weights, 96% of them in the blocks' MatMuls.
    The corpus's other transformers run in well under a millisecond, where a call's overhead, not
    the weights, sets the time; this one reads 100 MB of weights a run, as a language model's
    layers do, so weight-only quantization's speed shows (issue 22, part 5)."""
    return gpt2_tiny(hidden=1024, heads=16, layers=2, name="gpt2_medium_slice")


def _conv(w: _Weights, x: str, out: str, name: str, cin: int, cout: int, k: int = 3, stride: int = 1, group: int = 1,
          relu: bool = True, pad: int | None = None) -> list[onnx.NodeProto]:
    fan_in = cin // group * k * k
    pad = k // 2 if pad is None else pad
    conv = helper.make_node(
        "Conv",
        [x, w.he(f"{name}.w", (cout, cin // group, k, k), fan_in), w.normal(f"{name}.b", (cout,), 0.05)],
        [out if not relu else f"{out}.pre"],
        kernel_shape=[k, k],
        pads=[pad] * 4,
        strides=[stride, stride],
        group=group,
        name=name,
    )
    return [conv, helper.make_node("Relu", [f"{out}.pre"], [out], name=f"{name}/relu")] if relu else [conv]


def unet_small() -> onnx.ModelProto:
    """A small UNet for a foreground mask: two encoder levels (Conv, ReLU, MaxPool), a bottleneck,
    two decoder levels (Resize x2, Concat with the skip, Conv), a 1x1 Conv and Sigmoid. Dynamic
    "height" and "width"."""
    w = _Weights(25)
    w.add("up.roi", np.array([], np.float32))
    w.add("up.scales", np.array([1, 1, 2, 2], np.float32))
    nodes = [
        *_conv(w, "image", "e1a", "enc1a", 3, 16), *_conv(w, "e1a", "e1", "enc1b", 16, 16),
        helper.make_node("MaxPool", ["e1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        *_conv(w, "p1", "e2a", "enc2a", 16, 32), *_conv(w, "e2a", "e2", "enc2b", 32, 32),
        helper.make_node("MaxPool", ["e2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2], name="pool2"),
        *_conv(w, "p2", "b", "bottleneck", 32, 64),
        helper.make_node("Resize", ["b", "up.roi", "up.scales"], ["u2"], mode="nearest", name="up2"),
        helper.make_node("Concat", ["u2", "e2"], ["c2"], axis=1, name="skip2"),
        *_conv(w, "c2", "d2", "dec2", 96, 32),
        helper.make_node("Resize", ["d2", "up.roi", "up.scales"], ["u1"], mode="linear", name="up1"),
        helper.make_node("Concat", ["u1", "e1"], ["c1"], axis=1, name="skip1"),
        *_conv(w, "c1", "d1", "dec1", 48, 16),
        *_conv(w, "d1", "mask_logits", "to_mask", 16, 1, k=1, relu=False),
        helper.make_node("Sigmoid", ["mask_logits"], ["mask"], name="sigmoid"),
    ]
    graph = helper.make_graph(nodes, "unet_small", [_vi("image", TensorProto.FLOAT, [1, 3, "height", "width"])],
                              [_vi("mask", TensorProto.FLOAT, [1, 1, "height", "width"])], w.tensors)
    return make(graph)


def control_flow_classifier(classes: int = 10) -> onnx.ModelProto:
    """An image classifier with control flow: a stem Conv, an If on the image's mean brightness
    (dark images get a gamma-like lift, bright ones pass through a ReLU), a Loop that applies
    the same residual Conv block three times (its weights read from the outer scope), global
    pooling and a Gemm."""
    w = _Weights(26)
    ch = 16
    w.he("block.w", (ch, ch, 3, 3), ch * 9)
    w.normal("block.b", (ch,), 0.05)
    w.add("zero", np.array(0.0, np.float32))
    w.add("trips", np.array(3, np.int64))
    w.add("keep_going", np.array(True))
    then_branch = helper.make_graph(
        [helper.make_node("Relu", ["stem"], ["lifted_then"], name="bright_relu")], "bright", [],
        [_vi("lifted_then", TensorProto.FLOAT, [1, ch, 32, 32])])
    else_branch = helper.make_graph(
        [helper.make_node("Sigmoid", ["stem"], ["gate"], name="dark_gate"),
         helper.make_node("Mul", ["stem", "gate"], ["lifted_else"], name="dark_lift")], "dark", [],
        [_vi("lifted_else", TensorProto.FLOAT, [1, ch, 32, 32])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
         helper.make_node("Conv", ["state_in", "block.w", "block.b"], ["conv"], pads=[1, 1, 1, 1], name="body_conv"),
         helper.make_node("Relu", ["conv"], ["act"], name="body_relu"),
         helper.make_node("Add", ["state_in", "act"], ["state_out"], name="body_residual")],
        "refine", [_vi("iteration", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []),
                   _vi("state_in", TensorProto.FLOAT, [1, ch, 32, 32])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("state_out", TensorProto.FLOAT, [1, ch, 32, 32])])
    nodes = [
        *_conv(w, "image", "stem", "stem", 3, ch, relu=False),
        helper.make_node("ReduceMean", ["image"], ["brightness"], keepdims=0, name="brightness"),
        helper.make_node("Greater", ["brightness", "zero"], ["is_bright"], name="is_bright"),
        helper.make_node(
            "If", ["is_bright"], ["lifted"], then_branch=then_branch, else_branch=else_branch, name="lift"
        ),
        helper.make_node("Loop", ["trips", "keep_going", "lifted"], ["refined"], body=body, name="refine"),
        helper.make_node("GlobalAveragePool", ["refined"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node(
            "Gemm",
            ["flat", w.he("fc.w", (classes, ch), ch), w.add("fc.b", np.zeros(classes))],
            ["logits"],
            transB=1,
            name="fc",
        ),
    ]
    graph = helper.make_graph(nodes, "control_flow_classifier", [_vi("image", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [_vi("logits", TensorProto.FLOAT, [1, classes])], w.tensors)
    return make(graph)


REC_USERS, REC_ITEMS, CANDIDATES = 20000, 50000, 50


def recommender(folder: Path) -> Path:
    """A two-tower recommender scoring 50 candidate items for one user: user and item embedding
    tables (20,000 and 50,000 x 32, 8.9 MB) in an external data file, Gather lookups, a context
    MLP, a dot product per item plus an item bias, and Sigmoid (click probability). Written to
    ``folder`` as recommender.onnx + recommender.onnx.data; returns the model's path."""
    w = _Weights(27)
    dim = 32
    w.normal("user_table", (REC_USERS, dim), 0.3)
    w.normal("item_table", (REC_ITEMS, dim), 0.3)
    w.normal("item_bias", (REC_ITEMS,), 0.5)
    nodes = [
        helper.make_node("Gather", ["user_table", "user_id"], ["user"], name="user_lookup"),
        helper.make_node("MatMul", ["context", w.uniform("context.w", (8, dim), 8)], ["ctx"], name="context_proj"),
        helper.make_node("Add", ["user", "ctx"], ["user_ctx"], name="user_context"),
        helper.make_node("MatMul", ["user_ctx", w.he("user_tower.w", (dim, dim), dim)], ["ut_mm"], name="user_tower"),
        helper.make_node("Relu", ["ut_mm"], ["user_vec"], name="user_relu"),
        helper.make_node(
            "Reshape", ["user_vec", w.add("col_shape", np.array([1, dim, 1], np.int64))], ["user_col"], name="user_col"
        ),
        helper.make_node("Gather", ["item_table", "item_ids"], ["items"], name="item_lookup"),
        helper.make_node("MatMul", ["items", w.he("item_tower.w", (dim, dim), dim)], ["it_mm"], name="item_tower"),
        helper.make_node("Relu", ["it_mm"], ["item_vecs"], name="item_relu"),
        helper.make_node("MatMul", ["item_vecs", "user_col"], ["dots"], name="dot"),
        helper.make_node(
            "Reshape", ["dots", w.add("row_shape", np.array([1, CANDIDATES], np.int64))], ["dot_rows"], name="dot_rows"
        ),
        helper.make_node("Gather", ["item_bias", "item_ids"], ["biases"], name="bias_lookup"),
        helper.make_node("Add", ["dot_rows", "biases"], ["logits"], name="add_bias"),
        helper.make_node("Sigmoid", ["logits"], ["scores"], name="click_probability"),
    ]
    graph = helper.make_graph(
        nodes,
        "recommender",
        [
            _vi("user_id", TensorProto.INT64, [1]),
            _vi("item_ids", TensorProto.INT64, [1, CANDIDATES]),
            _vi("context", TensorProto.FLOAT, [1, 8]),
        ],
        [_vi("scores", TensorProto.FLOAT, [1, CANDIDATES])],
        w.tensors,
    )
    model = make(graph)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "recommender.onnx"
    (folder / "recommender.onnx.data").unlink(missing_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="recommender.onnx.data", size_threshold=1024)
    onnx.checker.check_model(str(path), full_check=True)
    return path


def convnext_tiny(classes: int = 10, dim: int = 32, blocks: int = 2) -> onnx.ModelProto:
    """A ConvNeXt-like classifier: a 4x4 stride-4 patchify stem, channels-last LayerNormalization,
    `blocks` ConvNeXt blocks (depthwise 7x7 Conv, LayerNorm, pointwise MatMul x4, GELU via Erf,
    MatMul back, layer scale, residual), global pooling, LayerNorm and a linear head. Static
    1x3x64x64."""
    w = _Weights(28)
    nodes = [
        *_conv(w, "image", "stem", "stem", 3, dim, k=4, stride=4, relu=False, pad=0),  # patchify: no padding
        helper.make_node("Transpose", ["stem"], ["stem.nhwc"], perm=[0, 2, 3, 1], name="stem/to_nhwc"),
        *_layer_norm(w, "stem.nhwc", "stem.norm", "stem/norm", dim, written_out=False),
        helper.make_node("Transpose", ["stem.norm"], ["x0"], perm=[0, 3, 1, 2], name="stem/to_nchw"),
    ]
    stream = "x0"
    for i in range(blocks):
        p = f"block{i}"
        nodes += [
            helper.make_node(
                "Conv",
                [stream, w.he(f"{p}.dw.w", (dim, 1, 7, 7), 49), w.normal(f"{p}.dw.b", (dim,), 0.05)],
                [f"{p}.dw"],
                kernel_shape=[7, 7],
                pads=[3, 3, 3, 3],
                group=dim,
                name=f"{p}/dwconv",
            ),
            helper.make_node("Transpose", [f"{p}.dw"], [f"{p}.nhwc"], perm=[0, 2, 3, 1], name=f"{p}/to_nhwc"),
            *_layer_norm(w, f"{p}.nhwc", f"{p}.n", f"{p}/norm", dim, written_out=False),
            helper.make_node(
                "MatMul", [f"{p}.n", w.uniform(f"{p}.pw1.w", (dim, 4 * dim), dim)], [f"{p}.pw1m"], name=f"{p}/pwconv1"
            ),
            helper.make_node(
                "Add", [f"{p}.pw1m", w.uniform(f"{p}.pw1.b", (4 * dim,), dim)], [f"{p}.pw1"], name=f"{p}/pwconv1_bias"
            ),
            *_gelu_erf(f"{p}.pw1", f"{p}.g", f"{p}/gelu", w),
            helper.make_node(
                "MatMul",
                [f"{p}.g", w.uniform(f"{p}.pw2.w", (4 * dim, dim), 4 * dim)],
                [f"{p}.pw2m"],
                name=f"{p}/pwconv2",
            ),
            helper.make_node(
                "Add", [f"{p}.pw2m", w.uniform(f"{p}.pw2.b", (dim,), 4 * dim)], [f"{p}.pw2"], name=f"{p}/pwconv2_bias"
            ),
            helper.make_node(
                "Mul",
                [f"{p}.pw2", w.add(f"{p}.gamma", np.full(dim, 0.5, np.float32))],
                [f"{p}.ls"],
                name=f"{p}/layer_scale",
            ),
            helper.make_node("Transpose", [f"{p}.ls"], [f"{p}.nchw"], perm=[0, 3, 1, 2], name=f"{p}/to_nchw"),
            helper.make_node("Add", [stream, f"{p}.nchw"], [f"{p}.out"], name=f"{p}/residual"),
        ]
        stream = f"{p}.out"
    nodes += [
        helper.make_node("GlobalAveragePool", [stream], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        *_layer_norm(w, "flat", "head.n", "head/norm", dim, written_out=False),
        helper.make_node(
            "Gemm",
            ["head.n", w.uniform("head.w", (classes, dim), dim), w.add("head.b", np.zeros(classes))],
            ["logits"],
            transB=1,
            name="head",
        ),
    ]
    graph = helper.make_graph(nodes, "convnext_tiny", [_vi("image", TensorProto.FLOAT, [1, 3, 64, 64])],
                              [_vi("logits", TensorProto.FLOAT, [1, classes])], w.tensors)
    return make(graph)


def wakeword_pipeline(models: Path, folder: Path) -> Path:
    """openWakeWord's front end and speech embedding as one model, as a deployment that hands the
    NPU a single file would ship them: raw audio [1, 12640] (int16 scale) -> the mel model ->
    x / 10 + 2 (what openWakeWord applies between them) -> [1, 76, 32, 1] -> the embedding
    [1, 1, 1, 96]. Both from the openwakeword 0.4.0 wheel (``models``: bench_corpus.fetch's
    folder); the glue is onnx.compose's. Written to ``folder``; returns its path."""
    from onnx import compose

    mel = onnx.load(str(models / "wakeword_mel.onnx"))
    embedding = onnx.load(str(models / "wakeword_embedding.onnx"))
    scale = helper.make_graph(
        [helper.make_node("Mul", ["mel", "tenth"], ["scaled"], name="mel_tenth"),
         helper.make_node("Add", ["scaled", "two"], ["shifted"], name="mel_plus_two"),
         helper.make_node("Reshape", ["shifted", "frames_shape"], ["frames"], name="mel_frames")],
        "mel_to_embedding",
        [_vi("mel", TensorProto.FLOAT, [1, 1, 76, 32])],
        [_vi("frames", TensorProto.FLOAT, [1, 76, 32, 1])],
        [numpy_helper.from_array(np.array(0.1, np.float32), "tenth"),
         numpy_helper.from_array(np.array(2.0, np.float32), "two"),
         numpy_helper.from_array(np.array([1, 76, 32, 1], np.int64), "frames_shape")],
    )
    glue = helper.make_model(scale, opset_imports=[helper.make_opsetid("", 13)], ir_version=mel.ir_version)
    front = compose.merge_models(mel, glue, io_map=[("output", "mel")], prefix2="glue/")
    whole = compose.merge_models(front, embedding, io_map=[("glue/frames", "input_1")], prefix2="embedding/")
    whole.graph.name = "wakeword_pipeline"
    path = folder / "wakeword_pipeline.onnx"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.checker.check_model(whole, full_check=True)
    onnx.save_model(whole, str(path))
    return path
