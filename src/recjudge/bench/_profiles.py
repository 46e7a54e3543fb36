"""Profile scoring at a team's pace: the wall time of ``gist verify`` on the example profile
systems, a first run, a later run into another folder with and without the judge answers
every run shares, and ten systems (the two examples and eight variants, as a team's versions
of its profiler would be).

"Without" is the behaviour before the shared answers (``share_judge_answers=False``): a run
into a new folder asks everything again. Every row runs in this process, one after the other,
with the judge loaded once (its loading is not in any row).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from recjudge.data import load_dataset
from recjudge.evaluators import GistConfig, example_profiles, verify_profiles
from recjudge.llm import load_llm
from recjudge.reporting import write_report

__all__ = ["ProfileScoringConfig", "bench_profile_scoring"]


class ProfileScoringConfig(BaseModel):
    """Settings of the ``profile-scoring`` benchmark.

    Attributes:
        model: the judge (preset, path or Hugging Face id).
        data: a dataset with item genres (the example profiles are built from them).
        users: users profiled (sha256 order).
        systems: the larger run's number of systems (2 to 10): the two examples, then
            variants with 2 or 4 interests citing 3 or 5 items.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "qwen2.5-coder-0.5b"
    data: str = "ml-100k"
    users: int = Field(3, ge=1)
    systems: int = Field(10, ge=2, le=10)


def _systems(ds: Any, users: int, n: int) -> dict[str, list[dict[str, Any]]]:
    out = example_profiles(ds, users=users)
    for k in (2, 4):
        for cite in (3, 5):
            more = example_profiles(ds, users=users, interests=k, cite=cite)
            out |= {f"{s}-{k}x{cite}": ps for s, ps in more.items()}
    return dict(list(out.items())[:n])


def bench_profile_scoring(
    config: ProfileScoringConfig, out: str | Path, progress: bool = True
) -> dict[str, Any]:
    """Time the rows (see the module); write ``results.json`` and ``report.md``."""
    out = Path(out)
    ds = load_dataset(config.data)
    judge = load_llm(config.model)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, ps in _systems(ds, config.users, config.systems).items():
            files[name] = Path(tmp) / f"{name}.jsonl"
            files[name].write_text("".join(json.dumps(p) + "\n" for p in ps))
        answers = Path(tmp) / "answers.sqlite"

        def row(label: str, systems: list[str], share: bool) -> None:
            cfg = GistConfig(judge=config.model, share_judge_answers=share)
            t0 = time.perf_counter()
            r = verify_profiles(cfg, config.data, [files[s] for s in systems],
                                Path(tmp) / f"run{len(rows)}", llms={config.model: judge},
                                progress=progress, answers=answers)  # fmt: skip
            rows.append({"row": label, "systems": len(systems), "shared": share,
                         "seconds": round(time.perf_counter() - t0, 1),
                         "asked": r["cost"]["judge"]["asked_now"],
                         "questions": r["cost"]["judge"]["questions"]})  # fmt: skip
            if progress:
                print(f"{label}: {rows[-1]['seconds']} s, {rows[-1]['asked']} asked")

        two, every = list(files)[:2], list(files)
        row("2 systems, first run", two, True)
        row("2 systems, later run into a new --out, before (nothing shared)", two, False)
        row("2 systems, later run into a new --out, after (shared answers)", two, True)
        row(f"{len(every)} systems, before (nothing shared)", every, False)
        row(f"{len(every)} systems, after (the 2 systems' answers shared)", every, True)
    results = {"config": config.model_dump(), "users": config.users, "rows": rows}
    lines = [
        f"# Profile scoring: `gist verify` wall time ({config.data}, judge `{config.model}`)",
        "",
        f"{config.users} users, the paper's verification settings (pool 1000, 50 options, the "
        "full 325-category taxonomy); the example profile systems of `gist example-profiles` "
        "and variants. One run per row, in this order, the judge loaded once.",
        "",
        "| row | systems | seconds | judge questions asked | of |",
        "|---|---|---|---|---|",
        *(
            f"| {r['row']} | {r['systems']} | {r['seconds']} | {r['asked']} | {r['questions']} |"
            for r in rows
        ),  # fmt: skip
    ]
    write_report(out, results, lines)
    return results
