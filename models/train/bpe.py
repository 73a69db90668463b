"""A GPT-2-style byte-level BPE: trained on the corpus, written as a Hugging Face tokenizer.json.

Pre-tokenisation is GPT-2's regex (essaim and llama.cpp call it "gpt-2"); words are byte strings mapped to
printable characters by GPT-2's byte<->unicode table; merges are learned greedily (most frequent adjacent
pair, ties broken by the pair's text) until the vocabulary holds `size` entries including the special tokens.
"""
import collections
import json

import regex

GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def byte_to_unicode():
    """GPT-2's table: printable bytes map to themselves, the others to U+0100 upwards, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


B2U = byte_to_unicode()
SPLIT = regex.compile(GPT2_SPLIT)


def words(text):
    """The pre-tokens of a text, each as its byte-level string."""
    return ["".join(B2U[b] for b in w.encode("utf-8")) for w in SPLIT.findall(text)]


def train(documents, size):
    """(vocab list in id order, merges list of (a, b)) for a vocabulary of `size` tokens."""
    counts = collections.Counter()
    for doc in documents:
        counts.update(words(doc))
    word_syms = [list(w) for w in counts]
    word_freq = [counts[w] for w in counts]
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for i, syms in enumerate(word_syms):
        for a, b in zip(syms, syms[1:]):
            pairs[(a, b)] += word_freq[i]
            where[(a, b)].add(i)
    vocab = [B2U[b] for b in range(256)]
    merges = []
    while len(vocab) + len(SPECIAL) < size and pairs:
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        joined = best[0] + best[1]
        vocab.append(joined)
        for i in list(where[best]):
            syms = word_syms[i]
            for a, b in zip(syms, syms[1:]):
                pairs[(a, b)] -= word_freq[i]
                if pairs[(a, b)] <= 0:
                    del pairs[(a, b)]
                where[(a, b)].discard(i)
            out, j = [], 0
            while j < len(syms):
                if j + 1 < len(syms) and syms[j] == best[0] and syms[j + 1] == best[1]:
                    out.append(joined)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            word_syms[i] = out
            for a, b in zip(out, out[1:]):
                pairs[(a, b)] += word_freq[i]
                where[(a, b)].add(i)
        where.pop(best, None)
    return vocab + SPECIAL, merges


class Tokenizer:
    def __init__(self, vocab, merges):
        self.ids = {t: i for i, t in enumerate(vocab)}
        self.rank = {m: r for r, m in enumerate(merges)}
        self.cache = {}

    def special(self, name):
        return self.ids[name]

    def _word(self, w):
        if w in self.cache:
            return self.cache[w]
        syms = list(w)
        while len(syms) > 1:
            ranked = [(self.rank.get((a, b), 1 << 30), k) for k, (a, b) in enumerate(zip(syms, syms[1:]))]
            r, k = min(ranked)
            if r == 1 << 30:
                break
            syms[k:k + 2] = [syms[k] + syms[k + 1]]
        ids = [self.ids[s] for s in syms]
        self.cache[w] = ids
        return ids

    def encode(self, text):
        out = []
        for w in words(text):
            out.extend(self._word(w))
        return out

    def decode(self, ids):
        u2b = {u: b for b, u in B2U.items()}
        vocab = {i: t for t, i in self.ids.items()}
        raw = bytearray()
        for i in ids:
            t = vocab[i]
            if t in SPECIAL:
                raw.extend(t.encode())
            else:
                raw.extend(u2b[c] for c in t)
        return raw.decode("utf-8", errors="replace")


def write_hf(vocab, merges, directory):
    """tokenizer.json and tokenizer_config.json as Hugging Face writes them for a GPT-2 byte-level BPE."""
    n = len(vocab) - len(SPECIAL)
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": n + k, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for k, s in enumerate(SPECIAL)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": {t: i for i, t in enumerate(vocab[:n])},
                  "merges": [a + " " + b for a, b in merges]},
    }
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "add_bos_token": False, "chat_template": CHAT_TEMPLATE}
    with open(directory + "/tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    with open(directory + "/tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
