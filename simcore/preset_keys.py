"""Every key of a topology preset's machine sections, declared once: kind, unit, limits,
source.

A preset's ``box`` section lays out a server's devices and links; its machine sections
say what the devices are and how fast and costly they are: ``gpu`` (a rank's compute
device), ``host`` (the machines' CPUs), ``gloo`` (the collective library), ``network``
(the links between boxes) and ``network.nic_link`` (a NIC's link into its box). They are
what ``sim calibrate`` measures. Each key is a :class:`PresetKey` of :data:`KEYS` named as
the field of the spec it fills (:class:`simcore.topology.GpuSpec`,
:class:`~simcore.topology.HostSpec`, :class:`~simcore.topology.GlooSpec`,
:class:`~simcore.topology.NetworkSpec`, :class:`~simcore.topology.NicLinkSpec`), its unit
in its name (``socket_buffer_bytes``, ``latency_s``). Files written before the keys were
named so use older names for some (``socket_buffer``, ``peak_flops``, ``latency``...):
those are read as the key's aliases.

:func:`section_values` converts a section's values with
:func:`simcore.settings.convert_value`, the converter of every run setting, so a bad
value in a preset file gets the message a bad flag gets: the key as written, the value,
what is allowed. :func:`canonical` renames a preset's aliases to the field names, values
untouched, as everything that writes a preset does. ``realrun.calibrated.KNOBS`` (the
keys whose value a calibration measures, fits or takes from a run) and the table in
docs/prediction.md come from :data:`KEYS`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simcore.settings import ConfigError, convert_value

__all__ = [
    "KEYS",
    "LINK_KINDS",
    "LINK_SHARING",
    "SECTIONS",
    "SOURCES",
    "PresetKey",
    "canonical",
    "canonical_path",
    "keys_of",
    "raw_value",
    "section_values",
    "written",
]

LINK_KINDS = ("pcie", "nvlink", "nvswitch", "qpi", "ib", "ethernet")
"""Link kinds a topology may use (``comm_bytes_by_link_kind`` is keyed by these)."""

LINK_SHARING = ("fifo", "fair")
"""How a link direction shares itself among messages queued on it (``network.sharing`` in
a preset): ``fifo``, each message after every byte queued before it; ``fair``, flows (a
source and a destination device) take turns, as TCP connections through one bottleneck
do (see :mod:`simcore.network`)."""

SECTIONS = ("gpu", "host", "gloo", "network", "network.nic_link")
"""The machine sections, by path (``network.nic_link`` is a mapping inside ``network``)."""

SOURCES = ("calibration", "fit-by-simulation", "profile", "constant", "run")
"""Where a key's value comes from in a calibrated file (:attr:`PresetKey.source`)."""


@dataclass(frozen=True)
class PresetKey:
    """One key of a machine section.

    Attributes:
        section: the section's path (one of :data:`SECTIONS`).
        name: the key, the field of the section's spec it fills.
        kind: the kind of value (:data:`simcore.settings.KINDS`; ``section`` for a
            mapping of further keys, :data:`SECTIONS`' ``network.nic_link``).
        unit: what its number means, for people (``s``, ``bytes/s``, ``FLOP/s``).
        what: one line on what it stands for.
        source: where a calibrated file's value comes from: ``calibration:<benchmark>``
            (measured by that microbenchmark of ``sim calibrate``),
            ``fit-by-simulation:<benchmark>`` (the value whose simulation of that
            benchmark matches the measurement), ``profile`` (measured with the model's
            profile, beside the trace), ``constant`` (a property of the software or the
            machine, not measured), or ``run`` (taken from a real run of the case
            itself: the replay's alone, never a prediction's). ``None`` for a key that
            says what a device is rather than how fast (``gpu.model``).
        aliases: older names of the key, read as it.
        choices, minimum, maximum, below, positive, auto, auto_zero: the limits, as
            :func:`simcore.settings.setting` takes them.
    """

    section: str
    name: str
    kind: str
    unit: str
    what: str
    source: str | None = None
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    below: float | None = None
    positive: bool = False
    auto: str | None = None
    auto_zero: bool = False

    @property
    def path(self) -> str:
        """``section.name``."""
        return f"{self.section}.{self.name}"

    @property
    def limits(self) -> str:
        """What values the key allows, in words: ``>= 0``, ``> 0, <= 1``, ``fifo, fair``
        (empty where any value of its kind is)."""
        if self.choices is not None:
            return ", ".join(self.choices)
        out = []
        if self.positive or self.kind == "rate":
            out.append("> 0")
        elif self.minimum is not None:
            out.append(f">= {self.minimum:g}")
        elif self.kind in ("seconds", "bytes"):
            out.append(">= 0")
        if self.maximum is not None:
            out.append(f"<= {self.maximum:g}")
        if self.below is not None:
            out.append(f"< {self.below:g}")
        auto = f" (0: {self.auto})" if self.auto is not None else ""
        return ", ".join(out) + auto

    def convert(self, value: Any, where: str | None = None) -> Any:
        """``value`` (typed, or text as written in a file) as this key's typed value;
        :class:`~simcore.settings.ConfigError` naming ``where`` (default: the path), the
        value and what is allowed when it does not fit. A ``section`` key's value is the
        mapping of its own keys' values (:func:`section_values`)."""
        where = where or self.path
        if self.kind == "section":
            return section_values(self.path, value, where)
        return convert_value(value, where, self.kind, vars(self))  # its limits by name


_UNSHAPED = "calibration:unshaped ping-pong"
_MESSENGER = "calibration:messenger ping-pong"
_MESSENGER_BUSY = "calibration:messenger ping-pong beside compute"
_SHAPED = "calibration:shaped ping-pong"
_ISEND = "calibration:isend beside compute"
_FLOWS = "calibration:concurrent flows"
_LINK_CPU = "calibration:link cpu"

KEYS: tuple[PresetKey, ...] = (
    # ---- gpu: a rank's compute device (simcore.topology.GpuSpec)
    PresetKey("gpu", "model", "str", "name", "the device's model, matched against a trace's"),
    PresetKey(
        "gpu", "kind", "str", "gpu or cpu",
        "a GPU, or the cores of a CPU host (the ranks' devices are cpu<i>)",
        choices=("gpu", "cpu"),
    ),
    PresetKey(
        "gpu", "memory_bytes", "bytes", "bytes", "the machine's memory (/proc/meminfo)",
        "constant", ("memory",), positive=True,
    ),
    PresetKey(
        "gpu", "memory_bandwidth_bytes_per_s", "rate", "bytes/s", "one thread's copy rate",
        "calibration:copy", ("memory_bandwidth",),
    ),
    PresetKey(
        "gpu", "peak_flop_per_s", "float", "FLOP/s", "one thread's float32 matmul rate",
        "calibration:matmul", ("peak_flops",), positive=True,
    ),
    PresetKey(
        "gpu", "step_overhead_s", "seconds", "s", "an optimizer step's fixed cost",
        "profile", ("step_overhead",),
    ),
    PresetKey(
        "gpu", "predict_overhead_s", "seconds", "s",
        "SpecTrain's fixed cost of a weight prediction", "run", ("predict_overhead",),
    ),
    # ---- host: the machines' CPUs (simcore.topology.HostSpec)
    PresetKey(
        "host", "cores", "int", "cores", "the machine's cores the ranks share", "constant",
        minimum=1,
    ),
    PresetKey(
        "host", "shared", "bool", "flag", "every emulated host on the same cores", "constant"
    ),
    PresetKey("host", "message_cpu_s", "seconds", "s", "CPU per message", _UNSHAPED),
    PresetKey(
        "host", "copy_cpu_s_per_byte", "float", "s/byte", "CPU per byte sent or received",
        _UNSHAPED, minimum=0,
    ),
    PresetKey(
        "host", "reduce_cpu_s_per_byte", "float", "s/byte",
        "CPU per byte summed by a collective", "calibration:reduce", minimum=0,
    ),
    PresetKey(
        "host", "p2p_handshake_s", "seconds", "s", "a point-to-point message's handshake",
        _MESSENGER,
    ),
    PresetKey(
        "host", "socket_buffer_bytes", "bytes", "bytes",
        "what a blocking send hands the kernel before it returns", _SHAPED,
        ("socket_buffer",),
    ),
    PresetKey(
        "host", "p2p_message_cpu_s", "seconds", "s",
        "the messenger threads' CPU per message (the replay takes it from the run)",
        _MESSENGER,
    ),
    PresetKey(
        "host", "p2p_copy_cpu_s_per_byte", "float", "s/byte",
        "the messenger threads' CPU per byte", _MESSENGER, minimum=0,
    ),
    PresetKey(
        "host", "p2p_message_busy_cpu_s", "seconds", "s",
        "the same at an end whose cores all compute", _MESSENGER_BUSY,
    ),
    PresetKey(
        "host", "isend_s", "seconds", "s", "the sending thread's hold per isend", _ISEND,
    ),
    PresetKey(
        "host", "posted_cpu_s", "seconds", "s",
        "a pipeline's transport threads' CPU per message end", _ISEND,
    ),
    PresetKey(
        "host", "wakeup_s", "seconds", "s",
        "a woken thread's wait for a core while every core computes",
        "fit-by-simulation:busy cores",
    ),
    PresetKey(
        "host", "balance_s", "seconds", "s",
        "how soon an idle core takes over a thread queued on a busier one",
        "fit-by-simulation:scheduler",
    ),
    PresetKey(
        "host", "link_cpu_s_per_byte", "float", "s/byte",
        "a shaped link's packet work per byte and end, one pair busy", _LINK_CPU, minimum=0,
    ),
    PresetKey(
        "host", "link_cpu_two_pairs_s_per_byte", "float", "s/byte",
        "the same with two pairs busy", _LINK_CPU, minimum=0,
    ),
    # ---- gloo: the collective library (simcore.topology.GlooSpec)
    PresetKey(
        "gloo", "segment_bytes", "bytes", "bytes", "gloo's all-reduce segment (1 MiB)",
        "constant", positive=True,
    ),
    PresetKey(
        "gloo", "threads", "int", "threads", "ProcessGroupGloo's worker threads (2)",
        "constant", minimum=1,
    ),
    # ---- network: the links between boxes (simcore.topology.NetworkSpec)
    PresetKey(
        "network", "kind", "str", "link kind", "the links' kind (ib, ethernet...)",
        choices=LINK_KINDS,
    ),
    PresetKey(
        "network", "bandwidth_bytes_per_s", "rate", "bytes/s", "the links' goodput", _SHAPED,
        ("bandwidth",),
    ),
    PresetKey(
        "network", "latency_s", "seconds", "s", "one link's latency", _SHAPED, ("latency",)
    ),
    PresetKey(
        "network", "burst_bytes", "bytes", "bytes", "tbf's bucket as sim real shapes it",
        "constant", ("burst",),
    ),
    PresetKey(
        "network", "peak_bandwidth_bytes_per_s", "rate", "bytes/s",
        "the rate a full bucket's bytes leave at", _UNSHAPED, ("peak_bandwidth",),
        auto="no limit", auto_zero=True,
    ),
    PresetKey(
        "network", "sharing", "str", "policy", "TCP connections take turns on a link",
        "constant", choices=LINK_SHARING,
    ),
    PresetKey(
        "network", "lead_s", "seconds", "s",
        "how long a sending connection keeps a link before a newcomer shares it",
        "fit-by-simulation:two flows", ("lead",),
    ),
    PresetKey(
        "network", "flow_share", "float", "share",
        "a flow's mean goodput while every host sends, over a lone flow's", _FLOWS,
        positive=True, maximum=1,
    ),
    PresetKey(
        "network", "flow_spread", "float", "CV",
        "how far apart concurrent flows' goodputs are (coefficient of variation)", _FLOWS,
        minimum=0, below=1,
    ),
    PresetKey(
        "network", "nic_link", "section", "keys", "a NIC's link into its box (kind, rate, latency)"
    ),
    # ---- network.nic_link: a NIC's link into its box (simcore.topology.NicLinkSpec)
    PresetKey(
        "network.nic_link", "kind", "str", "link kind", "the NIC link's kind",
        choices=LINK_KINDS,
    ),
    PresetKey(
        "network.nic_link", "bandwidth_bytes_per_s", "rate", "bytes/s", "the NIC link's rate",
        aliases=("bandwidth",),
    ),
    PresetKey(
        "network.nic_link", "latency_s", "seconds", "s", "the NIC link's latency",
        aliases=("latency",),
    ),
)  # fmt: skip
"""Every key of the machine sections, in the order a calibration writes them."""

_BY_SECTION: dict[str, dict[str, PresetKey]] = {s: {} for s in SECTIONS}
for _key in KEYS:
    for _spelling in (_key.name, *_key.aliases):
        _BY_SECTION[_key.section][_spelling] = _key
del _key, _spelling


def keys_of(section: str) -> tuple[PresetKey, ...]:
    """The keys of ``section`` (one of :data:`SECTIONS`), in declaration order."""
    return tuple(k for k in KEYS if k.section == section)


def section_values(
    section: str, values: Mapping[str, Any] | None, where: str | None = None
) -> dict[str, Any]:
    """The typed values of the keys a machine section sets, by field name (aliases read as
    their keys; ``None``: none set). :class:`~simcore.settings.ConfigError` for a value
    that is not a mapping, an unknown key (listing the known ones), a key set twice (by
    its name and an alias) or a bad value, each named as written (``host.socket_buffer``)
    under ``where`` (default: the section's path)."""
    where = where or section
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ConfigError(where, values, f"expected a mapping of {section} keys")
    known = _BY_SECTION[section]
    out: dict[str, Any] = {}
    written_as: dict[str, str] = {}
    for written, value in values.items():
        key = known.get(str(written))
        at = f"{where}.{written}"
        if key is None:
            names = ", ".join(k.name for k in keys_of(section))
            raise ConfigError(at, value, f"known: {names}", unknown=True)
        if key.name in out:
            raise ConfigError(
                at, value, f"{where}.{written_as[key.name]} is the same key; give it once"
            )
        written_as[key.name] = str(written)
        out[key.name] = key.convert(value, at)
    return out


def raw_value(values: Any, section: str, name: str, default: Any = None) -> Any:
    """The value a machine section gives key ``name`` under its name or an alias, as
    written (``default`` when it gives none, or ``values`` is not a mapping)."""
    if not isinstance(values, Mapping):
        return default
    for spelling in (name, *_BY_SECTION[section][name].aliases):
        if spelling in values:
            return values[spelling]
    return default


def _canonical_section(section: str, values: Mapping[str, Any]) -> dict[str, Any]:
    known = _BY_SECTION[section]
    out: dict[str, Any] = {}
    for written, value in values.items():
        key = known.get(str(written))
        name = key.name if key is not None else str(written)
        if name in out:
            raise ConfigError(
                f"{section}.{written}", value, f"{section}.{name} is the same key; give it once"
            )
        if key is not None and key.kind == "section" and isinstance(value, Mapping):
            value = _canonical_section(key.path, value)
        out[name] = value
    return out


def canonical_path(path: str) -> str:
    """A key's path (``gpu.peak_flops``) under its field name (``gpu.peak_flop_per_s``);
    any other path as it is."""
    section, _, name = path.rpartition(".")
    key = _BY_SECTION.get(section, {}).get(name)
    return key.path if key is not None else path


def canonical(preset: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``preset`` whose machine sections name every key by its field name
    (aliases renamed in place, values untouched), as do the paths of
    ``measured.sources``; keys that are not declared are kept for the parser to name.
    :class:`~simcore.settings.ConfigError` where a section gives a key twice."""
    out = dict(preset)
    for section in SECTIONS:
        if "." not in section and isinstance(out.get(section), Mapping):
            out[section] = _canonical_section(section, out[section])
    measured = out.get("measured")
    if isinstance(measured, Mapping) and isinstance(measured.get("sources"), Mapping):
        sources = {canonical_path(str(p)): s for p, s in measured["sources"].items()}
        out["measured"] = {**measured, "sources": sources}
    return out


def written(preset: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``preset`` laid out as a preset writer writes it: each machine section's
    keys by field name in the order of :data:`KEYS`, every value checked by its key, the
    other sections as they are. :class:`~simcore.settings.ConfigError` for a key that is
    not declared, one under an older name (a writer writes the field names:
    :func:`canonical` renames them) or a value its key refuses."""
    out = dict(preset)
    for section in SECTIONS:
        if "." not in section and out.get(section) is not None:
            out[section] = _written_section(section, out[section])
    return out


def _written_section(section: str, values: Mapping[str, Any]) -> dict[str, Any]:
    section_values(section, values)  # every value checked, an unknown key named
    keys = keys_of(section)
    names = {k.name for k in keys}
    for name, value in values.items():
        if name not in names:
            field_name = _BY_SECTION[section][str(name)].name
            raise ConfigError(
                f"{section}.{name}", value, f"a writer names it {section}.{field_name}"
            )
    out: dict[str, Any] = {}
    for key in keys:
        if key.name in values:
            value = values[key.name]
            nested = key.kind == "section" and isinstance(value, Mapping)
            out[key.name] = _written_section(key.path, value) if nested else value
    return out
