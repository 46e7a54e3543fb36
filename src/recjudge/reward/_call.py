"""One engine call of a judge: its prompts, its decoding and its judgments.

The same code runs a call in the judge's own process and on a Ray worker
(``Judge.judge_prepared``); which calls there are is the plan's business (``reward._plan``).
A call's prompts are rendered here, where it runs: each prompt prefix (a user's history and
the judge's instructions) once per call, each candidate's suffix once."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from recjudge._util import RunFault
from recjudge.data import datamark
from recjudge.decoding import DecodeJob, decode
from recjudge.llm import escape_special
from recjudge.reward._judge_config import JudgeConfig
from recjudge.reward._judgment import (
    RECORDED_ERRORS,
    DecodedCall,
    JudgeRequest,
    Judgment,
    parsed_evidence,
)
from recjudge.reward._prompt import CANDIDATE_SLOT, RenderedPrompt, build_messages

if TYPE_CHECKING:
    from recjudge.reward._judge import Judge

log = logging.getLogger(__name__)

#: a user simulator's role text (system message and question) of a request
Role = Callable[[JudgeRequest], dict[str, str]]


@dataclass(frozen=True)
class Prompt:
    """A request's prompt as the engine takes it: the rendered messages (what is shown),
    the prefix ids (shared by every candidate judged against the same history) and the
    suffix ids (the candidate and the chat template's tail)."""

    rendered: RenderedPrompt
    prefix: list[int]
    suffix: list[int]


def prompt_group(config: JudgeConfig, req: JudgeRequest, role: Role | None = None) -> Hashable:
    """What a request's prompt prefix is made of besides the judge's settings: its history's
    most recent ``max_history`` items, its length (the prompt counts the items not shown) and
    the domain (the candidate is in the suffix), and for a user simulator the user and whole
    history (its persona and role are written from them). Requests with equal groups share
    one prefix, rendered and encoded once per call."""
    domain = config.domain or req.domain
    # the prompt shows the most recent max_history items at most (build_messages): two
    # histories of one length that agree on those render one prefix
    shown = tuple(
        (h.item_id, h.title, h.text, h.rating) for h in req.history[-config.max_history :]
    )
    if role is None:
        return (domain, len(req.history) + req.older, shown)
    return (domain, shown, req.user_id, tuple(h.item_id for h in req.history))


def history_sent(config: JudgeConfig, role: Role | None = None) -> int | None:
    """How many of a history's most recent items an engine call needs: ``max_history`` for a
    mode that prompts the LLM (its prompt shows at most those, ``prompt_group``); None (all)
    for a user simulator (its role is written from the whole history) or a mode without the
    LLM (its judgment counts the whole history)."""
    return config.max_history if config.uses_llm() and role is None else None


class PromptGroups:
    """``prompt_group`` of many requests, computed once per history list: one user's
    candidates share one list (``requests_for``, ``request_from_record``), and the group's
    tuple of up to ``max_history`` items per request was most of planning a run's calls.

    A list is recognised by identity and length (kept alive here, so its id is not reused);
    like the keys' memo, it assumes a request's history is not edited in place after it is
    built."""

    def __init__(self, config: JudgeConfig, role: Role | None = None) -> None:
        self.config, self.role = config, role
        self._memo: dict[tuple[int, int, int, str, str], tuple[list[Any], Hashable]] = {}

    def __call__(self, req: JudgeRequest) -> Hashable:
        who = req.user_id if self.role is not None else ""
        k = (id(req.history), len(req.history), req.older, req.domain, who)
        got = self._memo.get(k)
        if got is not None and got[0] is req.history:
            return got[1]
        g = prompt_group(self.config, req, self.role)
        self._memo[k] = (req.history, g)
        return g


def _prefix(
    config: JudgeConfig, llm: Any, req: JudgeRequest, role: Role | None
) -> tuple[RenderedPrompt, list[int], str]:
    """(rendered prompt, prefix ids, the template's text after the candidate slot)."""
    tok = llm.tokenizer

    def count(lines: list[str]) -> list[int]:
        return [len(x) for x in tok(lines, add_special_tokens=False)["input_ids"]]

    rendered = build_messages(
        req.history,
        CANDIDATE_SLOT,
        **(role(req) if role is not None else {}),
        domain=config.domain or req.domain,
        evidence=not config.plain_verdict(),
        rating_scale=config.rating_scale if config.show_ratings else None,
        count_tokens=count,
        token_budget=config.token_budget,
        max_items=config.max_history,
        older=req.older,
        question_last=config.layout == "question-last",
        datamarked=config.marking == "datamark",
    )
    text = llm.chat_prompt(rendered.messages)
    head, slot, tail = text.partition(" " + CANDIDATE_SLOT)
    if not slot:
        raise RuntimeError("the chat template moved the candidate slot; cannot split")
    return rendered, llm.encode(head), tail


def prompts_for(
    config: JudgeConfig,
    llm: Any,
    reqs: Sequence[JudgeRequest],
    role: Role | None = None,
    record: bool = False,
) -> list[Prompt | Exception]:
    """Every request's ``Prompt``, the prefix of each ``prompt_group`` rendered once. With
    ``record``, a request whose prompt cannot be built (a ``RECORDED_ERRORS`` error) comes
    back as its exception; a ``RunFault`` is raised."""
    prefixes: dict[Hashable, tuple[RenderedPrompt, list[int], str] | Exception] = {}
    out: list[Prompt | Exception] = []
    group = PromptGroups(config, role)
    for r in reqs:
        try:
            g = group(r)
            if g not in prefixes:
                try:
                    prefixes[g] = _prefix(config, llm, r, role)
                except RunFault:
                    raise
                except RECORDED_ERRORS as e:  # the group's requests fail alike
                    prefixes[g] = e
            got = prefixes[g]
            if isinstance(got, Exception):
                raise got
            rendered, prefix, tail = got
            text = datamark(r.candidate_text) if config.marking == "datamark" else r.candidate_text
            candidate = escape_special(llm.tokenizer, text)
            out.append(Prompt(rendered, prefix, llm.encode(" " + candidate + tail)))
        except RunFault:
            raise
        except RECORDED_ERRORS as e:
            if not record:
                raise
            out.append(e)
    return out


def call_job(
    config: JudgeConfig,
    prompts: Sequence[Prompt],
    sigmas: Sequence[float | None],
    keys: Sequence[str],
    explore: Any = None,
) -> tuple[DecodeJob, list[Any], list[int]]:
    """One call's decoding as a ``DecodeJob`` (grammar- and bias-constrained, one or several
    prompt prefixes; ``keys`` seed sampling; ``explore``: see ``BranchBiasProcessor.explore``,
    local engines only), with each request's answer schema and each decoded row's request."""
    c = config
    schemas, which = [], []
    prefixes: dict[tuple[int, ...], int] = {}
    for p in prompts:
        schemas.append(c.schema_for(p.rendered))
        which.append(prefixes.setdefault(tuple(p.prefix), len(prefixes)))
    n = c.samples if c.sampling.do_sample else 1
    rows = [i for i in range(len(prompts)) for _ in range(n)]
    seeds = [c.sampling.seed + s + int(keys[i][:8], 16) for i in range(len(prompts))
             for s in range(n)]  # fmt: skip
    job = DecodeJob(
        suffixes=[prompts[i].suffix for i in rows],
        schemas=[schemas[i] for i in rows],
        prefixes=[list(p) for p in prefixes],
        prefix_of=[which[i] for i in rows],
        signal=[0.0 if sigmas[i] is None else sigmas[i] for i in rows],
        bias=c.branch_bias(),
        sampling=c.sampling,
        seeds=seeds,
        # The answer opens with a forced key: prefill its canonical tokens with the
        # candidate; the model still produces the merged decision tokens (' ["', ' []').
        jump_forward=c.jump_forward_prefix,
        # A read-out stops at the decision; a judgment that must cite evidence keeps
        # writing it after YES.
        stop_at_decision=True,
        keep_branch="YES" if c.need_evidence and not c.plain_verdict() else None,
        rows=c.rows(),
        deterministic=c.deterministic,
        head="allowed",
        explore=explore,
    )
    return job, schemas, rows


def decoded(
    prompts: Sequence[Prompt],
    schemas: list[Any],
    sigmas: Sequence[float | None],
    rows: list[int],
    outs: Sequence[Any],
) -> DecodedCall:
    """A call's decoded rows (``ConstrainedOutput``s) with what its judgments read."""
    return DecodedCall([p.rendered for p in prompts], schemas, list(sigmas), rows,
                       [o.record for o in outs], [o.text for o in outs])  # fmt: skip


def decode_call(
    judge: Judge,
    prompts: Sequence[Prompt],
    sigmas: Sequence[float | None],
    keys: Sequence[str],
    explore: Any = None,
) -> DecodedCall:
    """Decode one call's requests on the judge's LLM (``call_job``'s job, ``decode``)."""
    job, schemas, rows = call_job(judge.config, prompts, sigmas, keys, explore)
    return decoded(prompts, schemas, sigmas, rows, decode(judge.llm, job, stats=judge.stats))


def judgment_of(mode: str, r: JudgeRequest, d: DecodedCall, i: int) -> Judgment:
    """Request ``i`` of a decoded call as a Judgment (majority over its samples)."""
    my_rows = [k for k, ri in enumerate(d.rows) if ri == i]
    n = len(my_rows)
    rec = d.records[my_rows[0]]
    text = d.texts[my_rows[0]]
    verdicts = [d.records[k].chosen for k in my_rows]
    yes = sum(v == "YES" for v in verdicts)
    is_yes = verdicts[0] == "YES" if n == 1 else yes * 2 > n
    p_yes = rec.p_yes_after if n == 1 else yes / n
    evidence = parsed_evidence(d.schemas[i], text)
    ids = {h.title: h.item_id for h in d.rendered[i].shown}
    return Judgment(
        user_id=r.user_id,
        candidate_id=r.candidate_id,
        mode=mode,
        is_relevant=bool(is_yes),
        evidence=evidence,
        evidence_ids=[ids[t] for t in evidence],
        p_yes=float(p_yes if p_yes is not None else 0.0),
        p_yes_semantic=rec.p_yes_before,
        sigma=d.sigmas[i],
        delta=rec.delta_yes,
        entropy=rec.entropy,
        raw_text=text,
        decision_steps=rec.decision_steps,
        history_shown=len(d.rendered[i].shown),
        history_dropped=d.rendered[i].dropped,
        samples_yes=yes if n > 1 else None,
    )


def cf_judgment(config: JudgeConfig, r: JudgeRequest, sigma: float) -> Judgment:
    """A judgment of a mode without the LLM (``cf-only``, ``item-item``): YES where sigma
    exceeds ``cf_threshold``, p_yes = (sigma + 1) / 2."""
    return Judgment(r.user_id, r.candidate_id, config.mode, bool(sigma > config.cf_threshold),
                    [], (sigma + 1) / 2, None, sigma, 0.0, 0.0, "",
                    history_shown=len(r.history) + r.older)  # fmt: skip


def judge_call(
    judge: Judge,
    reqs: Sequence[JudgeRequest],
    keys: Sequence[str],
    sigmas: Sequence[float | None],
    record: bool,
) -> list[Judgment | Exception]:
    """Judge one engine call's requests (keys and sigma from the plan), in order. With
    ``record``, a request whose prompt cannot be built comes back as its exception, and a
    call that fails is retried request by request so that only the failing ones fail; a
    fault of the whole run (``RunFault``: NaN logits, a server down) is raised."""
    c = judge.config
    if not c.uses_llm():
        return [cf_judgment(c, r, s) for r, s in zip(reqs, sigmas, strict=True)]  # type: ignore[arg-type]
    prompts = prompts_for(c, judge.llm, reqs, judge.role, record)
    out: list[Judgment | Exception] = list(prompts)  # type: ignore[arg-type]
    ok = [i for i, p in enumerate(prompts) if isinstance(p, Prompt)]

    def run(idx: list[int]) -> list[Judgment | Exception]:
        try:
            d = decode_call(judge, [prompts[i] for i in idx], [sigmas[i] for i in idx],  # type: ignore[misc]
                            [keys[i] for i in idx])  # fmt: skip
            return [judgment_of(c.mode, reqs[i], d, k) for k, i in enumerate(idx)]
        except RunFault:  # NonFiniteLogitsError among them
            raise  # the model, device or server is broken: every request would fail alike
        except RECORDED_ERRORS as e:
            if not record:
                raise
            if len(idx) == 1:
                r = reqs[idx[0]]
                log.warning("user %r, candidate %r failed: %s", r.user_id, r.candidate_id, e)
                return [e]
            return [run([i])[0] for i in idx]

    if ok:
        for i, j in zip(ok, run(ok), strict=True):
            out[i] = j
    return out
