"""The HTML view in a real browser: headless Chromium (Debian `chromium` + `chromium-driver`) via selenium.

Checks the page the user sees: one token element per token, one masked-in element per
trained token, clicking a token shows its details, switching attempts in the group view,
no console errors; saves screenshots under the test's tmp_path. Skips only when Chromium
or its driver is absent.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from agentrl.inspect.cli import run_inspect
from synthetic_trajectories import known_example, long_trajectory
from agentrl.types import Trajectory, Verdict, write_jsonl
from fixture_paths import QWEN25 as QWEN

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="headless Chromium absent (Debian: apt-get install -y chromium chromium-driver)",
)


@pytest.fixture
def browser(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium not installed (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--no-first-run",
                 "--disable-sync", "--disable-extensions", "--window-size=1400,1000",
                 f"--user-data-dir={tmp_path / 'chrome-profile'}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


def open_page(driver, page: Path, fragment: str = "") -> float:
    """Load the page and wait until its script says ready; returns seconds from get() to ready."""
    from selenium.webdriver.support.ui import WebDriverWait

    t0 = time.perf_counter()
    driver.get(page.as_uri() + fragment)
    WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
    return time.perf_counter() - t0


def count(driver, css: str) -> int:
    return driver.execute_script("return document.querySelectorAll(arguments[0]).length", css)


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_token_elements_details_and_group_view(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    t = known_example().trajectory
    other = Trajectory.from_json(t.to_json())
    other.sample_index, other.verdict, other.trained.advantage = 3, Verdict(0.0), -1.0
    other.token_ids = other.token_ids[:12]  # a shorter attempt: counts must follow the selection
    other.loss_mask, other.logprobs = other.loss_mask[:12], other.logprobs[:12]
    other.trained.old_logprobs = other.old_logprobs[:12]
    other.spans = other.spans[:4]
    write_jsonl(str(tmp_path / "step_000001.jsonl"), [t, other])
    page = tmp_path / "view.html"
    assert run_inspect([str(tmp_path), "--html", str(page)]) == 0

    open_page(browser, page)
    assert count(browser, "#tokens span.tok") == len(t.token_ids) == 15
    assert count(browser, "#tokens span.tok.m1") == sum(t.loss_mask) == 6
    assert count(browser, "#groups .card") == 2

    # Click token 13 (model, trained; its trainer log-prob differs from the sampler's by 0.5).
    tok = browser.find_element(By.CSS_SELECTOR, '#tokens span.tok[data-i="13"]')
    tok.click()
    field = lambda name: browser.find_element(By.CSS_SELECTOR, f'#details [data-field="{name}"]').text
    assert field("id") == str(t.token_ids[13]) == "112"
    assert field("mask").startswith("1")
    assert field("ratio") == "1.6487"  # exp(0.5)
    assert field("adv") == "+1.500"
    assert "tok" in tok.get_attribute("class") and "sel" in tok.get_attribute("class")
    # A masked tool token: no gradient, no advantage.
    browser.find_element(By.CSS_SELECTOR, '#tokens span.tok[data-i="11"]').click()
    assert field("id") == "110" and field("mask").startswith("0") and field("adv").startswith("—")

    # Color by sampler log-prob: trained tokens get their own background, nothing breaks.
    Select(browser.find_element(By.ID, "mode")).select_by_value("lp")
    assert browser.execute_script(
        "return document.querySelector('#tokens .tok.m1').style.backgroundColor") != ""

    # Group view: clicking the second attempt shows it.
    browser.find_elements(By.CSS_SELECTOR, "#groups .card")[1].click()
    assert count(browser, "#tokens span.tok") == 12
    assert count(browser, "#tokens span.tok.m1") == sum(other.loss_mask) == 4
    assert "active" in browser.find_elements(By.CSS_SELECTOR, "#groups .card")[1].get_attribute("class")

    shot = tmp_path / "inspect.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    assert console_errors(browser) == []


def test_long_trajectory_page_renders(browser, tmp_path, record_property):
    """20 turns, >= 8,000 tokens: every token rendered, hover and click answer; timings reported."""
    from selenium.webdriver.common.by import By

    if QWEN.is_dir():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(QWEN))
        encode = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
        flags = ["--tokenizer", str(QWEN)]
    else:  # still a real 8,000-token page, showing ids
        encode = lambda s: [ord(c) for c in s]  # noqa: E731
        flags = []
    t = long_trajectory(encode, turns=20, min_tokens=8000)
    assert len(t.token_ids) >= 8000 and len([s for s in t.spans if s.kind == "tool"]) == 20
    write_jsonl(str(tmp_path / "long.jsonl"), [t])
    page = tmp_path / "long.html"
    assert run_inspect([str(tmp_path / "long.jsonl"), "--html", str(page), *flags]) == 0

    load_s = open_page(browser, page)
    render_ms = browser.execute_script("return window.agentrlRenderMs")
    ready_ms = browser.execute_script("return window.agentrlReadyMs")
    assert count(browser, "#tokens span.tok") == len(t.token_ids)
    assert count(browser, "#tokens span.tok.m1") == sum(t.loss_mask)

    # The long system prompt is folded (its tokens stay in the DOM); its label unfolds it. Clicked
    # by element, not by pointer position: under CPU load the lazily laid-out page may still move.
    assert count(browser, "#tokens .seg.folded") == 1
    browser.execute_script("document.querySelector('#tokens .seg.folded .fold').click()")
    assert count(browser, "#tokens .seg.folded") == 0

    # Scroll through the whole trajectory in steps; time it (content-visibility lays out lazily).
    t0 = time.perf_counter()
    height = browser.execute_script("return document.body.scrollHeight")
    for y in range(0, height, 900):
        browser.execute_script("window.scrollTo(0, arguments[0]); return document.body.offsetHeight", y)
    scroll_s = time.perf_counter() - t0

    # Hover and click the last token by its data-i, not by pointer position: a real pointer left
    # over the tokens gets a fresh mouseover whenever layout moves another token under it (CPU
    # load delays layout), which once showed a middle token's id. The hover event and the read of
    # the details run in one script, so nothing can come between them; a click pins the token,
    # and a pinned token ignores hover.
    last_i = len(t.token_ids) - 1
    hovered = browser.execute_script("""
        var e = document.querySelector('#tokens span.tok[data-i="' + arguments[0] + '"]');
        e.scrollIntoView({block: 'center'});
        e.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
        return [document.querySelector('#details [data-field="pos"]').textContent,
                document.querySelector('#details [data-field="id"]').textContent];""", last_i)
    assert hovered == [f"#{last_i} of {len(t.token_ids)} (response)", str(t.token_ids[-1])]
    last = browser.find_element(By.CSS_SELECTOR, f'#tokens span.tok[data-i="{last_i}"]')
    browser.execute_script("arguments[0].click()", last)
    field = lambda name: browser.find_element(By.CSS_SELECTOR, f'#details [data-field="{name}"]').text
    assert field("id") == str(t.token_ids[-1])
    assert "sel" in last.get_attribute("class")
    assert browser.find_element(By.CSS_SELECTOR, "#details .hint").text.startswith("pinned")
    browser.save_screenshot(str(tmp_path / "long.png"))
    assert console_errors(browser) == []

    size_mb = page.stat().st_size / 1e6
    for k, v in [("tokens", len(t.token_ids)), ("page_mb", round(size_mb, 2)), ("load_s", round(load_s, 3)),
                 ("ready_ms", round(ready_ms, 1)), ("render_ms", round(render_ms, 1)),
                 ("scroll_s", round(scroll_s, 3))]:
        record_property(k, v)
    print(f"\n[inspect long page] {len(t.token_ids)} tokens, {size_mb:.2f} MB: load {load_s:.2f}s "
          f"(ready at {ready_ms:.0f} ms after navigation, render {render_ms:.0f} ms), "
          f"scroll through {height}px in {scroll_s:.2f}s")


def test_evaluation_page_and_chart_labels(browser, tmp_path):
    """An evaluation attempt says so and shows no training figures; chart y labels stay inside the chart."""
    import json
    import re

    from agentrl.inspect.svg import TICK_CHAR_PX
    from agentrl.types import TrainerMarks

    (tmp_path / "rollouts").mkdir()
    write_jsonl(str(tmp_path / "rollouts" / "step_000001.jsonl"), [known_example().trajectory])
    ev = []
    for i in range(2):
        t = known_example().trajectory
        t.group_id, t.sample_index, t.trained = f"eval/test-{i}", 0, TrainerMarks()  # as evaluate writes it
        ev.append(t)
    write_jsonl(str(tmp_path / "rollouts" / "eval_step_000001.jsonl"), ev)
    rows = [{"step": 1, "reward/mean": 0.5, "loss": 2.73e-08}, {"step": 2, "reward/mean": 0.7, "loss": -5.96e-08}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = tmp_path / "eval.html"
    assert run_inspect([str(tmp_path), "--html", str(page), "--eval"]) == 0

    open_page(browser, page)
    text = lambda css: browser.execute_script("return document.querySelector(arguments[0]).innerText", css)
    head = text("#trajhead")
    assert "eval @ step 1 · group eval/test-0" in head and "evaluation (never trained)" in head
    assert re.search(r"advantage [-+—\d]", head) is None and "(trained " not in head
    labels = browser.execute_script("return Array.from(document.querySelectorAll('#tokens .lab'), e => e.textContent)")
    assert not any("· trained" in s for s in labels) and "model 6–10 · sampled 4 (evaluation: not trained)" in labels
    cards = browser.execute_script("return Array.from(document.querySelectorAll('#groups .card'), e => e.innerText)")
    assert len(cards) == 2 and all("trained" not in c and " A " not in c for c in cards)
    assert text("#groups h3").startswith("eval @ step 1 · group eval/test-0")
    browser.execute_script("document.querySelector('#tokens span.tok[data-i=\"13\"]').click()")
    field = lambda name: text(f'#details [data-field="{name}"]')
    assert field("adv") == "— (evaluation: never trained)"
    assert field("mask") == "1 · sampled (evaluation: not trained)"
    assert field("old") == "evaluation: never trained"
    assert "eval @ step 1" in text("table.summary tr.eval")

    # Every y label of every chart is drawn inside its chart and no wider than the margin allows.
    ticks = browser.execute_script("""return Array.from(document.querySelectorAll('.chart .yl'), e => {
        var b = e.getBBox(); return [e.textContent, b.x, b.width]; });""")
    assert len(ticks) == 4 and "27.3n" in [t for t, _, _ in ticks]
    for label, x, w in ticks:
        assert x >= 0 and w <= len(label) * TICK_CHAR_PX, (label, x, w)
    assert console_errors(browser) == []
