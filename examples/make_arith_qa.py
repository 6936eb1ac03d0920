"""Writes examples/arith_qa.jsonl: 1,200 distinct arithmetic questions with their answers (a quarter
one-digit a + b, the rest two-digit a + b or a - b), the data file the README's "Bring your own data"
lines train on. ``python examples/make_arith_qa.py`` rewrites the same file (fixed seed)."""

import json
import random
from pathlib import Path


def main() -> None:
    rng = random.Random(2026)
    rows, seen = [], set()
    while len(rows) < 1200:
        if rng.random() < 0.25:
            a, b, op = rng.randint(0, 9), rng.randint(0, 9), "+"
        else:
            a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-")
        q = f"What is {a} {op} {b}?"
        if q in seen:
            continue
        seen.add(q)
        rows.append({"question": q, "answer": a + b if op == "+" else a - b})
    out = Path(__file__).with_name("arith_qa.jsonl")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
