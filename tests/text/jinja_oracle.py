#!/usr/bin/env python3
"""Renders chat templates with Jinja2 exactly as Hugging Face's apply_chat_template sets it up (the oracle of
tests/text/jinja_oracle_test.cpp): an immutable sandbox with trim_blocks and lstrip_blocks, `tojson` as
json.dumps(ensure_ascii=False) keeping key order, raise_exception() raising.

    jinja_oracle.py CASES.json OUT.json     # CASES: [{"template": T, "context": {...}}, ...]
OUT: one {"ok": true, "text": ...} or {"ok": false, "error": ...} per case."""
import json
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    cases = json.load(open(sys.argv[1], encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    compiled = {}
    out = []
    for case in cases:
        try:
            t = compiled.get(case["template"])
            if t is None:
                t = compiled[case["template"]] = env.from_string(case["template"])
            out.append({"ok": True, "text": t.render(**case["context"])})
        except Exception as e:  # noqa: BLE001 - every failure is an answer here
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    json.dump(out, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)


if __name__ == "__main__":
    main()
