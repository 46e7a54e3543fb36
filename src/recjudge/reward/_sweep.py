"""Many bias settings from one decoding pass: ablations and beta sweeps at the cost of one.

brief, non-adaptive, no-behavior and item-item judges show the model the same prompt and
differ only in the bias added at the decision step (``Delta = beta * (1 + E_n) * sigma``,
``beta * sigma``, 0, or the item-item sigma). Under greedy decoding the tokens before the
decision do not depend on the bias, and the bias shifts every token of a branch by the same
amount, so the unbiased scores recorded at each decision step (``DecisionStep``) decide every
setting's verdict (``replay_greedy``). Evidence after a YES is the unbiased greedy
continuation, identical for every setting that commits at the same step, so it is decoded
once per (request, step) and only for settings that ask for evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from tqdm.auto import tqdm

from recjudge.decoding import DecisionRecord, DecisionStep, replay_greedy
from recjudge.llm import capabilities_of
from recjudge.reward._judge import Judge
from recjudge.reward._judgment import (
    RECORDED_ERRORS,
    JudgeRequest,
    Judgment,
    parse_answer,
    parsed_evidence,
)
from recjudge.reward._modes import SWEEPABLE
from recjudge.reward._plan import adopt_former_keys, plan_calls
from recjudge.reward._store import ResultsStore, decisions_path

# Settings that may differ between the judges of one sweep (everything else shapes the
# prompt or the decoding and must be equal).
_FREE = {"mode", "beta", "need_evidence", "batch_size", "cf_threshold"}


def _check(judges: Mapping[str, Judge]) -> Judge:
    if not judges:
        raise ValueError("judge_sweep needs at least one judge")
    labels = list(judges)
    first = judges[labels[0]]
    shared = first.config.model_dump(exclude=_FREE)
    for label, j in judges.items():
        c = j.config
        if c.mode not in SWEEPABLE:
            raise ValueError(
                f"judge {label!r}: mode {c.mode!r} cannot share a pass (sweepable: "
                f"{', '.join(SWEEPABLE)}); judge it on its own with judge_many"
            )
        if c.sampling.do_sample or c.samples > 1:
            raise ValueError(f"judge {label!r}: a sweep replays greedy decoding; it samples")
        diff = {k for k, v in c.model_dump(exclude=_FREE).items() if shared[k] != v}
        if diff:
            raise ValueError(
                f"judge {label!r} differs from {labels[0]!r} in {sorted(diff)}: only "
                f"{sorted(_FREE)} may differ within one sweep"
            )
        if j.llm is not first.llm:
            raise ValueError(f"judge {label!r}: give every judge of a sweep the same llm=")
    return first


def _signal(sigma: float | None, k: int) -> list[float]:
    s = 0.0 if sigma is None else float(sigma)
    return [s, -s][:k] if k > 1 else [0.0]


@dataclass
class Recorded:
    """One request's unbiased greedy pass, all a replay needs (storable as JSON).

    Attributes:
        record: the decision record (branches, chosen branch, the unbiased scores at each
            decision step).
        text: the answer text of the recorded pass.
        shown / dropped: history items shown in the prompt / left out by the budget.
        decoded: ``(decoded batch, row)`` when recorded in this process (the evidence of
            answers that want it is parsed from it); None when read from a store.
    """

    record: Any
    text: str
    shown: int
    dropped: int
    decoded: tuple[Any, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        steps = [[list(st.live), list(st.lse), list(st.top), st.other] for st in r.steps]
        return {"branches": list(r.branches), "chosen": r.chosen, "steps": steps,
                "text": self.text, "shown": self.shown, "dropped": self.dropped}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recorded:
        steps = [DecisionStep(tuple(lv), tuple(lse), tuple(top), float(other))
                 for lv, lse, top, other in d["steps"]]  # fmt: skip
        rec = DecisionRecord(tuple(d["branches"]), chosen=d["chosen"], steps=steps)
        return cls(rec, d["text"], int(d["shown"]), int(d["dropped"]))


def judge_sweep(
    judges: Mapping[str, Judge], reqs: Sequence[JudgeRequest], progress: bool = False
) -> dict[str, list[Judgment]]:
    """Judge ``reqs`` under every judge of ``judges`` from one decoding pass.

    Args:
        judges: label -> Judge. They may differ only in mode (brief, non-adaptive,
            no-behavior, item-item), beta, CF model, cf_threshold and need_evidence, must
            decode greedily and share one loaded llm.
        reqs: the requests, judged by every judge.
        progress: a progress bar over the recording pass.

    Returns:
        label -> one Judgment per request, in input order, each with the key its judge
        gives it. Verdicts, probabilities, Delta and E_n equal the judge's own
        ``judge_many`` up to floating-point rounding; a read-out judgment's ``raw_text`` is
        the recorded pass's text where the setting committed like it, else empty. Where a
        setting would keep a row undecided past the recorded commit (rare: the bias pushes
        both branches below an undecided token) that pair is decoded on its own.

    On vLLM or a server the recording pass is the engine's read-out with the bias off, its
    decision records replayed from the decision-step log-probabilities the engine returns
    (as every judgment there is); the pass cannot explore past the unbiased commit, so the
    pairs a setting would have kept undecided there are decoded on their own.
    """
    _check(judges)
    return _replay(judges, reqs, _record(judges, reqs, progress))


def _record(
    judges: Mapping[str, Judge], reqs: Sequence[JudgeRequest], progress: bool = False
) -> list[Recorded]:
    """The unbiased greedy pass over ``reqs`` (explored as far as any judge's bias needs)."""
    first = next(iter(judges.values()))
    base = Judge(
        first.config.model_copy(update={"mode": "no-behavior", "need_evidence": False}),
        llm=first.llm,
    )
    sigmas = {label: [j.sigma_for(r) for r in reqs] for label, j in judges.items()}
    recorded: list[Any] = [None] * len(reqs)
    bar = None
    if progress:
        bar = tqdm(total=len(reqs), desc="record", unit="pair")
    # On an engine backend (vLLM, a server) the pass cannot go on past a decision the
    # unbiased model commits at: its records come from the engine's decision-step
    # log-probabilities, and a setting that would have stayed undecided there replays to
    # None and is decoded on its own (``_fill_evidence``).
    steps = capabilities_of(first.llm).step_scores
    for batch in plan_calls(base.config, reqs, range(len(reqs))):
        sub = [reqs[i] for i in batch]
        explore = _explorer(judges, sigmas, batch) if steps else None
        d = base.decode_batch(sub, [None] * len(sub), explore=explore)
        for k, i in enumerate(batch):
            recorded[i] = Recorded(d.records[k], d.texts[k], len(d.rendered[k].shown),
                                   d.rendered[k].dropped, (d, k))  # fmt: skip
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    for f in fields(first.stats):  # every count of ``EngineStats`` (not its free-form extra)
        add = getattr(base.stats, f.name)
        if isinstance(add, int):
            setattr(first.stats, f.name, getattr(first.stats, f.name) + add)
    return recorded


def _replay(
    judges: Mapping[str, Judge], reqs: Sequence[JudgeRequest], recorded: list[Recorded]
) -> dict[str, list[Judgment]]:
    """Every judge's judgments from the recorded passes (evidence decoded where wanted)."""
    out = {
        label: _replay_all(j, reqs, recorded, [j.sigma_for(r) for r in reqs])
        for label, j in judges.items()
    }
    _fill_evidence(judges, reqs, recorded, out)
    return out


def _explorer(judges: Mapping[str, Judge], sigmas: dict[str, list[Any]], batch: list[int]):
    """The recording pass goes on undecided past a decision step while some setting would
    (its bias leaves an undecided token on top), so every setting's path is recorded."""
    settings = [(sigmas[label], j.config.branch_bias()) for label, j in judges.items()]

    def explore(row: int, rec: Any) -> bool:
        i = batch[row]  # greedy: one decoded row per request
        k = len(rec.branches)
        return any(
            replay_greedy(rec, _signal(sig[i], k), bias.beta, bias.adaptive).branch is None
            for sig, bias in settings
        )

    return explore


def _replay_all(
    judge: Judge, reqs: Sequence[JudgeRequest], recorded: list[Any], sigmas: list[Any]
) -> list[Any]:
    """Each request's Judgment under ``judge``'s bias, or None where replay cannot tell."""
    c = judge.config
    results: list[Any] = []
    for i, r in enumerate(reqs):
        got = recorded[i]
        rec = got.record
        sigma = sigmas[i]
        if rec is None:  # no decision on the wire (the engine recorded none): decode alone
            results.append(None)
            continue
        bias = c.branch_bias()
        rp = replay_greedy(rec, _signal(sigma, len(rec.branches)), bias.beta, bias.adaptive)
        if rp.branch is None:
            results.append(None)
            continue
        same = rp.branch == rec.chosen and rp.step == len(rec.steps) - 1
        p_yes_after = _p(rec.branches, rp.p_after, rp.branch)
        p_yes_before = _p(rec.branches, rp.p_before, rp.branch)
        results.append(
            Judgment(
                user_id=r.user_id,
                candidate_id=r.candidate_id,
                mode=c.mode,
                is_relevant=rp.branch == "YES",
                evidence=[],
                p_yes=p_yes_after,
                p_yes_semantic=p_yes_before,
                sigma=sigma,
                delta=rp.delta[0] if rp.delta else 0.0,
                entropy=rp.entropy,
                raw_text=got.text if same else "",
                decision_steps=rp.step + 1 if rec.steps else 0,
                history_shown=got.shown,
                history_dropped=got.dropped,
                key=judge.key(r),
            )
        )
    return results


def _p(branches: tuple[str, ...], probs: tuple[float, ...], chosen: str) -> float:
    """P(YES) from replayed branch probabilities (a one-branch decision is certain)."""
    if "YES" not in branches:
        return 0.0
    if not probs:
        return 1.0 if chosen == "YES" else 0.0
    return float(probs[branches.index("YES")])


def _evidence_from_pass(res: Any, recorded: Any) -> bool:
    """Take ``res``'s evidence from the recorded pass when that pass committed the same way
    and its answer is whole (a NO is forced to the end; a read-out YES stops after the
    decision); False: it must be decoded."""
    got = recorded.decoded  # None: read from a store, decode the evidence
    d, k = got if got is not None else (None, 0)
    if not res.raw_text or d is None or parse_answer(d.schemas[k], d.texts[k]) is None:
        return False
    res.evidence = parsed_evidence(d.schemas[k], d.texts[k])
    ids = {h.title: h.item_id for h in d.rendered[k].shown}
    res.evidence_ids = [ids[t] for t in res.evidence]
    return True


def _fill_evidence(
    judges: Mapping[str, Judge],
    reqs: Sequence[JudgeRequest],
    recorded: list[Any],
    out: dict[str, list[Any]],
) -> None:
    """Complete the answers of judges that want evidence (one decode per request and commit
    step), and decode on its own every pair the replay could not decide."""
    groups: dict[tuple[int, str, int], list[str]] = {}
    alone: list[tuple[str, int]] = []
    for label, j in judges.items():
        for i, res in enumerate(out[label]):
            if res is None:
                alone.append((label, i))
            elif j.config.need_evidence and not _evidence_from_pass(res, recorded[i]):
                verdict = "YES" if res.is_relevant else "NO"
                groups.setdefault((i, verdict, res.decision_steps), []).append(label)
    alone += _decode_evidence(judges, reqs, groups, out)
    for label, i in alone:
        out[label][i] = judges[label].judge(reqs[i])


def _decode_evidence(
    judges: Mapping[str, Judge],
    reqs: Sequence[JudgeRequest],
    groups: Mapping[tuple[int, str, int], list[str]],
    out: dict[str, list[Any]],
) -> list[tuple[str, int]]:
    """Decode each group's evidence once (the labels that committed the same way on a
    request share it) into ``out``; the (label, request) pairs whose decision moved (rounding)
    and must be decoded alone."""
    alone: list[tuple[str, int]] = []
    by_rep: dict[str, list[tuple[int, list[str]]]] = {}
    for (i, _, _), labels in groups.items():
        by_rep.setdefault(labels[0], []).append((i, labels))
    for rep, items in by_rep.items():
        decoded = judges[rep].judge_many([reqs[i] for i, _ in items])
        for (i, labels), full in zip(items, decoded, strict=True):
            for label in labels:
                res = out[label][i]
                if full.is_relevant != res.is_relevant:
                    alone.append((label, i))  # rounding moved the decision: decode it alone
                    continue
                out[label][i] = replace(
                    res, evidence=full.evidence, evidence_ids=full.evidence_ids,
                    raw_text=full.raw_text,
                )  # fmt: skip
    return alone


@dataclass(frozen=True)
class SweepFill:
    """What ``sweep_into_store`` did.

    Attributes:
        written: per label, judgments written to the store (it lacked them).
        decoded: requests the recording pass decoded (one model pass serves every label).
        replayed: requests decided from decision records an earlier run stored (no model).
    """

    written: dict[str, int]
    decoded: int
    replayed: int = 0


def can_sweep(judges: Mapping[str, Judge]) -> list[str]:
    """The labels of ``judges`` that one ``judge_sweep`` pass can serve together: sweepable
    modes, greedy, one llm (local, vLLM or a server: each returns the decision-step scores a
    replay reads), and every other setting equal to the first such judge's.

    A lone such judge is listed too: a pass costs what its own judgment would, and it reads
    and keeps the request's unbiased decision record, so a judge whose CF model was retrained
    (a new ``sigma``) or whose ``beta`` changed is decided from the records without the
    model, and a later run with other settings is too."""
    labels: list[str] = []
    for label, j in judges.items():
        c = j.config
        if c.mode not in SWEEPABLE or c.sampling.do_sample or c.samples > 1:
            continue
        if labels:
            first = judges[labels[0]]
            if j.llm is not first.llm or first.config.model_dump(exclude=_FREE) != c.model_dump(
                exclude=_FREE
            ):
                continue
        labels.append(label)
    return labels


def decisions_store(store: Any) -> Any:
    """The store of unbiased decision records beside ``store`` (``<name>.decisions``; never
    in it: its rows are all judgments)."""
    path = str(store.path)
    return ResultsStore(path if path == ":memory:" else decisions_path(store.path))


def sweep_into_store(
    judges: Mapping[str, Judge], reqs: Sequence[JudgeRequest], store: Any
) -> SweepFill:
    """Write to ``store`` every judgment of ``reqs`` under ``judges`` that it lacks; each
    judge's ``judge_many`` then reads them back. Results equal each judge's own up to
    floating-point rounding (so a store filled either way serves both).

    The unbiased decision record of every request (the scores at its decision steps) is kept
    beside the store (``decisions_store``), so a later run with other bias settings (a new
    beta, another CF model) on the same requests decides them without the model; requests
    without a record get one ``judge_sweep`` pass. The pass writes when it ends: call this
    per chunk of requests (e.g. one user) so a crash loses at most one chunk.
    """
    first = _check(judges)
    keys = {label: [j.key(r) for r in reqs] for label, j in judges.items()}
    have = {label: set(store.get_many(ks)) for label, ks in keys.items()}
    missing: list[int] = []
    seen: set[tuple[str, ...]] = set()
    for i in range(len(reqs)):
        ident = tuple(keys[label][i] for label in judges)
        if ident in seen or all(keys[label][i] in have[label] for label in judges):
            continue
        seen.add(ident)
        missing.append(i)
    written = dict.fromkeys(judges, 0)
    if not missing:
        return SweepFill(written, 0)
    lacking = {label: j for label, j in judges.items() if any(
        keys[label][i] not in have[label] for i in missing)}  # fmt: skip
    sub = [reqs[i] for i in missing]
    swept, decoded = _sweep_recorded(first, lacking, sub, store)
    replayed = len(sub) - decoded
    for label, j in lacking.items():
        new = [(r, res) for k, r, res in zip(missing, sub, swept[label], strict=True)
               if keys[label][k] not in have[label]]  # fmt: skip
        j.persist(store, new)
        written[label] = len(new)
    return SweepFill(written, decoded, replayed)


def _sweep_recorded(
    first: Judge, judges: Mapping[str, Judge], reqs: Sequence[JudgeRequest], store: Any
) -> tuple[dict[str, list[Judgment]], int]:
    """``judge_sweep`` that reads and writes the decision records beside ``store``; returns
    the judgments and how many requests were decoded."""
    dkeys = [first.decision_key(r) for r in reqs]
    with decisions_store(store) as decisions:
        stored = decisions.get_many(dkeys)
        adopt_former_keys(first.keys, decisions, reqs, dkeys, stored,
                          lambda r: {"user_id": r.user_id, "candidate_id": r.candidate_id},
                          bias=False)  # fmt: skip
        recorded: list[Any] = [
            Recorded.from_dict(stored[k]) if k in stored else None for k in dkeys
        ]
        todo = [i for i, got in enumerate(recorded) if got is None]
        if todo:
            fresh = _record(judges, [reqs[i] for i in todo])
            for i, got in zip(todo, fresh, strict=True):
                recorded[i] = got
            decisions.put_many(
                [
                    (
                        dkeys[i],
                        {"user_id": reqs[i].user_id, "candidate_id": reqs[i].candidate_id},
                        recorded[i].to_dict(),
                    )
                    for i in todo
                    if recorded[i].record is not None  # no decision recorded: nothing to keep
                ]  # fmt: skip
            )
    return _replay(judges, reqs, recorded), len(todo)


def judge_per_user(
    reqs: Sequence[Any],
    judges: Mapping[str, Any],
    store: Any,
    progress: bool,
    errors: Literal["raise", "record"] = "raise",
) -> tuple[dict[str, list[Any]], dict[str, dict[str, int]], int, int]:
    """Every judge on every request, one user at a time so judges share the user's prefix.
    The settings that differ only in their bias (``reward.can_sweep``) are decided from one
    decoding pass per request (``reward.sweep_into_store``), the others judged one by one.
    ``errors="record"``: a request that fails is recorded (``Judge.judge_many``) and the run
    goes on; a user whose shared pass fails is judged setting by setting instead.

    Returns:
        The judgments per judge name; per name ``{"new", "total"}``: judgments made in this
        call (not in the store before) and all requests; and the LLM decoding passes made
        (one per swept request, one per other LLM judgment); and the swept requests decided
        from stored decision records without the model.
    """
    users: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        users.setdefault(r.user_id, []).append(i)
    out: dict[str, list[Any]] = {name: [None] * len(reqs) for name in judges}
    for judge in judges.values():  # the simulators' personas, all users batched together
        if isinstance(judge, Judge) and judge.personas is not None:
            judge.personas.prepare(reqs, store, progress)
    swept = {name: judges[name] for name in can_sweep(judges)}
    counts = {name: {"new": 0, "total": 0} for name in judges}
    passes = replayed = 0

    bar = tqdm(total=len(users), desc=f"judge ({len(judges)} settings)", unit="user",
               disable=not progress)  # fmt: skip
    for idx in users.values():
        sub = [reqs[i] for i in idx]
        if swept:
            decoded, from_records = _sweep_user(swept, sub, store, counts, errors)
            passes += decoded
            replayed += from_records
        for name, judge in judges.items():
            for i, j in zip(idx, judge.judge_many(sub, store, errors=errors), strict=True):
                out[name][i] = j
            # 0 for the swept ones (read back), unless their shared pass failed
            counts[name]["new"] += judge.last_run.judged
            counts[name]["total"] += judge.last_run.requests
            if judge.config.uses_llm():
                passes += judge.last_run.judged
        bar.update(1)
    bar.close()
    return out, counts, passes, replayed


def _sweep_user(
    swept: Mapping[str, Any],
    sub: list[Any],
    store: Any,
    counts: dict[str, dict[str, int]],
    errors: str,
) -> tuple[int, int]:
    """One user's swept settings from one decoding pass per request (``sweep_into_store``),
    their new judgments added to ``counts``; (passes decoded, requests replayed). A pass that
    fails with ``errors="record"`` leaves them to ``judge_many``, setting by setting."""
    try:
        fill = sweep_into_store(swept, sub, store)
    except RECORDED_ERRORS:
        if errors == "raise":
            raise
        return 0, 0
    for name, n in fill.written.items():
        counts[name]["new"] += n
    return fill.decoded, fill.replayed


def llm_made(judges: Mapping[str, Any], counts: Mapping[str, Mapping[str, int]]) -> dict:
    """From ``judge_per_user``'s counts, the LLM judges' judgments made in that call
    (``judged_now``) and their requests (``requests``); a judge without an LLM (cf-only)
    makes no model judgments."""
    llm = [name for name, j in judges.items() if j.config.uses_llm()]
    return {
        "judged_now": sum(counts[n]["new"] for n in llm),
        "requests": sum(counts[n]["total"] for n in llm),
    }
