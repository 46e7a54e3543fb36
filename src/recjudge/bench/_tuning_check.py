"""Where a tuning gain goes: ``bench judge-tuning``'s teacher-forced check.

The tuning stops early on its validation users' AUC of the teacher-forced decision score
(at the first token where the YES and NO answers differ, ``logsumexp`` of the logits of the
tokens that commit to YES minus that of those that commit to NO: the read-out's ``logit
P(YES)`` at that step; before tune-v3, the two target tokens' logits alone), the base model
with the LoRA adapter in fp32. The report's rows judge other pairs another way: the
merged folder, loaded by the judge, reads P(YES) at the grammar's decision step on the
evaluation users' held-out pairs. When the validation AUC rises and the rows' does not, one of
four things differs, and this check measures each with the same score:

1. **the adapter as trained**, fp32 base plus the best step's LoRA weights (``OUT.tune/``),
   on the tuning's own validation pairs (rebuilt from the same log, settings and seed): it
   must reproduce the card's validation AUC, before and after;
2. **the merged folder** (what every backend loads) on the same pairs: the merge and the
   folder's dtype (the base's, bf16 for the presets) are all that differ from 1;
3. the merged folder on **the evaluation users' own past**, pairs built as the tuning builds
   them (their later past interactions against items they never touched): other users, same
   construction;
4. the merged folder on **the evaluation pairs** the rows judge (their held-out future against
   never-rated items): other pairs, same score.

Each set: the base model's AUC, the tuned one's, and tuned minus base with a 95 % bootstrap
interval over users (each user's pairs drawn together, the same draw for both models).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from recjudge._stats import bootstrap_ci, labelled_auc, user_draws
from recjudge._util import release_freed_memory
from recjudge.llm import quiet_loading
from recjudge.tune import (
    BEST_FILE,
    TuneConfig,
    TunePair,
    base_folder,
    decision_scores,
    encode_examples,
    load_trainable,
    pad_id,
    prompting_judge,
    set_lora,
    tuning_pairs,
)

#: the pair sets, in the order the report shows them
SETS = ("validation", "evaluation users' past", "evaluation pairs")


def _fp32(folder: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    with quiet_loading():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _adapter(tc: Any, work: Path) -> Any | None:
    """The fp32 base with the best step's LoRA weights, as validation scored it; None when
    the tuning's checkpoint folder is gone."""
    if not (work / BEST_FILE).is_file():
        return None
    model = load_trainable(tc, "cpu")
    set_lora(model, work / BEST_FILE)
    return model.eval()


def paired_auc(a: Sequence[float], b: Sequence[float], labels: Sequence[int],
               users: Sequence[str], draws: int, seed: int) -> dict[str, Any]:  # fmt: skip
    """AUC of scores ``a`` and ``b`` on the same pairs, and ``a - b`` with a 95 % percentile
    bootstrap over users (a user's pairs drawn together; one draw serves both scores, so the
    pairs' shared difficulty cancels). Draws where a side lacks a label class are dropped."""
    a, b, y = np.asarray(a, float), np.asarray(b, float), np.asarray(labels, int)
    by_user: dict[str, list[int]] = {}
    for n, u in enumerate(users):
        by_user.setdefault(u, []).append(n)
    groups = [np.asarray(v) for v in by_user.values()]
    diffs = []
    for draw in user_draws(len(groups), draws, seed):  # the project's user resamples
        idx = np.concatenate([groups[k] for k in draw])
        x, z = labelled_auc(a[idx], y[idx]), labelled_auc(b[idx], y[idx])
        if x is not None and z is not None:
            diffs.append(x - z)
    point_a, point_b = labelled_auc(a, y), labelled_auc(b, y)
    lo, hi = bootstrap_ci(diffs)
    diff = None if point_a is None or point_b is None else point_a - point_b
    return {"a": point_a, "b": point_b, "diff": diff, "lo": lo, "hi": hi,
            "pairs": int(len(y)), "users": len(groups), "draws": len(diffs)}  # fmt: skip


def _sets(tc: Any, ds: Any, past: Any, reqs: Sequence[Any], users: Sequence[str]) -> tuple:
    """The three pair sets (``SETS``) and the evidence rule the tuning's targets use."""
    log = ds.with_interactions(past, "judge-tuning: the past split")
    tuning = tuning_pairs(tc, log, exclude_users=users)
    keep = past["user_id"].astype(str).isin({str(u) for u in users})
    own_log = ds.with_interactions(past[keep], "judge-tuning: the evaluation users' past")
    # every evaluation user in one set: the split's validation share is capped at a fifth,
    # so the built pairs of both splits are taken together
    own = tuning_pairs(tc.model_copy(update={"max_users": None}), own_log)
    evaluation = [TunePair(r, int(r.meta["label"])) for r in reqs
                  if r.meta.get("kind") == "relevance"]  # fmt: skip
    return {SETS[0]: tuning.validation, SETS[1]: own.train + own.validation,
            SETS[2]: evaluation}, tuning.rule  # fmt: skip


def teacher_forced_check(
    config: Any,
    ds: Any,
    past: Any,
    reqs: Sequence[Any],
    users: Sequence[str],
    folder: Path,
    card: dict[str, Any],
) -> dict[str, Any]:
    """The check of the module docstring for the tuned ``folder`` (its ``card``).

    Returns:
        ``{"sets": {set: {"pairs", "users", "skipped"}}, "models": [...], "auc": {model: {set:
        {...paired_auc against the base}}}, "card": {"validation_auc_before",
        "validation_auc"}}``.
    """
    # the card names a local base folder by its name only (no machine path): the base is
    # the bench's own model
    tc = TuneConfig(**{**card["config"], "model": config.model})
    pair_sets, rule = _sets(tc, ds, past, reqs, users)
    judge = prompting_judge(tc)
    pad = pad_id(judge)
    examples, info = {}, {}
    for name, pairs in pair_sets.items():
        skipped: list[str] = []
        enc = encode_examples(judge, pairs, rule, skipped)
        examples[name] = ([enc[i] for i in sorted(enc)],
                          [pairs[i].request.user_id for i in sorted(enc)])  # fmt: skip
        info[name] = {"pairs": len(enc), "users": len(set(examples[name][1])),
                      "positive": sum(e.label for e in examples[name][0]),
                      "skipped": len(skipped)}  # fmt: skip
    del judge
    loaders = {"base": lambda: _fp32(base_folder(tc.model)),
               "tuned, adapter as trained (fp32)": lambda: _adapter(tc, Path(f"{folder}.tune")),
               "tuned, merged folder (fp32 load)": lambda: _fp32(folder)}  # fmt: skip
    scores: dict[str, dict[str, list[float]]] = {}
    for label, load in loaders.items():
        model = load()
        if model is None:
            continue
        scores[label] = {name: decision_scores(model, ex, pad, "cpu")
                         for name, (ex, _) in examples.items()}  # fmt: skip
        del model
        release_freed_memory()
    out: dict[str, Any] = {}
    for label in scores:
        out[label] = {
            name: paired_auc(scores[label][name], scores["base"][name],
                             [e.label for e in ex], us, config.bootstrap, config.seed)
            for name, (ex, us) in examples.items()
        }  # fmt: skip
    return {"sets": info, "models": list(scores), "auc": out,
            "card": {k: card[k] for k in ("validation_auc_before", "validation_auc")},
            "merged_dtype": card.get("dtype")}  # fmt: skip


def check_lines(check: dict[str, Any]) -> list[str]:
    """The report's section for ``teacher_forced_check``'s result."""
    f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    c = check["card"]
    lines = ["", "## Where the tuning gain goes (teacher-forced decision score)", "",
             "The score validation ranks by (at the first token where the YES and NO answers "
             "differ, the logsumexp of the tokens committing to YES minus that of those "
             "committing to NO, fp32), on three pair sets: the tuning's validation "
             "pairs (rebuilt), pairs built as the tuning builds them from the evaluation "
             "users' own past, and the evaluation pairs the rows above judge. Tuned minus base "
             "with a 95 % bootstrap over users. The card's validation AUC: "
             f"{f(c['validation_auc_before'])} -> {f(c['validation_auc'])} (merged folder "
             f"stored in {check.get('merged_dtype')}).", "",
             "| model | " + " | ".join(f"{s} (pairs, users)" for s in SETS) + " |",
             "|---|" + "---|" * len(SETS)]  # fmt: skip
    for label in check["models"]:
        cells = []
        for s in SETS:
            d = check["auc"][label][s]
            if label == "base":
                cells.append(f"AUC {f(d['a'])} ({d['pairs']}, {d['users']})")
            else:
                cells.append(f"AUC {f(d['a'])}; {d['diff']:+.3f} [{d['lo']:+.3f}, "
                             f"{d['hi']:+.3f}]" if d["diff"] is not None else "n/a")  # fmt: skip
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines
