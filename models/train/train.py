"""Trains the shipped qwen35moe model: corpus -> tokenizer -> model -> checkpoint, loss log and loss curve.

  /usr/bin/python3 models/train/train.py --out DIR [--steps N] [--seed S]

Deterministic for a seed on one machine (one thread, fixed sampling order). The objective is next-token
cross-entropy, plus 0.3 x the MTP block's cross-entropy for token t+2, plus 0.01 x the routers' balance loss.
15 % of the training windows come from a stream of ChatML conversations built from the corpus (a verse from the
user, the verses that follow it from the assistant), so the chat template means something to the model.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe     # noqa: E402
import corpus  # noqa: E402
import model   # noqa: E402

VOCAB = 4096
SEQ = 256
BATCH = 12
CHAT_SHARE = 0.15
MTP_WEIGHT = 0.3
AUX_WEIGHT = 0.01


def chat_stream(tok, train_docs, rng, count):
    """ChatML conversations: a verse, then the two verses after it, as a token stream."""
    start, end, nl = tok.special("<|im_start|>"), tok.special("<|im_end|>"), tok.encode("\n")
    out = []
    for _ in range(count):
        verses = rng.choice(train_docs).rstrip("\n").split("\n")
        if len(verses) < 3:
            continue
        i = rng.randrange(len(verses) - 2)
        out += [start] + tok.encode("user\n" + verses[i]) + [end] + nl
        out += [start] + tok.encode("assistant\n" + "\n".join(verses[i + 1:i + 3])) + [end] + nl
    return out


def text_stream(tok, docs):
    eot = tok.special("<|endoftext|>")
    out = []
    for d in docs:
        out += [eot] + tok.encode(d)
    return out


def windows(stream, rng, n):
    starts = [rng.randrange(len(stream) - SEQ - 2) for _ in range(n)]
    return torch.tensor([stream[s:s + SEQ + 2] for s in starts], dtype=torch.long).reshape(n, SEQ + 2)


def losses(m, batch):
    """(next-token loss, MTP loss) of a [B, SEQ + 2] batch."""
    h = m.hidden(batch[:, :SEQ])
    main = F.cross_entropy((h @ m.output.t()).reshape(-1, VOCAB), batch[:, 1:SEQ + 1].reshape(-1))
    mtp = m.mtp_logits(h, batch[:, 1:SEQ + 1])
    return main, F.cross_entropy(mtp.reshape(-1, VOCAB), batch[:, 2:SEQ + 2].reshape(-1))


def lr_at(step, steps, peak, warmup=40):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    train_docs, held_docs = corpus.split(corpus.chapters())
    with open(os.path.join(args.out, "heldout.txt"), "w") as f:
        f.write("".join(held_docs))
    t0 = time.time()
    vocab, merges = bpe.train(train_docs, VOCAB)
    bpe.write_hf(vocab, merges, args.out)
    tok = bpe.Tokenizer(vocab, merges)
    text = text_stream(tok, train_docs)
    chat = chat_stream(tok, train_docs, rng, 20000)
    held = text_stream(tok, held_docs)
    print(f"tokenizer {time.time() - t0:.0f} s; train tokens {len(text)}, chat tokens {len(chat)}, "
          f"held-out tokens {len(held)}", flush=True)
    held_batch = windows(held, random.Random(0), 16)

    c = model.Config(vocab=VOCAB)
    m = model.Model(c)
    decay = [p for n, p in m.named_parameters() if p.dim() >= 2 and "router" not in n]
    rest = [p for n, p in m.named_parameters() if not (p.dim() >= 2 and "router" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    log = open(os.path.join(args.out, "loss.csv"), "w")
    log.write("step,seconds,lr,train_loss,train_mtp_loss,heldout_loss,heldout_mtp_loss\n")
    t0 = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr)
        n_chat = sum(rng.random() < CHAT_SHARE for _ in range(BATCH))
        batch = torch.cat([windows(text, rng, BATCH - n_chat), windows(chat, rng, n_chat)])
        main_loss, mtp_loss = losses(m, batch)
        (main_loss + MTP_WEIGHT * mtp_loss + AUX_WEIGHT * m.aux_loss()).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        held_main = held_mtp = float("nan")
        if step % 20 == 0 or step == args.steps - 1:
            with torch.no_grad():
                hm, ht = losses(m, held_batch)
            held_main, held_mtp = hm.item(), ht.item()
            torch.save({"config": c.as_dict(), "state": m.state_dict(), "step": step + 1},
                       os.path.join(args.out, "checkpoint.pt"))
        log.write(f"{step},{time.time() - t0:.1f},{lr_at(step, args.steps, args.lr):.6f},{main_loss.item():.4f},"
                  f"{mtp_loss.item():.4f},{held_main:.4f},{held_mtp:.4f}\n")
        log.flush()
        print(f"step {step} {time.time() - t0:.0f}s loss {main_loss.item():.3f} mtp {mtp_loss.item():.3f} "
              f"held {held_main:.3f}", flush=True)
    with open(os.path.join(args.out, "train.json"), "w") as f:
        json.dump({"seed": args.seed, "steps": args.steps, "batch": BATCH, "seq": SEQ, "lr": args.lr,
                   "seconds": round(time.time() - t0), "config": c.as_dict(), "train_tokens": len(text),
                   "chat_tokens": len(chat), "heldout_tokens": len(held)}, f, indent=1)


if __name__ == "__main__":
    main()
