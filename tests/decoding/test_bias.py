"""Branch-bias arithmetic on a 20-token oracle vocabulary, and real SmolLM2 behaviour."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from recjudge.decoding import (
    BranchBias,
    BranchBiasProcessor,
    Choice,
    DecisionSpec,
    EvidenceFirst,
    GrammarLogitsProcessor,
    branch_deltas,
    compile_schema,
    constrained_generate,
    replay_greedy,
)
from recjudge.decoding._schemas import NO_MARKER, YES_MARKER
from recjudge.llm import SamplingConfig

# A 20-token vocabulary. Token 19 brings the text to '{"evidence":'.
VOCAB = [
    b' ["',
    b' ["B',
    b" []",
    b" [],",
    b" [",
    b" ",
    b' ["A',
    b'": ["',
    b'":',
    b"x",
    b"y",
    b"z",
    b"q",
    b"w",
    b"e",
    b"r",
    b"t",
    b"u",
    b"i",
    b'{"evidence":',
]
YES, NO, UNDECIDED, MASKED = [0, 1, 6], [2, 3], [4, 5], list(range(7, 20))
SPEC = DecisionSpec(("YES", "NO"), (YES_MARKER, NO_MARKER))


def _proc(sigmas, betas, adaptive=True, block=True):
    p = BranchBiasProcessor(
        [SPEC] * len(sigmas), VOCAB, sigmas, beta=betas, adaptive=adaptive, block_one_sided=block
    )
    for row in range(len(sigmas)):
        p.accept(row, 19)
    return p


def _scores(seed, rows):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(rows, 20, generator=g) * 2
    s[:, MASKED] = float("-inf")  # what the grammar mask leaves
    return s


def _expected(row_scores, sigma, beta, adaptive):
    lse_y = torch.logsumexp(row_scores[YES].double(), 0).item()
    lse_n = torch.logsumexp(row_scores[NO].double(), 0).item()
    p_yes = 1 / (1 + math.exp(lse_n - lse_y))
    h = -(p_yes * math.log(p_yes) + (1 - p_yes) * math.log(1 - p_yes)) / math.log(2)
    delta = beta * (1 + h) * sigma if adaptive else beta * sigma
    p_after = 1 / (1 + math.exp((lse_n - delta) - (lse_y + delta)))
    return p_yes, h, delta, p_after


@pytest.mark.parametrize("adaptive", [True, False])
def test_bias_arithmetic_matches_formula(adaptive):
    sigmas, betas = [0.7, -0.3, 1.0], [25.0, 5.0, 0.5]
    proc = _proc(sigmas, betas, adaptive)
    scores = _scores(0, 3)
    before = scores.clone()
    proc(torch.zeros(3, 4, dtype=torch.long), scores)  # first call: nothing accepted
    for row, (sig, beta) in enumerate(zip(sigmas, betas, strict=True)):
        p_yes, h, delta, p_after = _expected(before[row], sig, beta, adaptive)
        rec = proc.records[row]
        assert rec.p_yes_before == pytest.approx(p_yes, abs=1e-9)
        assert rec.entropy == pytest.approx(h, abs=1e-9)
        assert rec.delta == pytest.approx((delta, -delta), abs=1e-9)
        assert rec.p_yes_after == pytest.approx(p_after, abs=1e-9)
        assert torch.allclose(scores[row, YES], before[row, YES] + delta, atol=1e-5)
        assert torch.allclose(scores[row, NO], before[row, NO] - delta, atol=1e-5)
        assert torch.equal(scores[row, UNDECIDED], before[row, UNDECIDED])
        assert torch.isinf(scores[row, MASKED]).all()
        assert rec.decision_steps == 1 and rec.step == 1


def test_beta_zero_leaves_logits_exactly_unchanged():
    proc = _proc([1.0, -1.0], [0.0, 0.0])
    scores = _scores(1, 2)
    before = scores.clone()
    proc(torch.zeros(2, 4, dtype=torch.long), scores)
    assert torch.equal(scores, before)
    assert proc.records[0].p_yes_before == proc.records[0].p_yes_after


def test_entropy_scaling_doubles_delta_at_max_uncertainty():
    scores = torch.full((1, 20), float("-inf"))
    scores[0, [0, 2]] = 0.0  # one YES and one NO token, equal mass
    proc = _proc([0.5], [10.0])
    proc(torch.zeros(1, 1, dtype=torch.long), scores)
    assert proc.records[0].entropy == pytest.approx(1.0)
    assert proc.records[0].delta[0] == pytest.approx(10.0)  # 10 * (1 + 1) * 0.5


def test_one_sided_step_is_blocked_until_both_can_decide():
    proc = BranchBiasProcessor([SPEC], VOCAB, [1.0], beta=5.0)
    proc.accept(0, 19)
    proc.generated[0] = bytearray(b'{"evidence')  # before the closing quote
    scores = torch.full((1, 20), float("-inf"))
    scores[0, 7] = 3.0  # '": ["' decides YES, and no NO token is possible here
    scores[0, 8] = 1.0  # '":' is undecided
    proc(torch.zeros(1, 1, dtype=torch.long), scores)
    assert scores[0, 7] == float("-inf") and scores[0, 8] == 1.0
    assert proc.records[0].blocked_steps == 1 and proc.records[0].decision_steps == 0
    unblocked = BranchBiasProcessor([SPEC], VOCAB, [1.0], beta=5.0, block_one_sided=False)
    unblocked.generated[0] = bytearray(b'{"evidence')
    s2 = torch.full((1, 20), float("-inf"))
    s2[0, 7], s2[0, 8] = 3.0, 1.0
    unblocked(torch.zeros(1, 1, dtype=torch.long), s2)
    assert s2[0, 7] == 3.0


def test_committed_rows_are_untouched_and_chosen_recorded():
    proc = _proc([1.0], [5.0])
    scores = _scores(2, 1)
    proc(torch.zeros(1, 1, dtype=torch.long), scores)
    proc(torch.tensor([[0, 0]]), scores.clone())  # accept ' ["' -> YES
    assert proc.records[0].chosen == "YES"
    after = _scores(3, 1)
    before = after.clone()
    proc(torch.tensor([[0, 0, 9]]), after)
    assert torch.equal(after, before)


def test_k_way_entropy_uses_ln_k():
    p = np.array([0.5, 0.3, 0.2])
    deltas, e = branch_deltas(p, np.array([1.0, 0.0, -1.0]), 2.0, True)
    h = -(p * np.log(p)).sum() / math.log(3)
    assert e == pytest.approx(h)
    assert deltas == pytest.approx([2.0 * (1 + h), 0.0, -2.0 * (1 + h)])


# -- real model -------------------------------------------------------------------------
def _prompt(llm, titles, candidate):
    hist = "\n".join(f"- {t}" for t in titles)
    return llm.chat_prompt(
        [
            {
                "role": "system",
                "content": "You judge whether a user would enjoy a movie given the "
                "movies they watched. List evidence titles from the history if and only if the "
                "candidate is relevant. Answer in JSON.",
            },
            {"role": "user", "content": f"History:\n{hist}\n\nCandidate: {candidate}"},
        ]
    )


@pytest.fixture(scope="module")
def user_titles(ml1m):
    return ml1m.history("10").item_id.tolist()[-12:]


@pytest.mark.parametrize(("sigma", "verdict"), [(1.0, "YES"), (-1.0, "NO")])
def test_smollm_strong_bias_controls_verdict(smollm, user_titles, sigma, verdict):
    """beta = 50: the sampled verdict follows sigma in at least 9 of 10 runs."""
    schema = EvidenceFirst(user_titles, max_evidence=1)
    prompt = _prompt(smollm, user_titles, "Jurassic Park (1993)")
    outs = constrained_generate(
        smollm,
        [prompt] * 10,
        schema,
        signal=[sigma] * 10,
        bias=BranchBias(beta=50.0),
        sampling=SamplingConfig.paper(seed=11, max_new_tokens=120),
    )
    verdicts = [o.value["is_relevant"] for o in outs]
    assert sum(v == verdict for v in verdicts) >= 9
    for o in outs:
        assert set(o.value["evidence"]) <= set(user_titles)
        assert o.record.chosen == o.value["is_relevant"]


def test_smollm_beta_zero_equals_unbiased_grammar(smollm, user_titles):
    schema = EvidenceFirst(user_titles, max_evidence=2)
    prompts = [
        _prompt(smollm, user_titles, c)
        for c in ("Toy Story (1995)", "Friday the 13th (1980)", "Casablanca (1942)")
    ]
    biased = constrained_generate(
        smollm,
        prompts,
        schema,
        signal=[1.0, -1.0, 0.5],
        bias=BranchBias(beta=0.0),
        sampling=SamplingConfig(max_new_tokens=100),
    )
    compiled = compile_schema(schema, smollm.tokenizer, smollm.vocab_size)
    grammar_only = GrammarLogitsProcessor([compiled] * 3)
    plain = smollm.generate(
        prompts, processors=[grammar_only], sampling=SamplingConfig(max_new_tokens=100)
    )
    for row, (b, p) in enumerate(zip(biased, plain, strict=True)):
        assert b.text == grammar_only.text(row)
        assert b.token_ids == p.token_ids
        assert b.record.decision_steps >= 1
        assert 0.0 < b.record.p_yes_before < 1.0


def test_smollm_choice_k_way_record(smollm):
    schema = Choice(["A wins", "B wins", "Tie"])
    prompt = smollm.chat_prompt(
        [
            {
                "role": "user",
                "content": "Which list is better for a sci-fi fan? A: Alien, Aliens. "
                "B: Notting Hill, Love Actually. Answer A wins, B wins or Tie.",
            }
        ]
    )
    out = constrained_generate(
        smollm,
        [prompt],
        schema,
        signal=[[1.0, -1.0, 0.0]],
        bias=BranchBias(beta=3.0),
        sampling=SamplingConfig(max_new_tokens=20),
    )[0]
    rec = out.record
    assert out.value["answer"] in schema.options
    assert rec.chosen == out.value["answer"]
    assert sum(rec.p_before) == pytest.approx(1.0)
    p = np.array(rec.p_before)
    assert rec.entropy == pytest.approx(float(-(p[p > 0] * np.log(p[p > 0])).sum() / math.log(3)))


def _greedy_branch(row_scores, sigma, beta, adaptive):
    """Brute force: bias one decision-step row with a fresh processor and take the argmax."""
    proc = _proc([sigma], [beta], adaptive)
    s = row_scores.clone().unsqueeze(0)
    proc.apply(s)
    top = int(s[0].argmax())
    branch = "YES" if top in YES else "NO" if top in NO else None
    return branch, proc.records[0]


@pytest.mark.parametrize("seed", range(40))
def test_replay_greedy_equals_decoding_under_the_other_bias(seed):
    g = np.random.default_rng(seed)
    steps = [_scores(seed * 10 + k, 1)[0] for k in range(int(g.integers(1, 4)))]
    # The recorded run, under some bias: it stays undecided until it commits (or runs out).
    rec_sigma, rec_beta = float(g.uniform(-1, 1)), float(g.choice([0.0, 1.0, 4.0]))
    record = None
    for k, row in enumerate(steps):
        branch, r = _greedy_branch(row, rec_sigma, rec_beta, True)
        if record is None:
            record = r
        else:
            record.steps.extend(r.steps)
        if branch is not None:
            record.chosen = branch
            steps = steps[: k + 1]
            break
    sigma, beta = float(g.uniform(-1, 1)), float(g.choice([0.0, 0.5, 2.0, 8.0, 25.0]))
    adaptive = bool(g.integers(2))
    got = replay_greedy(record, [sigma, -sigma], beta, adaptive)
    want, want_step = None, len(steps) - 1
    for k, row in enumerate(steps):
        branch, r = _greedy_branch(row, sigma, beta, adaptive)
        if branch is not None:
            want, want_step, want_rec = branch, k, r
            break
    assert got.branch == want and got.step == want_step
    if want is not None:
        assert got.p_after == pytest.approx(want_rec.p_after, abs=1e-9)
        assert got.delta == pytest.approx(want_rec.delta, abs=1e-9)
        assert got.entropy == pytest.approx(want_rec.entropy, abs=1e-9)
