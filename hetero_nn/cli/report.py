"""Lines ``hetero-nn train`` prints about what it decided while running.

This module owns the one-line reports of decisions made at the first step: where
``--pipeline P`` cut the model (:func:`pipeline_cut`). Each is printed once, on stderr.
"""

from __future__ import annotations


def _worker_name(worker) -> str:
    return getattr(worker, "name", None) or str(worker)


def pipeline_cut(pipeline) -> str:
    """Where the pipeline cut the model: each stage's blocks (plan indices and classes),
    its workers and its predicted seconds."""
    parts = []
    for i, st in enumerate(pipeline.stages):
        names = [type(b).__name__ for b in pipeline.blocks[st.first:st.end]] \
            if pipeline.blocks else []
        seconds = "" if st.predicted_seconds is None \
            else f", predicted {1e3 * st.predicted_seconds:.3g} ms"
        blocks = f"block {st.first}" if st.end - st.first == 1 \
            else f"blocks {st.first}-{st.end - 1}"
        parts.append(f"stage {i}: {blocks} ({', '.join(names)}) on "
                     f"{', '.join(_worker_name(w) for w in st.workers)}{seconds}")
    return (f"pipeline of {len(pipeline.stages)} stages ({pipeline.schedule}): "
            + "; ".join(parts))
