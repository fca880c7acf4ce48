"""bench/link_use.py: link use of a real run, read from its records."""

from __future__ import annotations

import importlib.util
import math
import os
from typing import Any

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "bench", "link_use.py")
_spec = importlib.util.spec_from_file_location("link_use", _PATH)
assert _spec is not None and _spec.loader is not None
link_use = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(link_use)


def test_covered_time_is_the_union_of_the_spans() -> None:
    assert link_use.covered_s([]) == 0.0
    assert link_use.covered_s([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == pytest.approx(3.0)
    assert link_use.covered_s([(3.0, 4.0), (0.0, 5.0)]) == pytest.approx(5.0)


def _span(stream: str, start: float, end: float, nbytes: int, flow: int) -> list[Any]:
    return ["dev", stream, stream, "x", start, end, 1, 0, -1, nbytes, flow]


def test_bytes_and_shares_count_other_hosts_in_the_measured_window_only() -> None:
    # ranks 0 and 2 on host a, rank 1 on host b; warm-up 1, one measured iteration
    world = 3
    flow_1_to_0 = (1 * world + 0) << 32
    flow_2_to_0 = (2 * world + 0) << 32
    records = {
        "job": {"warmup_iterations": 1, "iterations": 1},
        "ranks": [
            {
                "rank": 0,
                "host": "a",
                "iteration_end": {"0": 1.0, "1": 3.0},
                "sent": [[1, 1, 400_000, "push"], [2, 1, 999, "push"], [1, 0, 7, "push"]],
                "spans": [
                    _span("send", 1.0, 1.5, 400_000, -1),
                    _span("recv", 2.0, 2.5, 200_000, flow_1_to_0),
                    _span("recv", 2.2, 2.4, 200_000, flow_2_to_0),  # same host: not inbound
                    _span("recv", 0.1, 0.9, 200_000, flow_1_to_0),  # warm-up
                ],
            },
            {"rank": 1, "host": "b", "sent": [[0, 1, 200_000, "value"]], "spans": []},
            {"rank": 2, "host": "a", "sent": [], "spans": []},
        ],
    }
    use = link_use.link_use(records)
    a, b = use["a"], use["b"]
    assert a["out_bytes_per_s"] == pytest.approx(400_000 / 2.0)
    assert a["in_bytes_per_s"] == pytest.approx(200_000 / 2.0)
    assert b["in_bytes_per_s"] == pytest.approx(400_000 / 2.0)
    assert a["inbound"] == pytest.approx(0.5 / 2.0)
    assert a["senders"] == pytest.approx(0.5 / 2.0)
    assert a["arrival_s"] == pytest.approx(0.5)
    assert a["arrival_bytes_per_s"] == pytest.approx(400_000.0)
    assert math.isnan(b["inbound"]) and math.isnan(b["arrival_s"])
