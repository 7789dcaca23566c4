"""Pipeline timeline PNG (skipped cleanly when matplotlib is absent)."""
from __future__ import annotations

from .simulator import SimResult

COLORS = {"F": "#4c9be8", "B": "#e8834c", "I": "#e8b44c", "W": "#8bc34a"}


def write_png(r: SimResult, path: str) -> str | None:
    """Write the timeline; return a message instead when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no timeline PNG written (pip install matplotlib)"
    p = len(r.peak_memory_bytes)
    fig, ax = plt.subplots(figsize=(12, 0.5 * p + 1))
    for s, op, _mb, t0, t1 in r.timeline:
        ax.barh(s, t1 - t0, left=t0, color=COLORS[op], edgecolor="black", linewidth=0.2)
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {i}" for i in range(p)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(f"iteration {r.iteration_time_s:.3f} s, bubble {100 * r.bubble_fraction:.1f}%")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
