"""GISTBench: interest extraction, groundedness (IG precision / recall / F1) and specificity (IS).

After "GISTBench: Evaluating LLM User Understanding via Evidence-Based Interest Verification"
(Meta, 2026, arXiv 2603.29112). A model under test lists a user's interests, each citing
objects from the user's history; a separate judge model keeps the cited objects that really
show the interest, and an interest is *verified* when the surviving evidence passes a
signal-count predicate. Specificity asks the judge to find an interest's evidence among
distractors. Scores are pure functions of per-interest records (``gist score``).

Split as Arena and UserSumBench are: this module holds the config and the taxonomy,
evidence-pool and interest-text helpers; ``_gist_metrics`` the predicate and scores,
``_gist_prompts`` the versioned prompts, ``_gist_report`` the report, ``_gist_pipeline`` the
run (extraction, verification, specificity, taxonomy). The names stay importable from here.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from recjudge._util import rng
from recjudge.evaluators.gist._config import GistConfig
from recjudge.evaluators.gist._metrics import (
    EVENT_SIGNAL,
    GIST_METRICS,
    SIGNALS,
    Predicate,
    build_oracle,
    gist_differences,
    gist_intervals,
    gist_scores,
    read_interest_records,
    read_oracle,
    user_scores,
)
from recjudge.evaluators.gist._prompts import (
    EVENT_WORDS,
    GIST_PROMPT_FINGERPRINT,
    GIST_PROMPT_VERSION,
    extraction_messages,
    relevance_messages,
    specificity_messages,
    taxonomy_full_messages,
    taxonomy_messages,
)

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend


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


# -- prompts ---------------------------------------------------------------------------------
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


__all__ = [
    "EVENT_SIGNAL",
    "EVENT_WORDS",
    "GIST_METRICS",
    "GIST_PROMPT_FINGERPRINT",
    "GIST_PROMPT_VERSION",
    "SIGNALS",
    "GistConfig",
    "Predicate",
    "echoes_example",
    "embed_texts",
    "global_pool",
    "load_categories",
    "names_signal",
    "normalize_interest",
    "shortlist_categories",
    "specificity_evidence",
    "specificity_options",
    "build_oracle",
    "extraction_messages",
    "gist_differences",
    "gist_intervals",
    "gist_scores",
    "read_interest_records",
    "read_oracle",
    "relevance_messages",
    "specificity_messages",
    "taxonomy_full_messages",
    "taxonomy_messages",
    "user_scores",
]
