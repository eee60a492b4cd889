"""The graph IR, the cost model, plans and solvers never import torch (DESIGN.md: torch only in
capture, lowering, bench and zoo), and the "remat" backend name resolves through the package's
entry point."""

import pkgutil
import subprocess
import sys

import remat

TORCH_FREE = ("graph", "cost", "plans", "solvers", "step", "transforms", "data")
TORCH_FREE_MODULES = ("remat.eager.plan",)  # torch-free modules of other packages


def torch_free_modules() -> list[str]:
    out = []
    for pkg in TORCH_FREE:
        out.append(f"remat.{pkg}")
        path = [str(p) for p in (remat.__path__[0] + "/" + pkg,)]
        out += [m.name for m in pkgutil.walk_packages(path, prefix=f"remat.{pkg}.")]
    return out + list(TORCH_FREE_MODULES)


def test_every_module_of_the_torch_free_layers_imports_without_torch():
    modules = torch_free_modules()
    assert len(modules) > 25 and "remat.solvers.checkmate.milp" in modules
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module(m)\n"
            "    assert 'torch' not in sys.modules, f'{m} imported torch'\n"
            "import remat\n"  # the package itself too: compile and plan load torch lazily
            "from remat.graph.examples import cos_cos_graph\n"
            "assert remat.solve(cos_cos_graph()).saved_names == ['add_2']\n"
            "assert remat.solve(cos_cos_graph(), 'checkmate', budget=1.0).feasible\n"
            "assert 'torch' not in sys.modules, 'planning imported torch'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_backend_name_resolves_through_entry_point():
    code = ("import torch; from torch._dynamo.backends.registry import lookup_backend; "
            "import remat.lower.backend as b; assert lookup_backend('remat') is b.remat_backend")
    subprocess.run([sys.executable, "-c", code], check=True)
