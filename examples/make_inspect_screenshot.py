"""Make docs/inspect.png, the README screenshot of `agentrl inspect --html`, from a real run.

It reads the run that `make demo` writes (``runs/arithmetic-tiny``: the main example, the
tiny model learning to use its python tool), picks a GRPO group of an early step where some
attempts called the tool and were right while others guessed and were wrong (the group the
advantage is computed over), renders that group with ``agentrl inspect --html``, opens the
page in headless Chromium (selenium + the Debian ``chromium``/``chromium-driver`` packages),
selects the attempt that used the tool, pins the trained token whose trainer and sampler
log-probs differ most, and saves the screenshot. Refresh it after `make demo`:

    python examples/make_inspect_screenshot.py [--run runs/arithmetic-tiny] [--step 1] [--out docs/inspect.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from agentrl.inspect.cli import run_inspect
from agentrl.types import Trajectory, read_jsonl

REPO = Path(__file__).resolve().parents[1]


def pick_group(trajs: list[Trajectory]) -> tuple[str, int]:
    """The first group with a right tool-using attempt beside a wrong one, and that attempt's
    position in the group."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    for gid, members in groups.items():
        rewards = {t.reward for t in members}
        for i, t in enumerate(members):
            used_tool = any(s.kind == "tool" for s in t.spans)
            if used_tool and t.reward == max(rewards) and len(rewards) > 1:
                return gid, i
    raise SystemExit("no group with both a right tool-using attempt and a wrong one at this step; try --step")


def screenshot(page: Path, out: Path, shown: int, token_index: int, profile: Path) -> None:
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
        driver.get(page.as_uri() + f"#t={shown}")
        WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
        driver.find_element(By.CSS_SELECTOR, f'#tokens span.tok[data-i="{token_index}"]').click()
        driver.execute_script("window.scrollTo(0, 0)")
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=REPO / "runs" / "arithmetic-tiny")
    ap.add_argument("--step", type=int, default=1, help="training step whose rollouts are shown")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "inspect.png")
    args = ap.parse_args()
    run, out = args.run.resolve(), args.out.resolve()
    rollouts = run / "rollouts" / f"step_{args.step:06d}.jsonl"
    if not rollouts.is_file():
        raise SystemExit(f"no rollouts at {rollouts}: run `make demo` first (it writes runs/arithmetic-tiny)")
    trajs = read_jsonl(str(rollouts))
    group, shown = pick_group(trajs)
    members = [t for t in trajs if t.group_id == group]
    t = members[shown]
    # The trained token whose trainer (π_old) and sampler (μ) log-probs differ most: what the viewer is for.
    pin = max((i for i, m in enumerate(t.loss_mask) if m), key=lambda i: abs(t.old_logprobs[i] - t.logprobs[i]))
    home = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        # Run from the run's grandparent with a relative path, so the page shows
        # "runs/arithmetic-tiny", never a path of the machine it was made on.
        os.chdir(run.parent.parent)
        rel = Path(run.parent.name) / run.name
        page = Path(tmp) / "inspect.html"
        code = run_inspect([str(rel), "--html", str(page), "--step", str(args.step), "--group", group,
                            "--limit", str(len(members))])
        if code != 0:
            raise SystemExit("agentrl inspect failed")
        screenshot(page, out, shown, pin, Path(tmp) / "profile")
        os.chdir(home)
    print(f"wrote {out} (step {args.step}, group {group}, attempt {shown}, pinned token {pin})")


if __name__ == "__main__":
    main()
