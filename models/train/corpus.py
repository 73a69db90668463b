"""The training corpus: the King James Version of the Bible as Debian's bible-kjv-text ships it.

The text is public domain (bible-kjv-text's copyright file: "The copyright for the King James Version text of
the Bible is expired"); the `bible` program (bible-kjv, GPL-2+) only reads it. Each chapter becomes one document:
its verses, one per line, without references. Every 40th chapter (counting from the 20th) is held out for
evaluation and never seen in training.
"""
import re
import subprocess

HELD_OUT_EVERY = 40
HELD_OUT_OFFSET = 19
VERSE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def chapters():
    """[(book, chapter number, [verse text, ...]), ...] in canonical order."""
    text = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                          text=True).stdout
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = VERSE.match(line)
        if not m:
            raise ValueError("unexpected line from bible: " + line[:80])
        book, chapter, _verse, body = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).strip()
        if not out or out[-1][0] != book or out[-1][1] != chapter:
            out.append((book, chapter, []))
        out[-1][2].append(body)
    return out


def split(all_chapters):
    """(train documents, held-out documents): each document one chapter's verses joined by newlines."""
    train, held = [], []
    for i, (_book, _chapter, verses) in enumerate(all_chapters):
        doc = "\n".join(verses) + "\n"
        (held if i % HELD_OUT_EVERY == HELD_OUT_OFFSET else train).append(doc)
    return train, held
