"""What `/metrics` says: GPU series under dcgm-exporter's names and labels, plus what
dcgm-exporter cannot say — the run and rank on each GPU — and gpud's own run, host and
daemon series. Pure: records in, prometheus-client metric families out.

Names, types, units and scales follow dcgm-exporter's counters (`etc/default-counters.csv`
and `dcp-metrics-included.csv`, copied in tests/data/dcgm-exporter/, and the DCGM field
reference): memory in MiB, clocks in MHz, power in W, energy in mJ, the profiling fields
(`DCGM_FI_PROF_*`) as ratios from 0 to 1, NVLink and PCIe traffic in bytes per second. A
field the GPU does not offer (None in the sample) is absent, never 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from gpud.efficiency.goodput import Goodput
from gpud.efficiency.model import RunFlops
from gpud.model.run import TRAINING, HealthSummary, RunState, throughput
from gpud.model.snapshot import GpuSample, HostSample, NodeSnapshot, PodRef
from gpud.notify.targets import DELIVERY_RESULTS
from gpud.wire.run_messages import RunSummary

MIB = 1024 * 1024
KIB = 1024
#: dcgm-exporter's labels, in its order; then ours. `DCGM_FI_DRIVER_VERSION` is how
#: dcgm-exporter carries the driver version: a field of type `label` in its CSV, which it
#: puts on every GPU series rather than in a series of its own.
GPU_LABELS = (
    "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
)  # fmt: skip
JOB_LABELS = ("run", "rank", "hpc_job", "simulated")
#: dcgm-exporter's Kubernetes labels (`pod_uid` is the one its --kubernetes-enable-pod-uid
#: adds; here it is the cgroup's UID of the pod whose process is on the GPU). Only while a
#: GPU of the node has a pod: Prometheus reads an empty label as an absent one, so the
#: series are the same either way, and a node off Kubernetes pays nothing for them.
POD_LABELS = ("pod", "namespace", "container", "pod_uid")
#: At most this many metric names per run: a trainer logging a new name per step must not
#: grow every scrape without bound.
MAX_RUN_METRICS = 32
VERDICTS = ("ok", "degraded", "stalled", "failed", "idle")


class DcgmCounterFamily(Metric):
    """A counter written as dcgm-exporter writes its counters: `# TYPE NAME counter` and
    samples named NAME, the name exactly as given. prometheus-client cannot write that (its
    counters always end in `_total`, which would break every dashboard that knows
    dcgm-exporter's names), so `gpud.prometheus.endpoint.render` knows this family. For a
    name that ends in `_total` it writes what prometheus-client writes for a counter."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        super().__init__(name, documentation, "counter")
        self._labelnames = tuple(labels)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.samples.append(
            Sample(self.name, dict(zip(self._labelnames, labels, strict=True)), value)
        )


@dataclass(frozen=True)
class GpuField:
    name: str
    help: str
    value: Callable[[GpuSample], float | None]
    #: A count that only grows, typed `counter` under its name as it is (DcgmCounterFamily):
    #: where dcgm-exporter's CSVs type the name `counter`, and gpud's own `..._total`.
    counter: bool = False


def _ratio(pct: float | None) -> float | None:
    return None if pct is None else pct / 100.0


def _mib(n: int | None) -> float | None:
    return None if n is None else n / MIB


def _free(g: GpuSample) -> float | None:
    if g.memory_total_bytes is None or g.memory_used_bytes is None:
        return None
    return (g.memory_total_bytes - g.memory_used_bytes - (g.memory_reserved_bytes or 0)) / MIB


def _links(g: GpuSample, pick: Callable[..., float | int | None]) -> float | None:
    if not g.nvlinks:
        return None
    values = [v for link in g.nvlinks if (v := pick(link)) is not None]
    return float(sum(values)) if values else None


def _nvlink_bandwidth(g: GpuSample) -> float | None:
    """DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as DCGM computes it: the data sent and received on
    all links, NVML's KiB counters per second, divided by 1000 (DCGM's arithmetic; its unit
    says MB/s). A rate, though dcgm-exporter types it `counter`."""
    sent = _links(g, lambda link: link.tx_bytes_per_s)
    received = _links(g, lambda link: link.rx_bytes_per_s)
    if sent is None or received is None:
        return None
    return (sent + received) / KIB / 1000


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


def _last_xid(g: GpuSample) -> float:
    return float(g.xid.recent[-1].code) if g.xid.recent else 0.0


FIELDS: tuple[GpuField, ...] = (
    GpuField("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.utilization_gpu_pct),
    GpuField(
        "DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).",
        lambda g: g.utilization_memory_pct,
    ),
    GpuField("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).",
             lambda g: g.encoder_utilization_pct),
    GpuField("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).",
             lambda g: g.decoder_utilization_pct),
    GpuField("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).",
             lambda g: _mib(g.memory_used_bytes)),
    GpuField("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _free),
    GpuField("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).",
             lambda g: _mib(g.memory_total_bytes)),
    GpuField("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).",
             lambda g: _mib(g.memory_reserved_bytes)),
    GpuField("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.clock_sm_mhz),
    GpuField("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).",
             lambda g: g.clock_mem_mhz),
    GpuField("DCGM_FI_DEV_MAX_SM_CLOCK", "Maximum SM clock frequency (in MHz).",
             lambda g: g.clock_sm_max_mhz),
    GpuField("DCGM_FI_DEV_MAX_MEM_CLOCK", "Maximum memory clock frequency (in MHz).",
             lambda g: g.clock_mem_max_mhz),
    GpuField("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature_c),
    GpuField("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).",
             lambda g: g.memory_temperature_c),
    GpuField("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power_w),
    GpuField("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
             "Total energy consumption since the driver was loaded (in mJ).",
             lambda g: g.energy_mj, counter=True),
    GpuField("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).",
             lambda g: g.power_limit_w),
    GpuField("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", lambda g: g.fan_pct),
    GpuField("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe link generation.", lambda g: g.pcie_link_gen),
    GpuField("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe link width (lanes).",
             lambda g: g.pcie_link_width),
    GpuField("DCGM_FI_DEV_PERSISTENCE_MODE", "Persistence mode (1 on).",
             lambda g: _flag(g.persistence_mode)),
    GpuField("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", _last_xid),
    GpuField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.",
             lambda g: g.pcie_replay_count, counter=True),
    GpuField("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.",
             lambda g: g.ecc_corrected_volatile, counter=True),
    GpuField("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.",
             lambda g: g.ecc_uncorrected_volatile, counter=True),
    GpuField("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
             "Total number of single-bit persistent ECC errors.",
             lambda g: g.ecc_corrected_aggregate, counter=True),
    GpuField("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
             "Total number of double-bit persistent ECC errors.",
             lambda g: g.ecc_uncorrected_aggregate, counter=True),
    GpuField("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
             "Number of remapped rows for correctable errors.",
             lambda g: g.remapped_rows_correctable, counter=True),
    GpuField("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
             "Number of remapped rows for uncorrectable errors.",
             lambda g: g.remapped_rows_uncorrectable, counter=True),
    GpuField("DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether remapping of rows is pending (1).",
             lambda g: _flag(g.remapped_rows_pending)),
    GpuField("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed (1).",
             lambda g: _flag(g.remapped_rows_failed)),
    GpuField("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
             "Total number of NVLink retries.",
             lambda g: _links(g, lambda link: link.replay_errors), counter=True),
    GpuField("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
             "Total number of NVLink recovery errors.",
             lambda g: _links(g, lambda link: link.recovery_errors), counter=True),
    GpuField("gpud_nvlink_crc_errors_total",
             "NVLink flit and data CRC errors, all links (NVML reads them together).",
             lambda g: _links(g, lambda link: link.crc_errors), counter=True),
    GpuField("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
             "NVLink data sent and received, all links (NVML's KiB per second / 1000, as"
             " DCGM counts it).",
             _nvlink_bandwidth, counter=True),
    GpuField("DCGM_FI_PROF_NVLINK_TX_BYTES",
             "The rate of data transmitted over NVLink, not including protocol headers,"
             " in bytes per second.",
             lambda g: _links(g, lambda link: link.tx_bytes_per_s)),
    GpuField("DCGM_FI_PROF_NVLINK_RX_BYTES",
             "The rate of data received over NVLink, not including protocol headers,"
             " in bytes per second.",
             lambda g: _links(g, lambda link: link.rx_bytes_per_s)),
    GpuField("DCGM_FI_PROF_PCIE_TX_BYTES",
             "The rate of data transmitted over the PCIe bus, in bytes per second.",
             lambda g: g.pcie_tx_bytes_per_s),
    GpuField("DCGM_FI_PROF_PCIE_RX_BYTES",
             "The rate of data received over the PCIe bus, in bytes per second.",
             lambda g: g.pcie_rx_bytes_per_s),
    GpuField("DCGM_FI_PROF_GR_ENGINE_ACTIVE",
             "Ratio of time the graphics engine is active (0 to 1).",
             lambda g: _ratio(g.graphics_activity_pct)),
    GpuField("DCGM_FI_PROF_DRAM_ACTIVE",
             "Ratio of cycles the device memory interface is active sending or receiving"
             " data (0 to 1).",
             lambda g: _ratio(g.dram_activity_pct)),
    GpuField("DCGM_FI_PROF_SM_ACTIVE",
             "The ratio of cycles an SM has at least 1 warp assigned (0 to 1).",
             lambda g: _ratio(g.sm_activity_pct)),
    GpuField("DCGM_FI_PROF_SM_OCCUPANCY",
             "The ratio of number of warps resident on an SM (0 to 1).",
             lambda g: _ratio(g.sm_occupancy_pct)),
    GpuField("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
             "Ratio of cycles the tensor (HMMA) pipe is active (0 to 1).",
             lambda g: _ratio(g.tensor_activity_pct)),
)  # fmt: skip


@dataclass(frozen=True)
class RunOnNode:
    """A run as this node knows it: its summary, its latest health (node 0 only), and
    which of its ranks runs on which of this node's GPUs (by UUID)."""

    summary: RunSummary
    health: HealthSummary | None = None
    ranks_by_gpu: dict[str, int] = field(default_factory=dict)
    gpus: tuple[str, ...] = ()  # UUIDs leased to it here
    #: From the spec: samples per optimizer step on one process (batch_size_per_gpu ×
    #: gradient_accumulation), and tokens per sample (training.seq_len).
    samples_per_rank_step: int | None = None
    tokens_per_sample: int | None = None
    goodput: Goodput | None = None  # node 0's account of its wall time

    def throughput(self) -> tuple[float | None, float | None]:
        """(samples/s, tokens/s): what the trainer logs under a throughput name, else the
        step rate (the ranks' median step time) × the global batch (× seq_len). None
        unless the run is training now: a stopped run's last rate is not a rate."""
        if self.summary.state not in TRAINING:
            return None, None
        health = self.health
        return throughput(
            self.summary.last_values,
            [r.step_time_s for r in health.ranks if r.step_time_s] if health else [],
            health.world_size if health else None,
            self.samples_per_rank_step,
            self.tokens_per_sample,
        )

    def flops(self) -> RunFlops | None:
        """Node 0's latest FLOP rate and MFU of the run, while it trains."""
        if self.summary.state not in TRAINING or self.health is None:
            return None
        return self.health.flops


@dataclass(frozen=True)
class DaemonStats:
    cpu_seconds: float
    rss_bytes: int
    clients: int
    requests: dict[str, int]
    #: Alerts handed to the webhook sender, by what became of them (gpud.notify).
    notify: dict[str, int] = field(default_factory=dict)
    #: The daemon's CPU by component (gpud.node.ledger).
    components: dict[str, float] = field(default_factory=dict)
    #: The state dir's bytes by part (database, runs, checkpoints), as last measured.
    state_bytes: dict[str, int] = field(default_factory=dict)
    #: Run records in the state dir.
    state_runs: int | None = None


def gpu_families(
    snapshot: NodeSnapshot, runs: list[RunOnNode], jobs: dict[int, str] | None = None
) -> Iterator[Metric]:
    """`jobs`: GPU index → the Slurm job of a process on it (dcgm-exporter's `hpc_job`);
    the pods come with the snapshot (gpud.kube.pods)."""
    host = snapshot.host.hostname
    jobs = jobs or {}
    on_gpu: dict[str, tuple[str, str]] = {}
    for run in runs:
        for uuid in run.gpus:
            on_gpu.setdefault(uuid, (run.summary.id, ""))
        for uuid, number in run.ranks_by_gpu.items():
            on_gpu[uuid] = (run.summary.id, str(number))
    pods = any(gpu.pod is not None for gpu in snapshot.gpus)
    labels = list(GPU_LABELS + JOB_LABELS + (POD_LABELS if pods else ()))
    families: dict[str, GaugeMetricFamily | DcgmCounterFamily] = {}
    for f in FIELDS:
        if f.counter:
            families[f.name] = DcgmCounterFamily(f.name, f.help, labels)
        else:
            families[f.name] = GaugeMetricFamily(f.name, f.help, labels=labels)
    for gpu in snapshot.gpus:
        run_id, rank = on_gpu.get(gpu.uuid, ("", ""))
        values: list[str] = [
            str(gpu.index),
            gpu.uuid,
            gpu.pci_bus_id or "",
            f"nvidia{gpu.index}",
            gpu.name,
            host,
            snapshot.driver_version or "",
            run_id,
            rank,
            jobs.get(gpu.index, ""),
            "true" if gpu.simulated else "",
        ]
        if pods:
            pod = gpu.pod or PodRef()
            values += [pod.name or "", pod.namespace or "", pod.container or "", pod.uid or ""]
        for f in FIELDS:
            value = None if gpu.lost else f.value(gpu)
            if value is not None:
                families[f.name].add_metric(values, float(value))
    yield from (family for family in families.values() if family.samples)


def hold_families(snapshot: NodeSnapshot) -> Iterator[Metric]:
    """Quarantines and drains (gpud.heal): 0 or 1 for every GPU and the node, never present
    only when set, so a dashboard and an alert see the series from the start."""
    host = snapshot.host.hostname
    labels = ("Hostname", "gpu", "UUID", "reason")
    quarantined = _gauge(
        "gpud_gpu_quarantined",
        "1 while gpud keeps new work off the GPU: it"
        " found it unsafe (an XID, ECC, row remapping, lost).",
        labels,
    )
    drained = _gauge(
        "gpud_gpu_drained",
        "1 while an operator keeps new work off the GPU (gpuctl drain --gpu).",
        (*labels, "by"),
    )
    node = _gauge("gpud_node_drained", "1 while the node takes no new runs (gpuctl drain).",
                  ("Hostname", "reason", "by"))  # fmt: skip
    for gpu in snapshot.gpus:
        hold = gpu.hold
        q = hold is not None and hold.kind == "quarantine"
        d = hold is not None and hold.kind == "drain"
        where = [host, str(gpu.index), gpu.uuid]
        quarantined.add_metric([*where, hold.reason if q and hold else ""], 1.0 if q else 0.0)
        by = hold.by or "" if d and hold else ""
        drained.add_metric([*where, hold.reason if d and hold else "", by], 1.0 if d else 0.0)
    held = snapshot.drained
    node.add_metric(
        [host, held.reason if held else "", (held.by or "") if held else ""], 1.0 if held else 0.0
    )
    yield from (f for f in (quarantined, drained, node) if f.samples)


def _gauge(name: str, help: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help, labels=list(labels))


def run_families(runs: list[RunOnNode]) -> Iterator[Metric]:
    state = _gauge("gpud_run_state", "The run's state: 1 for the one it is in.",
                   ("run", "name", "state"))  # fmt: skip
    attempt = _gauge("gpud_run_attempt", "The run's current attempt (1, 2, ...).", ("run",))
    restarts = CounterMetricFamily(
        "gpud_run_restarts", "Automatic restarts of the run.", labels=["run"]
    )
    steps = _gauge("gpud_run_steps_done", "Steps done (last step index + 1).", ("run",))
    total = _gauge("gpud_run_max_steps", "training.max_steps.", ("run",))
    values = _gauge("gpud_run_metric", "The run's latest value of a metric it logs.",
                    ("run", "metric"))  # fmt: skip
    verdict = _gauge("gpud_run_health", "The health verdict: 1 for the current one.",
                     ("run", "verdict"))  # fmt: skip
    from_output = _gauge(
        "gpud_run_health_from_output",
        "1 while the run's health is judged from its output (no rank sends heartbeats: the"
        " script does not use the trainers library), so its ok is not vouched for, else 0.",
        ("run",),
    )
    samples = _gauge("gpud_run_samples_per_second", "Samples trained per second (all ranks).",
                     ("run",))  # fmt: skip
    tokens = _gauge("gpud_run_tokens_per_second", "Tokens trained per second (all ranks).",
                    ("run",))  # fmt: skip
    flops = _gauge(
        "gpud_run_flops_per_second",
        "Achieved FLOP/s of the run, all ranks (counted by the trainers library, from the"
        " spec's flops_per_sample or 6·model_params·tokens, or the trainer's flops_per_s).",
        ("run",),
    )
    mfu = _gauge(
        "gpud_run_mfu",
        "Model FLOPs utilization, 0 to 1: achieved FLOP/s over the GPUs' dense peak at the"
        " run's precision; absent where n/a (CPU run, simulated GPU, GPU not in the table).",
        ("run",),
    )
    goodput = _gauge(
        "gpud_run_goodput_ratio",
        "Goodput, 0 to 1: training time (less steps done again after a restart) over the"
        " run's wall time so far (node 0 only).",
        ("run",),
    )
    # A gauge, not a counter: time learnt later (a save's, a stall's, steps done again) is
    # moved out of `training`, which then drops; as a counter, rate() and increase() would
    # read each move as a reset. Differences over time (x - x offset 1h, deriv) are right.
    seconds = _gauge(
        "gpud_run_seconds",
        "The run's wall time so far by bucket: queued, starting, training, checkpointing,"
        " stalled, stopping, restarting, lost, unwatched (node 0 only; they add up to the wall"
        " time)."
        " training can drop as time learnt later moves out of it: take differences, not rate.",
        ("run", "bucket"),
    )
    straggler = _gauge("gpud_run_straggler", "1 while the rank is a straggler, else 0.",
                       ("run", "rank"))  # fmt: skip
    stalled = _gauge("gpud_run_stalled", "1 while the rank holds the others up (or all are "
                     "stuck), else 0.", ("run", "rank"))  # fmt: skip
    busbw = _gauge("gpud_run_busbw_gbps", "Bus bandwidth of the collective probe (GB/s).",
                   ("run",))  # fmt: skip
    warnings = CounterMetricFamily(
        "gpud_run_nccl_warnings", "NCCL warnings in the run's logs.", labels=["run"]
    )
    age = _gauge("gpud_rank_heartbeat_age_seconds", "Seconds since the rank's last heartbeat.",
                 ("run", "rank"))  # fmt: skip
    step_time = _gauge("gpud_rank_step_time_seconds", "The rank's recent step time.",
                       ("run", "rank"))  # fmt: skip
    collective = _gauge(
        "gpud_rank_collective_seconds", "Time per step the rank spends in collectives.",
        ("run", "rank"),
    )  # fmt: skip
    world = _gauge("gpud_run_world_size", "Ranks in the run's current attempt.", ("run",))
    nodes = _gauge(
        "gpud_run_nodes",
        "Nodes in the run's current attempt (an elastic run may"
        " use fewer than it was launched on: gpud_run_planned_nodes).",
        ("run",),
    )
    planned = _gauge("gpud_run_planned_nodes", "Nodes the run was launched on.", ("run",))
    for run in runs:
        s = run.summary
        rid = s.id
        for each in RunState:
            if each is not RunState.LOST:
                state.add_metric([rid, s.name, each.value], float(s.state is each))
        attempt.add_metric([rid], float(s.attempt))
        restarts.add_metric([rid], float(s.restarts))
        planned_count = s.planned_nodes or len(s.nodes)
        planned.add_metric([rid], float(planned_count))
        nodes.add_metric([rid], float(len(s.members) if s.members is not None else planned_count))
        if s.world_size is not None:
            world.add_metric([rid], float(s.world_size))
        if s.steps_done is not None:
            steps.add_metric([rid], float(s.steps_done))
        if s.max_steps is not None:
            total.add_metric([rid], float(s.max_steps))
        for name in sorted(s.last_values)[:MAX_RUN_METRICS]:
            values.add_metric([rid, name], float(s.last_values[name]))
        per_second = run.throughput()
        if per_second[0] is not None:
            samples.add_metric([rid], per_second[0])
        if per_second[1] is not None:
            tokens.add_metric([rid], per_second[1])
        found = run.flops()
        if found is not None and found.flops_per_second is not None:
            flops.add_metric([rid], found.flops_per_second)
        if found is not None and found.mfu is not None:
            mfu.add_metric([rid], found.mfu)
        if run.goodput is not None and run.goodput.ratio is not None:
            goodput.add_metric([rid], run.goodput.ratio)
            for bucket, spent in run.goodput.seconds.items():
                seconds.add_metric([rid, bucket], spent)
        health = run.health
        if health is None:
            continue
        for each_verdict in VERDICTS:
            verdict.add_metric([rid, each_verdict], float(health.verdict == each_verdict))
        from_output.add_metric([rid], float(health.judged_from_output))
        stall = health.stall
        for rank in health.ranks:
            number = str(rank.rank)
            straggler.add_metric([rid, number], float(rank.straggler))
            stuck = stall is not None and stall.rank in (None, rank.rank)
            stalled.add_metric([rid, number], float(stuck))
        if health.bandwidth is not None:
            busbw.add_metric([rid], health.bandwidth.busbw_gbps)
        warnings.add_metric([rid], float(health.nccl_warnings))
        for rank in health.ranks:
            labels = [rid, str(rank.rank)]
            if rank.heartbeat_age_s is not None:
                age.add_metric(labels, rank.heartbeat_age_s)
            if rank.step_time_s is not None:
                step_time.add_metric(labels, rank.step_time_s)
            if rank.collective_s is not None:
                collective.add_metric(labels, rank.collective_s)
    for family in (state, attempt, restarts, steps, total, values, samples, tokens, flops, mfu,
                   goodput, seconds, verdict,
                   from_output, straggler, stalled, busbw, warnings, age, step_time,
                   collective, world, nodes, planned):  # fmt: skip
        if family.samples:
            yield family


def host_families(host: HostSample, daemon: DaemonStats) -> Iterator[Metric]:
    if host.cpu_percent is not None:
        cpu = _gauge("gpud_host_cpu_percent", "Host CPU use (in %).")
        cpu.add_metric([], host.cpu_percent)
        yield cpu
    memory = _gauge("gpud_host_memory_used_bytes", "Host memory in use.")
    memory.add_metric([], float(host.memory_used_bytes))
    yield memory
    total = _gauge("gpud_host_memory_total_bytes", "Host memory in all.")
    total.add_metric([], float(host.memory_total_bytes))
    yield total
    cpu_s = CounterMetricFamily("gpud_daemon_cpu_seconds", "CPU time the daemon used.")
    cpu_s.add_metric([], daemon.cpu_seconds)
    yield cpu_s
    if daemon.components:
        parts = CounterMetricFamily(
            "gpud_daemon_component_cpu_seconds",
            "CPU time each periodic part of the daemon used (the rest: zmq, the loop, requests).",
            labels=["component"],
        )
        for component, seconds in sorted(daemon.components.items()):
            parts.add_metric([component], seconds)
        yield parts
    rss = _gauge("gpud_daemon_rss_bytes", "The daemon's resident memory.")
    rss.add_metric([], float(daemon.rss_bytes))
    yield rss
    clients = _gauge("gpud_daemon_clients", "Connections to the control and events sockets.")
    clients.add_metric([], float(daemon.clients))
    yield clients
    served = CounterMetricFamily(
        "gpud_daemon_requests", "Control requests served, by method.", labels=["method"]
    )
    for method, count in sorted(daemon.requests.items()):
        served.add_metric([method], float(count))
    yield served
    # Every result from the start, 0 or not, so an alert on failures sees the series early.
    deliveries = CounterMetricFamily(
        "gpud_notify_deliveries",
        "Webhook alerts: sent, failed (given up), dropped (too many waiting), retried.",
        labels=["result"],
    )
    for result in DELIVERY_RESULTS:
        deliveries.add_metric([result], float(daemon.notify.get(result, 0)))
    yield deliveries
    if daemon.state_bytes:
        state = _gauge(
            "gpud_state_bytes",
            "The state dir's size by part: database, runs (run dirs, checkpoints left out:"
            " what retention bounds with the database) and checkpoints (never removed).",
            ("part",),
        )
        for part, size in daemon.state_bytes.items():
            state.add_metric([part], float(size))
        yield state
    if daemon.state_runs is not None:
        runs = _gauge("gpud_state_runs", "Run records in the state dir (any state).")
        runs.add_metric([], float(daemon.state_runs))
        yield runs
