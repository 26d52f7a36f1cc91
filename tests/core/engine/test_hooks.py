"""Prefill/decode hooks: once per step, batch tensors, own embeddings, own sampler, extra outputs."""

import torch
from omni_core.scheduler import AREngine, ARHooks, EngineConfig, EngineRequest, SamplingParams


def test_family_embeddings_sampler_and_step_outputs_match_a_reference_loop(tiny_checkpoint, tiny_model):
    """A CosyVoice-shaped stage: the prompt is embeddings, generated tokens are fed back through
    the family's own table, a windowed sampler bans recent repeats, and post_decode adds codes."""
    hf, _ = tiny_checkpoint
    torch.manual_seed(3)
    feedback_table = torch.randn(128, 64) * 0.5
    window = 3
    calls = {"before_prefill": 0, "before_decode": 0, "sample": 0, "post_prefill": 0, "post_decode": 0, "finished": []}

    def no_recent_repeat(batch, logits):
        recent = batch.recent_tokens(window)  # [N, window], -1 padded
        banned = torch.zeros_like(logits, dtype=torch.bool)
        banned.scatter_(1, recent.clamp(min=0), recent >= 0)
        return logits.masked_fill(banned, float("-inf")).argmax(-1)

    class FamilyHooks(ARHooks):
        def before_prefill(self, batch):
            calls["before_prefill"] += 1

        def before_decode(self, batch):
            calls["before_decode"] += 1
            assert batch.input_embeds.shape == (len(batch.request_ids), 64)
            batch.input_embeds = feedback_table[batch.input_ids]

        def sample(self, batch, logits):
            calls["sample"] += 1
            return no_recent_repeat(batch, logits)

        def post_prefill(self, batch, hidden, logits, token_ids):
            calls["post_prefill"] += 1

        def post_decode(self, batch, hidden, logits, token_ids):
            calls["post_decode"] += 1
            batch.step_outputs["codes"] = torch.stack([token_ids, token_ids + 1], dim=1)

        def on_finish(self, request_id, extras, reason):
            calls["finished"].append((request_id, extras["tag"], reason))

    prompts = [torch.randn(n, 64) * 0.5 for n in (4, 9, 6)]
    engine = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=128), hooks=FamilyHooks())
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", prompt_embeds=p, params=SamplingParams(max_tokens=6, ignore_eos=True), extras={"tag": i}))
    tokens = {f"r{i}": [] for i in range(3)}
    codes = {f"r{i}": [] for i in range(3)}
    steps = {"prefill": 0, "decode": 0}
    while engine.has_unfinished():
        kind = "prefill" if engine.scheduler.waiting or engine.scheduler.prefilling else "decode"
        steps[kind] += 1
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            if "codes" in out.step_outputs:
                codes[out.request_id].append(out.step_outputs["codes"].tolist())

    # reference: full recompute with transformers on inputs_embeds, same feedback and sampler rule
    for i, p in enumerate(prompts):
        embeds, ref = p, []
        for _ in range(6):
            with torch.no_grad():
                logits = hf(inputs_embeds=embeds[None]).logits[0, -1:]
            recent = torch.tensor([([-1] * window + ref)[-window:]])
            banned = torch.zeros_like(logits, dtype=torch.bool)
            banned.scatter_(1, recent.clamp(min=0), recent >= 0)
            tok = int(logits.masked_fill(banned, float("-inf")).argmax())
            ref.append(tok)
            embeds = torch.cat([embeds, feedback_table[tok][None]])
        assert tokens[f"r{i}"] == ref
        assert codes[f"r{i}"] == [[t, t + 1] for t in ref[1:]]
    assert calls["before_prefill"] == calls["post_prefill"] == steps["prefill"]
    assert calls["before_decode"] == calls["post_decode"] == steps["decode"]
    assert calls["sample"] == steps["prefill"] + steps["decode"]
    assert sorted(calls["finished"]) == [("r0", 0, "length"), ("r1", 1, "length"), ("r2", 2, "length")]


def test_post_hook_may_replace_tokens_and_abort_reports_on_finish(tiny_model):
    finished = []

    class Forced(ARHooks):
        def post_decode(self, batch, hidden, logits, token_ids):
            return torch.full_like(token_ids, 7)

        def on_finish(self, request_id, extras, reason):
            finished.append((request_id, reason))

    engine = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=64), hooks=Forced())
    out = engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert out.token_ids[1:] == [7, 7, 7, 7]
    engine.add_request(EngineRequest("x", prompt_token_ids=[4, 5], params=SamplingParams(max_tokens=50)))
    engine.step()
    engine.abort("x")
    assert finished[-1] == ("x", "abort")
