"""The training curve of a :class:`~langtorch.tuning.PromptTuner` as a PNG (matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from langtorch.core import user_path

if TYPE_CHECKING:
    from langtorch.tuning._tuner import PromptTuner


def plot(t: PromptTuner, path: str | Path) -> Path:
    """Save the loss per step and the validation loss/accuracy of ``t.history`` to ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            "PromptTuner.plot needs matplotlib, which is not installed; install the "
            'plot extra: pip install "langtorch-jax[plot]"') from exc
    path = user_path(path, what="PromptTuner.plot: path")
    fig, ax = plt.subplots(figsize=(7, 4))
    losses = np.asarray(t.step_losses, float)
    if losses.size:
        ax.plot(np.arange(1, losses.size + 1), losses, alpha=0.35, label="train loss (step)")
        k = max(1, losses.size // 20)
        smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
        ax.plot(np.arange(k, losses.size + 1), smooth, label=f"train loss ({k}-step mean)")
    vsteps = [h["step"] for h in t.history if h.get("val_loss") is not None]
    if vsteps:
        ax.plot(vsteps, [h["val_loss"] for h in t.history if h.get("val_loss") is not None],
                "o-", color="tab:red", label="val loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    if t.labels and vsteps:
        ax2 = ax.twinx()
        ax2.plot(vsteps, [h["val_accuracy"] for h in t.history
                          if h.get("val_loss") is not None], "s--", color="tab:green",
                 label="val accuracy")
        ax2.set_ylabel("accuracy")
        ax2.set_ylim(0, 1.05)
        ax2.legend(loc="lower right", fontsize=8)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title(f"prompt tuning, P={t.n_tokens}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
