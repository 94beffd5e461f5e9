"""A training run's curves as a PNG: training loss by step, and validation accuracy where it was measured."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.errors import InputError

FIGURE_INCHES = (8.0, 4.5)
DPI = 100  # 800 x 450 pixels

Series = Sequence[tuple[int, float]]


def plot_training_curves(loss: Series, accuracy: Series, path: Path, title: str) -> Path:
    """Draw `loss` (step, value) on the left axis and `accuracy` (step, value) on the right one."""
    if path.suffix.lower() != ".png":
        raise InputError(f"plot {path}: expected a file name ending in .png")
    if not loss:
        raise InputError(f"plot {path}: the run logged no loss; expected a finished or resumed training run")
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a build agent or a compute node
    from matplotlib import pyplot as plt

    figure, loss_axis = plt.subplots(figsize=FIGURE_INCHES, dpi=DPI)
    try:
        loss_axis.plot(*zip(*sorted(loss), strict=True), color="tab:blue", linewidth=1)
        loss_axis.set(xlabel="step", ylabel="training loss", title=title)
        if accuracy:
            accuracy_axis = loss_axis.twinx()
            accuracy_axis.plot(*zip(*sorted(accuracy), strict=True), "o", color="tab:green")
            accuracy_axis.set_ylabel("validation accuracy", color="tab:green")
            accuracy_axis.set_ylim(0, 1.0)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=DPI)
    finally:
        plt.close(figure)
    return path
