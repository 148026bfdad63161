"""``prism bench``: Prism against PyTorch, torch.compile, JAX and ONNX Runtime on WORKLOADS.md, with
each case's roofline bound measured on the machine (see docs/bench.md).

    python -m prism.bench --quick            # or prism.bench.main(["--quick"])
"""

from prism.bench.cli import main
from prism.bench.results import PRISM_NOTE, CaseResult, Report, SystemResult
from prism.bench.run import Config, run, run_case
from prism.bench.systems.prism_system import prism_runner

__all__ = ["PRISM_NOTE", "CaseResult", "Config", "Report", "SystemResult", "main", "prism_runner", "run",
           "run_case"]
