"""Equivalence verification: an e-graph proof over the parallel term language (egglog), backed by
numeric testing. See docs/verify.md.

Note: ``prism/__init__.py`` exports the function :func:`verify` as ``prism.verify``, which shadows this
package as an attribute of ``prism``; import from it with ``from prism.verify import ...``.
"""

from prism.verify.api import VerifyResult, verify
from prism.verify.egraph import FormalResult, Limits, ProofStats, prove
from prism.verify.numeric import (
                                  NumericResult,
                                  Runner,
                                  choose_instantiations,
                                  compiled_runner,
                                  interpreter_runner,
                                  numeric_check,
)

__all__ = ["FormalResult", "Limits", "NumericResult", "ProofStats", "Runner", "VerifyResult", "choose_instantiations",
           "compiled_runner", "interpreter_runner", "numeric_check", "prove", "verify"]
