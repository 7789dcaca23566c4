"""PNG plots (matplotlib, the optional 'plot' extra)."""
from __future__ import annotations

from .loss import LossReport


class PlotUnavailable(RuntimeError):
    pass


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("--plot needs the 'matplotlib' package (pip install matplotlib, or the project's "
                              "'plot' extra); the check itself ran without it") from exc
    return plt


def plot_loss(report: LossReport, path: str) -> None:
    """Both curves and the relative error per step, with the threshold and first divergence."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(report.steps, report.ref, label="reference")
    top.plot(report.steps, report.run, label="run")
    top.set_ylabel("loss")
    top.legend()
    top.set_title(f"MRE {report.mre:.3%} ({'pass' if report.passed else 'FAIL'} < {report.threshold:.2%})")
    bottom.plot(report.steps, [abs(r) for r in report.rel], color="tab:red")
    bottom.axhline(report.threshold, color="gray", linestyle="--", label="threshold")
    if report.first_divergence_step is not None:
        bottom.axvline(report.first_divergence_step, color="black", linestyle=":", label="first divergence")
    bottom.set_xlabel("step")
    bottom.set_ylabel("|relative error|")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
