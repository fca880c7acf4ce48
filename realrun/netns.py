"""An emulated cluster on one machine: each host a Linux network namespace, links shaped by tc.

``sim real --cluster netns --bandwidth 200Mbps`` runs every rank in its own network
namespace. The namespaces are joined like machines on one switch::

    host ns h0: lo, veth <ifname> 10.A.B.1/24 ──┐
    host ns h1: lo, veth <ifname> 10.A.B.2/24 ──┼── switch ns: a bridge, one veth port per host
    host ns h2: lo, veth <ifname> 10.A.B.3/24 ──┘

The bridge lives in its own "switch" namespace and every veth pair is created directly with
one end in the switch namespace and the other in the host namespace, so nothing is ever
added to the root namespace. A shaped cluster puts a ``tc tbf`` qdisc on both ends of each
host's veth: on the host end (egress host -> switch, what the host sends) and on the switch
end (egress switch -> host, what the host receives). Each direction of each host's link is
therefore limited to the rate independently, like a full-duplex NIC on a non-blocking switch.

What the rate means: tbf counts Ethernet frames (IP packet plus the 14-byte Ethernet header),
so TCP goodput is below the configured rate; with full-size segments it is about 1448/1514
(~95.6 %) of it, less when tbf's bursts cause losses (docs/emulated_cluster.md). Measure
a shaped link with :func:`measure_goodput` before trusting its rate. ``netem`` is not
available on the target kernel, so no delay is added: the round trip is tens of
microseconds plus queueing.

Names: everything carries the caller's prefix (default ``dtsim``) and the creating process's
pid and start time, e.g. ``dtsim-4242-1234567-a1b2-h0`` (host 0) and ``...-sw`` (switch), so
:func:`remove_stale` can tell leftovers of dead processes from live clusters, and nothing
without the prefix is ever removed. Interface names are at most 15 characters.

Cleanup: :meth:`EmulatedCluster.close` deletes the namespaces (which destroys their veths
and qdiscs with them) and stops processes still running inside them. It runs on normal exit
and exceptions (``with``), on Ctrl-C (Python raises ``KeyboardInterrupt``) and on SIGTERM and
SIGHUP (turned into :class:`Terminated`, a ``KeyboardInterrupt``, while a cluster is open if
nothing else handles those signals; see :func:`terminate_as_interrupt`). Only SIGKILL (or a
crash of the interpreter) leaves namespaces behind; :func:`remove_stale` removes those.

This module does not import torch; it needs root, ``ip`` and ``tc`` (iproute2).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from types import FrameType

from realrun.owner import owner_tag as _owner_tag
from realrun.owner import start_ticks as _start_ticks

__all__ = [
    "DEFAULT_PREFIX",
    "EmulatedCluster",
    "Host",
    "LinkShape",
    "NetnsUnavailable",
    "Terminated",
    "check_available",
    "list_ours",
    "measure_goodput",
    "remove_stale",
    "shape_for_rate",
    "terminate_as_interrupt",
]

DEFAULT_PREFIX = "dtsim"
#: Largest Ethernet frame tbf sees for a 1500-byte MTU (IP packet + 14-byte header).
FRAME_BYTES = 1514
#: Most hosts in one cluster: one /24, addresses .1 to .254.
MAX_HOSTS = 254
_RUN_NETNS = "/run/netns"
_PREFIX_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
_IFNAME_MAX = 15
_HINT = "use --cluster local, which works anywhere"
_counter = itertools.count()


class NetnsUnavailable(RuntimeError):
    """Emulated clusters cannot be built here; the one-line message says why and what to do
    (``--cluster local`` works anywhere)."""


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM or SIGHUP while a handler from
    :func:`terminate_as_interrupt` (or an open :class:`EmulatedCluster`) is installed, so that
    ``finally`` blocks and ``__exit__`` run. ``signum`` is the signal's number.

    It subclasses ``KeyboardInterrupt`` so code that already cleans up on Ctrl-C handles it,
    and ``except Exception`` does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


@dataclass(frozen=True)
class Host:
    """One emulated machine.

    ``index``: its position in the cluster (rank placement is the launcher's choice);
    ``namespace``: the network namespace's name (``ip netns exec <namespace> ...``);
    ``ifname``: the veth inside the namespace, to give gloo as ``GLOO_SOCKET_IFNAME``;
    ``address``: its IPv4 address (dotted quad, in the cluster's private /24)."""

    index: int
    namespace: str
    ifname: str
    address: str


@dataclass(frozen=True)
class LinkShape:
    """The tbf settings on each direction of each host's link.

    ``rate_bytes_per_s``: the token rate, in bytes of Ethernet frames per second;
    ``burst_bytes``: the bucket size, the most bytes sent back to back at line speed;
    ``limit_bytes``: the most bytes queued behind the bucket before tbf drops."""

    rate_bytes_per_s: float
    burst_bytes: int
    limit_bytes: int


#: Burst covers this much time at the rate: the kernel's timer and scheduling slack on a busy
#: machine must not leave the bucket overflowing (losing tokens and so rate) between wake-ups.
_BURST_S = 0.002
#: At least this many full frames in the bucket, so a frame always fits and slow links do
#: not send one frame per timer wake-up.
_BURST_MIN_FRAMES = 8
#: Queue behind the bucket: about this much time at the rate, like a switch buffer; bounded
#: so a queue never holds seconds of data (which would hide the rate behind latency).
_QUEUE_S = 0.05
#: ...but at least this many bytes, so a slow link still queues a useful window.
_QUEUE_MIN_BYTES = 64 * 1024


def shape_for_rate(rate_bytes_per_s: float) -> LinkShape:
    """The tbf settings used for a link of ``rate_bytes_per_s``.

    Burst: the larger of 8 full frames (a frame must always fit; tbf drops anything larger
    than its bucket) and 2 ms at the rate (tbf refills the bucket on timer wake-ups; with a
    bucket smaller than the tokens earned between wake-ups the excess is lost and the link
    runs below its rate). 2 ms of data is negligible next to any transfer worth measuring.
    Limit: burst plus the larger of 50 ms at the rate and 64 KiB: enough queue that TCP
    keeps the link busy, bounded so latency under load stays tens of milliseconds."""
    if not (rate_bytes_per_s > 0 and math.isfinite(rate_bytes_per_s)):
        raise ValueError(f"rate_bytes_per_s must be positive and finite, got {rate_bytes_per_s}")
    burst = max(_BURST_MIN_FRAMES * FRAME_BYTES, math.ceil(rate_bytes_per_s * _BURST_S))
    limit = burst + max(_QUEUE_MIN_BYTES, math.ceil(rate_bytes_per_s * _QUEUE_S))
    return LinkShape(float(rate_bytes_per_s), burst, limit)


# ---------------------------------------------------------------------------------------
# Running ip/tc


def _run(
    argv: Sequence[str], *, check: bool = True, timeout_s: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run a command quietly; on failure (with ``check``) raise ``CalledProcessError``
    carrying its stderr."""
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
    )
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, list(argv), proc.stdout, proc.stderr)
    return proc


def _why(err: BaseException) -> str:
    """A one-line reason from a failed command."""
    if isinstance(err, subprocess.CalledProcessError):
        text = (err.stderr or err.stdout or "").strip().splitlines()
        detail = text[0] if text else f"exit status {err.returncode}"
        return f"`{' '.join(map(str, err.cmd))}` failed: {detail}"
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def _check_prefix(prefix: str) -> None:
    if not _PREFIX_RE.match(prefix):
        raise ValueError(
            f"prefix must be a letter then up to 31 letters, digits or '_', got {prefix!r}"
        )


def _name_re(prefix: str) -> re.Pattern[str]:
    """Our namespace names: ``PREFIX-PID-STARTTICKS-TOKEN-ROLE``."""
    return re.compile(rf"^{re.escape(prefix)}-(\d+)-(\d+)-([0-9a-f]+)-(sw|h\d+|probe)$")


def _all_namespaces() -> list[str]:
    """Names of the namespaces under /run/netns (what ``ip netns list`` shows)."""
    try:
        return sorted(os.listdir(_RUN_NETNS))
    except FileNotFoundError:
        return []


def list_ours(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Namespaces whose names this module would create with ``prefix`` (live or stale),
    sorted. Names with another prefix, even one starting with ``prefix``, are not listed."""
    _check_prefix(prefix)
    pattern = _name_re(prefix)
    return [n for n in _all_namespaces() if pattern.match(n)]


def _owner_alive(name: str, prefix: str) -> bool:
    m = _name_re(prefix).match(name)
    if not m:
        return True  # not ours: treat as alive, never touch
    pid, ticks = int(m.group(1)), int(m.group(2))
    return _start_ticks(pid) == ticks


def _ns_pids(namespace: str) -> list[int]:
    proc = _run(["ip", "netns", "pids", namespace], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit() and int(p) != os.getpid()]


def _stop_processes(namespaces: Sequence[str], grace_s: float = 1.0) -> None:
    """SIGTERM every process inside ``namespaces``, then SIGKILL what is left after
    ``grace_s``. Only processes inside our own namespaces are signalled."""
    pids = {p for ns in namespaces for p in _ns_pids(ns)}
    if not pids:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            pids = {p for p in pids if os.path.exists(f"/proc/{p}") and not _is_zombie(p)}
            if pids:
                time.sleep(0.02)
        if not pids:
            return


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].startswith("Z")


def _delete_namespaces(names: Sequence[str]) -> list[str]:
    """Stop processes inside, then delete each namespace (its veths and qdiscs go with it).
    Returns the names deleted; a failure on one does not stop the others."""
    _stop_processes(names)
    deleted = []
    for name in names:
        proc = _run(["ip", "netns", "delete", name], check=False)
        if proc.returncode == 0 or not os.path.exists(os.path.join(_RUN_NETNS, name)):
            deleted.append(name)
    return deleted


def _delete_all(names: Sequence[str]) -> list[str]:
    """:func:`_delete_namespaces` that finishes even if interrupted: signals are held in
    this thread, and an interrupt that still gets through (a signal delivered to another
    thread runs its Python handler here) is kept, the deletion retried, and the interrupt
    re-raised once every namespace is gone."""
    interrupt: BaseException | None = None
    deleted: list[str] = []
    with _signals_blocked():
        for _ in range(5):
            left = [n for n in names if os.path.exists(os.path.join(_RUN_NETNS, n))]
            if not left:
                break
            try:
                deleted += _delete_namespaces(left)
            except KeyboardInterrupt as err:
                interrupt = interrupt or err
    if interrupt is not None:
        raise interrupt
    return deleted


def remove_stale(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Delete namespaces with ``prefix`` whose creating process is gone (killed with SIGKILL,
    crashed). A process is identified by pid and start time, so a reused pid does not keep
    leftovers alive, and live clusters, including other users' with the same prefix, are
    never touched. Returns the names removed."""
    return _delete_all([n for n in list_ours(prefix) if not _owner_alive(n, prefix)])


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP while cleaning up; they are delivered (and raise)
    once cleanup is done, so a second Ctrl-C cannot interrupt a half-done cleanup."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def check_available() -> None:
    """Raise :class:`NetnsUnavailable` unless emulated clusters can be built here: running
    as root, ``ip`` and ``tc`` installed, and the kernel lets us create a namespace, a veth
    pair and a tbf qdisc (tried on a throwaway namespace, removed again)."""
    if os.geteuid() != 0:
        raise NetnsUnavailable(f"emulated clusters need root (network namespaces); {_HINT}")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetnsUnavailable(
                f"emulated clusters need `{tool}` (iproute2), not found on PATH; {_HINT}"
            )
    probe = f"{DEFAULT_PREFIX}-{_owner_tag()}-{secrets.token_hex(2)}-probe"
    with _signals_blocked():
        try:
            _run(["ip", "netns", "add", probe])
            try:
                _run(["ip", "-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb"])
                _run(
                    [
                        "tc",
                        "-n",
                        probe,
                        "qdisc",
                        "add",
                        "dev",
                        "pa",
                        "root",
                        "tbf",
                        "rate",
                        "8000000bit",
                        "burst",
                        "12112",
                        "limit",
                        "100000",
                    ]
                )
            finally:
                _run(["ip", "netns", "delete", probe], check=False)
        except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired) as err:
            raise NetnsUnavailable(
                f"cannot build network namespaces here ({_why(err)}); {_HINT}"
            ) from err


# ---------------------------------------------------------------------------------------
# Signals


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


_TERM_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def terminate_as_interrupt(signals: Sequence[int] = _TERM_SIGNALS) -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Terminated` in the main thread
    (as Ctrl-C raises ``KeyboardInterrupt``), so ``finally`` blocks and context managers
    clean up; the previous handlers are restored afterwards. Outside the main thread it
    does nothing (Python only handles signals there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise_terminated) for s in signals}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


class _SignalGuard:
    """Shared by open clusters: while at least one is open, SIGTERM/SIGHUP raise
    :class:`Terminated`, but only where they had the default disposition (someone else's
    handler is left alone). Restored when the last cluster closes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._installed: dict[int, object] = {}

    def acquire(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        with self._lock:
            if self._count == 0:
                for s in _TERM_SIGNALS:
                    if signal.getsignal(s) == signal.SIG_DFL:
                        self._installed[s] = signal.signal(s, _raise_terminated)
            self._count += 1

    def release(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        with self._lock:
            if self._count == 0:
                return
            self._count -= 1
            if self._count == 0:
                for s, old in self._installed.items():
                    if signal.getsignal(s) is _raise_terminated:
                        signal.signal(s, old)  # type: ignore[arg-type]
                self._installed.clear()


_guard = _SignalGuard()


# ---------------------------------------------------------------------------------------
# The cluster


def _subnet() -> str:
    """A private /24 ``10.A.B`` for a new cluster, from the pid and a per-process counter so
    concurrent clusters differ; A is 64-127, away from the 10.0.x/10.1.x nets people use.
    The addresses only exist inside our namespaces, so a clash could not break anything."""
    n = (os.getpid() * 64 + next(_counter)) % (64 * 256)
    return f"10.{64 + n // 256}.{n % 256}"


class EmulatedCluster:
    """``hosts`` emulated machines on one switch, each a network namespace whose link is
    shaped to ``rate_bytes_per_s`` in each direction (None: unshaped, veth speed).

    Use it as a context manager; leaving the block (normally, by an exception, Ctrl-C or
    SIGTERM) calls :meth:`close`, which removes every namespace, veth and qdisc it created::

        with EmulatedCluster(3, 25e6) as cluster:          # 200 Mbit/s per direction
            procs = [subprocess.Popen(cluster.command(h.index, [sys.executable, "rank.py"]),
                                      env={**os.environ, "GLOO_SOCKET_IFNAME": h.ifname})
                     for h in cluster.hosts]

    Building it raises :class:`NetnsUnavailable` (one line, why and what to do) if the
    machine does not allow it; what was built by then is removed first. While a cluster is
    open, SIGTERM and SIGHUP raise :class:`Terminated` in the main thread unless the program
    already handles them. TCP goodput is about 1448/1514 of the rate (Ethernet framing);
    check it with :func:`measure_goodput`.

    Attributes besides the properties: ``prefix``; ``subnet`` (``10.A.B.0/24``);
    ``switch_namespace`` (the namespace holding the bridge); ``bridge`` (its name there).
    """

    def __init__(
        self, hosts: int, rate_bytes_per_s: float | None, *, prefix: str = DEFAULT_PREFIX
    ) -> None:
        """Build the cluster (see the class docstring). ``prefix`` starts every namespace
        name; use your own to keep clusters apart from others' (tests use one per test)."""
        _check_prefix(prefix)
        if isinstance(hosts, bool) or not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be an integer from 1 to {MAX_HOSTS}, got {hosts!r}")
        self._shape = None if rate_bytes_per_s is None else shape_for_rate(rate_bytes_per_s)
        self.prefix = prefix
        token = secrets.token_hex(2)
        base = f"{prefix}-{_owner_tag()}-{token}"
        short = f"{prefix[:6]}{token}"  # interface names: <=6 + 4 + 1 + 3 <= 15 characters
        self.switch_namespace = f"{base}-sw"
        self.bridge = f"{short}br"
        subnet = _subnet()
        self.subnet = f"{subnet}.0/24"
        self._hosts = [
            Host(i, f"{base}-h{i}", f"{short}h{i}", f"{subnet}.{i + 1}") for i in range(hosts)
        ]
        self._switch_ports = [f"{short}s{i}" for i in range(hosts)]
        assert all(
            len(n) <= _IFNAME_MAX
            for n in [self.bridge, *self._switch_ports, *(h.ifname for h in self._hosts)]
        )
        self._created: list[str] = []  # namespaces, in creation order
        self._closed = False
        _guard.acquire()
        try:
            self._build()
        except BaseException as err:
            self.close()
            if isinstance(err, subprocess.CalledProcessError | OSError | subprocess.TimeoutExpired):
                raise NetnsUnavailable(
                    f"cannot build the emulated cluster ({_why(err)}); {_HINT}"
                ) from err
            raise

    # -- building ----------------------------------------------------------------------

    def _add_namespace(self, name: str) -> None:
        self._created.append(name)  # before: a half-created one is still removed
        _run(["ip", "netns", "add", name])
        # no IPv6: no router solicitations or MLD reports adding bytes to measured links
        _run(
            [
                "ip",
                "netns",
                "exec",
                name,
                "sh",
                "-c",
                "for f in all default; do echo 1 > /proc/sys/net/ipv6/conf/$f/disable_ipv6; "
                "done 2>/dev/null; true",
            ],
            check=False,
        )
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _build(self) -> None:
        if os.geteuid() != 0:
            raise NetnsUnavailable(f"emulated clusters need root (network namespaces); {_HINT}")
        sw = self.switch_namespace
        self._add_namespace(sw)
        _run(
            [
                "ip",
                "-n",
                sw,
                "link",
                "add",
                self.bridge,
                "type",
                "bridge",
                "forward_delay",
                "0",
                "stp_state",
                "0",
            ]
        )
        _run(["ip", "-n", sw, "link", "set", self.bridge, "up"])
        for host, port in zip(self._hosts, self._switch_ports, strict=True):
            self._add_namespace(host.namespace)
            # both ends created directly in their namespaces: nothing in the root namespace
            _run(
                [
                    "ip",
                    "-n",
                    sw,
                    "link",
                    "add",
                    port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    host.ifname,
                    "netns",
                    host.namespace,
                ]
            )
            _run(["ip", "-n", sw, "link", "set", port, "master", self.bridge])
            _run(
                [
                    "ip",
                    "-n",
                    host.namespace,
                    "addr",
                    "add",
                    f"{host.address}/24",
                    "dev",
                    host.ifname,
                ]
            )
            if self._shape is not None:
                self._add_tbf(host.namespace, host.ifname)  # host -> switch
                self._add_tbf(sw, port)  # switch -> host
            _run(["ip", "-n", sw, "link", "set", port, "up"])
            _run(["ip", "-n", host.namespace, "link", "set", host.ifname, "up"])

    def _add_tbf(self, namespace: str, dev: str) -> None:
        shape = self._shape
        assert shape is not None
        _run(
            [
                "tc",
                "-n",
                namespace,
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                f"{round(shape.rate_bytes_per_s * 8)}bit",
                "burst",
                str(shape.burst_bytes),
                "limit",
                str(shape.limit_bytes),
            ]
        )

    def set_rate(self, rate_bytes_per_s: float | None) -> None:
        """Reshape every link to ``rate_bytes_per_s`` in each direction (None: remove the
        shaping), with the tbf settings of :func:`shape_for_rate`, while the cluster is
        open and its processes keep their connections. Used by ``sim calibrate`` to measure
        the same namespaces with and without shaping."""
        self._check_open()
        shape = None if rate_bytes_per_s is None else shape_for_rate(rate_bytes_per_s)
        ends = [
            end
            for host, port in zip(self._hosts, self._switch_ports, strict=True)
            for end in ((host.namespace, host.ifname), (self.switch_namespace, port))
        ]
        if self._shape is not None:
            for ns, dev in ends:
                _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"])
        self._shape = shape
        if shape is not None:
            for ns, dev in ends:
                self._add_tbf(ns, dev)

    # -- using -------------------------------------------------------------------------

    @property
    def hosts(self) -> list[Host]:
        """The hosts, in index order (a new list each time)."""
        return list(self._hosts)

    @property
    def rate_bytes_per_s(self) -> float | None:
        """The configured rate of every link in each direction, None when unshaped."""
        return None if self._shape is None else self._shape.rate_bytes_per_s

    @property
    def shape(self) -> LinkShape | None:
        """The tbf settings on every link end (None when unshaped)."""
        return self._shape

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._closed

    def link_rates(self) -> list[float | None]:
        """The configured rate of each host's link (index order), in bytes/s of Ethernet
        frames, the same in both directions; None where unshaped."""
        return [self.rate_bytes_per_s for _ in self._hosts]

    def command(self, index: int, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside host ``index``'s namespace
        (``ip netns exec NAMESPACE argv...``); the environment is inherited."""
        self._check_open()
        return ["ip", "netns", "exec", self._hosts[index].namespace, *map(str, argv)]

    def interface_bytes(self) -> list[dict[str, int | str]]:
        """Kernel counters of each host's veth (index order): ``tx_bytes``/``tx_packets``
        (sent by the host towards the switch), ``rx_bytes``/``rx_packets`` (received),
        ``tx_dropped``/``rx_dropped``, plus ``index``, ``namespace`` and ``ifname``.
        Bytes include headers, so they are at least the payload carried; but the veth
        counts a GSO batch (up to 64 KiB of TCP segments) as one packet with one set of
        headers, so they undercount per-frame overhead (tbf's own counters in
        :meth:`qdisc_stats`, and its shaping, account every frame's headers). Packets tbf
        dropped are not in ``tx_bytes`` (they never reached the veth)."""
        self._check_open()
        out: list[dict[str, int | str]] = []
        for host in self._hosts:
            proc = _run(
                ["ip", "-n", host.namespace, "-j", "-s", "link", "show", "dev", host.ifname]
            )
            stats = json.loads(proc.stdout)[0]["stats64"]
            out.append(
                {
                    "index": host.index,
                    "namespace": host.namespace,
                    "ifname": host.ifname,
                    "tx_bytes": int(stats["tx"]["bytes"]),
                    "rx_bytes": int(stats["rx"]["bytes"]),
                    "tx_packets": int(stats["tx"]["packets"]),
                    "rx_packets": int(stats["rx"]["packets"]),
                    "tx_dropped": int(stats["tx"]["dropped"]),
                    "rx_dropped": int(stats["rx"]["dropped"]),
                }
            )
        return out

    def qdisc_stats(self) -> list[dict[str, dict[str, int]]]:
        """Per host (index order), the tbf counters of both link ends: ``{"up": ...,
        "down": ...}`` with ``bytes``, ``packets``, ``drops``, ``overlimits`` and
        ``backlog`` (up = host -> switch, down = switch -> host). Empty dicts when
        unshaped. Drops here are what the shaping cost TCP in losses."""
        self._check_open()
        if self._shape is None:
            return [{"up": {}, "down": {}} for _ in self._hosts]
        res = []
        for host, port in zip(self._hosts, self._switch_ports, strict=True):
            ends = {}
            for key, ns, dev in (
                ("up", host.namespace, host.ifname),
                ("down", self.switch_namespace, port),
            ):
                proc = _run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev])
                q = next((q for q in json.loads(proc.stdout) if q.get("kind") == "tbf"), {})
                ends[key] = {
                    k: int(q.get(k, 0))
                    for k in ("bytes", "packets", "drops", "overlimits", "backlog")
                }
            res.append(ends)
        return res

    def namespaces(self) -> list[str]:
        """Every namespace this cluster created (switch first), for inspection."""
        return list(self._created)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the emulated cluster is closed")

    # -- cleaning up ---------------------------------------------------------------------

    def close(self) -> None:
        """Stop processes still running in the cluster's namespaces (SIGTERM, then SIGKILL
        after a second) and delete the namespaces, which removes their veths, bridge and
        qdiscs. Idempotent; SIGINT/SIGTERM arriving meanwhile wait until it is done."""
        if self._closed:
            return
        self._closed = True
        try:
            _delete_all(list(reversed(self._created)))
        finally:
            _guard.release()

    def __enter__(self) -> EmulatedCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # last resort for a cluster never closed; not a substitute for close()
        with contextlib.suppress(Exception):
            if not getattr(self, "_closed", True):
                self.close()

    def __repr__(self) -> str:
        rate = "unshaped" if self._shape is None else f"{self._shape.rate_bytes_per_s:g} B/s"
        return (
            f"EmulatedCluster({len(self._hosts)} hosts, {rate}, {self.subnet}, "
            f"{'closed' if self._closed else 'open'})"
        )


# ---------------------------------------------------------------------------------------
# Measuring a link

_RECEIVER = r"""
import socket, sys, time
n = int(sys.argv[2])
srv = socket.socket()
srv.bind((sys.argv[1], 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
buf = memoryview(bytearray(1 << 20))
got = 0
while got < n:
    k = conn.recv_into(buf)
    if not k:
        break
    got += k
end = time.monotonic()
conn.close()
print(got, repr(end), flush=True)
"""

_SENDER = r"""
import socket, sys, time
n = int(sys.argv[3])
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
chunk = memoryview(b"\0" * (1 << 20))
start = time.monotonic()
left = n
while left > 0:
    left -= sock.send(chunk[:min(left, len(chunk))])
sock.shutdown(socket.SHUT_WR)
sock.recv(1)
print(repr(start), flush=True)
"""


def measure_goodput(
    cluster: EmulatedCluster, src: int, dst: int, nbytes: int, *, timeout_s: float = 60.0
) -> float:
    """TCP goodput in bytes/s from host ``src`` to host ``dst``: ``nbytes`` of payload over
    one connection, plain Python sockets in processes started with ``cluster.command``.
    Timed from the sender's first byte (connection already open) to the receiver's last, on
    the system-wide monotonic clock, so interpreter start-up is not counted. Pick ``nbytes``
    for a second or two at the expected rate: tbf's initial burst inflates short transfers."""
    return measure_goodputs(cluster, [(src, dst)], nbytes, timeout_s=timeout_s)[0]


def measure_goodputs(
    cluster: EmulatedCluster,
    pairs: Sequence[tuple[int, int]],
    nbytes: int,
    *,
    timeout_s: float = 60.0,
) -> list[float]:
    """The goodput of each flow of ``pairs`` (``(src, dst)`` hosts) when they all send
    ``nbytes`` at once, each timed as :func:`measure_goodput` times one flow: flows in
    opposite directions, or into a host that is sending too, share its link's directions."""
    if nbytes <= 0:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    if any(src == dst for src, dst in pairs):
        raise ValueError("src and dst must be different hosts")
    procs: list[subprocess.Popen[str]] = []

    def start(host: int, script: str, *args: str) -> subprocess.Popen[str]:
        argv = [sys.executable, "-c", script, *args]
        proc = subprocess.Popen(
            cluster.command(host, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        procs.append(proc)
        return proc

    try:
        receivers = []
        for _src, dst in pairs:
            address = cluster.hosts[dst].address
            recv = start(dst, _RECEIVER, address, str(nbytes))
            assert recv.stdout is not None
            port = recv.stdout.readline().strip()
            if not port.isdigit():
                recv.kill()
                raise RuntimeError(
                    f"goodput receiver in {cluster.hosts[dst].namespace} failed: "
                    f"{recv.communicate(timeout=5)[1].strip()}"
                )
            receivers.append((recv, address, port))
        senders = [
            start(src, _SENDER, address, port, str(nbytes))
            for (src, _dst), (_recv, address, port) in zip(pairs, receivers, strict=True)
        ]
        out = []
        for (src, _dst), send, (recv, _a, _p) in zip(pairs, senders, receivers, strict=True):
            sent, send_err = send.communicate(timeout=timeout_s)
            got, err = recv.communicate(timeout=timeout_s)
            if send.returncode != 0 or recv.returncode != 0:
                raise RuntimeError(f"goodput flow failed: {(send_err + err).strip()}")
            got_s, end_s = got.split()
            if int(got_s) != nbytes:
                raise RuntimeError(
                    f"receiver got {got_s} of {nbytes} bytes from {cluster.hosts[src].namespace}"
                )
            out.append(nbytes / (float(end_s) - float(sent.strip())))
        return out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# ---------------------------------------------------------------------------------------
# Debugging entry point


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m realrun.netns``: build a cluster, print it as JSON, optionally measure
    each link and hold it open; or remove stale namespaces."""
    import argparse

    from simcore.units import UnitError, parse_rate

    ap = argparse.ArgumentParser(prog="python -m realrun.netns", description=main.__doc__)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--rate", default=None, help="link rate, e.g. 100Mbps (default unshaped)")
    ap.add_argument("--prefix", default=DEFAULT_PREFIX)
    ap.add_argument(
        "--hold",
        type=float,
        default=0.0,
        help="keep the cluster this many seconds (Ctrl-C or SIGTERM ends it)",
    )
    ap.add_argument(
        "--measure",
        type=float,
        default=0.0,
        metavar="MB",
        help="measure goodput host i -> i+1 with this many MB each",
    )
    ap.add_argument(
        "--remove-stale",
        action="store_true",
        help="only remove namespaces with PREFIX left by dead processes",
    )
    args = ap.parse_args(argv)
    try:
        if args.remove_stale:
            for name in remove_stale(args.prefix):
                print(f"removed {name}")
            return 0
        rate = None if args.rate is None else parse_rate(args.rate)
        check_available()
        with EmulatedCluster(args.hosts, rate, prefix=args.prefix) as cluster:
            print(
                json.dumps(
                    {
                        "rate_bytes_per_s": cluster.rate_bytes_per_s,
                        "subnet": cluster.subnet,
                        "switch_namespace": cluster.switch_namespace,
                        "hosts": [asdict(h) for h in cluster.hosts],
                    }
                ),
                flush=True,
            )
            if args.measure > 0:
                n = len(cluster.hosts)
                for i in range(n if n > 2 else n - 1):
                    bps = measure_goodput(cluster, i, (i + 1) % n, int(args.measure * 1e6))
                    print(
                        f"h{i} -> h{(i + 1) % n}: {bps * 8 / 1e6:.1f} Mbit/s goodput"
                        + (f" ({bps / rate:.1%} of the rate)" if rate else ""),
                        flush=True,
                    )
            print("ready", flush=True)
            if args.hold > 0:
                time.sleep(args.hold)
        return 0
    except (NetnsUnavailable, UnitError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Terminated as err:
        return 128 + err.signum
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
