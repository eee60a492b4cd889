"""The simulator: the one judge of every plan's memory and time.

:func:`simulate` replays a :class:`~remat.plans.schedule.Schedule` on its Graph. It checks that
every value a statement reads is resident, that nothing is computed while still resident
or freed twice, that inputs, parameters and kept values (outputs, gradients) are never
freed and that every required node is computed. It returns the peak memory, the memory
timeline (bytes resident after each statement, as seeds/001's U), and the predicted time
under the cost model (:mod:`remat.cost.model`).

Under a fusing compiler (``CostModel.fused_memory``) a value fused kernels keep in registers
takes no memory but keeps what it reads alive (:mod:`.fusion`), and a kernel that reads
an input for the last time writes its output into that input's storage when both have the
same size (inductor's ``inplace_buffers``): the two are not allocated together. A forward
value the backward computes does so too, into a saved value (AOTAutograd donates the saved
tensors to the backward); nothing is written into what ATen scattered into, nor into what a
later reader reads again to compute the value inside itself (below). For a graph
captured on a CPU, a free between kernels waits for the next extern kernel (a matmul, a
convolution): inductor's C++ backend emits consecutive kernels as one function and frees what
died after it. Graph inputs inductor copies to channels-last for its convolutions
(``meta["layout_copy"]``) are resident from the step's start to their input's last reader.

Memory counts the inputs and parameters (resident throughout, Checkmate's constant
overhead) plus every computed value until it is freed; a view shares its base's storage,
which stays allocated while either is resident (:func:`remat.cost.model.storage`); a value is counted from the moment
its op starts, while its inputs are still resident, so the peak includes each op's inputs
and output together.

>>> from remat.graph.examples import cos_cos_graph
>>> from remat.plans.schedule import schedule_from_saved_set
>>> g = cos_cos_graph()
>>> r = simulate(schedule_from_saved_set(g, ["add_2"]))
>>> r.valid, r.peak_bytes // 4096  # 4 inputs, add_2 saved, cos_1, the tangent, cos and sin
(True, 9)

The rules live in one module per statement kind: :mod:`.compute`, :mod:`.free`,
:mod:`.copies` (offload, reload), with :mod:`.fusion` (which computes write to memory),
:mod:`.inplace` (in-place writes), :mod:`.streams` (the two clocks), :mod:`.state` (what a
replay tracks) and :mod:`.result`. :mod:`.replay` walks the statements in order;
:mod:`.vectorised` computes the same result with array operations for compute/free schedules
judged without a fusing compiler (a min cut's plan of a large graph).
"""

from __future__ import annotations

from ...cost.model import CostModel, default_cost_model
from ...cost.transfer import Link, link_for_graph
from ...graph.graph import Graph
from ..schedule import COPIES, Schedule
from .fusion import FAR, HEAVY_OPS, REALIZE_READS, allocations as _allocations
from .replay import replay
from .result import SimResult
from .state import Replay
from .torch_order import TORCH_PARTITIONS, in_inductor_order
from .vectorised import vectorised

__all__ = ["FAR", "HEAVY_OPS", "REALIZE_READS", "SimResult", "simulate"]


def simulate(schedule: Schedule, cost_model: CostModel | None = None, *,
             timeline: bool = True, kernel_groups: bool = True, link: Link | None = None) -> SimResult:
    """Replay ``schedule`` on its graph; see the module docstring for the rules.
    A partition of PyTorch's partitioners (``schedule.meta["solver"]``: ``torch-mincut``, ...)
    under a fusing compiler is judged in inductor's order (:mod:`.torch_order`; statement
    indices then refer to that order). ``kernel_groups=False`` frees values where the schedule says even in a CPU kernel group
    (see below): for a partition inductor compiles in its own order. ``link``: the host link
    offloads and reloads use (:func:`remat.cost.transfer.link_for_graph` by default).

    **Two streams** (seeds/004 Section 6.2, MAGIS's simulator), timed as the lowering runs
    them (:mod:`remat.lower.offload`): computes run one after another on the compute stream,
    each taking its share of the fused prediction (the traffic, arithmetic and kernel launches it
    adds to :meth:`CostModel.seconds`: a view, or a kernel fused into its reader, takes no
    time; on graphs with profiled costs or a step run op by op, its op cost) and starting once the reloads it reads are
    done; an ``offload`` or ``reload`` runs on the copy stream (on a CPU, on the one stream)
    for ``link.seconds(bytes)``, starting when both streams have reached it in program order
    (PyTorch's copy stream waits for the compute stream), and a reload not before its value's
    offload is done. At an offloaded value's ``free`` compute waits until its copy is done
    (the lowering's ``ao.wait_tensor`` stands there), then its device memory is released; a
    reloaded value takes device memory from the reload's statement (where its buffer is
    allocated) to its next free. The predicted time is the single-stream prediction plus
    ``wait_seconds``: the time compute waited for copies, and copies that ran past compute's
    end."""
    g: Graph = schedule.graph
    cm = cost_model or default_cost_model(g)
    if cm.fused_memory and (schedule.meta or {}).get("solver") in TORCH_PARTITIONS:
        schedule = in_inductor_order(schedule)  # compiled as inductor would (.torch_order)
    if not cm.fused_memory:
        fast = vectorised(schedule, cm, timeline=timeline)
        if fast is not None:  # None: copies, or a problem the replay names
            return fast
    copies = any(st.op in COPIES for st in schedule.statements)
    link = link or (link_for_graph(g, cm) if copies else Link(float("inf")))
    return replay(schedule, Replay(schedule, cm, link, timeline=timeline, kernel_groups=kernel_groups,
                                   copies=copies))
