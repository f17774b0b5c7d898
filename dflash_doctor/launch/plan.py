"""The plan for one launch: the topology (`topology.py`: split, colocated, or auto's pick), which rank
plays which role on which device, the command (torchrun's, or a lone rank's own: `direct.py`), the
environment it gets, the memory each role will need, what the run will write to disk (`disk_plan.py`) and
how long it will train (`time_plan.py`). Built before anything starts, shown by `train --dry-run`, checked
by `checks/launch.py`, recorded with the run.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_base.errors import DoctorError
from dflash_doctor.cache.locations import snapshots_dir
from dflash_doctor.launch.direct import RANK_ENVIRON, direct_command, starts_directly
from dflash_doctor.launch.disk_plan import DiskFacts, DiskWrite, estimate_disk
from dflash_doctor.launch.memory_plan import (
    DEFAULT_CUDA_CONTEXT_BYTES,
    ModelShape,
    PlanInputs,
    RoleEstimate,
    is_floor,
    plan,
)
from dflash_doctor.launch.split import RoleRates
from dflash_doctor.launch.time_plan import TimeEstimate, estimate_time
from dflash_doctor.launch.topology import TopologyChoice, choose_topology
from trainer.runspec.topology import Topology, overlap_mode

if TYPE_CHECKING:  # types only: the gate imports the config loader lazily (gate.load_training_config)
    from transformers import PretrainedConfig

    from dflash_doctor.launch.runs import RunRecord
    from trainer.runspec.config import TrainConfig
    from trainer.runspec.target_shapes import TargetShapes

# What importing torch + transformers costs a CPU process (RSS, measured here: ~330 MiB), rounded up.
CPU_PROCESS_OVERHEAD_BYTES = 512 * 1024**2


@dataclass(frozen=True)
class TorchrunOptions:
    """torchrun's multi-node options, passed through unchanged; one node (`--standalone`) by default."""

    nnodes: int = 1
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    master_addr: str | None = None
    master_port: int | None = None

    def __post_init__(self) -> None:
        """Options torchrun would take and fail on minutes later, or never act on, are refused here, naming the
        option (issue 58, N14: `--master-port 99999` and `--node-rank 5 --nnodes 1` were accepted; issue 59: `--nnodes
        2` without an endpoint or a node rank started torchrun, which waited out its rendezvous)."""
        if self.nnodes < 1:
            raise DoctorError(f"--nnodes: must be >= 1, got {self.nnodes}")
        if self.node_rank is not None and not 0 <= self.node_rank < self.nnodes:
            raise DoctorError(
                f"--node-rank {self.node_rank}: not a node of --nnodes {self.nnodes} (ranks 0 to {self.nnodes - 1})",
                hint="give each node its rank, from 0 to --nnodes - 1",
            )
        if self.nnodes > 1 and not self.rdzv_endpoint and not self.master_addr:
            raise DoctorError(
                f"--nnodes {self.nnodes}: the nodes need a place to meet, and none was given",
                hint="give --rdzv-endpoint HOST:PORT on every node: node 0's address, which every node can reach "
                "(e.g. --rdzv-endpoint 10.0.0.1:29400; under SLURM the first host of $SLURM_JOB_NODELIST)",
            )
        if self.nnodes > 1 and self.node_rank is None:
            raise DoctorError(
                f"--nnodes {self.nnodes}: this node's --node-rank is missing",
                hint=f"give each node its rank, from 0 to {self.nnodes - 1} (under SLURM: --node-rank $SLURM_NODEID)",
            )
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise DoctorError(
                f"--master-port {self.master_port}: not a TCP port (1 to 65535)",
                hint="e.g. --master-port 29500",
            )

    @property
    def standalone(self) -> bool:
        return self.nnodes == 1 and not self.rdzv_endpoint and not self.master_addr

    def arguments(self, nproc_per_node: int) -> list[str]:
        args = ["--standalone"] if self.standalone else [f"--nnodes={self.nnodes}"]
        for flag, value in (
            ("--node-rank", self.node_rank),
            ("--rdzv-backend", self.rdzv_backend),
            ("--rdzv-endpoint", self.rdzv_endpoint),
            ("--rdzv-id", self.rdzv_id),
            ("--master-addr", self.master_addr),
            ("--master-port", self.master_port),
        ):
            if value is not None and not self.standalone:
                args.append(f"{flag}={value}")
        return [*args, f"--nproc-per-node={nproc_per_node}", "--max-restarts=0"]


@dataclass(frozen=True)
class NodeFacts:
    """What the launcher found on this node, all a plan reads of the machine: read once by the gate
    (`gate.node_facts`), so a test can plan for any node by building one."""

    gpu_count: int  # GPUs on this node, as CUDA_VISIBLE_DEVICES leaves them (0: none, or none seen)
    gpu_free_bytes: int | None = None  # the least free memory among them (None: unknown, everything fits)
    cuda_context_bytes: int | None = None  # one process's CUDA context (None: DEFAULT_CUDA_CONTEXT_BYTES)
    disk: DiskFacts = field(default_factory=DiskFacts)  # checkpoints already there, the compile cache's size


@dataclass(frozen=True)
class RoleAssignment:
    rank: int
    role: str  # "target" | "drafter" | "colocated"
    node: int
    device: str  # "cuda:3" or "cpu"
    peers: tuple[int, ...] = ()  # a target: the drafters it feeds; a drafter: the targets feeding it

    @property
    def peers_text(self) -> str:
        """`-> 5-7` (a target feeds), `<- 0-4, 8` (a drafter is fed), `-` (colocated: its own batches)."""
        if self.role == "colocated" or not self.peers:
            return "-"
        return ("-> " if self.role == "target" else "<- ") + rank_ranges(self.peers)


def rank_ranges(ranks: tuple[int, ...] | list[int]) -> str:
    """`0-4, 8, 10-12`: sorted ranks with runs folded."""
    out: list[str] = []
    ordered = sorted(ranks)
    start = prev = ordered[0] if ordered else 0
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ", ".join(out) if ordered else ""


@dataclass
class LaunchPlan:
    config_path: str
    device_type: str  # "cuda" | "cpu"
    targets: int
    drafters: int
    nnodes: int
    nproc_per_node: int
    roles: list[RoleAssignment]
    command: list[str]
    environ: dict[str, str] = field(default_factory=dict)  # what the launch sets or overrides
    memory: dict[str, RoleEstimate] = field(default_factory=dict)
    memory_inputs: PlanInputs | None = None
    choice: TopologyChoice | None = None
    overrides: list[str] = field(default_factory=list)  # every `--set` the workers get, the topology's too
    disk: list[DiskWrite] = field(default_factory=list)  # what the run writes, at its peak
    time: TimeEstimate | None = None  # steps x one step's seconds, and where that figure came from
    launcher: str = "torchrun"  # "torchrun" | "direct": one process in all, started without torchrun

    @property
    def memory_is_floor(self) -> bool:
        """On CPU the memory plan is a lower bound, not a peak (memory_plan.CPU_FLOOR_NOTE)."""
        return self.memory_inputs is not None and is_floor(self.memory_inputs)

    @property
    def mode(self) -> str:
        return self.choice.topology.mode if self.choice else "split"

    @property
    def world_size(self) -> int:
        return self.choice.topology.world_size if self.choice else self.targets + self.drafters

    @property
    def shape(self) -> str:
        """`1 target + 1 drafter ranks`, `8 colocated ranks (target + drafter each)`."""
        return (
            self.choice.topology.describe()
            if self.choice
            else f"{self.targets} target + {self.drafters} drafter"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "config_path": self.config_path,
            "device_type": self.device_type,
            "mode": self.mode,
            "topology": self.choice.to_json() if self.choice else None,
            "targets": self.targets,
            "drafters": self.drafters,
            "nnodes": self.nnodes,
            "nproc_per_node": self.nproc_per_node,
            "roles": [asdict(r) for r in self.roles],
            "launcher": self.launcher,
            "command": self.command,
            "environ": self.environ,
            "memory": {k: v.to_json() for k, v in self.memory.items()},
            "memory_is_floor": self.memory_is_floor,
            "disk": [w.to_json() for w in self.disk],
            "time": self.time.to_json() if self.time else None,
        }


def model_shape(target_config: TargetShapes | PretrainedConfig) -> ModelShape:
    """From the target's shapes (TargetShapes), or a transformers config read into them."""
    from trainer.runspec.target_shapes import TargetShapes  # light: no torch, no transformers

    t = target_config if isinstance(target_config, TargetShapes) else TargetShapes.from_config(target_config)
    return ModelShape(
        hidden=t.hidden_size,
        intermediate=t.intermediate_size,
        layers=t.num_hidden_layers,
        heads=t.num_attention_heads,
        kv_heads=t.num_key_value_heads,
        head_dim=t.head_dim,
        vocab=t.vocab_size,
        tied_embeddings=t.tie_word_embeddings,
    )


def plan_inputs(
    cfg: TrainConfig,
    target_config: TargetShapes | PretrainedConfig,
    device_type: str,
    cuda_context_bytes: int | None = None,
) -> PlanInputs:
    """The shapes the memory plan needs, from a completed trainer config and its target's config."""
    shape = model_shape(target_config)
    on_gpu = device_type == "cuda"
    overhead = (cuda_context_bytes or DEFAULT_CUDA_CONTEXT_BYTES) if on_gpu else CPU_PROCESS_OVERHEAD_BYTES
    captured = cfg.drafter.target_layer_ids
    assert captured is not None, "load_config fills drafter.target_layer_ids (a completed config)"
    return PlanInputs(
        target=shape,
        captured_layers=list(captured),
        drafter_layers=cfg.drafter.layers,
        drafter_intermediate=cfg.drafter.intermediate_size or shape.intermediate,
        block_size=cfg.drafter.block_size,
        anchors=cfg.optim.anchors,
        seq_len=cfg.data.seq_len,
        batch_size=cfg.optim.batch_size,
        in_flight=cfg.topology.in_flight,
        loss_chunk=cfg.drafter.loss_chunk,
        bf16=on_gpu,
        cuda_context_bytes=overhead,
        on_gpu=on_gpu,
        compiled_layers=on_gpu and cfg.drafter.compile_layers,  # as trainer/run/warmup.py compiles them
        heldout=cfg.data.holds_out,  # target ranks then keep the whole target and its LM head
        overlap_capture=overlap_mode(cfg.topology.overlap_capture, on_gpu) != "off",
    )


def choose_device_type(requested: str, gpu_count: int) -> str:
    if requested == "auto":
        return "cuda" if gpu_count > 0 else "cpu"
    return requested


def assign_roles(topology: Topology, device_type: str) -> list[RoleAssignment]:
    """Each rank's role, node and device, as the trainer places them (`trainer.runspec.topology.Topology`: on
    one node ranks [0, N) targets and [N, N+M) drafters; by node, each node's first ranks capture and its
    others train); colocated: every rank both. LOCAL_RANK = GPU."""
    per_node = topology.ranks_per_node
    pairs = topology.pairs()
    roles = []
    for rank in range(topology.world_size):
        peers: tuple[int, ...]
        if topology.colocated:
            role, peers = "colocated", (rank,)
        elif topology.is_target(rank):
            role, peers = "target", tuple(d for t, d in pairs if t == rank)
        else:
            role, peers = "drafter", tuple(t for t, d in pairs if d == rank)
        roles.append(
            RoleAssignment(
                rank=rank,
                role=role,
                node=topology.node_of(rank),
                device=f"cuda:{rank % per_node}" if device_type == "cuda" else "cpu",
                peers=peers,
            )
        )
    return roles


def torchrun_command(
    python: str,
    config_path: Path,
    options: TorchrunOptions,
    nproc_per_node: int,
    overrides: list[str] | None = None,
) -> list[str]:
    """The command the workers start with: the config plus every `--set` the gate validated."""
    sets = [arg for item in overrides or [] for arg in ("--set", item)]
    return [
        python,
        "-m",
        "torch.distributed.run",
        *options.arguments(nproc_per_node),
        "-m",
        "trainer",
        "--config",
        str(config_path),
        *sets,
    ]


def build_launch_plan(
    cfg: TrainConfig,
    config_path: Path,
    target_config: TargetShapes | PretrainedConfig,
    python: str,
    node: NodeFacts,
    options: TorchrunOptions | None = None,
    environ: dict[str, str] | None = None,
    overrides: list[str] | None = None,
    rates: dict[str, RoleRates] | None = None,
    store_dir: Path | None = None,
    records: list[RunRecord] | None = None,
    config_text: str | None = None,
) -> LaunchPlan:
    """`node`: this node's GPUs, their least free memory, the CUDA context's size and what is on disk
    (`auto` keeps only what fits); `rates`: the per-role rates table (default: the shipped one); `store_dir`:
    where the snapshot after a success goes (default: the store under DFLASH_DOCTOR_HOME); `records`: the
    past runs a measured step time may come from (default: the run store's); `config_text`: the config as
    launched (default: read from `config_path`), which a past run must share."""
    options = options or TorchrunOptions()
    device_type = choose_device_type(cfg.run.device, node.gpu_count)
    inputs = plan_inputs(cfg, target_config, device_type, node.cuda_context_bytes)
    choice = choose_topology(
        cfg, inputs, device_type, node.gpu_count, options.nnodes, node.gpu_free_bytes, rates
    )
    topology = choice.topology
    world = topology.world_size
    nproc = topology.ranks_per_node
    sets = [*(overrides or []), *choice.overrides]
    direct = starts_directly(cfg.topology.launcher, options.nnodes, options.standalone, nproc, world)
    if direct:  # the rank's own command, and the rank's variables shown with the plan's environment
        command = direct_command(python, config_path, sets)
        environ = {**(environ or {}), **RANK_ENVIRON}
    else:
        command = torchrun_command(python, config_path, options, nproc, sets)
    return LaunchPlan(
        config_path=os.fspath(config_path),
        device_type=device_type,
        targets=topology.targets,
        drafters=topology.drafters,
        nnodes=options.nnodes,
        nproc_per_node=nproc,
        roles=assign_roles(topology, device_type),
        command=command,
        environ=dict(environ or {}),
        memory=plan(inputs, topology.colocated),
        memory_inputs=inputs,
        choice=choice,
        overrides=sets,
        disk=estimate_disk(
            cfg,
            inputs,
            topology.drafters,
            device_type,
            node.disk,
            Path(cfg.output_dir).resolve(),
            store_dir or snapshots_dir(),
            cfg.optim.steps,
        ),
        launcher="direct" if direct else "torchrun",
        time=estimate_time(
            cfg,
            inputs,
            device_type,
            choice,
            _config_text(config_path) if config_text is None else config_text,
            command,
            _past_runs() if records is None else records,
        ),
    )


def _config_text(config_path: Path) -> str:
    """The config file as the gate read it (a path that cannot be read matches no past run)."""
    try:
        return Path(config_path).read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _past_runs() -> list[RunRecord]:
    """The run store's readable records (damaged ones are skipped, as `runs` skips them)."""
    from dflash_doctor.launch.runs import RunStore

    return RunStore().all()
