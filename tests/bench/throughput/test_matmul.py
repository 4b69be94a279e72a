"""bench/throughput/matmul.py: a model's linear shapes and their FLOPs per token."""

from __future__ import annotations

from bench.throughput.matmul import flops_per_token, linear_shapes
from tests.bench.helpers import SMOLLM2_135M


def test_linear_shapes_of_smollm2_give_its_flops_per_token():
    shapes = linear_shapes(SMOLLM2_135M)
    assert [(s.name, s.in_features, s.out_features, s.count) for s in shapes] == [
        ("qkv", 576, 960, 30),
        ("o", 576, 576, 30),
        ("gate_up", 576, 3072, 30),
        ("down", 1536, 576, 30),
        ("lm_head", 576, 49152, 1),
    ]
    assert flops_per_token(shapes) == 268_959_744
