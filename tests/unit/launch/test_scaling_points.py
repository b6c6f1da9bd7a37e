"""The spec at one count of `gpuctl scaling`: a fixed shape, never an elastic one."""

from __future__ import annotations

from launch.gpuctl.scaling import point_spec
from launch.spec import parse_spec


def test_a_point_of_an_elastic_spec_has_a_fixed_shape_and_no_restarts() -> None:
    spec = parse_spec(
        {
            "name": "ddp",
            "script": "train.py",
            "nodes": ["a:1", "b:1", "c:1"],
            "elastic": {"min_nodes": 2},
            "restart": {"max_attempts": 3},
        }
    )
    point = point_spec(spec, ["a:1", "b:1"], procs=2, max_steps=40)
    assert point.elastic is None and point.restart.max_attempts == 0
    assert point.nodes == ["a:1", "b:1"] and point.nproc_per_node == 2
    assert point.training.max_steps == 40
