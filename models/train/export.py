"""Exports a training checkpoint for `essaim synth --weights`, and measures it in PyTorch.

  /usr/bin/python3 models/train/export.py --run DIR             # DIR/npy/<tensor name>.npy
  /usr/bin/python3 models/train/export.py --run DIR --perplexity TEXT [--ctx 256] [--bf16]

Each array is float32 with the tensor's ggml ne reversed (a PyTorch Linear weight [out, in] is ggml's
[in, out] as it stands). --perplexity computes llama-perplexity's figure on TEXT with the sequential delta rule:
chunks of --ctx tokens, each scored on its second half. --bf16 rounds every weight the BF16 file stores as BF16
and every activation multiplied with one (as llama.cpp's and essaim's BF16 products do), so the figure is the
one the shipped BF16 file should give.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe    # noqa: E402
import model  # noqa: E402


def block_tensors(i, b):
    """{GGUF name: tensor} of one block (main or MTP)."""
    p = f"blk.{i}."
    out = {p + "attn_norm.weight": b.attn_norm, p + "post_attention_norm.weight": b.post_attention_norm}
    mx = b.mixer
    if b.recurrent:
        out.update({p + "attn_qkv.weight": mx.qkv.weight, p + "attn_gate.weight": mx.gate.weight,
                    p + "ssm_conv1d.weight": mx.conv, p + "ssm_dt.bias": mx.dt_bias,
                    p + "ssm_a": -torch.exp(mx.a_log), p + "ssm_beta.weight": mx.beta.weight,
                    p + "ssm_alpha.weight": mx.alpha.weight, p + "ssm_norm.weight": mx.norm,
                    p + "ssm_out.weight": mx.out.weight})
    else:
        out.update({p + "attn_q.weight": mx.q.weight, p + "attn_k.weight": mx.k.weight,
                    p + "attn_v.weight": mx.v.weight, p + "attn_q_norm.weight": mx.q_norm,
                    p + "attn_k_norm.weight": mx.k_norm, p + "attn_output.weight": mx.o.weight})
    f = b.ffn
    out.update({p + "ffn_gate_inp.weight": f.router, p + "ffn_gate_exps.weight": f.gate_exps,
                p + "ffn_up_exps.weight": f.up_exps, p + "ffn_down_exps.weight": f.down_exps,
                p + "ffn_gate_inp_shexp.weight": f.shexp_gate, p + "ffn_gate_shexp.weight": f.gate_shexp.weight,
                p + "ffn_up_shexp.weight": f.up_shexp.weight, p + "ffn_down_shexp.weight": f.down_shexp.weight})
    return out


def gguf_tensors(m):
    out = {"token_embd.weight": m.embed, "output_norm.weight": m.output_norm, "output.weight": m.output}
    for i, b in enumerate(m.blocks):
        out.update(block_tensors(i, b))
    n = len(m.blocks)
    out.update(block_tensors(n, m.mtp))
    out.update({f"blk.{n}.nextn.eh_proj.weight": m.mtp_eh_proj.weight, f"blk.{n}.nextn.enorm.weight": m.mtp_enorm,
                f"blk.{n}.nextn.hnorm.weight": m.mtp_hnorm,
                f"blk.{n}.nextn.shared_head_norm.weight": m.mtp_head_norm})
    return out


# Kept F32 in every file (llama.cpp's converter and llama-quantize leave them): 1-D tensors, routers, conv taps.
def stays_f32(name, t):
    return t.dim() < 2 or name.endswith("ffn_gate_inp.weight") or name.endswith("ssm_conv1d.weight")


def load(run):
    ck = torch.load(os.path.join(run, "checkpoint.pt"))
    m = model.Model(model.Config(**ck["config"]))
    m.load_state_dict(ck["state"])
    m.eval()
    return m, ck


def round_bf16(m):
    """Weights as the BF16 file holds them, and BF16 activations into every product with one."""
    with torch.no_grad():
        for name, t in gguf_tensors(m).items():
            if not stays_f32(name, t) and isinstance(t, torch.nn.Parameter):
                t.copy_(t.bfloat16().float())
    for mod in m.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_pre_hook(lambda _m, inp: (inp[0].bfloat16().float(),))
    model.EXPERT_INPUT_ROUNDING = lambda x: x.bfloat16().float()
    # Token embeddings are looked up, not multiplied: rounded above; the LM head is `output`, a plain matmul.
    model.HEAD_INPUT_ROUNDING = lambda x: x.bfloat16().float()


def perplexity(m, ids, ctx, max_chunks=0):
    """llama-perplexity: consecutive chunks of ctx tokens, each scored on tokens ctx/2 .. ctx-1."""
    n_chunks = len(ids) // ctx
    if max_chunks > 0:
        n_chunks = min(n_chunks, max_chunks)
    nll, count, running = 0.0, 0, []
    first = ctx // 2
    with torch.no_grad():
        for c in range(n_chunks):
            chunk = torch.tensor(ids[c * ctx:(c + 1) * ctx])[None]
            logits = m.logits(chunk, sequential=True)[0].double()
            logp = torch.log_softmax(logits, -1)
            for j in range(first, ctx - 1):
                nll -= logp[j, chunk[0, j + 1]].item()
                count += 1
            running.append(math.exp(nll / count))
    return running, n_chunks


def unigram(train_ids, held_ids, vocab):
    """Perplexity of add-one-smoothed training-token frequencies on the held-out tokens."""
    counts = np.bincount(np.array(train_ids), minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(np.exp(-logp[np.array(held_ids)].mean()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--perplexity")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--chunks", type=int, default=0)
    ap.add_argument("--unigram", action="store_true", help="also the unigram baseline of the training tokens")
    args = ap.parse_args()
    torch.set_num_threads(1)
    m, ck = load(args.run)
    if not args.perplexity:
        out = os.path.join(args.run, "npy")
        os.makedirs(out, exist_ok=True)
        for name, t in gguf_tensors(m).items():
            np.save(os.path.join(out, name + ".npy"), t.detach().float().contiguous().numpy())
        print(f"wrote {len(gguf_tensors(m))} tensors of step {ck['step']} to {out}")
        return
    with open(os.path.join(args.run, "tokenizer.json")) as f:
        tj = json.load(f)
    vocab = [t for t, _ in sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])] + bpe.SPECIAL
    merges = [tuple(x.split(" ")) for x in tj["model"]["merges"]]
    tok = bpe.Tokenizer(vocab, merges)
    with open(args.perplexity) as f:
        ids = tok.encode(f.read())
    if args.bf16:
        round_bf16(m)
    running, n_chunks = perplexity(m, ids, args.ctx, args.chunks)
    doc = {"tokens": len(ids), "chunks": n_chunks, "ctx": args.ctx, "bf16": args.bf16,
           "perplexity": running[-1], "running": [round(x, 4) for x in running]}
    if args.unigram:
        import corpus  # noqa: E402 (the bible package is needed only here)
        train_docs, _ = corpus.split(corpus.chapters())
        train_ids = [i for d in train_docs for i in tok.encode(d)]
        doc["unigram_perplexity"] = unigram(train_ids, ids, len(vocab))
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
