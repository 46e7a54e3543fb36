"""vLLM through Ray Data LLM (``ray.data.llm``): recjudge's engine requests as one Ray job.

``RayDataLLM`` is the backend a driver builds engine requests with: it holds the tokenizer
(prompts are rendered, escaped and tokenised on the driver, grammars compiled there, the
decision records replayed there) but no model, and it runs nothing itself. The caller
(``distributed.RayExecutor``) builds every engine call's requests as data
(``decoding.engine_stage``), sends all of them through one Ray Data LLM vLLM stage
(``run_requests``: ``ray.data.llm.build_processor``, one vLLM engine per worker, loaded once
per run, with recjudge's bias processor, grammar and watched log-probabilities), and feeds
each call's results back to its stage as they arrive; a call that needs another round (a
read-out whose decision did not come within its short budget) gives its next requests,
which go into the next run. Results are routed by ``fingerprint``: everything the engine
reads of a request.

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

    def submit(self, requests: list[EngineRequest]) -> list[EngineResult]:
        """Not here: the requests of a Ray Data LLM job run through ``run_requests``."""
        raise NotImplementedError(
            "RayDataLLM runs nothing itself: build the requests with "
            "recjudge.decoding.engine_stage and run them with recjudge.llm.run_requests "
            "(distributed.RayExecutor does both)"
        )

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
