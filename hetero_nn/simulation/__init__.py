"""Simulation: a step's task graph run on a described platform without running it
(:mod:`.simulate`) on a described platform and the machine the policies see
(:mod:`.machine`), platform files (:mod:`.platforms`), and the paths a step can take
(:mod:`.paths`: submitted, replayed through the executor, or by the compiled engine).
It sits above the scheduler, whose recordings it reads, and below layers and training.
"""
