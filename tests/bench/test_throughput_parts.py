"""The plain-vLLM method's parts that run without vLLM: the captured requests, the forced
branch grammars and the verdict read from plain text."""

from __future__ import annotations

import pytest

from recjudge.bench._throughput import _run_worker
from recjudge.bench._vllm_worker import forced_branch, plain_requests, plain_verdict
from recjudge.decoding import EvidenceFirst
from recjudge.decoding._schemas import remainder_ebnf
from recjudge.reward import Judge, JudgeConfig, request_for


def _remainder(titles=("Heat (1995)", "Up (2009)")) -> str:
    return remainder_ebnf(EvidenceFirst(list(titles), 3), '{"evidence')


def test_a_forced_branch_keeps_one_alternative_of_the_grammar():
    g = _remainder()
    no, yes = forced_branch(g, "NO"), forced_branch(g, "YES")
    assert '\\"NO\\"' in no and "title" not in no
    assert '\\"YES\\"' in yes and '\\"NO\\"' not in yes.partition("\n")[0]
    assert yes.partition("\n")[2] == g.partition("\n")[2]  # the title rule is unchanged
    with pytest.raises(ValueError):
        forced_branch('root ::= "x"', "YES")


def test_plain_text_reads_as_a_verdict():
    assert plain_verdict('": ["Heat (1995)"], "is_relevant": "YES"}') == (True, ["Heat (1995)"])
    assert plain_verdict('": [], "is_relevant": "NO"}') == (False, [])
    assert plain_verdict('": ["He') == (True, [])  # a read-out: the list opens with a title
    assert plain_verdict('": []') == (False, [])


def test_plain_requests_are_the_judges_engine_requests(smollm, ml1m):
    reqs = [request_for(ml1m, "1", c, sigma=s) for c, s in (("Heat (1995)", 0.5),
                                                            ("Fargo (1996)", -0.5))]  # fmt: skip
    judge = Judge(JudgeConfig(model="smollm2-135m", max_history=10), llm=smollm)
    got = plain_requests(judge, reqs, ["YES", "NO"])
    assert len(got) == 2
    lead = smollm.encode('{"evidence')
    for (ids, grammar), branch in zip(got, ("YES", "NO"), strict=True):
        assert ids[-len(lead) :] == lead  # the prompt ends with the jump-forward lead
        assert f'\\"{branch}\\"' in grammar.partition("\n")[0]
    rp, prefix, suffix = judge.prompt_ids(reqs[0])
    assert got[0][0][: len(prefix)] == prefix


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('echo "vllm: loading" >&2; kill -ILL $$', ["killed by SIGILL", "AVX512"]),
        ("kill -KILL $$", ["killed by SIGKILL", "out-of-memory"]),
        ('echo "RuntimeError: no CPU platform" >&2; exit 3', ["RuntimeError: no CPU platform"]),
    ],
)
def test_a_worker_that_dies_is_a_failed_row_with_its_cause(tmp_path, body, says):
    """A vLLM environment whose worker dies (a build this CPU cannot run, the OOM killer, an
    error) gives the bench a ``failed`` row saying why, never a traceback or an empty reason."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    got = _run_worker(fake, {"requests": []}, "plain_vllm", "test", [0])
    assert set(got) == {"failed"}
    for s in says:
        assert s in got["failed"]
