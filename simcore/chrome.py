"""Span records as a Chrome trace (JSON Trace Event Format, opens in Perfetto).

One process per device (``pid``), one thread per stream (``tid``): ``compute``, ``send``,
``recv``, ``comm``. Spans that overlap on one stream (several messages in flight) are
spread over extra lanes (``send #2``...) because the format needs slices on a thread to
nest. A flow arrow joins each message's send slice to its receive slice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from simcore.records import STREAMS

_US = 1e6
_LANES = 1000


def to_chrome_trace(
    spans: Iterable[Sequence[Any]],
    devices: Sequence[str] = (),
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The trace-event dictionary for ``spans`` (tuples in Span field order). ``devices``
    fixes the order of the first processes (GPUs by rank); others follow by name."""
    spans = sorted(spans, key=lambda s: (s[4], s[5]))
    pids: dict[str, int] = {d: i for i, d in enumerate(devices)}
    for s in spans:
        if s[0] not in pids:
            pids[s[0]] = len(pids)
    events: list[dict[str, Any]] = []
    for name, pid in pids.items():
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
        events.append(
            {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}
        )
    lanes: dict[tuple[str, str], list[float]] = {}
    named: set[tuple[int, int]] = set()
    flow_ends: dict[int, dict[str, Any]] = {}
    for dev, stream, kind, label, start, end, it, layer, mb, nbytes, flow in spans:
        ends = lanes.setdefault((dev, stream), [])
        lane = next((i for i, e in enumerate(ends) if e <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = end
        pid = pids[dev]
        sidx = STREAMS.index(stream) if stream in STREAMS else len(STREAMS)
        tid = sidx * _LANES + lane
        if (pid, tid) not in named:
            named.add((pid, tid))
            tname = stream if lane == 0 else f"{stream} #{lane + 1}"
            events.append(
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": tname}}
            )
            events.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        args: dict[str, Any] = {"iteration": it}
        if layer >= 0:
            args["layer"] = layer
        if mb >= 0:
            args["microbatch"] = mb
        if nbytes:
            args["bytes"] = nbytes
        ts, dur = start * _US, max(0.0, (end - start) * _US)
        events.append(
            {
                "name": label or kind,
                "cat": kind,
                "ph": "X",
                "ts": ts,
                "dur": dur,
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )
        if flow >= 0:
            if stream == "send":
                events.append(
                    {
                        "name": "message",
                        "cat": "flow",
                        "ph": "s",
                        "id": flow,
                        "ts": ts,
                        "pid": pid,
                        "tid": tid,
                    }
                )
            else:
                flow_ends[flow] = {
                    "name": "message",
                    "cat": "flow",
                    "ph": "f",
                    "bp": "e",
                    "id": flow,
                    "ts": ts + dur * 0.5,
                    "pid": pid,
                    "tid": tid,
                }
    events.extend(flow_ends.values())
    out: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if metadata:
        out["otherData"] = metadata
    return out
