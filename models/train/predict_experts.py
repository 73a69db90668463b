"""Expert prediction on the trained model (issue 42 part 4, measured before anything is built): how often the
next layer's router, applied to the current layer's state, picks the experts that layer will really pick.

At layer l the backbone knows h1_l (the residual stream after layer l's mixer) when it sends layer l's expert
requests. Predicting layer l+1's experts as top-M of softmax(router_{l+1} · RMSNorm(h1_l, post_attention_norm_{l+1}))
would let their requests travel with layer l's; layer l+1 then needs no round trip of its own only when every
expert it really picks (8 per token, all tokens of the step) was predicted. Reads the BF16 file (weights as
exported, model.py's module tree), runs the held-out chunks, prints JSON:

  /usr/bin/python3 models/train/predict_experts.py --model models/kjv-moe-bf16.gguf --text models/heldout.txt
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe      # noqa: E402
import export   # noqa: E402
import model    # noqa: E402

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf(path):
    """{name: float32 tensor in torch order (GGUF dims reversed)}, and the string-array metadata."""
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        return take(SCALARS[t])

    assert data[:4] == b"GGUF"
    pos = 4
    take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("<Q") for _ in range(take("<I"))]
        infos.append((name, dims, take("<I"), take("<Q")))
    align = meta.get("general.alignment", 32)
    base = (pos + align - 1) // align * align
    out = {}
    for name, dims, t, off in infos:
        n = int(np.prod(dims))
        if t == 0:
            a = np.frombuffer(data, np.float32, n, base + off)
        elif t == 30:
            a = (np.frombuffer(data, np.uint16, n, base + off).astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{name}: type {t} (use the BF16 file)")
        out[name] = torch.from_numpy(a.copy()).reshape(list(reversed(dims)))
    return out, meta


def load_model(path):
    tensors, meta = read_gguf(path)
    m = model.Model(model.Config())
    with torch.no_grad():
        for name, p in export.gguf_tensors(m).items():
            t = tensors[name]
            if name.endswith("ssm_a"):  # exported as -exp(A_log): set below
                continue
            p.copy_(t.reshape(p.shape))
        for i, b in enumerate(m.blocks):
            if b.recurrent:
                b.mixer.a_log.copy_(torch.log(-tensors[f"blk.{i}.ssm_a"]))
    return m, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    m, meta = load_model(args.model)
    tok = bpe.Tokenizer(meta["tokenizer.ggml.tokens"], [tuple(x.split(" ", 1)) for x in meta["tokenizer.ggml.merges"]])
    ids = tok.encode(open(args.text, encoding="utf-8").read())
    c = m.c
    states = []  # per block: (h1 before its FFN, its real top-K ids)

    def hook(block, idx):
        def forward(h, sequential=False):
            h1 = h + block.mixer(model.rms_norm(h, block.attn_norm, block.eps), sequential)
            states.append(h1)
            return h1 + block.ffn(model.rms_norm(h1, block.post_attention_norm, block.eps))
        return forward

    for i, b in enumerate(m.blocks):
        b.forward = hook(b, i)
    Ms = [8, 12, 16]
    per_layer = {l: {"tokens": 0, "hits": 0, **{f"all_hit_top{M}": 0 for M in Ms}} for l in range(c.layers - 1)}
    with torch.no_grad():
        for k in range(min(args.chunks, len(ids) // args.ctx)):
            states.clear()
            x = torch.tensor(ids[k * args.ctx:(k + 1) * args.ctx])[None]
            m.hidden(x)
            for l in range(c.layers - 1):
                nxt = m.blocks[l + 1]
                real_in = model.rms_norm(states[l + 1], nxt.post_attention_norm, c.eps)[0]
                pred_in = model.rms_norm(states[l], nxt.post_attention_norm, c.eps)[0]
                real = (real_in @ nxt.ffn.router.t()).topk(c.experts_used, -1).indices
                scores = pred_in @ nxt.ffn.router.t()
                pl = per_layer[l]
                pl["tokens"] += real.shape[0]
                top8 = scores.topk(c.experts_used, -1).indices
                pl["hits"] += int((real[:, :, None] == top8[:, None, :]).any(-1).sum())
                for M in Ms:
                    topm = scores.topk(M, -1).indices
                    pl[f"all_hit_top{M}"] += int((real[:, :, None] == topm[:, None, :]).any(-1).all(-1).sum())
    report = {"model": args.model, "chunks": args.chunks, "ctx": args.ctx, "layers": []}
    for l, pl in per_layer.items():
        n = pl["tokens"]
        report["layers"].append({"predicted_layer": l + 1, "from_layer": l, "tokens": n,
                                 "hit_rate_top8": pl["hits"] / (n * c.experts_used),
                                 **{f"all_8_in_top{M}": pl[f"all_hit_top{M}"] / n for M in Ms}})
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
