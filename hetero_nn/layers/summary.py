"""What a model looks like: ``print(model)`` and ``model.summary(input_shape)``.

``layer_repr`` writes PyTorch's nested listing (``(index): Layer(extra_repr)``,
containers indented), and once the model is built, each line ends with the
layer's per-sample output shape and parameter count. ``summary`` writes
torchsummary's table: one row per layer in forward order (a Residual's own row,
with no parameters of its own, after its children's, as torchsummary's hooks
fire), output shapes with ``-1`` for the batch, parameter counts, and the totals.
"""

from __future__ import annotations

_RULE = 72


def count_parameters(layer) -> int:
    """Number of trainable values in ``layer`` (sublayers included)."""
    return sum(p.data.size for p in layer.parameters())


def _note(layer) -> str:
    if layer.output_shape is None:
        return ""
    return f"  # -> {list(layer.output_shape)}, {count_parameters(layer):,} parameters"


def layer_repr(layer, top=True) -> str:
    """PyTorch's ``repr`` of a module tree; with shapes and counts once built."""
    children = layer.named_children()
    head = f"{type(layer).__name__}({layer.extra_repr()}"
    if not children:
        return head + ")"
    lines = [head]
    for name, child in children:
        text = layer_repr(child, top=False).replace("\n", "\n  ")
        first, _, rest = text.partition("\n")
        lines.append(f"  ({name}): {first}{_note(child)}" + ("\n" + rest if rest else ""))
    return "\n".join(lines) + "\n)"


def summary_rows(model, prefix=""):
    """``(name, type, output shape, parameters)`` for every layer, in forward order."""
    rows = []
    for name, child in model.named_children():
        path = f"{prefix}{name}"
        if child.named_children():
            rows.extend(summary_rows(child, path + "."))
            if type(child).__name__ == "Sequential":
                continue  # torchsummary has no row for a Sequential
        own = 0 if child.named_children() else count_parameters(child)  # as torchsummary
        rows.append((path, type(child).__name__, child.output_shape, own))
    return rows


def summary(model, input_shape=None, dtype=None) -> str:
    """torchsummary's table for ``model`` (built first for ``input_shape`` if given)."""
    if input_shape is not None:
        model.build(input_shape, dtype if dtype is not None else model.dtype)
    if model.output_shape is None:
        raise ValueError("summary: the model is not built; give input_shape=(C, H, W)")
    rows = summary_rows(model)
    lines = ["-" * _RULE, f"{'Layer (type)':>30s} {'Output Shape':>25s} {'Param #':>15s}",
             "=" * _RULE]
    for path, kind, shape, count in rows:
        lines.append(f"{path + ' (' + kind + ')':>30s} {str([-1, *shape]):>25s} {count:>15,d}")
    total = count_parameters(model)
    itemsize = model.dtype.itemsize
    buffers = sum(b.data.size for _, b in model.named_buffers())
    lines += ["=" * _RULE,
              f"Input shape: {list(model.input_shape)} ({model.dtype.name})",
              f"Total params: {total:,}",
              f"Trainable params: {total:,}",
              "Non-trainable params: 0",
              f"Buffer values (running statistics): {buffers:,}",
              f"Params size (MB): {total * itemsize / 2 ** 20:.2f}",
              "-" * _RULE]
    return "\n".join(lines)
