"""The graph IR and the solvers never import torch (DESIGN.md: torch only in capture/lowering)."""

import subprocess
import sys


def test_solvers_import_without_torch():
    code = ("import sys, remat.solvers.mincut, remat.graph.io, remat.plans, remat.plans.saved_set; "
            "from remat.graph.examples import cos_cos_graph; "
            "assert remat.solvers.solve(cos_cos_graph()).saved_names == ['add_2']; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_backend_name_resolves_through_entry_point():
    code = ("import torch; from torch._dynamo.backends.registry import lookup_backend; "
            "import remat.api; assert lookup_backend('remat') is remat.api.remat_backend")
    subprocess.run([sys.executable, "-c", code], check=True)
