"""`retrain plan scaling --plot FILE.png`: efficiency and GPU-hours against the GPU count, on one figure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.errors import InputError
from training.planning.maths import ScalingPlan

FIGURE_INCHES = (8.0, 4.5)
DPI = 100  # 800 x 450 pixels


def check_plot_path(path: Path) -> None:
    """Refuse a file name that cannot hold the figure before anything slow (a measurement) runs."""
    if path.suffix.lower() != ".png":
        raise InputError(f"--plot {path}: expected a file name ending in .png")


def plot_scaling(
    plan: ScalingPlan, path: Path, threshold: float, measured: Sequence[tuple[int, float]] = ()
) -> Path:
    """Draw the plan; `measured` adds (processes, measured efficiency) points beside the fitted curve."""
    check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a build agent or a compute node
    from matplotlib import pyplot as plt

    gpus = [row.gpus for row in plan.rows]
    figure, efficiency_axis = plt.subplots(figsize=FIGURE_INCHES, dpi=DPI)
    try:
        efficiency_axis.plot(gpus, [row.efficiency for row in plan.rows], "o-", color="tab:blue")
        if measured:
            efficiency_axis.plot(
                [count for count, _ in measured],
                [efficiency for _, efficiency in measured],
                "x",
                color="black",
                markersize=9,
                label="measured",
            )
            efficiency_axis.legend(loc="lower left")
        efficiency_axis.axhline(threshold, linestyle="--", color="tab:blue", alpha=0.5)
        efficiency_axis.axvline(plan.recommended_gpus, linestyle=":", color="tab:green")
        # A noisy measurement can beat linear scaling; it stays on the chart.
        top = max([1.05, *(efficiency + 0.05 for _, efficiency in measured)])
        efficiency_axis.set(xscale="log", xlabel="GPUs", ylabel="scaling efficiency", ylim=(0, top))
        efficiency_axis.set_xticks(gpus, [str(count) for count in gpus])
        hours_axis = efficiency_axis.twinx()
        hours_axis.plot(gpus, [row.gpu_hours for row in plan.rows], "s-", color="tab:red")
        hours_axis.set_ylabel("GPU-hours per run", color="tab:red")
        efficiency_axis.set_title(f"recommended: {plan.recommended_gpus} GPUs")
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=DPI)
    finally:
        plt.close(figure)
    return path
