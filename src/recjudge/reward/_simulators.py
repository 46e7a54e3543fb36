"""User-simulator reward models from the BRIEF paper's baselines: PUB, Agent4Rec, RecAgent.

Each simulator is a judge mode. It first builds a persona of the user with the LLM (one
free-text answer per user history, kept in the results store so a rerun costs nothing),
then answers the same grammar-constrained YES/NO question as the zero-shot judge, playing
that persona (no CF bias, no evidence list). Same model, same history budget and the same
decoding as every other mode, so the rows of a BRIEF table compare like with like.

What is kept of each original and what is not is in each class's docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from recjudge._registry import Registry
from recjudge._util import chat, stable_hash
from recjudge.data import TitleScreen
from recjudge.reward._stored import StoredAsk

SIMULATOR_VERSION = "sim-v1"  # part of every persona and judgment key: bump on prompt change
SIMULATOR_FINGERPRINT = "sim-v1:b3201c3ff1bb7afd"  # tests/test_prompt_versions.py


@dataclass(frozen=True)
class Population:
    """Facts about the whole dataset that a simulator reads: item genres and mean ratings,
    user attributes, and Agent4Rec's trait cut points computed over every user.

    Agent4Rec's tiers (its ``2_get_user_statistic.py``): activity = ratings per user, cut at
    the 60th and 90th percentiles; conformity = mean squared gap between the user's rating
    and the item's mean rating, cut at the 25th and 80th; diversity = how many of the user's
    top genres cover 80 % of their genre mentions, cut at the 33rd and 66th.
    """

    item_genres: dict[str, list[str]]
    item_mean: dict[str, float]
    users: dict[str, dict[str, Any]]
    activity_cuts: tuple[float, float]
    conformity_cuts: tuple[float, float]
    diversity_cuts: tuple[float, float]

    @classmethod
    def of(cls, dataset: Any, interactions: Any = None) -> Population:
        """From ``dataset`` (its ``interactions``, or the given ones: e.g. only the past
        part of a timeline split, so no held-out rating reaches a trait)."""
        inter = dataset.interactions if interactions is None else interactions
        items = dataset.items
        genres = {
            str(i): [g for g in str(v).split("|") if g and g != "nan"]
            for i, v in zip(items["item_id"], items.get("genres", [""] * len(items)), strict=True)
        }
        rating = inter["rating"].astype(float)
        item_mean = rating.groupby(inter["item_id"].astype(str)).mean().to_dict()
        users = (
            dataset.users.assign(_k=dataset.users["user_id"].astype(str))
            .drop_duplicates("_k")
            .set_index("_k")
            .drop(columns=["user_id"])
            .to_dict("index")
            if dataset.users is not None
            else {}
        )
        counts = inter.groupby("user_id", observed=True).size().to_numpy(float)
        gap = (rating - inter["item_id"].astype(str).map(item_mean)) ** 2
        conformity = gap.groupby(inter["user_id"], observed=True).mean().to_numpy(float)
        per_user = inter.groupby("user_id", observed=True)["item_id"].apply(
            lambda s: diversity_count([genres.get(str(i), []) for i in s])
        )
        div = per_user.to_numpy(float)
        return cls(
            genres,
            {str(k): float(v) for k, v in item_mean.items()},
            {str(k): dict(v) for k, v in users.items()},
            tuple(np.percentile(counts, [60, 90]).tolist()),  # type: ignore[arg-type]
            tuple(np.percentile(conformity, [25, 80]).tolist()),  # type: ignore[arg-type]
            tuple(np.percentile(div, [33, 66]).tolist()),  # type: ignore[arg-type]
        )

    def traits(self, history: Sequence[Any]) -> dict[str, int]:
        """Agent4Rec's activity, conformity and diversity tiers (1-3) of a history."""
        ratings = [
            (float(h.rating) - self.item_mean[h.item_id]) ** 2
            for h in history
            if h.rating is not None and h.rating == h.rating and h.item_id in self.item_mean
        ]
        conformity = float(np.mean(ratings)) if ratings else 0.0
        diversity = diversity_count([self.item_genres.get(h.item_id, []) for h in history])
        return {
            "activity": _tier(len(history), self.activity_cuts),
            "conformity": _tier(conformity, self.conformity_cuts),
            "diversity": _tier(diversity, self.diversity_cuts),
        }


def diversity_count(genre_lists: Sequence[Sequence[str]]) -> int:
    """How many of the most frequent genres have a cumulative share <= 0.8 (Agent4Rec)."""
    counts: dict[str, int] = {}
    for gs in genre_lists:
        for g in gs:
            counts[g] = counts.get(g, 0) + 1
    total = sum(counts.values())
    if not total:
        return 0
    cum, n = 0.0, 0
    for c in sorted(counts.values(), reverse=True):
        cum += c / total
        if cum > 0.8 + 1e-12:
            break
        n += 1
    return n


def _tier(value: float, cuts: tuple[float, float]) -> int:
    return 1 if value < cuts[0] else 2 if value < cuts[1] else 3


def _history_lines(history: Sequence[Any], limit: int) -> str:
    recent = list(reversed(history))[:limit]
    return "\n".join(
        f"- {h.text}" + (f" (rated {h.rating:g})" if h.rating is not None and h.rating == h.rating
                         else "")
        for h in recent
    )  # fmt: skip


class Simulator:
    """A persona step and the role the judge then plays."""

    name: ClassVar[str] = ""
    needs_population: ClassVar[bool] = False

    #: the persona step's chat: its system text, and its task with ``{history}`` where the
    #: user's most recent ``limit`` items go (one line each, with the rating when there is one)
    profile_system: ClassVar[str]
    profile_task: ClassVar[str]

    def profile_messages(
        self, user_id: str, history: Sequence[Any], population: Population | None, limit: int
    ) -> list[dict[str, str]]:
        """The persona step's chat for one user (the history filled into ``profile_task``;
        ``str.format`` reads only the class's template, never the titles)."""
        return chat(
            self.profile_system, self.profile_task.format(history=_history_lines(history, limit))
        )

    def system(
        self, persona: str, user_id: str, history: Sequence[Any], population: Population | None
    ) -> str:
        raise NotImplementedError

    question: ClassVar[str] = "Would you enjoy the candidate below?"


SIMULATORS: Registry[type[Simulator]] = Registry("user simulator")


@SIMULATORS.decorator("pub")
class PUB(Simulator):
    """PUB (Ma et al.): a personality-driven user simulator.

    Kept: the Big-Five personality profile inferred by the LLM from the user's history and
    ratings, conditioning every decision. Left out: PUB's fine-tuned behaviour model and its
    item-side persona matching; the decision is our constrained YES/NO.
    """

    name = "pub"

    profile_system = "You are a psychologist who infers personality from media choices."
    profile_task = (
        "These are the items a user chose, with their "
        "ratings, most recent first:\n{history}\n\nInfer the "
        "user's Big-Five personality: for each of openness, conscientiousness, "
        "extraversion, agreeableness and neuroticism write high, medium or low and a "
        "few words of reason, one trait per line."
    )

    def system(self, persona, user_id, history, population):
        return (
            "You are role-playing a real user whose personality is:\n"
            f"{persona}\nDecide as this person would, given their past choices."
        )


_ACTIVITY = {
    1: "you watch very rarely and leave as soon as something disappoints you",
    2: "you watch now and then, only what clearly matches your taste",
    3: "you watch a lot and are happy to try most of what is recommended",
}
_CONFORMITY = {
    1: "your opinions follow the public's ratings closely",
    2: "you weigh the public's ratings against your own taste",
    3: "you judge only by your own taste, whatever others think",
}
_DIVERSITY = {
    1: "you stay within a few favourite genres",
    2: "you mostly keep to your genres but sometimes explore",
    3: "you seek out unusual and varied films",
}


@SIMULATORS.decorator("agent4rec")
class Agent4Rec(Simulator):
    """After Agent4Rec (Zhang et al. 2024; LehengTHU/Agent4Rec).

    Kept: the profile module (a taste summary the LLM writes from the rated history, plus
    the activity, conformity and diversity traits computed from the log with the original's
    statistics and cut points, ``Population``), memory of recent interactions (the history
    in the prompt), and the watch decision, here a constrained YES/NO. Left out: page-by-page
    browsing, the exit decision, memory retrieval by embedding and reflection; the trait
    descriptions are ours, not the original's wording.
    """

    name = "agent4rec"
    needs_population = True
    question = "Would you choose to watch the candidate below?"

    profile_system = "You summarise a viewer's tastes."
    profile_task = (
        "A viewer rated these items, most recent first:\n"
        "{history}\n\nIn at most five short lines, each starting "
        "with 'I like', describe their tastes, then one line saying which items they "
        "rate highly."
    )

    def system(self, persona, user_id, history, population):
        assert population is not None
        t = population.traits(history)
        return (
            "You are good at role-playing. Imagine you are a user browsing a recommender. "
            f"Your activity: {_ACTIVITY[t['activity']]}. Your conformity: "
            f"{_CONFORMITY[t['conformity']]}. Your diversity: {_DIVERSITY[t['diversity']]}. "
            f"Your tastes:\n{persona}"
        )


@SIMULATORS.decorator("recagent")
class RecAgent(Simulator):
    """After RecAgent (Wang et al.; RUC-GSAI/YuLan-Rec).

    Kept: the profile module (the user's attributes from the users table and an 'interest'
    and 'feature' description the LLM writes from the history) and the memory module in two
    levels: short-term memory = the recent interactions in the prompt, long-term memory =
    that written description. The decision to watch is a constrained YES/NO. Left out: the
    sandbox (chatting, posting, other agents), memory importance scores and reflection.
    """

    name = "recagent"
    needs_population = True
    question = "Do you want to watch the candidate below?"

    profile_system = "You write user profiles for a simulation."
    profile_task = (
        "From the items this user watched (most recent "
        "first):\n{history}\n\nWrite two lines. 'Interest:' "
        "the kinds of items they enjoy. 'Feature:' how they choose (e.g. follows "
        "trends, loves classics, avoids long films)."
    )

    def system(self, persona, user_id, history, population):
        attrs = population.users.get(str(user_id), {}) if population is not None else {}
        about = ", ".join(f"{k}: {v}" for k, v in attrs.items() if k != "zip_code" and v == v)
        return (
            "You are role-playing a user in a recommender-system simulation. "
            f"Profile: {about or 'no attributes known'}.\nLong-term memory of yourself:\n"
            f"{persona}"
        )


def persona_key(simulator: Simulator, request: Any, settings: dict[str, Any], limit: int) -> str:
    """The stored persona's key: simulator, model settings, user and history."""
    history = [(h.item_id, h.text, h.rating) for h in request.history]
    return stable_hash(SIMULATOR_VERSION, simulator.name, settings, request.user_id, history,
                       limit, length=32)  # fmt: skip


def persona_asks(
    simulator: Simulator,
    requests: Sequence[Any],
    population: Population | None,
    settings: dict[str, Any],
    limit: int,
) -> list[Any]:
    """One stored question per distinct (user, history).

    A persona may leave the machine in a checkpoint (``recjudge store export``) only if it
    names no title of the history it was written from (``title_free_persona``); one that does
    stays behind and a resumed run writes it again.
    """
    asks: dict[str, Any] = {}
    for r in requests:
        key = persona_key(simulator, r, settings, limit)
        if key not in asks:
            # Every name the model was shown for an item: its citable title, its rendered
            # text (whose title part the screen splits out) and its id where the id is a
            # name (ML-1M's are the titles; a number such as ML-100K's names nothing, and
            # screening it would hold back every persona with a Big-Five score in it).
            screen = TitleScreen(
                s
                for h in r.history
                for s in (h.title, h.text, *([h.item_id] if _is_name(h.item_id) else []))
            )
            asks[key] = StoredAsk(
                key,
                {"kind": "persona", "simulator": simulator.name, "user_id": r.user_id},
                simulator.profile_messages(r.user_id, r.history, population, limit),
                portable=title_free_persona(screen),
            )
    return list(asks.values())


def _is_name(item_id: str) -> bool:
    return any(ch.isalpha() for ch in str(item_id))


def title_free_persona(screen: Any) -> Any:
    """``StoredAsk.portable`` of a persona: ``{"text": ...}`` if the text names no title of
    ``screen`` (``recjudge.data.TitleScreen``, in any common spelling), else ``None``.

    Personas are the simulators' costliest step (one free-text answer per user and
    simulator, ~7 s each for the 1.5B on 2 bf16 cores), so a long run that cannot finish in one
    sitting carries the title-free ones to the next machine instead of writing them again.
    """

    def form(result: dict[str, Any]) -> dict[str, Any] | None:
        text = result.get("text")
        if not isinstance(text, str) or screen.names_title(text):
            return None
        return {"text": text}

    return form
