"""``--ray --backend vllm`` through Ray Data LLM: the driver's side of the job.

The driver does everything but run the model: keys, reuse, sigma and the plan of engine
calls as on every Ray run (``RayExecutor.run``), then, per call, the prompts (rendered,
escaped, tokenised), grammars, bias payloads and watched tokens, which a ``RayDataLLM``
backend gathers (``recjudge.llm``'s module docstring says how). All of a job's requests go
through one ``ray.data.llm`` vLLM stage; as each block's results come back, every call whose
requests have all come back is decoded again on the driver (its decision records replayed,
its answers parsed) and handed to ``judge_many``, which writes it to the store: a crash loses
only the calls still in flight, and ``--resume`` skips the rest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from recjudge._util import first_line

if TYPE_CHECKING:
    from recjudge.llm import RayDataLLM
    from recjudge.reward._judgment import Judgment
    from recjudge.reward._ray import RayExecutor, RayRun


class _Calls:
    """The executor's planned engine calls as they wait for their requests' results: a call
    is decoded on the driver (``Judge.judge_prepared`` with a ``RayDataLLM``) when it is
    first seen and again once every request it deferred has a result."""

    def __init__(self, run: RayRun, engine: RayDataLLM) -> None:
        from recjudge.reward._judge import Judge

        self.run, self.engine = run, engine
        self.local = Judge(run.judge.config, llm=engine)  # decodes on the driver, into the engine
        self.waiting: dict[int, set[str]] = {}  # call -> the requests it still waits for
        self.by_fp: dict[str, list[int]] = {}  # request -> the calls waiting for it
        # Every request a call has deferred (all rounds), and how many unfinished calls hold
        # each: a result is dropped from the engine once the last call using it is decoded,
        # so the driver keeps the results of the calls in flight, not of the whole run.
        self.used: dict[int, set[str]] = {}
        self.holders: Counter[str] = Counter()

    def attempt(self, ci: int) -> tuple[list[int], list[Judgment]] | None:
        """Decode call ``ci``: its (indices, judgments), or None while it waits."""
        from recjudge.llm import Deferred
        from recjudge.reward._judgment import Judgment, error_text

        call = self.run.calls[ci]
        idx = [x["i"] for x in call]
        try:
            got = self.local.judge_prepared([self.run.reqs[i] for i in idx],
                                            [x["key"] for x in call], [x["sigma"] for x in call],
                                            self.run.record)  # fmt: skip
        except Deferred as d:
            self.waiting[ci] = set(d.fingerprints)
            used = self.used.setdefault(ci, set())
            for fp in d.fingerprints:
                self.by_fp.setdefault(fp, []).append(ci)
                if fp not in used:
                    used.add(fp)
                    self.holders[fp] += 1
            return None
        self._release(ci)
        return idx, [j if isinstance(j, Judgment) else self.run.failure(i, error_text(j))
                     for i, j in zip(idx, got, strict=True)]  # fmt: skip

    def _release(self, ci: int) -> None:
        """Call ``ci`` is decoded: drop the results no unfinished call holds any more."""
        for fp in self.used.pop(ci, ()):
            self.holders[fp] -= 1
            if self.holders[fp] <= 0:
                del self.holders[fp]
                self.engine.forget(fp)

    def arrived(self, fp: str) -> Iterator[tuple[list[int], list[Judgment]]]:
        """Request ``fp``'s result came: decode each call that no longer waits for any."""
        for ci in self.by_fp.pop(fp, []):
            need = self.waiting.get(ci)
            if need is None:
                continue
            need.discard(fp)
            if not need:
                del self.waiting[ci]
                done = self.attempt(ci)  # another round's requests go to the next run
                if done is not None:
                    yield done

    def stuck(self, pending: dict[str, Any]) -> int:
        """Calls that wait for results no run will bring."""
        return sum(1 for need in self.waiting.values() if need and not need & set(pending))


def stream_on_ray_data_llm(
    ex: RayExecutor, run: RayRun
) -> Iterator[tuple[list[int], list[Judgment]]]:
    """Judge ``run.calls`` (the executor's planned engine calls, each request with its
    index, key and sigma) with vLLM on Ray Data LLM workers; (indices, judgments) per
    finished call.

    Raises:
        RayClusterError: the Ray run failed, or ended with calls whose results never came.
    """
    from recjudge.llm import RayDataLLM, run_requests
    from recjudge.reward._ray import RayClusterError

    ray = ex.ready(vllm_stage=True)
    engine = RayDataLLM(run.llm_config)
    state = _Calls(run, engine)
    todo: list[int] = list(range(len(run.calls)))
    while True:
        for ci in todo:
            done = state.attempt(ci)
            if done is not None:
                yield done
        pending = engine.take_pending()
        if not pending:
            break
        todo = []
        try:
            ran = run_requests(ray, run.llm_config, pending, actors=ex.config.actors,
                               threads=ex.config.threads, gpus=ex.config.gpus)  # fmt: skip
            for fp, result in ran:
                engine.add_result(fp, result)
                yield from state.arrived(fp)
        except ray.exceptions.RayError as e:
            raise RayClusterError(
                f"the Ray Data LLM run failed ({type(e).__name__}: {first_line(e)}); finished "
                "pairs are in the store: run again with --resume to judge the rest"
            ) from None
        stuck = state.stuck(engine.pending)
        if stuck:
            raise RayClusterError(
                f"the Ray Data LLM run ended with {stuck} engine calls not answered; "
                "finished pairs are in the store: run again with --resume"
            )
