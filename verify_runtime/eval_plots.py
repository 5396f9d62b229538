"""Figures for ``sparkgate eval drafter``: reliability diagrams and acceptance curves."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display
import matplotlib.pyplot as plt
import torch

from sparkgate.policies.calibration import STS, reliability

from .evaluation import Blocks


def reliability_figure(blocks: Blocks, sts: STS | None, path: Path) -> None:
    """Per depth: observed survival frequency against predicted survival, raw and after STS."""
    labels = blocks.labels
    curves = {"raw": blocks.confidence.cumprod(-1)}
    if sts is not None:
        curves["STS"] = sts(blocks.confidence)
    gamma = labels.shape[1]
    cols = (gamma + 1) // 2
    fig, axes = plt.subplots(2, cols, figsize=(3 * cols, 6), sharex=True, sharey=True, squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= gamma:
            ax.axis("off")
            continue
        ax.plot([0, 1], [0, 1], color="0.7", lw=1)
        for (name, survival), color in zip(curves.items(), ("tab:red", "tab:blue")):
            bins = reliability(survival[:, k], labels[:, k])
            ax.plot([b["mean_p"] for b in bins], [b["freq_y"] for b in bins], "o-", ms=3, color=color, label=name)
        ax.set_title(f"depth {k + 1}")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
    axes[0, 0].legend(loc="upper left")
    fig.supxlabel("predicted survival S_k")
    fig.supylabel("observed 1[a* ≥ k]")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def acceptance_figure(report: dict, path: Path) -> None:
    """Survival S_k and conditional acceptance c_k by depth, per domain and drafter."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    styles = ["-", "--", ":", "-."]
    for i, (domain, section) in enumerate(report["domains"].items()):
        for style, name in zip(styles, report["drafters"]):
            depth = torch.arange(1, len(section[name]["survival"]) + 1)
            label = f"{domain} / {name} (mean {section[name]['mean_accepted']:.2f})"
            for ax, key in ((left, "survival"), (right, "conditional_acceptance")):
                ax.plot(depth, section[name][key], style, color=f"C{i}", marker="o", ms=3, label=label)
    left.set(title="prefix survival S_k", xlabel="depth k", ylim=(0, 1))
    right.set(title="conditional acceptance c_k", xlabel="depth k", ylim=(0, 1))
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
