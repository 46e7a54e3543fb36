"""``--ray --backend vllm`` through Ray Data LLM: the driver's side of the job.

The driver does everything but run the model: keys, reuse, sigma and the plan of engine
calls as on every Ray run (``JudgePlan``), then, per call, its prompts (rendered, escaped,
tokenised with the model's tokenizer, held by a ``RayDataLLM``), its ``DecodeJob`` and that
job's engine requests (``decoding.engine_stage``: grammars, bias payloads, watched tokens).
Every call's requests go through one ``ray.data.llm`` vLLM stage; as the results come back,
each call whose results have all arrived is finished (its decision records replayed, its
answers parsed) and handed to ``judge_many``, which writes it to the store: a crash loses
only the calls still in flight, and ``--resume`` skips the rest. A read-out whose decision
did not come within its short budget asks for a second round (the stage's own data, not an
exception), whose requests go through the next run of the stage.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recjudge._util import RunFault, first_line
from recjudge.decoding import engine_stage
from recjudge.distributed._cluster import RayClusterError
from recjudge.llm import RayDataLLM, fingerprint, run_requests
from recjudge.reward import (
    RECORDED_ERRORS,
    Judge,
    call_job,
    decoded,
    error_text,
    judgment_of,
    prompts_for,
)

if TYPE_CHECKING:
    from recjudge._ray_config import RayConfig
    from recjudge.distributed._run import RayRun
    from recjudge.llm import RayDataLLM
    from recjudge.reward import Judge, Judgment

log = logging.getLogger(__name__)


@dataclass
class EngineCall:
    """One planned call on its way through the stage.

    Attributes:
        idx: its requests' indices into the run's requests (those with a prompt).
        stage: its ``EngineStage`` (the requests of the round under way).
        finish: the stage's outputs -> the call's judgments, in ``idx`` order.
        fps: this round's request fingerprints, in the stage's order.
        got: the results of this round that came, by fingerprint.
    """

    idx: list[int]
    stage: Any
    finish: Any
    fps: list[str] = field(default_factory=list)
    got: dict[str, Any] = field(default_factory=dict)

    def ask(self) -> dict[str, Any]:
        """This round's requests by fingerprint (noted for ``complete``)."""
        reqs = self.stage.requests
        self.fps, self.got = [fingerprint(r) for r in reqs], {}
        return dict(zip(self.fps, reqs, strict=True))

    def complete(self) -> bool:
        """Every result of this round came."""
        return all(fp in self.got for fp in self.fps)


def engine_calls(local: Judge, run: RayRun) -> tuple[list[EngineCall], list[tuple[int, Exception]]]:
    """Every planned call of ``run`` as an ``EngineCall`` on the driver (``local``: the
    judge whose LLM is the ``RayDataLLM``), and the requests that failed before any engine
    ran (prompt or grammar; recorded with ``run.record``, else raised). A call that cannot
    be built whole is built request by request, so only the failing ones fail."""
    c = local.config
    calls: list[EngineCall] = []
    failed: list[tuple[int, Exception]] = []

    def build(part: list[dict[str, Any]]) -> None:
        idx = [x["i"] for x in part]
        reqs = [run.reqs[i] for i in idx]
        sigmas, keys = [x["sigma"] for x in part], [x["key"] for x in part]
        prompts = prompts_for(c, local.llm, reqs, record=run.record)
        ok = [k for k, p in enumerate(prompts) if not isinstance(p, Exception)]
        failed.extend((idx[k], p) for k, p in enumerate(prompts) if isinstance(p, Exception))
        if not ok:
            return
        ps = [prompts[k] for k in ok]
        try:
            job, schemas, rows = call_job(c, ps, [sigmas[k] for k in ok], [keys[k] for k in ok])
            stage = engine_stage(local.llm, job, stats=local.stats)
        except RunFault:
            raise
        except RECORDED_ERRORS as e:
            if not run.record:
                raise
            if len(ok) == 1:
                failed.append((idx[ok[0]], e))
                return
            for k in ok:
                build([part[k]])
            return

        def finish(outs: Any, ps=ps, schemas=schemas, rows=rows, ok=ok) -> list[Judgment]:
            d = decoded(ps, schemas, [sigmas[k] for k in ok], rows, outs)
            return [judgment_of(c.mode, reqs[k], d, n) for n, k in enumerate(ok)]

        calls.append(EngineCall([idx[k] for k in ok], stage, finish))

    for call in run.calls:
        build(call)
    return calls, failed


def _finished(call: EngineCall, run: RayRun) -> tuple[list[int], list[Judgment]] | None:
    """Feed a call whose round is complete: its (indices, judgments) when it is done, None
    when it asks for another round. An error while replaying it fails its requests (with
    ``run.record``; else it is raised)."""
    try:
        call.stage.feed([call.got[fp] for fp in call.fps])
        if not call.stage.done:
            return None
        return call.idx, call.finish(call.stage.outputs)
    except RunFault:
        raise
    except RECORDED_ERRORS as e:
        if not run.record:
            raise
        log.warning("an engine call of %d requests failed: %s", len(call.idx), e)
        return call.idx, [run.failure(i, error_text(e)) for i in call.idx]


def stream_on_ray_data_llm(
    ray: Any, config: RayConfig, run: RayRun
) -> Iterator[tuple[list[int], list[Judgment]]]:
    """Judge ``run.calls`` (the executor's planned engine calls, each request with its
    index, key and sigma) with vLLM on Ray Data LLM workers (``ray``: connected, with the
    vLLM stage's runtime; ``config``: the actors, threads and GPUs); (indices, judgments)
    per finished call.

    Raises:
        RayClusterError: the Ray run failed, or ended with calls whose results never came.
    """
    engine: RayDataLLM = RayDataLLM(run.llm_config)
    local = Judge(run.judge.config, llm=engine)  # prompts and replays on the driver
    calls, failed = engine_calls(local, run)
    if failed:
        yield ([i for i, _ in failed], [run.failure(i, error_text(e)) for i, e in failed])
    todo = calls
    while todo:
        pending: dict[str, Any] = {}
        waiting: dict[str, list[EngineCall]] = {}
        for call in todo:
            for fp, r in call.ask().items():
                pending.setdefault(fp, r)
                waiting.setdefault(fp, []).append(call)
        todo = []
        try:
            ran = run_requests(ray, run.llm_config, pending, actors=config.actors,
                               threads=config.threads, gpus=config.gpus)  # fmt: skip
            for fp, result in ran:  # (a rerun block's result comes again: already taken)
                for call in waiting.pop(fp, []):
                    call.got[fp] = result
                    if call.complete():
                        done = _finished(call, run)
                        if done is None:
                            todo.append(call)  # another round: the next run of the stage
                        else:
                            yield done
        except ray.exceptions.RayError as e:
            raise RayClusterError(
                f"the Ray Data LLM run failed ({type(e).__name__}: {first_line(e)}); finished "
                "pairs are in the store: run again with --resume to judge the rest"
            ) from None
        if waiting:
            stuck = len({id(c) for cs in waiting.values() for c in cs})
            raise RayClusterError(
                f"the Ray Data LLM run ended with {stuck} engine calls not answered; "
                "finished pairs are in the store: run again with --resume"
            )
