"""Model names that are not local fail at once when the hub cannot be asked (issue 32, item 5).

Without network, ``from_pretrained`` of a hub name spent ~1 min on retries before it failed.
Now an offline variable or a hub that does not answer one short request keeps the load to
local files: a name in the Hugging Face cache loads, any other fails with the fix. These tests
never touch the network: every socket connection and DNS lookup raises and is recorded.
"""

from __future__ import annotations

import shutil
import socket
import time
import urllib.error
from pathlib import Path

import pytest

from agentrl.models import names
from agentrl.models.names import ModelNotLocal, hub_reachability, hub_refusal, is_hub_name, resolve_shortcut
from agentrl.models.tiny import ensure_tiny_model
from agentrl.run.build import load_model_and_tokenizer

ROOT = Path(__file__).resolve().parents[1]
ABSENT = "agentrl-test/no-such-model"
CACHED = "agentrl-test/tiny-cached"


@pytest.fixture
def no_network(monkeypatch):
    """Every connection attempt (a DNS lookup included) fails and is recorded; the probe's
    per-process answer starts empty."""
    attempts: list[object] = []

    def refuse(*args, **kwargs):
        attempts.append(args[:2])
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", lambda self, *a: refuse(*a))
    monkeypatch.setattr(names, "_PROBED", {})
    from huggingface_hub import constants

    # restored after the test: a refusal switches huggingface_hub offline for the process
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    return attempts


@pytest.fixture
def no_probe(monkeypatch):
    """The hub must not even be probed."""
    def probe(*a, **k):
        raise AssertionError("the hub was probed")
    monkeypatch.setattr(names, "_ask_hub", probe)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """A Hugging Face cache holding the tiny model under the hub name CACHED."""
    from huggingface_hub import constants

    root = tmp_path / "hub"
    repo = root / ("models--" + CACHED.replace("/", "--"))
    commit = "0" * 40
    shutil.copytree(ensure_tiny_model(seed=0), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    return root


def test_the_guard_sees_a_connection_attempt(no_network):
    import urllib.request

    with pytest.raises(OSError):
        urllib.request.urlopen("https://huggingface.co", timeout=1)
    assert no_network  # so an empty list below means no attempt was made


def test_names_are_classified_without_the_network(no_network, no_probe, tmp_path):
    assert is_hub_name(ABSENT) and is_hub_name("gpt2")
    assert not any(is_hub_name(n) for n in (str(tmp_path), "./model", "/abs/model", "~/m", "tiny", "smollm2"))
    # a local directory, a path or a shortcut never needs the hub: nothing is probed
    assert hub_refusal(str(tmp_path)) is None and hub_refusal("./absent-dir") is None and hub_refusal("tiny") is None
    assert no_network == []


def test_offline_variable_fails_an_uncached_name_without_any_network_call(no_network, no_probe, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(ModelNotLocal) as err:
        load_model_and_tokenizer(ABSENT)
    message = str(err.value)
    assert "HF_HUB_OFFLINE=1 is set" in message and "not in the Hugging Face cache" in message
    assert f"hf download {ABSENT} --local-dir DIR" in message and "model.path=DIR" in message
    assert "tiny" in message and "\n" not in message
    assert no_network == []
    assert time.perf_counter() - t0 < 30  # generous: it took ~1 min of retries before


def test_unreachable_hub_is_probed_once_and_never_retried(no_network, monkeypatch):
    calls = []

    def unreachable(endpoint, timeout):
        calls.append(endpoint)
        return f"{endpoint} is unreachable (test)"

    monkeypatch.setattr(names, "_ask_hub", unreachable)
    for _ in range(2):
        with pytest.raises(ModelNotLocal, match="unreachable \\(test\\)"):
            load_model_and_tokenizer(ABSENT)
    assert calls == ["https://huggingface.co"]  # one probe for the process, tokenizer and model included
    assert no_network == []  # and from_pretrained itself stayed with local files


def test_a_cached_hub_name_still_loads_offline(no_network, no_probe, hf_cache, monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    model, tok = load_model_and_tokenizer(CACHED)
    assert model.config.model_type == "qwen2" and tok.convert_ids_to_tokens(tok.encode("42")) == ["4", "2"]
    assert no_network == []


def test_a_cached_hub_name_loads_when_the_hub_is_unreachable(no_network, hf_cache, monkeypatch):
    monkeypatch.setattr(names, "_ask_hub", lambda endpoint, timeout: "unreachable (test)")
    model, _ = load_model_and_tokenizer(CACHED)
    assert model.config.model_type == "qwen2" and no_network == []


def test_a_hanging_probe_is_cut_at_its_timeout(monkeypatch):
    monkeypatch.setattr(names, "_PROBED", {})
    monkeypatch.setattr(names, "_ask_hub", lambda endpoint, timeout: time.sleep(10))
    t0 = time.perf_counter()
    assert "did not answer within 0.2 s" in hub_reachability(timeout=0.2)
    assert time.perf_counter() - t0 < 5


def test_probe_counts_any_http_answer_as_reachable(monkeypatch):
    import urllib.request

    def http_error(request, timeout):
        raise urllib.error.HTTPError(request.full_url, 503, "busy", {}, None)

    monkeypatch.setattr(urllib.request, "urlopen", http_error)
    assert names._ask_hub("https://hub.example", 1.0) is None

    def no_route(request, timeout):
        raise urllib.error.URLError(OSError("no route to host"))

    monkeypatch.setattr(urllib.request, "urlopen", no_route)
    assert "https://hub.example is unreachable" in names._ask_hub("https://hub.example", 1.0)


def test_probe_reads_hf_endpoint(no_network, monkeypatch):
    seen = []
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example/")
    monkeypatch.setattr(names, "_ask_hub", lambda endpoint, timeout: seen.append(endpoint))
    assert hub_reachability() is None and seen == ["https://mirror.example"]


def test_check_template_takes_tiny_like_train_and_serve(capsys):
    from agentrl.chat.check import run_check_template

    assert resolve_shortcut("tiny") == str(ensure_tiny_model(seed=0))  # the directory train uses (model.tiny_seed=0)
    assert run_check_template("tiny", None) == 0
    out = capsys.readouterr().out
    assert out.startswith("PASS: the chat template of tiny") and "model.tool_call_format=NAME" in out
    assert "tool_call_format=" not in out.replace("model.tool_call_format=", "")  # no Python-syntax hint


def test_check_template_fails_an_uncached_name_offline_at_once(no_network, no_probe, capsys, monkeypatch):
    from agentrl.chat.check import run_check_template

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert run_check_template(ABSENT, None) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"error: cannot load a tokenizer for model id {ABSENT!r}") and out.count("\n") == 1
    assert "HF_HUB_OFFLINE=1 is set" in out and f"hf download {ABSENT}" in out
    assert no_network == []


def test_serve_fails_an_uncached_name_offline_at_once(no_network, no_probe, monkeypatch):
    from agentrl.run.serve_cli import build_service

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotLocal, match="agentrl serve DIR"):
        build_service(ABSENT)
    assert no_network == []


def test_template_and_format_hints_name_the_config_key_and_the_flag():
    from agentrl.chat.formats import FIX
    from agentrl.chat.template import TemplateError, resolve_template_source

    class NoTemplate:
        chat_template = None

    with pytest.raises(TemplateError) as err:
        resolve_template_source(NoTemplate(), None)
    message = str(err.value)
    assert "model.template=hermes" in message and "--template hermes" in message
    assert "template='hermes'" not in message.replace("ChatTemplate(tokenizer, 'hermes')", "")
    assert "model.tool_call_format=NAME" in FIX and "agentrl train CONFIG model.tool_call_format=NAME" in FIX


def test_a_local_directory_without_a_model_says_so(tmp_path):
    from agentrl.types import ConfigError

    # a local directory that holds no model keeps its own message (no hub wording), as one error
    with pytest.raises(ConfigError) as err:
        load_model_and_tokenizer(str(tmp_path))
    assert "exists but holds no loadable model" in str(err.value) and not isinstance(err.value, ModelNotLocal)


def test_warm_start_of_a_hub_name_reads_the_cached_copy_or_says_how(no_network, no_probe, hf_cache):
    from agentrl.run.build import make_env, resolve_model_path
    from agentrl.run.config import load_config

    cfg = load_config(ROOT / "examples/arithmetic_tiny.yaml", [f"model.path={ABSENT}"])
    with pytest.raises(ModelNotLocal) as err:
        resolve_model_path(cfg, make_env(cfg))
    assert f"hf download {ABSENT} --local-dir DIR" in str(err.value) and "warmstart.enabled=false" in str(err.value)
    snapshot = names.cached_snapshot(CACHED)
    assert Path(snapshot) == hf_cache / ("models--" + CACHED.replace("/", "--")) / "snapshots" / ("0" * 40)
    assert no_network == []
