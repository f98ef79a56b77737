"""Scheduling policies: which worker runs a ready task (:mod:`.policies`), and the one
list scheduler they and the compiled engine share (:mod:`.list_scheduling`)."""

from .policies import (POLICIES, Dmda, Eager, Heft, Policy, Random, WorkStealing, make_policy,
                       policy_class)

__all__ = ["POLICIES", "Dmda", "Eager", "Heft", "Policy", "Random", "WorkStealing",
           "make_policy", "policy_class"]
