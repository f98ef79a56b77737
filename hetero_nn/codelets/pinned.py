"""The variants codelets run when results must be reproducible: ``Runtime()``'s default.

Variants of one operation agree to rounding, not bit for bit (a Numba loop and a
BLAS call sum in different orders, as cuDNN's algorithms do in PyTorch). A
performance model picks variants by timing, so two runs could mix them
differently; a pinned runtime (``Runtime(deterministic=True)``, the default, and
the CLI unless ``--no-deterministic``) runs, per codelet and device kind, the
first variant of this table the codelet has, and its first declared variant for
a kind the table names none of. A derived codelet (``"<name>.overwrite"``,
see :func:`~hetero_nn.codelets.reduce.overwriting`) follows its base's entry, so
every contribution to one gradient runs the same kernel. A codelet whose variants give
the same bits (``Codelet.same_bits``: the dense and event-driven variants of the dense
layer on spikes) keeps those beside its pinned one, and the performance model chooses
among them. With REDUX trees whose
shape does not depend on the schedule, runs then give the same bits whatever the
policy, the worker count or the executor.

The choices are the fastest in ``benchmarks/bench_codelets.py``: the convolutions'
partition GEMMs (``cpu:gemm``, which hands small-channel, large-image and grouped layers
to the im2col kernels; ``benchmarks/bench_conv_gemm.py``; ``cpu:unrolled`` and
``cpu:winograd`` run them where their own kernels do not take the layer), im2col for the fused
convolution chains, the Numba kernels, BLAS for the dense layers, and for the fused dense +
ReLU chains their ``cpu:blas`` variants (BLAS and the ReLU in one Numba call: 1.6-3.6x
the Numba loops of their ``cpu`` variants on LeNet-5's layers,
``benchmarks/bench_gil.py`` and ``bench_fused.py``). The dense layers' ``cpu:blas``
variants are their NumPy references' operations in one Numba kernel (BLAS through
Numba's ``np.dot``), so a replayed step runs them in the engine's compiled loop; with
the BLAS of NumPy's and SciPy's wheels they give the references' bits
(``benchmarks/blas_bits.py``), which they replaced as the pinned variant. The dense
layers fed by spikes pin their event-driven variant (their ``cpu`` variant, which
gives the same bits, stays a candidate for the performance model).
Changing an entry changes the last bits of every training run (and of a resumed one
against its checkpoint): do it deliberately.
"""

from __future__ import annotations

#: Codelet name (``"*"``: every codelet not named) -> variant names, preferred first.
PINNED_VARIANTS = {
    "*": ("cpu:im2col", "cpu", "cuda"),
    **{name: ("cpu:winograd", "cpu:unrolled", "cpu:gemm", "cpu:im2col", "cuda") for name in (
        "conv2d_fwd", "conv2d_fwd_nobias", "conv2d_bwd_input", "conv2d_bwd_params",
        "conv2d_bwd_weight")},
    **{name: ("cpu:blas", "cuda") for name in (
        "dense_fwd", "dense_fwd_nobias", "dense_bwd_input", "dense_bwd_params",
        "dense_bwd_weight", "dense_relu_fwd", "dense_relu_bwd", "dense_relu_bwd_params")},
    **{name: ("cpu:events", "cuda") for name in (
        "spike_dense_fwd", "spike_dense_fwd_nobias", "spike_dense_bwd_params",
        "spike_dense_bwd_weight")},
}
