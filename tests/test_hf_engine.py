"""HFEngine: exact log-probs, stopping, seeding, ragged batches, and the fast decoder's exactness."""

from __future__ import annotations

import pytest
import torch

from agentrl.engines.base import SamplingParams
from agentrl.engines.decode import FastDecoder, make_decoder, max_logit_gap
from agentrl.engines.hf import HFEngine
from agentrl.engines.sampling import StopStrings, sample_tokens
from agentrl.engines.stock_decoder import StockDecoder
from agentrl.engines.prefix_cache import PrefillPlan, PrefixCache
from agentrl.models.tiny import build_tiny_model


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


@pytest.fixture()
def engine(model_dir) -> HFEngine:
    return HFEngine.from_pretrained(model_dir)


def _prompts(engine: HFEngine) -> list[list[int]]:
    tok = engine.tokenizer
    chat = tok.apply_chat_template([{"role": "user", "content": "What is 17 * 23?"}], add_generation_prompt=True,
                                   return_dict=False)
    return [chat, [5, 400, 77], chat[:9], [300]]  # lengths 26, 3, 9, 1


def _teacher_forced(model, prompt: list[int], sampled: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each sampled id, from one stock forward over prompt + sampled."""
    ids = torch.tensor([prompt + sampled])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1: -1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(-1, torch.tensor(sampled)[:, None])[:, 0]


def test_tiny_qwen2_uses_the_fast_decoder_and_it_matches_transformers(engine):
    assert isinstance(engine.decoder, FastDecoder)
    assert max_logit_gap(engine.model, FastDecoder(engine.model)) < 1e-4


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_logprobs_equal_teacher_forcing_on_ragged_batch(engine, temperature, top_p):
    prompts = _prompts(engine)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=temperature, top_p=top_p, seed=3))
    for prompt, g in zip(prompts, out):
        assert len(g.token_ids) == len(g.logprobs) == 12 and g.finish_reason == "length"
        ref = _teacher_forced(engine.model, prompt, g.token_ids, temperature)
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4), (prompt[:3], g.logprobs, ref.tolist())


def test_stock_decoder_gives_the_same_samples(engine):
    prompts = _prompts(engine)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=11)
    fast = engine.generate(prompts, params)
    engine._decoder = StockDecoder(engine.model)
    stock = engine.generate(prompts, params)
    for f, s, prompt in zip(fast, stock, prompts):
        assert f.token_ids == s.token_ids
        assert torch.allclose(torch.tensor(f.logprobs), torch.tensor(s.logprobs), atol=1e-4)
        ref = _teacher_forced(engine.model, prompt, s.token_ids, 1.0)
        assert torch.allclose(torch.tensor(s.logprobs), ref, atol=1e-4)


def test_greedy_is_deterministic_and_matches_transformers_generate(engine):
    prompts = _prompts(engine)
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    a, b = engine.generate(prompts, params), engine.generate(prompts, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    with torch.no_grad():
        ref = engine.model.generate(torch.tensor([prompts[0]]), max_new_tokens=8, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)
    assert a[0].token_ids == ref[0, len(prompts[0]):].tolist()


def test_ragged_rows_match_each_prompt_alone(engine):
    prompts = _prompts(engine)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    together = engine.generate(prompts, params)
    for prompt, g in zip(prompts, together):
        assert engine.generate([prompt], params)[0].token_ids == g.token_ids


def test_seeded_sampling_is_reproducible(engine):
    prompts = _prompts(engine)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=42)
    a, b = engine.generate(prompts, params), engine.generate(prompts, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    # The second call starts from the first one's kept KV (other matmul shapes: last-bit
    # differences); without the prefix cache the repeat is bitwise identical.
    for g, h in zip(a, b):
        assert g.logprobs == pytest.approx(h.logprobs, abs=1e-5)
    plain = HFEngine(engine.model, engine.tokenizer, max_cached_tokens=0)
    first, again = plain.generate(prompts, params), plain.generate(prompts, params)
    assert [g.logprobs for g in first] == [g.logprobs for g in again]
    other = engine.generate(prompts, SamplingParams(max_new_tokens=10, temperature=1.0, seed=43))
    assert [g.token_ids for g in other] != [g.token_ids for g in a]
    # A row's draws do not depend on the rows after it in the batch.
    assert engine.generate(prompts[:1], params)[0].token_ids == a[0].token_ids
    # Without a seed, the engine's generator moves on: consecutive calls differ.
    free = SamplingParams(max_new_tokens=10, temperature=1.0)
    assert engine.generate(prompts, free)[0].token_ids != engine.generate(prompts, free)[0].token_ids


def test_identical_prompts_sample_independently(engine):
    prompt = _prompts(engine)[0]
    out = engine.generate([prompt] * 4, SamplingParams(max_new_tokens=10, temperature=1.0, seed=0))
    assert len({tuple(g.token_ids) for g in out}) == 4
    for g in out:
        assert torch.allclose(torch.tensor(g.logprobs), _teacher_forced(engine.model, prompt, g.token_ids, 1.0),
                              atol=1e-4)


def test_stop_token_ends_row_and_is_kept(engine):
    prompts = _prompts(engine)
    greedy = engine.generate(prompts, SamplingParams(max_new_tokens=10, temperature=0.0))
    stop = greedy[0].token_ids[3]
    first = greedy[0].token_ids.index(stop)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=[stop]))
    assert out[0].token_ids == greedy[0].token_ids[: first + 1] and out[0].finish_reason == "stop"
    for g, full in zip(out[1:], greedy[1:]):  # other rows: unaffected by row 0 leaving the batch
        cut = full.token_ids.index(stop) + 1 if stop in full.token_ids else len(full.token_ids)
        assert g.token_ids == full.token_ids[:cut]
        assert g.finish_reason == ("stop" if stop in full.token_ids else "length")
        assert g.logprobs == pytest.approx(full.logprobs[:cut], abs=1e-5)


def test_stop_string_ends_row(engine):
    prompts = _prompts(engine)
    greedy = engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0))
    tok = engine.tokenizer
    ids = greedy[1].token_ids
    text = tok.decode(ids)
    stop = text[len(tok.decode(ids[:4])) - 2: len(tok.decode(ids[:5]))].strip() or text[-3:]
    k = next(i for i in range(1, len(ids) + 1) if stop in tok.decode(ids[:i]))
    out = engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0, stop_strings=[stop]))
    assert out[1].token_ids == ids[:k] and out[1].finish_reason == "stop"
    assert stop in tok.decode(out[1].token_ids) and stop not in tok.decode(out[1].token_ids[:-1])


def test_stop_strings_detects_a_string_inside_the_last_token(engine):
    tok = engine.tokenizer
    ids = tok.encode("the answer is 42</answer>\nok", add_special_tokens=False)
    close = tok.convert_tokens_to_ids("</answer>")
    checker = StopStrings(tok, ["</answer>"])
    at = ids.index(close)
    assert checker.hits([ids[:at], ids[: at + 1], ids[: at + 2]]) == [False, True, False]
    # A stop string that ends mid-token still fires on that token.
    long_token = next(i for i in range(11, len(tok)) if len(tok.decode([i]).strip()) >= 4)
    middle = tok.decode([long_token]).strip()[1:3]
    assert StopStrings(tok, [middle]).hits([[5, long_token], [long_token, 5]]) == [True, False]
    assert StopStrings(tok, []).hits([[5, long_token]]) == [False]


def test_max_new_tokens_and_length_finish(engine):
    out = engine.generate(_prompts(engine), SamplingParams(max_new_tokens=3, temperature=1.0, seed=0))
    assert all(len(g.token_ids) == 3 and g.finish_reason == "length" for g in out)
    zero = engine.generate(_prompts(engine), SamplingParams(max_new_tokens=0))
    assert all(g.token_ids == [] and g.finish_reason == "length" for g in zero)
    assert engine.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        engine.generate([[1]], SamplingParams(top_p=0.0))


def test_weight_updates_are_seen_without_reloading(engine):
    prompts = _prompts(engine)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    before = engine.generate(prompts, params)
    engine.model.train()
    with torch.no_grad():  # what an optimizer step does: in-place on the shared parameters
        engine.model.model.layers[-1].mlp.down_proj.weight.add_(torch.randn_like(
            engine.model.model.layers[-1].mlp.down_proj.weight, generator=torch.Generator().manual_seed(0)))
    engine.sync_weights(engine.model)
    assert engine.policy_version == 1
    after = engine.generate(prompts, params)
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    assert engine.model.training  # the trainer's mode is restored
    for prompt, g in zip(prompts, after):
        assert torch.allclose(torch.tensor(g.logprobs), _teacher_forced(engine.model, prompt, g.token_ids, 0.0),
                              atol=1e-4)


class _Adapted(torch.nn.Module):
    """A LoRA-like wrapper: base projection plus a learned delta."""

    def __init__(self, base: torch.nn.Linear):
        super().__init__()
        self.base = base
        self.delta = torch.nn.Linear(base.in_features, base.out_features, bias=False)
        torch.nn.init.normal_(self.delta.weight, std=0.5, generator=torch.Generator().manual_seed(1))

    @property
    def weight(self):
        return self.base.weight

    def forward(self, x):
        return self.base(x) + self.delta(x)


def test_adapter_wrapped_projection_switches_to_the_stock_decoder(engine):
    prompts = _prompts(engine)
    assert isinstance(engine.decoder, FastDecoder)
    layer = engine.model.model.layers[0]
    layer.self_attn.q_proj = _Adapted(layer.self_attn.q_proj)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=5, temperature=1.0, seed=0))
    assert isinstance(engine.decoder, StockDecoder)
    for prompt, g in zip(prompts, out):
        assert torch.allclose(torch.tensor(g.logprobs), _teacher_forced(engine.model, prompt, g.token_ids, 1.0),
                              atol=1e-4)


def test_thread_count_applies_to_the_call_only(model_dir):
    small = HFEngine.from_pretrained(model_dir)
    assert small.num_threads == 1  # tiny model on CPU
    torch.set_num_threads(2)
    try:
        small.generate([[1, 2]], SamplingParams(max_new_tokens=2))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


def test_sync_weights_adopts_a_different_model(engine, model_dir):
    from transformers import AutoModelForCausalLM

    prompts = _prompts(engine)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(model_dir.parent / "seed7", seed=7)).eval()
    before = engine.generate(prompts, params)
    engine.sync_weights(other)
    assert engine.model is other and engine.policy_version == 1
    after = engine.generate(prompts, params)
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    for prompt, g in zip(prompts, after):
        assert torch.allclose(torch.tensor(g.logprobs), _teacher_forced(other, prompt, g.token_ids, 0.0), atol=1e-4)
    engine.sync_weights()
    assert engine.model is other and engine.policy_version == 2


def test_from_pretrained_offline_error_names_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as info:
        HFEngine.from_pretrained("agentrl-test/no-such-model-anywhere")
    message = str(info.value)
    assert "no-such-model-anywhere" in message and "offline" in message
    assert "local directory" in message and "ensure_tiny_model" in message
    with pytest.raises(FileNotFoundError, match="no directory"):
        HFEngine.from_pretrained("/nonexistent/agentrl/model")


@pytest.mark.parametrize("arch,kv_heads", [("llama", 4), ("llama", 1), ("qwen3", 2)])
def test_fast_decoder_covers_llama_and_qwen3(arch, kv_heads):
    model = _small_model(arch, kv_heads)
    assert isinstance(make_decoder(model), FastDecoder)
    assert max_logit_gap(model, FastDecoder(model)) < 1e-4
    out = HFEngine(model, None).generate([[3, 4, 5, 6], [7]], SamplingParams(max_new_tokens=6, seed=1))
    for prompt, g in zip([[3, 4, 5, 6], [7]], out):
        assert torch.allclose(torch.tensor(g.logprobs), _teacher_forced(model, prompt, g.token_ids, 1.0), atol=1e-4)


def test_make_decoder_falls_back_for_other_architectures():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64,
                                       bos_token_id=0, eos_token_id=0)).eval()
    assert isinstance(make_decoder(model), StockDecoder)
    engine = HFEngine(model, tokenizer=None)
    out = engine.generate([[1, 2, 3], [4]], SamplingParams(max_new_tokens=5, temperature=1.0, seed=0))
    for prompt, g in zip([[1, 2, 3], [4]], out):
        assert torch.allclose(torch.tensor(g.logprobs), _teacher_forced(model, prompt, g.token_ids, 1.0), atol=1e-4)


def test_sample_tokens_follows_the_distribution_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(1000, 1)
    quantiles = (torch.arange(1000) + 0.5) / 1000  # exact quantiles: counts equal p * 1000
    tokens, logp = sample_tokens(logits.clone(), temperature=1.0, top_p=1.0, uniforms=quantiles)
    assert torch.bincount(tokens, minlength=4).tolist() == [500, 300, 150, 50]
    assert torch.allclose(logp, logits[0][tokens], atol=1e-6)
    # top_p=0.8 keeps {0.5, 0.3}: renormalised to 0.625 / 0.375; log-probs stay untruncated.
    tokens, logp = sample_tokens(logits.clone(), temperature=1.0, top_p=0.8, uniforms=quantiles)
    assert torch.bincount(tokens, minlength=4).tolist() == [625, 375, 0, 0]
    assert torch.allclose(logp, logits[0][tokens], atol=1e-6)
    # Temperature sharpens; u just below 1 never picks a token outside the nucleus.
    tokens, logp = sample_tokens(logits[:1].clone(), temperature=0.5, top_p=0.5, uniforms=torch.tensor([0.999999]))
    assert tokens.tolist() == [0]
    assert logp.item() == pytest.approx(torch.log_softmax(logits[0] / 0.5, -1)[0].item(), abs=1e-6)
    greedy, logp = sample_tokens(logits[:2].clone(), temperature=0.0, top_p=1.0, uniforms=torch.zeros(2))
    assert greedy.tolist() == [0, 0] and logp[0].item() == pytest.approx(0.5 ** 0 * torch.log(torch.tensor(0.5)).item())


@pytest.mark.parametrize("vocab,spread", [(1000, 3.0), (3000, 6.0), (3000, 0.01)])
def test_sample_tokens_matches_softmax_on_big_vocabularies(vocab, spread):
    # Several blocks plus a ragged tail (1000 = 31 * 32 + 8, 3000 = 46 * 64 + 56); spread 6 puts the
    # top-p nucleus in the first 1024 candidates, spread 0.01 (near uniform) forces the full sort.
    n = 2000
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(vocab)) * spread
    quantiles = (torch.arange(n) + 0.5) / n
    probs = torch.softmax(logits / 0.8, -1)
    tokens, logp = sample_tokens(logits.repeat(n, 1), temperature=0.8, top_p=1.0, uniforms=quantiles)
    counts = torch.bincount(tokens, minlength=vocab).float()
    assert (counts - probs * n).abs().max() <= 1.01
    assert torch.allclose(logp, probs.log()[tokens], atol=1e-5)

    sorted_p, order = probs.sort(descending=True)
    kept = order[(sorted_p.cumsum(0) - sorted_p) < 0.9]
    nucleus = torch.zeros(vocab)
    nucleus[kept] = probs[kept] / probs[kept].sum()
    tokens, logp = sample_tokens(logits.repeat(n, 1), temperature=0.8, top_p=0.9, uniforms=quantiles)
    counts = torch.bincount(tokens, minlength=vocab).float()
    assert (counts - nucleus * n).abs().max() <= 1.01
    assert set(tokens.unique().tolist()) <= set(kept.tolist())
    assert torch.allclose(logp, probs.log()[tokens], atol=1e-5)


def test_greedy_picks_the_first_maximum_on_a_big_vocabulary():
    logits = torch.randn(6, 3001, generator=torch.Generator().manual_seed(0))
    logits[1, 3000] = 50.0  # in the short last block
    logits[2, [7, 2000]] = 50.0  # a tie: the first index wins, like torch.argmax
    tokens, logp = sample_tokens(logits.clone(), temperature=0.0, top_p=1.0, uniforms=torch.zeros(6))
    assert tokens.tolist() == logits.argmax(-1).tolist() and tokens[1] == 3000 and tokens[2] == 7
    assert torch.allclose(logp, torch.log_softmax(logits, -1).gather(-1, tokens[:, None])[:, 0], atol=1e-5)


# -- prefix cache: KV kept across calls -------------------------------------------------------

def _next_turn(prompts: list[list[int]], outs, turn: int) -> list[list[int]]:
    """The rollout's next prompts: each row's prompt, its sampled ids (every third row keeps only
    half of them, as when a turn is cut or rewritten), then a few template/tool ids of its own."""
    nxt = []
    for r, (p, g) in enumerate(zip(prompts, outs)):
        ids = g.token_ids[: len(g.token_ids) // 2] if r % 3 == 2 else g.token_ids
        nxt.append(p + ids + [2, 1] + [40 + (r + turn) % 7] * (1 + (r + turn) % 4))
    return nxt


def _multi_turn(engine: HFEngine, params: SamplingParams, turns: int = 3, chat: list[int] | None = None):
    """Runs ``turns`` generate calls on growing ragged prompts (two groups of identical prompts,
    one prompt too short to cache); returns every turn's prompts, outputs and computed tokens."""
    chat = chat or _prompts(engine)[0]
    prompts = [chat] * 3 + [chat[:20] + [77, 78]] * 2 + [[5, 60, 77], chat[:17]]
    history = []
    for turn in range(turns):
        seeded = SamplingParams(**{**vars(params), "seed": None if params.seed is None else params.seed + turn})
        outs = engine.generate(prompts, seeded)
        history.append((prompts, outs, engine.decoder.computed_tokens))
        prompts = _next_turn(prompts, outs, turn)
    return history


@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=9, temperature=0.0),
    SamplingParams(max_new_tokens=9, temperature=1.0, seed=5),
    SamplingParams(max_new_tokens=9, temperature=0.8, top_p=0.9, seed=8),
], ids=["greedy", "seeded", "top_p"])
def test_prefix_cache_gives_the_same_samples_and_logprobs_across_turns(model_dir, params):
    cached = HFEngine.from_pretrained(model_dir)
    plain = HFEngine(cached.model, cached.tokenizer, max_cached_tokens=0)
    assert plain.prefix_cache is None and cached.prefix_cache is not None
    with_cache, without = _multi_turn(cached, params), _multi_turn(plain, params)
    for turn, ((prompts, a, computed), (prompts_b, b, full)) in enumerate(zip(with_cache, without)):
        assert prompts == prompts_b
        for prompt, g, h in zip(prompts, a, b):
            assert g.token_ids == h.token_ids and g.finish_reason == h.finish_reason
            assert g.logprobs == pytest.approx(h.logprobs, abs=1e-5)
            ref = _teacher_forced(cached.model, prompt, g.token_ids, params.temperature)
            assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4)
        assert full == sum(len(p) for p in {tuple(p) for p in prompts})
        if turn == 0:
            assert computed == full
        else:  # only the new tail of each conversation ran through the model
            assert computed < full / 3, (turn, computed, full)
    assert 0 < cached.prefix_cache.tokens <= cached.prefix_cache.max_tokens


def _small_model(arch: str, kv_heads: int):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[arch]
    torch.manual_seed(0)
    model = model_cls(config_cls(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=24,
                                 bos_token_id=0, eos_token_id=1, pad_token_id=0)).eval()
    if arch == "qwen3":  # make the per-head q/k norms matter (they initialise to ones)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 2.0)
                layer.self_attn.k_norm.weight.uniform_(0.5, 2.0)
    return model


@pytest.mark.parametrize("arch,kv_heads", [("llama", 1), ("qwen3", 2)])
def test_prefix_cache_on_other_fast_architectures_and_in_row_chunks(arch, kv_heads, monkeypatch):
    import agentrl.engines.decode as decode

    # Near-uniform attention at this init: a pad key that leaked into attention would show.
    model = _small_model(arch, kv_heads)
    chat = [(7 * i + 3) % 90 + 2 for i in range(30)]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=4)
    plain = _multi_turn(HFEngine(model, None, max_cached_tokens=0), params, chat=chat)
    cached = _multi_turn(HFEngine(model, None), params, chat=chat)
    monkeypatch.setattr(decode, "_MASK_ELEMENTS", 1)  # one row per prefill attention call
    chunked = _multi_turn(HFEngine(model, None), params, chat=chat)
    for (prompts, a, _), (_, b, _), (_, c, computed) in zip(plain, cached, chunked):
        for prompt, g, h, k in zip(prompts, a, b, c):
            assert g.token_ids == h.token_ids == k.token_ids
            assert g.logprobs == pytest.approx(h.logprobs, abs=1e-5)
            assert g.logprobs == pytest.approx(k.logprobs, abs=1e-5)
            ref = _teacher_forced(model, prompt, g.token_ids, 1.0)
            assert torch.allclose(torch.tensor(k.logprobs), ref, atol=1e-4)
    assert computed < sum(len(p) for p in {tuple(p) for p in prompts}) / 2


def test_rows_that_stop_early_are_remembered_before_they_leave_the_batch(engine):
    prompts = [_prompts(engine)[0] + [i + 20] for i in range(8)]
    full = engine.generate(prompts, SamplingParams(max_new_tokens=10, temperature=1.0, seed=1))
    # Rows 0 and 1 stop at their 4th and 5th tokens (the same draws: uniforms are per row), so
    # the batch compacts with rows still running.
    stops = [full[0].token_ids[3], full[1].token_ids[4]]
    engine.clear_prefix_cache()
    out = engine.generate(prompts, SamplingParams(max_new_tokens=10, temperature=1.0, seed=1, stop_token_ids=stops))
    assert len(out[0].token_ids) <= 4 and len(out[1].token_ids) <= 5
    assert sum(g.finish_reason == "length" for g in out) >= 1
    for prompt, g, f in zip(prompts, out, full):
        assert g.token_ids == f.token_ids[: len(g.token_ids)]
        # every row's KV is kept: its prompt and all sampled ids but the last
        hit = engine.prefix_cache.lookup(prompt + g.token_ids + [3])
        assert hit is not None and list(hit.entry.tokens) == prompt + g.token_ids[:-1]
        assert hit.length == len(prompt) + len(g.token_ids) - 1


def test_prefix_cache_is_dropped_when_the_weights_change(engine):
    prompts = _prompts(engine)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    first = engine.generate(prompts, params)
    assert len(engine.prefix_cache) > 0
    engine.sync_weights()
    assert len(engine.prefix_cache) == 0
    follow = [p + g.token_ids + [2, 1] for p, g in zip(prompts, first)]
    engine.generate(follow, params)
    assert engine.decoder.computed_tokens == sum(len(p) for p in follow)  # nothing reused
    # An in-place update without sync_weights is caught too (the parameters' version counters).
    weight = engine.model.model.layers[0].mlp.up_proj.weight
    with torch.no_grad():
        weight.add_(torch.randn_like(weight, generator=torch.Generator().manual_seed(3)))
    again = [p + [2, 1] for p in follow]
    out = engine.generate(again, params)
    assert engine.decoder.computed_tokens == sum(len(p) for p in again)
    for prompt, g in zip(again, out):
        assert torch.allclose(torch.tensor(g.logprobs), _teacher_forced(engine.model, prompt, g.token_ids, 0.0),
                              atol=1e-4)


def test_prefix_cache_memory_is_bounded(model_dir):
    engine = HFEngine.from_pretrained(model_dir, max_cached_tokens=100)
    prompts = [_prompts(engine)[0] + [i + 20] for i in range(6)]
    engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))
    kept = len(prompts[0]) + 5  # per row: prompt and 5 of the 6 sampled ids
    assert engine.prefix_cache.tokens <= 100 and len(engine.prefix_cache) == 100 // kept < len(prompts)
    with pytest.raises(ValueError, match="0 to disable"):
        HFEngine(engine.model, engine.tokenizer, max_cached_tokens=-1)


def test_stock_decoder_multi_turn_is_exact_and_keeps_nothing(engine):
    engine._decoder = StockDecoder(engine.model)
    for prompts, outs, computed in _multi_turn(engine, SamplingParams(max_new_tokens=6, temperature=1.0, seed=2)):
        assert computed == sum(int(len(p)) for p in prompts)
        for prompt, g in zip(prompts, outs):
            ref = _teacher_forced(engine.model, prompt, g.token_ids, 1.0)
            assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4)
    assert len(engine.prefix_cache) == 0


def _kv(tokens: list[int]) -> torch.Tensor:
    """A recognisable KV block: element [..., i, :] holds tokens[i]."""
    return torch.tensor(tokens, dtype=torch.float32)[None, None, :, None].expand(2, 1, len(tokens), 3)


def test_prefix_cache_finds_the_longest_shared_prefix():
    cache = PrefixCache(max_tokens=1000, block=4)
    a, b = list(range(100, 120)), list(range(100, 110)) + list(range(500, 510))
    cache.insert(a, _kv(a), _kv(a))
    cache.insert(b, _kv(b), _kv(b))
    assert len(cache) == 2 and cache.tokens == 40
    hit = cache.lookup(a[:13] + [7, 7])  # inside a block: extended token by token
    assert hit.entry.tokens == tuple(a) and hit.length == 13
    assert torch.equal(hit.entry.keys[0, 0, :13, 0], torch.tensor(a[:13], dtype=torch.float32))
    assert cache.lookup(b[:12] + [1]).entry.tokens == tuple(b)
    assert cache.lookup(b[:12] + [1]).length == 12
    assert cache.lookup(a).length == 19  # never the whole prompt: its last token must run
    assert cache.lookup([100, 101, 102, 7, 8]) is None  # less than one whole shared block
    assert cache.lookup([9] * 20) is None
    cache.insert([1, 2, 3], _kv([1, 2, 3]), _kv([1, 2, 3]))  # shorter than a block: not kept
    assert len(cache) == 2
    with pytest.raises(ValueError, match="KV for 3 tokens"):
        cache.insert([1, 2, 3, 4], _kv([1, 2, 3]), _kv([1, 2, 3]))


def test_prefix_cache_evicts_least_recently_used_and_drops_extended_entries():
    cache = PrefixCache(max_tokens=30, block=4)
    seqs = [[s] * 10 for s in (1, 2, 3)]
    for s in seqs:
        cache.insert(s, _kv(s), _kv(s))
    assert cache.lookup(seqs[0] + [0]) is not None  # touching 1 makes 2 the oldest
    cache.insert([4] * 10, _kv([4] * 10), _kv([4] * 10))
    assert cache.tokens == 30 and cache.lookup(seqs[1] + [0]) is None
    assert cache.lookup(seqs[0] + [0]) is not None and cache.lookup(seqs[2] + [0]) is not None
    # The next turn of sequence 3 holds all of its KV: the shorter entry goes.
    longer = seqs[2] + [5] * 6
    cache.insert(longer, _kv(longer), _kv(longer))
    assert len(cache) == 2 and cache.tokens == 26
    assert cache.lookup(seqs[2] + [0]).entry.tokens == tuple(longer)
    cache.insert(list(range(40)), _kv(list(range(40))), _kv(list(range(40))))  # over the whole budget
    assert cache.tokens == 26
    cache.clear()
    assert len(cache) == 0 and cache.tokens == 0 and cache.lookup(longer) is None


def test_prefix_cache_never_trusts_a_hash_alone(monkeypatch):
    import agentrl.engines.prefix_cache as pc

    monkeypatch.setattr(pc, "block_hashes", lambda tokens, block: [0] * (len(tokens) // block))  # all collide
    cache = PrefixCache(max_tokens=100, block=4)
    cache.insert([1] * 8, _kv([1] * 8), _kv([1] * 8))
    assert cache.lookup([2] * 8 + [3]) is None
    assert cache.lookup([1] * 6 + [3]).length == 6


def test_prefill_plan_packs_only_the_tokens_past_each_cached_prefix():
    cache = PrefixCache(max_tokens=100, block=4)
    kept = list(range(10, 20))
    cache.insert(kept, _kv(kept), _kv(kept))
    prompts = [kept[:8] + [1, 2], [3, 4, 5], kept[:8] + [1, 2]]
    plan = PrefillPlan.build(prompts, cache, torch.device("cpu"))
    assert plan.row_src == [0, 1, 0] and plan.reused == [8, 0] and plan.width == 10 and plan.window == 3
    assert plan.ids.tolist() == [1, 2, 3, 4, 5] and plan.row_of.tolist() == [0, 0, 1, 1, 1]
    assert plan.slot.tolist() == [8, 9, 7, 8, 9]  # right-aligned in 10 slots
    assert plan.pos.tolist() == [8, 9, 0, 1, 2] and plan.ends.tolist() == [2, 5]
    assert PrefillPlan.build(prompts, None, torch.device("cpu")).reused == [0, 0]
