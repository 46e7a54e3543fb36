"""The evaluators' per-family modules (``recjudge.evaluators.arena``, ``.gist``,
``.usersum``, ``.offline``) together export every flat name but the registry's, each from
one family, as the same object."""

from __future__ import annotations

import recjudge.evaluators as flat
from recjudge.evaluators import arena, gist, offline, usersum

FAMILIES = (arena, gist, usersum, offline)


def test_every_flat_name_lives_in_exactly_one_family():
    homes: dict[str, list[str]] = {}
    for fam in FAMILIES:
        for name in fam.__all__:
            homes.setdefault(name, []).append(fam.__name__)
            assert getattr(fam, name) is getattr(flat, name)
    assert {n for n, h in homes.items() if len(h) > 1} == set()
    assert set(flat.__all__) - set(homes) == {"EVALUATORS", "EvaluatorSpec", "JOBS", "JobSpec"}
