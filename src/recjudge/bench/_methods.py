"""The methods a throughput benchmark compares, each judging one user's requests.

Every method produces the same kind of output as its counterpart (a full evidence-first
answer, or the verdict at the decision step) under the same grammar and the same BRIEF bias.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recjudge.decoding import EVIDENCE_OPEN, make_processors
from recjudge.llm import SamplingConfig
from recjudge.reward import Judge, JudgeConfig, clear_prefix_cache, judge_sweep

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

BETAS = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 25.0, 35.0, 50.0)


@dataclass(frozen=True)
class Answer:
    """What is compared across methods: the verdict and (full answers) the evidence."""

    yes: bool
    evidence: tuple[str, ...] = ()


@dataclass
class Runner:
    """One method: ``run(reqs)`` judges one user's requests and returns one Answer each."""

    kind: str  # "full" | "readout"
    engine: str  # what it is, for the report
    run: Callable[[list[Any]], list[Answer]]
    settings: int = 1  # bias settings judged per pair (sweeps judge many)
    warm: Callable[[list[Any]], None] = field(default=lambda reqs: None)
    judge: Any = None  # the Judge whose prompts and grammar it runs (the naive reference's)
    #: how it computes, read from the engine once loaded (threads, weights), for the report's
    #: like-for-like table; ``None`` for the in-process torch methods (the process's row)
    binding: dict[str, Any] | None = None


def processors_for(judge: Any, r: Any) -> tuple[list[int], Any, Any, Any]:
    """One request as a baseline method runs it: its full prompt ids, its schema, and fresh
    grammar and bias processors with the judge's settings and the request's sigma."""
    c = judge.config
    rp, prefix, suffix = judge.prompt_ids(r)
    schema = c.schema_for(rp)
    grammar, proc = make_processors(
        judge.llm, [schema], [judge.sigma_for(r) or 0.0], c.branch_bias()
    )
    return prefix + suffix, schema, grammar, proc


def greedy_config(tok: Any, max_new_tokens: int) -> Any:
    """transformers' ``GenerationConfig`` for the greedy baselines (no sampling knobs)."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        temperature=None,
        top_p=None,
        top_k=None,
    )


def _naive(judge: Any, readout: bool, max_new_tokens: int) -> Callable[[list[Any]], list[Answer]]:
    """transformers ``generate()``, one full prompt per pair, with the judge's grammar and
    bias processors (the transformers ``LogitsProcessor`` contract); a read-out stops as
    soon as the decision token is generated."""
    import torch
    from transformers import (
        LogitsProcessorList,
        StoppingCriteria,
        StoppingCriteriaList,
    )

    llm = judge.llm
    tok = llm.tokenizer
    cfg = greedy_config(tok, max_new_tokens)

    class Committed(StoppingCriteria):
        def __init__(self, proc: Any) -> None:
            self.proc = proc

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kw: Any) -> torch.Tensor:
            done = self.proc.commits_with(0, int(input_ids[0, -1]))
            return torch.tensor([done], device=input_ids.device)

    def run(reqs: list[Any]) -> list[Answer]:
        out = []
        for r in reqs:
            prompt, schema, grammar, proc = processors_for(judge, r)
            ids = torch.tensor([prompt], device=llm.model.device)
            with torch.inference_mode():
                gen = llm.transformers_model().generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    generation_config=cfg,
                    logits_processor=LogitsProcessorList([grammar, proc]),
                    stopping_criteria=StoppingCriteriaList([Committed(proc)]) if readout else None,
                )
            text = tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)
            out.append(_answer(schema, text, readout))
        return out

    return run


def _answer(schema: Any, text: str, readout: bool) -> Answer:
    """The Answer in a naive or llama.cpp output text."""
    body = text.strip().replace(" ", "")
    opened = EVIDENCE_OPEN.replace(" ", "")
    if readout:
        return Answer(body.startswith(opened + '"'))
    try:
        value = schema.parse(text)
    except Exception:  # an unfinished answer (token budget) counts as no YES
        return Answer(False)
    return Answer(value["is_relevant"] == "YES", tuple(value["evidence"]))


def _engine(judge: Any, full: bool) -> Callable[[list[Any]], list[Answer]]:
    def run(reqs: list[Any]) -> list[Answer]:
        clear_prefix_cache(judge.llm)  # every method encodes the user's prefix itself
        res = judge.judge_many(reqs)
        return [Answer(j.is_relevant, tuple(j.evidence) if full else ()) for j in res]

    return run


def _sweep(judges: dict[str, Any], label: str, full: bool) -> Callable[[list[Any]], list[Answer]]:
    def run(reqs: list[Any]) -> list[Answer]:
        clear_prefix_cache(judges[label].llm)
        res = judge_sweep(judges, reqs)[label]  # compared through the one main setting
        return [Answer(j.is_relevant, tuple(j.evidence) if full else ()) for j in res]

    return run


def sweep_judges(base: Any, cf: Any, item_item: Any, full: bool) -> dict[str, Any]:
    """brief, non-adaptive and item-item at every beta of ``BETAS``, and no-behavior: 28."""
    out = {}
    c = base.config.model_copy(update={"need_evidence": full})
    for mode, model in (("brief", cf), ("non-adaptive", cf), ("item-item", item_item)):
        for beta in BETAS:
            cfg = c.model_copy(update={"mode": mode, "beta": beta})
            out[f"{mode}@{beta:g}"] = Judge(cfg, llm=base.llm, cf=model)
    out["no-behavior"] = Judge(c.model_copy(update={"mode": "no-behavior"}), llm=base.llm)
    return out


def method_runners(
    model: str,
    llm: LLMBackend,
    cf: Any,
    item_item: Any,
    history: int,
    beta: float,
    max_new_tokens: int,
    only: Sequence[str] | None = None,
    threads: int = 2,
) -> dict[str, Runner]:
    """Every available method, by name (``naive_*`` first: the references); ``threads``:
    what the in-process torch methods compute with, given to llama.cpp too."""
    base = JudgeConfig(
        model=model,
        mode="brief",
        beta=beta,
        max_history=history,
        token_budget=100_000,
        sampling=SamplingConfig(max_new_tokens=max_new_tokens),
    )
    full = Judge(base, llm=llm, cf=cf)
    readout = Judge(base.model_copy(update={"need_evidence": False}), llm=llm, cf=cf)
    invariant = Judge(base.model_copy(update={"deterministic": True}), llm=llm, cf=cf)
    main = "no-behavior" if beta == 0 else f"brief@{beta:g}"  # beta 0: the judge alone
    sweep_full = sweep_judges(full, cf, item_item, True)
    sweep_read = sweep_judges(readout, cf, item_item, False)
    if main not in sweep_full:
        raise ValueError(f"beta {beta} is not one of the sweep's {BETAS}")

    def warm(reqs: list[Any]) -> None:
        for r in reqs:
            full.prompt_ids(r)

    fast = "recjudge fast engine (shared prefix KV read in place, fp32 attention)"
    runners = {
        "naive_full": Runner(
            "full",
            "transformers generate() + recjudge grammar/bias processors",
            _naive(full, False, max_new_tokens),
            warm=warm,
            judge=full,
        ),
        "naive_readout": Runner(
            "readout",
            "generate() as above, stopped at the decision token",
            _naive(readout, True, max_new_tokens),
        ),
        "engine_full": Runner("full", fast, _engine(full, True)),
        "engine_readout": Runner(
            "readout", fast + ", stops at the decision", _engine(readout, False)
        ),
        "engine_full_invariant": Runner(
            "full",
            "recjudge batch-invariant engine (deterministic=True)",
            _engine(invariant, True),
        ),
        "sweep_readout": Runner(
            "readout",
            "judge_sweep: 28 bias settings from one read-out pass",
            _sweep(sweep_read, main, False),
            settings=len(sweep_read),
        ),
        "sweep_full": Runner(
            "full",
            "judge_sweep: 28 settings, evidence once per (pair, commit step)",
            _sweep(sweep_full, main, True),
            settings=len(sweep_full),
        ),
    }
    # import cycle: _llamacpp builds its runners on this module's
    from recjudge.bench._llamacpp import llamacpp_runners  # noqa: PLC0415

    runners.update(llamacpp_runners(model, full, readout, max_new_tokens, threads))
    if only:
        keep = {"naive_full", "naive_readout", *only}
        runners = {k: v for k, v in runners.items() if k in keep}
    return runners
