"""A zoo of benchmark cases: the seeds' patterns and standard models, at three sizes.

>>> from remat import zoo
>>> zoo.names("pattern")[:3]
['cos-cos', 'dropout-mask', 'gelu-erf']
>>> case = zoo.build("mlp", "tiny")
>>> out = case.model(*case.inputs)
>>> case.loss(out).backward()

Every entry is built from code and a seed: no downloads, random weights, plain torch CNNs
(no torchvision), transformers models from their configs. Sizes:

- ``tiny``: for tests; each case builds and runs a forward+backward eagerly in well under a
  second on a CPU.
- ``small``: sensible on a 2-core CPU: an eager training step takes roughly 0.05-1 s.
- ``full``: the sizes of the papers (seeds/000 Tables 1-3, seeds/003), for a GPU.

``batch=`` overrides the batch size of every entry that has a batch dimension (for
max-batch-size searches); entries without one (``cos-cos``, ``dropout-mask``,
``gelu-erf``) have ``case.batch is None`` and reject ``batch=``.

Dropout is switched off in every model (``p=0``) so that a training step is deterministic
and every method computes the same gradients; ``dropout-mask`` is the random-op case.
Each module's docstring lists its entries' shapes at each size.
"""

from . import patterns, qehvi, mlp, transformers_models, cnn  # noqa: F401 - they register, in this order
from .registry import KINDS, SIZES, Case, build, describe, names, register

__all__ = ["Case", "SIZES", "KINDS", "names", "build", "describe", "register"]
