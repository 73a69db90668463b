"""The loss curve of a training run: loss.csv -> a PNG (training and held-out loss, main and MTP heads)."""
import csv
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(csv_path, png_path):
    rows = list(csv.DictReader(open(csv_path)))
    step = [int(r["step"]) for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(step, [float(r["train_loss"]) for r in rows], lw=0.8, alpha=0.6, label="train: next token")
    ax.plot(step, [float(r["train_mtp_loss"]) for r in rows], lw=0.8, alpha=0.6, label="train: MTP (token t+2)")
    held = [(int(r["step"]), float(r["heldout_loss"]), float(r["heldout_mtp_loss"])) for r in rows
            if r["heldout_loss"] != "nan"]
    ax.plot([h[0] for h in held], [h[1] for h in held], "o-", ms=3, label="held-out: next token")
    ax.plot([h[0] for h in held], [h[2] for h in held], "s-", ms=3, label="held-out: MTP")
    ax.set_xlabel("step (12 x 256 tokens)")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title("kjv-moe: qwen35moe, 8 layers + MTP, 32 experts top-8")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
