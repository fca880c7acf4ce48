"""Simulated numbers of every shipped preset and calibration file, to compare two checkouts.

For each built-in topology preset (``simcore/presets/topologies``) and each calibration
file under ``docs/data/`` and ``tests/data/``, simulates a few configurations with that
preset as ``--topology`` (dp, ps, p3, gpipe, pipedream and gossip on 2-4 ranks; for a
calibrated file also at half its link rate, with the chunk ``sim validate`` uses, and the
emulated-device predictions of a few of the cases its validation registered) and writes
each one's iteration time (as ``float.hex``) and bytes moved. Run it on two checkouts
and compare the files: a change that must not move any simulated number leaves them
equal.

    python bench/preset_identity.py --out before.json
    python bench/preset_identity.py --compare before.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

CONFIGS = (
    ("dp", 2, {}),
    ("dp", 4, {}),
    ("ps", 3, {}),
    ("p3", 2, {}),
    ("gpipe", 4, {}),
    ("pipedream", 3, {}),
    ("gossip", 4, {}),
)
"""``(scheme, ranks, scheme options)`` simulated on every preset."""

PREDICTIONS_PER_FILE = 4
"""Registered emulated-device predictions re-made per calibration file under docs/data:
the first case of each scheme, this many schemes."""


def _numbers(result: Any) -> dict[str, Any]:
    return {
        "iteration_time_s": float(result.iteration_time_s).hex(),
        "comm_bytes_total": float(result.comm_bytes_total).hex(),
        "comm_bytes_by_link_kind": {
            k: float(v).hex() for k, v in sorted(dict(result.comm_bytes_by_link_kind).items())
        },
    }


def _simulate(settings: dict[str, Any]) -> dict[str, Any]:
    from analysis.resolve import build_config
    from simcore.engine import simulate
    from simcore.spec import RunSpec

    config = build_config(RunSpec().replace(**settings), record_spans=False)
    return _numbers(simulate(config))


def topologies() -> list[tuple[str, str]]:
    """``(label, --topology value)`` of every preset and calibration file."""
    from analysis.resolve import topology_presets

    out = [(name, name) for name in topology_presets()]
    for pattern in ("docs/data/*/*.yaml", "tests/data/*.yaml"):
        for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
            out.append((os.path.relpath(path, ROOT), path))
    return out


def _predictions(path: str) -> dict[str, dict[str, Any]]:
    """The emulated-device predictions of the first case of each scheme registered beside
    ``path``."""
    from analysis.emulated import predict
    from simcore.units import parse_rate

    registry = os.path.join(os.path.dirname(path), "predictions.json")
    if not os.path.exists(registry):
        return {}
    with open(registry, encoding="utf-8") as fh:
        cases = json.load(fh)["cases"]
    first: dict[str, str] = {}
    for case_id, entry in cases.items():
        first.setdefault(entry["case"]["scheme"], case_id)
    out = {}
    for case_id in list(first.values())[:PREDICTIONS_PER_FILE]:
        entry = cases[case_id]
        case = entry["case"]
        rate = parse_rate(case["bandwidth"]) if case.get("bandwidth") else None
        got = predict(
            entry["model_ref"],
            case["scheme"],
            int(case["gpus"]),
            json.loads(case.get("options") or "{}"),
            path,
            rate,
            iterations=int(case.get("iterations", 3)),
        )
        out[f"predict {case_id}"] = {
            "iteration_time_s": float(got.iteration_time_s).hex(),
            **{k: v for k, v in _numbers(got.result).items() if k != "iteration_time_s"},
        }
    return out


def collect() -> dict[str, dict[str, Any]]:
    """Every configuration's numbers, by ``preset | configuration``."""
    from analysis.resolve import load_preset
    from realrun.calibrated import calibrated_rate, is_calibrated

    out: dict[str, dict[str, Any]] = {}
    for label, topology in topologies():
        preset = load_preset(topology)
        cpu = (preset.get("gpu") or {}).get("kind") == "cpu"
        model = "resnet18-cpu" if cpu else "resnet18"
        variants: list[tuple[str, dict[str, Any]]] = [("", {})]
        if is_calibrated(preset):
            from realrun.calibration.fits import segment_bytes

            rate = calibrated_rate(preset)
            variants.append((" chunk", {"chunk_bytes": segment_bytes(preset)}))
            if rate:
                variants.append((" half-rate", {"bandwidth": rate / 2}))
        for scheme, ranks, options in CONFIGS:
            for tag, extra in variants:
                settings = {
                    "scheme": scheme,
                    "gpus": ranks,
                    "model": model,
                    "topology": topology,
                    "iterations": 2,
                    **extra,
                    **{f"scheme.{k}": v for k, v in options.items()},
                }
                out[f"{label} | {scheme} x{ranks}{tag}"] = _simulate(settings)
        if topology.startswith(os.path.join(ROOT, "docs")):
            out.update({f"{label} | {k}": v for k, v in _predictions(topology).items()})
        print(f"{label}: done", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the numbers to this JSON file")
    ap.add_argument("--compare", help="compare with the numbers in this JSON file")
    args = ap.parse_args(argv)
    got = collect()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(got, fh, indent=1, sort_keys=True)
    if not args.compare:
        return 0
    with open(args.compare, encoding="utf-8") as fh:
        want = json.load(fh)
    differ = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    for key in differ:
        print(f"differs: {key}: {want.get(key)} -> {got.get(key)}")
    print(f"{len(got)} configurations, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
