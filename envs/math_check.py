r"""Math answer checking: find the model's final answer, decide if it equals the gold answer.

**Extraction reads the last assistant turn only** (tool results and earlier turns never
count: an answer the model merely saw in a tool's output scores 0). In that turn, the first
format present wins:

1. the configured tag, ``<answer>...</answer>`` by default (a ``\boxed{}`` inside is unwrapped);
2. ``\boxed{...}`` / ``\fbox{...}``, nested braces included;
3. a GSM8K-style line ``#### N``;
4. "the answer is ...", "final answer: ..." (up to the end of the sentence or line).

Within the winning format the occurrences must agree: several different ones (``\boxed{1}
... \boxed{2}``, two tags, two boxes inside the tag) are a hedge, and the turn has no answer
(source ``ambiguous``); repeats of one answer count once. An answer written with digits the
gold does not hold (full-width ``４２``, Arabic-Indic ``٤٢``, superscripts) is not compared.
See docs/reward_integrity.md.

There is no "last number in the text" fallback: it rewards answers the model never committed
to, and a policy under RL learns to exploit it.

**Equivalence** (the first test that applies decides):

- ``numeric``: both sides are plain numbers, possibly with thousands commas, a currency sign,
  ``%``, trailing unit words (``18 dollars``, ``5 hours``), ``a/b`` or ``\frac{a}{b}``.
  Compared exactly as fractions: whole numbers and fractions must match exactly
  (``1000001`` != ``1000000``). A reference written with decimals is matched to its own
  precision (gold ``3.14`` accepts ``3.1416``: within half a unit of its last digit; gold
  ``0.333`` accepts ``1/3``); a fractional gold accepts a decimal answer within 1e-6
  relative (``1/3`` accepts ``0.333333``, not ``0.33``). A percent
  on one side only also matches
  the value / 100 (``25%`` == ``0.25``); ``25%`` == ``25`` (GSM8K golds omit the sign).
  Scale words (``thousand``, ``dozen``) and single letters other than m, g, s, h, l
  (``x``, ``i``, ``e``: variables) are not units.
- ``math_verify``: everything else (LaTeX expressions, radicals, sets, intervals, equations)
  goes to the ``math-verify`` library (``pip install math-verify``), which parses both sides
  with sympy and compares them symbolically and numerically.
- ``string``: when math-verify cannot parse a side, or is turned off, the normalized strings
  are compared (case, spaces, ``\text{}``, ``$`` and a trailing period ignored).

**Timeouts.** math-verify bounds parsing and comparison with ``signal.alarm``, which Python
allows only in the main thread. The trainer scores in the main thread, so the timeout holds
there (a comparison that runs past it counts as not equivalent, with the reason saying so).
Called from another thread, the check runs without a timeout instead of failing
(math-verify's own behaviour is to raise); answers longer than ``max_chars`` are refused
outright so a pathological string cannot stall scoring.

Example::

    >>> from agentrl.types import Message
    >>> msgs = [Message("user", "2+2?"), Message("assistant", "It is \\boxed{4}.")]
    >>> v = AnswerChecker().check(msgs, "4")
    >>> v.correct, v.method, v.source
    (True, 'numeric', 'boxed')
"""

from __future__ import annotations

import importlib.util
import re
import threading
from dataclasses import dataclass
from fractions import Fraction

from agentrl.env import foreign_digits, last_assistant_text
from agentrl.types import Message

# For rollout.answer_pattern: a turn that matches neither this nor a tool call is "void".
ANSWER_PATTERN = r"<answer>.*?</answer>|\\boxed\s*\{|(?m:^\s*####)|(?i:answer\s*(?:is|:))"

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASH_RE = re.compile(r"^\s*####\s*(.+?)\s*$", re.MULTILINE)
_ANSWER_IS_RE = re.compile(r"(?:final\s+answer|answer)\s*(?:is|:)\s*:?\s*(.+)", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")


@dataclass(frozen=True)
class Extraction:
    """The answer string found in a model's text, and which format it came from."""

    text: str | None  # None: no answer in any accepted format, or several different ones
    source: str  # "tag" | "boxed" | "hash" | "answer_is" | "ambiguous" | "none"


@dataclass(frozen=True)
class Verdict:
    """A checker's decision and why; ``info()`` is what goes into ``Score.info``."""

    correct: bool
    method: str  # "numeric" | "math_verify" | "string" | "none" (no answer to compare)
    reason: str
    extracted: str | None
    gold: str
    source: str = "none"

    def info(self) -> dict[str, str | bool]:
        return {"extracted": self.extracted or "", "gold": self.gold, "method": self.method,
                "reason": self.reason, "source": self.source, "has_answer": self.extracted is not None}


# -- extraction ---------------------------------------------------------------------------


def all_boxed(text: str) -> list[str]:
    r"""Contents of every closed ``\boxed{...}`` (or ``\fbox{...}``), braces balanced, in order.

    >>> all_boxed(r"so \boxed{1} then \boxed{\frac{a}{b}} and \boxed{2")
    ['1', '\\frac{a}{b}']
    """
    found = []
    for m in _BOX_RE.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:  # an unclosed box (cut-off generation) is no answer
            found.append(text[m.end():i - 1].strip())
    return found


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (or ``\fbox{...}``), braces balanced.

    >>> last_boxed(r"so \boxed{1} then \boxed{\frac{a}{b}} done")
    '\\frac{a}{b}'
    """
    found = all_boxed(text)
    return found[-1] if found else None


def _committed(found: list[str], source: str) -> Extraction | None:
    """The one answer of ``found`` (None when empty); ambiguous when they differ."""
    if not found:
        return None
    return Extraction(found[-1], source) if len(set(found)) == 1 else Extraction(None, "ambiguous")


def extract_answer(text: str | None, tag: str | None = "answer") -> Extraction:
    r"""The answer in one piece of model-written text (see the module docstring for the order).

    >>> extract_answer("I think the answer is 42. Done.")
    Extraction(text='42', source='answer_is')
    >>> extract_answer(r"<answer>\boxed{7}</answer>")
    Extraction(text='7', source='tag')
    """
    if not text:
        return Extraction(None, "none")
    if tag:
        tagged = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
        if tagged:
            unwrapped = []
            for inner in (t.strip() for t in tagged):
                boxes = all_boxed(inner)
                if len(set(boxes)) > 1:
                    return Extraction(None, "ambiguous")
                unwrapped.append(boxes[-1] if boxes and boxes[-1] else inner)
            return _committed(unwrapped, "tag")
    said = []
    for line in _ANSWER_IS_RE.findall(text):
        end = _SENTENCE_END.search(line.strip())
        said.append((line.strip()[:end.start()] if end else line.strip()).strip(" *$"))
    found = (_committed(all_boxed(text), "boxed") or _committed([h.strip() for h in _HASH_RE.findall(text)], "hash")
             or _committed(said, "answer_is"))
    return found or Extraction(None, "none")


def extract_final_answer(messages: list[Message], tag: str | None = "answer") -> Extraction:
    """The answer in the last assistant turn; tool messages and earlier turns are ignored."""
    return extract_answer(last_assistant_text(messages), tag)


def gsm8k_gold(answer: str) -> str:
    """The gold of a GSM8K ``answer`` field: the text after the last ``####`` (commas dropped
    from numbers); a field without ``####`` is returned stripped.

    >>> gsm8k_gold("Step 1... 1,000 + 200 = 1,200\\n#### 1,200")
    '1200'
    """
    found = _HASH_RE.findall(answer)
    gold = (found[-1] if found else answer).strip()
    return gold.replace(",", "") if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", gold) else gold


# -- numbers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    """A plain numeric answer: its exact value, whether it carried a percent sign, and how
    many digits it was written with after the decimal point (its precision as a reference)."""

    value: Fraction
    percent: bool = False
    decimals: int = 0


_NOT_UNITS = {"pi", "and", "or", "plus", "minus", "times", "over", "divided", "by", "squared",
              "cubed", "sqrt", "half", "halves", "third", "thirds", "quarter", "quarters", "dozen",
              "dozens", "hundred", "hundreds", "thousand", "thousands", "million", "millions",
              "billion", "billions", "trillion", "lakh", "crore", "score"}
_LETTER_UNITS = {"m", "g", "s", "h", "l", "L"}  # other single letters read as variables (5x, 2i, 3e)
_DECOR = [(re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox|operatorname)\s*\{([^{}]*)\}"), r" \1 "),
          (re.compile(r"\\[dt]frac"), r"\\frac"), (re.compile(r"\\[,!;: ]|~"), ""),
          (re.compile(r"\^\s*\{?\\circ\}?|°"), " "), (re.compile(r"\\\$"), "$"),
          (re.compile(r"\\%"), "%"), (re.compile(r"[−–]"), "-")]
_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
_NUMBER_RE = re.compile(
    rf"(?P<s1>[-+]?)\s*[$€£¥]?\s*(?P<s2>[-+]?)\s*"
    rf"(?:\\frac\{{(?P<fn>\d+)\}}\{{(?P<fd>\d+)\}}|(?P<n>{_NUM})(?:\s*/\s*(?P<d>\d+))?)"
    r"\s*(?P<pct>%|percent\b|per\s*cent\b)?\s*(?P<unit>[A-Za-z][A-Za-z\s./-]*)?"
)


def _strip_delims(s: str) -> str:
    s = s.strip().strip("*").strip()
    for left, right in (("$$", "$$"), ("$", "$"), (r"\(", r"\)"), (r"\[", r"\]")):
        if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left):-len(right)].strip()
    return s.rstrip(".").strip()


def parse_number(text: str) -> Number | None:
    r"""The number a plain numeric answer denotes, or None if it is anything more.

    >>> parse_number("$1,234.50"), parse_number(r"\frac{3}{4} cup"), parse_number("2 thousand")
    (Number(value=Fraction(2469, 2), percent=False, decimals=2), Number(value=Fraction(3, 4), percent=False, decimals=0), None)
    """
    s = _strip_delims(text)
    for pattern, repl in _DECOR:
        s = pattern.sub(repl, s)
    m = _NUMBER_RE.fullmatch(s.strip().rstrip("."))
    if not m or (m["s1"] and m["s2"]):
        return None
    unit = (m["unit"] or "").replace(".", " ").replace("/", " ").replace("-", " ").split()
    if len(unit) > 3 or any(w.lower() in _NOT_UNITS or (len(w) < 2 and w not in _LETTER_UNITS) for w in unit):
        return None
    if m["fn"] is not None:
        num, den = Fraction(m["fn"]), Fraction(m["fd"])
    else:
        num, den = Fraction(m["n"].replace(",", "")), Fraction(m["d"] or 1)
    if den == 0:
        return None
    value = num / den
    if "-" in (m["s1"] + m["s2"]):
        value = -value
    decimals = len(m["n"].partition(".")[2]) if m["n"] is not None else 0
    return Number(value, percent=m["pct"] is not None, decimals=decimals)


def numbers_equal(answer: Number, gold: Number) -> bool:
    """Equal as fractions, to the precision the reference is written with; percent on one
    side only also matches value/100.

    |a - g| <= tol, where tol = 10^-d / 2 for a gold written with d decimals; for a fractional
    gold (1/3) and an answer written with decimals 1e-6 * |g|; 0 for a whole-number gold. Scaled by 1/100 when the gold's percent is dropped.

    >>> numbers_equal(Number(Fraction(25), True), Number(Fraction(1, 4), decimals=2))
    True
    >>> numbers_equal(Number(Fraction(1000001)), Number(Fraction(1000000)))
    False
    >>> numbers_equal(Number(Fraction(31416, 10000), decimals=4), Number(Fraction(314, 100), decimals=2))
    True
    """
    if gold.decimals:
        tol = Fraction(1, 2 * 10**gold.decimals)
    elif gold.value.denominator != 1 and answer.decimals:
        tol = abs(gold.value) / 10**6
    else:
        tol = Fraction(0)
    if abs(answer.value - gold.value) <= tol:
        return True
    if answer.percent and not gold.percent:
        return abs(answer.value / 100 - gold.value) <= tol
    if gold.percent and not answer.percent:
        return abs(answer.value - gold.value / 100) <= tol / 100
    return False


# -- strings and math-verify ----------------------------------------------------------------


def normalize_string(s: str) -> str:
    r"""Lower case, no spaces, ``\text{}`` unwrapped, delimiters and a trailing period dropped.

    >>> normalize_string(r"\text{(B) } Paris.")
    '(b)paris'
    """
    s = _strip_delims(s)
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\left|\\right|\\[,!;: ]|\$", "", s)
    return re.sub(r"\s+", "", s).lower().rstrip(".")


def math_verify_available() -> bool:
    return importlib.util.find_spec("math_verify") is not None


def _short(x: object, n: int = 80) -> str:
    s = str(x)
    return s if len(s) <= n else s[: n - 3] + "..."


def _math_verify(answer: str, gold: str, timeout: int) -> tuple[bool | None, str]:
    """(equivalent, why): False when math-verify judged (or timed out), None when it could
    not parse a side or failed; the caller then compares strings."""
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    main = threading.current_thread() is threading.main_thread()
    t = timeout if main else None  # signal.alarm works in the main thread only
    note = "" if main else " (no timeout: not in the main thread)"
    try:
        g = parse(f"${_strip_delims(gold)}$", parsing_timeout=t, raise_on_error=True)
        p = parse(f"${_strip_delims(answer)}$", parsing_timeout=t, raise_on_error=True)
        if len(g) < 2 or len(p) < 2:  # [sympy, str] when parsed; a lone string when not
            side = "gold" if len(g) < 2 else "answer"
            return None, f"math_verify could not parse the {side}{note}"
        ok = verify(g, p, timeout_seconds=t, raise_on_error=True)
    except TimeoutException:
        return False, f"math_verify timed out after {timeout}s; counted as not equivalent"
    except Exception as e:  # sympy raises many kinds; the string fallback still runs
        return None, f"math_verify error {type(e).__name__}: {_short(e)}{note}"
    rel = "equivalent" if ok else "not equivalent"
    return bool(ok), f"math_verify: {_short(p[0])} {rel} to gold {_short(g[0])}{note}"


def check_equivalence(answer: str | None, gold: str, *, use_math_verify: bool = True,
                      timeout: int = 5, max_chars: int = 1000, source: str = "none") -> Verdict:
    r"""Decide whether an extracted ``answer`` equals ``gold``, and explain.

    >>> check_equivalence("1,200 dollars", "1200").method
    'numeric'
    >>> check_equivalence(r"\frac{\pi}{2}", r"\pi/2").correct
    True
    """
    if answer is None:
        why = ("several different answers in the last assistant turn; none counts" if source == "ambiguous"
               else "no answer found in the last assistant turn")
        return Verdict(False, "none", why, None, gold, source)
    if foreign_digits(answer) - foreign_digits(gold):
        return Verdict(False, "none", "answer written with digits other than 0-9; not compared",
                       answer[:max_chars], gold, source)
    if len(answer) > max_chars:
        return Verdict(False, "none", f"answer longer than {max_chars} characters; not compared",
                       answer[:max_chars], gold, source)
    a, g = parse_number(answer), parse_number(gold)
    if a is not None and g is not None:
        ok = numbers_equal(a, g)
        how = "==" if ok else "!="
        pa, pg = f"{a.value}{'%' if a.percent else ''}", f"{g.value}{'%' if g.percent else ''}"
        return Verdict(ok, "numeric", f"numbers: {pa} {how} {pg}", answer, gold, source)
    judged: bool | None = None
    why = "math-verify off"
    if use_math_verify:
        judged, why = _math_verify(answer, gold, timeout)
        if judged:
            return Verdict(True, "math_verify", why, answer, gold, source)
    if normalize_string(answer) == normalize_string(gold):
        return Verdict(True, "string", f"normalized strings equal ({why})", answer, gold, source)
    method = "string" if judged is None else "math_verify"
    return Verdict(False, method, f"{why}; normalized strings differ", answer, gold, source)


@dataclass
class AnswerChecker:
    """Extraction + equivalence with one configuration; what ``MathEnv.score`` uses.

    Args:
        tag: the answer tag (``"answer"`` -> ``<answer>...</answer>``); None disables it.
        use_math_verify: False keeps numeric and string comparison only.
        timeout: seconds math-verify may spend on one parse or comparison (main thread).
        max_chars: longer answers are refused without parsing.
    """

    tag: str | None = "answer"
    use_math_verify: bool = True
    timeout: int = 5
    max_chars: int = 1000

    def __post_init__(self) -> None:
        if self.use_math_verify and not math_verify_available():
            raise ImportError("math answer checking needs math-verify: pip install math-verify "
                              "(or pip install 'agentrl[math]'); or pass use_math_verify=False to "
                              "compare numbers and strings only")
        if not isinstance(self.timeout, int) or self.timeout < 1:
            raise ValueError(f"timeout must be a whole number of seconds >= 1 (signal.alarm), got {self.timeout!r}")

    def check(self, messages: list[Message], gold: str) -> Verdict:
        found = extract_final_answer(messages, self.tag)
        return self.compare(found.text, gold, source=found.source)

    def compare(self, answer: str | None, gold: str, source: str = "none") -> Verdict:
        return check_equivalence(answer, gold, use_math_verify=self.use_math_verify,
                                 timeout=self.timeout, max_chars=self.max_chars, source=source)
