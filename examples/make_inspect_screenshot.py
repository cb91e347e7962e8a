"""Make docs/inspect.png, the README screenshot of `agentrl inspect --html`, with the project's own code.

It builds a small run directory (a GRPO group of four tool-using arithmetic attempts,
tokenized with the Qwen2.5 tokenizer fixture; synthetic sampler/trainer log-probs and a
synthetic metrics.jsonl for the curves), renders it with ``agentrl inspect --html``, opens
the page in headless Chromium (selenium + the Debian ``chromium``/``chromium-driver``
packages), selects the attempt whose first tool call failed, pins the trained token whose
π_old/μ ratio is furthest from 1, and saves the screenshot.

    python examples/make_inspect_screenshot.py [--tokenizer DIR] [--out docs/inspect.png]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

from agentrl.inspect.cli import run_inspect
from agentrl.inspect.demo import arithmetic_group
from agentrl.types import write_jsonl

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TOKENIZER = REPO.parent / "shared" / "fixtures" / "tokenizers" / "qwen2.5"
SHOWN = 2  # the attempt with a failed tool call, then a fix


def build_run(run: Path, tokenizer_dir: Path) -> list:
    """A run directory with one rollout step, metrics and config; returns the group."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    group = arithmetic_group(lambda s: tok.encode(s, add_special_tokens=False), group_id="pencils-017")
    (run / "rollouts").mkdir(parents=True)
    write_jsonl(str(run / "rollouts" / "step_000060.jsonl"), group)
    rows = []
    for s in range(1, 61):  # synthetic but plausible learning curves
        mean = 0.18 + 0.5 * (1 - math.exp(-s / 22)) + 0.04 * math.sin(s * 1.7)
        row = {"step": s, "reward/mean": round(mean, 4), "reward/std": round(0.45 - 0.1 * s / 60, 4),
               "groups/zero_variance_frac": round(0.62 - 0.35 * s / 60 + 0.05 * math.cos(s), 4),
               "tools/calls_per_traj": round(0.4 + 1.1 * (1 - math.exp(-s / 15)), 4),
               "tools/error_rate": round(0.3 * math.exp(-s / 25) + 0.04, 4)}
        if s % 10 == 0:
            row["eval/accuracy"] = round(0.15 + 0.45 * (1 - math.exp(-s / 25)), 4)
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text(f"model:\n  path: {tokenizer_dir}\ngroup_size: 4\nenv: arithmetic\n")
    return group


def screenshot(page: Path, out: Path, token_index: int, profile: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--hide-scrollbars",
                 "--window-size=1400,1500", "--force-device-scale-factor=1", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                              options=opts)
    try:
        driver.get(page.as_uri() + f"#t={SHOWN}")
        WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
        driver.find_element(By.CSS_SELECTOR, f'#tokens span.tok[data-i="{token_index}"]').click()
        driver.execute_script("window.scrollTo(0, 0)")
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "inspect.png")
    args = ap.parse_args()
    out = args.out.resolve()
    tokenizer = args.tokenizer.resolve()
    home = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # relative paths, so the page shows "runs/arithmetic", not a temp folder
        run = Path("runs") / "arithmetic"
        group = build_run(run, tokenizer)
        page = Path(tmp) / "inspect.html"
        if run_inspect([str(run), "--html", str(page), "--tokenizer", str(tokenizer)]) != 0:
            raise SystemExit("agentrl inspect failed")
        t = group[SHOWN]
        # The trained token whose trainer/sampler log-probs differ most: what the viewer is for.
        pin = max((i for i, m in enumerate(t.loss_mask) if m),
                  key=lambda i: abs(t.old_logprobs[i] - t.logprobs[i]))
        screenshot(page, out, pin, Path(tmp) / "profile")
        os.chdir(home)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
