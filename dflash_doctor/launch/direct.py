"""A launch of one process in all starts `python -m trainer` itself, without torchrun.

For one rank on one node torchrun's elastic agent adds nothing (`--max-restarts=0`, `--standalone`: no
restart, no peer to meet) but its start-up: its own interpreter, `import torch`, a c10d store and its
rendezvous, 1.8 s of a warm qwen3-8b-b16 launch's 13.1 s to the first step on an H200 (issue 40 §2). HF
accelerate likewise runs a lone process directly. The launcher then gives the rank the environment torchrun
would have (`rank_environ`), without MASTER_ADDR/MASTER_PORT: the trainer joins a process group of one on a
store in its own process (trainer/run/train.py:join_process_group), so no port is taken. Everything around
the process is the launcher's already (supervise.py: its own session, the stop signals, the exit code; the
trainer's parent watch: it never outlives the launcher). `topology.launcher = "torchrun"` keeps torchrun.
"""

from __future__ import annotations

from pathlib import Path

# What torchrun's agent gives its one worker (torch/distributed/elastic/agent/server/local_elastic_agent.py)
# that means anything without the agent: the trainer reads RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK and
# GROUP_WORLD_SIZE; the rest is there for code that asks (torch's own, a user's hooks).
RANK_ENVIRON = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_WORLD_SIZE": "1",
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "ROLE_RANK": "0",
    "ROLE_WORLD_SIZE": "1",
    "ROLE_NAME": "default",
}
NCCL_ASYNC_ERRORS = "TORCH_NCCL_ASYNC_ERROR_HANDLING"  # torchrun's default "1" unless already set
# What only torchrun's agent and rendezvous mean: inherited from a shell that runs inside another job, they
# would point the lone rank at a store that is not its own (MASTER_ADDR selects env:// in the trainer).
AGENT_ONLY = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_")


def starts_directly(launcher: str, nnodes: int, standalone: bool, nproc_per_node: int, world: int) -> bool:
    """One process in all, on one node that meets no other (no rendezvous endpoint, no master address), and
    `topology.launcher` left at "auto"."""
    return launcher == "auto" and nnodes == 1 and standalone and nproc_per_node == 1 and world == 1


def direct_command(python: str, config_path: Path, overrides: list[str] | None = None) -> list[str]:
    """The rank's command: what torchrun would run after its own arguments (`-m trainer ...`)."""
    sets = [arg for item in overrides or [] for arg in ("--set", item)]
    return [python, "-m", "trainer", "--config", str(config_path), *sets]


def rank_environ(environ: dict[str, str]) -> dict[str, str]:
    """`environ` as torchrun would pass it to its one worker: the rank variables set, the agent's removed."""
    kept = {k: v for k, v in environ.items() if not k.startswith(AGENT_ONLY)}
    return {**kept, **RANK_ENVIRON, NCCL_ASYNC_ERRORS: environ.get(NCCL_ASYNC_ERRORS, "1")}
