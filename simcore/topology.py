"""Cluster topology: devices, full-duplex links, routing, and the builder for presets.

A :class:`Topology` is a graph of :class:`Device` nodes joined by links. Every physical
link is full duplex and becomes two :class:`Link` objects, one per direction, each with
its own bandwidth (bytes/s) and latency (s). Routing is shortest path, weighted by the
time to move :data:`ROUTE_PROBE_BYTES` (so a two-hop NVLink path beats a PCIe detour), and
cached per (source, destination).

Devices are grouped into *boxes* (servers). Traffic between two boxes leaves through the
source GPU's NIC, crosses the fabric (the switch devices with ``box == -1``) and enters
through the destination's NIC; a box never carries traffic between two other boxes, which
keeps routing cheap for thousands of GPUs.

:func:`build_topology` turns a preset (plain data, as parsed from the YAML files that ship
with dtsim) into a topology with any number of GPUs: it fills as many boxes as needed and
joins them by the preset's network (InfiniBand or Ethernet), one NIC per box by default or
one per GPU.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from simcore.preset_keys import LINK_KINDS, LINK_SHARING, section_values
from simcore.settings import ConfigError
from simcore.units import UnitError, parse_rate, parse_time

DEVICE_KINDS = ("gpu", "cpu", "nic", "pcie_switch", "nvswitch", "switch", "server")
"""Device kinds. ``server`` is a dedicated parameter-server host on the fabric."""

ROUTE_PROBE_BYTES = 1 << 20
"""Routing weight of a link is ``latency + ROUTE_PROBE_BYTES / bandwidth``."""


class TopologyError(ValueError):
    """A topology or preset is inconsistent; the message names the offending item."""


@dataclass(frozen=True)
class GpuSpec:
    """What the simulator needs to know about a rank's compute device (a GPU model, or
    a CPU on a cluster of CPU hosts).

    Attributes:
        model: short model name (``V100``, ``A100``), matched against a trace's device.
        kind: ``gpu``, or ``cpu``: the ranks compute on the cores of their machine (the
            preset's ``host`` section), their devices are named ``cpu<i>``.
        memory_bytes: device memory capacity.
        memory_bandwidth_bytes_per_s: DRAM bandwidth, used for weight-sized vector work
            (optimizer updates, SpecTrain's weight prediction).
        peak_flop_per_s: peak dense fp32 FLOP/s (for analytic traces and device
            rescaling); ``peak_flops`` in older preset files.
        step_overhead_s: fixed time of an optimizer step of a model or a pipeline stage,
            whatever its bytes (measured by ``sim validate``'s
            profiles, where a stage with no weights still takes it: the step's calls and
            the runtime's work between the last backward and the step). On CPU hosts a
            parameter server's update of one shard is such a step too (``sim
            validate`` measures it from the servers' handling of their messages).
        predict_overhead_s: fixed time of a SpecTrain weight prediction of a stage,
            whatever its bytes (measured by ``sim validate``: the
            loop over the stage's weights and the hand-over to the pass that uses them).
    """

    model: str = "V100"
    kind: str = "gpu"
    memory_bytes: int = 16 * 2**30
    memory_bandwidth_bytes_per_s: float = 900e9
    peak_flop_per_s: float = 15.7e12
    step_overhead_s: float = 0.0
    predict_overhead_s: float = 0.0


@dataclass(frozen=True)
class HostSpec:
    """The CPU side of a cluster's machines (a preset's ``host`` section).

    Attributes:
        cores: cores of one machine, shared by every rank and server on it.
        shared: every box of the cluster runs on one machine (the emulated cluster:
            network namespaces of one computer); otherwise each box has ``cores`` of its
            own.
        message_cpu_s: CPU seconds a point-to-point message costs each end (framing,
            system calls, the runtime's code), on top of its bytes.
        copy_cpu_s_per_byte: CPU seconds per byte a message costs each end (socket
            copies).
        reduce_cpu_s_per_byte: CPU seconds to add one byte of a received buffer into
            another (a collective's reduction, a parameter server's aggregation).
        p2p_handshake_s: how long a point-to-point message holds its sender before its
            bytes move (a blocking send waits for the receiver to post its buffer); 0:
            messages do not wait for each other at the sender.
        socket_buffer_bytes: how much of a message the kernel takes off a blocking send
            (TCP's send buffer): the sender moves on when what is left to go fits in it,
            not when the message has arrived; 0: it waits for the arrival.
        p2p_message_cpu_s: CPU seconds a point-to-point message handed to a sending
            thread (a parameter server's) costs each end beyond ``message_cpu_s``: the
            messenger threads' own code (headers, queues, hand-overs, callbacks).
        p2p_copy_cpu_s_per_byte: CPU seconds per byte such a message costs each end
            beyond ``copy_cpu_s_per_byte`` (the messenger's buffers and tensor handling);
            ``sim calibrate`` fits it with ``p2p_message_cpu_s`` over message sizes.
        p2p_message_busy_cpu_s: what ``p2p_message_cpu_s`` is at an end whose machine has
            every core computing when the message starts (the messenger's threads
            preempt compute and run on caches it filled); ``sim calibrate`` fits it from
            the same ping-pong beside computing main threads. 0: ``p2p_message_cpu_s``
            at any load.
        isend_s: how long handing a message to the transport holds the sending rank's
            thread beyond the message's CPU (``message_cpu``): the runtime's code around
            an ``isend`` whose bytes that thread writes itself (pipelines' and gossip's
            messages, :attr:`simcore.transport.Transport.isend_on_thread`).
            ``sim calibrate`` measures it with two ranks exchanging such messages while
            they compute; a replay of ``sim validate`` takes it from its run (the main
            threads' send spans).
        posted_cpu_s: CPU seconds each end of a message that a rank's own thread hands
            to the transport (the pipelines' and gossip's ``isend``) costs the
            transport's threads beyond ``message_cpu``: runnable on the end's cores,
            waited for by nobody (what gloo's threads spend reading and writing the
            sockets besides the calibrated copies). ``sim calibrate`` measures it in the
            same benchmark as ``isend_s``, a replay of ``sim validate`` in its pipeline
            run (its processes' CPU outside their main threads); 0: none.
        wakeup_s: how long a thread a message wakes waits for a core when every core of
            its machine computes, per computing thread per core: a time-slicing
            scheduler lets the running threads go on to the end of their slices first,
            and more of them queue longer. Charged at each end of a message that finds
            its machine's cores all computing: before its bytes leave (the sending
            thread, unless the sending rank's own thread writes them: it is running)
            and before the receiver sees it (the receiving one); 0: woken threads run
            at once, as processor sharing alone says.
        balance_s: how long a core that has run out of threads stays idle while another
            core has two or more runnable before it takes one of them over (the
            scheduler's load balancing); threads wake on an idle core if there is one,
            else on the core they last ran on. 0: the cores are one run queue shared by
            processor sharing (:class:`simcore.host.CpuPool`).
        link_cpu_s_per_byte: CPU seconds per byte, at each end, that a shaped link's
            packet work (tbf releasing what it held, the kernel's soft interrupts) takes
            from the cores, for every byte the first shaped link of a route holds to its
            rate; no thread waits for it, it only competes with the threads for the
            cores (docs/cpu_hosts.md). 0: none. Measured with one pair of hosts
            exchanging both ways: four link directions busy.
        link_cpu_two_pairs_s_per_byte: the same with two pairs exchanging at once
            (eight directions busy): the packet work does not grow in step with the
            bytes (docs/cpu_hosts.md). With five to seven directions busy the cost lies
            on the line between the two, with eight and more it is this one, with four
            and fewer ``link_cpu_s_per_byte``; 0: ``link_cpu_s_per_byte`` at any load.
    """

    cores: int = 1
    shared: bool = True
    message_cpu_s: float = 0.0
    copy_cpu_s_per_byte: float = 0.0
    reduce_cpu_s_per_byte: float = 0.0
    p2p_handshake_s: float = 0.0
    socket_buffer_bytes: int = 0
    p2p_message_cpu_s: float = 0.0
    p2p_copy_cpu_s_per_byte: float = 0.0
    p2p_message_busy_cpu_s: float = 0.0
    isend_s: float = 0.0
    posted_cpu_s: float = 0.0
    wakeup_s: float = 0.0
    balance_s: float = 0.0
    link_cpu_s_per_byte: float = 0.0
    link_cpu_two_pairs_s_per_byte: float = 0.0

    @property
    def link_cpu_by_load(self) -> bool:
        """Whether :meth:`link_cpu` depends on the busy link directions at all."""
        return 0 < self.link_cpu_two_pairs_s_per_byte != self.link_cpu_s_per_byte

    def link_cpu(self, busy_directions: int) -> float:
        """CPU seconds per byte and end of a shaped link's packet work while
        ``busy_directions`` link directions of the cluster are busy (see
        ``link_cpu_two_pairs_s_per_byte``)."""
        one, two = self.link_cpu_s_per_byte, self.link_cpu_two_pairs_s_per_byte
        if two <= 0 or busy_directions <= 4:
            return one
        if busy_directions >= 8:
            return two
        return one + (two - one) * (busy_directions - 4) / 4

    def message_cpu(self, nbytes: int, messages: int = 1) -> float:
        """CPU seconds one end spends on ``nbytes`` sent as ``messages`` messages."""
        return messages * self.message_cpu_s + nbytes * self.copy_cpu_s_per_byte

    def p2p_cpu(self, nbytes: int, busy: bool = False) -> float:
        """CPU seconds a message of ``nbytes`` through a messenger costs each end beyond
        :meth:`message_cpu`; ``busy``: at an end whose cores all compute."""
        per_message = self.p2p_message_cpu_s
        if busy and self.p2p_message_busy_cpu_s > 0:
            per_message = self.p2p_message_busy_cpu_s
        return per_message + nbytes * self.p2p_copy_cpu_s_per_byte


@dataclass(frozen=True)
class GlooSpec:
    """How the collective library behaves (a preset's ``gloo`` section).

    Attributes:
        segment_bytes: an all-reduce's ring moves its buffer in segments of at most this
            many bytes, at least two per rank and a multiple of the ranks (each segment is
            a message with its own per-message cost).
        threads: collectives that can be in flight at once (gloo runs them on a pool of
            worker threads; two in torch's process group).
    """

    segment_bytes: int = 1 << 20
    threads: int = 2

    def segments(self, nbytes: int, ranks: int) -> int:
        """Segments an all-reduce of ``nbytes`` over ``ranks`` cuts its buffer into."""
        if ranks <= 1 or nbytes <= 0:
            return 1
        by_size = -(-nbytes // self.segment_bytes)
        n = max(2 * ranks, by_size)
        return -(-n // ranks) * ranks


@dataclass(frozen=True)
class NicLinkSpec:
    """The link between a NIC and the device it hangs off in its box (a preset's
    ``network.nic_link``).

    Attributes:
        kind: one of :data:`LINK_KINDS`.
        bandwidth_bytes_per_s: its rate.
        latency_s: its latency.
    """

    kind: str = "pcie"
    bandwidth_bytes_per_s: float = 12e9
    latency_s: float = 1e-6


@dataclass(frozen=True)
class NetworkSpec:
    """The links that join the boxes (a preset's ``network`` section): each NIC's link to
    the fabric switch, and each dedicated parameter server's.

    Attributes:
        kind: one of :data:`LINK_KINDS`.
        bandwidth_bytes_per_s: a link's rate, each direction (``sim run --bandwidth``
            overrides it).
        latency_s: a link's latency.
        burst_bytes: a token bucket on each direction of every NIC's link, as ``tc tbf``
            shapes an emulated cluster's (:attr:`Link.burst_bytes`); 0: none.
        peak_bandwidth_bytes_per_s: how fast a full bucket's bytes leave
            (:attr:`Link.peak_bytes_per_s`); ``None``: no limit.
        sharing: one of :data:`LINK_SHARING` (:attr:`Topology.link_sharing`).
        lead_s: :attr:`Topology.link_lead_s`.
        flow_share, flow_spread: :attr:`Topology.flow_share`, :attr:`Topology.flow_spread`.
        nic_link: the NICs' links into their boxes.
    """

    kind: str = "ib"
    bandwidth_bytes_per_s: float = 12.5e9
    latency_s: float = 1e-6
    burst_bytes: int = 0
    peak_bandwidth_bytes_per_s: float | None = None
    sharing: str = "fifo"
    lead_s: float = 0.0
    flow_share: float = 1.0
    flow_spread: float = 0.0
    nic_link: NicLinkSpec = field(default_factory=NicLinkSpec)


@dataclass(frozen=True)
class PresetSections:
    """A preset's machine sections as specs (:func:`parse_sections`).

    Attributes:
        gpu: the ranks' compute device.
        host: the machines' CPUs, or ``None`` (a GPU cluster: no ``host`` section).
        gloo: the collective library on CPU hosts, or ``None``.
        network: the links between boxes.
    """

    gpu: GpuSpec = field(default_factory=GpuSpec)
    host: HostSpec | None = None
    gloo: GlooSpec | None = None
    network: NetworkSpec = field(default_factory=NetworkSpec)


def parse_sections(preset: Mapping[str, Any]) -> PresetSections:
    """The machine sections of ``preset`` (plain data, as read from YAML) as specs: every
    key converted and checked by its declaration (:data:`simcore.preset_keys.KEYS`;
    older names read as aliases), a key left out at its spec's default, and an empty or
    absent ``host`` or ``gloo`` section ``None``. :class:`~simcore.settings.ConfigError`
    naming the first bad key as written (``host.wakeup_s``), its value and what is
    allowed."""
    if not isinstance(preset, Mapping):
        raise ConfigError("preset", preset, "expected a mapping of sections")
    network = section_values("network", preset.get("network"))
    nic_link = NicLinkSpec(**network.pop("nic_link", {}))
    host, gloo = preset.get("host"), preset.get("gloo")
    return PresetSections(
        gpu=GpuSpec(**section_values("gpu", preset.get("gpu"))),
        host=HostSpec(**section_values("host", host)) if host else None,
        gloo=GlooSpec(**section_values("gloo", gloo)) if gloo else None,
        network=NetworkSpec(**network, nic_link=nic_link),
    )


@dataclass(frozen=True)
class Device:
    """A node of the topology: a GPU, host CPU, NIC, switch or server host.

    ``box`` is the index of the server the device sits in, ``-1`` for fabric switches and
    dedicated parameter-server hosts.
    """

    name: str
    kind: str
    box: int = -1


class Link:
    """One direction of a full-duplex link.

    Attributes:
        index: position in :attr:`Topology.links`.
        src, dst: device indices.
        kind: one of :data:`LINK_KINDS`.
        bandwidth_bytes_per_s: the rate, bytes per second.
        latency: seconds from the end of transmission to arrival at ``dst``.
        name: ``"srcname->dstname"``.
        burst_bytes: a token bucket's size (a link shaped with ``tc tbf``): after an idle
            spell that many bytes leave at ``peak_bytes_per_s`` before the rate applies;
            0 for a plain link.
        peak_bytes_per_s: how fast a burst leaves (the link's speed unshaped); 0 for
            no limit.
    """

    __slots__ = (
        "bandwidth_bytes_per_s",
        "burst_bytes",
        "dst",
        "index",
        "kind",
        "latency",
        "name",
        "peak_bytes_per_s",
        "src",
    )

    def __init__(
        self,
        index: int,
        src: int,
        dst: int,
        kind: str,
        bandwidth_bytes_per_s: float,
        latency: float,
        name: str,
        burst_bytes: float = 0.0,
        peak_bytes_per_s: float = 0.0,
    ) -> None:
        self.index, self.src, self.dst, self.kind = index, src, dst, kind
        self.bandwidth_bytes_per_s, self.latency = bandwidth_bytes_per_s, latency
        self.name = name
        self.burst_bytes, self.peak_bytes_per_s = burst_bytes, peak_bytes_per_s

    def __repr__(self) -> str:
        return (
            f"Link({self.name}, {self.kind}, {self.bandwidth_bytes_per_s:.4g} B/s, "
            f"{self.latency:.3g} s)"
        )


@dataclass
class Topology:
    """Devices, directed links, the GPUs in rank order and routing between devices.

    Attributes:
        name: preset or description.
        devices: all devices.
        links: all directed links (two per physical link).
        gpus: device index of each rank's GPU (rank ``r`` is ``gpus[r]``).
        gpu_spec: the GPU model (all GPUs are alike).
        hosts: the host-CPU device of each box (where co-located parameter servers run).
        servers: dedicated parameter-server hosts on the fabric (may be empty).
        ring_order: ranks in the order a ring collective visits them.
        gateway: for each device index that has one, the NIC its inter-box traffic uses.
        summary: one line describing the topology.
        host_spec: the machines' CPU model (:class:`HostSpec`): ranks and communication
            share their cores; ``None`` on GPU clusters.
        gloo: how collectives behave on CPU hosts (:class:`GlooSpec`), or ``None``.
        link_sharing: one of :data:`LINK_SHARING`; the detailed network model honours
            it, the analytic one always serialises messages in the order they were sent.
        link_lead_s: with ``fair`` sharing, how long the flows already sending on a link
            go on alone when another flow starts (``network.lead_s`` in a preset): a TCP
            connection already sending has that much data in flight ahead of a newcomer's.
            0 is plain start-time fair queueing.
        flow_share: how much of its link's rate a flow gets while every host sends at
            once, as a share of what a lone flow gets (``network.flow_share``, measured by
            ``sim calibrate``'s concurrent flows); the uplinks of the fabric carry it.
        flow_spread: the coefficient of variation of that share between the flows of one
            run (``network.flow_spread``): each uplink of the fabric runs at its rate
            times ``flow_share`` times its own log-normal factor of mean 1 (at most the
            full rate), drawn once per run from the simulation's seed
            (:func:`simcore.network.uplink_factors`).
    """

    name: str
    devices: list[Device]
    links: list[Link]
    gpus: list[int]
    gpu_spec: GpuSpec = field(default_factory=GpuSpec)
    hosts: list[int] = field(default_factory=list)
    servers: list[int] = field(default_factory=list)
    ring_order: list[int] = field(default_factory=list)
    gateway: dict[int, int] = field(default_factory=dict)
    summary: str = ""
    host_spec: HostSpec | None = None
    gloo: GlooSpec | None = None
    link_sharing: str = "fifo"
    link_lead_s: float = 0.0
    flow_share: float = 1.0
    flow_spread: float = 0.0

    def __post_init__(self) -> None:
        if self.link_sharing not in LINK_SHARING:
            raise TopologyError(
                f"topology {self.name!r}: network.sharing: {self.link_sharing!r} is not "
                f"allowed; choose one of {', '.join(LINK_SHARING)}"
            )
        if not (self.link_lead_s >= 0 and math.isfinite(self.link_lead_s)):
            raise TopologyError(
                f"topology {self.name!r}: network.lead must be a time of 0 or more, "
                f"got {self.link_lead_s!r} s"
            )
        if not (0 < self.flow_share <= 1):
            raise TopologyError(
                f"topology {self.name!r}: network.flow_share must be in (0, 1], "
                f"got {self.flow_share!r}"
            )
        if not (0 <= self.flow_spread < 1):
            raise TopologyError(
                f"topology {self.name!r}: network.flow_spread must be in [0, 1), "
                f"got {self.flow_spread!r}"
            )
        self._adj: list[list[Link]] = [[] for _ in self.devices]
        for link in self.links:
            self._adj[link.src].append(link)
        self._routes: dict[tuple[int, int], tuple[Link, ...]] = {}
        self._by_name = {d.name: i for i, d in enumerate(self.devices)}
        if not self.ring_order:
            self.ring_order = list(range(len(self.gpus)))
        if sorted(self.ring_order) != list(range(len(self.gpus))):
            raise TopologyError("ring_order must be a permutation of the ranks")

    # ---- lookups ---------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        """Number of GPUs (ranks)."""
        return len(self.gpus)

    @property
    def num_boxes(self) -> int:
        """Number of boxes that hold GPUs."""
        return 1 + max((self.devices[g].box for g in self.gpus), default=0)

    def box_of_rank(self, rank: int) -> int:
        """The box that holds rank ``rank``'s GPU."""
        return self.devices[self.gpus[rank]].box

    def ranks_by_box(self) -> list[list[int]]:
        """Ranks grouped by box, boxes in order, ranks ascending."""
        out: list[list[int]] = [[] for _ in range(self.num_boxes)]
        for r, g in enumerate(self.gpus):
            out[self.devices[g].box].append(r)
        return [b for b in out if b]

    def box_twins(self, twin_box: Callable[[int], int]) -> list[tuple[int, int]] | None:
        """Match every link of every box ``b`` to the link in the same place of box
        ``twin_box(b)``: ``(link index, twin link index)`` for each link of a box whose twin
        box differs, a link to a fabric device (box -1) counting as its box's. A device's
        place is its position among its box's devices. ``None`` unless every box is built
        like box 0 (the same links in the same places, of the same kind, bandwidth and
        latency)."""
        place: list[Any] = []
        seen: dict[int, int] = {}
        for i, dev in enumerate(self.devices):
            if dev.box < 0:
                place.append(("fabric", i))
            else:
                place.append(seen.get(dev.box, 0))
                seen[dev.box] = place[-1] + 1
        if len(set(seen.values())) > 1:
            return None
        by_key: dict[tuple[Any, ...], Link] = {}
        owned: list[tuple[int, Link]] = []
        per_box: dict[int, int] = {}
        for link in self.links:
            box = max(self.devices[link.src].box, self.devices[link.dst].box)
            if box < 0:
                continue
            by_key[(box, place[link.src], place[link.dst])] = link
            owned.append((box, link))
            per_box[box] = per_box.get(box, 0) + 1
        if len(set(per_box.values())) > 1:
            return None
        pairs: list[tuple[int, int]] = []
        for box, link in owned:
            for tb in (0, twin_box(box)):
                twin = by_key.get((tb, place[link.src], place[link.dst]))
                if twin is None or (twin.kind, twin.bandwidth_bytes_per_s, twin.latency) != (
                    link.kind,
                    link.bandwidth_bytes_per_s,
                    link.latency,
                ):
                    return None
            if twin_box(box) != box:
                pairs.append((link.index, twin.index))
        return pairs

    def route(self, src: int, dst: int) -> tuple[Link, ...]:
        """The directed links from device ``src`` to device ``dst`` (empty if equal).

        Cached. Raises :class:`TopologyError` if ``dst`` cannot be reached.
        """
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            r = self._routes[key] = self._compute_route(src, dst)
        return r

    def path_bandwidth(self, src: int, dst: int) -> float:
        """Bottleneck bandwidth on the route, bytes/s (``inf`` for ``src == dst``)."""
        return min((link.bandwidth_bytes_per_s for link in self.route(src, dst)), default=math.inf)

    def stage_bandwidth(self) -> float:
        """The bandwidth a pipeline's stages are cut for, bytes/s: the route's between the
        first two GPUs, or a GPU's memory bandwidth where there is one GPU."""
        bw = self.path_bandwidth(self.gpus[0], self.gpus[1]) if len(self.gpus) > 1 else math.inf
        return bw if math.isfinite(bw) else self.gpu_spec.memory_bandwidth_bytes_per_s

    def _compute_route(self, src: int, dst: int) -> tuple[Link, ...]:
        if src == dst:
            return ()
        bs, bd = self.devices[src].box, self.devices[dst].box
        if bs >= 0 and bd >= 0 and bs != bd:
            gs, gd = self.gateway.get(src), self.gateway.get(dst)
            if gs is not None and gd is not None and gs != src and gd != dst:
                return self.route(src, gs) + self.route(gs, gd) + self.route(gd, dst)
        allowed = {bs, bd, -1}
        return self._dijkstra(src, dst, allowed)

    def _dijkstra(self, src: int, dst: int, boxes: set[int]) -> tuple[Link, ...]:
        devices = self.devices
        dist = {src: 0.0}
        prev: dict[int, Link] = {}
        heap = [(0.0, src)]
        while heap:
            d, u = heapq.heappop(heap)
            if u == dst:
                break
            if d > dist[u]:
                continue
            for link in self._adj[u]:
                v = link.dst
                if devices[v].box not in boxes:
                    continue
                nd = d + link.latency + ROUTE_PROBE_BYTES / link.bandwidth_bytes_per_s
                if nd < dist.get(v, math.inf) - 1e-15:
                    dist[v] = nd
                    prev[v] = link
                    heapq.heappush(heap, (nd, v))
        if dst not in prev:
            raise TopologyError(f"no route from {devices[src].name} to {devices[dst].name}")
        path: list[Link] = []
        v = dst
        while v != src:
            link = prev[v]
            path.append(link)
            v = link.src
        return tuple(reversed(path))


class TopologyBuilder:
    """Incremental construction of a :class:`Topology` (used by presets and tests)."""

    def __init__(self, name: str = "custom") -> None:
        self.name = name
        self.devices: list[Device] = []
        self.links: list[Link] = []
        self._index: dict[str, int] = {}

    def device(self, name: str, kind: str, box: int = -1) -> int:
        """Add a device and return its index."""
        if kind not in DEVICE_KINDS:
            raise TopologyError(
                f"device {name!r}: unknown kind {kind!r}; known: {', '.join(DEVICE_KINDS)}"
            )
        if name in self._index:
            raise TopologyError(f"device {name!r} defined twice")
        self._index[name] = len(self.devices)
        self.devices.append(Device(name, kind, box))
        return self._index[name]

    def index(self, name: str) -> int:
        """Index of an added device."""
        try:
            return self._index[name]
        except KeyError:
            raise TopologyError(f"link refers to unknown device {name!r}") from None

    def link(
        self,
        a: str | int,
        b: str | int,
        kind: str,
        bandwidth: float,
        latency: float,
        count: int = 1,
        burst_bytes: float = 0.0,
        peak_bytes_per_s: float = 0.0,
    ) -> None:
        """Add a full-duplex link (two directed links) of ``count`` lanes ganged together
        (``burst_bytes``, ``peak_bytes_per_s``: a token bucket in each direction, see
        :class:`Link`)."""
        ia = a if isinstance(a, int) else self.index(a)
        ib = b if isinstance(b, int) else self.index(b)
        if kind not in LINK_KINDS:
            raise TopologyError(
                f"link {self.devices[ia].name}-{self.devices[ib].name}: unknown "
                f"kind {kind!r}; known: {', '.join(LINK_KINDS)}"
            )
        if not bandwidth > 0:
            raise TopologyError(
                f"link {self.devices[ia].name}-{self.devices[ib].name}: bandwidth must be positive"
            )
        bw = bandwidth * count
        for s, d in ((ia, ib), (ib, ia)):
            name = f"{self.devices[s].name}->{self.devices[d].name}"
            self.links.append(
                Link(len(self.links), s, d, kind, bw, latency, name, burst_bytes, peak_bytes_per_s)
            )

    def build(self, gpus: list[int] | None = None, **kwargs: Any) -> Topology:
        """The topology; ``gpus`` defaults to every GPU device in order of creation."""
        if gpus is None:
            gpus = [i for i, d in enumerate(self.devices) if d.kind == "gpu"]
        return Topology(self.name, self.devices, self.links, gpus, **kwargs)


# ---- presets ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TopologySpec:
    """A preset plus the choices that shape it into a concrete cluster.

    Attributes:
        preset: the preset's data (see :func:`build_topology`), a read-only mapping.
        gpus: number of GPUs (ranks).
        bandwidth_bytes_per_s: inter-box link rate; ``None`` keeps the preset's.
        nic_per_gpu: one NIC per GPU instead of one per box.
        dedicated_servers: parameter-server hosts to attach to the fabric.
        sections: the preset's machine sections, parsed when the spec is made
            (:func:`parse_sections`): a bad key is a :class:`TopologyError` naming the
            preset and the key.
    """

    preset: Mapping[str, Any]
    gpus: int
    bandwidth_bytes_per_s: float | None = None
    nic_per_gpu: bool = False
    dedicated_servers: int = 0
    sections: PresetSections = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            sections = parse_sections(self.preset)
        except ConfigError as exc:
            raise TopologyError(f"preset {self.name!r}: {exc}") from None
        object.__setattr__(self, "sections", sections)

    @property
    def name(self) -> str:
        """The preset's name."""
        if not isinstance(self.preset, Mapping):
            return "custom"
        return str(self.preset.get("name", "custom"))


def build_topology(spec: TopologySpec) -> Topology:
    """Build a cluster from a preset (see :func:`_build_topology`); anything malformed in
    it is a :class:`TopologyError` naming the preset."""
    try:
        return _build_topology(spec)
    except TopologyError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        name = spec.preset.get("name", "custom") if isinstance(spec.preset, Mapping) else "?"
        raise TopologyError(
            f"preset {str(name)!r} is malformed: {type(exc).__name__}: {exc}"
        ) from None


def _build_topology(spec: TopologySpec) -> Topology:
    """Build a cluster from a preset.

    A preset is a mapping with keys ``name``, ``summary``, the machine sections ``gpu``
    (:class:`GpuSpec`'s fields), optionally ``host`` (:class:`HostSpec`'s) and ``gloo``
    (:class:`GlooSpec`'s), and ``network`` (:class:`NetworkSpec`'s), every key declared in
    :mod:`simcore.preset_keys` and parsed with the spec (:attr:`TopologySpec.sections`),
    and ``box`` (``gpus`` per box, ``devices`` name -> kind, ``links`` as ``[a, b, kind,
    bandwidth, latency]`` or with a fifth ``count``, ``host``, ``nic_attach``, optional
    ``ring_order``). GPUs inside a box are the
    implicit devices ``gpu0 .. gpu{n-1}``. Device names get a ``n{box}.`` prefix when the
    cluster has more than one box.

    Boxes are filled in order; the last may be partial. A fabric switch joins the boxes'
    NICs whenever there is more than one box or dedicated servers are asked for.
    """
    p = spec.preset
    name = str(p.get("name", "custom"))
    if spec.gpus < 1:
        raise TopologyError(f"gpus must be at least 1, got {spec.gpus}")
    sections = spec.sections
    gpu, host_spec, gloo, net = sections.gpu, sections.host, sections.gloo, sections.network
    net_bw = spec.bandwidth_bytes_per_s or net.bandwidth_bytes_per_s
    net_peak = net.peak_bandwidth_bytes_per_s or 0.0
    nic_kind, nic_bw, nic_lat = (
        net.nic_link.kind,
        net.nic_link.bandwidth_bytes_per_s,
        net.nic_link.latency_s,
    )
    try:
        box = p["box"]
        per_box = int(box["gpus"])
        box_devices: Mapping[str, str] = box.get("devices", {})
        box_links: list[list[Any]] = list(box.get("links", []))
        host_name = str(box.get("host", ""))
        nic_attach = str(box.get("nic_attach", host_name))
        ring_local = list(box.get("ring_order", range(per_box)))
    except (KeyError, TypeError, ValueError, AttributeError, UnitError) as exc:
        # AttributeError: a section that is not a mapping (``box: 3``).
        raise TopologyError(f"preset {name!r} is malformed: {exc}") from None
    if per_box < 1:
        raise TopologyError(f"preset {name!r}: box.gpus must be at least 1")
    if gpu.kind == "cpu" and host_spec is None:
        raise TopologyError(f"preset {name!r}: gpu.kind cpu needs a 'host' section (cores)")
    rank_dev = "cpu" if gpu.kind == "cpu" else "gpu"
    if sorted(ring_local) != list(range(per_box)):
        raise TopologyError(f"preset {name!r}: box.ring_order must list 0..{per_box - 1}")

    nboxes = -(-spec.gpus // per_box)
    multi = nboxes > 1
    b = TopologyBuilder(name)
    gpus: list[int] = []
    hosts: list[int] = []
    gateway: dict[int, int] = {}
    ring: list[int] = []
    nics: list[int] = []
    for bi in range(nboxes):
        pre = f"n{bi}." if multi else ""
        n_here = min(per_box, spec.gpus - bi * per_box)
        local_gpus = {f"gpu{i}": i for i in range(n_here)}
        first_rank = len(gpus)
        for i in range(n_here):
            gpus.append(b.device(f"{pre}{_rank_name(rank_dev, i, box_devices)}", "gpu", bi))
        for dname, kind in box_devices.items():
            b.device(pre + dname, str(kind), bi)
        parent: dict[str, str] = {}
        for spec_link in box_links:
            a, c, kind, bw, lat, *rest = spec_link
            dropped = [x for x in (a, c) if str(x).startswith("gpu") and x not in local_gpus]
            if dropped:
                continue  # the GPU is beyond this (partial) box
            try:
                b.link(
                    pre + _local(a, rank_dev, box_devices),
                    pre + _local(c, rank_dev, box_devices),
                    kind,
                    parse_rate(bw),
                    parse_time(lat),
                    int(rest[0]) if rest else 1,
                )
            except UnitError as exc:
                raise TopologyError(f"preset {name!r}: link {a}-{c}: {exc}") from None
            for x, y in ((a, c), (c, a)):
                if str(x).startswith("gpu") and kind == "pcie":
                    parent[x] = y
        ring.extend(first_rank + i for i in ring_local if i < n_here)
        if host_name:
            hosts.append(b.index(pre + host_name))
        # NICs: one per box, or one per GPU hanging where the GPU hangs off PCIe.
        if multi or spec.dedicated_servers:
            if spec.nic_per_gpu:
                for i in range(n_here):
                    nic = b.device(f"{pre}nic{i}", "nic", bi)
                    at = _local(parent.get(f"gpu{i}", nic_attach), rank_dev, box_devices)
                    b.link(nic, pre + at, nic_kind, nic_bw, nic_lat)
                    nics.append(nic)
                    gateway[gpus[first_rank + i]] = nic
                for dname in box_devices:
                    gateway[b.index(pre + dname)] = nics[-n_here]
            else:
                nic = b.device(f"{pre}nic0", "nic", bi)
                b.link(nic, pre + nic_attach, nic_kind, nic_bw, nic_lat)
                nics.append(nic)
                for i in range(n_here):
                    gateway[gpus[first_rank + i]] = nic
                for dname in box_devices:
                    gateway[b.index(pre + dname)] = nic
    servers: list[int] = []
    if nics:
        fabric = b.device("switch", "switch", -1)
        for nic in nics:
            b.link(nic, fabric, net.kind, net_bw, net.latency_s, 1, net.burst_bytes, net_peak)
        for s in range(spec.dedicated_servers):
            srv = b.device(f"ps{s}", "server", -1)
            b.link(srv, fabric, net.kind, net_bw, net.latency_s)
            servers.append(srv)
    topo = b.build(
        gpus,
        gpu_spec=gpu,
        hosts=hosts,
        servers=servers,
        ring_order=ring,
        gateway=gateway,
        summary=str(p.get("summary", "")),
        host_spec=host_spec,
        gloo=gloo,
        link_sharing=net.sharing,
        link_lead_s=net.lead_s,
        flow_share=net.flow_share,
        flow_spread=net.flow_spread,
    )
    return topo


def _rank_name(rank_dev: str, i: int, box_devices: Mapping[str, str]) -> str:
    """The name of a box's ``i``-th rank device: ``gpu<i>``, or on CPU hosts ``cpu<i>``
    (``rank<i>`` where the preset already names a device ``cpu<i>``)."""
    name = f"{rank_dev}{i}"
    return f"rank{i}" if rank_dev == "cpu" and name in box_devices else name


def _local(dev: str, rank_dev: str, box_devices: Mapping[str, str]) -> str:
    """A preset's ``gpu<i>`` in a box's link list, named as :func:`_rank_name` does."""
    dev = str(dev)
    if dev.startswith("gpu") and dev[3:].isdigit():
        return _rank_name(rank_dev, int(dev[3:]), box_devices)
    return dev
