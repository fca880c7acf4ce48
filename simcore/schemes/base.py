"""The scheme interface and the context a scheme builds its processes in."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from simpy import Environment

from simcore.collectives import Collectives
from simcore.config import OPTIMIZERS, SimConfig
from simcore.device import Gpu
from simcore.network import Network
from simcore.topology import Topology
from simcore.work import SchemeWork, Workload
from traces.model import Trace

if TYPE_CHECKING:
    from simcore.host import CpuPool


@dataclass(frozen=True)
class NoOptions:
    """A scheme without options."""


class SimContext:
    """Everything a scheme needs while it sets up and runs.

    Attributes:
        env: the SimPy environment.
        config: the :class:`SimConfig`.
        options: the scheme's options instance.
        trace: the trace at ``config.effective_batch_size`` samples on the target GPU
            (``compute_scale`` applied).
        topology, net, coll: topology, network model and collectives engine.
        transport: what a scheme sends its messages through (the collectives' own
            :class:`~simcore.transport.Transport`), saying how the real runtime moves
            them; it adds what the hosts cost them.
        gpus: one :class:`Gpu` per rank.
        compute_log: the shared compute log (tuples in
            :data:`~simcore.records.COMPUTE_LOG_FIELDS` order); work on non-GPU devices
            (parameter servers) is logged here too.
        spans: other spans a scheme wants drawn (tuples in :class:`~simcore.records.Span`
            order); messages and collectives are added automatically.
        iteration_end: ``iteration_end[i][r]`` is when rank ``r`` finished iteration ``i``
            (``-1`` until it has).
        rng: the ``numpy.random.Generator`` seeded from ``config.seed``, or ``None`` when
            the run needs no randomness.
    """

    def __init__(
        self,
        env: Environment,
        config: SimConfig,
        options: Any,
        trace: Trace,
        topology: Topology,
        net: Network,
        coll: Collectives,
        gpus: list[Gpu],
        compute_log: list[tuple[Any, ...]],
        rng: Any,
    ) -> None:
        self.env, self.config, self.options, self.trace = env, config, options, trace
        self.topology, self.net, self.coll, self.gpus = topology, net, coll, gpus
        self.transport = coll.transport
        self.compute_log, self.rng = compute_log, rng
        self.spans: list[tuple[Any, ...]] = []
        self.iteration_end = [[-1.0] * len(gpus) for _ in range(config.total_iterations)]
        self.extra: dict[str, Any] = {}
        self.cpu_pool_of: Callable[[int], CpuPool] | None = None
        """On CPU hosts, the cores (:class:`~simcore.host.CpuPool`) a device's work runs
        on; ``None`` on GPU clusters."""
        self.simulated_iterations = config.total_iterations
        """Iterations' worth of work the run simulates (a scheme that runs more than the
        warm-up and measured ones, like an asynchronous pipeline's lead-in and drain, says
        so here; per-iteration link totals divide by it)."""
        self.traffic_scale = 1.0
        """Real payload bytes per simulated message byte: a scheme that simulates the
        messages of a part of a symmetric cluster and mirrors them onto the rest sets it
        (the payload totals are multiplied by it)."""

    @property
    def num_ranks(self) -> int:
        """Number of ranks (GPUs)."""
        return len(self.gpus)

    @property
    def iterations(self) -> int:
        """Iterations to simulate, warm-up included."""
        return self.config.total_iterations

    def mark_iteration(self, rank: int, iteration: int) -> None:
        """Record that ``rank`` finished ``iteration`` now."""
        self.iteration_end[iteration][rank] = self.env.now

    def optimizer_state_bytes(self, param_bytes: int) -> int:
        """Bytes of optimizer state for ``param_bytes`` of weights."""
        return OPTIMIZERS[self.config.optimizer][0] * param_bytes

    @property
    def update_passes(self) -> int:
        """Weight-sized memory passes of one optimizer step (see ``OPTIMIZERS``)."""
        return OPTIMIZERS[self.config.optimizer][1]

    def update_s(self, param_bytes: int) -> float:
        """Seconds for an optimizer step over ``param_bytes`` of weights on one GPU
        (memory-bound: weight-sized passes over DRAM, see ``OPTIMIZERS``, plus the
        device's fixed ``step_overhead_s``)."""
        spec = self.topology.gpu_spec
        return (
            spec.step_overhead_s
            + self.update_passes * param_bytes / spec.memory_bandwidth_bytes_per_s
        )


class Scheme(ABC):
    """A training scheme: turns a trace, a topology and options into SimPy processes.

    Subclasses set ``name`` (registry key = module name = CLI string), ``summary`` (one
    line for ``sim schemes``) and ``Options`` (a frozen dataclass of
    :func:`simcore.config.option` fields), and implement :meth:`start`. The class also
    holds every other fact about the scheme that the real runtime, the work guard and the
    analyses ask for (the attributes and classmethods below), so that a scheme is its
    module: nothing else lists scheme names.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    priority_network: ClassVar[bool] = False
    """Whether link queues are priority-ordered (P3) instead of FIFO."""
    pipeline: ClassVar[bool] = False
    """Whether the ranks are the stages of a pipeline that splits one mini-batch into
    micro-batches (a real run then carries the pipeline's plan), rather than workers with
    a batch each."""
    parameter_servers: ClassVar[bool] = False
    """Whether a real run adds parameter-server ranks to the workers
    (:meth:`server_ranks`)."""
    same_numerics: ClassVar[bool] = False
    """Whether training is SGD on each whole update batch, the numbers one process
    computes (synchronous data parallelism, pipelines with a flush): the staleness
    emulator trains every such scheme the same way."""
    update_per_microbatch: ClassVar[bool] = False
    """Whether the weights are updated after every micro-batch (the asynchronous
    pipelines' 1F1B) instead of once per iteration."""
    replicas_diverge: ClassVar[bool] = False
    """Whether every worker trains a model of its own that the exchanges only pull
    together (gossip), so the workers' weights differ."""
    posts_sends: ClassVar[bool] = False
    """Whether the real runtime's ranks hand every message to gloo on their main thread
    (``isend``, :class:`realrun.p2p.PostedLink`), so their send spans are the main
    thread's time, instead of sending from a thread of their own."""
    real_runtime: ClassVar[str] = ""
    """The real runtime that runs the scheme with torch.distributed, as
    ``"module:Class"``, imported by a real run's ranks only (the simulator stays
    torch-free); ``""``: the scheme has none."""
    real_backends: ClassVar[tuple[str, ...]] = ("gloo",)
    """The torch.distributed backends the real runtime runs on."""
    convergence_variants: ClassVar[Mapping[str, Mapping[str, Any]]] = MappingProxyType({})
    """The scheme's runs in ``sim train``'s convergence study, by the name the study gives
    each, with the options it sets; empty: not in the study. Read from the class itself,
    not inherited (a subclass names its own runs)."""

    def __init__(self, ctx: SimContext) -> None:
        self.ctx = ctx
        self.options = ctx.options

    @classmethod
    def dedicated_servers(cls, options: Any, gpus: int) -> int:
        """Parameter-server hosts the topology must provide on its fabric (default 0)."""
        return 0

    @classmethod
    def step_passes(cls, optimizer: str, gpus: int) -> int:
        """Weight-sized memory passes of one of the scheme's optimizer steps (the
        optimizer's, ``OPTIMIZERS``; a scheme whose step does more says so)."""
        return OPTIMIZERS[optimizer][1]

    @classmethod
    def check(cls, config: SimConfig, options: Any, topology: Topology) -> None:
        """Reject configurations the scheme cannot run (raise ``ConfigError``); the base
        accepts everything."""
        return None

    @classmethod
    def server_ranks(cls, options: Any, workers: int) -> int:
        """Parameter-server ranks a real run with ``workers`` workers adds (default 0)."""
        return 0

    @classmethod
    def worker_refusal(cls, workers: int) -> str | None:
        """Why the scheme cannot run on ``workers`` workers whatever its options (the words
        that follow the scheme's name in a message), or ``None`` when it can (the base:
        any number)."""
        return None

    @classmethod
    def real_refusal(cls, options: Any, workers: int) -> tuple[str, str] | None:
        """Why the real runtime cannot run ``options`` on ``workers`` workers, as ``(the
        setting, what follows its name in the message)``, or ``None`` when it can (the
        base: what :meth:`worker_refusal` refuses)."""
        why = cls.worker_refusal(workers)
        if why is None:
            return None
        return ("gpus", f"{workers} is not allowed; {cls.name} {why}")

    @classmethod
    def estimate_work(cls, work: Workload) -> SchemeWork:
        """The messages and bytes a simulation of ``work`` moves (see
        :mod:`simcore.guard`); the base: compute only, no messages."""
        return SchemeWork()

    def replicas(self) -> int:
        """Model replicas that each process ``batch_size`` samples per iteration (the
        global batch is ``batch_size * replicas()``); data parallelism: one per GPU."""
        return self.ctx.num_ranks

    @abstractmethod
    def start(self) -> None:
        """Create the processes for ``ctx.iterations`` iterations. Each rank must call
        ``ctx.mark_iteration(rank, i)`` when it finishes iteration ``i``."""

    def finish(self) -> None:
        """Called once the simulation has run, before the metrics are computed (the base
        does nothing)."""
        return None

    def extra_metrics(self) -> dict[str, Any]:
        """Scheme-specific results added to the run's JSON (e.g. pipeline stages)."""
        return {}
