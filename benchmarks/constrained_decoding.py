"""Per-token overhead of constrained decoding: llguidance, xgrammar and outlines-core.

For each model (the tiny model, SmolLM2-135M-Instruct) and each schema, a valid compact JSON
instance is tokenized and replayed token by token through each library's matcher, doing per
token what a decode step does: compute the allowed set, apply it to a (1, V) float32 logits
row (-inf outside it), and advance by the token. Reported: microseconds per token (median of
``--repeats`` replays, the mean over the tokens of one replay), the one-off tokenizer setup
and the per-schema compile time, next to the model's own decode step (the HF engine,
unconstrained, batch 1), and end to end: the HF engine's ms per token with and without a
grammar (llguidance, the one agentrl uses) on the same tokens.

    python benchmarks/constrained_decoding.py            # both models, all three libraries
    python benchmarks/constrained_decoding.py --models tiny --repeats 5

Needs ``pip install llguidance==1.9.1 outlines-core==0.2.14`` and
``pip install --no-deps xgrammar==0.2.9 apache-tvm-ffi`` (xgrammar declares torch and triton;
--no-deps keeps triton out); a library that is missing is reported as such.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import torch

from agentrl.engines.grammar import Grammar, forbidden_tokens

SCHEMAS = {
    "flat": ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
              "required": ["a", "b"], "additionalProperties": False}, {"a": 1234, "b": True}),
    "nested": ({"type": "object", "properties": {
        "answer": {"type": "integer"}, "unit": {"enum": ["m", "s", "kg"]},
        "steps": {"type": "array", "items": {"type": "string"}},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "where": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                  "required": ["x", "y"], "additionalProperties": False}},
        "required": ["answer", "unit", "steps", "note", "where"], "additionalProperties": False},
        {"answer": 42, "unit": "kg", "steps": ["add the two numbers", "then multiply by three"],
         "note": "the result is exact", "where": {"x": 1.5, "y": -2.25}}),
    "json_object": ({"type": "object"}, {"name": "Ada Lovelace", "born": 1815, "tags": ["math", "engines"]}),
}


def _bytes_of_tokens(tokenizer) -> dict[int, bytes]:
    """Each token id's bytes (byte-level BPE: GPT-2's byte-to-unicode table reversed)."""
    # GPT-2's table: printable bytes stand for themselves, the others are shifted past 255.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + n)] = b
            n += 1
    inverse = table
    special = set(tokenizer.all_special_ids)
    out = {}
    for tok, i in tokenizer.get_vocab().items():
        if i in special:
            continue
        try:
            out[i] = bytes(inverse[c] for c in tok)
        except KeyError:  # an added token that is not byte-level
            out[i] = tok.encode()
    return out


class Llguidance:
    name = "llguidance 1.9.1"

    def __init__(self, tokenizer, vocab, eos):
        from agentrl.engines.grammar import Constrainer

        self.c = Constrainer(tokenizer, vocab)
        self.eos = eos
        self.bitmask = torch.empty(1, (vocab + 31) // 32, dtype=torch.int32)
        self.c.matcher(Grammar.json_object(), [eos])  # builds the tokenizer view (setup)

    def compile(self, schema):
        return self.c.matcher(Grammar.json_schema(schema), [self.eos])

    def fill(self, m):
        m.fill(self.bitmask, 0)
        return self.bitmask

    def advance(self, m, token):
        m.advance(token)


class Xgrammar:
    name = "xgrammar 0.2.9"

    def __init__(self, tokenizer, vocab, eos):
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=[eos])
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab)

    def compile(self, schema):
        cg = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        return self.xgr.GrammarMatcher(cg)

    def fill(self, m):
        m.fill_next_token_bitmask(self.bitmask)
        return self.bitmask

    def advance(self, m, token):
        assert m.accept_token(token)


class OutlinesCore:
    name = "outlines-core 0.2.14"

    def __init__(self, tokenizer, vocab, eos):
        import outlines_core as oc

        self.oc, self.vocab_size, self.eos = oc, vocab, eos
        by_bytes: dict[bytes, list[int]] = {}
        for i, b in _bytes_of_tokens(tokenizer).items():
            by_bytes.setdefault(b, []).append(i)
        self.vocabulary = oc.Vocabulary(eos, by_bytes)
        self.bitmask = torch.empty(1, (vocab + 31) // 32, dtype=torch.int32)

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema), "")  # no free whitespace
        return self.oc.Guide(self.oc.Index(regex, self.vocabulary))

    def fill(self, m):
        m.write_mask_into(self.bitmask.data_ptr(), self.bitmask.numel(), 4)
        return self.bitmask

    def advance(self, m, token):
        if token == self.eos and m.is_finished():  # its final state has no transition on EOS
            return
        m.advance(token, return_tokens=False)


LIBRARIES = (Llguidance, Xgrammar, OutlinesCore)


def measure(lib_cls, tokenizer, vocab, eos, traces, repeats) -> dict:
    t0 = time.perf_counter()
    try:
        lib = lib_cls(tokenizer, vocab, eos)
    except ImportError as e:
        return {"library": lib_cls.name, "error": f"not installed ({e})"}
    setup = time.perf_counter() - t0
    out = {"library": lib.name, "setup_ms": round(setup * 1e3, 1), "schemas": {}}
    for name, (schema, ids) in traces.items():
        t0 = time.perf_counter()
        lib.compile(schema)
        compile_ms = (time.perf_counter() - t0) * 1e3
        per_token = []
        for _ in range(repeats):
            m = lib.compile(schema)
            logits = torch.randn(1, vocab)
            spent = 0.0  # the library's own part: the allowed set and the advance
            t0 = time.perf_counter()
            for t in ids:
                t1 = time.perf_counter()
                bitmask = lib.fill(m)
                spent += time.perf_counter() - t1
                logits.masked_fill_(forbidden_tokens(bitmask, vocab)[0], float("-inf"))  # the engine's apply
                t1 = time.perf_counter()
                lib.advance(m, t)
                spent += time.perf_counter() - t1
            per_token.append(((time.perf_counter() - t0) / len(ids) * 1e6, spent / len(ids) * 1e6))
        out["schemas"][name] = {"tokens": len(ids), "compile_ms": round(compile_ms, 1),
                                "us_per_token": round(statistics.median(p[0] for p in per_token), 1),
                                "library_us_per_token": round(statistics.median(p[1] for p in per_token), 1)}
    return out


def engine_figures(engine, prompt, eos, schema, tokens=48) -> dict:
    """ms/token of the HF engine itself, batch 1: unconstrained, and constrained (llguidance)."""
    from agentrl.engines.base import SamplingParams

    def run(params):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            g = asyncio.run(engine.agenerate(prompt, params))
            best = min(best, (time.perf_counter() - t0) / len(g.token_ids))
        return best * 1e3, len(g.token_ids)

    plain, n = run(SamplingParams(max_new_tokens=tokens, seed=0))
    constrained, m = run(SamplingParams(max_new_tokens=tokens, seed=0, stop_token_ids=[eos],
                                        grammar=Grammar.json_schema(schema)))
    return {"decode_ms_per_token": round(plain, 2), "constrained_ms_per_token": round(constrained, 2),
            "tokens": [n, m]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from agentrl.engines.hf import HFEngine
    from agentrl.models.names import resolve_shortcut

    for model in args.models.split(","):
        path = resolve_shortcut(model)
        engine = HFEngine.from_pretrained(path, seed=0)
        tok = engine.tokenizer
        vocab = engine.model.get_output_embeddings().weight.shape[0]
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        traces = {k: (s, tok.encode(json.dumps(v, separators=(",", ":")), add_special_tokens=False) + [eos])
                  for k, (s, v) in SCHEMAS.items()}
        print(f"== {model} ({path}): vocab {vocab}")
        for lib in LIBRARIES:
            print(json.dumps(measure(lib, tok, vocab, eos, traces, args.repeats)))
        prompt = tok.encode("<|im_start|>user\nanswer<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        print(json.dumps({"engine": "hf", **engine_figures(engine, prompt, eos, SCHEMAS["nested"][0])}))


if __name__ == "__main__":
    main()
