"""``algo=xsarsa``: Expected SARSA on rlspeed's Q-learning table.

An algorithm is an ``AlgoSpec``: its hyperparameters (a dataclass; ``algo.*`` on the command
line), its checks, and its parts named as "module:attribute", imported only when a run
needs them. This one has a torch learner and nothing else, so it trains with backend=torch
on any engine; other stacks are refused in one line naming that one.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlspeed.core.algos import AlgoSpec
from rlspeed.core.algos.qlearn import QLearnConfig
from rlspeed.core.algos.qlearn import validate as validate_qlearn


@dataclass(frozen=True)
class ExpectedSarsaConfig(QLearnConfig):
    # Q-learning's step size, discount and exploration schedule, with their defaults.
    name: str = "xsarsa"


SPEC = AlgoSpec(
    name="xsarsa",
    schema=ExpectedSarsaConfig,
    action_kinds=("discrete",),
    observation_kinds=("categorical",),
    learners={"torch": "rlspeed_example.xsarsa_torch:ExpectedSarsaTable"},
    fused=None,
    # Q-learning's checks: the ranges, a task with a tabular state, a table that fits.
    validate=validate_qlearn,
)
