"""bench make-gguf's tensor types reproduce what the real llama-quantize chose (llama_quantize_types.json; how it was
made: make_llama_quantize_fixture.py), and its rules hold on the full-size shapes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bench.make_gguf.shapes import SHAPES, Llama3RopeScaling, ModelShape
from bench.make_gguf.tensor_types import tensor_plan, use_more_bits

FIXTURE = json.loads(Path(__file__).with_name("llama_quantize_types.json").read_text())
CASES = [(entry, ft) for entry in FIXTURE["shapes"] for ft in entry["types"]]


def fixture_shape(fields: dict) -> ModelShape:
    scaling = fields.pop("rope_scaling")
    return ModelShape(**fields, rope_scaling=None if scaling is None else Llama3RopeScaling(**scaling))


@pytest.mark.parametrize(("entry", "file_type"), CASES, ids=[f"{e['shape']['name']}-{ft}" for e, ft in CASES])
def test_types_equal_llama_quantize(entry, file_type):
    shape = fixture_shape(dict(entry["shape"]))
    expected = dict(zip(entry["tensors"], entry["types"][file_type].split(), strict=True))
    ours = {spec.name: spec.type.name for spec in tensor_plan(shape, file_type)}
    assert ours == expected


def test_fixture_covers_every_rule():
    # the comparison means something only if llama-quantize's special cases all occur in it
    seen = {
        (ft, t) for entry in FIXTURE["shapes"] for ft, types in entry["types"].items() for t in types.split()
    }
    for case in [("Q4_K_M", "Q6_K"), ("Q4_K_M", "Q5_0"), ("Q4_K_M", "Q8_0"), ("Q5_K_M", "Q5_1"), ("Q4_0", "Q6_K"),
                 ("Q4_0", "Q8_0"), ("Q6_K", "Q8_0"), ("Q4_K_M", "F32")]:  # fmt: skip
        assert case in seen, case


def test_use_more_bits_layers_of_llama_3_2_1b():
    # 16 layers: the first and last two, and every third from layer 4
    assert [i for i in range(16) if use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]


@pytest.mark.parametrize(
    ("name", "file_type", "expected"),
    [
        (
            "llama-3.2-1b",
            "Q4_K_M",
            {"Q4_K": 96, "Q6_K": 17, "F32": 34},
        ),  # tied head Q6_K; 8 layers x (v, down)
        ("llama-3.2-1b", "Q4_0", {"Q4_0": 112, "Q6_K": 1, "F32": 34}),
        ("llama-3.1-8b", "Q4_K_M", {"Q4_K": 193, "Q6_K": 33, "F32": 66}),  # untied: embedding Q4_K, head Q6_K
        (
            "qwen2.5-1.5b",
            "Q4_K_M",
            {"Q4_K": 168, "Q6_K": 29, "F32": 141},
        ),  # 14 of 28 layers more bits; biases F32
        ("llama-3.2-3b", "Q8_0", {"Q8_0": 197, "F32": 58}),
    ],
)
def test_full_size_type_counts(name, file_type, expected):
    assert Counter(spec.type.name for spec in tensor_plan(SHAPES[name], file_type)) == expected
