"""The bytes a training step holds besides its activations: parameters, gradients, fp32 master
weights and the optimizer's state, and what FSDP2 shards of them (no torch).

The accounting is the one of the ZeRO paper (Rajbhandari et al., "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models"): mixed-precision training with Adam holds per
parameter 2 bytes of half-precision weights, 2 of half-precision gradients and 12 of fp32
state (a master copy of the weights, Adam's two moments): 16 bytes.

- The parameters and their gradients are in the step's own dtype (the captured graph holds
  them: its placeholders and the gradients its backward returns).
- ``master_weights`` (default: on for ``bfloat16``/``float16`` training): an fp32 copy of the
  weights that the optimizer updates; the optimizer's state is then fp32 too. Without master
  weights the state is in the step's dtype (pure bf16 training).
- The optimizer's state, in tensors the size of the parameters: :data:`OPTIMIZERS`.
- ``shards`` (FSDP2, ``fully_shard`` over N GPUs): parameters, gradients, master weights and
  optimizer state are each split over the N GPUs.

>>> s = model_states(1_000_000, optimizer="adamw", dtype="bfloat16")
>>> s.bytes_per_param, s.held_by_graph, s.beside_graph
(16.0, 4000000, 12000000)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import OptionError

OPTIMIZERS = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2, "adafactor": 0}
"""State tensors the size of the parameters each optimizer keeps: SGD without momentum none,
with momentum one buffer, Adam and AdamW two moments (``exp_avg``, ``exp_avg_sq``). Adafactor's
factored moments are a row and a column per matrix, counted as none here."""

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of the training dtypes ``remat fit`` knows."""

DTYPE_NAMES = {"fp32": "float32", "float": "float32", "float32": "float32", "bf16": "bfloat16",
               "bfloat16": "bfloat16", "fp16": "float16", "half": "float16", "float16": "float16"}
"""The spellings of a training dtype, to its name."""


def dtype_name(dtype: str) -> str:
    """The canonical name of a training dtype (``"bf16"`` -> ``"bfloat16"``); an
    :class:`~remat.errors.OptionError` lists the known ones."""
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPE_NAMES:
        raise OptionError(f"unknown training dtype {dtype!r}; use one of bf16, fp16, fp32")
    return DTYPE_NAMES[key]


def optimizer_name(optimizer: str) -> str:
    """The canonical name of an optimizer (``"AdamW"`` -> ``"adamw"``)."""
    key = str(optimizer).lower().replace("_", "-")
    if key not in OPTIMIZERS:
        raise OptionError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    return key


@dataclass(frozen=True)
class ModelStates:
    """The bytes of the model's states on one GPU. ``params``: the parameter count;
    ``param_bytes``, ``grad_bytes``, ``master_bytes``, ``optimizer_bytes``: each kind's bytes
    on one GPU (after sharding); ``shards``: the GPUs FSDP2 shards them over (1: none)."""

    params: int
    optimizer: str
    dtype: str
    master_weights: bool
    shards: int
    param_bytes: int
    grad_bytes: int
    master_bytes: int
    optimizer_bytes: int

    @property
    def total(self) -> int:
        return self.param_bytes + self.grad_bytes + self.master_bytes + self.optimizer_bytes

    @property
    def bytes_per_param(self) -> float:
        """The states' bytes per parameter before sharding (16 for AdamW in bf16 with fp32
        master weights)."""
        return self.total * self.shards / self.params if self.params else 0.0

    @property
    def held_by_graph(self) -> int:
        """Bytes the captured step holds itself (its parameters and gradients), on one GPU."""
        return self.param_bytes + self.grad_bytes

    @property
    def beside_graph(self) -> int:
        """Bytes resident beside the captured step: master weights and optimizer state."""
        return self.master_bytes + self.optimizer_bytes

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total, "bytes_per_param": self.bytes_per_param}


def model_states(params: int, *, optimizer: str = "adamw", dtype: str = "bfloat16",
                 master_weights: bool | None = None, shards: int = 1) -> ModelStates:
    """The bytes of ``params`` parameters' states on one GPU (see the module docstring)."""
    if int(params) < 0:
        raise OptionError(f"a parameter count cannot be negative, got {params}")
    if int(shards) < 1:
        raise OptionError(f"shards (GPUs under FSDP2) must be at least 1, got {shards}")
    dtype, optimizer = dtype_name(dtype), optimizer_name(optimizer)
    half = ITEMSIZE[dtype] == 2
    master = half if master_weights is None else bool(master_weights)
    if master and not half:
        master = False  # fp32 weights are their own master copy
    state_size = 4 if master else ITEMSIZE[dtype]
    n, k = int(params), int(shards)

    def shard(nbytes: int) -> int:
        return -(-nbytes // k)  # the largest shard: FSDP2 pads the last

    return ModelStates(params=n, optimizer=optimizer, dtype=dtype, master_weights=master, shards=k,
                       param_bytes=shard(n * ITEMSIZE[dtype]), grad_bytes=shard(n * ITEMSIZE[dtype]),
                       master_bytes=shard(n * 4) if master else 0,
                       optimizer_bytes=shard(n * state_size * OPTIMIZERS[optimizer]))
