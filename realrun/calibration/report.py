"""The short human summary of a calibration that ``sim calibrate`` prints
(:func:`describe`): goodput, latency, the CPU costs and what each fit by simulation
found, one ``(label, text)`` row each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simcore.preset_keys import canonical
from simcore.units import format_bytes, format_rate, parse_rate, parse_size

__all__ = ["describe"]


def _two_pairs_text(fits: Mapping[str, Any], row: Mapping[str, Any]) -> str:
    """The link CPU line's tail for two pairs busy at once (empty without them)."""
    if "link_cpu_two_pairs_s_per_byte" not in fits:
        return ""
    two = row["two_pairs"]
    return (
        f"; two pairs at once {fits['link_cpu_two_pairs_s_per_byte'] * 1e9:.3g} ns "
        f"({two['lost_cores']:.2f} cores lost, {two['ranks_cores']:.2f} the ranks')"
    )


def describe(preset: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The short human summary of a calibration, as (label, text) rows."""
    preset = canonical(preset)
    m = preset["measured"]
    fits = m["fits"]
    h = preset["host"]
    goodput = fits["goodput_bytes_per_s"]
    rows = []
    if m["tbf_rate"]:
        rows.append(
            (
                "goodput",
                f"{format_rate(goodput)}  ({fits['goodput_share_of_tbf_rate']:.1%} of the "
                f"{format_rate(parse_rate(m['tbf_rate']))} tbf rate)",
            )
        )
    else:
        rows.append(("goodput", f"{format_rate(goodput)}  (unshaped)"))
    rows += [
        (
            "latency",
            f"{fits['latency_s'] * 1e6:.3g} us  (one way; fit residual max "
            f"{fits['residual_rel_max']:.0%}, median {fits['residual_rel_median']:.0%})",
        ),
        (
            "CPU per message",
            f"{h['message_cpu_s'] * 1e6:.3g} us per side  (fit residual max "
            f"{fits['cpu_residual_rel_max']:.0%})",
        ),
        (
            "CPU per byte sent",
            f"{h['copy_cpu_s_per_byte'] * 1e9:.3g} ns per side  "
            f"(~{format_rate(1 / h['copy_cpu_s_per_byte']) if h['copy_cpu_s_per_byte'] else 'inf'} "
            "per core)",
        ),
        (
            "CPU per byte reduced",
            f"{h['reduce_cpu_s_per_byte'] * 1e9:.3g} ns  (float32 add_, one thread)",
        ),
        (
            "messenger handshake",
            f"{h.get('p2p_handshake_s', 0.0) * 1e6:.3g} us per point-to-point message "
            "beyond the wire's time, "
            f"{h.get('p2p_message_cpu_s', 0.0) * 1e6:.3g} us CPU per message and end "
            f"and {h.get('p2p_copy_cpu_s_per_byte', 0.0) * 1e9:.3g} ns per byte beyond a "
            "plain send's; "
            f"{h.get('p2p_message_busy_cpu_s', 0.0) * 1e6:.3g} us per message beside "
            "computing threads",
        ),
        (
            "isend beside compute",
            f"{h.get('isend_s', 0.0) * 1e6:.3g} us holding the sending thread beyond the "
            f"message's CPU, {h.get('posted_cpu_s', 0.0) * 1e6:.3g} us of the transport's "
            "threads per message end (a pipeline's messages)",
        ),
        *(
            [
                (
                    "link sharing",
                    f"a connection already sending keeps the link "
                    f"{fits['sharing_lead_s'] * 1e3:.3g} ms before a new one shares it "
                    f"(two-flow benchmark, residual max {fits['sharing_residual_rel_max']:.0%})",
                )
            ]
            if "sharing_lead_s" in fits
            else []
        ),
        *(
            [
                (
                    "link CPU",
                    f"{fits['link_cpu_s_per_byte'] * 1e9:.3g} ns per byte held to the rate, "
                    f"per side, taken from computing threads (link CPU benchmark: "
                    f"{m['link_cpu']['lost_cores']:.2f} cores lost, "
                    f"{m['link_cpu']['ranks_cores']:.2f} of them the ranks')"
                    + _two_pairs_text(fits, m["link_cpu"]),
                )
            ]
            if "link_cpu_s_per_byte" in fits
            else []
        ),
        *(
            [
                (
                    "concurrent flows",
                    f"with {m['flows'][0]['hosts']} hosts sending at once a flow gets "
                    f"{fits['flow_share']:.1%} of a lone flow's goodput on average, "
                    f"{fits['flow_spread']:.1%} apart (coefficient of variation); at "
                    + ", ".join(
                        f"{format_rate(e['rate_bytes_per_s'])} {e['share']:.1%} / {e['spread']:.1%}"
                        for e in m["flows"]
                    ),
                )
            ]
            if "flow_share" in fits
            else []
        ),
        *(
            [
                (
                    "scheduler",
                    f"a core left idle takes over a thread queued on a busier one after "
                    f"{fits['balance_s'] * 1e3:.3g} ms (scheduler benchmark, residual max "
                    f"{fits['balance_residual_rel_max']:.0%})",
                )
            ]
            if "balance_s" in fits
            else []
        ),
        *(
            [
                (
                    "wake-up",
                    f"a thread a message wakes waits {fits['wakeup_s'] * 1e3:.3g} ms per "
                    f"computing thread per core while compute takes every core (busy-cores "
                    f"benchmark, "
                    f"residual max {fits['wakeup_residual_s_max'] * 1e3:.2g} ms)",
                )
            ]
            if "wakeup_s" in fits
            else []
        ),
        (
            "send buffer",
            f"{format_bytes(parse_size(h.get('socket_buffer_bytes', 0)))} a blocking send hands "
            "the kernel before it returns",
        ),
        (
            "memory / compute",
            f"{preset['gpu']['memory_bandwidth_bytes_per_s']} copy, "
            f"{preset['gpu']['peak_flop_per_s'] / 1e9:.3g} GFLOP/s matmul (one thread)",
        ),
        (
            "unshaped",
            f"{format_rate(fits['unshaped_goodput_bytes_per_s'])}, "
            f"{fits['unshaped_latency_s'] * 1e6:.3g} us latency (wall-time fit)",
        ),
        (
            "all-reduce",
            f"{len(m['allreduce'])} points over ranks "
            f"{sorted({r['ranks'] for r in m['allreduce']})}, up to "
            f"{format_bytes(max((r['bytes'] for r in m['allreduce']), default=0))}",
        ),
        ("machine", f"{m['cores']} cores, {m['cpu']}; torch {m['torch']}; {m['wall_s']:.1f} s"),
    ]
    return rows
