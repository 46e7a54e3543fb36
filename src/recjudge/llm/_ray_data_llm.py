"""vLLM through Ray Data LLM (``ray.data.llm``): recjudge's engine requests as one Ray job.

``RayDataLLM`` is the engine backend a driver decodes with: it holds the tokenizer (prompts
are rendered, escaped and tokenised on the driver, grammars compiled there, the decision
records replayed there) but no model. Its ``submit`` answers from the results of earlier
Ray Data runs; a request it holds no result for is kept in ``pending`` and ``Deferred`` is
raised. The caller (``reward.RayExecutor``) lets every engine call of a job build its
requests that way, sends all of them through one Ray Data LLM vLLM stage (``run_requests``:
``ray.data.llm.build_processor``, one vLLM engine per worker, loaded once per run, with
recjudge's bias processor, grammar and watched log-probabilities), and decodes each call
again as its results arrive, which now finds them. The requests of a call are a function of the call
(greedy decoding, or sampling seeded per pair), so the second pass builds the same ones; a
call that needs another round (a read-out whose decision did not come within its short
budget) defers again and goes into the next run.

The prompt travels as token ids, never text, so untrusted titles stay escaped exactly as in
one process; the rows are the stage's own format, read back whatever Ray Data turned their
lists into (numpy arrays).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

from recjudge.llm._config import ENGINE_CAPABILITIES, Generation, LLMConfig, SamplingConfig
from recjudge.llm._vllm import (
    EngineRequest,
    EngineResult,
    _EngineMixin,
    _gguf_kwargs,
    engine_args,
    model_source,
    sampling_params_of,
)

#: rows per batch handed to one vLLM engine (a few users' calls; the engine schedules them
#: together, and a user's rows are consecutive, so its prefix is cached once)
ROWS_PER_BATCH = 64


class Deferred(BaseException):  # noqa: N818 - not an error: a request waits for its result
    """``RayDataLLM.submit`` was asked for results it does not hold yet: the requests are in
    ``pending``. A ``BaseException``, so the per-request isolation of a judge (which records
    errors) lets it through to the executor that runs the pending requests.

    Attributes:
        fingerprints: the missing requests' fingerprints (``fingerprint``).
    """

    def __init__(self, fingerprints: Sequence[str]) -> None:
        super().__init__(f"{len(fingerprints)} engine requests wait for a Ray Data LLM run")
        self.fingerprints = list(fingerprints)


def fingerprint(r: EngineRequest) -> str:
    """What identifies an engine request's result: everything the engine reads of it."""
    body = [list(map(int, r.prompt_ids)), r.grammar, r.payload, list(map(int, r.watch)),
            r.sampling.model_dump(mode="json"), int(r.seed)]  # fmt: skip
    return hashlib.sha256(json.dumps(body, separators=(",", ":")).encode()).hexdigest()


class RayDataLLM(_EngineMixin):
    """The driver's side of vLLM on Ray Data LLM workers (see the module's docstring).

    Args:
        config: the ``LLMConfig`` every worker's vLLM engine is built from (``backend``
            ``vllm``; its ``vllm_args`` go to the engine as on ``--backend vllm``).
    """

    #: engine-side grammar and bias; no option scoring (its next-token log-probabilities
    #: would need a run of their own per search step)
    capabilities = ENGINE_CAPABILITIES
    needs_bias_probe = False  # the workers' engines are built here, with the processor

    def __init__(self, config: LLMConfig) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.config = config
        self.name = config.model
        source, gguf = model_source(config.model)
        self.tokenizer = AutoTokenizer.from_pretrained(source, **_gguf_kwargs(gguf))
        # what vLLM's model_config.get_vocab_size() reads: the text model's vocabulary
        hf = AutoConfig.from_pretrained(source, **_gguf_kwargs(gguf))
        text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
        self.vocab_size = int(text.vocab_size)
        self.pending: dict[str, EngineRequest] = {}
        self._results: dict[str, EngineResult] = {}

    def submit(self, requests: list[EngineRequest]) -> list[EngineResult]:
        """The results of ``requests`` when every one has come back from a run; otherwise
        the missing ones go into ``pending`` and ``Deferred`` is raised."""
        fps = [fingerprint(r) for r in requests]
        missing = [fp for fp in dict.fromkeys(fps) if fp not in self._results]
        if missing:
            for fp, r in zip(fps, requests, strict=True):
                if fp in missing:
                    self.pending.setdefault(fp, r)
            raise Deferred(missing)
        return [self._results[fp] for fp in fps]

    def take_pending(self) -> dict[str, EngineRequest]:
        """The requests waiting for a run (emptied)."""
        out, self.pending = self.pending, {}
        return out

    def add_result(self, fp: str, result: EngineResult) -> None:
        self._results[fp] = result

    def forget(self, fp: str) -> None:
        """Drop a result every call using it has read (the driver keeps only what the calls
        in flight still need)."""
        self._results.pop(fp, None)

    def held(self) -> int:
        """How many results are kept."""
        return len(self._results)

    def generate(
        self,
        prompts: Sequence[str],
        processors: Sequence[Any] = (),
        sampling: SamplingConfig | None = None,
    ) -> list[Generation]:
        raise NotImplementedError(
            "RayDataLLM runs recjudge's constrained engine requests (the judge's calls); for "
            "plain generation on Ray use ray.data.llm directly, or --backend vllm in one process"
        )


def engine_row(fp: str, r: EngineRequest) -> dict[str, Any]:
    """One request as the row Ray Data LLM's vLLM stage reads: its prompt as token ids (never
    text: titles stay escaped as tokenised here) and its ``vllm.SamplingParams`` arguments.
    Every row of a job has the same keys (a missing one would be null after Arrow)."""
    sp = sampling_params_of(r)
    sp.setdefault("logprob_token_ids", None)
    sp.setdefault("extra_args", None)
    return {"fp": fp, "tokenized_prompt": list(map(int, r.prompt_ids)), "sampling_params": sp}


def _listed(x: Any) -> list[Any]:
    """A column value that Ray Data may hand over as a numpy array, a list or None."""
    return [] if x is None else list(x)


def result_row(row: dict[str, Any]) -> tuple[str, EngineResult]:
    """The vLLM stage's output row as (fingerprint, result): the generated token ids and,
    per step, the watched tokens' log-probabilities."""
    steps = [{int(t): float(v["logprob"]) for t, v in dict(step).items() if v is not None}
             for step in _listed(row.get("logprobs"))]  # fmt: skip
    tokens = [int(t) for t in _listed(row.get("generated_tokens"))]
    return str(row["fp"]), EngineResult(tokens, steps)


def processor_config(
    config: LLMConfig, *, actors: int, threads: int, gpus: float, rows: int = ROWS_PER_BATCH
) -> Any:
    """The ``ray.data.llm.vLLMEngineProcessorConfig`` of recjudge's engine on ``actors``
    workers, each with ``threads`` CPU cores and ``gpus`` GPUs (0: vLLM's CPU build). The
    chat-template, tokenize and detokenize stages are off: prompts arrive as token ids and
    results leave as token ids."""
    from ray.data.llm import vLLMEngineProcessorConfig

    args, env = engine_args(config)
    model = args.pop("model")
    bundle: dict[str, float] = {"CPU": float(threads)}
    if gpus > 0:
        bundle["GPU"] = float(gpus)
    return vLLMEngineProcessorConfig(
        model_source=model,
        engine_kwargs=args,
        runtime_env={"env_vars": env},
        concurrency=actors,
        batch_size=rows,
        placement_group_config={"bundles": [bundle]},
        chat_template_stage=False,
        tokenize_stage=False,
        detokenize_stage=False,
        # vLLM's Ray metrics need Ray Serve (ray[serve]), which recjudge does not install
        log_engine_metrics=False,
    )


def run_requests(
    ray: Any,
    config: LLMConfig,
    requests: dict[str, EngineRequest],
    *,
    actors: int,
    threads: int,
    gpus: float,
    rows: int = ROWS_PER_BATCH,
) -> Iterator[tuple[str, EngineResult]]:
    """Run ``requests`` (fingerprint -> request, in the order given: one call's requests
    together) through one Ray Data LLM stage; yields (fingerprint, result) as blocks finish.
    Ray Data reruns a block whose worker died; a fingerprint may then come back twice."""
    from ray.data.llm import build_processor

    items = [engine_row(fp, r) for fp, r in requests.items()]
    if not items:
        return
    cfg = processor_config(config, actors=actors, threads=threads, gpus=gpus, rows=rows)
    # No preprocess or postprocess stage: their Ray tasks would need CPUs beside engines that
    # may hold every core of their nodes, and would wait for them forever. The rows are
    # built here in the stage's own format and read back here.
    processor = build_processor(cfg)
    blocks = max(1, -(-len(items) // rows))
    ds = ray.data.from_items(items, override_num_blocks=blocks)
    for batch in processor(ds).iter_batches(batch_size=None, batch_format="pandas"):
        for row in batch.to_dict("records"):
            yield result_row(row)
