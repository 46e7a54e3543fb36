"""GISTBench: interest extraction, groundedness (IG precision / recall / F1) and specificity (IS).

After "GISTBench: Evaluating LLM User Understanding via Evidence-Based Interest Verification"
(Meta, 2026, arXiv 2603.29112). A model under test lists a user's interests, each citing
objects from the user's history; a separate judge model keeps the cited objects that really
show the interest, and an interest is *verified* when the surviving evidence passes a
signal-count predicate. Specificity asks the judge to find an interest's evidence among
distractors. Scores are pure functions of per-interest records (``gist score``).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from recjudge._util import rng

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

GIST_PROMPT_VERSION = "gist-v1"
GIST_PROMPT_FINGERPRINT = "gist-v1:39fa69db097acbd3"  # tests/test_prompt_versions.py
SIGNALS = ("imp+", "exp+", "imp-", "exp-")
EVENT_SIGNAL = {
    "implicit_positive": "imp+",
    "explicit_positive": "exp+",
    "implicit_negative": "imp-",
    "explicit_negative": "exp-",
}
EVENT_WORDS = (
    "explicit_positive (rated highly / loved), implicit_positive (engaged or liked), "
    "implicit_negative (skipped or abandoned), explicit_negative (rated low / disliked)"
)


# -- taxonomy -----------------------------------------------------------------------------
def load_categories(path: str | Path | None = None) -> dict[int, str]:
    """The 325 GISTBench interest categories (paper appendix, tables 8-9), id -> name.

    Args:
        path: a CSV with ``category_id,category_name`` (default: the shipped taxonomy).
    """
    if path is None:
        text = (
            resources.files("recjudge.evaluators")
            .joinpath("data/gist_categories.csv")
            .read_text(encoding="utf-8")
        )
        source = "recjudge/evaluators/data/gist_categories.csv"
    else:
        text, source = Path(path).read_text(encoding="utf-8"), str(path)
    out: dict[int, str] = {}
    for i, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        try:
            out[int(row["category_id"])] = row["category_name"].strip()
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{source}, line {i}: need integer category_id and a category_name "
                f"(header 'category_id,category_name'); got {row!r}"
            ) from None
    if not out:
        raise ValueError(f"{source}: no categories")
    return out


# -- verification predicate ---------------------------------------------------------------
class Predicate(BaseModel):
    """Which surviving evidence verifies an interest (GISTBench defaults).

    Verified if imp+ >= ``imp_pos``, or exp+ >= ``exp_pos``, or (exp+ >= ``mixed_exp`` and
    imp+ >= ``mixed_imp``); rejected if imp- > ``max_imp_neg`` or exp- > ``max_exp_neg`` or no
    cited object survives the judge's relevance filter. Datasets without some signal (e.g.
    no explicit feedback) simply never reach that branch; raise or lower the thresholds to
    fit the signals a dataset has.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    imp_pos: int = Field(3, ge=1)
    exp_pos: int = Field(2, ge=1)
    mixed_exp: int = Field(1, ge=1)
    mixed_imp: int = Field(2, ge=1)
    max_imp_neg: int = Field(3, ge=0)
    max_exp_neg: int = Field(2, ge=0)

    def describe(self) -> str:
        """The rule in words, for the extraction prompt (closed loop with the verifier)."""
        return (
            "An interest is accepted only if the cited objects that really show it include at "
            f"least {self.imp_pos} implicit_positive, or at least {self.exp_pos} "
            f"explicit_positive, or at least {self.mixed_exp} explicit_positive together with "
            f"{self.mixed_imp} implicit_positive. It is rejected if they include more than "
            f"{self.max_imp_neg} implicit_negative or more than {self.max_exp_neg} "
            "explicit_negative."
        )

    def check(self, counts: Mapping[str, int]) -> tuple[bool, list[str]]:
        """(verified, failure modes) for signal counts of the surviving objects.

        Failure modes are not exclusive and, as GISTBench Table 7 counts them, each is named
        by its own condition on every unverified interest: ``no_evidence`` (no cited object
        survived the judge's filter), ``insufficient_imp+`` (fewer than ``imp_pos`` implicit
        positives), ``insufficient_exp+`` (fewer than ``exp_pos`` explicit positives),
        ``excess_imp-`` and ``excess_exp-`` (more negatives than allowed). A verified
        interest has none.
        """
        c = {s: int(counts.get(s, 0)) for s in SIGNALS}
        positive = (
            c["imp+"] >= self.imp_pos
            or c["exp+"] >= self.exp_pos
            or (c["exp+"] >= self.mixed_exp and c["imp+"] >= self.mixed_imp)
        )
        excess = c["imp-"] > self.max_imp_neg or c["exp-"] > self.max_exp_neg
        if positive and not excess:
            return True, []
        reasons = []
        if sum(c.values()) == 0:
            reasons.append("no_evidence")
        if c["imp+"] < self.imp_pos:
            reasons.append("insufficient_imp+")
        if c["exp+"] < self.exp_pos:
            reasons.append("insufficient_exp+")
        if c["imp-"] > self.max_imp_neg:
            reasons.append("excess_imp-")
        if c["exp-"] > self.max_exp_neg:
            reasons.append("excess_exp-")
        return False, reasons


# -- scoring (pure) -----------------------------------------------------------------------
def _median(values: Sequence[float]) -> float:
    return float(np.median(values)) if len(values) else 0.0


def user_scores(records: Sequence[Mapping[str, Any]], oracle: set[Any]) -> dict[str, float | int]:
    """One model's scores for one user from its per-interest records.

    Per category c: G_c = verified / interests and S_c = sum(correct) / sum(backing).
    IG_P = sum_c G_c / |categories the model's interests fall in|; IG_R = sum over oracle
    categories of G_c / |oracle| (oracle = categories with a verified interest from any
    evaluated model); IG_F1 = 2 P R / (P + R); IS = mean S_c over categories with G_c > 0
    (0 if none). All 0 for a user with no interests.
    """
    cats: dict[Any, list[Mapping[str, Any]]] = {}
    for r in records:
        cats.setdefault(r["category_id"], []).append(r)
    g = {c: sum(bool(r["verified"]) for r in rs) / len(rs) for c, rs in cats.items()}
    s = {}
    for c, rs in cats.items():
        backing = sum(int(r.get("backing") or 0) for r in rs)
        s[c] = sum(int(r.get("correct") or 0) for r in rs) / backing if backing else 0.0
    p = sum(g.values()) / len(g) if g else 0.0
    r_ = sum(g.get(c, 0.0) for c in oracle) / len(oracle) if oracle else 0.0
    f1 = 2 * p * r_ / (p + r_) if p + r_ > 0 else 0.0
    specific = [s[c] for c in g if g[c] > 0]
    return {
        "ig_p": p,
        "ig_r": r_,
        "ig_f1": f1,
        "is": float(np.mean(specific)) if specific else 0.0,
        "interests": len(records),
        "categories": len(g),
        "oracle": len(oracle),
    }


def build_oracle(records: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """user_id -> sorted categories with a verified interest from any model (the union)."""
    out: dict[str, set[Any]] = {}
    for r in records:
        out.setdefault(str(r["user_id"]), set())
        if r["verified"]:
            out[str(r["user_id"])].add(r["category_id"])
    return {u: sorted(c, key=str) for u, c in out.items()}


def gist_scores(
    records: Sequence[Mapping[str, Any]],
    oracle: Mapping[str, Sequence[Any]] | None = None,
    users: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Per model: medians over users of ig_p, ig_r, ig_f1, is, plus per-user values and
    failure-mode percentages.

    Args:
        records: per-interest records with ``user_id, model, interest, category_id,
            verified, correct, backing`` (and optionally ``reasons``).
        oracle: ``{user_id: [category_ids]}``; default: the union over ``records``.
        users: users every model is scored on (a model with no interest for a user scores
            0 there); default: every user in ``records``.
        models: models under test scored even without any interest (0 everywhere, so a
            model that wrote nothing stays in the table); the models in ``records`` always are.
    """
    for i, r in enumerate(records):
        missing = [k for k in ("user_id", "model", "category_id", "verified") if k not in r]
        if missing:
            raise ValueError(
                f"interest record {i} lacks {missing}; each record needs user_id, model, "
                "interest, category_id, verified, correct, backing"
            )
    oracle = build_oracle(records) if oracle is None else oracle
    oracle_sets = {str(u): set(c) for u, c in oracle.items()}
    users = (
        [str(u) for u in users]
        if users is not None
        else sorted({str(r["user_id"]) for r in records})
    )
    models = sorted({str(r["model"]) for r in records} | {str(m) for m in models or ()})
    out: dict[str, Any] = {}
    for m in models:
        mine = [r for r in records if str(r["model"]) == m]
        per_user = {}
        for u in users:
            rs = [r for r in mine if str(r["user_id"]) == u]
            per_user[u] = user_scores(rs, oracle_sets.get(u, set()))
        # Failure modes over unverified interests; one interest may show several.
        unverified = [r for r in mine if not r["verified"]]
        reasons: dict[str, int] = {}
        for r in unverified:
            for why in dict.fromkeys(r.get("reasons") or []):
                reasons[why] = reasons.get(why, 0) + 1
        n = len(mine)
        out[m] = {
            **{
                k: _median([v[k] for v in per_user.values()])
                for k in ("ig_p", "ig_r", "ig_f1", "is")
            },
            "interests": n,
            "verified_pct": 100 * sum(bool(r["verified"]) for r in mine) / n if n else 0.0,
            "echoes_example": sum(bool(r.get("echoes_example")) for r in mine),
            "echoes_verified": sum(bool(r.get("echoes_example") and r["verified"]) for r in mine),
            "signal_names": sum(bool(r.get("names_signal")) for r in mine),
            "signal_names_verified": sum(
                bool(r.get("names_signal") and r["verified"]) for r in mine
            ),
            "unverified": len(unverified),
            "failure_pct": {k: 100 * v / len(unverified) for k, v in sorted(reasons.items())},
            "users": per_user,
        }
    return out


GIST_METRICS = ("ig_p", "ig_r", "ig_f1", "is")


def gist_intervals(
    scores: Mapping[str, Any], draws: int = 1000, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """95 % percentile intervals over users for ``gist_scores``' medians, and each model's
    precision minus recall.

    Users are resampled with replacement (the same draws for every model and metric, so the
    models' intervals are comparable); each draw takes the median over the drawn users, as
    the table does. ``p_minus_r`` is the mean over users of IG_P(u) - IG_R(u) with its
    bootstrap interval: the paper's finding that coverage (recall), not hallucination
    (precision), is the bottleneck predicts it above 0.

    Args:
        scores: ``gist_scores`` output (its per-user values under ``"users"``).
        draws: bootstrap resamples (0: no intervals).
        seed: resampling seed.

    Returns:
        ``{model: {metric: {"lo", "hi"}, "p_minus_r": {"estimate", "lo", "hi"}}}``.
    """
    from recjudge._stats import user_draws

    out: dict[str, dict[str, Any]] = {}
    per_user = _per_user_values(scores)
    if not per_user or draws <= 0:
        return out
    idx = user_draws(len(next(iter(per_user.values()))), draws, seed)
    for m, vals in per_user.items():
        med = np.median(vals[idx], axis=1)  # [draws, metrics]
        lo, hi = np.percentile(med, [2.5, 97.5], axis=0)
        d = vals[:, 0] - vals[:, 1]
        dl, dh = np.percentile(d[idx].mean(axis=1), [2.5, 97.5])
        out[m] = {
            **{k: {"lo": float(lo[j]), "hi": float(hi[j])} for j, k in enumerate(GIST_METRICS)},
            "p_minus_r": {"estimate": float(d.mean()), "lo": float(dl), "hi": float(dh)},
        }
    return out


def _per_user_values(scores: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``{model: [users, GIST_METRICS]}`` in the first model's user order ({} if no users).

    Raises:
        ValueError: a model is scored on other users than the first (nothing to pair).
    """
    if not scores:
        return {}
    users = list(next(iter(scores.values()))["users"])
    if not users:
        return {}
    out = {}
    for m, s in scores.items():
        if list(s["users"]) != users:
            raise ValueError(f"model {m!r} is scored on other users than the first model")
        out[m] = np.array([[s["users"][u][k] for k in GIST_METRICS] for u in users], dtype=float)
    return out


def gist_differences(
    scores: Mapping[str, Any], draws: int = 1000, seed: int = 0
) -> dict[str, dict[str, dict[str, float]]]:
    """Each pair of models' difference of medians over users, with a paired 95 % interval.

    ``A minus B`` on metric k is median_u k_A(u) - median_u k_B(u), the gap a reader of the
    table sees (GISTBench ranks models by these medians). The interval resamples users with
    replacement, the same draws for both models (they answered for the same users), so it
    tests whether the ranking holds beyond the users sampled; an interval containing 0 means
    the two models are not separated at this size.

    Args:
        scores: ``gist_scores`` output (its per-user values under ``"users"``).
        draws: bootstrap resamples (0: no differences).
        seed: resampling seed (``gist_intervals`` with the same seed draws the same users).

    Returns:
        ``{"A minus B": {metric: {"estimate", "lo", "hi"}}}`` for every pair in ``scores``'
        order (A before B).
    """
    from recjudge._stats import user_draws

    per_user = _per_user_values(scores)
    if not per_user or draws <= 0:
        return {}
    idx = user_draws(len(next(iter(per_user.values()))), draws, seed)
    models = list(per_user)
    out = {}
    for i, a in enumerate(models):
        for b in models[i + 1 :]:
            point = np.median(per_user[a], axis=0) - np.median(per_user[b], axis=0)
            boot = np.median(per_user[a][idx], axis=1) - np.median(per_user[b][idx], axis=1)
            lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
            out[f"{a} minus {b}"] = {
                k: {"estimate": float(point[j]), "lo": float(lo[j]), "hi": float(hi[j])}
                for j, k in enumerate(GIST_METRICS)
            }
    return out


def read_interest_records(path: str | Path) -> list[dict[str, Any]]:
    """Per-interest records from a JSONL file, with a clear error naming the bad line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {i}: not JSON ({e}); one record per line") from None
    return out


def read_oracle(path: str | Path) -> dict[str, list[Any]]:
    """``{"oracle": {user_id: [category_ids]}}`` from a JSON file."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("oracle"), dict):
        raise ValueError(f'{path}: expected {{"oracle": {{user_id: [category_ids]}}}}')
    return {str(u): list(c) for u, c in obj["oracle"].items()}


# -- specificity sampling ------------------------------------------------------------------
def global_pool(
    histories: Mapping[str, Sequence[str]], size: int = 1000, seed: int = 0
) -> list[str]:
    """``size`` distinct objects sampled uniformly across users: a user uniformly at random,
    then one of that user's objects uniformly (seeded by sha256, not Python's ``hash``)."""
    users = sorted(u for u, h in histories.items() if len(h))
    total = len({o for u in users for o in histories[u]})
    size = min(size, total)
    g = rng("gist-pool", seed)
    pool: dict[str, None] = {}
    while len(pool) < size:
        u = users[int(g.integers(len(users)))]
        h = histories[u]
        pool.setdefault(str(h[int(g.integers(len(h)))]), None)
    return list(pool)


def specificity_evidence(cited: Sequence[str], n: int, seed: Any) -> list[str]:
    """The specificity question's evidence: ``min(|O_j|, n)`` objects sampled without
    replacement from the interest's cited set ``O_j`` (GISTBench 4.3), seeded and
    process-independent; whether the judge kept them does not matter here."""
    cited = list(dict.fromkeys(cited))
    if len(cited) <= n:
        return cited
    pick = rng("gist-evidence", seed).choice(len(cited), n, replace=False)
    return [cited[i] for i in sorted(pick.tolist())]


def specificity_options(
    evidence: Sequence[str], distractors: Sequence[str], seed: Any
) -> tuple[list[str], list[bool]]:
    """The shuffled option list and which entries are evidence (seeded, process-independent)."""
    items = [(o, True) for o in evidence] + [(o, False) for o in distractors]
    order = rng("gist-options", seed).permutation(len(items))
    return [items[i][0] for i in order], [items[i][1] for i in order]


def normalize_interest(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def _content_words(text: str) -> list[str]:
    return sorted(w for w in re.split(r"[\W_]+", text.casefold()) if w and not re.search(r"\d", w))


def echoes_example(interest: str, example: str) -> bool:
    """Whether an interest repeats the extraction prompt's example up to its numbers.

    The words without a digit, case-folded, are the example's words (as a multiset): with
    the example "1990s crime thrillers", "1980s crime thrillers" and "Crime Thrillers" echo
    it, "legal thrillers" does not. A model that cannot read its input falls back on the
    example (measured on Book-Crossing); the report counts these interests per model.
    """
    words = _content_words(example)
    return bool(words) and _content_words(interest) == words


# The prompt's signal words (EVENT_SIGNAL's keys); an adverb ("explicitly") or plural counts.
_SIGNAL_NAME = re.compile(r"^(implicit|explicit)(?:ly)? (positive|negative)s?$")


def names_signal(interest: str) -> bool:
    """Whether an interest is only one of the prompt's engagement signals, not a topic.

    "explicit positive", "Implicitly negative" and "explicit_positive" are; "explicit
    thrillers" is not. The extraction prompt tags every history line with its signal; a model
    that copies a tag as an interest names no topic, and a judge that verifies it anyway
    inflates IG_P (measured on Book-Crossing: the 0.5B wrote 21 such interests, the 1.5B
    judge verified 19). The report counts them per model.
    """
    words = [w for w in re.split(r"[\W_]+", interest.casefold()) if w]
    return bool(_SIGNAL_NAME.match(" ".join(words)))


# -- configuration ------------------------------------------------------------------------
class GistConfig(BaseModel):
    """GISTBench settings. Defaults are the paper's protocol; every other value is a deviation
    that ``deviations()`` names for the report header.

    Attributes:
        models: models under test (presets, paths or Hugging Face ids).
        judge: the verifying judge model (separate from the models under test).
        users: users evaluated (sampled by sha256 of the id).
        min_history: users with fewer interactions are not sampled.
        max_history: most recent engagements considered (``None``, the paper: the whole
            history, in chunks of ``chunk_size``).
        chunk_size: engagements per extraction prompt (the paper: 100).
        max_interests: a grammar cap on interests per chunk (``None``, the paper: no cap;
            the answer is bounded by ``extraction_tokens``).
        max_ids: a grammar cap on cited objects per interest (``None``: no cap).
        extraction_tokens: token budget of one extraction answer; a cut answer keeps its
            complete entries (counted as incomplete).
        words: interest length in words (min, max).
        interest_example: the one example interest the extraction prompt gives (ours: the
            paper's prompt could not be read here). Interests that repeat it are counted
            (``echoes_example``). Any text; it is only put in the prompt.
        max_citations: the prompt asks to cite an object in at most this many interests
            (the paper's rule, instructed only).
        enforce_citations: drop citations beyond ``max_citations`` (counted either way).
        predicate: the verification rule.
        evidence_for_specificity: n = min(|O_j|, this) evidence objects, sampled from the
            interest's cited set O_j (the paper: 5).
        options: evidence + distractors shown per specificity question (the paper: 50).
        pool_size: global distractor pool size (the paper: 1000).
        taxonomy: ``full`` (the paper: the judge picks among all 325 categories),
            ``shortlist`` (among ``shortlist`` categories preselected by embedding and
            trigram similarity; its agreement with ``full`` is measured on
            ``agreement_sample`` interests and reported) or ``off`` (each interest is its
            own category).
        shortlist: categories offered per interest with ``taxonomy="shortlist"``.
        agreement_sample: interests asked both ways to measure the shortlist's agreement.
        batch_size: questions per engine call. On the fast engine a batch's other questions
            can change an answer in its last bits (bf16 arithmetic depends on the batch
            shape), so a question asked again in another batch (a resumed run, a store
            imported on a new machine) can come out different: one of 29 extraction answers
            did on Book-Crossing.
        deterministic: the batch-invariant engine for every decoded answer (extraction,
            evidence filter, specificity; the whole-name taxonomy choice is per interest
            anyway): an answer is bit-identical whatever else shares its batch, for the same
            ``batch_size`` (its fixed row count), so re-asked answers repeat exactly on the
            same kind of machine. Slower (1.58x on the throughput bench's full answers);
            transformers backends only. Not a deviation: it changes how, not what, is asked.
        seed: sampling seed.
        bootstrap: user resamples for the intervals over users (``gist_intervals``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    models: tuple[str, ...] = ("smollm2-135m",)
    judge: str = "qwen2.5-coder-0.5b"
    users: int = Field(30, ge=1)
    min_history: int = Field(20, ge=1)
    max_history: int | None = Field(None, ge=1)
    chunk_size: int = Field(100, ge=5)
    max_interests: int | None = Field(None, ge=1)
    max_ids: int | None = Field(None, ge=1)
    extraction_tokens: int = Field(1024, ge=16)
    words: tuple[int, int] = (2, 5)
    interest_example: str = Field("1990s crime thrillers", min_length=1, max_length=200)
    max_citations: int = Field(2, ge=1)
    enforce_citations: bool = False
    predicate: Predicate = Predicate()
    evidence_for_specificity: int = Field(5, ge=1)
    options: int = Field(50, ge=2)
    pool_size: int = Field(1000, ge=10)
    taxonomy: Literal["full", "shortlist", "off"] = "full"
    shortlist: int = Field(24, ge=2)
    agreement_sample: int = Field(50, ge=0)
    batch_size: int = Field(8, ge=1)
    deterministic: bool = False
    seed: int = 0
    bootstrap: int = Field(1000, ge=0)

    def deviations(self) -> list[str]:
        """How this configuration departs from the paper's protocol."""
        out = []
        if self.max_history is not None:
            out.append(f"only the latest {self.max_history} engagements (the paper: all)")
        if self.chunk_size != 100:
            out.append(f"chunks of {self.chunk_size} engagements (the paper: 100)")
        if self.max_interests is not None or self.max_ids is not None:
            out.append(
                f"grammar caps: {self.max_interests or 'any'} interests per chunk, "
                f"{self.max_ids or 'any'} ids per interest (the paper: none)"
            )
        if self.enforce_citations:
            out.append(
                f"citations beyond {self.max_citations} per object are dropped (the paper "
                "only instructs the rule)"
            )
        if self.evidence_for_specificity != 5 or self.options != 50 or self.pool_size != 1000:
            out.append(
                f"specificity with n <= {self.evidence_for_specificity} of {self.options} "
                f"options from a pool of {self.pool_size} (the paper: 5 of 50 from 1000)"
            )
        if self.taxonomy == "shortlist":
            out.append(
                f"taxonomy choice among a {self.shortlist}-category shortlist (the paper: all "
                "325; agreement with the full choice is reported)"
            )
        elif self.taxonomy == "off":
            out.append("no taxonomy: each interest is its own category (the paper maps to 325)")
        return out


# -- prompts ---------------------------------------------------------------------------------
def extraction_messages(
    lines: Sequence[str], domain_word: str, config: GistConfig
) -> list[dict[str, str]]:
    lo, hi = config.words
    return [
        {
            "role": "system",
            "content": "You study a user's activity history and list their specific interests.",
        },
        {
            "role": "user",
            "content": (
                f"Below are the user's {len(lines)} most recent engagements with {domain_word}, "
                "most recent first. Each line is `[object_id] event_type - object`. Event "
                f"types: {EVENT_WORDS}.\n\n"
                + "\n".join(lines)
                + f"\n\nList the user's specific interests, each {lo} to {hi} words (for "
                f'example "{config.interest_example}", not "{domain_word}"), each citing the '
                "ids of the objects above that show it. Cite each object in at most "
                f"{config.max_citations} interests. {config.predicate.describe()} So cite "
                "enough positive evidence for each interest and do not list things the "
                'user dislikes. Answer as JSON: [{"interest": "...", "ids": ["...", ...]}, ...]'
            ),
        },
    ]


def relevance_messages(interest: str, domain_word: str) -> list[dict[str, str]]:
    """Judge prompt with the object in the slot at the very end (shared prefix per interest)."""
    from recjudge.reward import SLOT

    return [
        {"role": "system", "content": "You check evidence for a person's interests."},
        {
            "role": "user",
            "content": (
                f'Interest: "{interest}".\nIs the following one of the {domain_word} a clear '
                "example of this interest? Answer YES or NO as JSON.\n"
                f"Object: {SLOT}"
            ),
        },
    ]


def specificity_messages(
    interest: str, options: Sequence[str], n: int, domain_word: str
) -> list[dict[str, str]]:
    lines = [f"{i + 1}. {o}" for i, o in enumerate(options)]
    return [
        {"role": "system", "content": "You match interests to the objects that show them."},
        {
            "role": "user",
            "content": (
                f'A user has the interest "{interest}". Exactly {n} of the following '
                f"{len(options)} {domain_word} come from this user's history as evidence of "
                "that interest; the others are unrelated.\n\n"
                + "\n".join(lines)
                + f"\n\nPick the {n} numbers of the evidence. Answer as JSON: "
                '{"picks": ["<number>", ...]}'
            ),
        },
    ]


def taxonomy_messages(interest: str, names: Sequence[str]) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You file interests under a category."},
        {
            "role": "user",
            "content": (
                f'Interest: "{interest}".\nCategories:\n'
                + "\n".join(f"- {n}" for n in names)
                + "\n\nWhich single category fits this interest best? Answer as JSON: "
                '{"category": "<category>"}'
            ),
        },
    ]


def taxonomy_full_messages(names: Sequence[str]) -> list[dict[str, str]]:
    """The taxonomy question over every category, with the interest in the slot at the very
    end (so the long category list is a prefix shared by all interests)."""
    from recjudge.reward import SLOT

    return [
        {"role": "system", "content": "You file interests under a category."},
        {
            "role": "user",
            "content": "Categories:\n"
            + "\n".join(f"- {n}" for n in names)
            + "\n\nWhich single category above fits the interest below best? Answer as JSON: "
            '{"category": "<category>"}\n'
            f"Interest: {SLOT}",
        },
    ]


# -- embeddings and the taxonomy shortlist -------------------------------------------------
def embed_texts(llm: LLMBackend, texts: Sequence[str], batch: int = 32) -> np.ndarray:
    """Mean-pooled last hidden states of ``llm`` for ``texts``, L2-normalised (a cheap
    shortlist embedding from the judge model itself; no extra download)."""
    import torch

    tok = llm.tokenizer
    out = []
    for b in range(0, len(texts), batch):
        enc = tok(list(texts[b : b + batch]), return_tensors="pt", padding=True)
        with torch.inference_mode():
            h = llm.model.base_model(**enc).last_hidden_state.float()
        m = enc["attention_mask"][..., None].float()
        v = (h * m).sum(1) / m.sum(1)
        out.append(torch.nn.functional.normalize(v, dim=-1).numpy())
    return np.concatenate(out) if out else np.zeros((0, 1))


def _trigrams(text: str) -> set[str]:
    t = f"  {text.lower()} "
    return {t[i : i + 3] for i in range(len(t) - 2)}


def shortlist_categories(
    interest_vecs: np.ndarray,
    interests: Sequence[str],
    cat_vecs: np.ndarray,
    cat_names: Sequence[str],
    k: int,
) -> list[list[int]]:
    """Per interest, indices of ``k`` categories: the best by embedding cosine, with a quarter
    of the slots given to the best character-trigram matches (catches literal overlaps the
    small model's embedding misses)."""
    sims = interest_vecs @ cat_vecs.T
    cat_grams = [_trigrams(n) for n in cat_names]
    lexical_k = max(1, k // 4)
    out = []
    for i, text in enumerate(interests):
        g = _trigrams(text)
        lex = np.array([len(g & c) / (len(g | c) or 1) for c in cat_grams])
        chosen = list(dict.fromkeys(np.argsort(-lex, kind="stable")[:lexical_k].tolist()))
        for j in np.argsort(-sims[i], kind="stable").tolist():
            if len(chosen) >= k:
                break
            if j not in chosen:
                chosen.append(j)
        out.append(sorted(chosen))
    return out


def _pr_draw(ax: Any, scores: Mapping[str, Any], data: str) -> None:
    """Per-user IG precision against recall, one colour per model for its dots and its median."""
    for i, (m, s) in enumerate(scores.items()):
        # An explicit colour: each scatter() call takes the next colour of the cycle, which
        # would give a model's median star another model's colour.
        color = f"C{i % 10}"
        ps = [v["ig_p"] for v in s["users"].values()]
        rs = [v["ig_r"] for v in s["users"].values()]
        ax.scatter(rs, ps, alpha=0.35, s=18, color=color)
        ax.scatter(
            [s["ig_r"]],
            [s["ig_p"]],
            marker="*",
            s=220,
            color=color,
            edgecolor="k",
            label=f"{m} (median)",
        )
    ax.set_xlabel("IG recall (per user)")
    ax.set_ylabel("IG precision (per user)")
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(f"GISTBench groundedness on {data}")
    ax.legend(loc="lower right", fontsize=8)


def _plot_pr(scores: Mapping[str, Any], path: Path, data: str) -> None:
    from recjudge.reporting import figure

    with figure(path, size=(6, 5), dpi=120) as ax:
        _pr_draw(ax, scores, data)


def _iv(c: Mapping[str, float] | None) -> str:
    from recjudge.reporting import interval

    return "" if not c else " " + interval(None, c["lo"], c["hi"])


def _signed(d: Mapping[str, float]) -> str:
    """A difference with its interval, signed: ``+0.123 [+0.010, +0.240]``."""
    from recjudge.reporting import interval

    return interval(d["estimate"], d["lo"], d["hi"], signed=True)


def _cost_line(results: Mapping[str, Any]) -> str:
    from recjudge.evaluators._cost import cost_sentence

    labels = {
        "extraction": "extraction answers (models under test)",
        "judge": "judge questions (evidence filter, taxonomy, specificity)",
    }
    return cost_sentence(results["wall_seconds"], results.get("cost") or {}, labels)


_RULE_TEXT = {
    "likelihood": " (the category whose whole name is most likely)",
    "greedy": " (category decoded token by token, which follows the first letters)",
}


def _gist_report(config: GistConfig, data: str, results: Mapping[str, Any]) -> list[str]:
    """The markdown report's lines, in the order a reader checks them: protocol, scores,
    failure modes and counts."""
    return (
        _report_header(config, data, results)
        + _report_scores(results)
        + _report_notes(config, results)
        + ["", "![precision-recall](pr.png)"]
    )


def _report_header(config: GistConfig, data: str, results: Mapping[str, Any]) -> list[str]:
    """Title, protocol line, deviations and what is always ours."""
    devs = list(results.get("deviations", config.deviations()))
    span = f"most recent {config.max_history}" if config.max_history else "whole history"
    return [
        f"# GISTBench on {data}",
        "",
        f"Judge: `{config.judge}`; {len(results['users'])} users (>= {config.min_history} "
        f"interactions, {span}), chunks of {config.chunk_size}, {config.options} options per "
        "specificity question, pool of "
        f"{results['pool_size']}, taxonomy {config.taxonomy}"
        f"{_RULE_TEXT.get(results.get('taxonomy_rule'), '')}, seed {config.seed}. "
        + _cost_line(results),
        "",
        "**Deviations from the paper:** " + ("; ".join(devs) if devs else "none") + ".",
        "",
        f"Always ours: an extraction answer is cut at {config.extraction_tokens} tokens (the "
        "paper sets no bound; a cut answer keeps its complete entries and is counted below).",
        "",
    ]


def _report_scores(results: Mapping[str, Any]) -> list[str]:
    """The score table with intervals, IG_P minus IG_R and the paired model differences."""
    s = results["scores"]
    lines = [
        "Medians over users (higher is better), with 95 % intervals over users (bootstrap, "
        "users resampled) where computed.",
        "",
        "| model | IG_P | IG_R | IG_F1 | IS | interests | verified % |",
        "|---|---|---|---|---|---|---|",
    ]
    iv = results.get("intervals") or {}
    for m, v in s.items():
        cells = [f"{v[k]:.3f}{_iv(iv.get(m, {}).get(k))}" for k in GIST_METRICS]
        lines.append(f"| {m} | {' | '.join(cells)} | {v['interests']} | {v['verified_pct']:.1f} |")
    if iv:
        lines += [
            "",
            "IG_P minus IG_R (mean over users; the paper finds coverage, not precision, the "
            "bottleneck, i.e. this above 0):",
            "",
        ]
        lines += [f"- {m}: {_signed(v['p_minus_r'])}" for m, v in iv.items()]
    diffs = results.get("differences") or {}
    if diffs:
        lines += [
            "",
            "Model differences (median minus median; 95 % intervals with users resampled, the "
            "same users for both models; an interval containing 0: not separated at this size):",
            "",
        ]
        for pair, d in diffs.items():
            cells = ", ".join(f"{k.upper()} {_signed(d[k])}" for k in GIST_METRICS)
            lines.append(f"- {pair}: {cells}")
    return lines


def _report_notes(config: GistConfig, results: Mapping[str, Any]) -> list[str]:
    """Failure modes (Table 7), example echoes, taxonomy agreement and the run's counts."""
    s = results["scores"]
    lines = ["", "Failure modes (% of each model's unverified interests; not exclusive):", ""]
    for m, v in s.items():
        fm = ", ".join(f"{k} {p:.1f}%" for k, p in v["failure_pct"].items()) or "none"
        lines.append(f"- {m} ({v.get('unverified', 0)} unverified): {fm}")
    example = results.get("prompt_example")
    if example:  # interests from our extraction prompt (not ``gist verify``'s profiles)
        lines += [
            "",
            f'Interests that repeat the prompt\'s example ("{example}", up to its numbers): '
            + "; ".join(
                f"{m} {v.get('echoes_example', 0)} of {v['interests']} "
                f"({v.get('echoes_verified', 0)} verified)"
                for m, v in s.items()
            )
            + ".",
        ]
    # Our prompt's tags, so only for its answers; results written before the count: no line.
    if example and any("signal_names" in v for v in s.values()):
        lines += [
            "",
            'Interests that only name an engagement signal of the prompt ("explicit '
            'positive", "implicit negative", ...; no topic): '
            + "; ".join(
                f"{m} {v['signal_names']} of {v['interests']} "
                f"({v['signal_names_verified']} verified)"
                for m, v in s.items()
            )
            + ".",
        ]
    agree = results.get("taxonomy_agreement")
    if agree:
        lines += [
            "",
            f"Shortlist taxonomy agrees with the full 325-category choice on "
            f"{agree['agree']} of {agree['n']} sampled interests "
            f"({agree['agree_pct']:.1f} %).",
        ]
    lines += [
        "",
        f"Extraction answers cut by the token budget (complete entries kept): "
        f"{results['incomplete_extractions']}; citations beyond the instructed "
        f"{config.max_citations}-interests-per-object rule: "
        f"{results.get('over_limit_citations', 0)} "
        f"({'dropped' if config.enforce_citations else 'kept, as the paper'}); "
        "distractors the judge called related but used to fill the option list (least "
        f"related first): {results['filled_distractors']}.",
    ]
    return lines
