"""Generate the shipped multi-step word problems: ``envs/data/math_word_problems.jsonl``.

Ten problem families (shopping, travel, reading, wages, ...), each a small story with
two to four arithmetic steps and operands large enough that a model gains from a Python
tool. Every answer is an exact integer computed here, so the file needs no checking by
hand. Records use the GSM8K shape: ``question``, and ``answer`` holding a worked solution
that ends in ``#### N``; plus ``id`` and ``family``.

The output is a pure function of the seed (only ``random.Random(seed)`` is used), so
re-running the script reproduces the committed file byte for byte; a test checks this.

Usage::

    python benchmarks/make_math_problems.py            # rewrite the shipped file
    python benchmarks/make_math_problems.py --check    # exit 1 if the file is stale

Example::

    >>> problems = generate(n=10, seed=0)
    >>> problems[0]["answer"].splitlines()[-1].startswith("#### ")
    True
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "envs" / "data" / "math_word_problems.jsonl"

NAMES = ["Maya", "Omar", "Lena", "Ravi", "Sofia", "Tomas", "Aiko", "Nadia", "Kwame", "Elena",
         "Jonas", "Priya", "Mateo", "Ines", "Yusuf", "Hana"]

Story = tuple[str, list[str], int]  # question, solution steps, answer


def _shopping(r: random.Random) -> Story:
    name = r.choice(NAMES)
    a, p = r.randint(12, 48), r.randint(3, 19)
    b, q = r.randint(7, 36), r.randint(11, 64)
    total = a * p + b * q
    paid = (total // 100 + r.randint(1, 3)) * 100
    question = (f"{name} buys {a} notebooks at ${p} each and {b} backpacks at ${q} each. "
                f"{name} pays with ${paid}. How much change, in dollars, does {name} get back?")
    steps = [f"Notebooks cost {a} * {p} = {a * p} dollars.",
             f"Backpacks cost {b} * {q} = {b * q} dollars.",
             f"Together they cost {a * p} + {b * q} = {total} dollars.",
             f"The change is {paid} - {total} = {paid - total} dollars."]
    return question, steps, paid - total


def _travel(r: random.Random) -> Story:
    v, t1 = r.randint(45, 128), r.randint(2, 9)
    w, t2 = r.randint(31, 97), r.randint(2, 7)
    question = (f"A train travels at {v} km per hour for {t1} hours, then slows to {w} km per hour "
                f"for another {t2} hours. How many kilometers does it travel in total?")
    steps = [f"First part: {v} * {t1} = {v * t1} km.", f"Second part: {w} * {t2} = {w * t2} km.",
             f"Total: {v * t1} + {w * t2} = {v * t1 + w * t2} km."]
    return question, steps, v * t1 + w * t2


def _reading(r: random.Random) -> Story:
    name = r.choice(NAMES)
    per_day, days = r.randint(13, 47), r.randint(5, 19)
    faster, more = r.randint(50, 90), r.randint(3, 14)
    pages = per_day * days + faster * more
    question = (f"A book has {pages} pages. {name} reads {per_day} pages a day for {days} days, then "
                f"reads {faster} pages a day until the book is finished. How many days does {name} "
                f"read at {faster} pages a day?")
    done = per_day * days
    steps = [f"In the first {days} days {name} reads {per_day} * {days} = {done} pages.",
             f"Pages left: {pages} - {done} = {pages - done}.",
             f"Days at {faster} pages a day: {pages - done} / {faster} = {more}."]
    return question, steps, more


def _wages(r: random.Random) -> Story:
    name = r.choice(NAMES)
    rate, hours, days = r.randint(14, 38), r.randint(5, 9), r.randint(4, 6)
    weeks, bonus = r.randint(3, 12), r.randint(2, 9) * 25
    weekly = rate * hours * days
    question = (f"{name} earns ${rate} an hour, works {hours} hours a day and {days} days a week. "
                f"After {weeks} weeks {name} also gets a ${bonus} bonus. How many dollars does "
                f"{name} earn in total?")
    steps = [f"Per week: {rate} * {hours} * {days} = {weekly} dollars.",
             f"In {weeks} weeks: {weekly} * {weeks} = {weekly * weeks} dollars.",
             f"With the bonus: {weekly * weeks} + {bonus} = {weekly * weeks + bonus} dollars."]
    return question, steps, weekly * weeks + bonus


def _discount(r: random.Random) -> Story:
    pct = r.choice([10, 15, 20, 25, 30, 40, 45, 60])
    price = r.randint(6, 60) * 20
    coupon = r.randint(1, 9) * 5
    qty = r.randint(2, 7)
    sale = price * (100 - pct) // 100
    question = (f"A bicycle costs ${price}. During a sale it is {pct}% off, and a coupon then takes "
                f"another ${coupon} off each bicycle. A club buys {qty} bicycles. How many dollars "
                f"does the club pay?")
    steps = [f"The discount is {price} * {pct} / 100 = {price - sale} dollars, so the sale price is "
             f"{price} - {price - sale} = {sale}.",
             f"After the coupon: {sale} - {coupon} = {sale - coupon} dollars each.",
             f"For {qty} bicycles: {sale - coupon} * {qty} = {(sale - coupon) * qty} dollars."]
    return question, steps, (sale - coupon) * qty


def _fencing(r: random.Random) -> Story:
    length, width = r.randint(23, 140), r.randint(11, 90)
    gate, cost = r.randint(2, 6), r.randint(7, 26)
    perimeter = 2 * (length + width)
    question = (f"A rectangular field is {length} meters long and {width} meters wide. A fence goes "
                f"around it, except for a {gate}-meter gate. Fencing costs ${cost} per meter. How "
                f"many dollars does the fence cost?")
    steps = [f"Perimeter: 2 * ({length} + {width}) = {perimeter} m.",
             f"Without the gate: {perimeter} - {gate} = {perimeter - gate} m.",
             f"Cost: {perimeter - gate} * {cost} = {(perimeter - gate) * cost} dollars."]
    return question, steps, (perimeter - gate) * cost


def _tickets(r: random.Random) -> Story:
    adults, ap = r.randint(120, 480), r.randint(12, 29)
    kids, kp = r.randint(60, 350), r.randint(5, 11)
    revenue = adults * ap + kids * kp
    costs = r.randint(revenue // 4, revenue // 2)
    question = (f"A theater sells {adults} adult tickets at ${ap} each and {kids} child tickets at "
                f"${kp} each. The show costs ${costs} to put on. What is the theater's profit in "
                f"dollars?")
    steps = [f"Adult tickets: {adults} * {ap} = {adults * ap} dollars.",
             f"Child tickets: {kids} * {kp} = {kids * kp} dollars.",
             f"Revenue: {adults * ap} + {kids * kp} = {revenue} dollars.",
             f"Profit: {revenue} - {costs} = {revenue - costs} dollars."]
    return question, steps, revenue - costs


def _baking(r: random.Random) -> Story:
    per_batch, cookies = r.randint(180, 420), r.choice([12, 16, 20, 24, 30])
    batches = r.randint(7, 25)
    bag = r.choice([1000, 1500, 2000, 2500])
    flour = per_batch * batches
    bags = -(-flour // bag)
    question = (f"A bakery uses {per_batch} grams of flour for each batch of {cookies} cookies. It "
                f"bakes {batches * cookies} cookies. Flour comes in {bag}-gram bags. How many bags "
                f"must the bakery open?")
    steps = [f"Batches: {batches * cookies} / {cookies} = {batches}.",
             f"Flour: {per_batch} * {batches} = {flour} grams.",
             f"Bags: {bags - 1} * {bag} = {(bags - 1) * bag} grams is too little and {bags} * {bag} = "
             f"{bags * bag} grams is enough, so {bags} bags."]
    return question, steps, bags


def _orchard(r: random.Random) -> Story:
    trees, per_tree = r.randint(14, 75), r.randint(37, 160)
    box = r.choice([6, 8, 12, 15, 18, 24])
    price = r.randint(4, 15)
    apples = trees * per_tree
    full = apples // box
    question = (f"An orchard has {trees} trees, and each tree gives {per_tree} apples. The apples "
                f"are packed into boxes of {box}, and only full boxes are sold, at ${price} a box. "
                f"How many dollars do the boxes bring in?")
    steps = [f"Apples: {trees} * {per_tree} = {apples}.",
             f"Full boxes: {apples} // {box} = {full}.",
             f"Money: {full} * {price} = {full * price} dollars."]
    return question, steps, full * price


def _savings(r: random.Random) -> Story:
    name = r.choice(NAMES)
    start, weekly, weeks = r.randint(40, 400), r.randint(15, 85), r.randint(8, 30)
    spent = r.randint(50, start + weekly * weeks - 10)
    have = start + weekly * weeks - spent
    question = (f"{name} has ${start} and saves ${weekly} every week for {weeks} weeks, then spends "
                f"${spent} on a phone. How many dollars does {name} have left?")
    steps = [f"Saved: {weekly} * {weeks} = {weekly * weeks} dollars.",
             f"Before the phone: {start} + {weekly * weeks} = {start + weekly * weeks} dollars.",
             f"Left: {start + weekly * weeks} - {spent} = {have} dollars."]
    return question, steps, have


FAMILIES: dict[str, Callable[[random.Random], Story]] = {
    "shopping": _shopping, "travel": _travel, "reading": _reading, "wages": _wages,
    "discount": _discount, "fencing": _fencing, "tickets": _tickets, "baking": _baking,
    "orchard": _orchard, "savings": _savings,
}


def generate(n: int = 100, seed: int = 0) -> list[dict[str, str]]:
    """``n`` distinct problems, families round-robin, as GSM8K-shaped records."""
    rng = random.Random(seed)
    names = list(FAMILIES)
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    while len(out) < n:
        family = names[len(out) % len(names)]
        question, steps, answer = FAMILIES[family](rng)
        if question in seen:
            continue
        seen.add(question)
        out.append({"id": f"mwp-{len(out):03d}", "family": family, "question": question,
                    "answer": "\n".join([*steps, f"#### {answer}"])})
    return out


def render(problems: list[dict[str, str]]) -> str:
    return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in problems)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="only compare with the existing file")
    args = ap.parse_args(argv)
    text = render(generate(args.n, args.seed))
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'STALE: rerun without --check'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.n} problems to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
